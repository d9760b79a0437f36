"""Behaviour every optimizer shares: convergence, dtypes, state, wrappers,
nnx.Optimizer and sharded parameters."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import optim
from jaxnorm import sharding as jsharding
from tests import helpers

STACK = optim.MatrixAxes(output=2, reduction=1)


def _axes(params):
  return jax.tree.map(
    lambda p: (
      STACK if p.ndim == 3 else (optim.MatrixAxes() if p.ndim == 2 else None)
    ),
    params,
  )


def _matrices(params):
  """The runner's kind of mask: decay leaves of rank >= 2."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


WD = 1e-3
FACTORIES = {
  "adamp": lambda lr, wd=WD, mask=_matrices: optim.adamp(
    lr, weight_decay=wd, axes=_axes, mask=mask
  ),
  "sgdp": lambda lr, wd=WD, mask=_matrices: optim.sgdp(
    lr, momentum=0.9, weight_decay=wd, nesterov=True, axes=_axes, mask=mask
  ),
  "conda": lambda lr, wd=WD, mask=_matrices: optim.conda(
    lr, weight_decay=wd, update_proj_gap=4, axes=_axes, mask=mask
  ),
  "rmnp": lambda lr, wd=WD, mask=_matrices: optim.rmnp(
    lr, weight_decay=wd, adam_weight_decay=wd, axes=_axes, mask=mask
  ),
}
LR = {"adamp": 0.05, "sgdp": 0.01, "conda": 0.05, "rmnp": 0.05}
MLP_LR = {"adamp": 0.05, "sgdp": 0.1, "conda": 0.05, "rmnp": 0.05}


def _params(key, dtype=jnp.float32):
  k1, k2, k3 = jax.random.split(key, 3)
  return {
    "w": jax.random.normal(k1, (8, 6), dtype),
    "stack": jax.random.normal(k2, (2, 4, 5), dtype),
    "b": jax.random.normal(k3, (6,), dtype),
  }


def _quadratic(key):
  """Ill-conditioned quadratic: curvatures from 1 to 100 across rows."""
  target = _params(jax.random.fold_in(key, 1))
  curv = jax.tree.map(
    lambda t: jnp.reshape(
      jnp.logspace(0.0, 2.0, t.shape[-1]), (1,) * (t.ndim - 1) + (t.shape[-1],)
    ),
    target,
  )

  def loss(p):
    terms = jax.tree.map(
      lambda x, t, c: jnp.sum(c * jnp.square(x - t)), p, target, curv
    )
    return 0.5 * sum(jax.tree.leaves(terms))

  return loss


def _train(tx, params, loss, steps):
  state = tx.init(params)

  def body(carry, _):
    p, s = carry
    g = jax.grad(loss)(p)
    u, s = tx.update(g, s, p)
    return (optax.apply_updates(p, u), s), None

  (params, state), _ = jax.jit(
    lambda c: jax.lax.scan(body, c, None, length=steps)
  )((params, state))
  return params, state


@pytest.mark.parametrize("name", list(FACTORIES))
def test_converges_on_ill_conditioned_quadratic(name, key):
  loss = _quadratic(key)
  p0 = _params(key)
  lr = optax.cosine_decay_schedule(LR[name], 300)
  out, _ = _train(FACTORIES[name](lr), p0, loss, 300)
  assert float(loss(out)) < 1e-2 * float(loss(p0))


@pytest.mark.parametrize("name", list(FACTORIES))
def test_trains_tiny_mlp(name, key):
  kx, ky, kp = jax.random.split(key, 3)
  x = jax.random.normal(kx, (64, 6))
  y = jnp.sin(x @ jax.random.normal(ky, (6, 2)))
  k1, k2 = jax.random.split(kp)
  params = {
    "w1": jax.random.normal(k1, (6, 16)) / jnp.sqrt(6.0),
    "b1": jnp.zeros((16,)),
    "w2": jax.random.normal(k2, (16, 2)) / 4.0,
  }

  def loss(p):
    h = jnp.tanh(x @ p["w1"] + jnp.reshape(p["b1"], (1, 16)))
    return jnp.mean(jnp.square(h @ p["w2"] - y))

  lr = optax.cosine_decay_schedule(MLP_LR[name], 200)
  out, _ = _train(FACTORIES[name](lr), params, loss, 200)
  assert float(loss(out)) < 0.2 * float(loss(params))


