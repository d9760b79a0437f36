"""CNet's causal Fourier mixing (the token mixer of CNet §6).

Complex in, complex out, along any axis. Pallas has no complex
support: there is no kernel. CNet's Born rule (attention and
cross-entropy) is `jaxnorm.cplx.born`; its TokenNorm is
`jaxnorm.cplx.complex_rms_norm`. `jaxnorm.nn.cplx.ComplexLM` mixes with it
in place of attention under ``attention="fourier"`` (no projections, not
an attention core).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex

from jaxnorm import _checks, _scope
from jaxnorm.cplx import _common


def _phasor(phase: jax.Array, dtype) -> jax.Array:
  """``exp(i phase)`` in the complex ``dtype``."""
  phase = phase.astype(_common.real_dtype(dtype))
  return jax.lax.complex(jnp.cos(phase), jnp.sin(phase))


def _unity_root_table(n: int, dtype) -> jax.Array:
  """``ω^{jk}``, ``ω = e^{-2πi/N}``, with ``jk mod N`` for accuracy."""
  j = jnp.arange(n)
  jk = ((j[:, None] * j[None, :]) % n).astype(_common.real_dtype(dtype))
  return _phasor((-2.0 * math.pi / n) * jk, dtype)


def _chirp(n: int, dtype) -> jax.Array:
  """``c_k = ω^{k²/2} = exp(-iπ k²/N)``, with ``k² mod 2N``."""
  k = jnp.arange(n)
  kk = ((k * k) % (2 * n)).astype(_common.real_dtype(dtype))
  return _phasor((-math.pi / n) * kk, dtype)


@_scope.scoped
def causal_fourier_mix(
  h: Complex[ArrayLike, "..."],
  *,
  axis: int = -1,
  method: str = "bluestein",
) -> Complex[Array, "..."]:
  r"""CNet's causal (lower-triangular) unitary-DFT mixing along ``axis``.

  .. math:: \mathrm{Mix}(h)_k = N^{-1/2} \textstyle\sum_{j \le k}
     h_j\, \omega^{jk}, \qquad \omega = e^{-2\pi i/N}

  ``method="bluestein"`` (CNet paper §6) uses
  :math:`\omega^{jk} = c_k c_j \bar c_{k-j}`, :math:`c_k = e^{-i\pi
  k^2/N}`: :math:`\mathrm{Mix}_k = N^{-1/2} c_k \sum_{j\le k} (h_j c_j)\,
  \bar c_{k-j}`, a causal linear convolution computed with zero-padded FFTs
  in :math:`O(N \log N)`; output ``k`` depends on inputs ``j > k`` only
  through FFT rounding (~1e-7 relative in complex64). ``method="direct"``
  is the :math:`O(N^2)` masked matrix (CNet's ``TriangFourier``, the only
  form in the official code read), exactly causal. Without the mask the
  matrix is ``fft(norm="ortho")`` (CNet's ``FourierTrans``: the code's
  :math:`\omega = e^{-2\pi i/N}` is used, not the :math:`e^{+i\cdot}` that
  the paper's §5 prints).

  CNet applies it to the flattened token-major stream (length ``T E``), not
  along the token axis: reshape before calling to reproduce that.

  Args:
    h: complex input.
    axis: the mixed axis (length ``N``).
    method: ``"bluestein"`` or ``"direct"``.

  Returns:
    ``h``'s shape, complex compute dtype.

  Raises:
    TypeError: for a non-complex ``h``.
    ValueError: for a bad ``axis`` or ``method``.

  Examples:
    >>> y = cplx.causal_fourier_mix(jnp.array([2 + 0j, 0j]))
    >>> print(np.abs(np.asarray(y)).round(4))  # a delta at 0: 2 / sqrt(2)
    [1.4142 1.4142]
    >>> y = cplx.causal_fourier_mix(jnp.array([0j, 2 + 0j]))
    >>> print(np.abs(np.asarray(y)).round(4))  # output 0 sees only h_0
    [0.     1.4142]

  References:
    Crasmaru, *CNet* (paper §6; code ``TriangFourier``); Bluestein, *A linear
    filtering approach to the computation of the discrete Fourier transform*
    (1970).
  """
  who = "causal_fourier_mix"
  _common.check_complex(who, "h", h)
  _checks.check_choice(who, "method", method, ("bluestein", "direct"))
  h = jnp.asarray(h)
  (ax,) = _checks.normalize_axes(who, axis, h.ndim)
  dtype = _common.complex_dtype(h)
  x = jnp.moveaxis(h.astype(dtype), ax, -1)
  n = x.shape[-1]
  if n == 0:
    return jnp.moveaxis(x, -1, ax)
  norm = jnp.asarray(1.0 / math.sqrt(n), _common.real_dtype(dtype))
  if method == "direct":
    table = _unity_root_table(n, dtype)
    tri = jnp.tril(jnp.ones((n, n), bool))
    y = x @ jnp.where(tri, table, 0).T
  else:
    c = _chirp(n, dtype).reshape((1,) * (x.ndim - 1) + (n,))
    size = 1 << (2 * n - 1).bit_length()
    a = jnp.fft.fft(x * c, size)
    b = jnp.fft.fft(jnp.conj(c), size)
    y = jnp.fft.ifft(a * b)[..., :n] * c
  return jnp.moveaxis(y * norm.astype(dtype), -1, ax)
