"""Every registered part builds into a model and takes one finite step."""

import functools

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from jaxnorm.training import build, config, optimizers

# Builds and steps every registered part in every model: CI runs it (-m slow).
pytestmark = [
  pytest.mark.slow,
  # XLA:CPU cannot reuse donated buffers; the donation is for its checks.
  pytest.mark.filterwarnings("ignore:Some donated buffers were not usable"),
]

LM_PARTS = build.registries("lm")
VIT_PARTS = build.registries("vit")
CNN_PARTS = build.registries("cnn")


def one_step(model="lm", optimizer="adamw", **parts):
  parts = {"activation": "relu" if model == "cnn" else "gelu", **parts}
  cfg = config.TrainConfig(model=model, width=16, depth=1, num_heads=2, **parts)
  if model == "lm":
    net = build.build_model(
      cfg, {"vocab_size": 256, "max_len": 8}, rngs=nnx.Rngs(0)
    )
    x = jax.random.randint(jax.random.key(1), (2, 8), 0, 256)
    y = x
  else:
    net = build.build_model(
      cfg, {"num_classes": 10, "image_shape": (8, 8, 1)}, rngs=nnx.Rngs(0)
    )
    x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 1))
    y = jnp.array([3, 7])
  graphdef, params, rest = nnx.split(net, nnx.Param, ...)
  tx = optimizers.build_optimizer(
    optimizer,
    learning_rate=1e-3,
    weight_decay=0.1,
    warmup_steps=1,
    total_steps=10,
  )

  # Donated as in the runner's train step: a buffer shared by two parameters
  # fails here as it would there.
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state):
    def loss_fn(params):
      out = nnx.merge(graphdef, params, rest, copy=True)(x)
      return optax.softmax_cross_entropy_with_integer_labels(
        out.astype(jnp.float32), y
      ).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, _ = tx.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates)

  loss, new_params = step(params, tx.init(params))
  assert jnp.isfinite(loss), (model, optimizer, parts)
  assert all(
    bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(new_params)
  )


@pytest.mark.parametrize("norm", LM_PARTS["norm"])
def test_norm_in_lm(norm):
  one_step("lm", norm=norm)


@pytest.mark.parametrize("norm", CNN_PARTS["norm"])
def test_norm_in_cnn(norm):
  one_step("cnn", norm=norm)


@pytest.mark.parametrize("attention", LM_PARTS["attention"])
def test_attention_in_lm(attention):
  one_step("lm", attention=attention)


@pytest.mark.parametrize("attention", VIT_PARTS["attention"])
def test_attention_in_vit(attention):
  one_step("vit", attention=attention)


@pytest.mark.parametrize("residual", LM_PARTS["residual"])
def test_residual_in_lm(residual):
  one_step("lm", residual=residual)


@pytest.mark.parametrize("activation", LM_PARTS["activation"])
def test_activation_in_lm(activation):
  one_step("lm", activation=activation)


@pytest.mark.parametrize("activation", ["selu", "elu"])
def test_snn(activation):
  one_step("mlp", activation=activation)


@pytest.mark.parametrize("optimizer", sorted(optimizers.OPTIMIZERS))
def test_optimizer_on_lm(optimizer):
  one_step("lm", optimizer=optimizer)


def test_bidirectional_attention_refused_in_lm():
  with pytest.raises(
    ValueError,
    match=r"attention 'soft' has no causal "
    r"form",
  ):
    one_step("lm", attention="soft")
