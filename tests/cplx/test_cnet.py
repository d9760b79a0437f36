"""Oracle tests of `jaxnorm.cplx.cnet`: CNet's Fourier layers.

Oracles: the direct DFT sum (tests/oracles/complex_numpy.py) and
``fft(norm="ortho")``; causality of both mixing methods; a NumPy
transcription of CNet's ``FourierTrans``, ``InverseFourierTrans``,
``Hadamard``, ``Pad`` and ``MeanPool`` forward and backward passes
(tests/oracles/cnet_pct_numpy.py); the direct circular convolution.
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
# FFT-Hadamard convolution, Pad, MeanPool.


def test_transcribed_transforms_are_the_unitary_dfts():
  """The oracle's FourierTrans / InverseFourierTrans are fft / ifft ortho."""
  x = c.np_cnormal(RNG, (2, 7))
  np.testing.assert_allclose(
    official.fourier_trans(x), np.fft.fft(x, norm="ortho"), atol=1e-12
  )
  np.testing.assert_allclose(
    official.inverse_fourier_trans(x), np.fft.ifft(x, norm="ortho"), atol=1e-12
  )


def _official_conv(x, taps, index, inverse=True):
  """CNet's graph: IFT(Hadamard(FT(x), FT(Pad(taps))))."""
  n = x.shape[-1]
  prod = official.hadamard(
    official.fourier_trans(x),
    official.fourier_trans(official.pad_forward(taps, index, n)),
  )
  return official.inverse_fourier_trans(prod) if inverse else prod


@pytest.mark.parametrize("inverse", [True, False])
def test_fourier_hadamard_conv_matches_cnet(inverse):
  n, index = 12, (0, 1, 5, 11)
  x = c.np_cnormal(RNG, (3, n))
  taps = c.np_cnormal(RNG, (len(index),))
  want = _official_conv(x, taps, index, inverse)
  k = cplx.pad_kernel(jnp.asarray(taps, jnp.complex64), index, n)
  got = cplx.fourier_hadamard_conv(
    jnp.asarray(x, jnp.complex64), k, inverse=inverse
  )
  c.close(got, want, atol=2e-5)
  with jax.enable_x64(True):
    k64 = cplx.pad_kernel(jnp.asarray(taps), index, n)
    got64 = cplx.fourier_hadamard_conv(jnp.asarray(x), k64, inverse=inverse)
    assert got64.dtype == jnp.complex128
    np.testing.assert_allclose(got64, want, atol=1e-12)


def test_fourier_hadamard_conv_is_scaled_circular_convolution():
  """Unitary transforms: the product is the circular convolution / sqrt N."""
  n = 9
  x, k = c.np_cnormal(RNG, (2, n)), c.np_cnormal(RNG, (n,))
  want = official.circular_conv(x, k) / np.sqrt(n)
  got = cplx.fourier_hadamard_conv(
    jnp.asarray(x, jnp.complex64), jnp.asarray(k, jnp.complex64)
  )
  c.close(got, want, atol=2e-5)
  # Along axis 0, a kernel of the input's rank broadcast over the rest.
  got0 = cplx.fourier_hadamard_conv(
    jnp.asarray(x.T, jnp.complex64),
    jnp.asarray(k[:, None], jnp.complex64),
    axis=0,
  )
  c.close(got0, want.T, atol=2e-5)
  # Commutes with shifts of x (a convolution), jit and no-jit agree.
  xj, kj = jnp.asarray(x, jnp.complex64), jnp.asarray(k, jnp.complex64)
  shifted = cplx.fourier_hadamard_conv(jnp.roll(xj, 2, axis=-1), kj)
  c.close(shifted, jnp.roll(got, 2, axis=-1), atol=2e-5)
  c.close(jax.jit(cplx.fourier_hadamard_conv)(xj, kj), got, atol=1e-6)


def test_local_kernel_conv_is_masked_circular_convolution():
  """A 3x3 local kernel in a 6x6 flattened image (CNet's 7x7 in 28x28)."""
  index = cplx.local_kernel_index((3, 3), (6, 6))
  assert index == (0, 1, 2, 6, 7, 8, 12, 13, 14)
  assert len(cplx.local_kernel_index((7, 7), (28, 28))) == 49
  x = c.np_cnormal(RNG, (36,))
  taps = c.np_cnormal(RNG, (9,))
  dense = official.pad_forward(taps, index, 36)
  want = official.circular_conv(x, dense) / 6.0
  k = cplx.pad_kernel(jnp.asarray(taps, jnp.complex64), index, 36)
  got = cplx.fourier_hadamard_conv(jnp.asarray(x, jnp.complex64), k)
  c.close(got, want, atol=2e-5)


