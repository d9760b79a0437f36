"""AdamP / SGDP against the official torch code and the paper's invariants."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import optim
from tests import helpers
from tests.oracles import optim_adamp as oracle

GOLDEN = pathlib.Path(oracle.__file__).with_name("adamp_golden.npz")
TORCH_AXES = optim.MatrixAxes(output=0)


def _make(case: str, layout_axes) -> optax.GradientTransformation:
  name, kw = oracle.CASES[case]
  kw = dict(kw)
  lr = kw.pop("lr")
  if name == "adamp":
    if "betas" in kw:
      kw["b1"], kw["b2"] = kw.pop("betas")
    return optim.adamp(lr, axes=layout_axes, **kw)
  return optim.sgdp(lr, axes=layout_axes, **kw)


def _replay(tx, p0, grads):
  """Runs ``tx`` on stored gradients; returns the stacked trajectories."""
  state = tx.init(p0)

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p, traj = p0, []
  for t in range(oracle.STEPS):
    p, state = step(p, state, jax.tree.map(lambda g: g[t], grads))
    traj.append(p)
  return jax.tree.map(lambda *x: np.stack(x), *traj)


def _load(data, prefix):
  p0 = {k: jnp.asarray(data[f"{prefix}/{k}/p0"]) for k in oracle.SHAPES}
  grads = {k: jnp.asarray(data[f"{prefix}/{k}/grads"]) for k in oracle.SHAPES}
  ref = {k: data[f"{prefix}/{k}/params"] for k in oracle.SHAPES}
  return p0, grads, ref


def _to_flax(x, batched):
  # torch (out, in, ...) -> flax (..., in, out): move the out axis last.
  if x.ndim - batched < 2:
    return x
  return jnp.moveaxis(x, batched, -1)


def _assert_traj(actual, ref):
  for k in ref:
    np.testing.assert_allclose(
      actual[k], ref[k], rtol=1e-6, atol=1e-6 * np.abs(ref[k]).max(), err_msg=k
    )


@pytest.mark.parametrize("case", list(oracle.CASES))
def test_matches_official_golden_torch_layout(case):
  data = np.load(GOLDEN)
  p0, grads, ref = _load(data, case)
  _assert_traj(_replay(_make(case, TORCH_AXES), p0, grads), ref)


@pytest.mark.parametrize("case", ["adamp_wd", "sgdp_momentum_wd"])
def test_matches_official_golden_flax_layout(case):
  data = np.load(GOLDEN)
  p0, grads, ref = _load(data, case)
  p0 = {k: _to_flax(v, 0) for k, v in p0.items()}
  grads = {k: _to_flax(v, 1) for k, v in grads.items()}
  out = _replay(_make(case, None), p0, grads)
  out = {k: np.moveaxis(v, -1, 1) if v.ndim > 2 else v for k, v in out.items()}
  _assert_traj(out, ref)


@pytest.mark.parametrize(
  "case", [c for c in oracle.CASES if c != "sgdp_momentum_wd"]
)
def test_matches_pytorch_optimizer_golden(case):
  # pytorch_optimizer clones SGDP's momentum before projecting, so it departs
  # from the official aliasing when momentum > 0 and nesterov is off.
  data = np.load(GOLDEN)
  p0, grads, ref = _load(data, f"po/{case}")
  out = _replay(_make(case, TORCH_AXES), p0, grads)
  for k in ref:
    np.testing.assert_allclose(
      out[k], ref[k], rtol=1e-5, atol=1e-5 * np.abs(ref[k]).max(), err_msg=k
    )


def test_pytorch_optimizer_departs_from_official_aliasing():
  data = np.load(GOLDEN)
  _, _, official = _load(data, "sgdp_momentum_wd")
  _, _, po = _load(data, "po/sgdp_momentum_wd")
  assert np.abs(official["linear"] - po["linear"]).max() > 1e-3


@pytest.mark.parametrize("case", ["adamp_nesterov_wd", "sgdp_momentum_wd"])
def test_live_oracle_matches_committed_golden(case):
  pytest.importorskip("torch")
  pytest.importorskip("adamp")
  live = oracle.run(case, "adamp")
  data = np.load(GOLDEN)
  for k, v in live.items():
    np.testing.assert_array_equal(v, data[f"{case}/{k}"], err_msg=k)


def test_projection_fires_in_golden():
  # The goldens exercise both views: AdamP's update on the channel-orthogonal
  # leaf is orthogonal to every row, and the plain Adam step is not.
  data = np.load(GOLDEN)
  p0, grads, _ = _load(data, "adamp_plain")
  tx = optim.scale_by_adamp(axes=TORCH_AXES)
  u, _ = tx.update({k: v[0] for k, v in grads.items()}, tx.init(p0), p0)
  rows = np.sum(np.asarray(u["linear"]) * np.asarray(p0["linear"]), axis=1)
  assert np.abs(rows).max() < 1e-4
  g = np.asarray(grads["linear"][0], np.float64)
  plain = g / (np.abs(g) + 1e-8)  # Adam's first step
  assert np.abs(np.sum(plain * np.asarray(p0["linear"]), axis=1)).max() > 1e-2


def _rand(key, shape):
  return jax.random.normal(key, shape, jnp.float32)


def test_orthogonal_gradient_gives_orthogonal_update(key):
  k1, k2 = jax.random.split(key)
  w = _rand(k1, (12, 6))  # flax (in, out): a channel is a column
  h = _rand(k2, (12, 6))
  g = h - w * jnp.sum(w * h, 0, keepdims=True) / jnp.sum(
    w * w, 0, keepdims=True
  )
  for tx in (
    optim.scale_by_adamp(),
    optim.scale_by_sgdp(0.9),
    optim.scale_by_adamp(nesterov=True),
  ):
    u, _ = tx.update(g, tx.init(w), w)
    cos = jnp.sum(u * w, 0) / (
      jnp.linalg.norm(u, axis=0) * jnp.linalg.norm(w, axis=0)
    )
    assert float(jnp.max(jnp.abs(cos))) < 1e-4


def test_parallel_gradient_is_adamw_with_decay_first(key):
  w = _rand(key, (5, 4)) + 2.0
  g = 0.3 * w
  lr, wd = 1e-2, 0.5
  tx = optim.adamp(lr, weight_decay=wd)
  u, _ = tx.update(g, tx.init(w), w)
  # step 1: m = 0.1 g, v = 0.001 g^2, bias corrected u = g / (|g| + eps').
  m, v = 0.1 * g, 0.001 * g * g
  denom = jnp.sqrt(v) / jnp.sqrt(0.001) + 1e-8
  expect = w * (1 - lr * wd) - lr / 0.1 * m / denom
  helpers.assert_close(w + u, expect, atol=1e-6)


def test_wd_ratio_path_one_step(key):
  k1, k2 = jax.random.split(key)
  w = _rand(k1, (10, 3))
  h = _rand(k2, (10, 3))
  g = h - w * jnp.sum(w * h, 0, keepdims=True) / jnp.sum(
    w * w, 0, keepdims=True
  )
  lr, wd, ratio = 0.1, 0.5, 0.1
  u, _ = optim.adamp(lr, weight_decay=wd, wd_ratio=ratio).update(
    g, optim.adamp(lr).init(w), w
  )
  # NumPy float64 transcription of one official step.
  w64, g64 = np.asarray(w, np.float64), np.asarray(g, np.float64)
  m, v = 0.1 * g64, 0.001 * g64**2
  pert = m / (np.sqrt(v) / np.sqrt(0.001) + 1e-8)
  pn = w64 / (np.linalg.norm(w64, axis=0, keepdims=True) + 1e-8)
  pert = pert - pn * np.sum(pn * pert, 0, keepdims=True)
  expect = w64 * (1 - lr * wd * ratio) - lr / 0.1 * pert
  np.testing.assert_allclose(np.asarray(w + u), expect, rtol=1e-6, atol=1e-6)


def test_batch_axes_are_independent_layers(key):
  k1, k2 = jax.random.split(key)
  w = _rand(k1, (3, 6, 4))
  g = _rand(k2, (3, 6, 4))
  axes = optim.MatrixAxes(output=2, reduction=1)
  tx = optim.adamp(1e-2, weight_decay=0.1, axes=axes)
  u, _ = tx.update(g, tx.init(w), w)
  for i in range(3):
    txi = optim.adamp(1e-2, weight_decay=0.1)
    ui, _ = txi.update(g[i], txi.init(w[i]), w[i])
    helpers.assert_close(u[i], ui, atol=1e-7)


def test_none_axes_means_plain_adam(key):
  w = {"emb": _rand(key, (6, 4))}
  g = {"emb": jnp.linspace(-1.0, 1.0, 24).reshape(6, 4)}
  tx = optim.scale_by_adamp(axes=lambda p: {"emb": None})
  u, s = tx.update(g, tx.init(w), w)
  u, _ = tx.update(g, s, w)
  # two identical gradients: m/bc1 = g, sqrt(v/bc2) = |g|.
  gn = np.asarray(g["emb"], np.float64)
  helpers.assert_close(u, {"emb": gn / (np.abs(gn) + 1e-8)}, atol=1e-5)


def test_adamp_requires_params(key):
  w = _rand(key, (3, 3))
  tx = optim.adamp(1e-3)
  with pytest.raises(ValueError, match="scale_by_adamp: params are required"):
    tx.update(w, tx.init(w))
  tx = optim.sgdp(1e-3)
  with pytest.raises(ValueError, match="scale_by_sgdp: params are required"):
    tx.update(w, tx.init(w))


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(eps=-1.0), "scale_by_adamp: eps must lie in"),
    (dict(b1=1.0), "scale_by_adamp: b1 must lie in"),
    (dict(b2=-0.1), "scale_by_adamp: b2 must lie in"),
    (dict(weight_decay=-0.1), "weight_decay must lie in"),
    (dict(delta=-1.0), "delta must lie in"),
    (dict(wd_ratio=-1.0), "wd_ratio must lie in"),
  ],
)
def test_adamp_rejects_bad_hyperparameters(kwargs, match):
  with pytest.raises(ValueError, match=match):
    optim.adamp(1e-3, **kwargs)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(momentum=1.0), "scale_by_sgdp: momentum must lie in"),
    (dict(dampening=1.5), "scale_by_sgdp: dampening must lie in"),
  ],
)
def test_sgdp_rejects_bad_hyperparameters(kwargs, match):
  with pytest.raises(ValueError, match=match):
    optim.sgdp(1e-3, **kwargs)
