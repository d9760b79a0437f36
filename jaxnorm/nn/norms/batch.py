"""BatchNorm, GroupNorm and InstanceNorm modules (`jaxnorm.norms.batch`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  PromoteDtype,
  RunningAverage,
  cast,
  flax_spelling,
  maybe,
  optional,
  param,
  promote_args,
)
from jaxnorm.norms import masked as _masked


class BatchNorm(RunningAverage):
  """BatchNorm over the last (feature) axis; see `jaxnorm.norms.batch_norm`.

  Running statistics are `nnx.BatchStat` variables ``mean`` and ``var``,
  float32 whatever ``param_dtype`` (as flax's), updated under
  `jax.lax.stop_gradient` (no gradient flows through the running
  averages). ``use_running_average`` selects inference mode;
  ``model.eval()`` and ``model.train()`` toggle it, and a call argument
  overrides it. ``axis_name`` averages batch statistics across a mapped
  device axis. flax's keywords as in `LayerNorm`: ``promote_dtype``
  receives ``(x, mean, var, scale, bias)``, and with ``dtype=None`` the
  output dtype is the promotion of the input with all of them (float32
  statistics: float32 or wider, as in flax).

  Examples:
    >>> bn = BatchNorm(1, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    >>> y = bn(jnp.array([[1.0], [2.0], [3.0], [4.0]]))  # training mode
    >>> [round(v, 4) for v in y[:, 0].tolist()]
    [-1.3416, -0.4472, 0.4472, 1.3416]
    >>> bn.mean[...].dtype, round(float(bn.mean[...][0]), 4)  # 0.01 * 2.5
    (dtype('float32'), 0.025)
  """

  @flax_spelling
  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.99,
    eps: float = 1e-5,
    use_running_average: bool = False,
    use_scale: bool = True,
    use_bias: bool = True,
    axis_name: str | None = None,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    promote_dtype: PromoteDtype | None = None,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("BatchNorm", "num_features", num_features)
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype, self.param_dtype = dtype, param_dtype
    self.promote_dtype = promote_dtype
    state = norms.init_batch_norm_state(num_features, jnp.float32)
    self.mean = param(state.mean, axis_names, nnx.BatchStat)
    self.var = param(state.var, axis_names, nnx.BatchStat)
    scale_key, bias_key = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  def __call__(
    self,
    x: jax.Array,
    use_running_average: bool | None = None,
    *,
    mask: jax.Array | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``var``.

    Args:
      x: input ``(..., num_features)``.
      use_running_average: overrides the module's mode for this call
        (positional too, as in flax).
      mask: boolean, True on the elements that enter the batch statistics
        (the real nodes of a padded graph batch): shape ``x.shape[:-1]``,
        or a flax mask with last dimension 1. The running statistics are
        updated from those elements only (not at all without any);
        inference ignores it. See `jaxnorm.norms.batch_norm`.

    Returns:
      The normalized ``x``.
    """
    eval_mode = self.eval_mode(use_running_average)
    stored = norms.BatchNormState(self.mean[...], self.var[...])
    x, mean, var, scale, bias = promote_args(
      self, x, *stored, maybe(self.scale), maybe(self.bias), statistics=2
    )
    if mask is not None:
      mask = _masked.position_mask("BatchNorm", mask, x)
    # Inference normalizes with the (promoted) running statistics; training
    # blends the stored float32 ones with the batch statistics.
    state = norms.BatchNormState(mean, var) if eval_mode else stored
    y, new_state = norms.batch_norm(
      x,
      scale,
      bias,
      state,
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
      mask=mask,
    )
    if not eval_mode:
      new_state = jax.lax.stop_gradient(new_state)
      self.mean[...] = new_state.mean
      self.var[...] = new_state.var
    return cast(y, self)


class GroupNorm(nnx.Module):
  """GroupNorm of channels-last input; see `jaxnorm.norms.group_norm`.

  ``reduction_axes`` (flax's spelling) picks the statistics axes: ``None``
  is the paper's image form (every axis but the batch axis); ``-1`` is one
  statistic per token and group, the causal-safe form for ``(batch, seq,
  d)`` sequences that `make_norm` builds for ``layout="tokens"``.
  ``num_groups`` and ``group_size`` may be positional, as in flax's
  ``nnx.GroupNorm``; its other keywords as in `LayerNorm`.

  Examples:
    >>> norm = GroupNorm(4, 2, rngs=nnx.Rngs(0))  # two groups of two channels
    >>> y = norm(jnp.array([[1.0, 3.0, 5.0, 9.0]]))  # (batch, features)
    >>> [round(v, 4) for v in y[0].tolist()]
    [-1.0, 1.0, -1.0, 1.0]
  """

  @flax_spelling
  def __init__(
    self,
    num_features: int,
    num_groups: int | None = 32,
    group_size: int | None = None,
    *,
    eps: float = 1e-6,
    reduction_axes: norms.Axis | None = None,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    promote_dtype: PromoteDtype | None = None,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "GroupNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    num_groups = _numerics.resolve_groups(
      who, "num_features", num_features, num_groups, group_size
    )
    self.num_features, self.num_groups = num_features, num_groups
    self.eps, self.reduction_axes, self.dtype = eps, reduction_axes, dtype
    self.promote_dtype = promote_dtype
    scale_key, bias_key = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters.

    Args:
      x: input ``(batch, ..., num_features)``.
      mask: boolean, as in flax: each group's statistics run over its
        ``True`` elements only (``x.shape[:-1]`` masks positions, any other
        shape broadcasts against ``x``).

    Returns:
      The normalized ``x``.
    """
    x, scale, bias = promote_args(self, x, maybe(self.scale), maybe(self.bias))
    y = norms.group_norm(
      x,
      scale,
      bias,
      num_groups=self.num_groups,
      eps=self.eps,
      reduction_axes=self.reduction_axes,
      mask=mask,
    )
    return cast(y, self)


class InstanceNorm(nnx.Module):
  """InstanceNorm of channels-last input; see `jaxnorm.norms.instance_norm`.

  flax's keywords as in `LayerNorm`, and ``mask=`` in the call.

  Examples:
    >>> x = jnp.array([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 5.0, 5.0]])[..., None]
    >>> y = InstanceNorm(1, rngs=nnx.Rngs(0))(x)  # per example and channel
    >>> [[round(v, 4) for v in row] for row in y[..., 0].tolist()]
    [[-1.0, -1.0, 1.0, 1.0], [-1.0, -1.0, 1.0, 1.0]]
  """

  @flax_spelling
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    promote_dtype: PromoteDtype | None = None,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("InstanceNorm", "num_features", num_features)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.promote_dtype = promote_dtype
    scale_key, bias_key = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters.

    Args:
      x: input ``(batch, *spatial, num_features)``, at least one spatial
        axis.
      mask: boolean, as in flax: each example's and channel's statistics
        run over its ``True`` elements only (``x.shape[:-1]`` masks
        positions, any other shape broadcasts against ``x``). The masked
        form is `jaxnorm.norms.group_norm` with one channel per group (its
        masked moments, `jaxnorm.norms.masked`), which is instance norm.

    Returns:
      The normalized ``x``.
    """
    x, scale, bias = promote_args(self, x, maybe(self.scale), maybe(self.bias))
    if mask is None:
      y = norms.instance_norm(x, scale, bias, eps=self.eps)
    else:
      _checks.check_ndim("InstanceNorm", "x", x, minimum=3)
      _masked.check_mask("InstanceNorm", mask, x)
      y = norms.group_norm(
        x, scale, bias, num_groups=None, group_size=1, eps=self.eps, mask=mask
      )
    return cast(y, self)
