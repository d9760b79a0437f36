"""Oracle tests of `jaxnorm.cplx` basics, norms, activations and layers.

Oracles: NumPy complex128 closed forms (tests/oracles/complex_numpy.py),
Trabelsi's ``complex_standardization``, the whitening invariants (identity
covariance, zero pseudo-covariance), phase equivariance, CNet's
hand-written TokenNorm backward under the Wirtinger mapping, and the exact
identities with the real library (`rms_norm`, `rope`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention, cplx, norms
from tests.cplx import _common as c
from tests.oracles import complex_numpy as ref

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------
# Autodiff contract and layout.


def test_jax_gradient_convention_cookbook():
  """L = |z|^2 at 3+4i: jax.grad gives 6-8i = conj(2 dL/dz̄) (JAX docs)."""
  g = jax.grad(lambda z: jnp.real(z * jnp.conj(z)))(jnp.complex64(3 + 4j))
  assert complex(g) == 6 - 8j


def test_to_complex_to_real_round_trip_and_dtypes():
  x = jnp.arange(12.0).reshape(2, 6)
  z = cplx.to_complex(x)
  assert z.dtype == jnp.complex64 and z.shape == (2, 3)
  np.testing.assert_array_equal(np.asarray(z.real), np.asarray(x[:, :3]))
  np.testing.assert_array_equal(np.asarray(z.imag), np.asarray(x[:, 3:]))
  np.testing.assert_array_equal(cplx.to_real(z), x)
  zb = cplx.to_complex(x.astype(jnp.bfloat16))
  assert zb.dtype == jnp.complex64  # No complex bf16: upcast.
  z0 = cplx.to_complex(x, axis=0)
  assert z0.shape == (1, 6)
  np.testing.assert_array_equal(cplx.to_real(z0, axis=0), x)
  with jax.enable_x64(True):
    z64 = cplx.to_complex(jnp.asarray(np.ones((2, 4))))
    assert z64.dtype == jnp.complex128
    assert cplx.to_real(z64).dtype == jnp.float64


def test_layout_errors():
  with pytest.raises(ValueError, match=r"to_complex: x.shape\[axis\] must"):
    cplx.to_complex(jnp.ones((2, 3)))
  with pytest.raises(TypeError, match=r"to_complex: x must have a real"):
    cplx.to_complex(jnp.ones((2, 4), jnp.complex64))
  with pytest.raises(TypeError, match=r"to_real: z must have a complex"):
    cplx.to_real(jnp.ones((2, 4)))
  with pytest.raises(ValueError, match=r"complex_power: m must be a positive"):
    cplx.complex_power(jnp.ones(2, jnp.complex64), 0)


@pytest.mark.parametrize(
  "fn",
  [
    cplx.modulus,
    cplx.phase,
    lambda z: jnp.real(cplx.unit_phasor(z)),
    lambda z: jnp.imag(cplx.unit_phasor(z)),
    lambda z: jnp.real(cplx.cardioid(z)),
    lambda z: jnp.real(cplx.modrelu(z[None], jnp.zeros(1), power=2)[0]),
    lambda z: jnp.imag(cplx.zrelu(z)),
    lambda z: jnp.real(cplx.split_gelu(z) + cplx.crelu(z)),
  ],
  ids=[
    "abs",
    "angle",
    "unit_re",
    "unit_im",
    "cardioid",
    "modrelu",
    "zrelu",
    "split",
  ],
)
def test_kinks_have_finite_gradient_at_zero(fn):
  g = jax.grad(fn)(jnp.complex64(0.0))
  assert c.finite(g)


def test_safe_kinks_match_numpy_away_from_zero():
  z = c.np_cnormal(RNG, (7,))
  zj = jnp.asarray(z, jnp.complex64)
  c.close(cplx.modulus(zj), np.abs(z), atol=1e-6)
  c.close(cplx.phase(zj), np.angle(z), atol=1e-6)
  c.close(cplx.unit_phasor(zj), z / np.abs(z), atol=1e-6)
  c.close(cplx.modulus_squared(zj), np.abs(z) ** 2, atol=1e-5)
  c.close(cplx.complex_power(zj, 3), z**3, atol=1e-4)
  zero = jnp.zeros(2, jnp.complex64)
  assert float(cplx.modulus(zero).sum()) == 0.0
  assert complex(cplx.unit_phasor(zero)[0]) == 0


# ---------------------------------------------------------------------------
# Whitening norms.


def _bn(x, scale=None, bias=None, training=True, **kw):
  state = cplx.init_complex_batch_norm_state(x.shape[-1], x.dtype)
  return cplx.complex_batch_norm(x, scale, bias, state, training=training, **kw)


def _correlated(rng, shape):
  """Complex input with unequal Re/Im variances and a Re-Im correlation."""
  a, b = rng.normal(size=shape), rng.normal(size=shape)
  return (2.0 * a + 3.0) + 1j * (0.5 * a + 0.3 * b - 1.0)


def test_batch_norm_whitens_to_identity_float64():
  x = _correlated(RNG, (500, 3))
  with jax.enable_x64(True):
    y, _ = _bn(jnp.asarray(x), eps=0.0)
    assert y.dtype == jnp.complex128
    y = np.asarray(y)
  for ch in range(3):
    pair = np.stack([y[:, ch].real, y[:, ch].imag])
    np.testing.assert_allclose(pair.mean(axis=1), 0, atol=1e-10)
    np.testing.assert_allclose(pair @ pair.T / 500, np.eye(2), atol=1e-10)
    assert abs(np.mean(y[:, ch] ** 2)) < 1e-10  # Zero pseudo-covariance.


def test_batch_norm_matches_keras_port_and_default_scale_power():
  x = _correlated(RNG, (6, 4, 5))
  want = ref.complex_standardization(x, eps=1e-4)
  y, state = _bn(jnp.asarray(x, jnp.complex64))
  c.close(y, want, atol=2e-5)
  scale = cplx.init_whitening_scale(5)
  y2, _ = _bn(jnp.asarray(x, jnp.complex64), scale)
  power = np.mean(np.abs(np.asarray(y2)) ** 2, axis=(0, 1))
  np.testing.assert_allclose(power, 1.0, atol=3e-3)  # E|y|^2 = 1 (- eps).
  # Running statistics: 0.9 * init + 0.1 * batch, eps inside Vrr, Vii.
  xc = x - x.mean(axis=(0, 1))
  vrr = (xc.real**2).mean(axis=(0, 1)) + 1e-4
  c.close(state.mean, 0.1 * x.mean(axis=(0, 1)), atol=1e-5)
  c.close(state.cov[0], 0.9 / np.sqrt(2) + 0.1 * vrr, atol=1e-5)


def test_batch_norm_inference_with_batch_stats_equals_training():
  x = jnp.asarray(_correlated(RNG, (8, 3)), jnp.complex64)
  scale = jnp.asarray(RNG.normal(size=(3, 3)), jnp.float32)
  bias = jnp.asarray(c.np_cnormal(RNG, (3,)), jnp.complex64)
  state0 = cplx.init_complex_batch_norm_state(3)
  y_train, s1 = cplx.complex_batch_norm(
    x, scale, bias, state0, training=True, momentum=0.0
  )
  y_eval, s2 = cplx.complex_batch_norm(x, scale, bias, s1, training=False)
  c.close(y_eval, y_train, atol=1e-5)
  assert s2 is s1


def test_whitening_phase_equivariance_and_conjugation():
  """Γ ∝ I, β = 0: f(e^{iα}x) = e^{iα}f(x) and f(x̄) = conj f(x)."""
  x = jnp.asarray(_correlated(RNG, (16, 4)), jnp.complex64)
  rot = jnp.complex64(np.exp(0.7j))
  scale = jnp.asarray([[2.0] * 4, [0.0] * 4, [2.0] * 4])
  for fn in (
    lambda t: _bn(t, scale)[0],
    lambda t: cplx.complex_layer_norm(t, scale),
  ):
    c.close(fn(rot * x), rot * fn(x), atol=1e-4)
    c.close(fn(jnp.conj(x)), jnp.conj(fn(x)), atol=1e-4)


def test_layer_norm_per_token_matches_port():
  x = _correlated(RNG, (3, 5, 6))
  y = cplx.complex_layer_norm(jnp.asarray(x, jnp.complex64))
  want = ref.complex_standardization(x, eps=1e-4, axes=(-1,))
  c.close(y, want, atol=2e-5)
  # Per token: the last token does not move the others (causal-safe).
  x2 = x.copy()
  x2[:, -1] += 5.0
  y2 = cplx.complex_layer_norm(jnp.asarray(x2, jnp.complex64))
  c.close(y2[:, :-1], y[:, :-1], atol=0)


@jax.jit
def _whitening_outputs_and_grad(x):
  def loss(t):
    y = cplx.complex_layer_norm(t) + _bn(t)[0]
    return jnp.sum(jnp.abs(y) ** 2)

  return cplx.complex_layer_norm(x), _bn(x)[0], jax.grad(loss)(x)


def test_whitening_degenerate_inputs_are_finite():
  """All zero, perfectly correlated Re/Im (det V = 0), and around 1e4."""
  line = (1 + 1j) * RNG.normal(size=(4, 3))
  for x in (np.zeros((4, 3)), line, line + 1e4):
    assert c.finite(_whitening_outputs_and_grad(jnp.asarray(x, jnp.complex64)))
  empty, state = _bn(jnp.zeros((0, 3), jnp.complex64))
  assert empty.shape == (0, 3) and c.finite(state)


def test_batch_norm_axis_name_pmean(key):
  """Cross-device statistics over a mapped axis equal the global batch."""
  x = c.cnormal(key, (4, 6, 3)) + 2.0
  state = cplx.init_complex_batch_norm_state(3)

  def per_device(xs):
    return cplx.complex_batch_norm(
      xs, None, None, state, training=True, axis_name="d"
    )

  y, new = jax.vmap(per_device, axis_name="d")(x)
  y_all, new_all = cplx.complex_batch_norm(
    x.reshape(24, 3), None, None, state, training=True
  )
  c.close(y.reshape(24, 3), y_all, atol=2e-5)
  c.close(new.cov[0], new_all.cov, atol=1e-5)


def test_whitening_errors():
  x = jnp.ones((2, 3), jnp.complex64)
  state = cplx.init_complex_batch_norm_state(3)
  with pytest.raises(TypeError, match=r"complex_batch_norm: x must have a"):
    cplx.complex_batch_norm(jnp.ones((2, 3)), None, None, state, training=True)
  with pytest.raises(ValueError, match=r"complex_batch_norm: scale must have"):
    cplx.complex_batch_norm(x, jnp.ones((3,)), None, state, training=True)
  with pytest.raises(TypeError, match=r"complex_batch_norm: bias must have a"):
    cplx.complex_batch_norm(x, None, jnp.ones((3,)), state, training=True)
  with pytest.raises(TypeError, match=r"complex_layer_norm: scale must have"):
    cplx.complex_layer_norm(x, jnp.ones((3, 3), jnp.complex64))
  with pytest.raises(ValueError, match=r"state.cov must have shape"):
    cplx.complex_batch_norm(
      x, None, None, state._replace(cov=jnp.ones((2, 3))), training=True
    )
  with pytest.raises(TypeError, match=r"init_complex_batch_norm_state: dtype"):
    cplx.init_complex_batch_norm_state(3, jnp.float32)
  with pytest.raises(ValueError, match=r"init_whitening_scale: num_features"):
    cplx.init_whitening_scale(0)


# ---------------------------------------------------------------------------
# RMS / L2 norms.


def test_rms_norm_equals_real_rms_norm_on_split_halves():
  x = jnp.asarray(c.np_cnormal(RNG, (3, 8)), jnp.complex64)
  want = cplx.to_complex(norms.rms_norm(cplx.to_real(x), eps=1e-5 / 2))
  c.close(cplx.complex_rms_norm(x), want / 2**0.5, atol=1e-6)


def test_rms_norm_phase_equivariance_with_complex_scale():
  x = jnp.asarray(c.np_cnormal(RNG, (3, 8)), jnp.complex64)
  s = jnp.asarray(c.np_cnormal(RNG, (8,)), jnp.complex64)
  rot = jnp.complex64(np.exp(-1.3j))
  y = cplx.complex_rms_norm(x, s)
  c.close(cplx.complex_rms_norm(rot * x, s), rot * y, atol=1e-5)


def test_rms_norm_backward_equals_cnet_hand_backward():
  """CNet's TokenNorm backward vs jax.grad under dz = g/2, dz* = conj(g)/2.

  ``L = Re Σ conj(C) f(x)`` so ``gO = conj(C)/2``, ``gOb = C/2``; CNet's
  ``dL/dx`` is ``conj(dL/dx̄)`` and jax.grad gives ``conj(2 dL/dx̄)``.
  """
  x = c.np_cnormal(RNG, (3, 8))
  cot = c.np_cnormal(RNG, (3, 8))
  eps = 1e-5
  with jax.enable_x64(True):
    loss = c.real_loss(lambda t: cplx.complex_rms_norm(t, eps=eps), cot)
    g = np.asarray(jax.grad(loss)(jnp.asarray(x)))
  dx = ref.token_norm_backward(x, np.conj(cot) / 2, cot / 2, eps)
  np.testing.assert_allclose(g, 2 * dx, atol=1e-10)


def test_l2_normalize():
  z = c.np_cnormal(RNG, (2, 3, 4))
  y = cplx.complex_l2_normalize(jnp.asarray(z, jnp.complex64), axis=(1, 2))
  want = z / np.sqrt((np.abs(z) ** 2).sum(axis=(1, 2), keepdims=True))
  c.close(y, want, atol=1e-6)
  zero = jnp.zeros((2, 3), jnp.complex64)
  assert float(jnp.abs(cplx.complex_l2_normalize(zero)).sum()) == 0.0
  g = jax.grad(lambda t: jnp.sum(jnp.real(cplx.complex_l2_normalize(t))))(zero)
  assert c.finite(g)


def test_rms_norm_errors():
  x = jnp.ones((2, 3), jnp.complex64)
  with pytest.raises(ValueError, match=r"complex_rms_norm: scale must have"):
    cplx.complex_rms_norm(x, jnp.ones((4,), jnp.complex64))
  with pytest.raises(TypeError, match=r"complex_rms_norm: scale must have a"):
    cplx.complex_rms_norm(x, jnp.ones((3,)))
  with pytest.raises(ValueError, match=r"complex_l2_normalize: axis"):
    cplx.complex_l2_normalize(x, axis=3)


# ---------------------------------------------------------------------------
# Activations.


def test_activations_closed_forms():
  z = c.np_cnormal(RNG, (40,))
  zj = jnp.asarray(z, jnp.complex64)
  relu = lambda t: np.maximum(t, 0)  # noqa: E731
  c.close(cplx.crelu(zj), relu(z.real) + 1j * relu(z.imag), atol=1e-6)
  quadrant = (z.real > 0) & (z.imag > 0)
  z32 = np.asarray(zj)
  c.close(cplx.zrelu(zj), np.where(quadrant, z32, 0), atol=0)
  c.close(cplx.zrelu(zj, closed=False), np.where(quadrant, z32, 0), atol=0)
  boundary = jnp.asarray([1 + 0j, 0 + 2j, -1 + 0j], jnp.complex64)
  c.close(cplx.zrelu(boundary), [1, 2j, 0], atol=0)
  c.close(cplx.zrelu(boundary, closed=False), [0, 0, 0], atol=0)
  b = RNG.normal(size=(40,)) * 0.5
  for p in (1, 2):
    want = relu(np.abs(z) + b) ** p * z / np.abs(z)
    got = cplx.modrelu(zj, jnp.asarray(b, jnp.float32), power=p)
    c.close(got, want, atol=1e-5)
  want = 0.5 * (1 + np.cos(np.angle(z))) * z
  c.close(cplx.cardioid(zj), want, atol=1e-6)
  real_axis = jnp.asarray([-2.0, 3.0], jnp.complex64)
  c.close(cplx.cardioid(real_axis), [0.0, 3.0], atol=1e-7)  # ReLU there.
  gelu = lambda t: (
    0.5
    * t
    * (  # noqa: E731
      1 + np.tanh(np.sqrt(2 / np.pi) * (t + 0.044715 * t**3))
    )
  )
  c.close(cplx.split_gelu(zj), gelu(z.real) + 1j * gelu(z.imag), atol=1e-6)
  assert set(cplx.ACTIVATIONS) == {"crelu", "zrelu", "cardioid", "split_gelu"}


def test_activation_errors():
  with pytest.raises(TypeError, match=r"crelu: z must have a complex"):
    cplx.crelu(jnp.ones(3))
  z = jnp.ones((2, 3), jnp.complex64)
  with pytest.raises(ValueError, match=r"modrelu: bias must have shape"):
    cplx.modrelu(z, jnp.ones(2))
  with pytest.raises(TypeError, match=r"modrelu: bias must have a real"):
    cplx.modrelu(z, jnp.ones(3, jnp.complex64))
  with pytest.raises(ValueError, match=r"modrelu: power must be a positive"):
    cplx.modrelu(z, jnp.ones(3), power=0)


# ---------------------------------------------------------------------------
# Dense, conv, RoPE, widely linear.


def _np_correlate(x, k, stride):
  """Direct complex cross-correlation, NHWC / HWIO, SAME padding (XLA's)."""
  n, h, w, _ = x.shape
  kh, kw, _, o = k.shape
  oh, ow = -(-h // stride), -(-w // stride)
  th = max((oh - 1) * stride + kh - h, 0)
  tw = max((ow - 1) * stride + kw - w, 0)
  pads = ((0, 0), (th // 2, th - th // 2), (tw // 2, tw - tw // 2), (0, 0))
  xp = np.pad(x, pads)
  out = np.zeros((n, oh, ow, o), complex)
  for i in range(oh):
    for j in range(ow):
      patch = xp[:, i * stride : i * stride + kh, j * stride : j * stride + kw]
      out[:, i, j] = np.einsum("nhwc,hwco->no", patch, k)
  return out


@pytest.mark.parametrize("gauss", [False, True])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_matches_direct_correlation(gauss, stride):
  x = c.np_cnormal(RNG, (2, 5, 6, 3))
  k = c.np_cnormal(RNG, (3, 3, 3, 4))
  b = c.np_cnormal(RNG, (4,))
  want = _np_correlate(x, k, stride) + b
  got = cplx.complex_conv(
    jnp.asarray(x, jnp.complex64),
    jnp.asarray(k, jnp.complex64),
    jnp.asarray(b, jnp.complex64),
    strides=stride,
    gauss_trick=gauss,
  )
  c.close(got, want, atol=1e-4)


def test_conv_1d_and_errors():
  x = c.np_cnormal(RNG, (1, 7, 2))
  k = c.np_cnormal(RNG, (3, 2, 2))
  got = cplx.complex_conv(
    jnp.asarray(x, jnp.complex64),
    jnp.asarray(k, jnp.complex64),
    padding="VALID",
  )
  want = np.stack(
    [np.einsum("tc,tco->o", x[0, t : t + 3], k) for t in range(5)]
  )[None]
  c.close(got, want, atol=1e-5)
  z = jnp.ones((1, 4, 4, 2), jnp.complex64)
  with pytest.raises(ValueError, match=r"complex_conv: kernel.shape\[-2\]"):
    cplx.complex_conv(z, jnp.ones((3, 3, 3, 2), jnp.complex64))
  with pytest.raises(ValueError, match=r"complex_conv: kernel must have rank"):
    cplx.complex_conv(z, jnp.ones((3, 2, 2), jnp.complex64))
  with pytest.raises(ValueError, match=r"complex_conv: x must be"):
    cplx.complex_conv(z[0, 0], jnp.ones((2, 2), jnp.complex64))
  with pytest.raises(TypeError, match=r"complex_conv: kernel must have a"):
    cplx.complex_conv(z, jnp.ones((3, 3, 2, 2)))


def test_dense_and_errors():
  x, k, b = (c.np_cnormal(RNG, s) for s in ((3, 4), (4, 5), (5,)))
  got = cplx.complex_dense(*(jnp.asarray(a, jnp.complex64) for a in (x, k, b)))
  c.close(got, x @ k + b, atol=1e-5)
  z = jnp.ones((2, 4), jnp.complex64)
  with pytest.raises(ValueError, match=r"complex_dense: kernel must have sh"):
    cplx.complex_dense(z, jnp.ones((3, 2), jnp.complex64))
  with pytest.raises(ValueError, match=r"complex_dense: bias must have shape"):
    cplx.complex_dense(
      z, jnp.ones((4, 2), jnp.complex64), jnp.ones(3, jnp.complex64)
    )


def test_complex_rope_is_rope_on_split_halves_and_closed_form():
  x = c.np_cnormal(RNG, (2, 5, 3, 4))
  xj = jnp.asarray(x, jnp.complex64)
  got = cplx.complex_rope(xj)
  want = cplx.to_complex(attention.rope(cplx.to_real(xj)))
  c.close(got, want, atol=0)
  theta = 10000.0 ** (-np.arange(4) / 4)
  phase = np.exp(1j * np.arange(5)[:, None] * theta)
  c.close(got, x * phase[None, :, None, :], atol=1e-5)
  with pytest.raises(ValueError, match=r"complex_rope: x must have rank 4"):
    cplx.complex_rope(xj[0])


def test_widely_linear_conversion_is_exact():
  kernel = RNG.normal(size=(6, 8))
  x = RNG.normal(size=(5, 6))
  with jax.enable_x64(True):
    u, w = cplx.widely_linear_from_real(jnp.asarray(kernel))
    assert u.shape == (3, 4) and u.dtype == jnp.complex128
    y = cplx.widely_linear(cplx.to_complex(jnp.asarray(x)), u, w)
    np.testing.assert_allclose(cplx.to_real(y), x @ kernel, atol=1e-12)
    back = cplx.real_from_widely_linear(u, w)
    np.testing.assert_allclose(back, kernel, atol=1e-12)
  # Holomorphic kernel (w = 0) <=> real kernel of the form [[A, B], [-B, A]].
  a, b = RNG.normal(size=(2, 2)), RNG.normal(size=(2, 2))
  holo = np.block([[a, b], [-b, a]])
  u, w = cplx.widely_linear_from_real(jnp.asarray(holo, jnp.float32))
  c.close(w, np.zeros((2, 2)), atol=1e-6)
  c.close(u, a + 1j * b, atol=1e-6)


def test_widely_linear_errors():
  with pytest.raises(ValueError, match=r"widely_linear_from_real: kernel must"):
    cplx.widely_linear_from_real(jnp.ones((3, 4)))
  with pytest.raises(ValueError, match=r"real_from_widely_linear: w must have"):
    cplx.real_from_widely_linear(
      jnp.ones((2, 2), jnp.complex64), jnp.ones((2, 3), jnp.complex64)
    )
  with pytest.raises(TypeError, match=r"widely_linear: x must have a complex"):
    cplx.widely_linear(
      jnp.ones((2, 2)),
      jnp.ones((2, 2), jnp.complex64),
      jnp.ones((2, 2), jnp.complex64),
    )
