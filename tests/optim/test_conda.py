"""Conda against pytorch_optimizer goldens and a NumPy transcription."""

import importlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import optim
from tests import helpers
from tests.oracles import optim_conda as oracle
from tests.oracles import optim_numpy

# The package re-exports the function `conda`, shadowing the module attribute.
conda_lib = importlib.import_module("jaxnorm.optim.conda")
GOLDEN = pathlib.Path(oracle.__file__).with_name("conda_golden.npz")
TORCH_AXES = optim.MatrixAxes(output=0)


def _replay(tx, p0, grads, steps):
  state = tx.init(p0)

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p, traj, states = p0, [], []
  for t in range(steps):
    p, state = step(p, state, jax.tree.map(lambda g: g[t], grads))
    traj.append(p)
    states.append(state)
  return jax.tree.map(lambda *x: np.stack(x), *traj), states


def _tx(case, offset, axes=TORCH_AXES):
  kw = oracle.CASES[case]
  return optim.conda(
    kw["lr"],
    b1=kw["betas"][0],
    b2=kw["betas"][1],
    weight_decay=kw["weight_decay"],
    update_proj_gap=kw["update_proj_gap"],
    scale=kw["scale"],
    refresh_offset=offset,
    axes=axes,
  )


def _load(case):
  data = np.load(GOLDEN)
  p0 = {k: jnp.asarray(data[f"{case}/{k}/p0"]) for k in oracle.SHAPES}
  grads = {k: jnp.asarray(data[f"{case}/{k}/grads"]) for k in oracle.SHAPES}
  ref = {k: data[f"{case}/{k}/params"] for k in oracle.SHAPES}
  return p0, grads, ref


def _assert_traj(out, ref, rtol=1e-6):
  for k in ref:
    np.testing.assert_allclose(
      out[k], ref[k], rtol=rtol, atol=rtol * np.abs(ref[k]).max(), err_msg=k
    )


def test_matches_pytorch_optimizer_shifted_schedule():
  p0, grads, ref = _load("gap3")
  out, _ = _replay(_tx("gap3", 1), p0, grads, oracle.STEPS)
  _assert_traj(out, ref)


def test_matches_pytorch_optimizer_before_first_refresh_official_schedule():
  p0, grads, ref = _load("gap100")
  out, _ = _replay(_tx("gap100", 0), p0, grads, oracle.STEPS)
  _assert_traj(out, ref)


def test_official_schedule_differs_from_pytorch_optimizer_after_gap():
  p0, grads, ref = _load("gap3")
  out, _ = _replay(_tx("gap3", 0), p0, grads, oracle.STEPS)
  _assert_traj(
    {k: v[:2] for k, v in out.items()}, {k: v[:2] for k, v in ref.items()}
  )
  assert np.abs(out["tall"][-1] - ref["tall"][-1]).max() > 1e-4


@pytest.mark.parametrize("layout", ["torch", "flax"])
def test_matches_numpy_official_over_several_refreshes(layout):
  p0, grads, _ = _load("gap3")
  kw = oracle.CASES["gap3"]
  if layout == "flax":
    p0f = {k: v.T for k, v in p0.items()}
    gf = {k: jnp.swapaxes(v, 1, 2) for k, v in grads.items()}
    out, _ = _replay(_tx("gap3", 0, axes=None), p0f, gf, oracle.STEPS)
    out = {k: np.swapaxes(v, 1, 2) for k, v in out.items()}
  else:
    out, _ = _replay(_tx("gap3", 0), p0, grads, oracle.STEPS)
  for k in oracle.SHAPES:
    ref, _ = optim_numpy.conda_reference(
      p0[k],
      grads[k],
      lr=kw["lr"],
      b1=kw["betas"][0],
      b2=kw["betas"][1],
      wd=kw["weight_decay"],
      gap=kw["update_proj_gap"],
      scale=kw["scale"],
    )
    np.testing.assert_allclose(
      out[k], ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max(), err_msg=k
    )


def test_live_oracle_matches_committed_golden():
  pytest.importorskip("torch")
  pytest.importorskip("pytorch_optimizer")
  live = oracle.run("gap3")
  data = np.load(GOLDEN)
  for k, v in live.items():
    np.testing.assert_array_equal(v, data[f"gap3/{k}"], err_msg=k)


def test_basis_orthogonal_and_frozen_between_refreshes():
  p0, grads, _ = _load("gap3")
  _, states = _replay(_tx("gap3", 0), p0, grads, 7)
  # one basis per matrix leaf, in leaf order (square, tall, wide).
  bases = [jax.tree.leaves(s.basis) for s in states]
  for b in bases:
    for q in b:
      q = np.asarray(q, np.float64)
      np.testing.assert_allclose(q @ q.T, np.eye(q.shape[0]), atol=1e-5)
  # refreshes at 0-based steps 0, 3, 6: bit-identical in between.
  for t in (1, 2, 4, 5):
    for a, b in zip(bases[t], bases[t - 1]):
      np.testing.assert_array_equal(a, b)
  assert not np.array_equal(bases[3][1], bases[2][1])


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_first_step_with_zero_betas_is_rotated_sign(key, shape):
  # b1 = b2 = 0: M = G, V = Gp^2, so the update is back(sign(Gp)).
  g = jax.random.normal(key, shape, jnp.float32)
  tx = optim.scale_by_conda(0.0, 0.0, 1e-12)
  u, state = tx.update(g, tx.init(g))
  q = state.basis
  q = np.asarray(q, np.float64)
  g64 = np.asarray(g, np.float64)
  if shape[0] <= shape[1]:  # flax (in, out): rotate the input side
    expect = q @ np.sign(q.T @ g64)
  else:
    expect = np.sign(g64 @ q) @ q.T
  np.testing.assert_allclose(np.asarray(u), expect, atol=1e-5)


