"""jaxnorm parts inside small copies of the flax tutorial patterns.

Each test swaps a flax norm for jaxnorm's in a pattern users already have
(the nnx MNIST-style CNN with ``nnx.view``, ``nnx.scan`` over layers, a
linen model, an FSDP mesh with the user's axis names under
``nnx.Optimizer``) and checks it equals the flax original where the maths is
the same.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxnorm import linen as jln
from jaxnorm import nn as jnn
from jaxnorm import norms, optim, sharding
from tests import helpers

D = 8


@pytest.fixture(autouse=True)
def _standard_promotion():
  """Tutorial code runs under JAX's default promotion.

  flax's pooling and optax's bias correction mix int and float scalars,
  which the suite's strict promotion refuses; jaxnorm's own code is
  checked under strict promotion in its unit tests.
  """
  with jax.numpy_dtype_promotion("standard"):
    yield


@pytest.fixture(scope="module")
def images():
  kx, ky = jax.random.split(jax.random.key(0))
  return jax.random.normal(kx, (4, 6, 6, 1)), jax.random.randint(ky, (4,), 0, 3)


class _CNN(nnx.Module):
  """The flax MNIST tutorial CNN, shrunk, with norms given by the caller."""

  def __init__(self, batch_norm, layer_norm, *, rngs: nnx.Rngs):
    # No bias before BatchNorm: its gradient is zero up to round-off, which
    # an adaptive optimizer would amplify into different, irrelevant biases.
    self.conv = nnx.Conv(1, 4, kernel_size=(3, 3), use_bias=False, rngs=rngs)
    self.bn = batch_norm(4, rngs=rngs)
    self.linear1 = nnx.Linear(36, D, rngs=rngs)
    self.ln = layer_norm(D, rngs=rngs)
    self.linear2 = nnx.Linear(D, 3, rngs=rngs)

  def __call__(self, x):
    x = nnx.avg_pool(nnx.relu(self.bn(self.conv(x))), (2, 2), (2, 2))
    x = self.ln(nnx.relu(self.linear1(x.reshape(x.shape[0], -1))))
    return self.linear2(x)


def _train_cnn(model, images):
  """Two tutorial train steps, then the eval view; losses and logits."""
  x, y = images
  opt = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    def loss_fn(model):
      logits = model(x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  losses = [step(model, opt) for _ in range(2)]
  eval_model = nnx.view(model, use_running_average=True)
  return jnp.stack(losses), nnx.jit(lambda m: m(x))(eval_model)


def test_tutorial_cnn_with_jaxnorm_norms_equals_flax(images):
  """Same keys drawn, so the same init; same training and eval view."""
  flax_bn = functools.partial(nnx.BatchNorm, use_fast_variance=False)
  flax_ln = functools.partial(nnx.LayerNorm, use_fast_variance=False)
  theirs = _CNN(flax_bn, flax_ln, rngs=nnx.Rngs(0))
  ours = _CNN(jnn.BatchNorm, jnn.LayerNorm, rngs=nnx.Rngs(0))
  helpers.assert_close(
    nnx.to_pure_dict(nnx.state(ours)),
    nnx.to_pure_dict(nnx.state(theirs)),
    atol=0,
  )
  losses, logits = _train_cnn(ours, images)
  ref_losses, ref_logits = _train_cnn(theirs, images)
  helpers.assert_close(losses, ref_losses, atol=1e-5)
  helpers.assert_close(logits, ref_logits, atol=1e-4)
  helpers.assert_close(ours.bn.mean[...], theirs.bn.mean[...], atol=1e-5)


class _Block(nnx.Module):
  def __init__(self, norm, *, rngs: nnx.Rngs):
    self.norm = norm(D, rngs=rngs)
    self.linear = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, x):
    return x + self.linear(nnx.gelu(self.norm(x)))


def _scanned(norm, layers=3):
  """flax's scan-over-layers recipe: vmapped init, scanned forward."""

  @nnx.split_rngs(splits=layers)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def create(rngs):
    return _Block(norm, rngs=rngs)

  return create(nnx.Rngs(0))


@nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
def _forward(block, x):
  return block(x)


