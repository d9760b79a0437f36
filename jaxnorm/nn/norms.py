"""Flax nnx modules for the normalization functions of `jaxnorm.norms`.

Each module only declares its parameters (and running statistics) and calls
the pure function; the maths and its documentation live there. Common
arguments:

* ``num_features``: size of the normalized (last) axis.
* ``dtype``: output dtype; ``None`` keeps the input dtype. Statistics are
  always computed in at least float32.
* ``param_dtype``: storage dtype of parameters and statistics (float32).
* ``axis_names``: logical axis name of the feature axis, attached to every
  parameter for sharding (default ``("norm",)``, replicated by the default
  rules of `jaxnorm.sharding`).
* ``rngs``: an `nnx.Rngs`; the ``params`` stream feeds the initializers.

`make_norm` builds any of them by name.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn import _param

Initializer = Callable[..., jax.Array]
Names = Sequence[str | None] | None


def _cast(y: jax.Array, dtype: Any) -> jax.Array:
  return y if dtype is None else y.astype(dtype)


def _init(
  init: Initializer,
  rngs: nnx.Rngs,
  num_features: int,
  param_dtype: Any,
  names: Names,
) -> nnx.Param:
  value = init(rngs.params(), (num_features,), param_dtype)
  return _param.param(value, names)


def _maybe(var: nnx.Variable | None) -> jax.Array | None:
  return None if var is None else var[...]


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis; maths in `jaxnorm.norms.layer_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_offset: float = 0.0,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    implementation: Literal["xla", "pallas"] | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("LayerNorm", "num_features", num_features)
    _checks.check_choice(
      "LayerNorm", "implementation", implementation, (None, "xla", "pallas")
    )
    self.implementation = implementation
    self.num_features, self.eps = num_features, eps
    self.scale_offset, self.dtype = scale_offset, dtype
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _init(bias_init, rngs, num_features, param_dtype, axis_names)
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.layer_norm(
      x,
      _maybe(self.scale),
      _maybe(self.bias),
      eps=self.eps,
      scale_offset=self.scale_offset,
      implementation=self.implementation,
    )
    return _cast(y, self.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis; maths in `jaxnorm.norms.rms_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    eps_mode: norms.EpsMode = "inside",
    use_scale: bool = True,
    scale_offset: float = 0.0,
    scale_init: Initializer = nnx.initializers.ones,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    implementation: Literal["xla", "pallas"] | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("RMSNorm", "num_features", num_features)
    _checks.check_choice("RMSNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    _checks.check_choice(
      "RMSNorm", "implementation", implementation, (None, "xla", "pallas")
    )
    self.implementation = implementation
    self.num_features, self.eps, self.eps_mode = num_features, eps, eps_mode
    self.scale_offset, self.dtype = scale_offset, dtype
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.rms_norm(
      x,
      _maybe(self.scale),
      eps=self.eps,
      eps_mode=self.eps_mode,
      scale_offset=self.scale_offset,
      implementation=self.implementation,
    )
    return _cast(y, self.dtype)


class CRMSNorm(nnx.Module):
  """Compressed RMSNorm on ``d-1`` features; see `jaxnorm.norms.crms_norm`.

  ``num_features`` is the compressed width ``d-1``.
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    use_scale: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("CRMSNorm", "num_features", num_features)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.crms_norm(x, _maybe(self.scale), eps=self.eps)
    return _cast(y, self.dtype)


