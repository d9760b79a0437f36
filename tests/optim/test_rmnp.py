"""RMNP against a NumPy transcription of the official step, and invariants."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxnorm import optim
from tests import helpers
from tests.oracles import optim_numpy

rmnp_lib = importlib.import_module("jaxnorm.optim.rmnp")
TORCH_SHAPES = {"tall": (8, 5), "wide": (4, 16), "conv": (6, 3, 3, 3)}
STEPS = 6


def _inputs(seed=0):
  rng = np.random.RandomState(seed)
  p0 = {k: rng.randn(*s).astype(np.float32) for k, s in TORCH_SHAPES.items()}
  grads = {
    k: rng.randn(STEPS, *s).astype(np.float32) for k, s in TORCH_SHAPES.items()
  }
  return p0, grads


def _replay(tx, p0, grads):
  state = tx.init(p0)

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p, traj = p0, []
  for t in range(STEPS):
    p, state = step(p, state, jax.tree.map(lambda g: g[t], grads))
    traj.append(p)
  return jax.tree.map(lambda *x: np.stack(x), *traj)


@pytest.mark.parametrize(
  "nesterov,wd", [(True, 0.0), (True, 0.1), (False, 0.05)]
)
def test_matches_numpy_official_torch_layout(nesterov, wd):
  p0, grads = _inputs()
  tx = optim.rmnp(
    0.02,
    beta=0.9,
    nesterov=nesterov,
    weight_decay=wd,
    axes=optim.MatrixAxes(output=0),
  )
  out = _replay(tx, p0, grads)
  for k in TORCH_SHAPES:
    ref = optim_numpy.rmnp_reference(
      p0[k], grads[k], lr=0.02, momentum=0.9, nesterov=nesterov, wd=wd
    )
    np.testing.assert_allclose(out[k], ref, rtol=1e-6, atol=1e-6, err_msg=k)


def _to_flax(x, batched):
  return np.moveaxis(x, batched, -1)


def test_matches_numpy_official_flax_layout():
  p0, grads = _inputs(1)
  tx = optim.rmnp(0.02, weight_decay=0.1)
  out = _replay(
    tx,
    {k: _to_flax(v, 0) for k, v in p0.items()},
    {k: _to_flax(v, 1) for k, v in grads.items()},
  )
  for k in TORCH_SHAPES:
    ref = optim_numpy.rmnp_reference(p0[k], grads[k], lr=0.02, wd=0.1)
    np.testing.assert_allclose(
      np.moveaxis(out[k], -1, 1), ref, rtol=1e-6, atol=1e-6, err_msg=k
    )


def test_within_bf16_rounding_of_the_official_buffer():
  p0, grads = _inputs(2)
  out = _replay(optim.rmnp(0.02, axes=optim.MatrixAxes(output=0)), p0, grads)
  for k in TORCH_SHAPES:
    ref = optim_numpy.rmnp_reference(p0[k], grads[k], lr=0.02, bf16=True)
    step_ours = out[k][0] - p0[k]
    step_ref = ref[0] - p0[k]
    rel = np.abs(step_ours - step_ref).max() / np.abs(step_ref).max()
    assert 0 < rel < 4e-3


@settings(max_examples=6, deadline=None)
@given(
  n_in=st.integers(1, 9), n_out=st.integers(1, 9), seed=st.integers(0, 2**16)
)
def test_unit_rows_before_shape_scale(n_in, n_out, seed):
  if n_in * n_out < 2:
    n_in = 2
  u = jax.random.normal(jax.random.key(seed), (n_in, n_out), jnp.float32)
  d = optim._axes.resolve("t", optim.MatrixAxes(), u.shape)
  r = rmnp_lib.row_normalize(u, d)
  np.testing.assert_allclose(
    np.linalg.norm(np.asarray(r), axis=0), 1.0, atol=1e-6
  )
  tx = optim.scale_by_rmnp(0.0, nesterov=False)
  out, _ = tx.update(u, tx.init(u))
  np.testing.assert_allclose(
    np.linalg.norm(np.asarray(out), axis=0),
    np.sqrt(max(1.0, n_out / n_in)),
    rtol=1e-6,
  )


def test_orthogonal_rows_give_the_polar_factor(key):
  # torch wide U = D Q (orthonormal rows): RMNP direction = polar factor.
  k1, k2 = jax.random.split(key)
  q, _ = np.linalg.qr(np.asarray(jax.random.normal(k1, (12, 5)), np.float64))
  dscale = np.diag(np.asarray(jax.random.uniform(k2, (5,)), np.float64) + 0.5)
  u_torch = dscale @ q.T  # (5, 12)
  uu, _, vh = np.linalg.svd(u_torch, full_matrices=False)
  polar = uu @ vh
  tx = optim.scale_by_rmnp(0.0, nesterov=False, axes=optim.MatrixAxes(output=0))
  out, _ = tx.update(
    jnp.asarray(u_torch, jnp.float32), tx.init(jnp.zeros((5, 12)))
  )
  np.testing.assert_allclose(np.asarray(out), polar, atol=1e-6)


def test_scale_invariance_and_ema_equivalence(key):
  g = jax.random.normal(key, (3, 2, 6, 4), jnp.float32)  # steps, layers
  axes = optim.MatrixAxes(output=2, reduction=1)
  tx = optim.scale_by_rmnp(0.9, nesterov=False, axes=axes)
  a, _ = tx.update(g[0], tx.init(g[0]))
  b, _ = tx.update(3.7 * g[0], tx.init(g[0]))
  helpers.assert_close(a, b, atol=1e-6)
  np.testing.assert_allclose(
    np.linalg.norm(np.asarray(a), axis=1), 1.0, atol=1e-6
  )
  sums = optim.scale_by_rmnp(0.9, nesterov=False, axes=axes)
  emas = optim.scale_by_rmnp(0.9, nesterov=False, ema=True, axes=axes)
  s1, s2 = sums.init(g[0]), emas.init(g[0])
  for t in range(3):
    u1, s1 = sums.update(g[t], s1)
    u2, s2 = emas.update(g[t], s2)
    helpers.assert_close(u1, u2, atol=1e-6)


def test_vectors_go_to_adamw(key):
  params = {"w": jnp.ones((4, 6)), "b": jnp.ones((6,))}
  grads = {"w": jax.random.normal(key, (4, 6)), "b": jnp.full((6,), 0.5)}
  tx = optim.rmnp(0.02, adam_learning_rate=0.1)
  u, _ = tx.update(grads, tx.init(params), params)
  # AdamW first step: -lr * g / |g| (eps negligible).
  helpers.assert_close(u["b"], jnp.full((6,), -0.1), atol=1e-6)
  np.testing.assert_allclose(
    np.linalg.norm(np.asarray(u["w"]), axis=0), 0.02 * np.sqrt(6 / 4), rtol=1e-6
  )


def test_axes_none_routes_matrix_to_adamw(key):
  params = {"emb": jnp.ones((5, 3)), "w": jnp.ones((3, 3))}
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 2.0), params)
  tx = optim.rmnp(
    0.02,
    adam_learning_rate=0.1,
    axes=lambda p: {"emb": None, "w": optim.MatrixAxes()},
  )
  u, _ = tx.update(grads, tx.init(params), params)
  helpers.assert_close(u["emb"], jnp.full((5, 3), -0.1), atol=1e-6)
  helpers.assert_close(u["w"], jnp.full((3, 3), -0.02 / np.sqrt(3)), atol=1e-6)


def test_rejects_non_matrix_leaf_and_bad_hyper():
  tx = optim.scale_by_rmnp()
  with pytest.raises(ValueError, match="scale_by_rmnp: every leaf needs"):
    tx.update(jnp.ones((3,)), tx.init(jnp.ones((3,))))
  with pytest.raises(ValueError, match="scale_by_rmnp: beta must lie in"):
    optim.scale_by_rmnp(beta=1.0)
  with pytest.raises(ValueError, match="rmnp: beta must lie in"):
    optim.rmnp(0.02, beta=1.0)
  with pytest.raises(ValueError, match="rmnp: eps must lie in"):
    optim.rmnp(0.02, eps=-1.0)
  with pytest.raises(ValueError, match="rmnp: adam_weight_decay must lie"):
    optim.rmnp(0.02, adam_weight_decay=-1.0)
