"""Tests for jaxnorm.residual: wiring, scaled residuals, HC, mHC, oHC, AttnRes.

Oracles: ``hyper-connections`` golden vectors (``tests/oracles/hc_golden.py``,
``tests/oracles/mhc_sinkhorn.py``) and NumPy float64 transcriptions of the
spec's equations.
"""

import itertools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from jaxnorm import residual as R
from tests import helpers
from tests.oracles import hc_golden, mhc_sinkhorn

HC_GOLDEN = pathlib.Path(hc_golden.__file__).with_name("hc_golden.npz")
SK_GOLDEN = pathlib.Path(mhc_sinkhorn.__file__).with_name("mhc_sinkhorn.npz")


def _rms(x):
  return norms.rms_norm(x, None)


def _linear(w):
  return lambda x: x @ jnp.asarray(w, x.dtype)


# ---------------------------------------------------------------------------
# Wiring and LayerNorm Scaling.


def test_pre_post_sandwich_wiring(key):
  x = jax.random.normal(key, (2, 3, 8))
  w = jax.random.normal(jax.random.key(1), (8, 8))
  f = _linear(w)
  helpers.assert_close(R.pre_norm(x, f, _rms), x + f(_rms(x)), atol=1e-6)
  helpers.assert_close(R.post_norm(x, f, _rms), _rms(x + f(x)), atol=1e-6)
  helpers.assert_close(
    R.sandwich_norm(x, f, _rms, jnp.tanh), x + jnp.tanh(f(_rms(x))), atol=1e-6
  )


@pytest.mark.parametrize("layer_index", [0, 3, 11])
def test_layer_norm_scaling_rms(key, layer_index):
  # Spec 6 test 3: with unit gain the norm output has RMS 1/sqrt(l).
  x = 5.0 * jax.random.normal(key, (4, 64))
  seen = []

  def probe(h):
    seen.append(h)
    return jnp.zeros_like(h)

  R.pre_norm(x, probe, _rms, layer_index=layer_index)
  rms = jnp.sqrt(jnp.mean(seen[0] ** 2, axis=-1))
  np.testing.assert_allclose(rms, 1 / math.sqrt(layer_index + 1), atol=1e-5)


# ---------------------------------------------------------------------------
# Scaled residuals.


def test_residual_scale_rules():
  assert R.residual_scale(8) == 1 / 8
  assert R.residual_scale(16, "1/sqrt(n)") == 0.25
  assert R.residual_scale(3, 0.7) == 0.7
  with pytest.raises(ValueError, match="rule must be one of"):
    R.residual_scale(3, "1/n^2")
  with pytest.raises(ValueError, match="positive float"):
    R.residual_scale(3, -1.0)
  with pytest.raises(ValueError, match="num_residuals must be a positive"):
    R.residual_scale(0)


def test_scaled_residual_forms(key):
  x = jax.random.normal(key, (2, 5, 6))
  f = _linear(jax.random.normal(jax.random.key(2), (6, 6)))
  helpers.assert_close(
    R.scaled_residual(x, f, 0.25), x + 0.25 * f(x), atol=1e-6
  )
  alpha = jnp.asarray([0.3])
  helpers.assert_close(
    R.scaled_residual(x, f, alpha), x + 0.3 * f(x), atol=1e-6
  )
  gamma = jnp.arange(6, dtype=jnp.float32)
  helpers.assert_close(
    R.scaled_residual(x, f, gamma, norm=_rms),
    x + gamma.reshape(1, 1, 6) * f(_rms(x)),
    atol=1e-5,
  )
  # SkipInit / ReZero at init: the identity.
  helpers.assert_close(R.scaled_residual(x, f, jnp.zeros((1,))), x, atol=0)
  xb = x.astype(jnp.bfloat16)
  assert R.scaled_residual(xb, f, alpha).dtype == jnp.bfloat16


def test_scaled_residual_errors(key):
  x = jax.random.normal(key, (2, 6))
  with pytest.raises(
    ValueError,
    match=r"scale must be a scalar or have "
    r"shape \(x.shape\[-1\],\)=\(6,\)",
  ):
    R.scaled_residual(x, jnp.tanh, jnp.ones((3,)))
  with pytest.raises(TypeError, match="scale must have a floating dtype"):
    R.scaled_residual(x, jnp.tanh, jnp.ones((6,), jnp.int32))
  with pytest.raises(ValueError, match="sublayer must keep the shape"):
    R.scaled_residual(x, lambda h: h[..., :3], 0.5)


