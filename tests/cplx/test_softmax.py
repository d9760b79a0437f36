"""Oracle tests of `jaxnorm.cplx.softmax`: complex softmax attention.

Oracle: a NumPy complex128 transcription of the formula (softmax of
``Re(q k^H)/sqrt(H)`` plus bias, masked, times complex ``v``); the phase
invariance; the causal form; grouped-query heads, unbatched inputs, jit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import cplx
from tests.cplx import _common as c

RNG = np.random.default_rng(2)
B, T, N, K, H = 2, 5, 4, 2, 3


def _qkv(t=T):
  return c.complex_qkv(RNG, B, t, N, K, H)


def _oracle(q, k, v, bias=None, mask=None, causal=False):
  """NumPy complex128 complex softmax attention, ``(B, T, N, H)`` layouts."""
  q, k, v = (np.asarray(a, np.complex128) for a in (q, k, v))
  g = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  s = np.real(np.einsum("btnh,bsnh->bnts", q, np.conj(k))) / np.sqrt(H)
  if bias is not None:
    s = s + np.asarray(bias, np.float64)
  allowed = np.ones(s.shape, bool)
  if mask is not None:
    allowed = allowed & np.asarray(mask)
  if causal:
    allowed = allowed & np.tril(np.ones(s.shape[-2:], bool))
  s = np.where(allowed, s, -np.inf)
  w = np.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  return np.einsum("bnts,bsnh->btnh", w, v)


def test_matches_numpy_oracle_with_gqa_bias_mask_and_causal():
  q, k, v = _qkv()
  bias = RNG.normal(size=(B, 1, T, T))
  mask = RNG.random((1, N, T, T)) > 0.3
  mask[..., 0] = True  # No fully masked row.
  for causal in (False, True):
    got = cplx.complex_softmax_attention(
      q,
      k,
      v,
      jnp.asarray(bias, jnp.float32),
      jnp.asarray(mask),
      is_causal=causal,
    )
    assert got.dtype == jnp.complex64 and got.shape == (B, T, N, H)
    want = _oracle(q, k, v, bias, mask, causal)
    c.close(got, want, atol=2e-6, rtol=1e-5)
  c.close(cplx.complex_softmax_attention(q, k, v), _oracle(q, k, v), atol=2e-6)


def test_phase_invariance_causality_unbatched_and_jit():
  q, k, v = _qkv()
  y = cplx.complex_softmax_attention(q, k, v, is_causal=True)
  # A common phase on q and k leaves the weights; a phase on v rotates out.
  turn = jnp.complex64(np.exp(0.7j))
  c.close(
    cplx.complex_softmax_attention(
      q * turn, k * turn, v * turn, is_causal=True
    ),
    y * turn,
    atol=2e-6,
  )
  y2 = cplx.complex_softmax_attention(
    q, k.at[:, -1].add(3.0), v.at[:, -1].add(3.0), is_causal=True
  )
  c.close(y2[:, :-1], y[:, :-1], atol=0)
  assert not np.allclose(y2[:, -1], y[:, -1], atol=1e-3)
  c.close(
    cplx.complex_softmax_attention(q[0], k[0], v[0]),
    _oracle(q, k, v)[0],
    atol=2e-6,
  )
  jitted = jax.jit(cplx.complex_softmax_attention, static_argnames="is_causal")
  c.close(jitted(q, k, v, is_causal=True), y, atol=1e-6)
  g = jax.grad(
    lambda t: jnp.sum(jnp.abs(cplx.complex_softmax_attention(t, k, v)) ** 2)
  )(jnp.zeros_like(q))
  assert c.finite(g)


def test_complex_softmax_errors():
  q, k, v = _qkv()
  who = "complex_softmax_attention"
  with pytest.raises(TypeError, match=rf"{who}: key must have a complex"):
    cplx.complex_softmax_attention(q, jnp.real(k), v)
  with pytest.raises(ValueError, match=rf"{who}: key head_dim must"):
    cplx.complex_softmax_attention(q, k[..., :2], v)
  with pytest.raises(TypeError, match=rf"{who}: mask must be boolean"):
    cplx.complex_softmax_attention(q, k, v, None, jnp.ones((1, 1, T, T)))
  with pytest.raises(TypeError, match=rf"{who}: bias must have a real"):
    cplx.complex_softmax_attention(
      q, k, v, jnp.ones((1, 1, T, T), jnp.complex64)
    )
  with pytest.raises(ValueError, match=rf"{who}: bias must be broadcastable"):
    cplx.complex_softmax_attention(q, k, v, jnp.ones((1, 1, T, 2)))
