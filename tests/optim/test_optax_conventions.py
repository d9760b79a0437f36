"""optax's conventions, checked on every jaxnorm optimizer.

``optax.tree.map_params`` over the state, state sharded like the parameters
from ``init``, updates under an explicit mesh, ``mu_dtype``,
``inject_hyperparams`` (learning rate and NaP's ``period``), extra keyword
arguments of ``update``, ``MultiSteps`` and missing ``params``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import optim
from tests import helpers

P = jax.sharding.PartitionSpec
SHAPES = {"w": (8, 16), "conv": (2, 2, 4, 8), "b": (16,)}
# Pytree specs (not callables), so init on map_params' placeholder, which
# has no leaves, must not try to match them.
AXES = {"w": optim.MatrixAxes(), "conv": optim.MatrixAxes(), "b": None}
MASK = {"w": True, "conv": True, "b": False}
GROUPS = {"w": -1, "conv": 0, "b": 0}

FACTORIES = {
  "adamp": lambda lr=0.05, **kw: optim.adamp(
    lr, weight_decay=0.1, axes=AXES, **kw
  ),
  "sgdp": lambda lr=0.05, **kw: optim.sgdp(
    lr, momentum=0.9, weight_decay=0.1, axes=AXES, **kw
  ),
  "conda": lambda lr=0.05, **kw: optim.conda(
    lr, weight_decay=0.1, update_proj_gap=2, axes=AXES, **kw
  ),
  "rmnp": lambda lr=0.05, **kw: optim.rmnp(
    lr, weight_decay=0.1, adam_weight_decay=0.1, axes=AXES, **kw
  ),
  "nap_project": lambda: optim.nap_project(MASK, period=2, axes=AXES),
  "nap_project_joint": lambda: optim.nap_project_joint(GROUPS),
}
MOMENTS = ["adamp", "sgdp", "conda", "rmnp"]
FIRST_MOMENT = {"adamp": "mu", "sgdp": "momentum", "conda": "mu"}
FIRST_MOMENT["rmnp"] = "momentum"


def _params(key, dtype=jnp.float32):
  ks = jax.random.split(key, len(SHAPES))
  return {
    k: jax.random.normal(kk, s, dtype) for kk, (k, s) in zip(ks, SHAPES.items())
  }


def _grads(params, i):
  return jax.tree.map(lambda x: jnp.cos(x * (i + 1.0)).astype(x.dtype), params)


def _names(path):
  return {getattr(k, "name", getattr(k, "key", None)) for k in path}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_map_params_reaches_every_parameter_tree(name, key):
  tx = FACTORIES[name]()
  p = _params(key)
  state = tx.init(p)
  assert optax.tree.map_params(tx, lambda v: v, state) is not None
  marked = optax.tree.map_params(
    tx, lambda v: jnp.full_like(v, 7), state, transform_non_params=lambda v: v
  )
  chex.assert_trees_all_equal_structs(marked, state)
  flat = jax.tree_util.tree_leaves_with_path(state)
  new = jax.tree.leaves(marked)
  assert len(flat) == len(new) > 1
  for (path, old), leaf in zip(flat, new):
    if "count" in _names(path):  # not a parameter tree: untouched
      np.testing.assert_array_equal(leaf, old)
    else:  # moments, bases and targets sit in parameter-shaped trees
      np.testing.assert_array_equal(leaf, np.full(old.shape, 7))


def _mesh(axis_type):
  return jax.make_mesh(
    (2, 2), ("a", "b"), devices=jax.devices()[:4], axis_types=(axis_type,) * 2
  )


SPECS = {"w": P("a", "b"), "conv": P(None, None, "a", "b"), "b": P("b")}


def _param_shaped(state, params):
  """``(param key, leaf)`` for every state leaf of a parameter's shape."""
  out = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    key = getattr(path[-1], "key", None)
    if key in params and leaf.shape == params[key].shape:
      out.append((key, leaf))
  return out


@pytest.mark.parametrize("name", MOMENTS)
def test_init_keeps_the_parameter_sharding(name, key):
  mesh = _mesh(jax.sharding.AxisType.Auto)
  p = {
    k: jax.device_put(v, jax.NamedSharding(mesh, SPECS[k]))
    for k, v in _params(key).items()
  }
  leaves = _param_shaped(FACTORIES[name]().init(p), p)
  assert {k for k, _ in leaves} == set(SHAPES)
  for k, leaf in leaves:
    assert leaf.sharding.is_equivalent_to(p[k].sharding, leaf.ndim), k