def test_depth_rule_linear_path_expansion():
  # Spec 5 test 1: the linear tower equals the sum over ordered subsets.
  rng = np.random.RandomState(0)
  n, d, lam = 6, 5, 1 / 6
  mats = [rng.randn(d, d) / np.sqrt(d) for _ in range(n)]
  x0 = rng.randn(d)
  expected = np.zeros(d)
  for size in range(n + 1):
    for subset in itertools.combinations(range(n), size):
      v = x0
      for k in subset:
        v = mats[k] @ v
      expected += lam**size * v
  x = jnp.asarray(x0, jnp.float32)
  for a in mats:
    x = R.scaled_residual(
      x, lambda h, a=a: jnp.asarray(a, h.dtype) @ h, R.residual_scale(n)
    )
  np.testing.assert_allclose(np.asarray(x), expected, atol=1e-5)


def test_depth_rule_bounded_with_orthogonal_branches():
  # Spec 5 test 2: lam = 1/n keeps ||x_n|| <= e ||x_0||; lam = 1 explodes.
  d, n = 8, 256
  qs = jax.random.orthogonal(jax.random.key(3), d, shape=(n,))
  x0 = jax.random.normal(jax.random.key(4), (d,))

  def tower(lam):
    def step(x, q):
      return R.scaled_residual(x, lambda h: q @ h, lam), None

    return jax.lax.scan(step, x0, qs)[0]

  ratio = jnp.linalg.norm(tower(R.residual_scale(n))) / jnp.linalg.norm(x0)
  assert ratio <= math.e + 1e-4
  assert jnp.linalg.norm(tower(1.0)) / jnp.linalg.norm(x0) > 1e6


# ---------------------------------------------------------------------------
# Hyper-Connections.


def _hc_params(data, case, k, d):
  p = lambda name: jnp.asarray(data[f"hc/{case}/p{k}/{name}"])  # noqa: E731
  return dict(
    static_alpha=p("static_alpha"),
    static_beta=p("static_beta"),
    dynamic_alpha=p("dynamic_alpha_fn"),
    dynamic_beta=p("dynamic_beta_fn"),
    alpha_scale=p("dynamic_alpha_scale"),
    beta_scale=p("dynamic_beta_scale"),
    norm_scale=p("norm.gamma"),
  )


def _hc_net(data, case):
  x = jnp.asarray(data[f"hc/{case}/x"])
  d = x.shape[-1]
  h = R.expand_streams(x, hc_golden.N)
  for k in range(2):
    maps = R.hc_maps(
      h, tanh=case != "dynamic_notanh", **_hc_params(data, case, k, d)
    )
    w = data[f"hc/{case}/w{k}"].T  # torch (out, in) -> (in, out)
    h = R.hyper_connection(
      h, _linear(w), h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    )
  return R.reduce_streams(h)


@pytest.mark.parametrize("case", hc_golden.CASES)
def test_hc_matches_golden(case):
  data = np.load(HC_GOLDEN)
  helpers.assert_close(_hc_net(data, case), data[f"hc/{case}/y"], atol=1e-5)


@pytest.mark.parametrize("case", ["static", "dynamic"])
def test_hc_live_oracle_matches_committed_golden(case):
  pytest.importorskip("torch")
  pytest.importorskip("hyper_connections")
  live, data = hc_golden.compute(), np.load(HC_GOLDEN)
  for k in data.files:
    if k.startswith(f"hc/{case}/"):
      np.testing.assert_allclose(live[k], data[k], atol=1e-6, err_msg=k)


def test_static_hc_without_dynamic_weights():
  data = np.load(HC_GOLDEN)
  x = jnp.asarray(data["hc/static/x"])
  h = R.expand_streams(x, 4)
  p = _hc_params(data, "static", 0, x.shape[-1])
  full = R.hc_maps(h, **p)
  static = R.hc_maps(
    h, static_alpha=p["static_alpha"], static_beta=p["static_beta"]
  )
  assert static[2].shape == (4, 4)
  for a, b in zip(full, static):
    helpers.assert_close(a, jnp.broadcast_to(b, a.shape), atol=0)


def test_hc_init_is_n_copies_of_prenorm(key):
  # Spec 1 test 1: fresh HCs on two linear branches = n * plain residual.
  n, d = 4, 32
  x = jax.random.normal(key, (2, 3, d))
  ws = [jax.random.normal(jax.random.key(k), (d, d)) / d for k in (5, 6)]
  h = R.expand_streams(x, n)
  plain = x
  for k, w in enumerate(ws):
    alpha, beta = R.hc_static_init(n, k)
    maps = R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((d, n + 1)),
      dynamic_beta=jnp.zeros((d,)),
    )
    f = lambda v, w=w: _linear(w)(_rms(v))  # noqa: E731
    h = R.hyper_connection(h, f, h_pre=maps[0], h_post=maps[1], h_res=maps[2])
    plain = plain + f(plain)
  helpers.assert_close(R.reduce_streams(h), n * plain, atol=1e-5)
  helpers.assert_close(R.reduce_streams(h, readout="mean"), plain, atol=1e-6)


