r"""Masked statistics for the ``mask=`` argument of the per-example norms.

flax's ``LayerNorm``, ``RMSNorm`` and ``GroupNorm`` take ``mask=`` in
``__call__``: the statistics run over the masked-in elements only, and every
element (masked or not) is normalized with them:

.. math::
  \mu = \frac{\sum_i m_i x_i}{\max(1, \sum_i m_i)},\qquad
  \sigma^2 = \frac{\sum_i m_i (x_i - \mu)^2}{\max(1, \sum_i m_i)}

over the norm's axes (RMSNorm: no centring, :math:`\mu = 0`). The forms
below mirror `jaxnorm.norms.layer_norm`, `rms_norm` and `group_norm` (same
``eps`` placement, affine tail, float32 statistics, output in ``x.dtype``)
with these moments, over the last axis (the features); the nnx modules call
them when given a mask and the unmasked functions otherwise.

Deviation: flax divides by the count as is, so a row without a valid
element gives NaN; here the count is clamped at 1 (mean and variance 0, a
finite output), as in `jaxnorm.norms.batch_norm`.

``mask`` is boolean. A mask of shape ``x.shape[:-1]`` is a mask of positions
(jaxnorm's convention, as in `jaxnorm.norms.batch_norm` and the graph
models); any other shape broadcasts against ``x`` as in flax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import ArrayLike

from jaxnorm import _numerics


def check_masked_call(
  who: str, axes: tuple[int, ...], ndim: int, implementation: str | None
) -> None:
  """Refuses ``mask=`` off the last axis or with the Pallas kernel.

  Raises:
    ValueError: ``axes`` is not the last axis alone.
    NotImplementedError: ``implementation="pallas"`` (no masked kernel).
  """
  if axes != (ndim - 1,):
    raise ValueError(
      f"{who}: mask= normalizes over the features on the last axis, got "
      f"axis={axes} for x.ndim={ndim}"
    )
  if implementation == "pallas":
    raise NotImplementedError(
      f"{who}: the Pallas kernel has no mask=; use implementation='xla' or None"
    )


def check_mask(who: str, mask: ArrayLike, x: jax.Array) -> jax.Array:
  """``mask`` as a boolean array of ``x.ndim`` dims broadcastable to ``x``.

  Raises:
    TypeError: for a non-boolean mask.
    ValueError: for a shape that neither is ``x.shape[:-1]`` nor
      broadcasts to ``x.shape``.
  """
  dtype = jnp.result_type(mask)
  if dtype != jnp.bool_:
    raise TypeError(
      f"{who}: mask must be boolean (True on the elements that enter the "
      f"statistics), got mask.dtype={dtype}"
    )
  mask = jnp.asarray(mask)
  if mask.shape == x.shape[:-1]:
    return mask[..., None]
  try:
    shape = jnp.broadcast_shapes(mask.shape, x.shape)
  except ValueError:
    shape = None
  if shape != x.shape:
    raise ValueError(
      f"{who}: mask must have shape x.shape[:-1]={x.shape[:-1]} (positions) "
      f"or broadcast to x.shape={x.shape} (flax), got mask.shape={mask.shape}"
    )
  return mask.reshape((1,) * (x.ndim - mask.ndim) + mask.shape)


def _inputs(
  who: str, x: jax.Array, mask: ArrayLike, **params: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
  """Checked ``(x in the compute dtype, mask)`` of a last-axis norm."""
  mask = check_mask(who, mask, x)
  for name, value in params.items():
    _numerics.check_param(who, name, value, x, (x.ndim - 1,))
  return x.astype(_numerics.compute_dtype(x)), mask


def moments(
  xf: jax.Array, mask: jax.Array, axes: tuple[int, ...], *, center: bool
) -> tuple[jax.Array, jax.Array]:
  """Masked mean (0 without ``center``) and second central moment, keepdims.

  The count of valid elements is clamped at 1.
  """
  m = jnp.broadcast_to(mask, xf.shape).astype(xf.dtype)
  count = jnp.maximum(jnp.sum(m, axis=axes, keepdims=True), 1.0)
  mean = jnp.sum(xf * m, axis=axes, keepdims=True) / count if center else 0.0
  var = jnp.sum(jnp.square(xf - mean) * m, axis=axes, keepdims=True) / count
  return mean, var


def layer_norm(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mask: ArrayLike,
  *,
  eps: float,
  scale_offset: float,
) -> jax.Array:
  """`jaxnorm.norms.layer_norm` over the last axis with masked moments."""
  xf, mask = _inputs("LayerNorm", x, mask, scale=scale, bias=bias)
  mean, var = moments(xf, mask, (x.ndim - 1,), center=True)
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  y = _numerics.affine(y, scale, bias, scale_offset=scale_offset)
  return y.astype(x.dtype)


def rms_norm(
  x: jax.Array,
  scale: jax.Array | None,
  mask: ArrayLike,
  *,
  eps: float,
  eps_mode: str,
  scale_offset: float,
) -> jax.Array:
  """`jaxnorm.norms.rms_norm` over the last axis with a masked mean square."""
  xf, mask = _inputs("RMSNorm", x, mask, scale=scale)
  _, ms = moments(xf, mask, (x.ndim - 1,), center=False)
  y = xf * _numerics.rms_factor(ms, eps, eps_mode)
  y = _numerics.affine(y, scale, None, scale_offset=scale_offset)
  return y.astype(x.dtype)


def group_norm(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mask: ArrayLike,
  *,
  num_groups: int,
  eps: float,
  reduction_axes: int | tuple[int, ...] | None,
) -> jax.Array:
  """`jaxnorm.norms.group_norm` with moments over the masked elements.

  The mask is broadcast to ``x.shape`` and split into groups like ``x``
  (flax's ``mask.reshape(..., num_groups, group_size)``).
  """
  who = "GroupNorm"
  x = jnp.asarray(x)
  axes = _numerics.group_reduction_axes(who, reduction_axes, x, min_rank=2)
  mask = jnp.broadcast_to(check_mask(who, mask, x), x.shape)
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  xf = x.astype(_numerics.compute_dtype(x))
  grouped = (*x.shape[:-1], num_groups, x.shape[-1] // num_groups)
  group_axes = (*(a for a in axes if a != x.ndim - 1), x.ndim)
  mean, var = moments(
    xf.reshape(grouped), mask.reshape(grouped), group_axes, center=True
  )
  y = (xf.reshape(grouped) - mean) * jax.lax.rsqrt(var + eps)
  y = _numerics.affine(y.reshape(x.shape), scale, bias)
  return y.astype(x.dtype)


def position_mask(who: str, mask: ArrayLike, x: jax.Array) -> jax.Array:
  """A mask for `jaxnorm.norms.batch_norm`: shape ``x.shape[:-1]``.

  Accepts the positions form or a flax mask that is the same for every
  feature (last dimension 1).

  Raises:
    TypeError: for a non-boolean mask.
    ValueError: for a bad shape, or a mask that differs per feature.
  """
  mask = check_mask(who, mask, x)
  if mask.shape[-1] != 1:
    raise ValueError(
      f"{who}: mask must be the same for every feature (shape "
      f"x.shape[:-1]={x.shape[:-1]}, or last dimension 1), got "
      f"mask.shape={mask.shape}; batch statistics are taken over the same "
      "elements for every feature"
    )
  return jnp.broadcast_to(mask[..., 0], x.shape[:-1])
