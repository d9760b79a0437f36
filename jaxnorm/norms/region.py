"""Region Normalization (RN, RN-B, RN-L) for image inpainting."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope


def _check_mask(who: str, mask: ArrayLike, x: jax.Array) -> jax.Array:
  """A 0/1 mask of shape ``x.shape[:-1] + (1,)`` or ``x.shape``."""
  shapes = (x.shape[:-1] + (1,), x.shape)
  if tuple(jnp.shape(mask)) not in shapes:
    raise ValueError(
      f"{who}: mask must have shape {shapes[0]} or "
      f"{shapes[1]} (x.shape[:-1] + (1,) or x.shape), got "
      f"mask.shape={tuple(jnp.shape(mask))}"
    )
  return jnp.asarray(mask)


def resize_mask_nearest(
  mask: ArrayLike, spatial_shape: Sequence[int]
) -> jax.Array:
  """Nearest-neighbour resize of ``(n, *spatial, c)`` masks, torch style.

  Output index ``i`` reads input index ``floor(i * in / out)``, as
  ``torch.nn.functional.interpolate(mode="nearest")`` (not the half-pixel
  rule of `jax.image.resize`), so masks match the region-norm code.

  Args:
    mask: ``(n, *spatial, c)`` array of any dtype.
    spatial_shape: the target spatial sizes.

  Returns:
    The resized mask, same dtype.

  Raises:
    ValueError: for a mask of rank < 3, or a ``spatial_shape`` that does not
      match the spatial rank or has non-positive sizes.
  """
  who = "resize_mask_nearest"
  mask = jnp.asarray(mask)
  _checks.check_ndim(who, "mask", mask, minimum=3)
  spatial_shape = tuple(spatial_shape)
  if len(spatial_shape) != mask.ndim - 2:
    raise ValueError(
      f"{who}: spatial_shape must have {mask.ndim - 2} "
      f"entries for mask.shape={mask.shape}, got "
      f"{spatial_shape=}"
    )
  for size in spatial_shape:
    _checks.check_positive_int(who, "spatial_shape entries", size)
  for i, out in enumerate(spatial_shape):
    size = mask.shape[i + 1]
    idx = np.floor(np.arange(out) * (size / out)).astype(np.int32)
    mask = jnp.take(mask, jnp.asarray(np.minimum(idx, size - 1)), axis=i + 1)
  return mask


@_scope.scoped
def region_norm(
  x: Float[ArrayLike, "n *spatial c"],
  mask: ArrayLike,
  *,
  eps: float = 1e-5,
  axis_name: str | tuple[str, ...] | None = None,
) -> Float[Array, "n *spatial c"]:
  r"""Region normalization: batch normalization within each mask region.

  For each region :math:`R \in \{M = 1, M = 0\}` with :math:`S_R`
  positions over ``(n, *spatial)`` (per channel), mean :math:`\mu_R` and
  biased variance :math:`\sigma^2_R`,

  .. math::
    y = \sum_R 1_R \odot \frac{x - \mu_R}
        {\sqrt{\sigma^2_R + \epsilon N_{tot}/S_R}},\qquad
    N_{tot} = n \cdot \prod \mathrm{spatial}

  the closed form of the official code's fill-with-mean, batch-normalize,
  rescale-by-:math:`\sqrt{S_R/N_{tot}}` construction (:math:`S_R` clamped
  to 1, so an empty region contributes 0). Batch statistics are always
  used: no running statistics, training and inference are the same. The
  mask gets no gradient. Not causal-safe on ``(batch, seq, d)``: the
  statistics mix every position (as do those of `region_norm_b` and
  `region_norm_l`, which call this function).

  Args:
    x: input ``(n, *spatial, c)``.
    mask: 0/1 (or boolean) ``(n, *spatial, 1)`` or ``x.shape``.
    eps: the BatchNorm eps.
    axis_name: mapped axis name(s) to compute region statistics across
      devices.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for a non-floating ``x``.
    ValueError: for rank < 3 or a bad mask shape.

  Examples:
    >>> x = jnp.array([1.0, 3.0, 10.0, 30.0]).reshape(1, 4, 1)  # (n, w, c)
    >>> mask = jnp.array([1.0, 1.0, 0.0, 0.0]).reshape(1, 4, 1)
    >>> print(np.asarray(norms.region_norm(x, mask, eps=0.0)[0, :, 0]))
    [-1.  1. -1.  1.]

  References:
    Yu et al., *Region Normalization for Image Inpainting*,
    arXiv:1911.10375 (AAAI 2020).
  """
  who = "region_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  mask = _check_mask(who, mask, x)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  m = jnp.broadcast_to(jax.lax.stop_gradient(mask.astype(cdt)), x.shape)
  axes = tuple(range(x.ndim - 1))
  n_tot = math.prod(x.shape[:-1]) * _numerics.axis_count(axis_name)
  y = jnp.zeros_like(xf)
  for region in (m, 1.0 - m):
    count = jnp.maximum(
      _numerics.psum(jnp.sum(region, axis=axes), axis_name), 1.0
    )
    count = _numerics.channel(count, x.ndim, cdt)
    mean = (
      _numerics.psum(jnp.sum(xf * region, axis=axes, keepdims=True), axis_name)
      / count
    )
    # Outside the region the square is dropped, not multiplied by 0: an
    # overflowing square (inputs near 1e30) times 0 would be NaN.
    sq = jnp.where(region > 0, jnp.square(xf - mean), 0.0) * region
    var = (
      _numerics.psum(jnp.sum(sq, axis=axes, keepdims=True), axis_name) / count
    )
    y = y + region * (xf - mean) * jax.lax.rsqrt(var + eps * n_tot / count)
  return y.astype(x.dtype)


@_scope.scoped
def region_norm_b(
  x: Float[ArrayLike, "n *spatial c"],
  mask: ArrayLike,
  scale_fg: Float[ArrayLike, " c"],
  bias_fg: Float[ArrayLike, " c"],
  scale_bg: Float[ArrayLike, " c"],
  bias_bg: Float[ArrayLike, " c"],
  *,
  eps: float = 1e-5,
  masked_bias: bool = False,
  axis_name: str | tuple[str, ...] | None = None,
) -> Float[Array, "n *spatial c"]:
  r"""RN-B: region normalization with a given mask and per-region affine.

  .. math::
    y = (\mathrm{RN}(x)\,M) \odot (1 + \gamma_f) + \beta_f
      + (\mathrm{RN}(x)\,(1 - M)) \odot (1 + \gamma_b) + \beta_b

  The four parameters are initialized to 0 and used as ``1 + scale``. The
  mask is 1 on the "foreground" region (hole pixels in the official
  inpainting code). Code quirk kept by default: both shifts are added at
  every pixel; ``masked_bias=True`` gives the paper's per-region shift
  :math:`M\beta_f + (1-M)\beta_b`. Resize a full-resolution mask to the
  feature size with `resize_mask_nearest`.

  Args:
    x: input ``(n, *spatial, c)``.
    mask: 0/1 ``(n, *spatial, 1)`` or ``x.shape``.
    scale_fg: :math:`\gamma_f`, ``(c,)``.
    bias_fg: :math:`\beta_f`, ``(c,)``.
    scale_bg: :math:`\gamma_b`, ``(c,)``.
    bias_bg: :math:`\beta_b`, ``(c,)``.
    eps: the BatchNorm eps.
    masked_bias: apply each shift only in its region.
    axis_name: mapped axis name(s) for cross-device region statistics.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for rank < 3, a bad mask or parameter shape.

  Examples:
    >>> x = jnp.array([1.0, 3.0, 10.0, 30.0]).reshape(1, 4, 1)
    >>> mask = jnp.array([1.0, 1.0, 0.0, 0.0]).reshape(1, 4, 1)
    >>> zero = jnp.zeros(1)
    >>> y = norms.region_norm_b(x, mask, zero, zero, jnp.ones(1), zero, eps=0.0)
    >>> print(np.asarray(y[0, :, 0]))  # background gain 1 + 1
    [-1.  1. -2.  2.]

  References:
    Yu et al., *Region Normalization for Image Inpainting*,
    arXiv:1911.10375 (AAAI 2020).
  """
  who = "region_norm_b"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  _numerics.check_channels(
    who,
    x,
    scale_fg=scale_fg,
    bias_fg=bias_fg,
    scale_bg=scale_bg,
    bias_bg=bias_bg,
  )
  mask = _check_mask(who, mask, x)
  cdt = _numerics.compute_dtype(x)
  rn = region_norm(x.astype(cdt), mask, eps=eps, axis_name=axis_name)
  m = jnp.broadcast_to(jax.lax.stop_gradient(mask.astype(cdt)), x.shape)
  p = {
    k: _numerics.channel(v, x.ndim, cdt)
    for k, v in (
      ("gf", scale_fg),
      ("bf", bias_fg),
      ("gb", scale_bg),
      ("bb", bias_bg),
    )
  }
  y = rn * m * (1 + p["gf"]) + rn * (1 - m) * (1 + p["gb"])
  if masked_bias:
    y = y + m * p["bf"] + (1 - m) * p["bb"]
  else:
    y = y + p["bf"] + p["bb"]
  return y.astype(x.dtype)


def _conv_same(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """2-D cross-correlation, NHWC/HWIO, zero padding ``k // 2`` (torch)."""
  kh, kw = kernel.shape[:2]
  return jax.lax.conv_general_dilated(
    x,
    kernel,
    window_strides=(1, 1),
    padding=((kh // 2, kh // 2), (kw // 2, kw // 2)),
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )


@_scope.scoped
def region_norm_l(
  x: Float[ArrayLike, "n h w c"],
  mask_kernel: Float[ArrayLike, "k k 2 1"],
  scale_kernel: Float[ArrayLike, "k k 1 1"],
  scale_bias: Float[ArrayLike, " 1"],
  bias_kernel: Float[ArrayLike, "k k 1 1"],
  bias_bias: Float[ArrayLike, " 1"],
  *,
  threshold: float = 0.8,
  eps: float = 1e-5,
  axis_name: str | tuple[str, ...] | None = None,
) -> Float[Array, "n h w c"]:
  r"""RN-L: region normalization with a learned, self-aware mask.

  .. math::
    a = \mathrm{sigmoid}(\mathrm{conv}_{2\to1}([\mathrm{mean}_c x,
        \max_c x])),\quad M = 1[a \ge \mathrm{threshold}],\\
    y = \mathrm{RN}(x, M) \odot (1 + \mathrm{conv}_\gamma(a))
        + \mathrm{conv}_\beta(a)

  The mask conv has no bias; the two pixel-wise affine convs have one;
  all use odd ``k x k`` kernels (7 in the paper, 3 allowed) with zero
  "same" padding. ``M`` is thresholded without gradient; ``a`` receives
  gradient through the affine maps.

  Args:
    x: input ``(n, h, w, c)``.
    mask_kernel: ``(k, k, 2, 1)`` (HWIO) weight of the mask conv.
    scale_kernel: ``(k, k, 1, 1)`` weight of :math:`\mathrm{conv}_\gamma`.
    scale_bias: ``(1,)`` bias of :math:`\mathrm{conv}_\gamma`.
    bias_kernel: ``(k, k, 1, 1)`` weight of :math:`\mathrm{conv}_\beta`.
    bias_bias: ``(1,)`` bias of :math:`\mathrm{conv}_\beta`.
    threshold: mask threshold on ``a``.
    eps: the BatchNorm eps.
    axis_name: mapped axis name(s) for cross-device region statistics.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a non-4-D input or bad kernel shapes.

  Examples:
    >>> x = jnp.array([1.0, 3.0, 1.0, 3.0]).reshape(1, 2, 2, 1)
    >>> k1, k2 = jnp.zeros((1, 1, 2, 1)), jnp.zeros((1, 1, 1, 1))
    >>> b = jnp.zeros(1)
    >>> y = norms.region_norm_l(x, k1, k2, b, k2, b, threshold=0.5)  # a = 0.5
    >>> print(np.asarray(y[0, ..., 0]).round(4))
    [[-1.  1.]
     [-1.  1.]]

  References:
    Yu et al., *Region Normalization for Image Inpainting*,
    arXiv:1911.10375 (AAAI 2020).
  """
  who = "region_norm_l"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=4)
  k = jnp.shape(mask_kernel)[0] if jnp.ndim(mask_kernel) else 0
  if k % 2 == 0:
    raise ValueError(
      f"{who}: kernels must be (k, k, ...) with odd k, got "
      f"mask_kernel.shape={jnp.shape(mask_kernel)}"
    )
  for name, p, shape in (
    ("mask_kernel", mask_kernel, (k, k, 2, 1)),
    ("scale_kernel", scale_kernel, (k, k, 1, 1)),
    ("scale_bias", scale_bias, (1,)),
    ("bias_kernel", bias_kernel, (k, k, 1, 1)),
    ("bias_bias", bias_bias, (1,)),
  ):
    _checks.check_floating(who, name, p)
    _checks.check_shape(who, name, p, shape)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  pooled = jnp.concatenate(
    [jnp.mean(xf, -1, keepdims=True), jnp.max(xf, -1, keepdims=True)], axis=-1
  )
  a = jax.nn.sigmoid(_conv_same(pooled, jnp.asarray(mask_kernel).astype(cdt)))
  mask = jax.lax.stop_gradient((a >= threshold).astype(cdt))
  gamma = _conv_same(a, jnp.asarray(scale_kernel).astype(cdt)) + jnp.asarray(
    scale_bias
  ).astype(cdt).reshape(1, 1, 1, 1)
  beta = _conv_same(a, jnp.asarray(bias_kernel).astype(cdt)) + jnp.asarray(
    bias_bias
  ).astype(cdt).reshape(1, 1, 1, 1)
  rn = region_norm(xf, mask, eps=eps, axis_name=axis_name)
  return (rn * (1 + gamma) + beta).astype(x.dtype)