@pytest.mark.parametrize("name", list(FACTORIES))
def test_bf16_params_keep_dtype_and_state_is_stable(name, key):
  p = _params(key, jnp.bfloat16)
  tx = FACTORIES[name](1e-2)
  state = tx.init(p)
  step = jax.jit(lambda p, s, g: tx.update(g, s, p))
  g = jax.tree.map(lambda x: (0.1 * x).astype(jnp.bfloat16), p)
  u, state1 = step(p, state, g)
  chex.assert_trees_all_equal_dtypes(u, p)
  p1 = optax.apply_updates(p, u)
  chex.assert_trees_all_equal_dtypes(p1, p)
  _, state2 = step(p1, state1, g)
  chex.assert_trees_all_equal_structs(state, state2)
  chex.assert_trees_all_equal_shapes_and_dtypes(state, state2)
  moments = [x for x in jax.tree.leaves(state) if x.ndim > 0]
  assert moments and all(x.dtype == jnp.float32 for x in moments)
  assert helpers.all_finite(p1)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_multisteps_averages_gradients(name, key):
  p = _params(key)
  g1 = jax.tree.map(lambda x: 0.3 * x + 0.1, p)
  g2 = jax.tree.map(lambda x: -0.2 * x + 0.05, p)
  gm = jax.tree.map(lambda a, b: 0.5 * (a + b), g1, g2)
  base = FACTORIES[name](1e-2)
  ref, _ = jax.jit(base.update)(gm, base.init(p), p)
  multi = optax.MultiSteps(FACTORIES[name](1e-2), every_k_schedule=2)
  s = multi.init(p)
  with jax.numpy_dtype_promotion("standard"):  # optax's own accumulator
    update = jax.jit(multi.update)
    u0, s = update(g1, s, p)
    u1, s = update(g2, s, p)
  helpers.assert_close(u0, jax.tree.map(jnp.zeros_like, p), atol=0)
  helpers.assert_close(u1, ref, atol=1e-6)


MASK = {"w": True, "stack": False, "b": False}
INJECT = {
  "adamp": (
    optim.adamp,
    dict(learning_rate=0.05, weight_decay=0.1, delta=0.1, mask=MASK),
  ),
  "sgdp": (
    optim.sgdp,
    dict(learning_rate=0.01, momentum=0.9, weight_decay=0.1, mask=MASK),
  ),
  "conda": (
    optim.conda,
    dict(learning_rate=0.05, scale=0.5, weight_decay=0.1, mask=MASK),
  ),
  "rmnp": (
    optim.rmnp,
    dict(learning_rate=0.05, beta=0.9, weight_decay=0.1, mask=MASK),
  ),
}


@pytest.mark.parametrize("name", list(INJECT))
def test_inject_hyperparams(name, key):
  fn, kw = INJECT[name]
  p = _params(key)
  g = jax.tree.map(lambda x: 0.3 * x + 0.1, p)
  plain = fn(**kw)
  injected = optax.inject_hyperparams(fn)(**kw)
  s0, s1 = plain.init(p), injected.init(p)
  plain_step, step = jax.jit(plain.update), jax.jit(injected.update)
  for _ in range(2):
    u0, s0 = plain_step(g, s0, p)
    u1, s1 = step(g, s1, p)
    helpers.assert_close(u1, u0, atol=1e-6)
  s1.hyperparams["learning_rate"] = jnp.asarray(0.0)
  u2, _ = step(g, s1, p)
  helpers.assert_close(u2, jax.tree.map(jnp.zeros_like, p), atol=0)


def _two_steps(tx, p):
  # Eager: cheaper than compiling one jit per variant at these sizes.
  step = tx.update
  s = tx.init(p)
  outs = []
  for i in range(2):
    g = jax.tree.map(lambda x, i=i: jnp.cos(x * (i + 1.0)), p)
    u, s = step(g, s, p)
    outs.append(u)
  return outs, s


@pytest.mark.parametrize("name", list(FACTORIES))
def test_mask_selects_decayed_leaves(name, key):
  p = _params(key)
  fac = FACTORIES[name]
  masked, _ = _two_steps(fac(0.05, 0.5, MASK), p)
  official, _ = _two_steps(fac(0.05, 0.5, None), p)
  undecayed, _ = _two_steps(fac(0.05, 0.0, None), p)
  as_callable, _ = _two_steps(fac(0.05, 0.5, lambda q: {**MASK}), p)
  everything, _ = _two_steps(fac(0.05, 0.5, True), p)  # a prefix mask
  for k, on in MASK.items():
    for t in range(2):
      want = (official if on else undecayed)[t][k]
      np.testing.assert_array_equal(masked[t][k], want, err_msg=k)
      np.testing.assert_array_equal(as_callable[t][k], want, err_msg=k)
      np.testing.assert_array_equal(everything[t][k], official[t][k])
      # the decay is visible, so a wrong mask would fail.
      gap = np.abs(official[t][k] - undecayed[t][k]).max()
      assert gap > 1e-4, (k, gap)


