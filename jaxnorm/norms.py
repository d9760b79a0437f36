"""Normalization layers as pure functions.

Every function here is the executable form of its paper's equation: arrays and
static keyword arguments in, arrays out, no parameters created. Conventions
shared by all of them:

* Features are last by default (``axis=-1``); images are NHWC.
* Statistics are computed in ``promote_types(x.dtype, float32)``: half inputs
  are upcast, float64 stays float64. The output has ``x.dtype``.
* Variances are two-pass, ``mean((x - mean(x))**2)``, so they are
  non-negative by construction (no ``E[x^2] - E[x]^2`` cancellation to clamp)
  and stay accurate when ``|mean| >> std``, e.g. inputs of magnitude 1e4.
* Parameters are cast to the compute dtype at use, so a float32 ``scale``
  works with a bfloat16 ``x`` under strict dtype promotion.
* Static facts (rank, axis, parameter shapes, dtypes) are validated at trace
  time by `jaxnorm._checks`.

`layer_norm` and `rms_norm` carry a `jax.custom_vjp` whose backward pass
computes ``dx`` in one fused expression from the saved per-row statistics
(instead of differentiating through every intermediate of the forward pass);
the gradients are the exact gradients of the forward function.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _dispatch

Axis = int | Sequence[int]
EpsMode = Literal["inside", "outside"]
EPS_MODES: tuple[str, ...] = ("inside", "outside")


# ---------------------------------------------------------------------------
# Shared helpers.


def _compute_dtype(x: jax.Array) -> jnp.dtype:
  """``promote_types(x.dtype, float32)``, valid under strict promotion."""
  if jnp.finfo(x.dtype).bits < 32:
    return jnp.dtype(jnp.float32)
  return jnp.dtype(x.dtype)


def _param_shape(x: jax.Array, axes: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(x.shape[a] for a in axes)


def _check_param(
  who: str, name: str, p: ArrayLike | None, x: jax.Array, axes: tuple[int, ...]
) -> None:
  """Parameters over the normalized axes: shape ``x.shape[axes]``, float."""
  if p is None:
    return
  _checks.check_floating(who, name, p)
  where = f"x.shape[axis] for axis={axes if len(axes) > 1 else axes[0]}"
  _checks.check_shape(who, name, p, _param_shape(x, axes), where)


def _expand(
  p: ArrayLike, ndim: int, axes: tuple[int, ...], dtype: jnp.dtype
) -> jax.Array:
  """Reshapes a parameter over ``axes`` to broadcast against rank ``ndim``."""
  p = jnp.asarray(p).astype(dtype)
  shape = [1] * ndim
  for i, a in enumerate(axes):
    shape[a] = p.shape[i]
  return p.reshape(shape)


def _other_axes(ndim: int, axes: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(a for a in range(ndim) if a not in axes)


def _moments(
  x: jax.Array,
  axes: tuple[int, ...],
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Two-pass mean and biased variance over ``axes`` (keepdims).

  With ``axis_name`` the statistics are averaged across devices as well; each
  device must hold the same number of elements, as in any data-parallel batch.
  """
  mean = jnp.mean(x, axis=axes, keepdims=True)
  if axis_name is not None:
    mean = jax.lax.pmean(mean, axis_name)
  var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
  if axis_name is not None:
    var = jax.lax.pmean(var, axis_name)
  return mean, var


def _sum_to_param(
  t: jax.Array, axes: tuple[int, ...], dtype: jnp.dtype
) -> jax.Array:
  """Reduces a full-size gradient term to the shape of a parameter."""
  return jnp.sum(t, axis=_other_axes(t.ndim, axes)).astype(dtype)


# ---------------------------------------------------------------------------
# LayerNorm.


def layer_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  scale_offset: float = 0.0,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Layer normalization over ``axis``.

  .. math::
    y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot
        \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \mathrm{bias},
    \quad \mu = \mathrm{mean}_{axis}(x),\;
    \sigma^2 = \mathrm{mean}_{axis}((x - \mu)^2)

  ``eps`` sits inside the square root, as in Flax and torch.

  Args:
    x: input of any rank, floating dtype.
    scale: gain of shape ``x.shape[axis]`` (a tuple of sizes for several
      axes); ``None`` means no gain.
    bias: offset, same shape as ``scale``; ``None`` means no offset.
    eps: added to the variance.
    axis: axis or axes to normalize over.
    scale_offset: constant added to ``scale`` (1.0 gives the ``1 + scale``
      parameterization of Gemma-style models).
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Normalized array with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x``, ``scale`` or ``bias`` is not floating.
    ValueError: if ``axis`` is out of range or a parameter has the wrong shape.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  References:
    Ba, Kiros & Hinton, *Layer Normalization*, arXiv:1607.06450 (2016).
  """
  who = "layer_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "layer_norm_pallas",
    lambda k: k(x, scale, bias, eps=eps, axis=axes, scale_offset=scale_offset),
  )
  if out is not None:
    return out
  return _layer_norm(x, scale, bias, float(eps), axes, float(scale_offset))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layer_norm(x, scale, bias, eps, axes, offset):
  return _layer_norm_fwd(x, scale, bias, eps, axes, offset)[0]


def _layer_norm_fwd(x, scale, bias, eps, axes, offset):
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  mean, var = _moments(xf, axes)
  rstd = jax.lax.rsqrt(var + eps)
  xhat = (xf - mean) * rstd
  y = xhat
  if scale is not None:
    y = y * (_expand(scale, x.ndim, axes, cdt) + offset)
  elif offset:
    y = y * (1.0 + offset)
  if bias is not None:
    y = y + _expand(bias, x.ndim, axes, cdt)
  return y.astype(x.dtype), (x, scale, bias, mean, rstd)


def _layer_norm_bwd(eps, axes, offset, res, dy):
  del eps
  x, scale, bias, mean, rstd = res
  cdt = _compute_dtype(x)
  dy = dy.astype(cdt)
  xhat = (x.astype(cdt) - mean) * rstd
  if scale is not None:
    g = dy * (_expand(scale, x.ndim, axes, cdt) + offset)
  else:
    g = dy * (1.0 + offset)
  g_mean = jnp.mean(g, axis=axes, keepdims=True)
  gx_mean = jnp.mean(g * xhat, axis=axes, keepdims=True)
  dx = (rstd * (g - g_mean - xhat * gx_mean)).astype(x.dtype)
  dscale = (
    None
    if scale is None
    else _sum_to_param(dy * xhat, axes, jnp.result_type(scale))
  )
  dbias = (
    None if bias is None else _sum_to_param(dy, axes, jnp.result_type(bias))
  )
  return dx, dscale, dbias


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


# ---------------------------------------------------------------------------
# RMSNorm.


def rms_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  eps_mode: EpsMode = "inside",
  scale_offset: float = 0.0,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Root-mean-square normalization over ``axis`` (no re-centering).

  .. math::
    y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot x \cdot k,\quad
    k = \begin{cases}
      1/\sqrt{\mathrm{mean}_{axis}(x^2) + \epsilon} & \text{inside}\\
      1/(\sqrt{\mathrm{mean}_{axis}(x^2)} + \epsilon) & \text{outside}
    \end{cases}

  ``eps_mode="inside"`` is the Flax, torch and LLaMA convention (and the
  default); ``"outside"`` is the official ``bzhangGo/rmsnorm`` torch code,
  which uses ``eps=1e-8``.

  Args:
    x: input of any rank, floating dtype.
    scale: gain of shape ``x.shape[axis]``; ``None`` means no gain.
    eps: stabilizer, placed according to ``eps_mode``.
    axis: axis or axes to normalize over.
    eps_mode: ``"inside"`` or ``"outside"`` the square root.
    scale_offset: constant added to ``scale`` (1.0 for ``1 + scale``).
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Normalized array with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x`` or ``scale`` is not floating.
    ValueError: for a bad ``axis``, ``scale`` shape or ``eps_mode``.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  References:
    Zhang & Sennrich, *Root Mean Square Layer Normalization*,
    arXiv:1910.07467 (2019).
  """
  who = "rms_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, EPS_MODES)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _check_param(who, "scale", scale, x, axes)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "rms_norm_pallas",
    lambda k: k(
      x, scale, eps=eps, axis=axes, eps_mode=eps_mode, scale_offset=scale_offset
    ),
  )
  if out is not None:
    return out
  return _rms_norm(x, scale, float(eps), axes, eps_mode, float(scale_offset))


def _rms_factor(ms: jax.Array, eps: float, eps_mode: str) -> jax.Array:
  if eps_mode == "inside":
    return jax.lax.rsqrt(ms + eps)
  return 1.0 / (jnp.sqrt(ms) + eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _rms_norm(x, scale, eps, axes, eps_mode, offset):
  return _rms_norm_fwd(x, scale, eps, axes, eps_mode, offset)[0]


def _rms_norm_fwd(x, scale, eps, axes, eps_mode, offset):
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  ms = jnp.mean(jnp.square(xf), axis=axes, keepdims=True)
  k = _rms_factor(ms, eps, eps_mode)
  y = xf * k
  if scale is not None:
    y = y * (_expand(scale, x.ndim, axes, cdt) + offset)
  elif offset:
    y = y * (1.0 + offset)
  return y.astype(x.dtype), (x, scale, ms, k)


def _rms_norm_bwd(eps, axes, eps_mode, offset, res, dy):
  # With y = w * x * k(m), m = mean(x^2):
  #   dx = k * g + (2/n) * k'(m) * sum(g * x) * x,   g = dy * w,
  # where -2 k'(m) = k^3 (inside) or k^2 / sqrt(m) (outside). The outside
  # correction vanishes at x = 0 (its limit), so it is guarded there.
  del eps
  x, scale, ms, k = res
  cdt = _compute_dtype(x)
  dy = dy.astype(cdt)
  xf = x.astype(cdt)
  if scale is not None:
    g = dy * (_expand(scale, x.ndim, axes, cdt) + offset)
  else:
    g = dy * (1.0 + offset)
  gx_mean = jnp.mean(g * xf, axis=axes, keepdims=True)
  if eps_mode == "inside":
    a = gx_mean * k * k * k
  else:
    safe = ms > 0
    inv_rms = jnp.where(safe, jax.lax.rsqrt(jnp.where(safe, ms, 1.0)), 0.0)
    a = gx_mean * k * k * inv_rms
  dx = (k * g - a * xf).astype(x.dtype)
  dscale = (
    None
    if scale is None
    else _sum_to_param(dy * xf * k, axes, jnp.result_type(scale))
  )
  return dx, dscale


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


# ---------------------------------------------------------------------------
# CRMSNorm.


def crms_norm(
  z: Float[ArrayLike, "... d_minus_1"],
  scale: Float[ArrayLike, " d_minus_1"] | None = None,
  *,
  eps: float = 1e-6,
  axis: int = -1,
) -> Float[Array, "... d_minus_1"]:
  r"""Compressed RMSNorm on the ``(d-1)``-dim form of zero-mean vectors.

  A zero-mean ``x`` in :math:`\mathbb{R}^d` is stored as its first ``d-1``
  coordinates ``z``; the dropped one is :math:`x_d = -\sum_i z_i`, so

  .. math::
    \mathrm{CRMS}(z) = \mathrm{scale} \odot
      \frac{z}{\sqrt{\left(\sum_i z_i^2 + (\sum_i z_i)^2\right) / d
      + \epsilon}},

  with ``d = z.shape[axis] + 1`` (the original width). For zero-mean ``x``,
  ``crms_norm(x[..., :-1]) == rms_norm(x)[..., :-1]``.

  Args:
    z: compressed input, ``d-1`` features on ``axis``.
    scale: gain of shape ``(d-1,)``; ``None`` means none.
    eps: added inside the square root (the source model's LayerNorm eps).
    axis: the feature axis.

  Returns:
    Array with the shape and dtype of ``z``.

  Raises:
    TypeError: if ``z`` or ``scale`` is not floating.
    ValueError: for a bad ``axis`` or ``scale`` shape.

  References:
    Jiang, Gu, Zhu & Pan, *Pre-RMSNorm and Pre-CRMSNorm Transformers:
    Equivalent and Efficient Pre-LN Transformers*, NeurIPS 2023,
    arXiv:2305.14858.
  """
  who = "crms_norm"
  _checks.check_floating(who, "z", z)
  z = jnp.asarray(z)
  axes = _checks.normalize_axes(who, axis, z.ndim)
  _check_param(who, "scale", scale, z, axes)
  cdt = _compute_dtype(z)
  zf = z.astype(cdt)
  d = z.shape[axes[0]] + 1
  sq = jnp.sum(jnp.square(zf), axis=axes, keepdims=True)
  total = jnp.sum(zf, axis=axes, keepdims=True)
  y = zf * jax.lax.rsqrt((sq + jnp.square(total)) / d + eps)
  if scale is not None:
    y = y * _expand(scale, z.ndim, axes, cdt)
  return y.astype(z.dtype)


# ---------------------------------------------------------------------------
# BatchNorm, GroupNorm, InstanceNorm.


class BatchNormState(NamedTuple):
  """Running statistics of `batch_norm` (the ``batch_stats`` of Flax).

  Attributes:
    mean: running mean, shape ``(num_features,)``.
    var: running biased variance, shape ``(num_features,)``.
  """

  mean: jax.Array
  var: jax.Array


def init_batch_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> BatchNormState:
  """Running statistics at initialization: mean 0, variance 1."""
  _checks.check_positive_int(
    "init_batch_norm_state", "num_features", num_features
  )
  return BatchNormState(
    mean=jnp.zeros((num_features,), dtype), var=jnp.ones((num_features,), dtype)
  )


def batch_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: BatchNormState,
  *,
  training: bool,
  momentum: float = 0.99,
  eps: float = 1e-5,
  axis: int = -1,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], BatchNormState]:
  r"""Batch normalization with explicit running statistics.

  Training normalizes with the batch statistics over every axis except the
  feature ``axis`` and updates the running averages; inference uses the
  running averages and returns ``state`` unchanged:

  .. math::
    y = \mathrm{scale} \odot \frac{x - \mu_B}{\sqrt{\sigma_B^2 + \epsilon}}
        + \mathrm{bias},\qquad
    \bar\mu \leftarrow m\,\bar\mu + (1 - m)\,\mu_B,\;
    \bar\sigma^2 \leftarrow m\,\bar\sigma^2 + (1 - m)\,\sigma_B^2

  with the **biased** batch variance and momentum ``m`` weighting the old
  value, as in Flax (torch stores the unbiased variance and its momentum
  weights the new batch).

  Args:
    x: input with features on ``axis``.
    scale: per-feature gain or ``None``.
    bias: per-feature offset or ``None``.
    state: running statistics, each of shape ``(x.shape[axis],)``.
    training: batch statistics and a state update when True, running
      statistics when False.
    momentum: decay of the running averages.
    eps: added to the variance.
    axis: the feature axis.
    axis_name: mapped axis name(s) (`shard_map`, `pmap`) across which batch
      statistics are averaged, for cross-device BatchNorm.

  Returns:
    ``(y, new_state)``; ``y`` has the shape and dtype of ``x`` and
    ``new_state`` the structure and dtypes of ``state``.

  Raises:
    TypeError: for non-floating ``x`` or parameters.
    ValueError: for a bad ``axis``, parameter or state shape.

  References:
    Ioffe & Szegedy, *Batch Normalization: Accelerating Deep Network Training
    by Reducing Internal Covariate Shift*, arXiv:1502.03167 (2015).
  """
  who = "batch_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  _check_param(who, "scale", scale, x, (feat,))
  _check_param(who, "bias", bias, x, (feat,))
  if not isinstance(state, BatchNormState):
    raise TypeError(
      f"{who}: state must be a BatchNormState, got {type(state).__name__}"
    )
  _checks.check_shape(
    who, "state.mean", state.mean, (x.shape[feat],), "x.shape[axis]"
  )
  _checks.check_shape(
    who, "state.var", state.var, (x.shape[feat],), "x.shape[axis]"
  )
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  reduce = _other_axes(x.ndim, (feat,))
  if training:
    mean, var = _moments(xf, reduce, axis_name)
    new_state = BatchNormState(
      mean=(
        momentum * state.mean.astype(cdt) + (1 - momentum) * mean.reshape(-1)
      ).astype(state.mean.dtype),
      var=(
        momentum * state.var.astype(cdt) + (1 - momentum) * var.reshape(-1)
      ).astype(state.var.dtype),
    )
  else:
    mean = _expand(state.mean, x.ndim, (feat,), cdt)
    var = _expand(state.var, x.ndim, (feat,), cdt)
    new_state = state
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  if scale is not None:
    y = y * _expand(scale, x.ndim, (feat,), cdt)
  if bias is not None:
    y = y + _expand(bias, x.ndim, (feat,), cdt)
  return y.astype(x.dtype), new_state