def test_hc_single_stream_is_plain_residual(key):
  # Spec 1 test 3: n = 1, alpha = [[1, 1]], B = [1] gives x + T(x).
  x = jax.random.normal(key, (3, 8))
  h = R.expand_streams(x, 1)
  maps = R.hc_maps(h, static_alpha=jnp.ones((1, 2)), static_beta=jnp.ones((1,)))
  out = R.hyper_connection(
    h, jnp.sin, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
  )
  helpers.assert_close(out[..., 0, :], x + jnp.sin(x), atol=0)


def test_hyper_connection_keeps_dtype_and_jits(key):
  h = jax.random.normal(key, (2, 4, 8)).astype(jnp.bfloat16)
  alpha, beta = R.hc_static_init(4, 1)
  maps = R.hc_maps(h, static_alpha=alpha, static_beta=beta)
  out = R.hyper_connection(
    h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
  )
  assert out.dtype == jnp.bfloat16
  helpers.assert_jit_matches_eager(
    lambda h: R.hyper_connection(
      h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    h.astype(jnp.float32),
  )


def test_hc_errors(key):
  h = jax.random.normal(key, (2, 4, 8))
  alpha, beta = R.hc_static_init(4, 0)
  with pytest.raises(
    ValueError,
    match=r"static_alpha must have shape "
    r"\(3, 4\).*got static_alpha.shape=\(4, 5\)",
  ):
    R.hc_maps(h[:, :3], static_alpha=alpha, static_beta=beta[:3])
  with pytest.raises(ValueError, match="static_beta must have shape"):
    R.hc_maps(h, static_alpha=alpha, static_beta=beta[:3])
  with pytest.raises(ValueError, match="give both dynamic_alpha"):
    R.hc_maps(
      h, static_alpha=alpha, static_beta=beta, dynamic_alpha=jnp.zeros((8, 5))
    )
  with pytest.raises(ValueError, match="dynamic_alpha must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 4)),
      dynamic_beta=jnp.zeros(8),
    )
  with pytest.raises(ValueError, match="dynamic_beta must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(4),
    )
  with pytest.raises(ValueError, match="norm_scale must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(8),
      norm_scale=jnp.zeros(4),
    )
  with pytest.raises(ValueError, match="alpha_scale must be a scalar"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(8),
      alpha_scale=jnp.zeros(2),
    )
  with pytest.raises(ValueError, match="h must have rank >= 2"):
    R.hc_maps(h[0, 0], static_alpha=alpha, static_beta=beta)
  with pytest.raises(ValueError, match="layer_index must be a non-negative"):
    R.hc_static_init(4, -1)
  pre, post, res = R.hc_maps(h, static_alpha=alpha, static_beta=beta)
  with pytest.raises(ValueError, match=r"h_res must have shape \(3, 3\)"):
    R.hyper_connection(
      h[:, :3], jnp.tanh, h_pre=pre[:3], h_post=post[:3], h_res=res
    )
  with pytest.raises(ValueError, match=r"h_pre must have shape \(4,\)"):
    R.hyper_connection(h, jnp.tanh, h_pre=pre[:2], h_post=post, h_res=res)
  with pytest.raises(ValueError, match="sublayer must map"):
    R.hyper_connection(
      h, lambda v: v[..., :2], h_pre=pre, h_post=post, h_res=res
    )
  with pytest.raises(ValueError, match="num_streams must be a positive"):
    R.expand_streams(h, 0)
  with pytest.raises(ValueError, match="readout must be one of"):
    R.reduce_streams(h, readout="max")


# ---------------------------------------------------------------------------
# Sinkhorn-Knopp.


def test_sinkhorn_matches_hyper_connections_golden():
  data = np.load(SK_GOLDEN)
  logits = jnp.asarray(data["logits"])
  helpers.assert_close(R.sinkhorn_knopp(logits), data["log_domain"], atol=1e-5)
  helpers.assert_close(
    R.sinkhorn_knopp(logits, log_domain=False), data["direct"], atol=1e-5
  )


def test_sinkhorn_live_oracle_matches_committed_golden():
  pytest.importorskip("torch")
  pytest.importorskip("hyper_connections")
  live, data = mhc_sinkhorn.compute(), np.load(SK_GOLDEN)
  for k in data.files:
    np.testing.assert_allclose(live[k], data[k], atol=1e-6, err_msg=k)


@pytest.mark.parametrize("log_domain", [True, False])
def test_sinkhorn_doubly_stochastic(key, log_domain):
  # Spec 2 test 1 and 2.
  logits = 2.0 * jax.random.normal(key, (3, 4, 4))
  m = R.sinkhorn_knopp(logits, num_iters=20, log_domain=log_domain)
  assert bool(jnp.all(m >= 0))
  np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(m.sum(-2), 1.0, atol=1e-3)
  assert float(jnp.max(jnp.linalg.norm(m, ord=2, axis=(-2, -1)))) <= 1 + 1e-4
  ms = R.sinkhorn_knopp(2.0 * jax.random.normal(jax.random.key(9), (64, 4, 4)))
  prod = jnp.eye(4)
  for k in range(64):
    prod = ms[k] @ prod
  np.testing.assert_allclose(prod.sum(-1), 1.0, atol=1e-2)
  np.testing.assert_allclose(prod.sum(-2), 1.0, atol=1e-2)


def test_sinkhorn_direct_and_log_domain_agree_and_temperature(key):
  logits = jax.random.normal(key, (5, 4, 4))
  helpers.assert_close(
    R.sinkhorn_knopp(logits),
    R.sinkhorn_knopp(logits, log_domain=False),
    atol=1e-6,
  )
  helpers.assert_close(
    R.sinkhorn_knopp(logits, temperature=0.5),
    R.sinkhorn_knopp(2.0 * logits),
    atol=1e-6,
  )
  assert R.sinkhorn_knopp(logits.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_sinkhorn_gradients_flow_through_iterations(key):
  logits = jax.random.normal(key, (4, 4))
  target = jax.random.normal(jax.random.key(1), (4, 4))

  def loss(z, iters):
    return jnp.sum(R.sinkhorn_knopp(z, num_iters=iters) * target)

  helpers.assert_grads_numerical(
    lambda z: loss(z, 20), [logits], atol=2e-2, rtol=2e-2
  )
  # The gradient depends on the iteration count: it is not cut after one.
  g1, g20 = jax.grad(loss)(logits, 1), jax.grad(loss)(logits, 20)
  assert float(jnp.max(jnp.abs(g1 - g20))) > 1e-4


def test_sinkhorn_errors():
  z = jnp.zeros((4, 4))
  with pytest.raises(ValueError, match="must be square"):
    R.sinkhorn_knopp(jnp.zeros((4, 3)))
  with pytest.raises(ValueError, match="num_iters must be a positive"):
    R.sinkhorn_knopp(z, num_iters=0)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    R.sinkhorn_knopp(z, temperature=0.0)
  with pytest.raises(ValueError, match="eps must be >= 0"):
    R.sinkhorn_knopp(z, log_domain=False, eps=-1.0)
  with pytest.raises(ValueError, match="eps applies to the direct form"):
    R.sinkhorn_knopp(z, eps=1e-6)
  with pytest.raises(TypeError, match="logits must have a floating dtype"):
    R.sinkhorn_knopp(jnp.zeros((4, 4), jnp.int32))


# ---------------------------------------------------------------------------
# Quaternion rotations (oHC).


def _hamilton(a, b):
  a0, a1, a2, a3 = a
  b0, b1, b2, b3 = b
  return np.array(
    [
      a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
      a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
      a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
      a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0,
    ]
  )


def test_quaternion_rotation_is_so4(key):
  # Spec 3 tests 1-3.
  kp, kq, kx = jax.random.split(key, 3)
  p = jax.random.normal(kp, (100, 4))
  q = jax.random.normal(kq, (100, 4))
  m = R.quaternion_rotation(p, q)
  eye = jnp.broadcast_to(jnp.eye(4), m.shape)
  helpers.assert_close(m @ jnp.swapaxes(m, -1, -2), eye, atol=1e-5)
  np.testing.assert_allclose(jnp.linalg.det(m), 1.0, atol=1e-5)
  # M x = p x conj(q) as quaternions (unit p, q), NumPy float64.
  x = np.asarray(jax.random.normal(kx, (4,)), np.float64)
  for i in range(5):
    pn = np.asarray(p[i], np.float64)
    qn = np.asarray(q[i], np.float64)
    pn, qn = pn / np.linalg.norm(pn), qn / np.linalg.norm(qn)
    expected = _hamilton(_hamilton(pn, x), qn * np.array([1, -1, -1, -1]))
    np.testing.assert_allclose(np.asarray(m[i]) @ x, expected, atol=1e-5)
  lp, rq = R.quaternion_left_matrix(p), R.quaternion_right_matrix(q)
  helpers.assert_close(lp @ rq, rq @ lp, atol=1e-4)
  helpers.assert_close(
    R.quaternion_rotation(jnp.array([1.0, 0, 0, 0]), jnp.array([1.0, 0, 0, 0])),
    jnp.eye(4),
    atol=0,
  )
  helpers.assert_close(R.quaternion_rotation(-p, -q), m, atol=1e-6)
  xs = jax.random.normal(kx, (4, 16))
  np.testing.assert_allclose(
    jnp.linalg.norm(m[0] @ xs), jnp.linalg.norm(xs), rtol=1e-5
  )
  prod = jnp.eye(4)
  for k in range(100):
    prod = m[k] @ prod
  helpers.assert_close(prod @ prod.T, jnp.eye(4), atol=1e-5)


def test_quaternion_errors():
  with pytest.raises(ValueError, match="p must have 4 components"):
    R.quaternion_rotation(jnp.ones(3), jnp.ones(4))
  with pytest.raises(ValueError, match="p and q must have the same shape"):
    R.quaternion_rotation(jnp.ones((2, 4)), jnp.ones(4))
  with pytest.raises(ValueError, match="q must have 4 components"):
    R.quaternion_right_matrix(jnp.ones(5))
  with pytest.raises(TypeError, match="p must have a floating dtype"):
    R.quaternion_left_matrix(jnp.ones(4, jnp.int32))


# ---------------------------------------------------------------------------
# mHC / oHC / iHC maps.


def _mhc_numpy(h, phis, bs, gates, eps):
  """Float64 NumPy transcription of mHC Eq. 7-9 (20 Sinkhorn iterations)."""
  h = np.asarray(h, np.float64)
  n, d = h.shape[-2:]
  xv = h.reshape(*h.shape[:-2], n * d)
  xn = xv / np.sqrt(np.mean(xv**2, -1, keepdims=True) + eps)
  sig = lambda t: 1 / (1 + np.exp(-t))  # noqa: E731
  pre = sig(gates[0] * xn @ phis[0] + bs[0])
  post = 2 * sig(gates[1] * xn @ phis[1] + bs[1])
  m = np.exp(gates[2] * (xn @ phis[2]).reshape(*h.shape[:-2], n, n) + bs[2])
  for _ in range(20):
    m = m / m.sum(-2, keepdims=True)
    m = m / m.sum(-1, keepdims=True)
  return pre, post, m


def test_mhc_maps_match_numpy(key):
  n, d = 4, 8
  ks = jax.random.split(key, 8)
  h = jax.random.normal(ks[0], (2, 3, n, d))
  phis = [
    jax.random.normal(ks[1 + i], (n * d, o)) / math.sqrt(n * d)
    for i, o in enumerate((n, n, n * n))
  ]
  bs = [
    jax.random.normal(ks[4], (n,)),
    jax.random.normal(ks[5], (n,)),
    jax.random.normal(ks[6], (n, n)),
  ]
  gates = (0.3, 0.2, 0.5)
  got = R.mhc_maps(
    h,
    phi_pre=phis[0],
    phi_post=phis[1],
    phi_res=phis[2],
    b_pre=bs[0],
    b_post=bs[1],
    b_res=bs[2],
    a_pre=gates[0],
    a_post=gates[1],
    a_res=jnp.asarray(gates[2]),
  )
  want = _mhc_numpy(
    h, [np.asarray(p) for p in phis], [np.asarray(b) for b in bs], gates, 1e-6
  )
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), w, atol=2e-5)
  assert bool(jnp.all(got[1] > 0)) and bool(jnp.all(got[1] < 2))
  np.testing.assert_allclose(got[2].sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(got[2].sum(-2), 1.0, atol=1e-3)


@pytest.mark.parametrize("residual", ["sinkhorn", "quaternion", "identity"])
def test_mhc_init_maps(key, residual):
  n, d = 4, 8
  h = jax.random.normal(key, (3, n, d))
  b_pre, b_post, b_res = R.mhc_static_init(n, residual=residual)
  res_out = {"sinkhorn": 16, "quaternion": 8, "identity": None}[residual]
  pre, post, res = R.mhc_maps(
    h,
    phi_pre=jnp.zeros((n * d, n)),
    phi_post=jnp.zeros((n * d, n)),
    phi_res=None if res_out is None else jnp.zeros((n * d, res_out)),
    b_pre=b_pre,
    b_post=b_post,
    b_res=b_res,
    residual=residual,
  )
  np.testing.assert_allclose(pre, 1 / n, atol=1e-6)
  np.testing.assert_allclose(post, 1.0, atol=1e-6)
  if residual == "sinkhorn":
    expected = 0.99 * np.eye(n) + 0.01 / (n - 1) * (1 - np.eye(n))
    np.testing.assert_allclose(
      res, np.broadcast_to(expected, res.shape), atol=1e-6
    )
  else:  # oHC is the identity at init, iHC always.
    np.testing.assert_allclose(
      res, np.broadcast_to(np.eye(n), res.shape), atol=1e-6
    )


def test_ohc_maps_orthogonal_for_random_generators(key):
  n, d = 4, 8
  ks = jax.random.split(key, 3)
  h = jax.random.normal(ks[0], (5, n, d))
  b_pre, b_post, _ = R.mhc_static_init(n)
  _, _, res = R.mhc_maps(
    h,
    phi_pre=None,
    phi_post=None,
    phi_res=jax.random.normal(ks[1], (n * d, 8)),
    b_pre=b_pre,
    b_post=b_post,
    b_res=jax.random.normal(ks[2], (8,)),
    residual="quaternion",
    a_res=1.0,
  )
  eye = jnp.broadcast_to(jnp.eye(4), res.shape)
  helpers.assert_close(res @ jnp.swapaxes(res, -1, -2), eye, atol=1e-5)
  np.testing.assert_allclose(jnp.linalg.det(res), 1.0, atol=1e-5)


def test_ihc_is_n_copies_of_plain_stream(key):
  # H_res = I with identical streams and sum(H_pre) = 1, H_post = 1: every
  # stream is the plain residual stream, for any depth.
  n, d = 4, 8
  x = jax.random.normal(key, (3, d))
  ws = [jax.random.normal(jax.random.key(k), (d, d)) / d for k in range(6)]
  b_pre, b_post, b_res = R.mhc_static_init(n, residual="identity")
  h, plain = R.expand_streams(x, n), x
  for w in ws:
    maps = R.mhc_maps(
      h,
      phi_pre=None,
      phi_post=None,
      phi_res=None,
      b_pre=b_pre,
      b_post=b_post,
      b_res=b_res,
      residual="identity",
    )
    f = lambda v, w=w: _linear(w)(_rms(v))  # noqa: E731
    h = R.hyper_connection(h, f, h_pre=maps[0], h_post=maps[1], h_res=maps[2])
    plain = plain + f(plain)
  helpers.assert_close(h, jnp.broadcast_to(plain[:, None], h.shape), atol=1e-5)


def test_mhc_errors(key):
  n, d = 4, 8
  h = jax.random.normal(key, (2, n, d))
  b_pre, b_post, b_res = R.mhc_static_init(n)
  kw = dict(phi_pre=None, phi_post=None, b_pre=b_pre, b_post=b_post)
  with pytest.raises(ValueError, match="residual must be one of"):
    R.mhc_maps(h, phi_res=None, b_res=b_res, residual="cayley", **kw)
  with pytest.raises(
    ValueError,
    match="needs n = 4 streams, got "
    r"h.shape\[-2\]=3",
  ):
    R.mhc_maps(
      h[:, :3],
      phi_res=None,
      b_res=jnp.zeros(8),
      residual="quaternion",
      **dict(kw, b_pre=b_pre[:3], b_post=b_post[:3]),
    )
  with pytest.raises(ValueError, match="takes no phi_res or b_res"):
    R.mhc_maps(h, phi_res=None, b_res=b_res, residual="identity", **kw)
  with pytest.raises(ValueError, match="needs b_res of shape"):
    R.mhc_maps(h, phi_res=None, b_res=None, **kw)
  with pytest.raises(ValueError, match=r"b_res must have shape \(8,\)"):
    R.mhc_maps(h, phi_res=None, b_res=b_res, residual="quaternion", **kw)
  with pytest.raises(ValueError, match=r"b_pre must have shape \(3,\)"):
    R.mhc_maps(h[:, :3], phi_res=None, b_res=b_res[:3, :3], **kw)
  with pytest.raises(ValueError, match=r"phi_res must have shape \(32, 16\)"):
    R.mhc_maps(h, phi_res=jnp.zeros((24, 16)), b_res=b_res, **kw)
  with pytest.raises(ValueError, match="a_res must be a scalar"):
    R.mhc_maps(h, phi_res=None, b_res=b_res, a_res=jnp.ones(3), **kw)
  with pytest.raises(ValueError, match="res_diag must lie in"):
    R.mhc_static_init(4, res_diag=1.0)
  with pytest.raises(ValueError, match="needs num_streams=4"):
    R.mhc_static_init(3, residual="quaternion")


# ---------------------------------------------------------------------------
# Attention residuals.


def test_attn_res_zero_query_is_mean(key):
  # Spec 4 test 1.
  v = jax.random.normal(key, (5, 2, 3, 8))
  out = R.attn_res(v, jnp.zeros(8))
  helpers.assert_close(out, jnp.mean(v, axis=0), atol=1e-6)


def test_attn_res_weights_scale_invariant_and_normalized(key):
  # Spec 4 test 2.
  kv, kw = jax.random.split(key)
  v = jax.random.normal(kv, (4, 6, 16))
  w = jax.random.normal(kw, (16,))
  a = R.attn_res_weights(v, w, eps=0.0)
  np.testing.assert_allclose(a.sum(0), 1.0, atol=1e-6)
  scaled = v * jnp.array([1.0, 7.0, 0.1, 3.0]).reshape(4, 1, 1)
  helpers.assert_close(R.attn_res_weights(scaled, w, eps=0.0), a, atol=1e-5)


def test_attn_res_one_hot_limit(key):
  # Spec 4 test 3: a query aligned with one normalized key selects it.
  v = jax.random.normal(key, (5, 16))
  j = 2
  k = np.asarray(_rms(v[j]))
  w = 1e3 * k / np.linalg.norm(k)
  helpers.assert_close(
    R.attn_res(v[:, None], jnp.asarray(w))[0], v[j], atol=1e-3
  )


def test_attn_res_matches_numpy_with_key_scale(key):
  kv, kw, kg = jax.random.split(key, 3)
  v = jax.random.normal(kv, (3, 4, 8))
  w = jax.random.normal(kw, (8,))
  g = jax.random.normal(kg, (8,))
  vn = np.asarray(v, np.float64)
  keys = vn / np.sqrt(np.mean(vn**2, -1, keepdims=True) + 1e-6)
  s = (keys * np.asarray(g)) @ np.asarray(w)
  a = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)
  helpers.assert_close(
    R.attn_res(v, w, key_scale=g), np.sum(a[..., None] * vn, 0), atol=1e-5
  )
  assert R.attn_res(v.astype(jnp.bfloat16), w).dtype == jnp.bfloat16


