"""Oracle tests of `jaxnorm.cplx.attention`: Born attention and Born CE,
causal Fourier mixing, ComplexFormer and the PCT gates.

Oracles: NumPy complex128 ports (tests/oracles/complex_numpy.py) of CNet's
hand-written backward passes (compared with jax.grad under the Wirtinger
mapping), of the official ComplexFormer and PCT forwards, the direct DFT sum
and ``fft(norm="ortho")``; the exact RoPE identity of ComplexFormer with
delta = 1, b = 0; invariances (phase, scale); causality of every causal form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention, cplx
from tests.cplx import _common as c
from tests.oracles import complex_numpy as ref

RNG = np.random.default_rng(1)
B, T, N, K, H = 2, 5, 4, 2, 3


def _qkv(dtype=jnp.complex64, t=T):
  return tuple(
    jnp.asarray(c.np_cnormal(RNG, (B, t, n, H)), dtype) for n in (N, K, K)
  )


# ---------------------------------------------------------------------------
# Born rule.


def test_born_probs_and_invariance():
  z = c.np_cnormal(RNG, (3, 7))
  p = cplx.born_probs(jnp.asarray(z, jnp.complex64))
  c.close(
    p, np.abs(z) ** 2 / (np.abs(z) ** 2).sum(-1, keepdims=True), atol=1e-6
  )
  scaled = cplx.born_probs(jnp.asarray(z * (0.3 - 2j), jnp.complex64))
  c.close(scaled, p, atol=1e-6)
  assert float(cplx.born_probs(jnp.zeros((2, 3), jnp.complex64)).sum()) == 0


def test_born_cross_entropy_value_and_closed_form_gradient():
  z = c.np_cnormal(RNG, (2, 3, 6))
  labels = RNG.integers(0, 6, size=(2, 3))
  with jax.enable_x64(True):
    zj = jnp.asarray(z)
    for s in (0.0, 0.1):
      loss, g = jax.value_and_grad(
        lambda t, s=s: cplx.born_cross_entropy(t, labels, smoothing=s)
      )(zj)
      np.testing.assert_allclose(loss, ref.born_ce(z, labels, s), atol=1e-12)
      # jax.grad = conj(2 dL/dz̄) (the spec's mapping).
      want = np.conj(2 * ref.born_ce_grad(z, labels, s))
      np.testing.assert_allclose(g, want, atol=1e-12)
      # Without the floor the custom VJP is the forward's own gradient.
      auto = jax.grad(
        lambda t, s=s: ref_born_ce_jnp(t, jnp.asarray(labels), s)
      )(zj)
      np.testing.assert_allclose(g, auto, atol=1e-12)
    scaled = cplx.born_cross_entropy(zj * (2 - 1j), labels)
    np.testing.assert_allclose(scaled, cplx.born_cross_entropy(zj, labels))


def ref_born_ce_jnp(z, labels, s):
  """The forward by autodiff-able jnp ops (no custom VJP)."""
  p = jnp.abs(z) ** 2
  py = jnp.take_along_axis(p, labels[..., None], axis=-1)[..., 0]
  return jnp.mean(-jnp.log((py + s) / (p.sum(-1) + z.shape[-1] * s)))


def test_born_cross_entropy_target_floor_and_zero_input():
  z = np.array([[1e-3 + 0j, 1.0, 1.0]])
  labels = np.array([0])
  zj = jnp.asarray(z, jnp.complex64)
  g0 = jax.grad(lambda t: cplx.born_cross_entropy(t, labels))(zj)
  g1 = jax.grad(
    lambda t: cplx.born_cross_entropy(t, labels, target_floor=1e-3)
  )(zj)
  # The floor caps the target's 1/|z_y| blow-up in the backward only.
  assert abs(complex(g1[0, 0])) < abs(complex(g0[0, 0])) / 10
  c.close(g1[0, 1:], g0[0, 1:], atol=1e-6)
  zero = jnp.zeros((2, 4), jnp.complex64)
  loss, g = jax.value_and_grad(
    lambda t: cplx.born_cross_entropy(t, np.array([0, 1]))
  )(zero)
  assert np.isfinite(float(loss)) and c.finite(g)


def test_born_cross_entropy_errors():
  z = jnp.ones((2, 3), jnp.complex64)
  with pytest.raises(TypeError, match=r"born_cross_entropy: labels must be"):
    cplx.born_cross_entropy(z, jnp.zeros(2))
  with pytest.raises(ValueError, match=r"born_cross_entropy: labels must have"):
    cplx.born_cross_entropy(z, jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match=r"born_cross_entropy: smoothing must"):
    cplx.born_cross_entropy(z, jnp.zeros(2, jnp.int32), smoothing=-1.0)


def test_born_attention_weights_invariants():
  q, k, _ = _qkv()
  w = cplx.born_attention_weights(q, k)
  c.close(w.sum(-1), np.ones((B, N, T)), atol=1e-5)
  phase_q = jnp.asarray(
    np.exp(1j * RNG.uniform(0, 6, (B, T, 1, 1))), jnp.complex64
  )
  w2 = cplx.born_attention_weights(q * phase_q * 3.0, k * phase_q[:, ::-1])
  c.close(w2, w, atol=1e-5)
  wc = cplx.born_attention_weights(q, k, is_causal=True)
  c.close(wc[..., 0, :], np.eye(T)[0] * np.ones((B, N, 1)), atol=1e-6)


def test_born_attention_matches_port_and_causal_row0():
  q, k, v = (c.np_cnormal(RNG, (T, H)) for _ in range(3))
  for causal in (False, True):
    want, _, _ = ref.born_attention_forward(q, k, v, causal)
    got = cplx.born_attention(
      *(jnp.asarray(a[:, None], jnp.complex64) for a in (q, k, v)),
      is_causal=causal,
    )
    c.close(got[:, 0], want, atol=2e-5)
  c.close(got[0, 0], v[0], atol=1e-5)  # Causal row 0 returns v_0.


def test_born_attention_backward_equals_cnet_hand_backward():
  """CNet's dL/dQ̄, dL/dK̄, dL/dV̄ vs jax.grad = conj(2 dL/d(·)̄)."""
  q, k, v, cot = (c.np_cnormal(RNG, (T, H)) for _ in range(4))
  for causal in (False, True):
    with jax.enable_x64(True):

      def f(q, k, v, causal=causal):
        out = cplx.born_attention(
          q[:, None], k[:, None], v[:, None], is_causal=causal
        )
        return out[:, 0]

      grads = jax.grad(c.real_loss(f, cot), argnums=(0, 1, 2))(
        *(jnp.asarray(a) for a in (q, k, v))
      )
    hand = ref.born_attention_backward(q, k, v, np.conj(cot) / 2, causal)
    for g, h in zip(grads, hand):
      np.testing.assert_allclose(np.asarray(g), np.conj(2 * h), atol=1e-10)