def test_nnx_scan_over_layers_with_a_jaxnorm_norm(key):
  x = jax.random.normal(key, (2, 5, D))
  ours = _scanned(jnn.RMSNorm)
  assert ours.norm.scale[...].shape == (3, D)
  theirs = _scanned(functools.partial(nnx.RMSNorm, use_fast_variance=False))
  nnx.update(theirs, nnx.state(ours))  # flax's RMSNorm draws one key fewer

  def loss(model):
    return jnp.mean(jnp.square(_forward(model, x)))

  value, grads = nnx.jit(nnx.value_and_grad(loss))(ours)
  ref_value, ref_grads = nnx.jit(nnx.value_and_grad(loss))(theirs)
  helpers.assert_close(value, ref_value, atol=1e-5)
  helpers.assert_close(
    nnx.to_pure_dict(grads), nnx.to_pure_dict(ref_grads), atol=1e-5
  )
  # The scan equals a Python loop over the stacked layers.
  h = x
  for i in range(3):
    normed = norms.rms_norm(h, ours.norm.scale[...][i])
    h = h + nnx.gelu(normed) @ ours.linear.kernel[...][i]
    h = h + ours.linear.bias[...][i][None, None]
  helpers.assert_close(value, jnp.mean(jnp.square(h)), atol=1e-5)


class _LinenMLP(nn.Module):
  norm: type

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D)(x)
    x = self.norm()(nn.gelu(x))
    return nn.Dense(3)(x)


def test_linen_model_with_jaxnorm_linen(images):
  x, y = images
  x = x.reshape(x.shape[0], -1)
  models = {
    "ours": _LinenMLP(lambda: jln.LayerNorm(axis_names=None)),
    "theirs": _LinenMLP(lambda: nn.LayerNorm(use_fast_variance=False)),
  }
  tx = optax.adam(1e-2)
  curves = {}
  for name, model in models.items():
    params = model.init(jax.random.key(0), x)

    @jax.jit
    def step(params, state, model=model):
      def loss_fn(p):
        logits = model.apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state, loss

    state, losses = tx.init(params), []
    for _ in range(3):
      params, state, loss = step(params, state)
      losses.append(loss)
    curves[name] = (np.asarray(losses), params)
  helpers.assert_close(curves["ours"][0], curves["theirs"][0], atol=1e-5)
  helpers.assert_close(curves["ours"][1], curves["theirs"][1], atol=1e-5)


class _MLP(nnx.Module):
  """FSDP-style: kernels named ``(embed, mlp)``, a jaxnorm norm between."""

  def __init__(self, *, rngs: nnx.Rngs):
    init = nnx.initializers.lecun_normal()
    self.up = nnx.Linear(
      D,
      16,
      kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
      rngs=rngs,
    )
    self.norm = jnn.RMSNorm(16, axis_names=("mlp",), rngs=rngs)
    self.down = nnx.Linear(
      16,
      D,
      kernel_init=nnx.with_partitioning(init, ("mlp", "embed")),
      rngs=rngs,
    )

  def __call__(self, x):
    return self.down(self.norm(nnx.gelu(self.up(x))))


def _train_mlp(x):
  model = _MLP(rngs=nnx.Rngs(0))
  opt = nnx.Optimizer(model, optim.adamp(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    loss, grads = nnx.value_and_grad(
      lambda m: jnp.mean(jnp.square(m(x) - 1.0))
    )(model)
    opt.update(model, grads)
    return loss

  losses = jnp.stack([step(model, opt) for _ in range(3)])
  return model, losses


def test_fsdp_mesh_with_user_axis_names_and_optimizer(key):
  """gemma's (fsdp, tp) mesh, rules derived by rules_for_mesh."""
  x = jax.random.normal(key, (8, D))
  mesh = sharding.make_mesh((4, 2), ("fsdp", "tp"))
  rules = sharding.rules_for_mesh(mesh, {"tensor": "tp"})
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    model, losses = _train_mlp(x)
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    assert specs["up"]["kernel"].get_value() == P("fsdp", "tp")
    assert specs["norm"]["scale"].get_value() == P("tp")
  assert model.up.kernel[...].sharding.spec == P("fsdp", "tp")
  assert model.norm.scale[...].sharding.spec == P("tp")
  with nnx.use_eager_sharding(False):
    ref, ref_losses = _train_mlp(x)
  assert float(losses[-1]) < float(losses[0])
  helpers.assert_close(losses, ref_losses, atol=1e-5)
  helpers.assert_close(
    nnx.to_pure_dict(nnx.state(model, nnx.Param)),
    nnx.to_pure_dict(nnx.state(ref, nnx.Param)),
    atol=1e-5,
  )
