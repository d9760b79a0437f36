"""Oracle tests of `jaxnorm.cplx.born`: CNet's Born probabilities, Born
cross-entropy and Born attention.

Oracles: NumPy complex128 ports (tests/oracles/complex_numpy.py) of CNet's
forward and hand-written backward passes (compared with jax.grad under the
Wirtinger mapping); invariances (phase, scale); the causal form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import cplx
from tests.cplx import _common as c
from tests.oracles import complex_numpy as ref

RNG = np.random.default_rng(1)
B, T, N, K, H = 2, 5, 4, 2, 3


def _qkv(t=T):
  return c.complex_qkv(RNG, B, t, N, K, H)


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
