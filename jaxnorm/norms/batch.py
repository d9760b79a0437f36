"""BatchNorm, GroupNorm and InstanceNorm (channels last)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer, masked


class BatchNormState(NamedTuple):
  """Running statistics of `batch_norm` (the ``batch_stats`` of Flax).

  Attributes:
    mean: running mean, shape ``(num_features,)``.
    var: running biased variance, shape ``(num_features,)``.
  """

  mean: jax.Array
  var: jax.Array


@_scope.scoped
def init_batch_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> BatchNormState:
  """Running statistics at initialization: mean 0, variance 1.

  Examples:
    >>> state = norms.init_batch_norm_state(3)
    >>> print(state.mean, state.var)
    [0. 0. 0.] [1. 1. 1.]
  """
  _checks.check_positive_int(
    "init_batch_norm_state", "num_features", num_features
  )
  return BatchNormState(
    mean=jnp.zeros((num_features,), dtype), var=jnp.ones((num_features,), dtype)
  )


def _masked_moments(
  x: jax.Array,
  mask: jax.Array,
  axes: tuple[int, ...],
  axis_name: _numerics.AxisName,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Two-pass mean and biased variance over the ``mask``-ed elements.

  ``mask`` broadcasts against ``x`` (size 1 on the feature axis). Returns
  ``(mean, var, count)`` with keepdims statistics and the global count of
  valid elements (clamped at 1 in the divisions, so an all-masked batch
  gives mean and variance 0).
  """
  m = jax.lax.stop_gradient(mask.astype(x.dtype))
  count = _numerics.psum(jnp.sum(m), axis_name)
  denom = jnp.maximum(count, 1.0)
  mean = _numerics.psum(jnp.sum(x * m, axis=axes, keepdims=True), axis_name)
  mean = mean / denom
  var = jnp.sum(jnp.square(x - mean) * m, axis=axes, keepdims=True)
  return mean, _numerics.psum(var, axis_name) / denom, count


def _check_mask(who: str, mask: ArrayLike | None, x: jax.Array, feat: int):
  """A boolean mask of ``x.shape`` without ``feat``, expanded on ``feat``."""
  if mask is None:
    return None
  if jnp.result_type(mask) != jnp.bool_:
    raise TypeError(
      f"{who}: mask must be boolean (True on valid elements), got "
      f"mask.dtype={jnp.result_type(mask)}"
    )
  expected = x.shape[:feat] + x.shape[feat + 1 :]
  _checks.check_shape(who, "mask", mask, expected, "x.shape without axis")
  return jnp.expand_dims(jnp.asarray(mask), feat)