def test_born_attention_gqa_mask_and_zero_rows():
  q, k, v = _qkv()
  mask = jnp.asarray(RNG.random((B, 1, T, T)) > 0.4)
  mask = mask.at[:, :, 0].set(False)  # A fully masked row: weights 0.
  out = cplx.born_attention(q, k, v, mask)
  rep = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
  c.close(out, cplx.born_attention(q, *rep, mask), atol=1e-6)
  c.close(out[:, 0], np.zeros((B, N, H)), atol=0)
  zero = jnp.zeros_like(q)
  g = jax.grad(lambda t: jnp.sum(jnp.abs(cplx.born_attention(t, k, v)) ** 2))(
    zero
  )
  assert c.finite(g)
  unbatched = cplx.born_attention(q[0], k[0], v[0])
  c.close(unbatched, cplx.born_attention(q, k, v)[0], atol=1e-6)


def test_born_attention_errors():
  q, k, v = _qkv()
  with pytest.raises(TypeError, match=r"born_attention: key must have a comp"):
    cplx.born_attention(q, jnp.real(k), v)
  with pytest.raises(ValueError, match=r"born_attention: key head_dim must"):
    cplx.born_attention(q, k[..., :2], v)
  with pytest.raises(TypeError, match=r"born_attention: mask must be boolean"):
    cplx.born_attention(q, k, v, jnp.ones((1, 1, T, T)))


# ---------------------------------------------------------------------------
# Causal Fourier mixing.


@pytest.mark.parametrize("method", ["bluestein", "direct"])
def test_causal_fourier_matches_direct_sum(method):
  h = c.np_cnormal(RNG, (3, 12))
  want = ref.causal_fourier_direct(h)
  got = cplx.causal_fourier_mix(jnp.asarray(h, jnp.complex64), method=method)
  c.close(got, want, atol=2e-5)
  got0 = cplx.causal_fourier_mix(
    jnp.asarray(h.T, jnp.complex64), axis=0, method=method
  )
  c.close(got0, want.T, atol=2e-5)
  with jax.enable_x64(True):
    got64 = cplx.causal_fourier_mix(jnp.asarray(h), method=method)
    np.testing.assert_allclose(got64, want, atol=1e-12)


@pytest.mark.parametrize("method", ["bluestein", "direct"])
def test_causal_fourier_is_causal(method):
  h = jnp.asarray(c.np_cnormal(RNG, (16,)), jnp.complex64)
  y = cplx.causal_fourier_mix(h, method=method)
  y2 = cplx.causal_fourier_mix(h.at[9:].add(10.0), method=method)
  # Exact for the matrix form; FFT rounding only for Bluestein.
  atol = 0 if method == "direct" else 2e-5
  c.close(y2[:9], y[:9], atol=atol)
  assert not np.allclose(y2[9:], y[9:])


def test_unmasked_mix_is_ortho_fft():
  """The lower-triangular sum plus its strictly upper part is the FFT."""
  h = c.np_cnormal(RNG, (10,))
  n = 10
  j = np.arange(n)
  upper = np.exp(-2j * np.pi * np.outer(j, j) / n) * np.triu(np.ones((n, n)), 1)
  full = ref.causal_fourier_direct(h) + h @ upper.T / np.sqrt(n)
  np.testing.assert_allclose(full, np.fft.fft(h, norm="ortho"), atol=1e-12)
  got = cplx.causal_fourier_mix(jnp.asarray(h, jnp.complex64))
  c.close(got, ref.causal_fourier_direct(h), atol=2e-5)


def test_causal_fourier_errors_and_empty():
  with pytest.raises(ValueError, match=r"causal_fourier_mix: method must be"):
    cplx.causal_fourier_mix(jnp.ones(3, jnp.complex64), method="fft")
  assert cplx.causal_fourier_mix(jnp.ones((2, 0), jnp.complex64)).shape == (
    2,
    0,
  )


# ---------------------------------------------------------------------------
# ComplexFormer.

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


# ---------------------------------------------------------------------------
# PCT.


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
