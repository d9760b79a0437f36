"""Tests for jaxnorm.residual.manifold: Sinkhorn-Knopp against the
``hyper-connections`` golden vectors (``tests/oracles/mhc_sinkhorn.py``),
quaternion rotations against the Hamilton product, and the mHC / oHC / iHC
maps against a NumPy float64 transcription of the equations."""

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.oracles import mhc_sinkhorn
from tests.residual import _common as common
from tests.residual._common import _net

SK_GOLDEN = pathlib.Path(mhc_sinkhorn.__file__).with_name("mhc_sinkhorn.npz")


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
    f = lambda v, w=w: common.linear(w)(common.rms(v))  # noqa: E731
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


@pytest.mark.parametrize("k", [0, 5])
def test_mhc_init_focuses_the_read_on_stream_k_mod_n(k):
  n, focus = 4, 0.9
  b_pre, _, _ = R.mhc_static_init(n, layer_index=k, pre_focus=focus)
  expected = np.full(n, (1 - focus) / (n - 1))
  expected[k % n] = focus
  np.testing.assert_allclose(jax.nn.sigmoid(b_pre), expected, atol=1e-6)
  traced = jax.jit(lambda i: R.mhc_static_init(n, layer_index=i)[0])
  np.testing.assert_allclose(traced(jnp.asarray(k)), b_pre, atol=1e-6)


def test_mhc_init_pre_focus_out_of_range():
  with pytest.raises(ValueError, match=r"pre_focus must lie in \[1/n, 1\)"):
    R.mhc_static_init(4, layer_index=0, pre_focus=1.0)
  with pytest.raises(ValueError, match="layer_index must be a non-negative"):
    R.mhc_static_init(4, layer_index=-1)


def _stream_gradients(focused: bool) -> jax.Array:
  """d loss / d b_post of the first of three mHC sublayers, per stream."""
  n, d = 4, 8
  x = jax.random.normal(jax.random.key(0), (5, d))
  ws = [jax.random.normal(jax.random.key(k), (d, d)) / d for k in (1, 2, 3)]

  def loss(b_post0):
    h = R.expand_streams(x, n)
    for k, w in enumerate(ws):
      b_pre, b_post, b_res = R.mhc_static_init(
        n, layer_index=k if focused else None
      )
      maps = R.mhc_maps(
        h,
        phi_pre=None,
        phi_post=None,
        phi_res=None,
        b_pre=b_pre,
        b_post=b_post0 if k == 0 else b_post,
        b_res=b_res,
      )
      f = lambda v, w=w: common.linear(w)(common.rms(v))  # noqa: E731
      h = R.hyper_connection(h, f, h_pre=maps[0], h_post=maps[1], h_res=maps[2])
    return jnp.sum(jnp.sin(h.sum(-2)))

  return jax.grad(loss)(R.mhc_static_init(n)[1])


def test_focused_read_separates_the_streams():
  # Uniform read: every stream gets the same gradient, so identical streams
  # stay identical forever. The focused read (same function at init) sends
  # different gradients to different streams.
  uniform = _stream_gradients(focused=False)
  np.testing.assert_allclose(uniform, uniform[0], rtol=1e-5)
  focused = _stream_gradients(focused=True)
  assert float(jnp.max(focused) - jnp.min(focused)) > 1e-2 * float(
    jnp.max(jnp.abs(focused))
  )


# ---------------------------------------------------------------------------
# The modules (jaxnorm.nn.residual.manifold).


@pytest.mark.parametrize("residual_map", ["sinkhorn", "quaternion"])
def test_mhc_module_matches_function(residual_map):
  d = 8
  m = nn_res.ManifoldHyperConnection(
    d, residual_map=residual_map, phi_init_std=0.1, norm=None, rngs=nnx.Rngs(3)
  )
  h = jax.random.normal(jax.random.key(1), (2, 4, d))
  maps = R.mhc_maps(
    h,
    phi_pre=m.phi_pre[...],
    phi_post=m.phi_post[...],
    phi_res=m.phi_res[...],
    b_pre=m.b_pre[...],
    b_post=m.b_post[...],
    b_res=m.b_res[...],
    residual=residual_map,
  )
  helpers.assert_close(
    m(h, jnp.sin),
    R.hyper_connection(
      h, jnp.sin, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    atol=1e-6,
  )
  assert float(jnp.std(m.phi_res[...])) > 0.05  # phi_init_std is used


def test_ihc_streams_equal_plain_residual_stream():
  d, x = 16, jax.random.normal(jax.random.key(0), (2, 5, 16))
  net = _net("ihc", 2, d)
  plain = _net("prenorm", 2, d)(x)
  h = R.expand_streams(x, 4)
  for block, step in zip(net.blocks, net.steps):
    h = step(h, block)
  helpers.assert_close(
    h, jnp.broadcast_to(plain[..., None, :], h.shape), atol=1e-5
  )