def group_norm(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None = None,
  bias: Float[ArrayLike, " c"] | None = None,
  *,
  num_groups: int | None = 32,
  group_size: int | None = None,
  eps: float = 1e-6,
) -> Float[Array, "n *spatial c"]:
  r"""Group normalization of a channels-last batch.

  Channels are split into ``G`` contiguous groups; mean and biased variance
  are taken per example and group over all spatial positions and the
  ``C/G`` channels of the group, then a per-channel affine is applied.
  ``G = 1`` is LayerNorm over all non-batch axes; ``G = C`` is InstanceNorm.

  Args:
    x: input ``(batch, *spatial, channels)``, rank >= 2.
    scale: per-channel gain or ``None``.
    bias: per-channel offset or ``None``.
    num_groups: number of groups ``G``; give exactly one of ``num_groups``
      and ``group_size``.
    group_size: channels per group (``C/G``).
    eps: added to the variance.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for rank < 2, both or neither of ``num_groups`` and
      ``group_size``, a group count that does not divide the channels, or a
      bad parameter shape.

  References:
    Wu & He, *Group Normalization*, arXiv:1803.08494 (2018).
  """
  who = "group_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  channels = x.shape[-1]
  if (num_groups is None) == (group_size is None):
    raise ValueError(
      f"{who}: give exactly one of num_groups and group_size, got "
      f"{num_groups=} and {group_size=}"
    )
  if num_groups is None:
    _checks.check_positive_int(who, "group_size", group_size)
    _checks.check_divisible(
      who, "x.shape[-1]", channels, "group_size", group_size
    )
    num_groups = channels // group_size
  _checks.check_positive_int(who, "num_groups", num_groups)
  _checks.check_divisible(
    who, "x.shape[-1]", channels, "num_groups", num_groups
  )
  last = (x.ndim - 1,)
  _check_param(who, "scale", scale, x, last)
  _check_param(who, "bias", bias, x, last)
  cdt = _compute_dtype(x)
  xg = x.astype(cdt).reshape(*x.shape[:-1], num_groups, channels // num_groups)
  stat_axes = (*range(1, x.ndim - 1), x.ndim)
  mean, var = _moments(xg, stat_axes)
  y = ((xg - mean) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
  if scale is not None:
    y = y * _expand(scale, x.ndim, last, cdt)
  if bias is not None:
    y = y + _expand(bias, x.ndim, last, cdt)
  return y.astype(x.dtype)


def instance_norm(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None = None,
  bias: Float[ArrayLike, " c"] | None = None,
  *,
  eps: float = 1e-6,
) -> Float[Array, "n *spatial c"]:
  r"""Instance normalization: per example and channel, over spatial axes.

  .. math::
    y_{n,\dots,c} = \mathrm{scale}_c
      \frac{x_{n,\dots,c} - \mu_{n,c}}{\sqrt{\sigma^2_{n,c} + \epsilon}}
      + \mathrm{bias}_c

  Args:
    x: input ``(batch, *spatial, channels)`` with at least one spatial axis.
    scale: per-channel gain or ``None``.
    bias: per-channel offset or ``None``.
    eps: added to the variance.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for rank < 3 or a bad parameter shape.

  References:
    Ulyanov, Vedaldi & Lempitsky, *Instance Normalization: The Missing
    Ingredient for Fast Stylization*, arXiv:1607.08022 (2016).
  """
  who = "instance_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  last = (x.ndim - 1,)
  _check_param(who, "scale", scale, x, last)
  _check_param(who, "bias", bias, x, last)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  mean, var = _moments(xf, tuple(range(1, x.ndim - 1)))
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  if scale is not None:
    y = y * _expand(scale, x.ndim, last, cdt)
  if bias is not None:
    y = y + _expand(bias, x.ndim, last, cdt)
  return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# DyT and SeeDNorm.


def dyt(
  x: Float[ArrayLike, "..."],
  alpha: Float[ArrayLike, " "],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  axis: Axis = -1,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Dynamic Tanh, an element-wise stand-in for a normalization layer.

  .. math:: y = \mathrm{scale} \odot \tanh(\alpha\,x) + \mathrm{bias}

  ``alpha`` is one learnable scalar (initialized to 0.5 for vision models;
  the LLaMA recipe uses 0.8/0.2 for 7B attention/FFN inputs and no bias).
  No statistics are computed, so rows never interact.

  Args:
    x: input of any rank, floating dtype.
    alpha: scalar, shape ``()`` or ``(1,)``.
    scale: gain over ``axis`` or ``None``.
    bias: offset over ``axis`` or ``None``.
    axis: axis or axes that ``scale`` and ``bias`` run along.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a non-scalar ``alpha``, a bad ``axis`` or parameter shape.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  References:
    Zhu, Chen, He, LeCun & Liu, *Transformers without Normalization*,
    arXiv:2503.10622 (2025).
  """
  who = "dyt"
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "alpha", alpha)
  x = jnp.asarray(x)
  if math.prod(jnp.shape(alpha)) != 1 or jnp.ndim(alpha) > 1:
    raise ValueError(
      f"{who}: alpha must be a scalar of shape () or (1,), "
      f"got alpha.shape={jnp.shape(alpha)}"
    )
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "dyt_pallas",
    lambda k: k(x, alpha, scale, bias, axis=axes),
  )
  if out is not None:
    return out
  cdt = _compute_dtype(x)
  a = jnp.asarray(alpha).astype(cdt).reshape(())
  y = jnp.tanh(a * x.astype(cdt))
  if scale is not None:
    y = y * _expand(scale, x.ndim, axes, cdt)
  if bias is not None:
    y = y + _expand(bias, x.ndim, axes, cdt)
  return y.astype(x.dtype)


def seed_norm(
  x: Float[ArrayLike, "... d"],
  scale: Float[ArrayLike, " d"],
  dyn_scale: Float[ArrayLike, " d"],
  dyn_proj: Float[ArrayLike, " d"],
  *,
  eps: float = 1e-6,
  num_heads: int = 1,
  axis: int = -1,
  dyn_scale_div_dim: bool = False,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "... d"]:
  r"""SeeDNorm: RMSNorm with an input-dependent, bounded rescaling.

  For each token ``x`` (features on ``axis``, width ``D``) and head ``h`` of
  ``H = num_heads`` contiguous chunks,

  .. math::
    s_h(x) = \gamma_h + \alpha_h \tanh(\langle x_h, \beta_h \rangle),\qquad
    y = s(x) \odot \frac{x}{\sqrt{\mathrm{mean}_D(x^2) + \epsilon}}

  where :math:`\gamma` = ``scale``, :math:`\alpha` = ``dyn_scale`` and
  :math:`\beta` = ``dyn_proj``. The RMS is always over the full ``D``. The
  dot product uses the raw (un-normalized) input, so the norm of ``x`` leaks
  into ``y`` but only boundedly: ``|s_i(x) - gamma_i| <= |alpha_i|``.
  ``dyn_proj = 0`` (or ``dyn_scale = 0``) gives RMSNorm with gain ``scale``.
  Paper init: ``scale = 1, dyn_scale = 1, dyn_proj = 0`` (language models).

  Unverified: the paper's full text was not readable when this was written
  (spec: secondary sources that agree). With ``dyn_scale_div_dim`` the dot
  product is divided by ``D`` (the full width) before the tanh; this is our
  reading of the vision-only "divide by the dimension" trick. The vision-only
  dropout on the dynamic term is left to the caller (apply it to the
  module's output difference), since pure functions hide no randomness.

  Args:
    x: input with features on ``axis``.
    scale: :math:`\gamma`, shape ``(D,)``.
    dyn_scale: :math:`\alpha`, shape ``(D,)``.
    dyn_proj: :math:`\beta`, shape ``(D,)``.
    eps: added inside the square root.
    num_heads: number of heads ``H``; must divide ``D``.
    axis: the feature axis.
    dyn_scale_div_dim: divide the dot product by ``D`` before the tanh.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or head count.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  References:
    Cai, Zhu, Liu & Min, *SeeDNorm: Self-Rescaled Dynamic Normalization*,
    arXiv:2510.22777 (2025).
  """
  who = "seed_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  for name, p in (
    ("scale", scale),
    ("dyn_scale", dyn_scale),
    ("dyn_proj", dyn_proj),
  ):
    if p is None:
      raise ValueError(f"{who}: {name} is required, got None")
    _check_param(who, name, p, x, (ax,))
  d = x.shape[ax]
  _checks.check_positive_int(who, "num_heads", num_heads)
  _checks.check_divisible(who, "x.shape[axis]", d, "num_heads", num_heads)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "seed_norm_pallas",
    lambda k: k(
      x,
      scale,
      dyn_scale,
      dyn_proj,
      eps=eps,
      num_heads=num_heads,
      axis=ax,
      dyn_scale_div_dim=dyn_scale_div_dim,
    ),
  )
  if out is not None:
    return out
  cdt = _compute_dtype(x)
  xf = jnp.moveaxis(x.astype(cdt), ax, -1)
  beta = jnp.asarray(dyn_proj).astype(cdt).reshape(num_heads, d // num_heads)
  xh = xf.reshape(*xf.shape[:-1], num_heads, d // num_heads)
  dot = jnp.sum(xh * beta.reshape((1,) * (xf.ndim - 1) + beta.shape), -1)
  if dyn_scale_div_dim:
    dot = dot / d
  t = jnp.repeat(jnp.tanh(dot), d // num_heads, axis=-1)
  last = (xf.ndim - 1,)
  s = (
    _expand(scale, xf.ndim, last, cdt)
    + _expand(dyn_scale, xf.ndim, last, cdt) * t
  )
  ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
  y = s * xf * jax.lax.rsqrt(ms + eps)
  return jnp.moveaxis(y, -1, ax).astype(x.dtype)


# ---------------------------------------------------------------------------
# LayerNorm Scaling.


def layer_norm_scaling(layer_index: int) -> float:
  r"""LayerNorm Scaling factor :math:`1/\sqrt{\ell}` for a 0-based layer.

  The Curse of Depth paper multiplies both pre-norm outputs of block
  :math:`\ell = \mathrm{layer\_index} + 1` by this constant (not learned,
  after the norm's own gain); the final norm is not scaled. Combine it with
  plain (not depth-scaled) initialization.

  Args:
    layer_index: 0-based index of the block.

  Returns:
    ``1 / sqrt(layer_index + 1)``.

  Raises:
    ValueError: for a negative or non-integer ``layer_index``.

  References:
    Sun et al., *The Curse of Depth in Large Language Models*,
    arXiv:2502.05795 (2025).
  """
  if (
    isinstance(layer_index, bool)
    or not isinstance(layer_index, int)
    or (layer_index < 0)
  ):
    raise ValueError(
      "layer_norm_scaling: layer_index must be a non-negative "
      f"integer (0-based), got {layer_index=}"
    )
  return 1.0 / math.sqrt(layer_index + 1)


# ---------------------------------------------------------------------------
# Helpers of the normalization family below.


def _axis_count(axis_name: str | tuple[str, ...] | None) -> int:
  """Number of devices along the mapped ``axis_name`` (1 without one)."""
  return 1 if axis_name is None else jax.lax.axis_size(axis_name)


def _pmean(x: jax.Array, axis_name: str | tuple[str, ...] | None) -> jax.Array:
  return x if axis_name is None else jax.lax.pmean(x, axis_name)


def _psum(x: jax.Array, axis_name: str | tuple[str, ...] | None) -> jax.Array:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _channel(p: ArrayLike, ndim: int, dtype: jnp.dtype) -> jax.Array:
  """A ``(C,)`` vector reshaped to broadcast over a features-last input."""
  return _expand(p, ndim, (ndim - 1,), dtype)


def _check_channels(who: str, x: jax.Array, **params: ArrayLike | None) -> None:
  """Every given parameter is a float vector of length ``x.shape[-1]``."""
  for name, p in params.items():
    _check_param(who, name, p, x, (x.ndim - 1,))


def _check_state(
  who: str, state: tuple, cls: type, shapes: dict[str, tuple[int, ...]]
) -> None:
  """``state`` is a ``cls`` whose named fields have the given shapes."""
  if not isinstance(state, cls):
    raise TypeError(
      f"{who}: state must be a {cls.__name__}, got {type(state).__name__}"
    )
  for name, shape in shapes.items():
    _checks.check_shape(who, f"state.{name}", getattr(state, name), shape)


def _resolve_groups(
  who: str,
  name: str,
  channels: int,
  num_groups: int | None,
  group_size: int | None,
) -> int:
  """The group count from exactly one of ``num_groups`` and ``group_size``."""
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


def _group_var(xf: jax.Array, num_groups: int) -> jax.Array:
  """Biased variance per example and channel group, over all non-batch axes.

  Returns an array shaped like ``xf`` (each channel gets its group's value).
  """
  c = xf.shape[-1]
  xg = xf.reshape(*xf.shape[:-1], num_groups, c // num_groups)
  _, var = _moments(xg, (*range(1, xf.ndim - 1), xf.ndim))
  return jnp.broadcast_to(var, xg.shape).reshape(xf.shape)


# ---------------------------------------------------------------------------
# EvoNorm-B0 and EvoNorm-S0.


class EvoNormB0State(NamedTuple):
  """Running statistic of `evo_norm_b0`.

  Attributes:
    var: running batch variance, shape ``(C,)``, initialized to 1; like
      torch (and timm) it stores the **unbiased** batch variance.
  """

  var: jax.Array


def init_evo_norm_b0_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> EvoNormB0State:
  """`evo_norm_b0` state at initialization: running variance 1."""
  _checks.check_positive_int(
    "init_evo_norm_b0_state", "num_features", num_features
  )
  return EvoNormB0State(var=jnp.ones((num_features,), dtype))


def evo_norm_b0(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  v: Float[ArrayLike, " c"] | None,
  state: EvoNormB0State,
  *,
  training: bool,
  momentum: float = 0.9,
  eps: float = 1e-3,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "n *spatial c"], EvoNormB0State]:
  r"""EvoNorm-B0: batch-dependent normalization-activation layer.

  For channels-last ``x`` (NHWC),

  .. math::
    y = \frac{x}{\max\left(\sqrt{\sigma^2_B + \epsilon},\;
        v \odot x + \sqrt{\sigma^2_I + \epsilon}\right)} \odot \gamma + \beta

  with the element-wise max, :math:`\sigma^2_B[c]` the biased variance over
  batch and spatial axes (training) or the running variance (inference),
  and :math:`\sigma^2_I[n, c]` the per-instance variance over the spatial
  axes, always from the sample. There is no mean subtraction. Training
  updates the running variance with the **unbiased** batch variance
  (torch convention, as in timm):
  :math:`\bar\sigma^2 \leftarrow m \bar\sigma^2 + (1 - m)\,\sigma^2_B
  \frac{n}{n - 1}`, ``n`` the number of values per channel (across devices
  with ``axis_name``).

  ``momentum`` follows the Flax convention (weight of the old value): the
  default 0.9 is timm's ``momentum=0.1``. With ``v=None`` (timm's
  ``apply_act=False``) the layer is only the affine map and the state is
  returned unchanged, as in timm.

  Args:
    x: input ``(n, *spatial, c)`` with at least one spatial axis.
    scale: :math:`\gamma`, shape ``(c,)``, or ``None``.
    bias: :math:`\beta`, shape ``(c,)``, or ``None``.
    v: :math:`v`, shape ``(c,)`` (init 1), or ``None`` for no normalization.
    state: running variance.
    training: batch statistics and a state update when True.
    momentum: decay of the running variance (Flax convention).
    eps: added to both variances (timm default 1e-3).
    axis_name: mapped axis name(s) across which batch statistics are
      averaged (cross-device EvoNorm).

  Returns:
    ``(y, new_state)``: ``y`` with the shape and dtype of ``x``,
    ``new_state`` with the structure and dtypes of ``state``.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 3, bad parameter or state shapes, or a training
      batch with one value per channel.

  References:
    Liu, Brock, Simonyan & Le, *Evolving Normalization-Activation Layers*,
    arXiv:2004.02967 (NeurIPS 2020). Layer formula as in timm's
    ``EvoNorm2dB0``.
  """
  who = "evo_norm_b0"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  _check_channels(who, x, scale=scale, bias=bias, v=v)
  c = x.shape[-1]
  _check_state(who, state, EvoNormB0State, {"var": (c,)})
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  y, new_state = xf, state
  if v is not None:
    if training:
      n = math.prod(x.shape[:-1]) * _axis_count(axis_name)
      if n < 2:
        raise ValueError(
          f"{who}: training needs more than one value per "
          f"channel, got {x.shape=}"
        )
      _, var_b = _moments(xf, tuple(range(x.ndim - 1)), axis_name)
      new_var = momentum * state.var.astype(cdt) + (
        1 - momentum
      ) * var_b.reshape(-1) * (n / (n - 1))
      new_state = EvoNormB0State(var=new_var.astype(state.var.dtype))
    else:
      var_b = _channel(state.var, x.ndim, cdt)
    _, var_i = _moments(xf, tuple(range(1, x.ndim - 1)))
    left = jnp.sqrt(var_b + eps)
    right = _channel(v, x.ndim, cdt) * xf + jnp.sqrt(var_i + eps)
    y = xf / jnp.maximum(left, right)
  if scale is not None:
    y = y * _channel(scale, x.ndim, cdt)
  if bias is not None:
    y = y + _channel(bias, x.ndim, cdt)
  return y.astype(x.dtype), new_state


EvoNormS0Variant = Literal["s0", "s0a"]


def evo_norm_s0(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  v: Float[ArrayLike, " c"] | None,
  *,
  num_groups: int | None = 32,
  group_size: int | None = None,
  eps: float = 1e-5,
  variant: EvoNormS0Variant = "s0",
) -> Float[Array, "n *spatial c"]:
  r"""EvoNorm-S0: sample-based normalization-activation layer (stateless).

  .. math::
    y = \frac{x \odot \mathrm{sigmoid}(v \odot x)}
             {\sqrt{\sigma^2_G + \epsilon}} \odot \gamma + \beta

  with :math:`\sigma^2_G[n, g]` the biased variance per example over the
  spatial axes and the channels of group ``g``. No mean subtraction;
  training and inference are the same.

  timm quirks kept: with ``v=None`` (``apply_act=False``) variant ``"s0"``
  is only the affine map; ``"s0a"`` (timm ``EvoNorm2dS0a``, whose default
  ``eps`` is 1e-3) always divides by the group std, with or without ``v``.

  Args:
    x: input ``(n, *spatial, c)`` with at least one spatial axis.
    scale: :math:`\gamma`, shape ``(c,)``, or ``None``.
    bias: :math:`\beta`, shape ``(c,)``, or ``None``.
    v: :math:`v`, shape ``(c,)`` (init 1), or ``None``.
    num_groups: number of channel groups; give exactly one of this and
      ``group_size``.
    group_size: channels per group.
    eps: added to the group variance (timm: 1e-5 for S0, 1e-3 for S0a).
    variant: ``"s0"`` or ``"s0a"``.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for rank < 3, a bad group configuration, parameter shape or
      variant.

  References:
    Liu, Brock, Simonyan & Le, *Evolving Normalization-Activation Layers*,
    arXiv:2004.02967 (NeurIPS 2020). Layer formula as in timm's
    ``EvoNorm2dS0`` / ``EvoNorm2dS0a``.
  """
  who = "evo_norm_s0"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "variant", variant, ("s0", "s0a"))
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  groups = _resolve_groups(
    who, "x.shape[-1]", x.shape[-1], num_groups, group_size
  )
  _check_channels(who, x, scale=scale, bias=bias, v=v)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  y = xf
  if v is not None:
    y = xf * jax.nn.sigmoid(_channel(v, x.ndim, cdt) * xf)
  if v is not None or variant == "s0a":
    y = y * jax.lax.rsqrt(_group_var(xf, groups) + eps)
  if scale is not None:
    y = y * _channel(scale, x.ndim, cdt)
  if bias is not None:
    y = y + _channel(bias, x.ndim, cdt)
  return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# PowerNorm and Unified Normalization: running statistics in the forward
# pass, approximate backward passes with their own state.
#
# A `jax.custom_vjp` cannot mutate state, so the state its backward pass
# updates (PowerNorm's and UN's gradient statistics) is an explicit input of
# the function, and the backward pass returns the *increment* of that state
# (``new - old``) as its cotangent. A train step differentiates with respect
# to these state fields too, removes them from the gradient tree before the
# optimizer, and adds them to the state. Under gradient accumulation the
# increments of the micro-steps are summed and applied once.


def _check_pad_mask(
  who: str, pad_mask: ArrayLike | None, x: jax.Array
) -> jax.Array | None:
  if pad_mask is None:
    return None
  if jnp.result_type(pad_mask) != jnp.bool_:
    raise TypeError(
      f"{who}: pad_mask must be boolean (True at pads), got "
      f"pad_mask.dtype={jnp.result_type(pad_mask)}"
    )
  _checks.check_shape(who, "pad_mask", pad_mask, x.shape[:-1], "x.shape[:-1]")
  return jnp.asarray(pad_mask)


def _quadratic_mean(
  xf: jax.Array,
  pad_mask: jax.Array | None,
  axis_name: str | tuple[str, ...] | None,
) -> jax.Array:
  """``mean(x**2)`` per channel over non-pad positions, shape ``(C,)``."""
  sq = jnp.square(xf).reshape(-1, xf.shape[-1])
  if pad_mask is None:
    total = jnp.sum(sq, axis=0)
    count = jnp.asarray(sq.shape[0], xf.dtype)
  else:
    valid = jnp.logical_not(pad_mask).reshape(-1, 1).astype(xf.dtype)
    total = jnp.sum(sq * valid, axis=0)
    count = jnp.sum(valid)
  total, count = _psum(total, axis_name), _psum(count, axis_name)
  return jax.lax.stop_gradient(total / jnp.maximum(count, 1.0))


def _all_mean(
  t: jax.Array, axis_name: str | tuple[str, ...] | None
) -> jax.Array:
  """Mean over every position (pads included), per channel, ``(C,)``."""
  return _pmean(jnp.mean(t.reshape(-1, t.shape[-1]), axis=0), axis_name)


class PowerNormState(NamedTuple):
  r"""State of `power_norm`.

  Attributes:
    count: training steps taken, int32 scalar (``t`` after the update).
    running_phi: running quadratic mean :math:`\Phi`, ``(C,)``, init 1.
    grad_ema: backward statistic :math:`\nu`, ``(C,)``, init 0; updated
      only through the backward pass (its cotangent is the increment).
  """

  count: jax.Array
  running_phi: jax.Array
  grad_ema: jax.Array


def init_power_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> PowerNormState:
  """`power_norm` state at initialization: ``t=0, Phi=1, nu=0``."""
  _checks.check_positive_int(
    "init_power_norm_state", "num_features", num_features
  )
  return PowerNormState(
    count=jnp.zeros((), jnp.int32),
    running_phi=jnp.ones((num_features,), dtype),
    grad_ema=jnp.zeros((num_features,), dtype),
  )


BackwardStat = Literal["batch", "running"]


def power_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: PowerNormState,
  *,
  training: bool,
  pad_mask: ArrayLike | None = None,
  eps: float = 1e-5,
  alpha_fwd: float = 0.9,
  alpha_bkw: float = 0.9,
  warmup_iters: int = 10000,
  num_groups: int | None = 1,
  group_eps: float = 1e-5,
  backward_stat: BackwardStat = "batch",
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], PowerNormState]:
  r"""PowerNorm: batch normalization by a running quadratic mean.

  Follows the official code (``sIncerass/powernorm``, ``MaskPowerNorm``).
  Features are last; every other axis is a batch/token axis.

  0. Group scaling (differentiated normally; skipped with
     ``num_groups=None``): per token, each of ``G`` contiguous channel
     groups is divided by :math:`\sqrt{\mathrm{mean}_{group}(x^2) +
     \mathrm{group\_eps}}`. With ``G = 1`` this is an affine-free RMSNorm.
  1. :math:`\psi^2_B[c]` = mean of :math:`x^2` over non-pad positions.
  2. Training (the step counter ``t`` is incremented first):
     :math:`z = x/\sqrt{\psi^2_B + \epsilon}` while ``t <= warmup_iters``,
     else :math:`z = x/\sqrt{\Phi + \epsilon}`; then, if
     ``t < warmup_iters``, :math:`\Phi \leftarrow \Phi (t-1)/t +
     \psi^2_B/t`, and always :math:`\Phi \leftarrow \alpha_f \Phi +
     (1-\alpha_f)\psi^2_B`. Inference: :math:`z = x/\sqrt{\Phi + \epsilon}`.
  3. :math:`y = \gamma \odot z + \beta`. Pads are normalized too.

  Approximate backward (training; a `jax.custom_vjp`):
  :math:`g_z = \gamma \odot g_y`,
  :math:`\tilde g = g_z - (1-\alpha_b)\,\nu \odot z`,
  :math:`\partial L/\partial x = \tilde g / \sqrt{\psi^2_B + \epsilon}` (the
  batch statistic even after warmup, as in the code), and
  :math:`\nu \leftarrow \nu + \mathrm{mean}_{all}(\tilde g \odot z)` (pads
  included). Gradients do not flow through :math:`\psi^2_B`. The increment
  of :math:`\nu` is returned as the cotangent of ``state.grad_ema``: add it
  to the state after the backward pass (see the section comment above);
  ``new_state.grad_ema`` is the unchanged input. In inference the function
  is differentiated normally.

  Unverified: the paper's Algorithm 1 could not be read; its form is
  recalled as dividing by the running statistic in backward, available as
  ``backward_stat="running"`` (the pre-update :math:`\Phi`). The group
  scaling is in the code; whether the paper has it is unverified.
  ``warmup_iters`` defaults to the class default 10000; fairseq's
  ``NormSelect`` passes ``--warmup-updates`` (default 1000).

  Args:
    x: input ``(..., c)``; fairseq's layout is ``(T, B, C)``.
    scale: :math:`\gamma`, ``(c,)`` or ``None``.
    bias: :math:`\beta`, ``(c,)`` or ``None``.
    state: `PowerNormState`.
    training: training step (statistics, state update, custom backward).
    pad_mask: boolean ``x.shape[:-1]``, True at pads (for fairseq's
      ``(B, T)`` mask and ``(T, B, C)`` input pass ``pad_mask.T``).
    eps: added to the statistics.
    alpha_fwd: :math:`\alpha_f`.
    alpha_bkw: :math:`\alpha_b`.
    warmup_iters: steps that normalize with the batch statistic.
    num_groups: groups of the group scaling; ``None`` disables it.
    group_eps: eps of the group scaling (hard-coded 1e-5 in the code).
    backward_stat: ``"batch"`` (code) or ``"running"`` (paper, unverified).
    axis_name: mapped axis name(s): :math:`\psi^2_B` and the :math:`\nu`
      increment are averaged across devices.

  Returns:
    ``(y, new_state)`` with ``y`` shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or parameters, a non-boolean
      ``pad_mask`` or a bad state type.
    ValueError: for bad shapes, group configuration or ``backward_stat``.

  References:
    Shen, Yao, Gholami, Mahoney & Keutzer, *PowerNorm: Rethinking Batch
    Normalization in Transformers*, arXiv:2003.07845 (ICML 2020).
  """
  who = "power_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(
    who, "backward_stat", backward_stat, ("batch", "running")
  )
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _check_channels(who, x, scale=scale, bias=bias)
  _check_state(
    who,
    state,
    PowerNormState,
    {"count": (), "running_phi": (c,), "grad_ema": (c,)},
  )
  pad_mask = _check_pad_mask(who, pad_mask, x)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  if num_groups is not None:
    groups = _resolve_groups(who, "x.shape[-1]", c, num_groups, None)
    xg = xf.reshape(*x.shape[:-1], groups, c // groups)
    xf = rms_norm(xg, eps=group_eps).reshape(x.shape)
  gamma = (
    jnp.ones((c,), cdt) if scale is None else jnp.asarray(scale).astype(cdt)
  )
  beta = jnp.zeros((c,), cdt) if bias is None else jnp.asarray(bias).astype(cdt)
  phi = state.running_phi.astype(cdt)
  if not training:
    y = xf * jax.lax.rsqrt(_channel(phi, x.ndim, cdt) + eps) * _channel(
      gamma, x.ndim, cdt
    ) + _channel(beta, x.ndim, cdt)
    return y.astype(x.dtype), state
  t = state.count + 1
  psi2 = _quadratic_mean(xf, pad_mask, axis_name)
  warm = t <= warmup_iters
  var = jnp.where(warm, psi2, phi)
  denom = psi2 if backward_stat == "batch" else phi
  y = _power_norm_core(
    xf,
    gamma,
    beta,
    state.grad_ema.astype(cdt),
    var,
    denom,
    float(eps),
    float(alpha_bkw),
    axis_name,
  )
  tf = t.astype(cdt)
  phi_c = jnp.where(t < warmup_iters, phi * (tf - 1) / tf + psi2 / tf, phi)
  new_phi = alpha_fwd * phi_c + (1 - alpha_fwd) * psi2
  new_state = PowerNormState(
    count=t.astype(state.count.dtype),
    running_phi=new_phi.astype(state.running_phi.dtype),
    grad_ema=state.grad_ema,
  )
  return y.astype(x.dtype), new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _power_norm_core(x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name):
  return _power_norm_core_fwd(
    x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name
  )[0]


def _power_norm_core_fwd(
  x, gamma, beta, nu, var, denom, eps, alpha_bkw, axis_name
):
  del alpha_bkw, axis_name
  z = x * jax.lax.rsqrt(_channel(var, x.ndim, x.dtype) + eps)
  y = _channel(gamma, x.ndim, x.dtype) * z + _channel(beta, x.ndim, x.dtype)
  return y, (z, gamma, nu, denom)


def _power_norm_core_bwd(eps, alpha_bkw, axis_name, res, dy):
  z, gamma, nu, denom = res
  nd = z.ndim
  dy = dy.astype(z.dtype)
  g = dy * _channel(gamma, nd, z.dtype)
  g_tilde = g - (1 - alpha_bkw) * _channel(nu, nd, z.dtype) * z
  d_nu = _all_mean(g_tilde * z, axis_name)
  dx = g_tilde * jax.lax.rsqrt(_channel(denom, nd, z.dtype) + eps)
  reduce = tuple(range(nd - 1))
  dgamma = jnp.sum(dy * z, axis=reduce)
  dbeta = jnp.sum(dy, axis=reduce)
  return dx, dgamma, dbeta, d_nu.astype(nu.dtype), None, None


_power_norm_core.defvjp(_power_norm_core_fwd, _power_norm_core_bwd)


class UnifiedNormState(NamedTuple):
  r"""State of `unified_norm`.

  Attributes:
    count: training steps taken, int32 scalar.
    skip_count: steps skipped by outlier filtration, int32 scalar.
    running_var: running statistic :math:`\Phi`, ``(C,)``, init 1.
    grad_ema: EMA of the gradient statistic, ``(C,)``, init 0 (backward).
    buf_x2: window of forward statistics, ``(W_f, C)``, init 0.
    buf_gz: window of gradient statistics, ``(W_b, C)``, init 0 (backward).
  """

  count: jax.Array
  skip_count: jax.Array
  running_var: jax.Array
  grad_ema: jax.Array
  buf_x2: jax.Array
  buf_gz: jax.Array


def init_unified_norm_state(
  num_features: int,
  window_size: int | tuple[int, int] = 4,
  dtype: jnp.dtype = jnp.float32,
) -> UnifiedNormState:
  """`unified_norm` state at initialization.

  Args:
    num_features: channels ``C``.
    window_size: ``W`` for both windows, or ``(W_f, W_b)``.
    dtype: dtype of the float fields.

  Returns:
    The state (counters 0, ``running_var`` 1, everything else 0).

  Raises:
    ValueError: for a non-positive size or a malformed ``window_size``.
  """
  who = "init_unified_norm_state"
  _checks.check_positive_int(who, "num_features", num_features)
  if isinstance(window_size, (tuple, list)):
    if len(window_size) != 2:
      raise ValueError(
        f"{who}: window_size must be an int or a pair "
        f"(W_f, W_b), got {window_size=}"
      )
    w_f, w_b = window_size
  else:
    w_f = w_b = window_size
  _checks.check_positive_int(who, "window_size", w_f)
  _checks.check_positive_int(who, "window_size", w_b)
  zero = jnp.zeros((), jnp.int32)
  return UnifiedNormState(
    count=zero,
    skip_count=zero,
    running_var=jnp.ones((num_features,), dtype),
    grad_ema=jnp.zeros((num_features,), dtype),
    buf_x2=jnp.zeros((w_f, num_features), dtype),
    buf_gz=jnp.zeros((w_b, num_features), dtype),
  )


def unified_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: UnifiedNormState,
  *,
  training: bool,
  pad_mask: ArrayLike | None = None,
  warmup_iters: int = 4000,
  eps: float = 1e-5,
  momentum: float = 0.9,
  outlier_filtration: bool = False,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], UnifiedNormState]:
  r"""Unified Normalization (UN): smoothed batch statistics for Transformers.

  Follows the official code (``hikvision-research/Unified-Normalization``,
  ``UN1d``/``UN2dFunction``); the window sizes ``W_f, W_b`` are the first
  dimensions of ``state.buf_x2`` and ``state.buf_gz``. Training, with ``t``
  incremented first and :math:`\psi^2_B` the mean of :math:`x^2` over
  non-pad positions:

  1. ``r_var``: unbiased variance of all entries of
     :math:`\sqrt{\mathrm{buf\_x2}}` (before the insertion), then
     ``buf_x2[t % W_f] = psi2``.
  2. Adaptive outlier filtration (``outlier_filtration`` and
     ``t >= warmup_iters``): with the window's arithmetic mean ``AM`` and
     geometric mean ``GM``, if any channel has ``AM - GM > r_var * W_f``
     the step is skipped: ``buf_x2[t % W_f] = running_var`` and
     ``skip_count += 1``. ``W_f <= 1`` always skips.
  3. Fluctuation smoothing: :math:`\sigma^2 = \psi^2_B` if ``t <= W_f``,
     ``t < warmup_iters`` or skipped, else the window's geometric mean.
  4. Gradient compensation :math:`r = \sqrt{\sigma^2+\epsilon}/
     \sqrt{\Phi+\epsilon}`, forced to 1 while ``t <= max(1000, warmup)`` or
     when skipped, else clipped to ``[1/5, 5]``.
  5. :math:`z = x/\sqrt{\sigma^2+\epsilon}`, :math:`y = \gamma z + \beta`,
     :math:`\Phi \leftarrow m\Phi + (1-m)\sigma^2`.

  Custom backward (a `jax.custom_vjp`): :math:`g = r\,\gamma \odot g_y`,
  ``gz = mean_all(g * z)``, ``buf_gz[t % W_b] = ema_gz if skip else gz``,
  :math:`\mu_g` = ``gz`` if ``t <= W_b``, ``t < warmup`` or skipped, else
  the mean of ``buf_gz``; ``ema_gz = m ema_gz + (1-m) mu_g``;
  :math:`\tilde g = g - (\mu_g` if skipped else ``ema_gz``:math:`) \odot z`;
  :math:`\partial L/\partial x = \tilde g/\sqrt{\sigma^2+\epsilon}`,
  :math:`\partial L/\partial\gamma = \sum g_y \odot r z`,
  :math:`\partial L/\partial\beta = \sum g_y`. The increments of
  ``grad_ema`` and ``buf_gz`` are returned as their cotangents (see the
  section comment above); ``new_state`` carries their input values.

  Inference: :math:`y = \gamma \odot x/\sqrt{\Phi+\epsilon} + \beta`, a
  fixed affine map (`fold_unified_norm` folds it into a linear layer).

  Unverified: the paper's equations were not re-read; the code is
  normative (it produced the published numbers).

  Args:
    x: input ``(..., c)`` (the code's layout is ``(B, N, C)``).
    scale: :math:`\gamma`, ``(c,)`` or ``None``.
    bias: :math:`\beta`, ``(c,)`` or ``None``.
    state: `UnifiedNormState` (from `init_unified_norm_state`).
    training: training step (statistics, state update, custom backward).
    pad_mask: boolean ``x.shape[:-1]``, True at pads.
    warmup_iters: steps before smoothing (code default 4000).
    eps: added to the statistics.
    momentum: EMA decay ``m`` of ``running_var`` and ``grad_ema``.
    outlier_filtration: enable step 2 (False for NLP, True for CV).
    axis_name: mapped axis name(s): :math:`\psi^2_B` and ``gz`` are averaged
      across devices.

  Returns:
    ``(y, new_state)`` with ``y`` shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or parameters, a non-boolean
      ``pad_mask`` or a bad state type.
    ValueError: for bad shapes.

  References:
    Yang et al., *Unified Normalization for Accelerating and Stabilizing
    Transformers*, arXiv:2208.01313 (ACM MM 2022).
  """
  who = "unified_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _check_channels(who, x, scale=scale, bias=bias)
  if not isinstance(state, UnifiedNormState):
    raise TypeError(
      f"{who}: state must be a UnifiedNormState, got {type(state).__name__}"
    )
  w_f, w_b = state.buf_x2.shape[0], state.buf_gz.shape[0]
  _check_state(
    who,
    state,
    UnifiedNormState,
    {
      "count": (),
      "skip_count": (),
      "running_var": (c,),
      "grad_ema": (c,),
      "buf_x2": (w_f, c),
      "buf_gz": (w_b, c),
    },
  )
  pad_mask = _check_pad_mask(who, pad_mask, x)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  gamma = (
    jnp.ones((c,), cdt) if scale is None else jnp.asarray(scale).astype(cdt)
  )
  beta = jnp.zeros((c,), cdt) if bias is None else jnp.asarray(bias).astype(cdt)
  phi = state.running_var.astype(cdt)
  if not training:
    y = xf * jax.lax.rsqrt(_channel(phi, x.ndim, cdt) + eps) * _channel(
      gamma, x.ndim, cdt
    ) + _channel(beta, x.ndim, cdt)
    return y.astype(x.dtype), state
  t = state.count + 1
  psi2 = _quadratic_mean(xf, pad_mask, axis_name)
  buf = state.buf_x2.astype(cdt)
  r_var = jnp.var(jnp.sqrt(buf), ddof=1) if buf.size > 1 else jnp.nan
  slot = t % w_f
  buf = buf.at[slot].set(psi2)
  skip = jnp.asarray(w_f <= 1)
  outlier = jnp.asarray(False)
  if outlier_filtration:
    am = jnp.mean(buf, axis=0)
    gm = jnp.exp(jnp.mean(jnp.log(buf), axis=0))
    outlier = jnp.logical_and(t >= warmup_iters, jnp.any(am - gm > r_var * w_f))
    buf = jnp.where(outlier, buf.at[slot].set(phi), buf)
    skip = jnp.logical_or(skip, outlier)
  gm = jnp.exp(jnp.mean(jnp.log(buf), axis=0))
  use_batch = (t <= w_f) | (t < warmup_iters) | skip
  var = jnp.where(use_batch, psi2, gm)
  r = jnp.sqrt(var + eps) / jnp.sqrt(phi + eps)
  r = jnp.where(
    (t <= max(1000, warmup_iters)) | skip,
    jnp.ones_like(r),
    jnp.clip(r, 1 / 5, 5),
  )
  y = _unified_norm_core(
    xf,
    gamma,
    beta,
    state.grad_ema.astype(cdt),
    state.buf_gz.astype(cdt),
    var,
    r,
    t,
    skip,
    float(eps),
    float(momentum),
    int(warmup_iters),
    axis_name,
  )
  new_state = UnifiedNormState(
    count=t.astype(state.count.dtype),
    skip_count=(state.skip_count + outlier.astype(state.skip_count.dtype)),
    running_var=(momentum * phi + (1 - momentum) * var).astype(
      state.running_var.dtype
    ),
    grad_ema=state.grad_ema,
    buf_x2=buf.astype(state.buf_x2.dtype),
    buf_gz=state.buf_gz,
  )
  return y.astype(x.dtype), new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12))
def _unified_norm_core(
  x,
  gamma,
  beta,
  ema_gz,
  buf_gz,
  var,
  r,
  t,
  skip,
  eps,
  momentum,
  warmup,
  axis_name,
):
  return _unified_norm_core_fwd(
    x,
    gamma,
    beta,
    ema_gz,
    buf_gz,
    var,
    r,
    t,
    skip,
    eps,
    momentum,
    warmup,
    axis_name,
  )[0]


def _unified_norm_core_fwd(
  x,
  gamma,
  beta,
  ema_gz,
  buf_gz,
  var,
  r,
  t,
  skip,
  eps,
  momentum,
  warmup,
  axis_name,
):
  del momentum, warmup, axis_name
  z = x * jax.lax.rsqrt(_channel(var, x.ndim, x.dtype) + eps)
  y = _channel(gamma, x.ndim, x.dtype) * z + _channel(beta, x.ndim, x.dtype)
  return y, (z, gamma, ema_gz, buf_gz, var, r, t, skip)


def _unified_norm_core_bwd(eps, momentum, warmup, axis_name, res, dy):
  z, gamma, ema_gz, buf_gz, var, r, t, skip = res
  nd, cdt = z.ndim, z.dtype
  dy = dy.astype(cdt)
  g = dy * _channel(r * gamma, nd, cdt)
  gz = _all_mean(g * z, axis_name)
  w_b = buf_gz.shape[0]
  new_buf = buf_gz.at[t % w_b].set(jnp.where(skip, ema_gz, gz))
  batch = (t <= w_b) | (t < warmup) | skip
  mu_g = jnp.where(batch, gz, jnp.mean(new_buf, axis=0))
  new_ema = momentum * ema_gz + (1 - momentum) * mu_g
  sub = jnp.where(skip, mu_g, new_ema)
  g_tilde = g - _channel(sub, nd, cdt) * z
  dx = g_tilde * jax.lax.rsqrt(_channel(var, nd, cdt) + eps)
  reduce = tuple(range(nd - 1))
  dgamma = jnp.sum(dy * z, axis=reduce) * r
  dbeta = jnp.sum(dy, axis=reduce)
  return (
    dx,
    dgamma,
    dbeta,
    new_ema - ema_gz,
    new_buf - buf_gz,
    None,
    None,
    None,
    None,
  )


_unified_norm_core.defvjp(_unified_norm_core_fwd, _unified_norm_core_bwd)


def fold_unified_norm(
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  running_var: Float[ArrayLike, " c"],
  kernel: Float[ArrayLike, "a b"],
  kernel_bias: Float[ArrayLike, " d"] | None = None,
  *,
  eps: float = 1e-5,
  position: Literal["next", "previous"] = "next",
) -> tuple[Float[Array, "a b"], Float[Array, " d"]]:
  r"""Folds an inference-mode UN layer into an adjacent linear layer.

  Inference UN is :math:`y = s \odot x + \beta` with
  :math:`s = \gamma/\sqrt{\Phi + \epsilon}`. For a linear layer
  ``h @ kernel + kernel_bias`` (Flax layout, ``kernel`` is
  ``(d_in, d_out)``):

  * ``position="next"`` (UN then linear, ``d_in = c``):
    :math:`W \leftarrow \mathrm{diag}(s) W`,
    :math:`b \leftarrow b + \beta W`;
  * ``position="previous"`` (linear then UN, ``d_out = c``):
    :math:`W \leftarrow W \mathrm{diag}(s)`,
    :math:`b \leftarrow b \odot s + \beta`.

  The same folding holds for any per-channel affine inference norm
  (BatchNorm, PowerNorm with ``running_var`` = :math:`\Phi` and no group
  scaling).

  Args:
    scale: :math:`\gamma` ``(c,)`` or ``None`` (ones).
    bias: :math:`\beta` ``(c,)`` or ``None`` (zeros).
    running_var: :math:`\Phi` ``(c,)`` (``state.running_var``).
    kernel: ``(d_in, d_out)`` weight of the adjacent linear layer.
    kernel_bias: ``(d_out,)`` bias or ``None`` (zeros).
    eps: the UN layer's eps.
    position: where the linear layer sits relative to the UN layer.

  Returns:
    ``(kernel, kernel_bias)`` of the fused linear layer, float32 or wider.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for inconsistent shapes or a bad ``position``.

  References:
    Yang et al., *Unified Normalization for Accelerating and Stabilizing
    Transformers*, arXiv:2208.01313 (ACM MM 2022).
  """
  who = "fold_unified_norm"
  _checks.check_choice(who, "position", position, ("next", "previous"))
  _checks.check_floating(who, "kernel", kernel)
  _checks.check_floating(who, "running_var", running_var)
  kernel = jnp.asarray(kernel)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  d_in, d_out = kernel.shape
  c = d_in if position == "next" else d_out
  for name, p in (
    ("scale", scale),
    ("bias", bias),
    ("running_var", running_var),
  ):
    if p is not None:
      _checks.check_floating(who, name, p)
      _checks.check_shape(
        who,
        name,
        p,
        (c,),
        "kernel.shape[0]" if position == "next" else "kernel.shape[1]",
      )
  if kernel_bias is not None:
    _checks.check_floating(who, "kernel_bias", kernel_bias)
    _checks.check_shape(
      who, "kernel_bias", kernel_bias, (d_out,), "kernel.shape[1]"
    )
  cdt = _compute_dtype(kernel)
  w = kernel.astype(cdt)
  gamma = (
    jnp.ones((c,), cdt) if scale is None else jnp.asarray(scale).astype(cdt)
  )
  beta = jnp.zeros((c,), cdt) if bias is None else jnp.asarray(bias).astype(cdt)
  b = (
    jnp.zeros((d_out,), cdt)
    if kernel_bias is None
    else jnp.asarray(kernel_bias).astype(cdt)
  )
  s = gamma * jax.lax.rsqrt(jnp.asarray(running_var).astype(cdt) + eps)
  if position == "next":
    return w * s.reshape(-1, 1), b + beta @ w
  return w * s.reshape(1, -1), b * s + beta


# ---------------------------------------------------------------------------
# Region Normalization (RN-B, RN-L).


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
    ValueError: if ``spatial_shape`` does not match the spatial rank or has
      non-positive sizes.
  """
  who = "resize_mask_nearest"
  mask = jnp.asarray(mask)
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
  mask gets no gradient.

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

  References:
    Yu et al., *Region Normalization for Image Inpainting*,
    arXiv:1911.10375 (AAAI 2020).
  """
  who = "region_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  mask = _check_mask(who, mask, x)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  m = jnp.broadcast_to(jax.lax.stop_gradient(mask.astype(cdt)), x.shape)
  axes = tuple(range(x.ndim - 1))
  n_tot = math.prod(x.shape[:-1]) * _axis_count(axis_name)
  y = jnp.zeros_like(xf)
  for region in (m, 1.0 - m):
    count = jnp.maximum(_psum(jnp.sum(region, axis=axes), axis_name), 1.0)
    count = _channel(count, x.ndim, cdt)
    mean = (
      _psum(jnp.sum(xf * region, axis=axes, keepdims=True), axis_name) / count
    )
    var = (
      _psum(
        jnp.sum(jnp.square(xf - mean) * region, axis=axes, keepdims=True),
        axis_name,
      )
      / count
    )
    y = y + region * (xf - mean) * jax.lax.rsqrt(var + eps * n_tot / count)
  return y.astype(x.dtype)


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

  References:
    Yu et al., *Region Normalization for Image Inpainting*,
    arXiv:1911.10375 (AAAI 2020).
  """
  who = "region_norm_b"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  _check_channels(
    who,
    x,
    scale_fg=scale_fg,
    bias_fg=bias_fg,
    scale_bg=scale_bg,
    bias_bg=bias_bg,
  )
  mask = _check_mask(who, mask, x)
  cdt = _compute_dtype(x)
  rn = region_norm(x.astype(cdt), mask, eps=eps, axis_name=axis_name)
  m = jnp.broadcast_to(jax.lax.stop_gradient(mask.astype(cdt)), x.shape)
  p = {
    k: _channel(v, x.ndim, cdt)
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
  cdt = _compute_dtype(x)
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


# ---------------------------------------------------------------------------
# UnMix-TNS.


class UnMixTNSState(NamedTuple):
  r"""The ``K`` statistic components of `unmix_tns`.

  Attributes:
    mean: component means :math:`\mu_k`, ``(K, C)``.
    var: component variances :math:`\sigma^2_k`, ``(K, C)``.
  """

  mean: jax.Array
  var: jax.Array


def init_unmix_tns_state(
  mean: Float[ArrayLike, " c"],
  var: Float[ArrayLike, " c"],
  key: jax.Array,
  *,
  num_components: int = 16,
  spread: float = 0.5,
  dtype: jnp.dtype = jnp.float32,
) -> UnMixTNSState:
  r"""UnMix-TNS components from a trained BatchNorm's running statistics.

  For ``K > 1``: :math:`\mu_k = \mu_s + \sqrt{cK/(K-1)}\,\sigma_s \odot
  \xi_k`, :math:`\xi_k \sim N(0, I)`, and :math:`\sigma^2_k =
  (1-c)\sigma^2_s` (``c = spread``), so the mixture of the components has
  the source statistics on average. ``K = 1`` copies the source statistics.

  Args:
    mean: BN running mean :math:`\mu_s`, ``(c,)``.
    var: BN running variance :math:`\sigma^2_s`, ``(c,)``.
    key: PRNG key of the noise :math:`\xi`.
    num_components: ``K`` (16 for single/continual shifts, 128 for mixed).
    spread: ``c`` in ``[0, 1)``.
    dtype: state dtype.

  Returns:
    `UnMixTNSState` with ``(K, c)`` fields.

  Raises:
    TypeError: for non-floating statistics.
    ValueError: for a bad ``num_components`` or mismatched shapes.

  References:
    Tomar, Vray, Thiran & Bozorgtabar, *Un-Mixing Test-Time Normalization
    Statistics: Combatting Label Temporal Correlation*, ICLR 2024.
  """
  who = "init_unmix_tns_state"
  _checks.check_positive_int(who, "num_components", num_components)
  _checks.check_floating(who, "mean", mean)
  _checks.check_floating(who, "var", var)
  _checks.check_ndim(who, "mean", mean, expected=1)
  _checks.check_shape(who, "var", var, jnp.shape(mean), "mean.shape")
  mu = jnp.asarray(mean, jnp.float32)
  sigma2 = jnp.asarray(var, jnp.float32)
  k, c = num_components, mu.shape[0]
  if k == 1:
    return UnMixTNSState(
      mu.reshape(1, c).astype(dtype), sigma2.reshape(1, c).astype(dtype)
    )
  noise = jax.random.normal(key, (k, c), jnp.float32)
  means = (
    mu.reshape(1, c)
    + math.sqrt(spread * k / (k - 1)) * jnp.sqrt(sigma2).reshape(1, c) * noise
  )
  variances = jnp.broadcast_to((1 - spread) * sigma2.reshape(1, c), (k, c))
  return UnMixTNSState(means.astype(dtype), variances.astype(dtype))


def unmix_tns_momentum(
  batch_size: int, *, max_batch_size: int = 64, bn_momentum: float = 0.1
) -> float:
  r"""UnMix-TNS update rate :math:`M = 1 - (1 - m)^{B/B_{max}}`.

  ``bn_momentum`` is torch's (weight of the new batch; Flax's momentum
  ``0.9`` is torch's 0.1). ``max_batch_size`` is 64 (CIFAR) or 16
  (ImageNet).

  Raises:
    ValueError: for non-positive batch sizes.
  """
  who = "unmix_tns_momentum"
  _checks.check_positive_int(who, "batch_size", batch_size)
  _checks.check_positive_int(who, "max_batch_size", max_batch_size)
  return 1.0 - (1.0 - bn_momentum) ** (batch_size / max_batch_size)


def unmix_tns(
  x: Float[ArrayLike, "b *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: UnMixTNSState,
  *,
  momentum: float | None = None,
  temperature: float = 0.07,
  eps: float = 1e-5,
  update: bool = True,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "b *spatial c"], UnMixTNSState]:
  r"""UnMix-TNS: test-time normalization with ``K`` un-mixed components.

  For a batch ``x`` with instance statistics :math:`\tilde\mu_b,
  \tilde\sigma^2_b` (over the spatial axes, biased):

  1. :math:`p_{bk} = \mathrm{softmax}_k(\cos(\tilde\mu_b, \mu_k)/\tau)`,
     without gradient;
  2. :math:`m_{bk} = (1-p_{bk})\mu_k + p_{bk}\tilde\mu_b`,
     :math:`v_{bk} = (1-p_{bk})\sigma^2_k + p_{bk}\tilde\sigma^2_b`;
  3. :math:`\mu_b = \mathrm{mean}_k m_{bk}`, :math:`\sigma^2_b =
     \mathrm{mean}_k v_{bk} + \mathrm{mean}_k m_{bk}^2 - \mu_b^2`;
  4. :math:`y = \gamma (x - \mu_b)/\sqrt{\sigma^2_b + \epsilon} + \beta`;
  5. with ``update``, without gradient and from the old components:
     :math:`\mu_k \mathrel{+}= M\,\mathrm{mean}_b(p_{bk}(\tilde\mu_b -
     \mu_k))`, :math:`\sigma^2_k \mathrel{+}= M\,\mathrm{mean}_b(p_{bk}
     (\tilde\sigma^2_b - \sigma^2_k))` (not normalized by
     :math:`\sum_b p_{bk}`).

  Gradients flow into ``x`` through the instance statistics (for TENT-like
  adaptation), not through ``p``. There is no train/eval distinction.
  The cosine similarity is :math:`a\cdot b/\max(\|a\|\|b\|, 10^{-8})`
  (torch's ``cosine_similarity`` eps).

  Args:
    x: input ``(b, *spatial, c)`` with at least one spatial axis.
    scale: :math:`\gamma` (the replaced BN's scale) or ``None``.
    bias: :math:`\beta` (the replaced BN's bias) or ``None``.
    state: the components.
    momentum: :math:`M`; ``None`` uses `unmix_tns_momentum` of the (global)
      batch size with its defaults.
    temperature: :math:`\tau`.
    eps: the replaced BN's eps.
    update: apply step 5.
    axis_name: mapped axis name(s): the component update averages over the
      global batch.

  Returns:
    ``(y, new_state)``; ``y`` like ``x``, the state keeps its dtypes.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 3 or bad shapes.

  References:
    Tomar, Vray, Thiran & Bozorgtabar, *Un-Mixing Test-Time Normalization
    Statistics: Combatting Label Temporal Correlation*, ICLR 2024
    (OpenReview xyxU99Nutg); code ``devavratTomar/unmixtns``.
  """
  who = "unmix_tns"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  c = x.shape[-1]
  _check_channels(who, x, scale=scale, bias=bias)
  if not isinstance(state, UnMixTNSState):
    raise TypeError(
      f"{who}: state must be a UnMixTNSState, got {type(state).__name__}"
    )
  k = state.mean.shape[0] if state.mean.ndim == 2 else -1
  _check_state(who, state, UnMixTNSState, {"mean": (k, c), "var": (k, c)})
  if momentum is None:
    momentum = unmix_tns_momentum(x.shape[0] * _axis_count(axis_name))
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  b = x.shape[0]
  inst_mean, inst_var = _moments(xf, tuple(range(1, x.ndim - 1)))
  mu_t, var_t = inst_mean.reshape(b, c), inst_var.reshape(b, c)
  mu_k, var_k = state.mean.astype(cdt), state.var.astype(cdt)
  mu_sg = jax.lax.stop_gradient(mu_t)
  dots = mu_sg @ mu_k.T
  norms_ = jnp.linalg.norm(mu_sg, axis=-1).reshape(b, 1) * jnp.linalg.norm(
    mu_k, axis=-1
  ).reshape(1, k)
  p = jax.nn.softmax(dots / jnp.maximum(norms_, 1e-8) / temperature, axis=-1)
  p = jax.lax.stop_gradient(p).reshape(b, k, 1)
  m = (1 - p) * mu_k.reshape(1, k, c) + p * mu_t.reshape(b, 1, c)
  v = (1 - p) * var_k.reshape(1, k, c) + p * var_t.reshape(b, 1, c)
  mu_b = jnp.mean(m, axis=1)
  var_b = (
    jnp.mean(v, axis=1) + jnp.mean(jnp.square(m), axis=1) - jnp.square(mu_b)
  )
  shape = (b,) + (1,) * (x.ndim - 2) + (c,)
  y = (xf - mu_b.reshape(shape)) * jax.lax.rsqrt(var_b.reshape(shape) + eps)
  if scale is not None:
    y = y * _channel(scale, x.ndim, cdt)
  if bias is not None:
    y = y + _channel(bias, x.ndim, cdt)
  new_state = state
  if update:
    mu_d = jax.lax.stop_gradient(mu_t).reshape(b, 1, c) - mu_k.reshape(1, k, c)
    var_d = jax.lax.stop_gradient(var_t).reshape(b, 1, c) - var_k.reshape(
      1, k, c
    )
    new_state = UnMixTNSState(
      mean=(
        mu_k + momentum * _pmean(jnp.mean(p * mu_d, axis=0), axis_name)
      ).astype(state.mean.dtype),
      var=(
        var_k + momentum * _pmean(jnp.mean(p * var_d, axis=0), axis_name)
      ).astype(state.var.dtype),
    )
  return y.astype(x.dtype), new_state


# ---------------------------------------------------------------------------
# L1 normalization.

L1_KAPPA = math.sqrt(math.pi / 2)


def _l1_denominator(
  s1: jax.Array, kappa: float, eps: float, eps_mode: str
) -> jax.Array:
  if eps_mode == "outside":
    return kappa * s1 + eps
  return jnp.sqrt(jnp.square(kappa * s1) + eps)


def l1_layer_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-5,
  axis: Axis = -1,
  kappa: float = L1_KAPPA,
  eps_mode: EpsMode = "outside",
) -> Float[Array, "..."]:
  r"""L1 layer normalization: the mean absolute deviation replaces the std.

  .. math::
    \mu = \mathrm{mean}_{axis}(x),\quad
    s_1 = \mathrm{mean}_{axis}(|x - \mu|),\quad
    y = \gamma \odot \frac{x - \mu}{\kappa s_1 + \epsilon} + \beta

  :math:`\kappa = \sqrt{\pi/2}` makes :math:`\kappa s_1 \approx \sigma` for
  Gaussian data. ``eps_mode="inside"`` uses
  :math:`\sqrt{(\kappa s_1)^2 + \epsilon}` instead.

  Unverified: the paper's exact layer (constants, ``kappa``, where ``eps``
  sits) could not be read (abstract only, no code); this is the standard
  L1 norm of Hoffer et al., *Norm matters*, arXiv:1803.01814 (2018).
  Gradients are plain autodiff (:math:`d|u|/du = \mathrm{sign}(u)`).

  Args:
    x: input of any rank.
    scale: gain over ``axis`` or ``None``.
    bias: offset over ``axis`` or ``None``.
    eps: stabilizer, placed according to ``eps_mode``.
    axis: axis or axes to normalize over.
    kappa: :math:`\kappa`.
    eps_mode: ``"outside"`` (default) or ``"inside"``.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or ``eps_mode``.

  References:
    Guo et al., *Towards Accurate and Efficient Sub-8-Bit Integer Training*,
    arXiv:2411.10948 (2024).
  """
  who = "l1_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, EPS_MODES)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  mu = jnp.mean(xf, axis=axes, keepdims=True)
  s1 = jnp.mean(jnp.abs(xf - mu), axis=axes, keepdims=True)
  y = (xf - mu) / _l1_denominator(s1, kappa, eps, eps_mode)
  if scale is not None:
    y = y * _expand(scale, x.ndim, axes, cdt)
  if bias is not None:
    y = y + _expand(bias, x.ndim, axes, cdt)
  return y.astype(x.dtype)


class L1BatchNormState(NamedTuple):
  """Running statistics of `l1_batch_norm`.

  Attributes:
    mean: running mean, ``(C,)``, init 0.
    dev: running ``kappa * s1`` (the L1 estimate of the std), ``(C,)``,
      init 1.
  """

  mean: jax.Array
  dev: jax.Array


def init_l1_batch_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> L1BatchNormState:
  """`l1_batch_norm` state at initialization: mean 0, deviation 1."""
  _checks.check_positive_int(
    "init_l1_batch_norm_state", "num_features", num_features
  )
  return L1BatchNormState(
    mean=jnp.zeros((num_features,), dtype), dev=jnp.ones((num_features,), dtype)
  )


def l1_batch_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: L1BatchNormState,
  *,
  training: bool,
  momentum: float = 0.99,
  eps: float = 1e-5,
  kappa: float = L1_KAPPA,
  eps_mode: EpsMode = "outside",
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], L1BatchNormState]:
  r"""L1 batch normalization with running statistics (features last).

  Training uses the batch :math:`\mu` and :math:`d = \kappa\,
  \mathrm{mean}(|x - \mu|)` over every axis but the last, normalizes
  :math:`y = \gamma (x - \mu)/(d + \epsilon) + \beta` and updates
  :math:`\bar\mu \leftarrow m\bar\mu + (1-m)\mu`,
  :math:`\bar d \leftarrow m\bar d + (1-m)d` (Flax momentum convention);
  inference uses the running values. ``eps_mode="inside"`` uses
  :math:`\sqrt{d^2 + \epsilon}`. Unverified details as in `l1_layer_norm`.

  Args:
    x: input ``(..., c)``.
    scale: per-channel gain or ``None``.
    bias: per-channel offset or ``None``.
    state: running statistics.
    training: batch statistics and a state update when True.
    momentum: decay of the running statistics.
    eps: stabilizer.
    kappa: :math:`\kappa`.
    eps_mode: ``"outside"`` or ``"inside"``.
    axis_name: mapped axis name(s) for cross-device batch statistics.

  Returns:
    ``(y, new_state)``.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 2, bad shapes or ``eps_mode``.

  References:
    Guo et al., *Towards Accurate and Efficient Sub-8-Bit Integer Training*,
    arXiv:2411.10948 (2024); Hoffer et al., *Norm matters*,
    arXiv:1803.01814 (2018).
  """
  who = "l1_batch_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, EPS_MODES)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _check_channels(who, x, scale=scale, bias=bias)
  _check_state(who, state, L1BatchNormState, {"mean": (c,), "dev": (c,)})
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  axes = tuple(range(x.ndim - 1))
  if training:
    mu = _pmean(jnp.mean(xf, axis=axes, keepdims=True), axis_name)
    dev = kappa * _pmean(
      jnp.mean(jnp.abs(xf - mu), axis=axes, keepdims=True), axis_name
    )
    new_state = L1BatchNormState(
      mean=(
        momentum * state.mean.astype(cdt) + (1 - momentum) * mu.reshape(-1)
      ).astype(state.mean.dtype),
      dev=(
        momentum * state.dev.astype(cdt)
        + (1 - momentum) * jax.lax.stop_gradient(dev).reshape(-1)
      ).astype(state.dev.dtype),
    )
  else:
    mu = _channel(state.mean, x.ndim, cdt)
    dev = _channel(state.dev, x.ndim, cdt)
    new_state = state
  y = (xf - mu) / _l1_denominator(dev, 1.0, eps, eps_mode)
  if scale is not None:
    y = y * _channel(scale, x.ndim, cdt)
  if bias is not None:
    y = y + _channel(bias, x.ndim, cdt)
  return y.astype(x.dtype), new_state


# ---------------------------------------------------------------------------
# Scale vectors: branch-specific scales, dual placement, magnitude-direction.


def magnitude_direction_scale(
  magnitude: Float[ArrayLike, " *one"],
  direction: Float[ArrayLike, " d"],
) -> Float[Array, " d"]:
  r"""A scale vector written as magnitude times unit direction.

  .. math:: \gamma = m \cdot \frac{u}{\|u\|_2} \sqrt{d}

  so ``magnitude = 1`` and ``direction = 1`` give :math:`\gamma = 1`.

  Unverified: the paper's OR / ER reparameterizations could not be read
  (abstract and digests only); this is one reading of "a global scalar
  magnitude times a direction vector". :math:`\|u\|` is clamped at 1e-12.

  Args:
    magnitude: scalar :math:`m`, shape ``()`` or ``(1,)``.
    direction: :math:`u`, shape ``(d,)``.

  Returns:
    :math:`\gamma`, shape ``(d,)``, in ``direction``'s dtype promoted to at
    least float32.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for a non-scalar magnitude or non-vector direction.

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "magnitude_direction_scale"
  _checks.check_floating(who, "magnitude", magnitude)
  _checks.check_floating(who, "direction", direction)
  if math.prod(jnp.shape(magnitude)) != 1 or jnp.ndim(magnitude) > 1:
    raise ValueError(
      f"{who}: magnitude must be a scalar of shape () or "
      f"(1,), got magnitude.shape={jnp.shape(magnitude)}"
    )
  _checks.check_ndim(who, "direction", direction, expected=1)
  u = jnp.asarray(direction)
  cdt = _compute_dtype(u)
  u = u.astype(cdt)
  m = jnp.asarray(magnitude).astype(cdt).reshape(())
  norm = jnp.maximum(jnp.linalg.norm(u), 1e-12)
  return m * u / norm * math.sqrt(u.shape[0])


def branch_rms_norm(
  x: Float[ArrayLike, "... d"],
  scales: Sequence[Float[ArrayLike, " d"]],
  *,
  eps: float = 1e-6,
  eps_mode: EpsMode = "inside",
) -> tuple[Float[Array, "... d"], ...]:
  r"""One affine-free RMSNorm read by several branches, each with its scale.

  Branch-specific heterogeneity (HG): instead of one scale shared by the
  readers of a norm (Q, K, V; or gate and up), reader ``i`` gets
  :math:`\gamma_i \odot \mathrm{RMS}(x)`. The function class is the same
  (each :math:`\gamma_i` folds into its reader's weight); the
  preconditioning differs. With equal scales every branch equals
  ``rms_norm(x, scale)``.

  Args:
    x: input ``(..., d)``.
    scales: one ``(d,)`` scale per branch.
    eps: RMSNorm eps.
    eps_mode: RMSNorm eps placement.

  Returns:
    A tuple with one array per branch, each shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or scales.
    ValueError: for no scales or a bad scale shape.

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "branch_rms_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  scales = tuple(scales)
  if not scales:
    raise ValueError(
      f"{who}: scales must hold at least one (d,) vector, got {len(scales)}"
    )
  for i, s in enumerate(scales):
    _check_param(who, f"scales[{i}]", s, x, (x.ndim - 1,))
  cdt = _compute_dtype(x)
  n = rms_norm(x.astype(cdt), eps=eps, eps_mode=eps_mode)
  return tuple((n * _channel(s, x.ndim, cdt)).astype(x.dtype) for s in scales)


def dual_scaled_linear(
  x: Float[ArrayLike, "... d_in"],
  kernel: Float[ArrayLike, "d_in d_out"],
  scale_in: Float[ArrayLike, " d_in"] | None = None,
  scale_out: Float[ArrayLike, " d_out"] | None = None,
  *,
  dnp: bool = False,
  eps: float = 1e-6,
) -> Float[Array, "... d_out"]:
  r"""A linear map with scale vectors on both sides (dual placement, DP).

  .. math:: y = s_{out} \odot ((s_{in} \odot x) W)

  row- and column-wise preconditioning of ``W``; both scales start at 1,
  where this is the plain linear map. ``dnp=True`` (DNP) adds an
  affine-free RMS normalization of the result, after :math:`s_{out}`.

  Unverified: the position of DNP's extra normalization is our choice (the
  paper text could not be read).

  Args:
    x: input ``(..., d_in)``.
    kernel: ``(d_in, d_out)``.
    scale_in: :math:`s_{in}` or ``None`` (no input scale).
    scale_out: :math:`s_{out}` or ``None``.
    dnp: append the RMS normalization.
    eps: its eps.

  Returns:
    ``(..., d_out)`` array in ``x``'s dtype.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for mismatched shapes.

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "dual_scaled_linear"
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "kernel", kernel)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  d_in, d_out = jnp.shape(kernel)
  _checks.check_shape(
    who, "kernel", kernel, (x.shape[-1], d_out), "(x.shape[-1], d_out)"
  )
  for name, s, size in (
    ("scale_in", scale_in, d_in),
    ("scale_out", scale_out, d_out),
  ):
    if s is not None:
      _checks.check_floating(who, name, s)
      _checks.check_shape(who, name, s, (size,))
  cdt = _compute_dtype(x)
  h = x.astype(cdt)
  if scale_in is not None:
    h = h * _channel(scale_in, x.ndim, cdt)
  h = h @ jnp.asarray(kernel).astype(cdt)
  if scale_out is not None:
    h = h * _channel(scale_out, x.ndim, cdt)
  if dnp:
    h = rms_norm(h, eps=eps)
  return h.astype(x.dtype)


# ---------------------------------------------------------------------------
# [CLS]-specialized normalization.

RegistersWith = Literal["patch", "cls"]


def cls_token_type(
  seq_len: int,
  *,
  num_cls_tokens: int = 1,
  num_registers: int = 0,
  registers_with: RegistersWith = "patch",
) -> jax.Array:
  """Token types of a ``[CLS], registers, patches`` sequence (1 = [CLS]).

  Args:
    seq_len: sequence length.
    num_cls_tokens: leading [CLS] tokens.
    num_registers: register tokens right after them (DINOv2 layout).
    registers_with: whose parameters registers use; ``"patch"`` by default
      (unverified: the two re-implementations disagree, the paper most
      likely separates only [CLS]).

  Returns:
    int32 ``(seq_len,)``.

  Raises:
    ValueError: if the special tokens do not fit or for a bad choice.
  """
  who = "cls_token_type"
  _checks.check_choice(who, "registers_with", registers_with, ("patch", "cls"))
  _checks.check_positive_int(who, "seq_len", seq_len)
  if (
    num_cls_tokens < 0
    or num_registers < 0
    or (num_cls_tokens + num_registers > seq_len)
  ):
    raise ValueError(
      f"{who}: need 0 <= num_cls_tokens + num_registers <= "
      f"seq_len, got {num_cls_tokens=}, {num_registers=}, "
      f"{seq_len=}"
    )
  special = num_cls_tokens + (num_registers if registers_with == "cls" else 0)
  return (jnp.arange(seq_len) < special).astype(jnp.int32)


def _token_select(who: str, token_type: ArrayLike, x: jax.Array) -> jax.Array:
  """Returns ``token_type`` as a rank-``x.ndim`` boolean, True at [CLS]."""
  shape = tuple(jnp.shape(token_type))
  lead = x.shape[:-1]
  if len(shape) > len(lead) or lead[len(lead) - len(shape) :] != shape:
    raise ValueError(
      f"{who}: token_type must have shape x.shape[:-1]="
      f"{lead} or a suffix of it, got "
      f"token_type.shape={shape}"
    )
  t = jnp.asarray(token_type) != 0
  return t.reshape((1,) * (len(lead) - len(shape)) + shape + (1,))


def specialized_layer_norm(
  x: Float[ArrayLike, "... d"],
  token_type: ArrayLike,
  scale_cls: Float[ArrayLike, " d"],
  bias_cls: Float[ArrayLike, " d"] | None,
  scale_patch: Float[ArrayLike, " d"],
  bias_patch: Float[ArrayLike, " d"] | None,
  *,
  eps: float = 1e-6,
  kind: Literal["layer", "rms"] = "layer",
) -> Float[Array, "... d"]:
  r"""LayerNorm (or RMSNorm) with separate affines for [CLS] and patches.

  The statistics are per token, so they are unchanged; only the affine is
  chosen per token: :math:`y = \gamma_{t} \odot \hat x + \beta_{t}` with
  ``t = token_type`` (1 = [CLS], 0 = patch), selected with a mask (no
  gather), so it is `jit`-friendly and :math:`\partial L/\partial
  \gamma_{cls}` only receives gradient from [CLS] positions. With equal
  parameters this is the shared norm.

  Args:
    x: input ``(..., d)``, e.g. ``(batch, seq, d)``.
    token_type: integer or boolean array of shape ``x.shape[:-1]`` or a
      suffix of it (e.g. ``(seq,)`` from `cls_token_type`).
    scale_cls: [CLS] gain ``(d,)``.
    bias_cls: [CLS] offset ``(d,)`` or ``None`` (for ``kind="rms"``).
    scale_patch: patch gain ``(d,)``.
    bias_patch: patch offset ``(d,)`` or ``None``.
    eps: added to the variance (mean square for RMS).
    kind: ``"layer"`` or ``"rms"`` (only the scale is specialized).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for bad shapes, a bad ``kind`` or biases given with only
      one token type.

  References:
    Marouani, Siméoni, Jégou, Bojanowski & Vo, *Revisiting [CLS] and Patch
    Token Interaction in Vision Transformers*, arXiv:2602.08626 (ICLR 2026).
  """
  who = "specialized_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "kind", kind, ("layer", "rms"))
  x = jnp.asarray(x)
  _check_channels(
    who,
    x,
    scale_cls=scale_cls,
    bias_cls=bias_cls,
    scale_patch=scale_patch,
    bias_patch=bias_patch,
  )
  if (bias_cls is None) != (bias_patch is None):
    raise ValueError(f"{who}: give both bias_cls and bias_patch or neither")
  is_cls = _token_select(who, token_type, x)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  xhat = layer_norm(xf, eps=eps) if kind == "layer" else rms_norm(xf, eps=eps)
  nd = x.ndim
  y = xhat * jnp.where(
    is_cls, _channel(scale_cls, nd, cdt), _channel(scale_patch, nd, cdt)
  )
  if bias_cls is not None:
    y = y + jnp.where(
      is_cls, _channel(bias_cls, nd, cdt), _channel(bias_patch, nd, cdt)
    )
  return y.astype(x.dtype)


def specialized_linear(
  x: Float[ArrayLike, "... d_in"],
  token_type: ArrayLike,
  kernel_cls: Float[ArrayLike, "d_in d_out"],
  kernel_patch: Float[ArrayLike, "d_in d_out"],
  bias_cls: Float[ArrayLike, " d_out"] | None = None,
  bias_patch: Float[ArrayLike, " d_out"] | None = None,
) -> Float[Array, "... d_out"]:
  """A linear layer with separate weights for [CLS] and patch tokens.

  QKV specialization of the early blocks: both weight sets are applied and
  the result is selected per token (1 = [CLS]), so the tokens still
  interact in attention. Bias pairs follow the kernels.

  Args:
    x: input ``(..., d_in)``.
    token_type: as in `specialized_layer_norm`.
    kernel_cls: ``(d_in, d_out)``.
    kernel_patch: ``(d_in, d_out)``.
    bias_cls: ``(d_out,)`` or ``None``.
    bias_patch: ``(d_out,)`` or ``None``.

  Returns:
    ``(..., d_out)`` in ``x``'s dtype.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for mismatched shapes or a single bias.

  References:
    Marouani, Siméoni, Jégou, Bojanowski & Vo, *Revisiting [CLS] and Patch
    Token Interaction in Vision Transformers*, arXiv:2602.08626 (ICLR 2026).
  """
  who = "specialized_linear"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  for name, k in (("kernel_cls", kernel_cls), ("kernel_patch", kernel_patch)):
    _checks.check_floating(who, name, k)
    _checks.check_ndim(who, name, k, expected=2)
  d_out = jnp.shape(kernel_cls)[1]
  for name, k in (("kernel_cls", kernel_cls), ("kernel_patch", kernel_patch)):
    _checks.check_shape(
      who, name, k, (x.shape[-1], d_out), "(x.shape[-1], kernel_cls.shape[1])"
    )
  if (bias_cls is None) != (bias_patch is None):
    raise ValueError(f"{who}: give both bias_cls and bias_patch or neither")
  is_cls = _token_select(who, token_type, x)
  cdt = _compute_dtype(x)
  xf = x.astype(cdt)
  y_cls = xf @ jnp.asarray(kernel_cls).astype(cdt)
  y_patch = xf @ jnp.asarray(kernel_patch).astype(cdt)
  if bias_cls is not None:
    for name, b in (("bias_cls", bias_cls), ("bias_patch", bias_patch)):
      _checks.check_floating(who, name, b)
      _checks.check_shape(who, name, b, (d_out,))
    y_cls = y_cls + _channel(bias_cls, x.ndim, cdt)
    y_patch = y_patch + _channel(bias_patch, x.ndim, cdt)
  return jnp.where(is_cls, y_cls, y_patch).astype(x.dtype)


# ---------------------------------------------------------------------------
# Gecko timestep-decay normalization.


class TimestepDecayNormState(NamedTuple):
  """Carried statistics of `timestep_decay_norm`, per sequence and group.

  Attributes:
    count: tokens accumulated since the last reset, int32 ``(B,)``.
    mean: decayed mean accumulator ``M``, ``(B, G)``.
    var: decayed variance accumulator ``V``, ``(B, G)``.
  """

  count: jax.Array
  mean: jax.Array
  var: jax.Array


def init_timestep_decay_norm_state(
  batch_size: int, num_groups: int = 64, dtype: jnp.dtype = jnp.float32
) -> TimestepDecayNormState:
  """The empty `timestep_decay_norm` state: ``n = M = V = 0``."""
  who = "init_timestep_decay_norm_state"
  _checks.check_positive_int(who, "batch_size", batch_size)
  _checks.check_positive_int(who, "num_groups", num_groups)
  return TimestepDecayNormState(
    count=jnp.zeros((batch_size,), jnp.int32),
    mean=jnp.zeros((batch_size, num_groups), dtype),
    var=jnp.zeros((batch_size, num_groups), dtype),
  )


def _affine_scan(a: jax.Array, b: jax.Array, h0: jax.Array) -> jax.Array:
  """``h_t = a_t h_{t-1} + b_t`` along axis 1, from ``h0`` (prefix scan)."""

  def combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2

  big_a, big_b = jax.lax.associative_scan(combine, (a, b), axis=1)
  return big_a * jnp.expand_dims(h0, 1) + big_b


def timestep_decay_norm(
  x: Float[ArrayLike, "b l d"],
  scale: Float[ArrayLike, " d"] | None = None,
  bias: Float[ArrayLike, " d"] | None = None,
  state: TimestepDecayNormState | None = None,
  *,
  num_groups: int = 64,
  beta1: float = 0.999,
  beta2: float = 0.9999,
  eps: float = 1e-5,
  padding_mask: ArrayLike | None = None,
  bos_mask: ArrayLike | None = None,
) -> tuple[Float[Array, "b l d"], TimestepDecayNormState]:
  r"""Gecko's timestep-decay normalization: causal, decayed group stats.

  For token ``t`` and group ``g``, :math:`u_t` and :math:`v_t` are the mean
  and biased variance over the group's ``D/G`` channels. From the carried
  state ``(n, M, V)``:
  :math:`n \leftarrow n + 1`, :math:`M \leftarrow \beta_1 M +
  (1-\beta_1)u_t`, :math:`V \leftarrow \beta_2 V + (1-\beta_2)v_t`, then

  .. math::
    \hat\mu_t = \frac{M}{1-\beta_1^n},\quad
    \hat\sigma^2_t = \frac{V}{1-\beta_2^n},\quad
    y_t = \frac{x_t - \hat\mu_t}{\sqrt{\hat\sigma^2_t + \epsilon}}
          \odot (1 + w) + b

  ``V`` averages within-token group variances (not the spread of the means
  over time). Pad tokens (``padding_mask`` True) leave the state unchanged
  and output 0. At a BOS token (``bos_mask`` True) the state resets to
  empty before the update, so that token gets :math:`\hat\mu = u_t,
  \hat\sigma^2 = v_t`. Unverified: the official CUDA combine appears to
  store the unweighted :math:`(u_t, v_t)` at a BOS; we follow the spec's
  reset-then-update reading. The recurrence is evaluated with a parallel
  prefix scan; gradients flow through the statistics into ``x`` and the
  incoming state. No train/eval difference.

  Args:
    x: input ``(B, L, D)``.
    scale: :math:`w` (used as ``1 + w``, init 0), ``(D,)``, or ``None``.
    bias: :math:`b` (init 0), ``(D,)``, or ``None``.
    state: carried `TimestepDecayNormState` or ``None`` (empty).
    num_groups: ``G``; ``D % G == 0`` and ``G < D``.
    beta1: decay of the mean accumulator.
    beta2: decay of the variance accumulator.
    eps: added to :math:`\hat\sigma^2`.
    padding_mask: boolean ``(B, L)``, True at pads.
    bos_mask: boolean ``(B, L)``, True where a new document starts.

  Returns:
    ``(y, new_state)``: ``y`` like ``x``; the state after the last token,
    to carry into the next segment (streaming).

  Raises:
    TypeError: for non-floating input or parameters, non-boolean masks or a
      bad state type.
    ValueError: for bad shapes or group counts.

  References:
    Ma et al., *Gecko: An Efficient Neural Architecture Inherently
    Processing Sequences with Arbitrary Lengths*, arXiv:2601.06463 (2026);
    code ``XuezheMax/gecko-llm``.
  """
  who = "timestep_decay_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=3)
  bsz, length, d = x.shape
  _checks.check_positive_int(who, "num_groups", num_groups)
  _checks.check_divisible(who, "x.shape[-1]", d, "num_groups", num_groups)
  if num_groups >= d:
    raise ValueError(
      f"{who}: num_groups must be < x.shape[-1]={d} (at "
      f"least two channels per group), got {num_groups=}"
    )
  _check_channels(who, x, scale=scale, bias=bias)
  masks = []
  for name, mk in (("padding_mask", padding_mask), ("bos_mask", bos_mask)):
    if mk is None:
      masks.append(jnp.zeros((bsz, length, 1), bool))
      continue
    if jnp.result_type(mk) != jnp.bool_:
      raise TypeError(
        f"{who}: {name} must be boolean, got {name}.dtype={jnp.result_type(mk)}"
      )
    _checks.check_shape(who, name, mk, (bsz, length), "x.shape[:2]")
    masks.append(jnp.asarray(mk).reshape(bsz, length, 1))
  pad, bos = masks
  cdt = _compute_dtype(x)
  if state is None:
    state = init_timestep_decay_norm_state(bsz, num_groups, cdt)
  _check_state(
    who,
    state,
    TimestepDecayNormState,
    {"count": (bsz,), "mean": (bsz, num_groups), "var": (bsz, num_groups)},
  )
  xf = x.astype(cdt)
  xg = xf.reshape(bsz, length, num_groups, d // num_groups)
  u, v = _moments(xg, (3,))
  u, v = u.reshape(bsz, length, num_groups), v.reshape(bsz, length, num_groups)
  keep = jnp.logical_not(pad).astype(cdt)
  reset = jnp.logical_and(bos, jnp.logical_not(pad)).astype(cdt)

  def decay(beta, val, h0):
    a = keep * (1 - reset) * beta + (1 - keep)
    return _affine_scan(
      jnp.broadcast_to(a, val.shape), keep * (1 - beta) * val, h0
    )

  m = decay(beta1, u, state.mean.astype(cdt))
  vv = decay(beta2, v, state.var.astype(cdt))
  n = _affine_scan(
    keep * (1 - reset) + (1 - keep),
    keep,
    state.count.astype(cdt).reshape(bsz, 1),
  )
  live = n > 0
  safe_n = jnp.where(live, n, 1.0)
  corr1 = -jnp.expm1(safe_n * math.log(beta1))
  corr2 = -jnp.expm1(safe_n * math.log(beta2))
  mu = (m / corr1).reshape(bsz, length, num_groups, 1)
  var = (vv / corr2).reshape(bsz, length, num_groups, 1)
  y = ((xg - mu) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
  if scale is not None:
    y = y * (1 + _channel(scale, 3, cdt))
  if bias is not None:
    y = y + _channel(bias, 3, cdt)
  y = y * keep
  new_state = TimestepDecayNormState(
    count=n[:, -1, 0].astype(state.count.dtype),
    mean=m[:, -1].astype(state.mean.dtype),
    var=vv[:, -1].astype(state.var.dtype),
  )
  return y.astype(x.dtype), new_state
