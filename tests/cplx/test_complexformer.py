"""Oracle tests of `jaxnorm.cplx.complexformer`: ComplexFormer attention.

Oracles: a NumPy port (tests/oracles/complex_numpy.py) of the official
ComplexFormer forward and the exact RoPE identity with delta = 1, b = 0;
causality and relative positions.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention, cplx
from tests.cplx import _common as c
from tests.oracles import complex_numpy as ref

RNG = np.random.default_rng(1)
B, T, N, K = 2, 5, 4, 2
HR = 4  # Real head dim of ComplexFormer (2 complex dims).


def _real_qkv(t=T, n=N, kv=K):
  return tuple(
    jnp.asarray(RNG.normal(size=(B, t, m, HR)), jnp.float32)
    for m in (n, kv, kv)
  )


def test_complexformer_delta1_is_rope_exactly():
  q, k, v = _real_qkv()
  delta = jnp.ones((N, HR // 2))
  pb = jnp.zeros((N, HR // 2))
  logits = cplx.complexformer_logits(q, k, delta, pb, eps=0.0)
  kr = jnp.repeat(k, N // K, axis=2)
  want = jnp.einsum("btnh,bsnh->bnts", attention.rope(q), attention.rope(kr))
  c.close(logits, want, atol=1e-5)
  out = cplx.complexformer_attention(
    q, k, v, delta, pb, eps=0.0, is_causal=True
  )
  want = attention.dot_product_attention(
    attention.rope(q), attention.rope(k), v, scale=1.0, is_causal=True
  )
  c.close(out, want, atol=1e-5)


def test_complexformer_matches_official_forward_port():
  q, k, _ = _real_qkv(n=1, kv=1)
  delta = RNG.normal(size=(1, HR // 2)) * 0.7
  pb = RNG.normal(size=(1, HR // 2))
  got = cplx.complexformer_logits(
    q, k, jnp.asarray(delta, jnp.float32), jnp.asarray(pb, jnp.float32)
  )
  for b in range(B):
    want = ref.complexformer_logits(
      np.asarray(q[b, :, 0], np.float64),
      np.asarray(k[b, :, 0], np.float64),
      delta[0],
      pb[0],
    )
    c.close(got[b, 0], want, atol=2e-5)


def test_complexformer_causal_positions_and_gradient_at_zero():
  q, k, v = _real_qkv()
  delta = jnp.asarray(RNG.normal(size=(N, HR // 2)), jnp.float32)
  pb = jnp.zeros((N, HR // 2))
  y = cplx.complexformer_attention(q, k, v, delta, pb, is_causal=True)
  y2 = cplx.complexformer_attention(
    q, k.at[:, -1].add(1.0), v.at[:, -1].add(1.0), delta, pb, is_causal=True
  )
  c.close(y2[:, :-1], y[:, :-1], atol=1e-6)
  # Relative positions: shifting every position leaves the logits unchanged.
  p = jnp.arange(T, dtype=jnp.float32)
  l0 = cplx.complexformer_logits(q, k, delta, pb)
  l1 = cplx.complexformer_logits(
    q, k, delta, pb, positions=p + 7, key_positions=p + 7
  )
  c.close(l1, l0, atol=5e-5)
  zero = jnp.zeros_like(q)
  g = jax.grad(
    lambda t: jnp.sum(
      cplx.complexformer_attention(t, t[:, :, :K], v, delta, pb)
    )
  )(zero)
  assert c.finite(g)
  unb = cplx.complexformer_attention(q[0], k[0], v[0], delta, pb)
  c.close(unb, cplx.complexformer_attention(q, k, v, delta, pb)[0], atol=1e-6)


def test_complexformer_errors():
  q, k, v = _real_qkv()
  d = jnp.ones((N, HR // 2))
  with pytest.raises(ValueError, match=r"complexformer_logits: delta must"):
    cplx.complexformer_logits(q, k, d[:1], d)
  with pytest.raises(ValueError, match=r"complexformer_attention: the head"):
    cplx.complexformer_attention(q[..., :3], k[..., :3], v, d, d)
  with pytest.raises(ValueError, match=r"complexformer_logits: positions"):
    cplx.complexformer_logits(q, k, d, d, positions=jnp.arange(T + 1))
