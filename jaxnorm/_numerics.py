"""Numerical helpers shared by every family of pure functions.

One rule for the compute dtype: half precision computes in float32, float32
and float64 stay as they are (``promote_types(x.dtype, float32)``), valid
under strict dtype promotion. On top of it, the pieces every normalization
repeats: parameter checks against the normalized axes, broadcasting a
parameter to the input's rank, two-pass moments, the affine tail
``y * (scale + scale_offset) + bias``, the running-average (EMA) update, the
group count of grouped norms, and the collectives of cross-device statistics
(identities without an ``axis_name``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike

from jaxnorm import _checks

AxisName = str | tuple[str, ...] | None


def compute_dtype(*xs: jax.Array) -> jnp.dtype:
  """``promote_types(result_type(*xs), float32)`` under strict promotion.

  Args:
    *xs: floating (or complex) arrays.

  Returns:
    float32 for half-precision inputs, else their common dtype.
  """
  with jax.numpy_dtype_promotion("standard"):
    return jnp.dtype(jnp.promote_types(jnp.result_type(*xs), jnp.float32))


# ---------------------------------------------------------------------------
# Static checks of parameters and state.


def check_param(
  who: str,
  name: str,
  p: ArrayLike | None,
  x: jax.Array,
  axes: tuple[int, ...],
) -> None:
  """A parameter over the normalized ``axes``: float, shape ``x.shape[axes]``.

  ``None`` (no parameter) passes. ``axes`` are non-negative (from
  `_checks.normalize_axes`).

  Raises:
    TypeError: for a non-floating parameter.
    ValueError: for a shape other than ``x.shape[axes]``.
  """
  if p is None:
    return
  _checks.check_floating(who, name, p)
  where = f"x.shape[axis] for axis={axes if len(axes) > 1 else axes[0]}"
  _checks.check_shape(who, name, p, tuple(x.shape[a] for a in axes), where)


def check_channels(who: str, x: jax.Array, **params: ArrayLike | None) -> None:
  """Every given parameter is a float vector of length ``x.shape[-1]``.

  Raises:
    ValueError: for a rank-0 ``x`` or a parameter of another shape.
    TypeError: for a non-floating parameter.
  """
  _checks.check_ndim(who, "x", x, minimum=1)
  for name, p in params.items():
    check_param(who, name, p, x, (x.ndim - 1,))


def check_state(
  who: str, state: Any, cls: type, shapes: dict[str, tuple[int, ...]]
) -> None:
  """``state`` is a ``cls`` whose named fields have the given shapes.

  Raises:
    TypeError: if ``state`` is not a ``cls``.
    ValueError: for a field of another shape.
  """
  if not isinstance(state, cls):
    raise TypeError(
      f"{who}: state must be a {cls.__name__}, got {type(state).__name__}"
    )
  for name, shape in shapes.items():
    _checks.check_shape(who, f"state.{name}", getattr(state, name), shape)


def resolve_groups(
  who: str,
  name: str,
  channels: int,
  num_groups: int | None,
  group_size: int | None,
) -> int:
  """The group count from exactly one of ``num_groups`` and ``group_size``.

  Args:
    who: public function or module name for error messages.
    name: how the channel count is called there (``"x.shape[-1]"``,
      ``"num_features"``).
    channels: the channel count.
    num_groups: number of groups, or ``None``.
    group_size: channels per group, or ``None``.

  Returns:
    The number of groups, which divides ``channels``.

  Raises:
    ValueError: for both or neither given, a non-positive value, or a count
      that does not divide ``channels``.
  """
  if (num_groups is None) == (group_size is None):
    raise ValueError(
      f"{who}: give exactly one of num_groups and group_size, got "
      f"{num_groups=} and {group_size=}"
    )
  if num_groups is None:
    _checks.check_positive_int(who, "group_size", group_size)
    _checks.check_divisible(who, name, channels, "group_size", group_size)
    num_groups = channels // group_size
  _checks.check_positive_int(who, "num_groups", num_groups)
  _checks.check_divisible(who, name, channels, "num_groups", num_groups)
  return num_groups


def group_reduction_axes(
  who: str,
  reduction_axes: int | Sequence[int] | None,
  x: jax.Array,
  *,
  min_rank: int,
) -> tuple[int, ...]:
  """The statistics axes of a grouped norm of channels-last ``x``.

  ``None`` means every axis but the batch axis 0 (the image form; ``x``
  needs rank ``>= min_rank``); an explicit value must include the channel
  axis ``-1`` (Flax ``GroupNorm`` convention), e.g. ``-1`` alone for one
  statistic per token and group.

  Raises:
    ValueError: for a rank below ``min_rank`` (default) or 1, bad axes, or
      axes without the channel axis.
  """
  if reduction_axes is None:
    _checks.check_ndim(who, "x", x, minimum=min_rank)
    return tuple(range(1, x.ndim))
  axes = _checks.normalize_axes(
    who, reduction_axes, x.ndim, name="reduction_axes"
  )
  if x.ndim - 1 not in axes:
    raise ValueError(
      f"{who}: reduction_axes must include the channel axis -1 (the groups "
      f"split it), got {reduction_axes=}; pass e.g. reduction_axes=-1 for "
      "per-token statistics"
    )
  return axes


def check_pad_mask(
  who: str, pad_mask: ArrayLike | None, x: jax.Array
) -> jax.Array | None:
  """A boolean mask of shape ``x.shape[:-1]`` (True at pads), or ``None``.

  Raises:
    TypeError: for a non-boolean mask.
    ValueError: for a mask of another shape.
  """
  if pad_mask is None:
    return None
  if jnp.result_type(pad_mask) != jnp.bool_:
    raise TypeError(
      f"{who}: pad_mask must be boolean (True at pads), got "
      f"pad_mask.dtype={jnp.result_type(pad_mask)}"
    )
  _checks.check_shape(who, "pad_mask", pad_mask, x.shape[:-1], "x.shape[:-1]")
  return jnp.asarray(pad_mask)


def is_empty(x: jax.Array, axes: Sequence[int]) -> bool:
  """Whether the reduction over ``axes`` has no elements (a static fact)."""
  return math.prod(x.shape[a] for a in axes) == 0


# ---------------------------------------------------------------------------
# Broadcasting and statistics.


def other_axes(ndim: int, axes: Sequence[int]) -> tuple[int, ...]:
  """The axes of a rank-``ndim`` array that are not in ``axes``."""
  return tuple(a for a in range(ndim) if a not in axes)


def expand(
  p: ArrayLike, ndim: int, axes: Sequence[int], dtype: jnp.dtype
) -> jax.Array:
  """A parameter over ``axes``, cast and reshaped to broadcast at ``ndim``.

  Every other axis gets size 1.
  """
  p = jnp.asarray(p).astype(dtype)
  shape = [1] * ndim
  for i, a in enumerate(axes):
    shape[a] = p.shape[i]
  return p.reshape(shape)


def channel(p: ArrayLike, ndim: int, dtype: jnp.dtype) -> jax.Array:
  """A ``(C,)`` vector cast and reshaped to broadcast over ``(..., C)``."""
  return expand(p, ndim, (ndim - 1,), dtype)


def sum_to_param(
  t: jax.Array, axes: Sequence[int], dtype: jnp.dtype
) -> jax.Array:
  """Reduces a full-size gradient term to the shape of a parameter."""
  return jnp.sum(t, axis=other_axes(t.ndim, axes)).astype(dtype)


def axis_count(axis_name: AxisName) -> int:
  """Number of devices along the mapped ``axis_name`` (1 without one)."""
  return 1 if axis_name is None else jax.lax.axis_size(axis_name)


def pmean(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """`jax.lax.pmean` over ``axis_name``; the identity for ``None``."""
  return x if axis_name is None else jax.lax.pmean(x, axis_name)


def psum(x: jax.Array, axis_name: AxisName) -> jax.Array:
  """`jax.lax.psum` over ``axis_name``; the identity for ``None``."""
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def moments(
  x: jax.Array, axes: Sequence[int], axis_name: AxisName = None
) -> tuple[jax.Array, jax.Array]:
  """Two-pass mean and biased variance over ``axes`` (keepdims).

  ``var = mean((x - mean(x))**2)`` is non-negative by construction and
  accurate when ``|mean| >> std`` (no ``E[x^2] - E[x]^2`` cancellation).
  With ``axis_name`` both passes are averaged across devices as well; each
  device must hold the same number of elements, as in any data-parallel
  batch.
  """
  axes = tuple(axes)
  mean = pmean(jnp.mean(x, axis=axes, keepdims=True), axis_name)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  return mean, pmean(var, axis_name)


def group_moments(
  x: jax.Array, num_groups: int, reduction_axes: Sequence[int]
) -> tuple[jax.Array, jax.Array]:
  """Two-pass moments per channel group, broadcast back to ``x.shape``.

  The last axis (channels) is split into ``num_groups`` contiguous groups;
  each group's statistics run over its ``C/G`` channels and the other
  ``reduction_axes`` (non-negative, containing ``x.ndim - 1``).

  Returns:
    ``(mean, var)``, each of shape ``x.shape`` (a channel gets its group's
    value).
  """
  c = x.shape[-1]
  xg = x.reshape(*x.shape[:-1], num_groups, c // num_groups)
  axes = (*(a for a in reduction_axes if a != x.ndim - 1), x.ndim)
  mean, var = moments(xg, axes)
  mean, var = (
    jnp.broadcast_to(t, xg.shape).reshape(x.shape) for t in (mean, var)
  )
  return mean, var


def quadratic_mean(
  xf: jax.Array, pad_mask: jax.Array | None, axis_name: AxisName
) -> jax.Array:
  """``mean(x**2)`` per channel over non-pad positions, ``(C,)``, no grad.

  An all-pad batch gives 0 (the count is clamped at 1).
  """
  sq = jnp.square(xf).reshape(-1, xf.shape[-1])
  if pad_mask is None:
    total = jnp.sum(sq, axis=0)
    count = jnp.asarray(sq.shape[0], xf.dtype)
  else:
    valid = jnp.logical_not(pad_mask).reshape(-1, 1).astype(xf.dtype)
    total = jnp.sum(sq * valid, axis=0)
    count = jnp.sum(valid)
  total, count = psum(total, axis_name), psum(count, axis_name)
  return jax.lax.stop_gradient(total / jnp.maximum(count, 1.0))


def all_mean(t: jax.Array, axis_name: AxisName) -> jax.Array:
  """Mean over every position (pads included), per channel, ``(C,)``."""
  return pmean(jnp.mean(t.reshape(-1, t.shape[-1]), axis=0), axis_name)


# ---------------------------------------------------------------------------
# Affine tail and running averages.


def affine(
  y: jax.Array,
  scale: ArrayLike | None,
  bias: ArrayLike | None,
  axes: Sequence[int] | None = None,
  *,
  scale_offset: float = 0.0,
) -> jax.Array:
  """``y * (scale + scale_offset) + bias`` with parameters over ``axes``.

  Parameters are cast to ``y.dtype`` (the compute dtype) and broadcast over
  the other axes; ``axes=None`` means the last axis. ``None`` skips a
  parameter; without ``scale`` a non-zero ``scale_offset`` still multiplies.
  """
  axes = (y.ndim - 1,) if axes is None else tuple(axes)
  if scale is not None:
    y = y * (expand(scale, y.ndim, axes, y.dtype) + scale_offset)
  elif scale_offset:
    y = y * (1.0 + scale_offset)
  if bias is not None:
    y = y + expand(bias, y.ndim, axes, y.dtype)
  return y


def vector_or(
  p: ArrayLike | None, fill: float, size: int, dtype: jnp.dtype
) -> jax.Array:
  """``p`` cast to ``dtype``, or a ``(size,)`` vector of ``fill`` if None.

  A missing gain is ones, a missing offset zeros.
  """
  if p is None:
    return jnp.full((size,), fill, dtype)
  return jnp.asarray(p).astype(dtype)


def ema(old: jax.Array, new: jax.Array, momentum: float) -> jax.Array:
  """``momentum * old + (1 - momentum) * new``, in ``old.dtype``.

  Flax convention: ``momentum`` weights the old value. The blend runs in
  ``new.dtype`` (the compute dtype) and ``new`` is reshaped to ``old``'s
  shape (e.g. keepdims statistics into a ``(C,)`` state).
  """
  blend = momentum * old.astype(new.dtype) + (1 - momentum) * new.reshape(
    old.shape
  )
  return blend.astype(old.dtype)


def rms_factor(ms: jax.Array, eps: float, eps_mode: str) -> jax.Array:
  """RMSNorm's ``1/sqrt(ms + eps)`` (inside) or ``1/(sqrt(ms) + eps)``.

  Outside, ``d sqrt(m)/dm`` is infinite at ``m = 0``, where the chain rule
  multiplies it by ``dm/dx = 0`` (NaN under autodiff); there the root is
  taken of 1 and replaced by 0, so the gradient is its limit (slope
  ``1/eps``).
  """
  if eps_mode == "inside":
    return jax.lax.rsqrt(ms + eps)
  nonzero = ms > 0
  rms = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, ms, 1.0)), 0.0)
  return 1.0 / (rms + eps)
