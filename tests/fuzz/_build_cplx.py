"""Fuzz builders of `jaxnorm.cplx` (table: tests/fuzz/_builders.py)."""

from __future__ import annotations

import numpy as np

from jaxnorm import cplx
from tests.fuzz import _cases
from tests.fuzz._cases import case, first

# ---------------------------------------------------------------------------
# jaxnorm.cplx (complex draws: complex64, complex128, and the real float32
# and int32 inputs every complex function refuses)


# The parts' dtype of a complex output: complex128 input arrives as complex64.
_PARTS = np.dtype("float32")


def _complex_elementwise(real_out=False, **kwargs):
  def build(d, f):
    z = f.data(d.shape())
    return case(z, **kwargs, expect=(z.shape, _PARTS if real_out else d.out))

  return build


def _complex_axis(**kwargs):
  def build(d, f):
    z, _ = _cases.x_axis(d, f)
    return case(z, axis=d.axis, **kwargs, expect=(z.shape, d.out))

  return build


def _born_probs(d, f):
  z, _ = _cases.x_axis(d, f)
  return case(z, axis=d.axis, expect=(z.shape, _PARTS))


def _born_cross_entropy(d, f):
  z = f.data(d.shape())
  return case(
    z, _cases.labels(f, z.shape[:-1], z.shape[-1]), expect=((), _PARTS)
  )


def _complex_attention(**kwargs):
  def build(d, f):
    q, k, v = _cases.qkv(d, f)
    return case(q, k, v, **kwargs, expect=_cases.attention_out(q, v, d))

  return build


def _born_attention_weights(d, f):
  q, k, _ = _cases.qkv(d, f)
  return case(
    q, k, is_causal=True, expect=(q.shape[:-3] + (2, 3, k.shape[-3]), _PARTS)
  )


def _complexformer(logits):
  def build(d, f):
    q, k, v = _cases.qkv(d, f)
    extra = (f.normal((2, 2)), 0.1 * f.normal((2, 2)))
    if logits:
      lead = q.shape[:-3]
      return case(q, k, *extra, expect=(lead + (2, 3, k.shape[-3]), d.compute))
    return case(
      q, k, v, *extra, is_causal=True, expect=_cases.attention_out(q, v, d)
    )

  return build


def _complex_batch_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x,
    cplx.init_whitening_scale(c),
    f.normal((c,), "complex64"),
    cplx.init_complex_batch_norm_state(c),
    training=d.axis % 2 == 0,
    axis=d.axis,
    expect=(x.shape, d.out),
    pick=first,
  )


def _complex_layer_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x,
    cplx.init_whitening_scale(c),
    f.normal((c,), "complex64"),
    axis=d.axis,
    expect=(x.shape, d.out),
  )


def _complex_rms_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x, f.normal((c,), "complex64"), axis=d.axis, expect=(x.shape, d.out)
  )


def _complex_conv(d, f):
  x = f.data(d.shape())
  window = (3,) * (x.ndim - 2)
  return case(
    x,
    0.3 * f.normal(window + (x.shape[-1], 3), "complex64"),
    f.normal((3,), "complex64"),
    expect=(x.shape[:-1] + (3,), d.out),
  )


def _complex_dense(d, f):
  x = f.data(d.shape())
  return case(
    x,
    0.3 * f.normal((x.shape[-1], 3), "complex64"),
    f.normal((3,), "complex64"),
    expect=(x.shape[:-1] + (3,), d.out),
  )


def _widely_linear(d, f):
  x = f.data(d.shape())
  m = x.shape[-1]
  return case(
    x,
    0.3 * f.normal((m, 3), "complex64"),
    0.3 * f.normal((m, 3), "complex64"),
    f.normal((3,), "complex64"),
    expect=(x.shape[:-1] + (3,), d.out),
  )


def _complex_rope(d, f):
  x = f.data((2, 1 if d.one else 3, 2, 4))
  return case(x, expect=(x.shape, d.out))


def _modrelu(d, f):
  z = f.data(d.shape())
  return case(z, f.normal(z.shape[-1:]), power=2, expect=(z.shape, d.out))


def _kernel_matrix(d, f):
  """A real ``(2m, 2n)`` kernel: ``(2, 4)``, ``(4, 2)`` or ``(4, 4)``."""
  shape = {2: (2, 4), 3: (4, 2), 4: (4, 4)}[d.rank]
  return f.data(shape)


def _fairy2i_quantize_kernel(d, f):
  k = _kernel_matrix(d, f)
  return case(k, num_stages=1 + d.one, expect=(k.shape, d.out))


