"""Oracle tests of the Phase-Coherent Transformer's attention and norm.

Oracles: a NumPy port (tests/oracles/complex_numpy.py) of the official PCT
attention forward; phase invariances; causality, chunking and finite
gradients of every gate. `jaxnorm.cplx.pct_rms_norm` against a transcription
of the repository's ``ComplexRMSNorm`` (tests/oracles/cnet_pct_numpy.py),
its output RMS ``1/d`` and its relation to CNet's TokenNorm.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import cplx
from tests.cplx import _common as c
from tests.oracles import cnet_pct_numpy as official
from tests.oracles import complex_numpy as ref

RNG = np.random.default_rng(1)
B, T, N, K, H = 2, 5, 4, 2, 3


def _qkv(t=T):
  return c.complex_qkv(RNG, B, t, N, K, H)


def test_pct_matches_official_forward_port():
  q, k, v = (c.np_cnormal(RNG, (T, H)) for _ in range(3))
  b = -np.log(64.0)
  for causal in (False, True):
    got = cplx.pct_attention(
      *(jnp.asarray(a[:, None], jnp.complex64) for a in (q, k, v)),
      jnp.float32(b),
      is_causal=causal,
    )
    c.close(got[:, 0], ref.pct_attention(q, k, v, b, causal), atol=2e-5)


@jax.jit(static_argnames="gate")
def _pct_cases(q, k, v, gate):
  """Causal output, output with the last key/value changed, chunked output
  and the input gradient at q = k = 0, in one compiled function."""
  b = jnp.float32(-1.0)
  y = cplx.pct_attention(q, k, v, b, is_causal=True, gate=gate)
  y2 = cplx.pct_attention(
    q, k.at[:, -1].add(3.0), v.at[:, -1].add(3.0), b, is_causal=True, gate=gate
  )
  chunked = cplx.pct_attention(
    q, k, v, b, is_causal=True, gate=gate, chunk_size=2
  )
  g = jax.grad(
    lambda t: jnp.sum(
      jnp.abs(cplx.pct_attention(t, t[:, :, :K], v, b, gate=gate)) ** 2
    )
  )(jnp.zeros_like(q))
  return y, y2, chunked, g


@pytest.mark.parametrize("gate", sorted(cplx.PCT_GATES))
def test_pct_gates_causal_chunked_and_finite(gate):
  y, y2, chunked, g = _pct_cases(*_qkv(t=6), gate=gate)
  c.close(y2[:, :-1], y[:, :-1], atol=1e-6, rtol=2e-6)
  # Chunks sum their scores in another order: float32 round-off on |y| ~ 8.
  c.close(chunked, y, atol=1e-6, rtol=2e-6)
  assert c.finite(g) and c.finite(y)


def test_pct_phase_properties():
  q, k, v = _qkv()
  b = jnp.float32(0.0)
  y = cplx.pct_attention(q, k, v, b)
  rot = jnp.complex64(np.exp(0.9j))
  # Common phase on q and k: weights (hence output) unchanged.
  c.close(cplx.pct_attention(rot * q, rot * k, v, b), y, atol=1e-5)
  # A relative phase changes them.
  assert not np.allclose(cplx.pct_attention(rot * q, k, v, b), y, atol=1e-3)
  # A phase on v comes out (equivariance of the sublayer).
  c.close(cplx.pct_attention(rot * q, rot * k, rot * v, b), rot * y, atol=1e-5)
  # No row normalization: the weights of the identity values do not sum to 1.
  eye = jnp.eye(T, dtype=jnp.complex64)[None, :, None, :].repeat(B, 0)
  w = cplx.pct_attention(q[..., :1, :], k[..., :1, :], eye, b)
  assert not np.allclose(np.asarray(w).real.sum(-1), 1.0, atol=1e-2)


def test_pct_errors():
  q, k, v = _qkv()
  b = jnp.float32(0.0)
  with pytest.raises(ValueError, match=r"pct_attention: gate must be one of"):
    cplx.pct_attention(q, k, v, b, gate="softmax")
  with pytest.raises(ValueError, match=r"pct_attention: gate_bias must be a"):
    cplx.pct_attention(q, k, v, jnp.zeros(2))
  with pytest.raises(ValueError, match=r"pct_attention: T=5 must be divisible"):
    cplx.pct_attention(q, k, v, b, chunk_size=2)
  with pytest.raises(TypeError, match=r"pct_attention: bias must have a real"):
    cplx.pct_attention(q, k, v, b, jnp.ones((1, 1, T, T), jnp.complex64))


# ---------------------------------------------------------------------------
# The PCT's ComplexRMSNorm.


def test_pct_rms_norm_matches_official_and_has_rms_one_over_d():
  x = c.np_cnormal(RNG, (3, 5, 8))
  gamma = c.np_cnormal(RNG, (8,))
  want = official.pct_rms_norm(x, gamma)
  got = cplx.pct_rms_norm(
    jnp.asarray(x, jnp.complex64), jnp.asarray(gamma, jnp.complex64)
  )
  c.close(got, want, atol=2e-6)
  with jax.enable_x64(True):
    got64 = cplx.pct_rms_norm(jnp.asarray(x), jnp.asarray(gamma))
    np.testing.assert_allclose(got64, want, atol=1e-14)
    # Unit gain: per-element RMS modulus 1/d (CNet's TokenNorm: 1).
    y = np.asarray(cplx.pct_rms_norm(jnp.asarray(x)))
    rms = np.sqrt((np.abs(y) ** 2).mean(-1))
    np.testing.assert_allclose(rms, 1 / 8, rtol=1e-12)
    cnet = np.asarray(cplx.complex_rms_norm(jnp.asarray(x), eps=0.0))
    np.testing.assert_allclose(np.sqrt((np.abs(cnet) ** 2).mean(-1)), 1.0)
    # complex_rms_norm(x, gamma / d, eps=0) away from zero.
    alt = cplx.complex_rms_norm(jnp.asarray(x), jnp.asarray(gamma) / 8, eps=0.0)
    np.testing.assert_allclose(got64, alt, atol=1e-14)
    # Axis 0, phase equivariance and scale invariance.
    got0 = cplx.pct_rms_norm(jnp.asarray(np.moveaxis(x, -1, 0)), axis=0)
    np.testing.assert_allclose(np.moveaxis(np.asarray(got0), 0, -1), y)
    rot = np.exp(0.7j)
    np.testing.assert_allclose(
      cplx.pct_rms_norm(jnp.asarray(rot * 3.0 * x)), rot * y, atol=1e-14
    )


def test_pct_rms_norm_zero_token_and_errors():
  zero = jnp.zeros((2, 4), jnp.complex64)
  assert float(jnp.abs(cplx.pct_rms_norm(zero)).sum()) == 0.0
  g = jax.grad(lambda t: jnp.sum(jnp.real(cplx.pct_rms_norm(t))))(zero)
  assert c.finite(g)
  with pytest.raises(TypeError, match=r"pct_rms_norm: x must have a complex"):
    cplx.pct_rms_norm(jnp.ones(4))
  with pytest.raises(TypeError, match=r"pct_rms_norm: scale must have"):
    cplx.pct_rms_norm(zero, jnp.ones(4))
  with pytest.raises(ValueError, match=r"pct_rms_norm: scale must have shape"):
    cplx.pct_rms_norm(zero, jnp.ones(3, jnp.complex64))
  with pytest.raises(ValueError, match=r"pct_rms_norm: axis must be"):
    cplx.pct_rms_norm(zero, axis=2)
  with pytest.raises(ValueError, match=r"pct_rms_norm: eps must be > 0"):
    cplx.pct_rms_norm(zero, eps=0.0)


def test_pct_rms_norm_huge_tokens_normalize():
  # |x| = 1e30: the sum of squares would overflow complex64; the output is
  # the unit-scale one, modulus 1/d per element (d = 4).
  x = 1e30 * (1 + 1j) * jnp.ones((2, 4), jnp.complex64)
  y = cplx.pct_rms_norm(x)
  np.testing.assert_allclose(jnp.abs(y), 0.25, rtol=1e-6)
  np.testing.assert_allclose(y, cplx.pct_rms_norm(x / 1e30), rtol=1e-6)