def test_mask_entries_must_be_bools(key):
  p = _params(key)
  tx = optim.adamp(0.1, weight_decay=0.1, mask={"w": 1, "stack": 1, "b": 0})
  with pytest.raises(ValueError, match="scale_by_adamp: mask entries must be"):
    tx.update(p, tx.init(p), p)


@pytest.mark.parametrize("name", ["conda", "rmnp"])
def test_one_step_counter(name, key):
  p = _params(key)
  schedule = optax.linear_schedule(0.05, 0.0, 10)
  tx = FACTORIES[name](schedule)
  _, s = _two_steps(tx, p)
  assert int(optax.tree_utils.tree_get(s, "count")) == 2


@pytest.mark.parametrize("name", ["conda", "rmnp"])
def test_decay_needs_params(name, key):
  p = _params(key)
  tx = FACTORIES[name](0.1)
  with pytest.raises(ValueError, match=f"{name}: params are required"):
    tx.update(p, tx.init(p))
  free = FACTORIES[name](0.1, 0)
  u, _ = free.update(p, free.init(p))
  assert helpers.all_finite(u)


class _MLP(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(6, 16, use_bias=False, rngs=rngs)
    self.norm = nnx.LayerNorm(16, use_scale=False, use_bias=False, rngs=rngs)
    self.l2 = nnx.Linear(16, 2, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.norm(self.l1(x))))


def _nap_mask(params):
  # Hidden kernel feeding the LayerNorm only; keyed by path.
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  flags = [
    any(getattr(k, "key", None) == "l1" for k in path) for path, _ in paths
  ]
  return jax.tree.unflatten(jax.tree.structure(params), flags)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_nnx_optimizer_with_nap(name, key):
  model = _MLP(nnx.Rngs(0))
  kx, ky = jax.random.split(key)
  x = jax.random.normal(kx, (32, 6))
  y = jax.random.normal(ky, (32, 2))
  tx = optax.chain(FACTORIES[name](0.02), optim.nap_project(_nap_mask))
  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
  norm0 = float(jnp.linalg.norm(model.l1.kernel[...]))

  def loss_fn(m):
    return jnp.mean(jnp.square(m(x) - y))

  @nnx.jit
  def step(m, o):
    loss, grads = nnx.value_and_grad(loss_fn)(m)
    o.update(m, grads)
    return loss

  losses = [float(step(model, opt)) for _ in range(40)]
  assert losses[-1] < 0.8 * losses[0]
  np.testing.assert_allclose(
    float(jnp.linalg.norm(model.l1.kernel[...])), norm0, rtol=1e-5
  )


@pytest.mark.parametrize("name", list(FACTORIES))
def test_sharded_equals_unsharded(name, key):
  mesh = jsharding.make_mesh((2, 2, 2))
  P = jax.sharding.PartitionSpec
  specs = {
    "w": P("fsdp", "tensor"),
    "stack": P(None, "data", "tensor"),
    "b": P("tensor"),
  }
  # Full-rank shapes divisible by the mesh (a rank-deficient Conda moment
  # has projected coordinates at rounding level, whose sign is arbitrary).
  ks = jax.random.split(key, 4)
  p = {
    "w": jax.random.normal(ks[0], (16, 12)),
    "stack": jax.random.normal(ks[1], (2, 8, 10)),
    "b": jax.random.normal(ks[2], (12,)),
  }
  tx = FACTORIES[name](1e-2)
  grads = [
    jax.tree.map(lambda x, i=i: jnp.cos(x * (i + 1.0)), p) for i in range(5)
  ]

  def run(params, gs):
    state = jax.jit(tx.init)(params)
    step = jax.jit(
      lambda q, s, g: (lambda u, s: (optax.apply_updates(q, u), s))(
        *tx.update(g, s, q)
      )
    )
    for g in gs:
      params, state = step(params, state, g)
    return params

  ref = run(p, grads)
  shard = lambda t: jax.tree.map(
    lambda x, s: jax.device_put(x, jax.NamedSharding(mesh, s)), t, specs
  )
  out = run(shard(p), [shard(g) for g in grads])
  assert out["w"].sharding.spec == specs["w"]
  helpers.assert_close(out, ref, atol=2e-6)
