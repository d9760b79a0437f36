r"""LLM.int8(): absmax int8 quantization and the mixed-precision matmul.

Dettmers et al. quantize a matmul :math:`C = XW` per row of :math:`X` (one
scale per token) and per output column of :math:`W` (vector-wise absmax),
and route the few feature dimensions that carry emergent outliers
(:math:`|x| \ge` ``threshold``, 6 in the paper) through a high-precision
matmul. Weights use the Flax kernel layout ``w (h, o)``: "per output" means
per column of ``w`` (per row of bitsandbytes' ``W^T``).

Scales are float32, products are int8 x int8 -> int32, and a row or column
whose absmax is 0 quantizes to 0 (bitsandbytes divides by zero there).
Everything is mask-based (no gathers), so shapes are static under ``jit``.
``__all__`` holds the functions, `BNB_DEQUANT_SCALE` (an argument value)
and the ``Literal`` types of the options.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import quant
  >>> q, absmax = quant.absmax_quantize(jnp.array([[0.5, -1.0, 2.0]]))
  >>> print(np.asarray(q), np.asarray(absmax))  # round(127 x / 2)
  [[ 32 -64 127]] [[2.]]

References:
  Dettmers, Lewis, Belkada and Zettlemoyer, *LLM.int8(): 8-bit Matrix
  Multiplication for Transformers at Scale*, arXiv:2208.07339 (2022).
  bitsandbytes, ``backends/default/ops.py`` (``int8_vectorwise_quant``,
  ``int8_mm_dequant``, ``int8_mixed_scaled_mm``), official code, read.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int8

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "BNB_DEQUANT_SCALE",
  "AbsmaxMode",
  "Granularity",
  "OutlierWeight",
  "absmax_dequantize",
  "absmax_quantize",
  "int8_mixed_matmul",
  "int8_vectorwise_matmul",
  "outlier_columns",
]

AbsmaxMode = Literal["paper", "bnb"]
OutlierWeight = Literal["fp", "dequant"]
Granularity = Literal["vector", "tensor"]
ABSMAX_MODES = ("paper", "bnb")
OUTLIER_WEIGHTS = ("fp", "dequant")
GRANULARITIES = ("vector", "tensor")
_Q = 127.0
# bitsandbytes' ``int8_mm_dequant`` constant, written as 1/127**2 but about
# 1.8e-5 relative above it (1/127**2 = 6.2000124e-05).
BNB_DEQUANT_SCALE = 6.200124e-05


def _f32(who: str, name: str, x: ArrayLike) -> jax.Array:
  x = jnp.asarray(x)
  _checks.check_floating(who, name, x)
  return x.astype(_numerics.compute_dtype(x))


def _quantize(x: jax.Array, absmax: jax.Array) -> jax.Array:
  """``round(127 x / absmax)`` as int8, 0 where ``absmax == 0``."""
  safe = jnp.where(absmax > 0, absmax, 1.0)
  q = jnp.round(x * (_Q / safe))  # round half to even, as torch.round
  return jnp.clip(q, -_Q, _Q).astype(jnp.int8)


@_scope.scoped
def absmax_quantize(
  x: Float[ArrayLike, "..."], *, axis: int | None = -1
) -> tuple[Int8[Array, "..."], Float[Array, "..."]]:
  r"""Symmetric absmax int8 quantization along ``axis`` (or the tensor).

  .. math:: a = \max_{axis}|x|,\qquad q = \mathrm{round}(127\,x/a)

  dequantized as :math:`q\,a/127` (`absmax_dequantize`). ``axis=None``
  takes one scale for the whole tensor (tensor-wise). An all-zero slice
  has :math:`a = 0` and :math:`q = 0`.

  Args:
    x: floating input.
    axis: the reduced axis (``-1``: one scale per row) or ``None``.

  Returns:
    ``(q, absmax)``: ``q`` int8 of the shape of ``x``; ``absmax`` float32
    (the compute dtype) with ``axis`` kept as size 1 (all axes for None).

  Raises:
    TypeError: for non-floating input.
    ValueError: for an axis out of range.

  Examples:
    >>> q, a = quant.absmax_quantize(jnp.array([[0.5, -1.0, 2.0]]))
    >>> print(np.asarray(q), np.asarray(a))  # round(127 x / 2)
    [[ 32 -64 127]] [[2.]]

  References:
    Dettmers et al., arXiv:2208.07339 (2022), section 3.1.
  """
  who = "absmax_quantize"
  xf = _f32(who, "x", x)
  if axis is None:
    axes = tuple(range(xf.ndim))
  else:
    axes = _checks.normalize_axes(who, axis, xf.ndim)
  a = jnp.max(jnp.abs(xf), axis=axes, keepdims=True)
  return _quantize(xf, a), a


@_scope.scoped
def absmax_dequantize(
  q: Int8[ArrayLike, "..."], absmax: Float[ArrayLike, "..."]
) -> Float[Array, "..."]:
  """``q * absmax / 127`` in the dtype of ``absmax`` (`absmax_quantize`).

  Examples:
    >>> q, a = quant.absmax_quantize(jnp.array([[0.5, -1.0, 2.0]]))
    >>> y = quant.absmax_dequantize(q, a)
    >>> print(np.asarray(y).round(4))  # 32 * 2 / 127, -64 * 2 / 127, 2
    [[ 0.5039 -1.0079  2.    ]]
  """
  _checks.check_floating("absmax_dequantize", "absmax", absmax)
  a = jnp.asarray(absmax)
  return jnp.asarray(q).astype(a.dtype) * (a / _Q)


def _check_matmul(who: str, x: ArrayLike, w: ArrayLike) -> None:
  _checks.check_ndim(who, "x", x, minimum=1)
  _checks.check_ndim(who, "w", w, expected=2)
  if jnp.shape(x)[-1] != jnp.shape(w)[0]:
    raise ValueError(
      f"{who}: w must have shape (x.shape[-1], out) = ({jnp.shape(x)[-1]}, "
      f"out) in the Flax (in, out) layout, got w.shape={jnp.shape(w)}"
    )


def _int_matmul(qx: jax.Array, qw: jax.Array) -> jax.Array:
  return jax.lax.dot_general(
    qx,
    qw,
    (((qx.ndim - 1,), (0,)), ((), ())),
    preferred_element_type=jnp.int32,
  )


def _scaled(
  acc: jax.Array, ax: jax.Array, aw: jax.Array, dequant_scale: float | None
) -> jax.Array:
  """``acc * ax * aw * c`` with ``ax (..., 1)``, ``aw (o,)``, c = 1/127^2."""
  lead = (1,) * (acc.ndim - 1)
  c = 1.0 / (_Q * _Q) if dequant_scale is None else dequant_scale
  return acc.astype(ax.dtype) * ax * aw.reshape(lead + aw.shape) * c


@_scope.scoped
def int8_vectorwise_matmul(
  x: Float[ArrayLike, "... h"],
  w: Float[ArrayLike, "h o"],
  *,
  granularity: Granularity = "vector",
  dequant_scale: float | None = None,
) -> Float[Array, "... o"]:
  r"""``x @ w`` through int8 with absmax scales (no outlier decomposition).

  .. math::
    C_{ik} = \frac{a^x_i\, a^w_k}{127^2}\sum_j q^x_{ij}\,q^w_{jk},\quad
    a^x_i = \max_j |x_{ij}|,\ a^w_k = \max_j |w_{jk}|

  with an int32 accumulator. ``granularity="tensor"`` uses one
  scale for all of ``x`` and one for all of ``w`` (the paper's
  tensor-wise baseline).

  Deviation: bitsandbytes casts activations to float16 first; this
  quantizes from the compute dtype (float32 for half inputs).

  Args:
    x: ``(..., h)`` activations.
    w: ``(h, o)`` kernel (Flax layout).
    granularity: ``"vector"`` (per token and per output) or ``"tensor"``.
    dequant_scale: the constant :math:`c` replacing :math:`1/127^2`; pass
      `BNB_DEQUANT_SCALE` (``6.200124e-05``, bitsandbytes'
      ``int8_mm_dequant``, 1.8e-5 relative above :math:`1/127^2`) to match
      bitsandbytes to float precision.

  Returns:
    ``(..., o)`` in the dtype of ``x``.

  Raises:
    TypeError: for non-floating input.
    ValueError: for mismatched shapes or a bad ``granularity``.

  Examples:
    >>> x = jnp.array([[1.0, 2.0]])
    >>> w = jnp.array([[1.0], [1.0]])
    >>> y = quant.int8_vectorwise_matmul(x, w)  # x -> [64, 127] * 2 / 127
    >>> print(np.asarray(y).round(4))
    [[3.0079]]

  References:
    Dettmers et al., arXiv:2208.07339 (2022), eq. 1-3.
  """
  who = "int8_vectorwise_matmul"
  _check_matmul(who, x, w)
  _checks.check_choice(who, "granularity", granularity, GRANULARITIES)
  xf, wf = _f32(who, "x", x), _f32(who, "w", w)
  vector = granularity == "vector"
  qx, ax = absmax_quantize(xf, axis=-1 if vector else None)
  qw, aw = absmax_quantize(wf.astype(xf.dtype), axis=0 if vector else None)
  out = _scaled(_int_matmul(qx, qw), ax, aw.reshape(-1), dequant_scale)
  return out.astype(jnp.result_type(x))


@_scope.scoped
def outlier_columns(
  x: Float[ArrayLike, "... h"], *, threshold: float = 6.0
) -> Bool[Array, " h"]:
  r"""The outlier feature dimensions of ``x``, over all of its rows.

  .. math:: O = \{j: \exists i,\ |x_{ij}| \ge \text{threshold}\}

  ``threshold = 0`` means no decomposition (bitsandbytes'
  ``Linear8bitLt`` default): the mask is all false.

  Args:
    x: ``(..., h)`` activations (all leading axes are rows).
    threshold: magnitude at which a feature counts as an outlier.

  Returns:
    ``(h,)`` boolean mask.

  Raises:
    TypeError: for non-floating input.
    ValueError: for a scalar input or a negative threshold.

  Examples:
    >>> x = jnp.array([[0.5, 8.0, 1.0], [-7.0, 0.1, 0.2]])
    >>> print(np.asarray(quant.outlier_columns(x)))  # |x| >= 6 in a column
    [ True  True False]

  References:
    Dettmers et al., arXiv:2208.07339 (2022), section 3.2.
  """
  who = "outlier_columns"
  _checks.check_ndim(who, "x", x, minimum=1)
  _checks.check_nonnegative(who, "threshold", threshold)
  xf = _f32(who, "x", x)
  if threshold == 0:
    return jnp.zeros(xf.shape[-1:], bool)
  rows = tuple(range(xf.ndim - 1))
  return jnp.any(jnp.abs(xf) >= threshold, axis=rows)


@_scope.scoped
def int8_mixed_matmul(
  x: Float[ArrayLike, "... h"],
  w: Float[ArrayLike, "h o"],
  *,
  threshold: float = 6.0,
  absmax_mode: AbsmaxMode = "paper",
  outlier_weight: OutlierWeight = "fp",
  dequant_scale: float | None = None,
) -> Float[Array, "... o"]:
  r"""LLM.int8(): outlier features in high precision, the rest in int8.

  .. math::
    C = X_{:,O}\,W_{O,:} + \mathrm{int8}(X_{:,\bar O})\,
        \mathrm{int8}(W_{\bar O,:})

  with :math:`O` from `outlier_columns` over every row of the flattened
  batch and the int8 part as in `int8_vectorwise_matmul` (outlier columns
  of :math:`q^x` set to 0). The row scale :math:`a^x_i` is taken

  * ``absmax_mode="paper"``: over the non-outlier columns only;
  * ``absmax_mode="bnb"``: after zeroing only the outlier **elements**
    (:math:`|x_{ij}| \ge` threshold), so a sub-threshold value inside an
    outlier column still sets the row scale (bitsandbytes'
    ``int8_vectorwise_quant``).

  Weights are quantized per output column over all ``h`` rows (once, with
  no threshold). The outlier part uses the original weights
  (``outlier_weight="fp"``, bitsandbytes with ``has_fp16_weights``) or the
  dequantized int8 weights (``"dequant"``, bitsandbytes' inference mode).
  A threshold above :math:`\max|x|` gives `int8_vectorwise_matmul`;
  ``threshold=0`` disables the decomposition (bitsandbytes' convention).

  Deviation: activations are quantized from float32, not float16.

  Args:
    x: ``(..., h)`` activations.
    w: ``(h, o)`` kernel (Flax layout).
    threshold: outlier magnitude (6.0 in the paper and Hugging Face's
      ``llm_int8_threshold``).
    absmax_mode: ``"paper"`` or ``"bnb"``.
    outlier_weight: ``"fp"`` or ``"dequant"``.
    dequant_scale: as in `int8_vectorwise_matmul`.

  Returns:
    ``(..., o)`` in the dtype of ``x``.

  Raises:
    TypeError: for non-floating input.
    ValueError: for mismatched shapes, a negative threshold or a bad mode.

  Examples:
    >>> x = jnp.array([[0.3, 100.0]])  # column 1 is an outlier: kept in float
    >>> w = jnp.array([[1.0], [0.01]])
    >>> print(np.asarray(quant.int8_mixed_matmul(x, w)).round(4))  # 0.3 + 1
    [[1.3]]

  References:
    Dettmers et al., arXiv:2208.07339 (2022), eq. 4 and section 3.2.
  """
  who = "int8_mixed_matmul"
  _check_matmul(who, x, w)
  _checks.check_choice(who, "absmax_mode", absmax_mode, ABSMAX_MODES)
  _checks.check_choice(who, "outlier_weight", outlier_weight, OUTLIER_WEIGHTS)
  cols = outlier_columns(x, threshold=threshold)
  xf = _f32(who, "x", x)
  wf = _f32(who, "w", w).astype(xf.dtype)
  lead = (1,) * (xf.ndim - 1)
  o = cols.reshape(lead + cols.shape)
  regular = jnp.where(o, 0.0, xf)
  if absmax_mode == "paper" or threshold == 0:
    scale_src = regular
  else:
    scale_src = jnp.where(jnp.abs(xf) >= threshold, 0.0, xf)
  ax = jnp.max(jnp.abs(scale_src), axis=-1, keepdims=True)
  qx = jnp.where(o, jnp.int8(0), _quantize(regular, ax))
  qw, aw = absmax_quantize(wf, axis=0)
  out = _scaled(_int_matmul(qx, qw), ax, aw.reshape(-1), dequant_scale)
  w_out = wf if outlier_weight == "fp" else absmax_dequantize(qw, aw)
  out = out + jnp.matmul(jnp.where(o, xf, 0.0), w_out)
  return out.astype(jnp.result_type(x))
