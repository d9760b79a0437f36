"""Looped LSA + norm: exact power method (float64), LSA consistency, norms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import looped

D, N, T = 5, 12, 6


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, N, D)) * np.array([2.0, 1.5, 1.0, 0.7, 0.4])
  v0 = rng.normal(size=(2, D))
  return x, v0


def _np_power(x, v0, t):
  s = x.T @ x / x.shape[0]
  out, v = [], v0
  for _ in range(t):
    v = s @ v
    out.append(v / np.linalg.norm(v))
  return np.stack(out)


def test_exact_construction_is_the_power_method(data):
  x, v0 = data
  with jax.enable_x64(True):
    wkq, wpv = looped.power_construction(D, dtype=jnp.float64)
    got = np.asarray(looped.looped_lsa(x, v0, wkq, wpv, num_loops=T))
    s = np.einsum("bnd,bne->bde", x, x) / N
    oracle = np.asarray(looped.power_iteration(s, v0, T))
    rms = np.asarray(
      looped.looped_lsa(x, v0, wkq, wpv, num_loops=T, norm="rms")
    )
    raw = np.asarray(
      looped.looped_lsa(x, v0, wkq, wpv, num_loops=3, norm="none")
    )
    ln = np.asarray(
      looped.looped_lsa(x, v0, wkq, wpv, num_loops=T, norm="layernorm")
    )
  for b in range(2):
    want = _np_power(x[b], v0[b], T)
    np.testing.assert_allclose(got[b], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(oracle[b], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rms[b], np.sqrt(D) * want, atol=1e-12)
    raw_want = np.linalg.matrix_power(x[b].T @ x[b] / N, 3) @ v0[b]
    np.testing.assert_allclose(raw[b, -1], raw_want, rtol=1e-12)
    cos = np.abs(np.sum(ln[b] * want, -1)) / np.linalg.norm(ln[b], axis=-1)
    assert np.all(cos < 1 - 1e-6)  # centring breaks exactness


def test_query_update_matches_full_lsa(data):
  x, v0 = data
  rng = np.random.default_rng(1)
  wkq = rng.normal(size=(2 * D, 2 * D)).astype(np.float32)
  wpv = rng.normal(size=(2 * D, 2 * D)).astype(np.float32)
  xf, vf = x.astype(np.float32), v0.astype(np.float32)
  z = np.zeros((2, 2 * D, N + 1), np.float32)
  z[:, :D, :N] = np.swapaxes(xf, 1, 2)
  z[:, D:, N] = vf
  full = np.asarray(looped.linear_self_attention(z, wkq, wpv, n=N))
  # NumPy oracle of the LSA formula.
  m = np.diag(np.r_[np.ones(N), 0.0])
  want = np.stack(
    [wpv @ z[b] @ m @ (z[b].T @ wkq @ z[b]) / N for b in range(2)]
  )
  np.testing.assert_allclose(full, want, rtol=1e-4, atol=1e-4)
  one = looped.looped_lsa(
    xf, vf, wkq, wpv, num_loops=1, norm="none", return_all=False
  )
  np.testing.assert_allclose(one, full[:, D:, N], rtol=1e-4, atol=1e-4)
  res = looped.looped_lsa(
    xf, vf, wkq, wpv, num_loops=1, norm="none", residual=True
  )
  np.testing.assert_allclose(
    res[:, 0], full[:, D:, N] + vf, rtol=1e-4, atol=1e-4
  )


def test_norms_scale_invariance_and_grad(data):
  x, v0 = data
  xf, vf = x.astype(np.float32), v0.astype(np.float32)
  wkq, wpv = looped.power_construction(D)
  f = jax.jit(
    lambda a, b: looped.looped_lsa(xf, vf, a, b, num_loops=3, norm="rms")
  )
  base = f(wkq, wpv)
  np.testing.assert_allclose(
    f(3.0 * wkq, 0.5 * wpv), base, rtol=1e-5, atol=1e-6
  )
  g = jax.grad(lambda a: jnp.sum(f(a, wpv)[..., -1, :] ** 2))(wkq)
  assert np.all(np.isfinite(np.asarray(g)))
  assert float(jnp.abs(g).max()) < 1e-3  # output norm is fixed at sqrt(d)


def test_errors(data):
  x, v0 = data
  w = np.zeros((2 * D, 2 * D))
  with pytest.raises(ValueError, match="looped_lsa: norm must be one of"):
    looped.looped_lsa(x, v0, w, w, num_loops=1, norm="batch")
  with pytest.raises(ValueError, match="num_loops must be a positive"):
    looped.looped_lsa(x, v0, w, w, num_loops=0)
  with pytest.raises(ValueError, match=r"w_kq must have shape \(10, 10\)"):
    looped.looped_lsa(x, v0, w[:3], w, num_loops=1)
  with pytest.raises(ValueError, match="v0 must have shape"):
    looped.looped_lsa(x, v0[0], w, w, num_loops=1)
  with pytest.raises(ValueError, match="n must be <= the token count"):
    looped.linear_self_attention(np.zeros((10, 4)), w, w, n=5)
  with pytest.raises(ValueError, match="power_iteration: s must have shape"):
    looped.power_iteration(np.zeros((3, 4)), np.zeros(3), 2)
  with pytest.raises(TypeError, match="x must have a floating dtype"):
    looped.looped_lsa(x.astype(np.int32), v0, w, w, num_loops=1)
