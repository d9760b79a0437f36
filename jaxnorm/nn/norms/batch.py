"""Batch and group statistics: BatchNorm, GroupNorm, EvoNorm and kin."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics, norms
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  RunningAverage,
  cast,
  draw_keys,
  flax_spelling,
  maybe,
  optional,
  param,
  promote,
)
from jaxnorm.norms import masked as _masked


class BatchNorm(RunningAverage):
  """BatchNorm over the last (feature) axis; see `jaxnorm.norms.batch_norm`.

  Running statistics are `nnx.BatchStat` variables ``mean`` and ``var``.
  ``use_running_average`` selects inference mode; ``model.eval()`` and
  ``model.train()`` toggle it, and a call argument overrides it.
  ``axis_name`` averages batch statistics across a mapped device axis.
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
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("BatchNorm", "num_features", num_features)
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    state = norms.init_batch_norm_state(num_features, param_dtype)
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
    *,
    use_running_average: bool | None = None,
    mask: jax.Array | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``var``.

    Args:
      x: input ``(..., num_features)``.
      use_running_average: overrides the module's mode for this call.
      mask: boolean, True on the elements that enter the batch statistics
        (the real nodes of a padded graph batch): shape ``x.shape[:-1]``,
        or a flax mask with last dimension 1. The running statistics are
        updated from those elements only (not at all without any);
        inference ignores it. See `jaxnorm.norms.batch_norm`.

    Returns:
      The normalized ``x``.
    """
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    if mask is not None:
      mask = _masked.position_mask("BatchNorm", mask, x)
    state = norms.BatchNormState(self.mean[...], self.var[...])
    y, new_state = norms.batch_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      state,
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
      mask=mask,
    )
    if not eval_mode:
      self.mean[...] = new_state.mean
      self.var[...] = new_state.var
    return cast(y, self)


class GroupNorm(nnx.Module):
  """GroupNorm of channels-last input; see `jaxnorm.norms.group_norm`.

  ``reduction_axes`` (flax's spelling) picks the statistics axes: ``None``
  is the paper's image form (every axis but the batch axis); ``-1`` is one
  statistic per token and group, the causal-safe form for ``(batch, seq,
  d)`` sequences that `make_norm` builds for ``layout="tokens"``.
  """

  @flax_spelling
  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int | None = 32,
    group_size: int | None = None,
    eps: float = 1e-6,
    reduction_axes: norms.Axis | None = None,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
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
    x = promote(x, self)
    y = norms.group_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      num_groups=self.num_groups,
      eps=self.eps,
      reduction_axes=self.reduction_axes,
      mask=mask,
    )
    return cast(y, self)


class InstanceNorm(nnx.Module):
  """InstanceNorm of channels-last input; see `jaxnorm.norms.instance_norm`."""

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
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("InstanceNorm", "num_features", num_features)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    scale_key, bias_key = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    x = promote(x, self)
    y = norms.instance_norm(
      x, maybe(self.scale), maybe(self.bias), eps=self.eps
    )
    return cast(y, self)


class EvoNormB0(RunningAverage):
  """EvoNorm-B0 of NHWC input; see `jaxnorm.norms.evo_norm_b0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``); running variance ``var`` is an `nnx.BatchStat`.
  ``momentum`` is Flax-style (0.9 = timm's 0.1). ``use_running_average``
  selects inference, as in `BatchNorm`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.9,
    eps: float = 1e-3,
    use_running_average: bool = False,
    apply_act: bool = True,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("EvoNormB0", "num_features", num_features)
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (
      param(jnp.ones(shape, param_dtype), axis_names) if apply_act else None
    )
    state = norms.init_evo_norm_b0_state(num_features, param_dtype)
    self.var = param(state.var, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``var``."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new_state = norms.evo_norm_b0(
      x,
      self.scale[...],
      self.bias[...],
      maybe(self.v),
      norms.EvoNormB0State(self.var[...]),
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.var[...] = new_state.var
    return cast(y, self)


class EvoNormS0(nnx.Module):
  """EvoNorm-S0 (or S0a) of NHWC input; see `jaxnorm.norms.evo_norm_s0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``). Stateless. ``reduction_axes`` as in `GroupNorm`
  (``-1``: per token and group, causal-safe on sequences).
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int | None = 32,
    group_size: int | None = None,
    eps: float = 1e-5,
    reduction_axes: norms.Axis | None = None,
    apply_act: bool = True,
    variant: norms.EvoNormS0Variant = "s0",
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "EvoNormS0"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "variant", variant, ("s0", "s0a"))
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_groups = _numerics.resolve_groups(
      who, "num_features", num_features, num_groups, group_size
    )
    self.num_features, self.eps, self.variant = num_features, eps, variant
    self.reduction_axes, self.dtype = reduction_axes, dtype
    shape = (num_features,)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (
      param(jnp.ones(shape, param_dtype), axis_names) if apply_act else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (NHWC) with this module's parameters."""
    x = promote(x, self)
    y = norms.evo_norm_s0(
      x,
      self.scale[...],
      self.bias[...],
      maybe(self.v),
      num_groups=self.num_groups,
      eps=self.eps,
      variant=self.variant,
      reduction_axes=self.reduction_axes,
    )
    return cast(y, self)


class L1BatchNorm(RunningAverage):
  """L1 BatchNorm (features last); see `jaxnorm.norms.l1_batch_norm`.

  `nnx.BatchStat` ``mean`` and ``dev``; ``use_running_average`` selects
  inference, as in `BatchNorm`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.99,
    eps: float = 1e-5,
    kappa: float = norms.L1_KAPPA,
    eps_mode: norms.EpsMode = "outside",
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("L1BatchNorm", "num_features", num_features)
    _checks.check_choice("L1BatchNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.kappa, self.eps_mode = kappa, eps_mode
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    state = norms.init_l1_batch_norm_state(num_features, param_dtype)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = param(jnp.zeros(shape, param_dtype), axis_names)
    self.mean = param(state.mean, axis_names, nnx.BatchStat)
    self.dev = param(state.dev, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``dev``."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new = norms.l1_batch_norm(
      x,
      self.scale[...],
      self.bias[...],
      norms.L1BatchNormState(self.mean[...], self.dev[...]),
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      kappa=self.kappa,
      eps_mode=self.eps_mode,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.mean[...] = new.mean
      self.dev[...] = new.dev
    return cast(y, self)