def test_attn_res_errors():
  with pytest.raises(ValueError, match=r"query must have shape \(8,\)"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(4))
  with pytest.raises(ValueError, match="sources must have rank >= 2"):
    R.attn_res(jnp.zeros(8), jnp.zeros(8))
  with pytest.raises(ValueError, match=r"key_scale must have shape \(8,\)"):
    R.attn_res_weights(jnp.zeros((3, 8)), jnp.zeros(8), key_scale=jnp.ones(3))
  with pytest.raises(TypeError, match="attn_res_weights: mask must be boolean"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(8), mask=jnp.ones(3))
  with pytest.raises(ValueError, match=r"mask must have shape \(3,\)"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(8), mask=jnp.ones(2, bool))


def test_attn_res_mask_equals_the_existing_sources(key):
  kv, kw = jax.random.split(key)
  v = jax.random.normal(kv, (5, 2, 8))
  w = jax.random.normal(kw, (8,))
  buffer = v.at[3:].set(0.0)  # Two slots not yet written.
  mask = jnp.arange(5) < 3
  helpers.assert_close(
    R.attn_res(buffer, w, mask=mask), R.attn_res(v[:3], w), atol=1e-6
  )
  a = R.attn_res_weights(buffer, w, mask=mask)
  assert float(jnp.max(a[3:])) == 0.0
  g = jax.grad(lambda b: jnp.sum(R.attn_res(b, w, mask=mask) ** 2))(buffer)
  assert helpers.all_finite(g) and float(jnp.max(jnp.abs(g[3:]))) == 0.0


