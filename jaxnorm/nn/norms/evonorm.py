"""EvoNorm-B0 and EvoNorm-S0 modules; maths in `jaxnorm.norms.evonorm`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  RunningAverage,
  cast,
  maybe,
  optional,
  param,
  promote,
)


class EvoNormB0(RunningAverage):
  """EvoNorm-B0 of NHWC input; see `jaxnorm.norms.evo_norm_b0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``); running variance ``var`` is an `nnx.BatchStat`,
  float32 whatever ``param_dtype`` (as flax's ``batch_stats``: a bfloat16
  average with momentum 0.99 loses updates), updated under
  `jax.lax.stop_gradient`. ``momentum`` is Flax-style (0.9 = timm's 0.1).
  ``use_running_average`` selects inference, as in `BatchNorm`. flax's
  ``use_scale``, ``use_bias``, ``scale_init`` and ``bias_init`` act on
  ``scale`` and ``bias``.

  Examples:
    >>> norm = EvoNormB0(1, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([1.0, 3.0]).reshape(2, 1, 1, 1))  # training mode
    >>> y.shape, norm.var[...].dtype  # float32 running variance
    ((2, 1, 1, 1), dtype('float32'))
    >>> round(float(norm.var[...][0]), 4)  # 0.9 * 1 + 0.1 * 2 (unbiased)
    1.1
  """

  @paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.9,
    eps: float = 1e-3,
    use_running_average: bool = False,
    apply_act: bool = True,
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
    _checks.check_positive_int("EvoNormB0", "num_features", num_features)
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.v = (
      param(jnp.ones(shape, param_dtype), axis_names) if apply_act else None
    )
    state = norms.init_evo_norm_b0_state(num_features, jnp.float32)
    self.var = param(state.var, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``var``."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new_state = norms.evo_norm_b0(
      x,
      maybe(self.scale),
      maybe(self.bias),
      maybe(self.v),
      norms.EvoNormB0State(self.var[...]),
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.var[...] = jax.lax.stop_gradient(new_state.var)
    return cast(y, self)


class EvoNormS0(nnx.Module):
  """EvoNorm-S0 (or S0a) of NHWC input; see `jaxnorm.norms.evo_norm_s0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``). Stateless. ``reduction_axes`` as in `GroupNorm`
  (``-1``: per token and group, causal-safe on sequences). flax's affine
  keywords as in `EvoNormB0`.

  Examples:
    >>> norm = EvoNormS0(1, num_groups=1, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([[[1.0], [-1.0]]]))  # (n, w, c): group std 1
    >>> [round(v, 4) for v in y[0, :, 0].tolist()]  # x sigmoid(x) / std
    [0.7311, -0.2689]
  """

  @paper_affine()
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
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "EvoNormS0"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "variant", variant, ("s0", "s0a"))
    scale_key, bias_key = draw_keys(rngs)
    self.num_groups = _numerics.resolve_groups(
      who, "num_features", num_features, num_groups, group_size
    )
    self.num_features, self.eps, self.variant = num_features, eps, variant
    self.reduction_axes, self.dtype = reduction_axes, dtype
    shape = (num_features,)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.v = (
      param(jnp.ones(shape, param_dtype), axis_names) if apply_act else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (NHWC) with this module's parameters."""
    x = promote(x, self)
    y = norms.evo_norm_s0(
      x,
      maybe(self.scale),
      maybe(self.bias),
      maybe(self.v),
      num_groups=self.num_groups,
      eps=self.eps,
      variant=self.variant,
      reduction_axes=self.reduction_axes,
    )
    return cast(y, self)