class BatchNorm(nnx.Module):
  """BatchNorm over the last (feature) axis; see `jaxnorm.norms.batch_norm`.

  Running statistics are `nnx.BatchStat` variables ``mean`` and ``var``.
  ``use_running_average`` selects inference mode; ``model.eval()`` and
  ``model.train()`` toggle it, and a call argument overrides it.
  ``axis_name`` averages batch statistics across a mapped device axis.
  """

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
    self.mean = _param.param(state.mean, axis_names, nnx.BatchStat)
    self.var = _param.param(state.var, axis_names, nnx.BatchStat)
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _init(bias_init, rngs, num_features, param_dtype, axis_names)
      if use_bias
      else None
    )

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``var``."""
    eval_mode = (
      self.use_running_average
      if use_running_average is None
      else use_running_average
    )
    state = norms.BatchNormState(self.mean[...], self.var[...])
    y, new_state = norms.batch_norm(
      x,
      _maybe(self.scale),
      _maybe(self.bias),
      state,
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.mean[...] = new_state.mean
      self.var[...] = new_state.var
    return _cast(y, self.dtype)


class GroupNorm(nnx.Module):
  """GroupNorm of channels-last input; see `jaxnorm.norms.group_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int | None = 32,
    group_size: int | None = None,
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
    who = "GroupNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    if (num_groups is None) == (group_size is None):
      raise ValueError(
        f"{who}: give exactly one of num_groups and "
        f"group_size, got {num_groups=} and {group_size=}"
      )
    if group_size is not None:
      _checks.check_positive_int(who, "group_size", group_size)
      _checks.check_divisible(
        who, "num_features", num_features, "group_size", group_size
      )
      num_groups = num_features // group_size
    _checks.check_positive_int(who, "num_groups", num_groups)
    _checks.check_divisible(
      who, "num_features", num_features, "num_groups", num_groups
    )
    self.num_features, self.num_groups = num_features, num_groups
    self.eps, self.dtype = eps, dtype
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _init(bias_init, rngs, num_features, param_dtype, axis_names)
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.group_norm(
      x,
      _maybe(self.scale),
      _maybe(self.bias),
      num_groups=self.num_groups,
      eps=self.eps,
    )
    return _cast(y, self.dtype)


class InstanceNorm(nnx.Module):
  """InstanceNorm of channels-last input; see `jaxnorm.norms.instance_norm`."""

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
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _init(bias_init, rngs, num_features, param_dtype, axis_names)
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.instance_norm(
      x, _maybe(self.scale), _maybe(self.bias), eps=self.eps
    )
    return _cast(y, self.dtype)


class DyT(nnx.Module):
  """Dynamic Tanh; see `jaxnorm.norms.dyt`.

  ``alpha`` is one learnable scalar (shape ``(1,)``) initialized to
  ``alpha_init`` (0.5 for vision; the LLaMA recipe uses per-position values
  and ``use_bias=False``).
  """

  def __init__(
    self,
    num_features: int,
    *,
    alpha_init: float = 0.5,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("DyT", "num_features", num_features)
    self.num_features, self.dtype = num_features, dtype
    self.alpha = _param.param(
      jnp.full((1,), alpha_init, param_dtype),
      (None,) if axis_names is not None else None,
    )
    self.scale = (
      _init(scale_init, rngs, num_features, param_dtype, axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _init(bias_init, rngs, num_features, param_dtype, axis_names)
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.dyt(x, self.alpha[...], _maybe(self.scale), _maybe(self.bias))
    return _cast(y, self.dtype)


class SeeDNorm(nnx.Module):
  """SeeDNorm over the last axis; see `jaxnorm.norms.seed_norm`.

  Parameters ``scale`` (gamma, init 1), ``dyn_scale`` (alpha, init
  ``dyn_scale_init`` = 1) and ``dyn_proj`` (beta, init 0), the paper's
  language-model init: the layer starts as RMSNorm while ``dyn_proj`` still
  receives gradient. The paper decays ``dyn_scale`` and ``dyn_proj`` (not
  ``scale``); build optimizer masks from those names.
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    num_heads: int = 1,
    dyn_scale_init: float = 1.0,
    dyn_scale_div_dim: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "SeeDNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_heads", num_heads)
    _checks.check_divisible(
      who, "num_features", num_features, "num_heads", num_heads
    )
    self.num_features, self.eps, self.num_heads = num_features, eps, num_heads
    self.dyn_scale_div_dim, self.dtype = dyn_scale_div_dim, dtype
    del rngs  # Constant initialization only.
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.dyn_scale = _param.param(
      jnp.full(shape, dyn_scale_init, param_dtype), axis_names
    )
    self.dyn_proj = _param.param(jnp.zeros(shape, param_dtype), axis_names)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.seed_norm(
      x,
      self.scale[...],
      self.dyn_scale[...],
      self.dyn_proj[...],
      eps=self.eps,
      num_heads=self.num_heads,
      dyn_scale_div_dim=self.dyn_scale_div_dim,
    )
    return _cast(y, self.dtype)


class EvoNormB0(nnx.Module):
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
    del rngs  # Constant initialization only.
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (
      _param.param(jnp.ones(shape, param_dtype), axis_names)
      if apply_act
      else None
    )
    state = norms.init_evo_norm_b0_state(num_features, param_dtype)
    self.var = _param.param(state.var, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``var``."""
    eval_mode = (
      self.use_running_average
      if use_running_average is None
      else use_running_average
    )
    y, new_state = norms.evo_norm_b0(
      x,
      self.scale[...],
      self.bias[...],
      _maybe(self.v),
      norms.EvoNormB0State(self.var[...]),
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.var[...] = new_state.var
    return _cast(y, self.dtype)


class EvoNormS0(nnx.Module):
  """EvoNorm-S0 (or S0a) of NHWC input; see `jaxnorm.norms.evo_norm_s0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``). Stateless.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int | None = 32,
    group_size: int | None = None,
    eps: float = 1e-5,
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
    del rngs  # Constant initialization only.
    self.num_groups = norms._resolve_groups(
      who, "num_features", num_features, num_groups, group_size
    )
    self.num_features, self.eps, self.variant = num_features, eps, variant
    self.dtype = dtype
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (
      _param.param(jnp.ones(shape, param_dtype), axis_names)
      if apply_act
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (NHWC) with this module's parameters."""
    y = norms.evo_norm_s0(
      x,
      self.scale[...],
      self.bias[...],
      _maybe(self.v),
      num_groups=self.num_groups,
      eps=self.eps,
      variant=self.variant,
    )
    return _cast(y, self.dtype)


class BackwardStat(nnx.Variable):
  """State that a custom backward pass updates (PowerNorm, UN).

  The pure functions return the increment of such state as its cotangent.
  Differentiate with respect to it as well, e.g. ``nnx.grad(loss,
  argnums=nnx.DiffState(0, BACKWARD_DIFF))``, keep it out of the optimizer,
  and add it with `apply_backward_updates`. Plain ``nnx.grad`` (parameters
  only) leaves it unchanged.
  """


BACKWARD_DIFF = nnx.Any(nnx.Param, BackwardStat)


def apply_backward_updates(module: nnx.Module, grads: nnx.State) -> None:
  """Adds the `BackwardStat` increments found in ``grads`` to ``module``.

  Args:
    module: the model that was differentiated.
    grads: gradients taken with respect to (at least) its `BackwardStat`
      variables, e.g. with ``nnx.DiffState(0, BACKWARD_DIFF)``.
  """
  increments = nnx.split_state(grads, BackwardStat, ...)[0]
  current = nnx.state(module, BackwardStat)
  nnx.update(
    module,
    jax.tree.map(lambda v, d: v + d.astype(v.dtype), current, increments),
  )


def _counter(names: Names) -> nnx.BatchStat:
  return _param.param(
    jnp.zeros((), jnp.int32), None if names is None else (), nnx.BatchStat
  )


class PowerNorm(nnx.Module):
  """PowerNorm over the last axis; see `jaxnorm.norms.power_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count`` and
  ``running_phi``; `BackwardStat` ``grad_ema`` (updated through the
  backward pass, see `BackwardStat`). ``use_running_average`` selects
  inference, as in `BatchNorm`. Call with ``pad_mask`` (``x.shape[:-1]``,
  True at pads) for padded batches.
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    alpha_fwd: float = 0.9,
    alpha_bkw: float = 0.9,
    warmup_iters: int = 10000,
    num_groups: int | None = 1,
    group_eps: float = 1e-5,
    backward_stat: norms.BackwardStat = "batch",
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "PowerNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(
      who, "backward_stat", backward_stat, ("batch", "running")
    )
    if num_groups is not None:
      norms._resolve_groups(who, "num_features", num_features, num_groups, None)
    del rngs  # Constant initialization only.
    self.num_features, self.eps = num_features, eps
    self.alpha_fwd, self.alpha_bkw = alpha_fwd, alpha_bkw
    self.warmup_iters, self.num_groups = warmup_iters, num_groups
    self.group_eps, self.backward_stat = group_eps, backward_stat
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    state = norms.init_power_norm_state(num_features, param_dtype)
    self.count = _counter(axis_names)
    self.running_phi = _param.param(
      state.running_phi, axis_names, nnx.BatchStat
    )
    self.grad_ema = _param.param(state.grad_ema, axis_names, BackwardStat)

  def state_tuple(self) -> norms.PowerNormState:
    """The module's statistics as a `jaxnorm.norms.PowerNormState`."""
    return norms.PowerNormState(
      self.count[...], self.running_phi[...], self.grad_ema[...]
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    pad_mask: jax.Array | None = None,
    use_running_average: bool | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    eval_mode = (
      self.use_running_average
      if use_running_average is None
      else use_running_average
    )
    y, new = norms.power_norm(
      x,
      self.scale[...],
      self.bias[...],
      self.state_tuple(),
      training=not eval_mode,
      pad_mask=pad_mask,
      eps=self.eps,
      alpha_fwd=self.alpha_fwd,
      alpha_bkw=self.alpha_bkw,
      warmup_iters=self.warmup_iters,
      num_groups=self.num_groups,
      group_eps=self.group_eps,
      backward_stat=self.backward_stat,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.count[...] = new.count
      self.running_phi[...] = new.running_phi
    return _cast(y, self.dtype)


class UnifiedNorm(nnx.Module):
  """Unified Normalization over the last axis; see `norms.unified_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count``,
  ``skip_count``, ``running_var`` and ``buf_x2``; `BackwardStat`
  ``grad_ema`` and ``buf_gz``. ``window_size`` is an int or ``(W_f, W_b)``.
  `fold` returns the kernel and bias of an adjacent linear layer with this
  (inference-mode) layer folded in.
  """

  def __init__(
    self,
    num_features: int,
    *,
    window_size: int | tuple[int, int] = 4,
    warmup_iters: int = 4000,
    eps: float = 1e-5,
    momentum: float = 0.9,
    outlier_filtration: bool = False,
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("UnifiedNorm", "num_features", num_features)
    del rngs  # Constant initialization only.
    state = norms.init_unified_norm_state(
      num_features, window_size, param_dtype
    )
    self.num_features, self.warmup_iters = num_features, warmup_iters
    self.eps, self.momentum = eps, momentum
    self.outlier_filtration = outlier_filtration
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    buf_names = None if axis_names is None else (None, *axis_names)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.count = _counter(axis_names)
    self.skip_count = _counter(axis_names)
    self.running_var = _param.param(
      state.running_var, axis_names, nnx.BatchStat
    )
    self.buf_x2 = _param.param(state.buf_x2, buf_names, nnx.BatchStat)
    self.grad_ema = _param.param(state.grad_ema, axis_names, BackwardStat)
    self.buf_gz = _param.param(state.buf_gz, buf_names, BackwardStat)

  def state_tuple(self) -> norms.UnifiedNormState:
    """The module's statistics as a `jaxnorm.norms.UnifiedNormState`."""
    return norms.UnifiedNormState(
      self.count[...],
      self.skip_count[...],
      self.running_var[...],
      self.grad_ema[...],
      self.buf_x2[...],
      self.buf_gz[...],
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    pad_mask: jax.Array | None = None,
    use_running_average: bool | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    eval_mode = (
      self.use_running_average
      if use_running_average is None
      else use_running_average
    )
    y, new = norms.unified_norm(
      x,
      self.scale[...],
      self.bias[...],
      self.state_tuple(),
      training=not eval_mode,
      pad_mask=pad_mask,
      warmup_iters=self.warmup_iters,
      eps=self.eps,
      momentum=self.momentum,
      outlier_filtration=self.outlier_filtration,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.count[...] = new.count
      self.skip_count[...] = new.skip_count
      self.running_var[...] = new.running_var
      self.buf_x2[...] = new.buf_x2
    return _cast(y, self.dtype)

  def fold(
    self,
    kernel: jax.Array,
    kernel_bias: jax.Array | None = None,
    *,
    position: str = "next",
  ) -> tuple[jax.Array, jax.Array]:
    """Folds this layer into a linear layer; see `norms.fold_unified_norm`."""
    return norms.fold_unified_norm(
      self.scale[...],
      self.bias[...],
      self.running_var[...],
      kernel,
      kernel_bias,
      eps=self.eps,
      position=position,
    )


class RegionNormB(nnx.Module):
  """RN-B, region normalization with a given mask; see `norms.region_norm_b`.

  Parameters ``scale_fg``, ``bias_fg``, ``scale_bg``, ``bias_bg`` (all 0,
  used as ``1 + scale``). Call with ``mask`` (1 = foreground, e.g. hole
  pixels), ``(n, *spatial, 1)`` at any resolution: it is resized to the
  feature map with torch-style nearest interpolation. Without a mask the
  whole map is one region (training-mode BatchNorm plus the fg affine and
  both shifts).
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    masked_bias: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("RegionNormB", "num_features", num_features)
    del rngs  # Constant initialization only.
    self.num_features, self.eps, self.masked_bias = (
      num_features,
      eps,
      (masked_bias),
    )
    self.axis_name, self.dtype = axis_name, dtype
    zeros = jnp.zeros((num_features,), param_dtype)
    self.scale_fg = _param.param(zeros, axis_names)
    self.bias_fg = _param.param(zeros, axis_names)
    self.scale_bg = _param.param(zeros, axis_names)
    self.bias_bg = _param.param(zeros, axis_names)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Normalizes NHWC ``x`` within the regions of ``mask``."""
    if mask is None:
      mask = jnp.ones((*x.shape[:-1], 1), jnp.float32)
    elif mask.shape[1:-1] != x.shape[1:-1]:
      mask = norms.resize_mask_nearest(mask, x.shape[1:-1])
    y = norms.region_norm_b(
      x,
      mask,
      self.scale_fg[...],
      self.bias_fg[...],
      self.scale_bg[...],
      self.bias_bg[...],
      eps=self.eps,
      masked_bias=self.masked_bias,
      axis_name=self.axis_name,
    )
    return _cast(y, self.dtype)


def _torch_uniform(
  rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype: Any
) -> jax.Array:
  """The torch default conv init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

  Kaiming-uniform with ``a = sqrt(5)`` for the weight gives this bound, and
  torch draws the bias from the same range.
  """
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(
    rngs.params(), shape, jnp.float32, -bound, bound
  ).astype(dtype)


class RegionNormL(nnx.Module):
  """RN-L, region normalization with a learned mask (`norms.region_norm_l`).

  Parameters (HWIO convs, torch default init): ``mask_kernel``
  ``(k, k, 2, 1)``; ``scale_kernel``/``scale_bias`` and
  ``bias_kernel``/``bias_bias`` (``(k, k, 1, 1)`` and ``(1,)``).
  """

  def __init__(
    self,
    num_features: int,
    *,
    kernel_size: int = 7,
    threshold: float = 0.8,
    eps: float = 1e-5,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "RegionNormL"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "kernel_size", kernel_size)
    if kernel_size % 2 == 0:
      raise ValueError(f"{who}: kernel_size must be odd, got {kernel_size=}")
    self.num_features, self.threshold, self.eps = num_features, threshold, eps
    self.axis_name, self.dtype = axis_name, dtype
    k = kernel_size
    conv_names = None if axis_names is None else (None,) * 4
    bias_names = None if axis_names is None else (None,)
    self.mask_kernel = _param.param(
      _torch_uniform(rngs, (k, k, 2, 1), 2 * k * k, param_dtype), conv_names
    )
    self.scale_kernel = _param.param(
      _torch_uniform(rngs, (k, k, 1, 1), k * k, param_dtype), conv_names
    )
    self.scale_bias = _param.param(
      _torch_uniform(rngs, (1,), k * k, param_dtype), bias_names
    )
    self.bias_kernel = _param.param(
      _torch_uniform(rngs, (k, k, 1, 1), k * k, param_dtype), conv_names
    )
    self.bias_bias = _param.param(
      _torch_uniform(rngs, (1,), k * k, param_dtype), bias_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes NHWC ``x`` within its learned regions."""
    y = norms.region_norm_l(
      x,
      self.mask_kernel[...],
      self.scale_kernel[...],
      self.scale_bias[...],
      self.bias_kernel[...],
      self.bias_bias[...],
      threshold=self.threshold,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    return _cast(y, self.dtype)


class UnMixTNS(nnx.Module):
  """UnMix-TNS test-time normalization; see `jaxnorm.norms.unmix_tns`.

  Parameters ``scale``/``bias`` (the replaced BatchNorm's); `nnx.BatchStat`
  components ``mean`` and ``var`` of shape ``(K, C)``, initialized from
  ``source_mean``/``source_var`` (default 0 and 1) with noise from
  ``rngs.params()``. Every call updates the components unless
  ``update_stats=False``. `from_batch_norm` replaces a trained `BatchNorm`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_components: int = 16,
    spread: float = 0.5,
    temperature: float = 0.07,
    momentum: float | None = None,
    eps: float = 1e-5,
    update_stats: bool = True,
    source_mean: jax.Array | None = None,
    source_var: jax.Array | None = None,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("UnMixTNS", "num_features", num_features)
    self.num_features, self.temperature = num_features, temperature
    self.momentum, self.eps, self.update_stats = momentum, eps, update_stats
    self.axis_name, self.dtype = axis_name, dtype
    shape = (num_features,)
    mean = jnp.zeros(shape) if source_mean is None else source_mean
    var = jnp.ones(shape) if source_var is None else source_var
    state = norms.init_unmix_tns_state(
      mean,
      var,
      rngs.params(),
      num_components=num_components,
      spread=spread,
      dtype=param_dtype,
    )
    comp_names = None if axis_names is None else (None, *axis_names)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.mean = _param.param(state.mean, comp_names, nnx.BatchStat)
    self.var = _param.param(state.var, comp_names, nnx.BatchStat)

  @classmethod
  def from_batch_norm(
    cls, bn: BatchNorm, *, rngs: nnx.Rngs, **kwargs: Any
  ) -> UnMixTNS:
    """An UnMix-TNS layer with ``bn``'s affine, eps and source statistics."""
    kwargs.setdefault("eps", bn.eps)
    module = cls(
      bn.num_features,
      source_mean=bn.mean[...],
      source_var=bn.var[...],
      param_dtype=bn.mean[...].dtype,
      rngs=rngs,
      **kwargs,
    )
    if bn.scale is not None:
      module.scale[...] = bn.scale[...]
    if bn.bias is not None:
      module.bias[...] = bn.bias[...]
    return module

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes NHWC ``x``; updates the components (``update_stats``)."""
    y, new = norms.unmix_tns(
      x,
      self.scale[...],
      self.bias[...],
      norms.UnMixTNSState(self.mean[...], self.var[...]),
      momentum=self.momentum,
      temperature=self.temperature,
      eps=self.eps,
      update=self.update_stats,
      axis_name=self.axis_name,
    )
    if self.update_stats:
      self.mean[...] = new.mean
      self.var[...] = new.var
    return _cast(y, self.dtype)


class L1LayerNorm(nnx.Module):
  """L1 LayerNorm over the last axis; see `jaxnorm.norms.l1_layer_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    kappa: float = norms.L1_KAPPA,
    eps_mode: norms.EpsMode = "outside",
    use_scale: bool = True,
    use_bias: bool = True,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("L1LayerNorm", "num_features", num_features)
    _checks.check_choice("L1LayerNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    del rngs  # Constant initialization only.
    self.num_features, self.eps, self.kappa = num_features, eps, kappa
    self.eps_mode, self.dtype = eps_mode, dtype
    shape = (num_features,)
    self.scale = (
      _param.param(jnp.ones(shape, param_dtype), axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _param.param(jnp.zeros(shape, param_dtype), axis_names)
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.l1_layer_norm(
      x,
      _maybe(self.scale),
      _maybe(self.bias),
      eps=self.eps,
      kappa=self.kappa,
      eps_mode=self.eps_mode,
    )
    return _cast(y, self.dtype)


class L1BatchNorm(nnx.Module):
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
    del rngs  # Constant initialization only.
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.kappa, self.eps_mode = kappa, eps_mode
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    state = norms.init_l1_batch_norm_state(num_features, param_dtype)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.mean = _param.param(state.mean, axis_names, nnx.BatchStat)
    self.dev = _param.param(state.dev, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``dev``."""
    eval_mode = (
      self.use_running_average
      if use_running_average is None
      else use_running_average
    )
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
    return _cast(y, self.dtype)


NormRole = Literal["input", "output"]
NORM_ROLES: tuple[str, ...] = ("input", "output")


class ScaleVectorNorm(nnx.Module):
  """RMSNorm whose scale vectors follow the scale-vector paper's switches.

  Maths in `jaxnorm.norms.branch_rms_norm` and
  `jaxnorm.norms.magnitude_direction_scale`. Switches (defaults give the
  plain `RMSNorm`):

  * ``num_branches`` (HG): one affine-free RMSNorm read by that many
    branches (Q, K, V; gate, up), each with its own scale; the call then
    returns a tuple. Parameter ``scale`` has shape ``(num_features,)`` or
    ``(num_branches, num_features)``.
  * ``reparam`` (magnitude-direction): each scale is
    ``scale_magnitude * scale_direction / ||scale_direction|| * sqrt(d)``
    (parameters ``scale_magnitude`` and ``scale_direction``, init 1).
  * ``role``: ``"input"`` (pre-norm, decayed under IWD) or ``"output"``
    (QK-norm, post-branch norm; not decayed); read by `weight_decay_mask`.

  The third improvement, dual placement, is `DualScaledLinear`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_branches: int = 1,
    reparam: bool = False,
    eps: float = 1e-6,
    eps_mode: norms.EpsMode = "inside",
    role: NormRole = "input",
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "ScaleVectorNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_branches", num_branches)
    _checks.check_choice(who, "role", role, NORM_ROLES)
    _checks.check_choice(who, "eps_mode", eps_mode, norms.EPS_MODES)
    del rngs  # Constant initialization only.
    self.num_features, self.num_branches = num_features, num_branches
    self.reparam, self.eps, self.eps_mode = reparam, eps, eps_mode
    self.role, self.dtype = role, dtype
    lead = () if num_branches == 1 else (num_branches,)
    names = (
      None if axis_names is None else (None,) * len(lead) + tuple(axis_names)
    )
    vec = jnp.ones((*lead, num_features), param_dtype)
    if reparam:
      self.scale_magnitude = _param.param(
        jnp.ones(lead or (1,), param_dtype),
        None if axis_names is None else (None,),
      )
      self.scale_direction = _param.param(vec, names)
    else:
      self.scale = _param.param(vec, names)

  def scales(self) -> list[jax.Array]:
    """The effective per-branch scale vectors."""
    if not self.reparam:
      s = self.scale[...]
      return [s] if self.num_branches == 1 else list(s)
    m, u = self.scale_magnitude[...], self.scale_direction[...]
    if self.num_branches == 1:
      return [norms.magnitude_direction_scale(m, u)]
    return [
      norms.magnitude_direction_scale(m[i], u[i])
      for i in range(self.num_branches)
    ]

  def __call__(self, x: jax.Array) -> jax.Array | tuple[jax.Array, ...]:
    """Normalizes ``x``; a tuple of branch outputs if ``num_branches > 1``."""
    ys = norms.branch_rms_norm(
      x, self.scales(), eps=self.eps, eps_mode=self.eps_mode
    )
    ys = tuple(_cast(y, self.dtype) for y in ys)
    return ys[0] if self.num_branches == 1 else ys


class DualScaledLinear(nnx.Module):
  """A bias-free linear map with optional two-sided scale vectors.

  Maths in `jaxnorm.norms.dual_scaled_linear`. ``dual=True`` adds
  ``scale_in`` and ``scale_out`` (init 1, the paper's DP), ``dnp=True`` the
  extra RMS normalization (DNP). The defaults are a plain linear layer.
  ``role`` tags the scales for `weight_decay_mask`; which role the paper
  gives them is unverified (default ``"input"``).
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    dual: bool = False,
    dnp: bool = False,
    eps: float = 1e-6,
    role: NormRole = "input",
    kernel_init: Initializer = nnx.initializers.lecun_normal(),
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    kernel_axis_names: Names = ("embed", "mlp"),
    rngs: nnx.Rngs,
  ):
    who = "DualScaledLinear"
    _checks.check_positive_int(who, "in_features", in_features)
    _checks.check_positive_int(who, "out_features", out_features)
    _checks.check_choice(who, "role", role, NORM_ROLES)
    self.in_features, self.out_features = in_features, out_features
    self.dnp, self.eps, self.role, self.dtype = dnp, eps, role, dtype
    self.kernel = _param.param(
      kernel_init(rngs.params(), (in_features, out_features), param_dtype),
      kernel_axis_names,
    )
    in_names = None if kernel_axis_names is None else kernel_axis_names[:1]
    out_names = None if kernel_axis_names is None else kernel_axis_names[1:]
    self.scale_in = (
      _param.param(jnp.ones((in_features,), param_dtype), in_names)
      if dual
      else None
    )
    self.scale_out = (
      _param.param(jnp.ones((out_features,), param_dtype), out_names)
      if dual
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ``s_out * ((s_in * x) @ kernel)`` (then RMS with ``dnp``)."""
    y = norms.dual_scaled_linear(
      x,
      self.kernel[...],
      _maybe(self.scale_in),
      _maybe(self.scale_out),
      dnp=self.dnp,
      eps=self.eps,
    )
    return _cast(y, self.dtype)


class CLSNorm(nnx.Module):
  """[CLS]-specialized LayerNorm/RMSNorm (`norms.specialized_layer_norm`).

  Parameters ``scale_cls``, ``scale_patch`` (1) and, for
  ``kind="layer"``, ``bias_cls``, ``bias_patch`` (0). Token types come
  from the call's ``token_type`` or, by default, from the layout
  ``[CLS] * num_cls_tokens, registers, patches`` along axis -2
  (`jaxnorm.norms.cls_token_type`). `from_shared` clones a trained shared
  norm, so the specialized model starts equal to it.
  """

  def __init__(
    self,
    num_features: int,
    *,
    kind: Literal["layer", "rms"] = "layer",
    eps: float = 1e-6,
    num_cls_tokens: int = 1,
    num_registers: int = 0,
    registers_with: norms.RegistersWith = "patch",
    role: NormRole = "input",
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "CLSNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "kind", kind, ("layer", "rms"))
    _checks.check_choice(
      who, "registers_with", registers_with, ("patch", "cls")
    )
    _checks.check_choice(who, "role", role, NORM_ROLES)
    del rngs  # Constant initialization only.
    self.num_features, self.kind, self.eps = num_features, kind, eps
    self.num_cls_tokens, self.num_registers = num_cls_tokens, num_registers
    self.registers_with, self.role, self.dtype = registers_with, role, dtype
    ones = jnp.ones((num_features,), param_dtype)
    zeros = jnp.zeros((num_features,), param_dtype)
    self.scale_cls = _param.param(ones, axis_names)
    self.scale_patch = _param.param(ones, axis_names)
    use_bias = kind == "layer"
    self.bias_cls = _param.param(zeros, axis_names) if use_bias else None
    self.bias_patch = _param.param(zeros, axis_names) if use_bias else None

  @classmethod
  def from_shared(cls, norm: LayerNorm | RMSNorm, **kwargs: Any) -> CLSNorm:
    """Both copies cloned from a shared `LayerNorm` or `RMSNorm`."""
    if not isinstance(norm, (LayerNorm, RMSNorm)):
      raise TypeError(
        "CLSNorm.from_shared: norm must be a LayerNorm or "
        f"RMSNorm, got {type(norm).__name__}"
      )
    kind = "layer" if isinstance(norm, LayerNorm) else "rms"
    if norm.scale is None or norm.scale_offset:
      raise ValueError(
        "CLSNorm.from_shared: the shared norm must have a "
        "scale and scale_offset=0"
      )
    if kind == "layer" and norm.bias is None:
      raise ValueError(
        "CLSNorm.from_shared: the shared LayerNorm must have a bias"
      )
    if kind == "rms" and norm.eps_mode != "inside":
      raise ValueError(
        "CLSNorm.from_shared: the shared RMSNorm must use eps_mode='inside'"
      )
    module = cls(
      norm.num_features,
      kind=kind,
      eps=norm.eps,
      dtype=norm.dtype,
      param_dtype=norm.scale[...].dtype,
      rngs=nnx.Rngs(0),
      **kwargs,
    )
    module.scale_cls[...] = norm.scale[...]
    module.scale_patch[...] = norm.scale[...]
    if kind == "layer":
      module.bias_cls[...] = norm.bias[...]
      module.bias_patch[...] = norm.bias[...]
    return module

  def __call__(
    self, x: jax.Array, token_type: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``(..., seq, d)`` tokens with per-type affines."""
    if token_type is None:
      token_type = norms.cls_token_type(
        x.shape[-2],
        num_cls_tokens=self.num_cls_tokens,
        num_registers=self.num_registers,
        registers_with=self.registers_with,
      )
    y = norms.specialized_layer_norm(
      x,
      token_type,
      self.scale_cls[...],
      _maybe(self.bias_cls),
      self.scale_patch[...],
      _maybe(self.bias_patch),
      eps=self.eps,
      kind=self.kind,
    )
    return _cast(y, self.dtype)


class TimestepDecayNorm(nnx.Module):
  """Gecko timestep-decay norm; see `jaxnorm.norms.timestep_decay_norm`.

  Parameters ``scale`` (used as ``1 + scale``) and ``bias``, both 0. The
  streaming state is not stored in the module: pass ``state`` and set
  ``return_state=True`` to carry it across segments.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int = 64,
    beta1: float = 0.999,
    beta2: float = 0.9999,
    eps: float = 1e-5,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "TimestepDecayNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_groups", num_groups)
    _checks.check_divisible(
      who, "num_features", num_features, "num_groups", num_groups
    )
    if num_groups >= num_features:
      raise ValueError(
        f"{who}: num_groups must be < num_features="
        f"{num_features}, got {num_groups=}"
      )
    del rngs  # Constant initialization only.
    self.num_features, self.num_groups = num_features, num_groups
    self.beta1, self.beta2, self.eps, self.dtype = beta1, beta2, eps, dtype
    zeros = jnp.zeros((num_features,), param_dtype)
    self.scale = _param.param(zeros, axis_names)
    self.bias = _param.param(zeros, axis_names)

  def __call__(
    self,
    x: jax.Array,
    *,
    state: norms.TimestepDecayNormState | None = None,
    padding_mask: jax.Array | None = None,
    bos_mask: jax.Array | None = None,
    return_state: bool = False,
  ) -> jax.Array | tuple[jax.Array, norms.TimestepDecayNormState]:
    """Normalizes ``(B, L, D)`` causally; optionally returns the state."""
    y, new = norms.timestep_decay_norm(
      x,
      self.scale[...],
      self.bias[...],
      state,
      num_groups=self.num_groups,
      beta1=self.beta1,
      beta2=self.beta2,
      eps=self.eps,
      padding_mask=padding_mask,
      bos_mask=bos_mask,
    )
    y = _cast(y, self.dtype)
    return (y, new) if return_state else y


NormName = Literal[
  "layernorm",
  "rmsnorm",
  "crmsnorm",
  "batchnorm",
  "groupnorm",
  "instancenorm",
  "dyt",
  "seednorm",
  "evonormb0",
  "evonorms0",
  "powernorm",
  "unifiednorm",
  "regionnormb",
  "regionnorml",
  "unmixtns",
  "l1layernorm",
  "l1batchnorm",
  "scalevectornorm",
  "clsnorm",
  "timestepdecaynorm",
]

NORMS: Mapping[str, type[nnx.Module]] = types.MappingProxyType(
  {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "crmsnorm": CRMSNorm,
    "batchnorm": BatchNorm,
    "groupnorm": GroupNorm,
    "instancenorm": InstanceNorm,
    "dyt": DyT,
    "seednorm": SeeDNorm,
    "evonormb0": EvoNormB0,
    "evonorms0": EvoNormS0,
    "powernorm": PowerNorm,
    "unifiednorm": UnifiedNorm,
    "regionnormb": RegionNormB,
    "regionnorml": RegionNormL,
    "unmixtns": UnMixTNS,
    "l1layernorm": L1LayerNorm,
    "l1batchnorm": L1BatchNorm,
    "scalevectornorm": ScaleVectorNorm,
    "clsnorm": CLSNorm,
    "timestepdecaynorm": TimestepDecayNorm,
  }
)


def make_norm(
  name: NormName, num_features: int, *, rngs: nnx.Rngs, **kwargs: Any
) -> nnx.Module:
  """Builds a norm module by name.

  Args:
    name: one of `NORMS` (``"layernorm"``, ``"rmsnorm"``, ...).
    num_features: size of the normalized axis.
    rngs: parameter RNG streams.
    **kwargs: keyword arguments of the chosen module.

  Returns:
    The module.

  Raises:
    ValueError: for an unknown name; the message lists every valid name.
  """
  if name not in NORMS:
    raise ValueError(
      f"make_norm: unknown norm {name!r}; valid names are "
      f"{', '.join(sorted(NORMS))}"
    )
  return NORMS[name](num_features, rngs=rngs, **kwargs)


# ---------------------------------------------------------------------------
# Weight-decay masks for scale vectors (IWD).

WeightDecayRule = Literal["iwd", "all", "none"]

OUTPUT_NORM_PATTERN = (
  r"(q|k|qk|query|key)_?norm|post_?\w*norm|\w*out_?norm"
  r"|\w*output_?norm"
)
"""Attribute names treated as Output-Norms when a module has no ``role``:
QK-norm (``q_norm``, ``k_norm``, ``qk_norm``, ...) and post-branch norms
(``post_norm``, ``post_attn_norm``, ``out_norm``, ...)."""

_SCALE_NAMES = re.compile(r"scale\w*")


def _norm_role(
  path: tuple[Any, ...],
  node: nnx.Module,
  roles: Mapping[str, str] | None,
  pattern: re.Pattern[str],
) -> str:
  role = getattr(node, "role", None)
  if role is not None:
    return role
  name = str(path[-1]) if path else ""
  if roles is not None and name in roles:
    return roles[name]
  return "output" if pattern.fullmatch(name) else "input"


def weight_decay_mask(
  model: nnx.Module,
  *,
  rule: WeightDecayRule = "iwd",
  roles: Mapping[str, NormRole] | None = None,
  decay_others: bool = True,
  output_pattern: str = OUTPUT_NORM_PATTERN,
) -> Callable[[Any], Any]:
  """Builds the optax weight-decay mask for the scale vectors of ``model``.

  A norm module is any module registered in `NORMS`, or any module with a
  ``role`` attribute (`ScaleVectorNorm`, `DualScaledLinear`, `CLSNorm`).
  Its role is, in order: its ``role`` attribute; ``roles[name]`` for its
  attribute name; ``"output"`` if the name matches ``output_pattern``
  (QK-norms and post-branch norms); else ``"input"`` (pre-norms and, an
  unverified default, the final norm). Scale parameters of a norm (names
  ``scale*``) are decayed according to ``rule``:

  * ``"iwd"``: decay Input-Norm scales, never Output-Norm scales (the
    paper's rule: decay helps Input-Norms and hurts Output-Norms);
  * ``"all"`` / ``"none"``: decay every / no norm scale (the baselines).

  Other parameters of a norm (biases, convs of RN-L, ...) are not decayed;
  parameters outside norms follow ``decay_others``.

  Args:
    model: the module tree.
    rule: ``"iwd"``, ``"all"`` or ``"none"``.
    roles: optional role per attribute name, overriding the pattern.
    decay_others: decay of the parameters outside norm modules.
    output_pattern: regular expression of Output-Norm attribute names.

  Returns:
    A function of a parameter tree (``nnx.state(model, nnx.Param)``, as
    given to optax by `nnx.Optimizer`) returning the same tree of bools
    (True = decay), for ``optax.masked`` / ``optax.add_decayed_weights``.

  Raises:
    ValueError: for a bad ``rule`` or role.

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "weight_decay_mask"
  _checks.check_choice(who, "rule", rule, ("iwd", "all", "none"))
  for name, role in (roles or {}).items():
    _checks.check_choice(who, f"roles[{name!r}]", role, NORM_ROLES)
  pattern = re.compile(output_pattern)
  norm_types = tuple(NORMS.values())
  module_roles = {}
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Module) and (
      isinstance(node, norm_types) or hasattr(node, "role")
    ):
      module_roles[tuple(path)] = _norm_role(tuple(path), node, roles, pattern)
  decisions = {}
  for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    path = tuple(path)
    role = module_roles.get(path[:-1])
    if role is None:
      decisions[path] = decay_others
    elif _SCALE_NAMES.fullmatch(str(path[-1])):
      decisions[path] = (rule == "all") or (rule == "iwd" and role == "input")
    else:
      decisions[path] = False

  def mask_fn(params: Any) -> Any:
    def decide(key_path, _):
      keys = tuple(
        k.key if isinstance(k, jax.tree_util.DictKey) else k.idx
        for k in key_path
        if isinstance(k, (jax.tree_util.DictKey, jax.tree_util.SequenceKey))
      )
      if keys not in decisions:
        raise ValueError(
          f"{who}: parameter {keys} is not a parameter of "
          "the model the mask was built for"
        )
      return decisions[keys]

    return jax.tree.map_with_path(decide, params)

  return mask_fn