def test_pad_kernel_forward_and_backward_match_cnet():
  index, size = (4, 0, 2), 6
  taps = c.np_cnormal(RNG, (2, 3))
  got = cplx.pad_kernel(jnp.asarray(taps, jnp.complex64), index, size)
  c.close(got, official.pad_forward(taps, index, size), atol=1e-6)
  assert got.shape == (2, 6) and got.dtype == jnp.complex64
  # Taps on axis 0.
  got0 = cplx.pad_kernel(
    jnp.asarray(taps.T, jnp.complex64), index, size, axis=0
  )
  c.close(got0, official.pad_forward(taps, index, size).T, atol=1e-6)
  # Backward: JAX's gradient of L = Re sum conj(cot) y is 2 dL/dx.
  cot = c.np_cnormal(RNG, (2, size))
  with jax.enable_x64(True):
    loss = c.real_loss(lambda t: cplx.pad_kernel(t, index, size), cot)
    g = np.asarray(jax.grad(loss)(jnp.asarray(taps)))
  dz, dzs = official.pad_backward(np.conj(cot) / 2, cot / 2, index)
  np.testing.assert_allclose(g, 2 * dz, atol=1e-12)
  np.testing.assert_allclose(dzs, np.conj(dz), atol=1e-12)


def test_mean_pool_forward_and_backward_match_cnet():
  x = c.np_cnormal(RNG, (2, 12))
  for bins in (1, 3, 12):
    got = cplx.mean_pool(jnp.asarray(x, jnp.complex64), bins)
    c.close(got, official.mean_pool_forward(x, bins), atol=1e-6)
    assert got.shape == (2, bins)
  got0 = cplx.mean_pool(jnp.asarray(x.T, jnp.complex64), 4, axis=0)
  c.close(got0, official.mean_pool_forward(x, 4).T, atol=1e-6)
  # Real input (CNet pools |z|^2, a complex array with zero imaginary part).
  power = np.abs(x) ** 2
  got_real = cplx.mean_pool(jnp.asarray(power, jnp.float32), 3)
  assert got_real.dtype == jnp.float32
  c.close(got_real, official.mean_pool_forward(power, 3).real, atol=1e-5)
  cot = c.np_cnormal(RNG, (2, 3))
  with jax.enable_x64(True):
    loss = c.real_loss(lambda t: cplx.mean_pool(t, 3), cot)
    g = np.asarray(jax.grad(loss)(jnp.asarray(x)))
  dz, _ = official.mean_pool_backward(np.conj(cot) / 2, cot / 2, 12)
  np.testing.assert_allclose(g, 2 * dz, atol=1e-12)


def test_fourier_layers_errors():
  z = jnp.ones(6, jnp.complex64)
  with pytest.raises(TypeError, match=r"fourier_hadamard_conv: x must have"):
    cplx.fourier_hadamard_conv(jnp.ones(6), z)
  with pytest.raises(TypeError, match=r"fourier_hadamard_conv: kernel must"):
    cplx.fourier_hadamard_conv(z, jnp.ones(6))
  with pytest.raises(ValueError, match=r"kernel must have length x.shape"):
    cplx.fourier_hadamard_conv(z, jnp.ones(4, jnp.complex64))
  with pytest.raises(ValueError, match=r"kernel must have length x.shape"):
    cplx.fourier_hadamard_conv(
      jnp.ones((2, 6), jnp.complex64), jnp.ones((1, 1, 6), jnp.complex64)
    )
  with pytest.raises(
    ValueError, match=r"broadcastable with x.shape=\(2, 3, 6\)"
  ):
    cplx.fourier_hadamard_conv(
      jnp.ones((2, 3, 6), jnp.complex64), jnp.ones((3, 1, 6), jnp.complex64)
    )
  with pytest.raises(TypeError, match=r"pad_kernel: taps must have"):
    cplx.pad_kernel(jnp.ones(2), (0, 1), 4)
  with pytest.raises(ValueError, match=r"one entry per tap"):
    cplx.pad_kernel(z[:2], (0,), 4)
  with pytest.raises(ValueError, match=r"must lie in \[0, size=4\)"):
    cplx.pad_kernel(z[:2], (0, 4), 4)
  with pytest.raises(ValueError, match=r"must not repeat a position"):
    cplx.pad_kernel(z[:2], (1, 1), 4)
  with pytest.raises(ValueError, match=r"sequence of Python ints"):
    cplx.pad_kernel(z[:2], (0, 1.0), 4)
  with pytest.raises(ValueError, match=r"size must be a positive integer"):
    cplx.pad_kernel(z[:2], (0, 1), 0)
  with pytest.raises(ValueError, match=r"kernel_shape must fit"):
    cplx.local_kernel_index((3, 3), (2, 8))
  with pytest.raises(ValueError, match=r"two positive ints"):
    cplx.local_kernel_index((3,), (8, 8))
  with pytest.raises(ValueError, match=r"kernel_shape must be a positive"):
    cplx.local_kernel_index((0, 3), (8, 8))
  with pytest.raises(TypeError, match=r"mean_pool: x must have a complex or"):
    cplx.mean_pool(jnp.ones(6, jnp.int32), 2)
  with pytest.raises(ValueError, match=r"must be divisible by num_bins=4"):
    cplx.mean_pool(z, 4)
  with pytest.raises(ValueError, match=r"num_bins must be a positive"):
    cplx.mean_pool(z, 0)
  with pytest.raises(ValueError, match=r"x.shape\[axis\]=0"):
    cplx.mean_pool(jnp.ones((2, 0), jnp.complex64), 1)
