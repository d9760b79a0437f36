"""Oracle tests of `jaxnorm.cplx.cnet`: CNet's causal Fourier mixing.

Oracles: the direct DFT sum (tests/oracles/complex_numpy.py) and
``fft(norm="ortho")``; causality of both methods.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import cplx
from tests.cplx import _common as c
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