def test_batch_axes_are_independent(key):
  k1, k2 = jax.random.split(key)
  w = jax.random.normal(k1, (3, 5, 7), jnp.float32)
  g = jax.random.normal(k2, (3, 5, 7), jnp.float32)
  tx = optim.scale_by_conda(axes=optim.MatrixAxes(output=2, reduction=1))
  u, _ = tx.update(g, tx.init(w))
  for i in range(3):
    txi = optim.scale_by_conda()
    ui, _ = txi.update(g[i], txi.init(w[i]))
    helpers.assert_close(u[i], ui, atol=1e-6)


@pytest.mark.parametrize(
  "ptype,side",
  [("std", "in"), ("reverse_std", "out"), ("right", "in"), ("left", "out")],
)
def test_projection_type_picks_side(ptype, side):
  d = optim._axes.resolve("t", optim.MatrixAxes(), (4, 9))
  assert conda_lib._side(d, ptype) == side


def test_post_step_decay_order(key):
  w = jax.random.normal(key, (4, 4), jnp.float32)
  u = jnp.full((4, 4), 0.1, jnp.float32)
  tx = conda_lib.add_decayed_weights_after_step(0.5, 0.2)
  out, _ = tx.update(u, tx.init(w), w)
  helpers.assert_close(w + out, (w + u) * (1 - 0.5 * 0.2), atol=1e-6)
  with pytest.raises(
    ValueError, match="add_decayed_weights_after_step: params are required"
  ):
    tx.update(u, tx.init(w))
  tx0 = conda_lib.add_decayed_weights_after_step(0.5, 0)
  out0, _ = tx0.update(u, tx0.init(w))
  helpers.assert_close(out0, u, atol=0)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(projection_type="full"), "projection_type must be one of"),
    (dict(update_proj_gap=0), "update_proj_gap must be a positive integer"),
    (dict(refresh_offset=2), "refresh_offset must be 0"),
    (dict(b1=1.5), "scale_by_conda: b1 must lie in"),
    (dict(b2=1.0), "scale_by_conda: b2 must lie in"),
    (dict(eps=-1.0), "scale_by_conda: eps must lie in"),
  ],
)
def test_rejects_bad_config(kwargs, match):
  with pytest.raises(ValueError, match=match):
    optim.conda(1e-3, **kwargs)


def test_rejects_negative_decay():
  with pytest.raises(ValueError, match="conda: weight_decay must lie in"):
    optim.conda(1e-3, weight_decay=-1.0)
  with pytest.raises(ValueError, match="conda: adam_weight_decay must lie"):
    optim.conda(1e-3, adam_weight_decay=-1.0)


def test_vectors_take_the_unprojected_official_step():
  # The official class's second group: Adam, eps on the uncorrected root,
  # decay after the step, no `scale`.
  b = np.linspace(-1.0, 1.0, 5)
  grads = np.stack([np.cos(b * (t + 1)) for t in range(3)])
  lr, wd, b1, b2, eps = 0.1, 0.2, 0.9, 0.99, 1e-3
  tx = optim.conda(lr, b1, b2, eps, wd, scale=0.25)
  out, _ = _replay(
    tx, {"b": jnp.asarray(b, jnp.float32)}, {"b": jnp.asarray(grads)}, 3
  )
  ref, _ = optim_numpy.conda_reference(
    b, grads, lr=lr, b1=b1, b2=b2, eps=eps, wd=wd, proj_type=None
  )
  np.testing.assert_allclose(out["b"], ref, rtol=1e-6, atol=1e-7)


NON_SQUARE = {"tall": (7, 4), "wide": (4, 7)}  # torch (out, in)


@pytest.mark.parametrize("ptype", ["std", "reverse_std", "right", "left"])
def test_projection_types_on_non_square_match_numpy(ptype):
  # 'reverse_std' (both shapes), 'right' on wide and 'left' on tall are
  # low-rank projections: the official code fails there (see the module
  # doc); the transcription keeps V in projected coordinates.
  rng = np.random.RandomState(3)
  p0 = {k: rng.randn(*s).astype(np.float32) for k, s in NON_SQUARE.items()}
  grads = {
    k: rng.randn(5, *s).astype(np.float32) for k, s in NON_SQUARE.items()
  }
  kw = dict(b1=0.9, b2=0.99, update_proj_gap=2, scale=0.5)
  tx = optim.conda(
    1e-2, weight_decay=0.1, projection_type=ptype, axes=TORCH_AXES, **kw
  )
  out, states = _replay(tx, p0, grads, 5)
  for k in NON_SQUARE:
    ref, _ = optim_numpy.conda_reference(
      p0[k],
      grads[k],
      lr=1e-2,
      wd=0.1,
      gap=2,
      b1=0.9,
      b2=0.99,
      scale=0.5,
      proj_type=ptype,
    )
    np.testing.assert_allclose(out[k], ref, rtol=1e-5, atol=1e-6, err_msg=k)
    # torch 'right' stores Vh (r, in), 'left' U (out, r): ours is (k, r).
    assert states[-1].basis[k].shape[-1] == min(NON_SQUARE[k])
    assert states[-1].nu[k].shape == NON_SQUARE[k]