# ---------------------------------------------------------------------------
# Traced layer indices (nnx.scan over layers) and the fused recurrence.


def test_traced_layer_index_equals_python_index(key):
  x = jax.random.normal(key, (2, 3, 8))
  f = _linear(jax.random.normal(jax.random.key(1), (8, 8)))

  @jax.jit
  def traced(x, index):
    return R.pre_norm(x, f, _rms, layer_index=index), R.sandwich_norm(
      x, f, _rms, jnp.tanh, layer_index=index
    )

  for index in (0, 5):
    got = traced(x, jnp.asarray(index))
    helpers.assert_close(
      got[0], R.pre_norm(x, f, _rms, layer_index=index), atol=1e-6
    )
    helpers.assert_close(
      got[1],
      R.sandwich_norm(x, f, _rms, jnp.tanh, layer_index=index),
      atol=1e-6,
    )
  bf16 = R.pre_norm(x.astype(jnp.bfloat16), f, _rms, layer_index=jnp.asarray(3))
  assert bf16.dtype == jnp.bfloat16
  for k in (0, 5):
    want = R.hc_static_init(4, k)
    got = jax.jit(lambda k: R.hc_static_init(4, k))(jnp.asarray(k))
    for a, b in zip(got, want):
      helpers.assert_close(a, b, atol=0)