def _widely_linear_from_real(d, f):
  k = _kernel_matrix(d, f)
  half = (k.shape[0] // 2, k.shape[1] // 2)
  return case(k, expect=(half, np.complex64), pick=first)


def _real_from_widely_linear(d, f):
  shape = d.shape()[-2:] if d.rank > 1 else (1,) + d.shape()
  u = f.data(shape)
  return case(
    u,
    f.normal(shape, d.dtype),
    expect=((2 * shape[0], 2 * shape[1]), _PARTS),
  )


def _to_complex(d, f):
  x = f.data(d.shape(last=4), axis=d.axis)
  shape = list(x.shape)
  shape[d.axis] //= 2
  return case(x, axis=d.axis, expect=(tuple(shape), np.complex64))


def _to_real(d, f):
  z, _ = _cases.x_axis(d, f)
  shape = list(z.shape)
  shape[d.axis] *= 2
  return case(z, axis=d.axis, expect=(tuple(shape), _PARTS))


def _phase_quantize(d, f):
  w = f.data(d.shape())
  return case(w, num_stages=1 + d.one, expect=(w.shape, d.out))


def _quantize_kernel(d, f):
  k = f.data(d.shape())
  return case(k, expect=(k.shape, d.out))


def _pct_attention(d, f):
  q, k, v = _cases.qkv(d, f)
  return case(
    q, k, v, f.normal(()), is_causal=True, expect=_cases.attention_out(q, v, d)
  )


def _pct_rms_norm(d, f):
  # scale=None on even axes: the documented "or None" of the gain.
  x, c = _cases.x_axis(d, f)
  scale = None if d.axis % 2 == 0 else f.normal((c,), "complex64")
  return case(x, scale, axis=d.axis, expect=(x.shape, d.out))


def _fourier_hadamard_conv(d, f):
  # The kernel is a weight (ordinary values): a fuzzed kernel times fuzzed
  # data overflows float32 at 1e30 by definition. It is ``(N,)`` on even
  # ranks and ``x``'s rank (ones off ``axis``) on odd ones; ``inverse``
  # alternates with the axis.
  x, n = _cases.x_axis(d, f)
  kshape = [1] * x.ndim
  kshape[d.axis] = n
  kshape = (n,) if d.rank % 2 == 0 else tuple(kshape)
  return case(
    x,
    0.3 * f.normal(kshape, "complex64"),
    axis=d.axis,
    inverse=d.axis % 2 != 0,
    expect=(x.shape, d.out),
  )


def _pad_kernel(d, f):
  # ``size = K + rank - 1``: rank 1 fills every position (no zeros); the
  # index is the last ``K`` positions in reverse, so the scatter permutes.
  taps, k = _cases.x_axis(d, f)
  size = k + d.rank - 1
  index = tuple(range(size - 1, size - 1 - k, -1))
  shape = list(taps.shape)
  shape[d.axis] = size
  return case(taps, index, size, axis=d.axis, expect=(tuple(shape), d.out))


def _local_kernel_index(d, f):
  # A 1 x r block (r = rank) in a 3 x 4 image, or 2 x r: rank 4 spans a
  # whole row (kw = W), the ``one`` draw a single row.
  del f
  kernel = (1 if d.one else 2, d.rank)
  return case(kernel, (3, 4), expect=((kernel[0] * kernel[1],), None))


def _mean_pool(d, f):
  # Two bins on an even axis, global pooling (one bin) on an odd one.
  x, n = _cases.x_axis(d, f)
  bins = 2 if n % 2 == 0 else 1
  shape = list(x.shape)
  shape[d.axis] = bins
  return case(x, bins, axis=d.axis, expect=(tuple(shape), d.out))


# `mean_pool` takes real floating input too (half precision included).
_COMPLEX_OR_REAL = ("complex64", *_cases.FLOATS, "complex128", "int32")


CPLX = {
  "cplx.cardioid": _cases.Spec(_complex_elementwise(), dtypes=_cases.COMPLEX),
  "cplx.crelu": _cases.Spec(_complex_elementwise(), dtypes=_cases.COMPLEX),
  "cplx.split_gelu": _cases.Spec(_complex_elementwise(), dtypes=_cases.COMPLEX),
  "cplx.zrelu": _cases.Spec(_complex_elementwise(), dtypes=_cases.COMPLEX),
  "cplx.unit_phasor": _cases.Spec(
    _complex_elementwise(), dtypes=_cases.COMPLEX
  ),
  "cplx.phase_codes": _cases.Spec(
    _complex_elementwise(), dtypes=_cases.COMPLEX
  ),
  "cplx.modulus": _cases.Spec(
    _complex_elementwise(real_out=True), dtypes=_cases.COMPLEX
  ),
  "cplx.modulus_squared": _cases.Spec(
    _complex_elementwise(real_out=True),
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.phase": _cases.Spec(
    _complex_elementwise(real_out=True), dtypes=_cases.COMPLEX
  ),
  "cplx.complex_power": _cases.Spec(
    _complex_elementwise(m=3), dtypes=_cases.COMPLEX, kinds=_cases.SQUARABLE
  ),
  "cplx.modrelu": _cases.Spec(
    _modrelu, dtypes=_cases.COMPLEX, kinds=_cases.SQUARABLE
  ),
  "cplx.phase_quantize": _cases.Spec(_phase_quantize, dtypes=_cases.COMPLEX),
  "cplx.causal_fourier_mix": _cases.Spec(
    _complex_axis(), axis=True, dtypes=_cases.COMPLEX
  ),
  "cplx.complex_l2_normalize": _cases.Spec(
    _complex_axis(eps=1e-12), axis=True, dtypes=_cases.COMPLEX
  ),
  "cplx.born_probs": _cases.Spec(
    _born_probs, axis=True, dtypes=_cases.COMPLEX, kinds=_cases.SQUARABLE
  ),
  "cplx.born_cross_entropy": _cases.Spec(
    _born_cross_entropy, dtypes=_cases.COMPLEX, kinds=_cases.SQUARABLE
  ),
  "cplx.complex_batch_norm": _cases.Spec(
    _complex_batch_norm,
    ranks=_cases.BATCHED,
    axis=True,
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.complex_layer_norm": _cases.Spec(
    _complex_layer_norm,
    axis=True,
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.complex_rms_norm": _cases.Spec(
    _complex_rms_norm, axis=True, dtypes=_cases.COMPLEX
  ),
  "cplx.pct_rms_norm": _cases.Spec(
    _pct_rms_norm, axis=True, dtypes=_cases.COMPLEX
  ),
  "cplx.fourier_hadamard_conv": _cases.Spec(
    _fourier_hadamard_conv, axis=True, dtypes=_cases.COMPLEX
  ),
  "cplx.pad_kernel": _cases.Spec(_pad_kernel, axis=True, dtypes=_cases.COMPLEX),
  "cplx.local_kernel_index": _cases.Spec(_local_kernel_index, **_cases.STATIC),
  "cplx.mean_pool": _cases.Spec(_mean_pool, axis=True, dtypes=_COMPLEX_OR_REAL),
  "cplx.complex_conv": _cases.Spec(
    _complex_conv, ranks=_cases.IMAGES, dtypes=_cases.COMPLEX
  ),
  "cplx.complex_dense": _cases.Spec(_complex_dense, dtypes=_cases.COMPLEX),
  "cplx.widely_linear": _cases.Spec(_widely_linear, dtypes=_cases.COMPLEX),
  "cplx.complex_rope": _cases.Spec(
    _complex_rope, ranks=(4,), dtypes=_cases.COMPLEX
  ),
  "cplx.born_attention": _cases.Spec(
    _complex_attention(is_causal=True),
    ranks=(4, 3),
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.born_attention_weights": _cases.Spec(
    _born_attention_weights,
    ranks=(4, 3),
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.complex_softmax_attention": _cases.Spec(
    _complex_attention(is_causal=True),
    ranks=(4, 3),
    dtypes=_cases.COMPLEX,
    kinds=_cases.SQUARABLE,
  ),
  "cplx.pct_attention": _cases.Spec(
    _pct_attention, ranks=(4, 3), dtypes=_cases.COMPLEX, kinds=_cases.SQUARABLE
  ),
  "cplx.complexformer_attention": _cases.Spec(
    _complexformer(False), ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "cplx.complexformer_logits": _cases.Spec(
    _complexformer(True), ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "cplx.real_from_widely_linear": _cases.Spec(
    _real_from_widely_linear, ranks=(2,), dtypes=_cases.COMPLEX
  ),
  "cplx.to_real": _cases.Spec(_to_real, axis=True, dtypes=_cases.COMPLEX),
  "cplx.to_complex": _cases.Spec(_to_complex, axis=True),
  "cplx.binary_quantize_kernel": _cases.Spec(_quantize_kernel),
  "cplx.ternary_quantize_kernel": _cases.Spec(_quantize_kernel),
  "cplx.fairy2i_quantize_kernel": _cases.Spec(
    _fairy2i_quantize_kernel, ranks=(2, 3, 4)
  ),
  "cplx.widely_linear_from_real": _cases.Spec(
    _widely_linear_from_real, ranks=(2, 3, 4)
  ),
  "cplx.init_complex_batch_norm_state": _cases.Spec(
    _cases.scalars(4, expect=((4,), np.complex64), pick=first), **_cases.STATIC
  ),
  "cplx.init_whitening_scale": _cases.Spec(
    _cases.scalars(4, expect=((3, 4), np.float32)), **_cases.STATIC
  ),
}
