"""CNet's Fourier layers: causal Fourier mixing, FFT-Hadamard convolution.

CNet's causal Fourier mixing (the token mixer of CNet §6), its
convolution as a Hadamard product of unitary DFTs (``FourierTrans``,
``Hadamard``, ``InverseFourierTrans``), the ``Pad`` that scatters a small
kernel into the DFT length, and its ``MeanPool``. Complex in, complex out,
along any axis. Pallas has no complex support: there is no kernel. CNet's
Born rule (attention and cross-entropy) is `jaxnorm.cplx.born`; its
TokenNorm is `jaxnorm.cplx.complex_rms_norm`. `jaxnorm.nn.cplx.ComplexLM`
mixes with `causal_fourier_mix` in place of attention under
``attention="fourier"`` (no projections, not an attention core);
`jaxnorm.nn.cplx.FourierHadamardConv` holds the taps of a padded
FFT-Hadamard convolution.

Source: ``crasmarum/CNet`` at commit
``866b8d1a2ad0f793f76ba96795e24b2f9a18acea`` (``impl/pad.h``,
``impl/pool.h``); ``impl/ft.h`` and ``impl/hadamard.h`` at
``6e292693bb8cce4d5c96cd618e98be006f7db18a``; ``InverseFourierTrans`` as
``tests/gputests.h`` (``testIFfft``, ``testIFFTInverse``) describes it
(``FastFourierTransform::inverseTransform`` then ``1/sqrt(N)``; its class
body was not in the stored snapshots).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Complex

from jaxnorm import _checks, _numerics, _scope
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


def _fft_axis_len(who: str, x: jax.Array, axis: int) -> tuple[int, int]:
  """The normalized ``axis`` of ``x`` and its length."""
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  return ax, x.shape[ax]


@_scope.scoped
def fourier_hadamard_conv(
  x: Complex[ArrayLike, "..."],
  kernel: Complex[ArrayLike, "..."],
  *,
  axis: int = -1,
  inverse: bool = True,
) -> Complex[Array, "..."]:
  r"""CNet's convolution: a Hadamard product of unitary DFTs along ``axis``.

  .. math:: y = F^{-1}\big(F x \odot F k\big)
     = \tfrac{1}{\sqrt N}\,(x \circledast k), \qquad
     (x \circledast k)_n = \textstyle\sum_m x_m k_{(n - m) \bmod N}

  with :math:`F` CNet's ``FourierTrans``, the unitary DFT
  :math:`(Fx)_p = N^{-1/2}\sum_q x_q e^{-2\pi i pq/N}` (``fft`` with
  ``norm="ortho"``), and :math:`F^{-1}` its ``InverseFourierTrans``
  (``ifft`` with ``norm="ortho"``). Because both transforms are unitary the
  product is the circular convolution divided by :math:`\sqrt N`, not the
  convolution itself (the ``impl/pad.h`` comment omits the factor).
  ``inverse=False`` returns the frequency-domain product :math:`Fx \odot
  Fk` (``Hadamard(FourierTrans(x), FourierTrans(k))``, the output of the
  README's MNIST net, which never inverts). Build ``kernel`` from a few
  taps with `pad_kernel` (CNet's ``Pad`` followed by ``FourierTrans``).

  Args:
    x: complex input; ``N = x.shape[axis]``.
    kernel: complex spatial-domain kernel of length ``N`` along ``axis``:
      shape ``(N,)``, or ``x``'s rank and broadcastable to ``x``.
    axis: the transformed axis.
    inverse: return to the spatial domain (``False``: frequency domain).

  Returns:
    The broadcast shape of ``x`` and ``kernel``, complex compute dtype.

  Raises:
    TypeError: for a non-complex ``x`` or ``kernel``.
    ValueError: for a bad ``axis`` or a ``kernel`` whose length along
      ``axis`` is not ``N``, of another rank than 1 or ``x.ndim``, or not
      broadcastable with ``x``.

  Examples:
    >>> x = jnp.array([1 + 0j, 2, 3, 4])
    >>> k = jnp.array([0j, 1, 0, 0])  # a delay by one: rolls x
    >>> y = cplx.fourier_hadamard_conv(x, k)
    >>> print((np.asarray(y) * 2).real.round(4))  # times sqrt(N) = 2
    [4. 1. 2. 3.]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``: ``FourierTrans``,
    ``Hadamard``, ``InverseFourierTrans``, ``Pad``); Crasmaru, *On the
    Equivalence of Convolutional and Hadamard Networks using DFT*,
    arXiv:1810.11650 (2018).
  """
  who = "fourier_hadamard_conv"
  _common.check_complex(who, "x", x)
  _common.check_complex(who, "kernel", kernel)
  x, kernel = jnp.asarray(x), jnp.asarray(kernel)
  ax, n = _fft_axis_len(who, x, axis)
  if kernel.ndim == 1 and x.ndim != 1:
    kshape = [1] * x.ndim
    kshape[ax] = kernel.shape[0]
    kernel = kernel.reshape(kshape)
  if (
    kernel.ndim != x.ndim
    or kernel.shape[ax] != n
    or any(k != s and 1 not in (k, s) for k, s in zip(kernel.shape, x.shape))
  ):
    raise ValueError(
      f"{who}: kernel must have length x.shape[axis]={n} along axis={axis} "
      f"and shape (N,) or rank x.ndim={x.ndim} broadcastable with "
      f"{x.shape=}, got kernel.shape={kernel.shape}; scatter a short kernel "
      f"with pad_kernel"
    )
  dtype = _common.complex_dtype(x, kernel)
  fx = jnp.fft.fft(x.astype(dtype), axis=ax, norm="ortho")
  fk = jnp.fft.fft(kernel.astype(dtype), axis=ax, norm="ortho")
  prod = fx * fk
  if not inverse:
    return prod
  return jnp.fft.ifft(prod, axis=ax, norm="ortho")


def _check_kernel_index(
  who: str, kernel_index: Sequence[int], size: int, taps: int
) -> tuple[int, ...]:
  """``kernel_index`` as a tuple of distinct ints in ``[0, size)``."""
  _checks.check_positive_int(who, "size", size)
  index = tuple(kernel_index)
  if not all(
    isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in index
  ):
    raise ValueError(
      f"{who}: kernel_index must be a sequence of Python ints, got "
      f"kernel_index={kernel_index!r}"
    )
  if len(index) != taps:
    raise ValueError(
      f"{who}: kernel_index must have one entry per tap, "
      f"taps.shape[axis]={taps}, got len(kernel_index)={len(index)}"
    )
  bad = [i for i in index if not 0 <= i < size]
  if bad:
    raise ValueError(
      f"{who}: kernel_index entries must lie in [0, size={size}), got {bad[:4]}"
    )
  if len(set(index)) != len(index):
    raise ValueError(
      f"{who}: kernel_index must not repeat a position (CNet's Pad would "
      f"keep the last tap written there), got kernel_index={index!r}"
    )
  return tuple(int(i) for i in index)


@_scope.scoped
def pad_kernel(
  taps: Complex[ArrayLike, "... k"],
  kernel_index: Sequence[int],
  size: int,
  *,
  axis: int = -1,
) -> Complex[Array, "... n"]:
  r"""CNet's ``Pad``: scatter ``K`` kernel taps into ``size`` zeros.

  .. math:: y_{\mathrm{index}_k} = t_k, \qquad y_n = 0 \text{ elsewhere}

  Followed by ``FourierTrans`` and a Hadamard product this is a circular
  convolution with a kernel of only ``K`` free taps (`fourier_hadamard_conv`);
  CNet's comment names the 7x7 local kernel in a 28x28 image (49 taps, 784
  positions, arXiv:1810.11650), whose index set `local_kernel_index`
  builds. The backward gathers the output gradient at ``kernel_index``
  (JAX's VJP of the scatter; tested against CNet's hand-written one).

  Args:
    taps: complex ``(..., K)`` (``K`` along ``axis``).
    kernel_index: ``K`` distinct static positions in ``[0, size)``.
    size: the padded length ``N >= K``.
    axis: the taps' axis.

  Returns:
    Complex ``taps``' shape with ``axis`` of length ``size``, ``taps``'
    dtype.

  Raises:
    TypeError: for non-complex ``taps``.
    ValueError: for a bad ``axis`` or ``size``, a ``kernel_index`` of the
      wrong length, out of range, repeated or not made of ints.

  Examples:
    >>> y = cplx.pad_kernel(jnp.array([1 + 1j, 2j]), (0, 3), 5)
    >>> print(np.asarray(y))
    [1.+1.j 0.+0.j 0.+0.j 0.+2.j 0.+0.j]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``, ``impl/pad.h``).
  """
  who = "pad_kernel"
  _common.check_complex(who, "taps", taps)
  taps = jnp.asarray(taps)
  (ax,) = _checks.normalize_axes(who, axis, taps.ndim)
  index = _check_kernel_index(who, kernel_index, size, taps.shape[ax])
  t = jnp.moveaxis(taps, ax, -1)
  out = jnp.zeros((*t.shape[:-1], size), t.dtype)
  out = out.at[..., jnp.asarray(index, jnp.int32)].set(t)
  return jnp.moveaxis(out, -1, ax)


@_scope.scoped
def local_kernel_index(
  kernel_shape: Sequence[int], image_shape: Sequence[int]
) -> tuple[int, ...]:
  r"""Row-major flat positions of a ``kh x kw`` block in an ``H x W`` image.

  .. math:: \{\, r W + c : 0 \le r < k_h,\ 0 \le c < k_w \,\}

  The ``kernel_index`` of `pad_kernel` for a local kernel at the image's
  top-left corner (CNet's ``Pad`` comment: 49 taps of a 7x7 kernel in the
  784 positions of a flattened 28x28 image). Our construction: CNet's code
  takes any index set and builds none. With CNet's 1-D DFT over the
  flattened image, the convolution wraps row ends into the next row (it is
  not a 2-D circular convolution).

  Args:
    kernel_shape: ``(kh, kw)``.
    image_shape: ``(H, W)`` with ``kh <= H`` and ``kw <= W``.

  Returns:
    ``kh * kw`` ints, row-major.

  Raises:
    ValueError: for shapes that are not two positive ints or a kernel
      larger than the image.

  Examples:
    >>> cplx.local_kernel_index((2, 2), (3, 4))
    (0, 1, 4, 5)
    >>> len(cplx.local_kernel_index((7, 7), (28, 28)))  # CNet's 7x7 in 28x28
    49
  """
  who = "local_kernel_index"
  for name, shape in (
    ("kernel_shape", kernel_shape),
    ("image_shape", image_shape),
  ):
    if len(tuple(shape)) != 2:
      raise ValueError(
        f"{who}: {name} must be two positive ints (rows, cols), got "
        f"{name}={shape!r}"
      )
    for v in shape:
      _checks.check_positive_int(who, name, v)
  (kh, kw), (h, w) = tuple(kernel_shape), tuple(image_shape)
  if kh > h or kw > w:
    raise ValueError(
      f"{who}: kernel_shape must fit in image_shape, got "
      f"kernel_shape={tuple(kernel_shape)}, image_shape={tuple(image_shape)}"
    )
  return tuple(int(r * w + c) for r in range(kh) for c in range(kw))


@_scope.scoped
def mean_pool(
  x: Complex[ArrayLike, "... n"],
  num_bins: int,
  *,
  axis: int = -1,
) -> Complex[Array, "... p"]:
  r"""CNet's ``MeanPool``: means over ``num_bins`` contiguous bins.

  .. math:: y_p = \tfrac{1}{w}\textstyle\sum_{j < w} x_{p w + j},
     \qquad w = N / P

  ``num_bins=1`` is global average pooling. CNet pools complex values (e.g.
  the mean power after ``CModulus2``, a complex array with zero imaginary
  part); real floating input is accepted too. A real-linear map, so the
  Wirtinger gradients are the output's divided by ``w`` (CNet's backward).

  Args:
    x: complex or real floating; ``N = x.shape[axis]``.
    num_bins: ``P``, a positive divisor of ``N``.
    axis: the pooled axis.

  Returns:
    ``x``'s shape with ``axis`` of length ``P``, ``x``'s dtype.

  Raises:
    TypeError: for an integer or boolean ``x``.
    ValueError: for a bad ``axis``, an empty ``axis`` (``N = 0``), or a
      ``num_bins`` that is not a positive divisor of ``N``.

  Examples:
    >>> y = cplx.mean_pool(jnp.array([1 + 1j, 3 + 1j, 2j, 4j]), 2)
    >>> print(np.asarray(y))
    [2.+1.j 0.+3.j]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``, ``impl/pool.h``).
  """
  who = "mean_pool"
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.inexact):
    raise TypeError(
      f"{who}: x must have a complex or real floating dtype, got "
      f"x.dtype={dtype}; cast it with x.astype(jnp.complex64)"
    )
  x = jnp.asarray(x)
  _checks.check_positive_int(who, "num_bins", num_bins)
  ax, n = _fft_axis_len(who, x, axis)
  _checks.check_positive_int(who, "x.shape[axis]", n)
  _checks.check_divisible(who, "x.shape[axis]", n, "num_bins", num_bins)
  cdt = (
    _common.complex_dtype(x)
    if jnp.issubdtype(dtype, jnp.complexfloating)
    else _numerics.compute_dtype(x)
  )
  t = jnp.moveaxis(x.astype(cdt), ax, -1)
  t = t.reshape(*t.shape[:-1], num_bins, n // num_bins)
  return jnp.moveaxis(jnp.mean(t, axis=-1), -1, ax).astype(x.dtype)