def test_layer_index_errors():
  x = jnp.ones((2, 8))
  with pytest.raises(
    ValueError, match="pre_norm: layer_index must be a non-negative integer"
  ):
    R.pre_norm(x, jnp.tanh, _rms, layer_index=-1)
  with pytest.raises(
    ValueError, match="sandwich_norm: an array layer_index must be an integer"
  ):
    R.sandwich_norm(x, jnp.tanh, _rms, _rms, layer_index=jnp.float32(1.0))
  with pytest.raises(ValueError, match="must be an integer scalar"):
    R.hc_static_init(4, jnp.arange(2))
  with pytest.raises(ValueError, match="hc_static_init: layer_index must be"):
    R.hc_static_init(4, None)


def test_fused_pre_norm_equals_unfused_stack(key):
  from jaxnorm import fused_norms

  d, depth = 16, 4
  kx, kw, ks = jax.random.split(key, 3)
  x = jax.random.normal(kx, (2, 5, d))
  fs = [_linear(w / 4) for w in jax.random.normal(kw, (depth, d, d))]
  scales = 1.0 + 0.1 * jax.random.normal(ks, (depth, d))
  norm_k = [lambda h, s=s: norms.rms_norm(h, s) for s in scales]
  add_k = [
    lambda b, h, s=s: fused_norms.add_rms_norm(b, h, s, implementation="xla")
    for s in scales[1:]
  ]
  y, hidden = R.fused_pre_norm(x, fs, norm_k[0], add_k, return_hidden=True)
  ref, ref_hidden = x, []
  for f, norm in zip(fs, norm_k):
    ref = R.pre_norm(ref, f, norm)
    ref_hidden.append(ref)
  helpers.assert_close(y, ref, atol=1e-5)
  helpers.assert_close(hidden, jnp.stack(ref_hidden), atol=1e-5)
  helpers.assert_close(
    R.fused_pre_norm(x, fs[:1], norm_k[0], []), x + fs[0](norm_k[0](x)), atol=0
  )
  with pytest.raises(
    ValueError, match="fused_pre_norm: need at least one sublayer and one"
  ):
    R.fused_pre_norm(x, fs, norm_k[0], add_k[:1])