@pytest.mark.parametrize("name", list(FACTORIES))
def test_explicit_mesh_update_equals_unsharded(name, key):
  tx = FACTORIES[name]()
  p0 = _params(key)

  def run(params):
    state = jax.jit(tx.init)(params)
    types = jax.tree.map(jax.typeof, state)
    step = jax.jit(tx.update)
    for i in range(3):  # Conda refreshes its basis at steps 0 and 2
      u, state = step(_grads(params, i), state, params)
      params = optax.apply_updates(params, u)
    return params, types, jax.tree.map(jax.typeof, state)

  ref, _, _ = run(p0)
  with jax.set_mesh(_mesh(jax.sharding.AxisType.Explicit)):
    sharded = {k: jax.device_put(v, SPECS[k]) for k, v in p0.items()}
    out, t0, t1 = run(sharded)
    for k, v in out.items():
      assert jax.typeof(v).sharding.spec == SPECS[k], k
    # state types (shape, dtype and sharding) are the same after a step
    assert t1 == t0
    if name in MOMENTS:
      for k, t in _param_shaped(t0, p0):
        assert t.sharding.spec == SPECS[k], (k, t)
  helpers.assert_close(out, ref, atol=1e-5)


def _moments(state, field):
  return [
    leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    if field in _names(path)
  ]


@pytest.mark.parametrize("name", MOMENTS)
@pytest.mark.parametrize(
  "mu_dtype", [None, jnp.bfloat16, jnp.dtype("bfloat16"), "float32"]
)
def test_mu_dtype_and_stable_state_dtypes(name, mu_dtype, key):
  p = _params(key, jnp.bfloat16)
  tx = FACTORIES[name](mu_dtype=mu_dtype)
  state = tx.init(p)
  want = jnp.float32 if mu_dtype is None else jnp.dtype(mu_dtype)
  first = _moments(state, FIRST_MOMENT[name])
  assert len(first) == len(SHAPES)
  assert all(m.dtype == want for m in first)
  # second moments keep jaxnorm's float32 whatever mu_dtype says
  assert all(v.dtype == jnp.float32 for v in _moments(state, "nu"))
  step = jax.jit(lambda g, s, q: tx.update(g, s, q))
  u, s1 = step(_grads(p, 0), state, p)
  chex.assert_trees_all_equal_dtypes(u, p)
  _, s2 = step(_grads(p, 1), s1, optax.apply_updates(p, u))
  for s in (s1, s2):
    chex.assert_trees_all_equal_structs(s, state)
    chex.assert_trees_all_equal_shapes_and_dtypes(s, state)


INJECT = {
  "adamp": (optim.adamp, dict(b1=0.8, eps=1e-6, delta=0.2)),
  "sgdp": (optim.sgdp, dict(momentum=0.9, dampening=0.1, wd_ratio=0.2)),
  "conda": (
    optim.conda,
    dict(b2=0.99, scale=0.5, update_proj_gap=2, refresh_offset=1),
  ),
  "rmnp": (optim.rmnp, dict(beta=0.9, eps=1e-8, adam_b2=0.99)),
}


@pytest.mark.parametrize("name", list(INJECT))
def test_inject_hyperparams_matches_and_reads_the_learning_rate(name, key):
  fn, kw = INJECT[name]
  kw = dict(kw, learning_rate=0.05, axes=AXES)
  p = _params(key)
  plain = fn(**kw)
  injected = optax.inject_hyperparams(fn)(**kw)
  s0, s1 = plain.init(p), jax.jit(injected.init)(p)
  plain_step, step = jax.jit(plain.update), jax.jit(injected.update)
  for i in range(3):
    u0, s0 = plain_step(_grads(p, i), s0, p)
    u1, s1 = step(_grads(p, i), s1, p)
    helpers.assert_close(u1, u0, atol=1e-6)
  helpers.assert_close(s1.inner_state, s0, atol=1e-6)
  # Without weight decay the step is linear in the injected rate.
  u_lr, _ = step(_grads(p, 3), s1, p)
  s1.hyperparams["learning_rate"] = jnp.asarray(0.1)
  u_2lr, _ = step(_grads(p, 3), s1, p)
  helpers.assert_close(u_2lr, jax.tree.map(lambda x: 2 * x, u_lr), atol=1e-6)
  assert np.abs(np.asarray(u_lr["w"])).max() > 1e-3