@_scope.scoped
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
  mask: Bool[ArrayLike, "..."] | None = None,
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
  weights the new batch). A training batch with no elements per feature
  (a static fact of the shape) returns an empty output and leaves the state
  unchanged, instead of averaging NaN statistics into it.

  ``mask`` restricts the training statistics to valid elements (the real
  nodes of a padded batch of graphs, as the Graph Transformer's BatchNorm
  over all nodes of a batch of DGL graphs):

  .. math::
    \mu_B = \frac{\sum_i m_i x_i}{\sum_i m_i},\qquad
    \sigma_B^2 = \frac{\sum_i m_i (x_i - \mu_B)^2}{\sum_i m_i}

  Every element, masked or not, is normalized with these statistics (the
  caller ignores the padded outputs); a batch without valid elements
  leaves the state unchanged. Inference ignores ``mask``.

  Causality on ``(batch, seq, d)``: training statistics mix every position
  and example, so training mode is not causal-safe; inference (running
  statistics) is per token and causal-safe.

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
    mask: boolean, the shape of ``x`` without ``axis``; True on the
      elements that enter the training statistics. ``None``: all.

  Returns:
    ``(y, new_state)``; ``y`` has the shape and dtype of ``x`` and
    ``new_state`` the structure and dtypes of ``state``.

  Raises:
    TypeError: for non-floating ``x`` or parameters, or a non-boolean
      ``mask``.
    ValueError: for a bad ``axis``, parameter, state or ``mask`` shape.

  Examples:
    >>> x = jnp.array([[1.0], [2.0], [3.0], [4.0]])  # 4 examples, 1 channel
    >>> state = norms.init_batch_norm_state(1)
    >>> y, state = norms.batch_norm(x, None, None, state, training=True)
    >>> print(np.asarray(y[:, 0]).round(4), np.asarray(state.mean).round(4))
    [-1.3416 -0.4472  0.4472  1.3416] [0.025]

  References:
    Ioffe & Szegedy, *Batch Normalization: Accelerating Deep Network Training
    by Reducing Internal Covariate Shift*, arXiv:1502.03167 (2015); Dwivedi
    & Bresson, *A Generalization of Transformer Networks to Graphs*,
    arXiv:2012.09699 (2020) (BatchNorm over the nodes of a graph batch).
  """
  who = "batch_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  _numerics.check_param(who, "scale", scale, x, (feat,))
  _numerics.check_param(who, "bias", bias, x, (feat,))
  c = x.shape[feat]
  _numerics.check_state(who, state, BatchNormState, {"mean": (c,), "var": (c,)})
  mask = _check_mask(who, mask, x, feat)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  reduce = _numerics.other_axes(x.ndim, (feat,))
  if training and not _numerics.is_empty(x, reduce):
    if mask is None:
      mean, var = _numerics.moments(xf, reduce, axis_name)
    else:
      mean, var, count = _masked_moments(xf, mask, reduce, axis_name)
    new_state = BatchNormState(
      mean=_numerics.ema(state.mean, mean, momentum),
      var=_numerics.ema(state.var, var, momentum),
    )
    if mask is not None:  # No valid element: keep the running statistics.
      new_state = jax.tree.map(
        lambda old, new: jnp.where(count > 0, new, old), state, new_state
      )
  else:
    mean = _numerics.expand(state.mean, x.ndim, (feat,), cdt)
    var = _numerics.expand(state.var, x.ndim, (feat,), cdt)
    new_state = state
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  y = _numerics.affine(y, scale, bias, (feat,))
  return y.astype(x.dtype), new_state


@_scope.scoped
def group_norm(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None = None,
  bias: Float[ArrayLike, " c"] | None = None,
  *,
  num_groups: int | None = 32,
  group_size: int | None = None,
  eps: float = 1e-6,
  reduction_axes: layer.Axis | None = None,
  mask: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, "n *spatial c"]:
  r"""Group normalization of a channels-last batch.

  Channels are split into ``G`` contiguous groups; mean and biased variance
  are taken per group over the ``C/G`` channels of the group and the other
  ``reduction_axes``, then a per-channel affine is applied:

  .. math::
    y = \mathrm{scale} \odot \frac{x - \mu_g}{\sqrt{\sigma^2_g + \epsilon}}
        + \mathrm{bias}

  The default (``reduction_axes=None``) is the paper's image form: per
  example over all spatial positions (every axis but the batch axis 0);
  there ``G = 1`` is LayerNorm over all non-batch axes and ``G = C`` is
  InstanceNorm. ``reduction_axes`` names the statistics axes explicitly, as
  in Flax's ``GroupNorm``, and must include the channel axis ``-1``.

  Causality on ``(batch, seq, d)``: the default mixes the whole sequence
  (not causal-safe); ``reduction_axes=-1`` normalizes each token over the
  channels of its group (causal-safe; ``G = 1`` is then LayerNorm).

  Args:
    x: input ``(batch, *spatial, channels)``, rank >= 2 for the default
      ``reduction_axes``.
    scale: per-channel gain or ``None``.
    bias: per-channel offset or ``None``.
    num_groups: number of groups ``G``; give exactly one of ``num_groups``
      and ``group_size``.
    group_size: channels per group (``C/G``).
    eps: added to the variance.
    reduction_axes: axes of the statistics, containing ``-1``; ``None``
      means every axis but 0.
    mask: boolean, flax's ``mask=``: each group's statistics run over its
      ``True`` elements only (`jaxnorm.norms.masked`).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a rank below 2 (default) or 1, both or neither of
      ``num_groups`` and ``group_size``, a group count that does not divide
      the channels, ``reduction_axes`` without the channel axis, or a bad
      parameter shape.

  Examples:
    >>> x = jnp.array([[[1.0, 3.0, 10.0, 20.0]]])  # (n=1, w=1, c=4)
    >>> y = norms.group_norm(x, num_groups=2)  # groups {1, 3} and {10, 20}
    >>> print(np.asarray(y).round(4))
    [[[-1.  1. -1.  1.]]]

  References:
    Wu & He, *Group Normalization*, arXiv:1803.08494 (2018).
  """
  who = "group_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  axes = _numerics.group_reduction_axes(who, reduction_axes, x, min_rank=2)
  groups = _numerics.resolve_groups(
    who, "x.shape[-1]", x.shape[-1], num_groups, group_size
  )
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  if mask is not None:
    return masked.group_norm(
      x,
      scale,
      bias,
      mask,
      num_groups=groups,
      eps=eps,
      reduction_axes=reduction_axes,
    )
  xf = x.astype(_numerics.compute_dtype(x))
  mean, var = _numerics.group_moments(xf, groups, axes)
  y = _numerics.affine((xf - mean) * jax.lax.rsqrt(var + eps), scale, bias)
  return y.astype(x.dtype)


@_scope.scoped
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

  Causality on ``(batch, seq, d)``: the statistics run over the sequence,
  so it is not causal-safe. A per-token form is degenerate: one value per
  channel has variance 0, so every output would be ``bias``; use
  `group_norm` with ``reduction_axes=-1`` (per token over channel groups)
  or `jaxnorm.norms.layer_norm` instead.

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

  Examples:
    >>> x = jnp.array([[[1.0, 10.0], [3.0, 30.0]]])  # (n=1, w=2, c=2)
    >>> print(np.asarray(norms.instance_norm(x)).round(4))
    [[[-1. -1.]
      [ 1.  1.]]]

  References:
    Ulyanov, Vedaldi & Lempitsky, *Instance Normalization: The Missing
    Ingredient for Fast Stylization*, arXiv:1607.08022 (2016).
  """
  who = "instance_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  xf = x.astype(_numerics.compute_dtype(x))
  mean, var = _numerics.moments(xf, tuple(range(1, x.ndim - 1)))
  y = _numerics.affine((xf - mean) * jax.lax.rsqrt(var + eps), scale, bias)
  return y.astype(x.dtype)