# ---------------------------------------------------------------------------
# Degenerate inputs: every function with a norm or a division.


def _degenerate_cases():
  n, d = 4, 8
  alpha, beta = R.hc_static_init(n, 1)
  b_pre, b_post, b_res = R.mhc_static_init(n)
  rng = np.random.RandomState(0)
  phi = lambda out: jnp.asarray(0.1 * rng.randn(n * d, out), jnp.float32)  # noqa

  def hc(h):
    return R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=phi(n + 1)[:d],
      dynamic_beta=phi(1)[:d, 0],
    )

  def mhc(h, residual="sinkhorn"):
    out, bias = {"sinkhorn": (n * n, b_res), "quaternion": (8, None)}[residual]
    if bias is None:
      bias = R.mhc_static_init(n, residual="quaternion")[2]
    return R.mhc_maps(
      h,
      phi_pre=phi(n),
      phi_post=phi(n),
      phi_res=phi(out),
      b_pre=b_pre,
      b_post=b_post,
      b_res=bias,
      residual=residual,
    )

  return {
    "hc_maps": (hc, (3, n, d)),
    "mhc_maps": (mhc, (3, n, d)),
    "ohc_maps": (lambda h: mhc(h, "quaternion"), (3, n, d)),
    "quaternion_rotation": (lambda p: R.quaternion_rotation(p, p), (3, 4)),
    "attn_res": (lambda v: R.attn_res(v, jnp.ones(d)), (3, 2, d)),
    "reduce_streams": (
      lambda h: R.reduce_streams(h, readout="mean"),
      (3, n, d),
    ),
    "sinkhorn_knopp": (
      lambda z: R.sinkhorn_knopp(z, log_domain=False, eps=1e-6),
      (3, n, n),
    ),
  }