def test_inject_hyperparams_nap_period(key):
  p = _params(key)
  kw = dict(mask=MASK, period=3, eps=1e-12, axes=AXES)
  plain = optim.nap_project(**kw)
  injected = optax.inject_hyperparams(optim.nap_project)(**kw)
  s0, s1 = plain.init(p), jax.jit(injected.init)(p)
  assert s1.hyperparams["period"].dtype == jnp.int32
  step = jax.jit(injected.update)
  for i in range(4):
    u0, s0 = plain.update(_grads(p, i), s0, p)
    u1, s1 = step(_grads(p, i), s1, p)
    helpers.assert_close(u1, u0, atol=1e-6)
  # Step 5 does not project with period 3; with period 1 every step does.
  g = _grads(p, 4)
  u_plain, _ = plain.update(g, s0, p)
  helpers.assert_close(u_plain, g, atol=0)
  s1.hyperparams["period"] = jnp.asarray(1, jnp.int32)
  u_every, _ = step(g, s1, p)
  w = p["w"] + u_every["w"]
  np.testing.assert_allclose(
    np.linalg.norm(w), np.linalg.norm(p["w"]), rtol=1e-5
  )
  assert np.abs(np.asarray(u_every["w"] - g["w"])).max() > 1e-3
  helpers.assert_close(u_every["b"], g["b"], atol=0)


def test_nap_period_array_must_be_an_integer_scalar():
  with pytest.raises(TypeError, match="nap_project: period must be a positive"):
    optim.nap_project(MASK, period=jnp.asarray(2.0))
  with pytest.raises(TypeError, match="scale_by_conda: update_proj_gap must"):
    optim.conda(0.1, update_proj_gap=jnp.asarray([2, 3]))
  with pytest.raises(TypeError, match="scale_by_conda: refresh_offset must"):
    optim.conda(0.1, refresh_offset=jnp.asarray(0.5))


PUBLIC = {
  **{k: FACTORIES[k] for k in MOMENTS},
  "complex_adam": lambda: optim.complex_adam(0.05, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(PUBLIC))
def test_update_ignores_unexpected_extra_args(name, key):
  tx = PUBLIC[name]()
  p = _params(key)
  state = tx.init(p)
  ref, ref_state = tx.update(_grads(p, 0), state, p)
  u, new_state = jax.jit(
    lambda g, s, q: tx.update(g, s, q, unexpected_extra_arg=1)
  )(_grads(p, 0), state, p)
  helpers.assert_close(u, ref, atol=1e-6)
  helpers.assert_close(new_state, ref_state, atol=1e-6)


@pytest.mark.parametrize("name", MOMENTS)
def test_constructors_reject_unknown_keywords(name):
  with pytest.raises(TypeError, match="unexpected keyword argument 'betas'"):
    FACTORIES[name](betas=(0.9, 0.99))


@pytest.mark.parametrize("name", list(FACTORIES))
def test_multisteps_with_bf16_params(name, key):
  p = _params(key, jnp.bfloat16)
  multi = optax.MultiSteps(FACTORIES[name](), every_k_schedule=2)
  state = multi.init(p)
  with jax.numpy_dtype_promotion("standard"):  # optax's own accumulator
    step = jax.jit(multi.update)
    u0, s1 = step(_grads(p, 0), state, p)
    u1, s2 = step(_grads(p, 1), s1, p)
  chex.assert_trees_all_equal_dtypes(u0, p)
  chex.assert_trees_all_equal_dtypes(u1, p)
  helpers.assert_close(u0, jax.tree.map(jnp.zeros_like, p), atol=0)
  assert np.abs(np.asarray(u1["conv"], np.float32)).max() > 0
  chex.assert_trees_all_equal_shapes_and_dtypes(s2, state)


NEEDS_PARAMS = {
  "adamp": "scale_by_adamp: params are required",
  "sgdp": "scale_by_sgdp: params are required",
  "conda": "conda: params are required",
  "rmnp": "rmnp: params are required",
  "nap_project": "nap_project: params are required",
  "nap_project_joint": "nap_project_joint: params are required",
}


@pytest.mark.parametrize("name", list(NEEDS_PARAMS))
def test_update_without_params_names_them(name, key):
  tx = FACTORIES[name]()
  p = _params(key)
  with pytest.raises(ValueError, match=NEEDS_PARAMS[name]):
    tx.update(_grads(p, 0), tx.init(p))


TRANSFORMS = {
  "scale_by_adamp": optim.scale_by_adamp,
  "scale_by_sgdp": optim.scale_by_sgdp,
  "scale_by_conda": optim.scale_by_conda,
  "scale_by_rmnp": optim.scale_by_rmnp,
  "scale_by_complex_adam": optim.scale_by_complex_adam,
  "conda": lambda: optim.conda(0.1),
  "rmnp": lambda: optim.rmnp(0.1),
  "nap_project": FACTORIES["nap_project"],
  "nap_project_joint": FACTORIES["nap_project_joint"],
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_state_is_a_namedtuple_with_int32_count_first(name):
  p = {"w": jnp.ones((8, 16)), "conv": jnp.ones((2, 2, 4, 8))}
  p["b"] = jnp.ones((16,))
  state = TRANSFORMS[name]().init(p)
  assert state._fields[0] == "count"
  assert state.count.dtype == jnp.int32 and state.count.shape == ()