DEGENERATE = _degenerate_cases()


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_all_zero_rows_give_finite_values_and_gradients(name, key):
  fn, shape = DEGENERATE[name]
  x = jax.random.normal(key, shape).at[0].set(0.0)  # One all-zero row.

  def loss(x):
    return sum(jnp.sum(jnp.tanh(t)) for t in jax.tree.leaves(fn(x)))

  value, grad = jax.value_and_grad(loss)(x)
  assert helpers.all_finite((value, grad)), name
  assert helpers.all_finite(jax.grad(loss)(jnp.zeros(shape))), name


WRONG_RANK = {
  "expand_streams": (lambda: R.expand_streams(jnp.float32(1.0), 2), "x"),
  "reduce_streams": (lambda: R.reduce_streams(jnp.ones(4)), "h"),
  "hyper_connection": (
    lambda: R.hyper_connection(
      jnp.ones(4),
      jnp.tanh,
      h_pre=jnp.ones(4),
      h_post=jnp.ones(4),
      h_res=jnp.eye(4),
    ),
    "h",
  ),
  "hc_maps": (
    lambda: R.hc_maps(
      jnp.ones(4), static_alpha=jnp.ones((1, 2)), static_beta=jnp.ones(1)
    ),
    "h",
  ),
  "mhc_maps": (
    lambda: R.mhc_maps(
      jnp.ones(4),
      phi_pre=None,
      phi_post=None,
      phi_res=None,
      b_pre=jnp.ones(1),
      b_post=jnp.ones(1),
      b_res=None,
      residual="identity",
    ),
    "h",
  ),
  "sinkhorn_knopp": (lambda: R.sinkhorn_knopp(jnp.ones(4)), "logits"),
  "quaternion_left_matrix": (
    lambda: R.quaternion_left_matrix(jnp.float32(1.0)),
    "p",
  ),
  "quaternion_rotation": (
    lambda: R.quaternion_rotation(jnp.float32(1.0), jnp.float32(1.0)),
    "p",
  ),
  "scaled_residual": (
    lambda: R.scaled_residual(jnp.float32(1.0), jnp.tanh, 0.5),
    "x",
  ),
  "attn_res_weights": (
    lambda: R.attn_res_weights(jnp.ones(4), jnp.ones(4)),
    "sources",
  ),
}


@pytest.mark.parametrize("name", sorted(WRONG_RANK))
def test_wrong_rank_raises_a_named_error(name):
  call, arg = WRONG_RANK[name]
  with pytest.raises(ValueError, match=rf"^{name}: {arg} must have rank >= "):
    call()
