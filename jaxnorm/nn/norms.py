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


def _init(init: Initializer, rngs: nnx.Rngs, num_features: int,
          param_dtype: Any, names: Names) -> nnx.Param:
  value = init(rngs.params(), (num_features,), param_dtype)
  return _param.param(value, names)


def _maybe(var: nnx.Variable | None) -> jax.Array | None:
  return None if var is None else var[...]


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis; maths in `jaxnorm.norms.layer_norm`."""

  def __init__(self, num_features: int, *, eps: float = 1e-6,
               use_scale: bool = True, use_bias: bool = True,
               scale_offset: float = 0.0,
               scale_init: Initializer = nnx.initializers.ones,
               bias_init: Initializer = nnx.initializers.zeros,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("LayerNorm", "num_features", num_features)
    self.num_features, self.eps = num_features, eps
    self.scale_offset, self.dtype = scale_offset, dtype
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)
    self.bias = (_init(bias_init, rngs, num_features, param_dtype,
                       axis_names) if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.layer_norm(x, _maybe(self.scale), _maybe(self.bias),
                         eps=self.eps, scale_offset=self.scale_offset)
    return _cast(y, self.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis; maths in `jaxnorm.norms.rms_norm`."""

  def __init__(self, num_features: int, *, eps: float = 1e-6,
               eps_mode: norms.EpsMode = "inside", use_scale: bool = True,
               scale_offset: float = 0.0,
               scale_init: Initializer = nnx.initializers.ones,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("RMSNorm", "num_features", num_features)
    _checks.check_choice("RMSNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    self.num_features, self.eps, self.eps_mode = num_features, eps, eps_mode
    self.scale_offset, self.dtype = scale_offset, dtype
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.rms_norm(x, _maybe(self.scale), eps=self.eps,
                       eps_mode=self.eps_mode, scale_offset=self.scale_offset)
    return _cast(y, self.dtype)


class CRMSNorm(nnx.Module):
  """Compressed RMSNorm on ``d-1`` features; see `jaxnorm.norms.crms_norm`.

  ``num_features`` is the compressed width ``d-1``.
  """

  def __init__(self, num_features: int, *, eps: float = 1e-6,
               use_scale: bool = True,
               scale_init: Initializer = nnx.initializers.ones,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("CRMSNorm", "num_features", num_features)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)

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

  def __init__(self, num_features: int, *, momentum: float = 0.99,
               eps: float = 1e-5, use_running_average: bool = False,
               use_scale: bool = True, use_bias: bool = True,
               axis_name: str | None = None,
               scale_init: Initializer = nnx.initializers.ones,
               bias_init: Initializer = nnx.initializers.zeros,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("BatchNorm", "num_features", num_features)
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    state = norms.init_batch_norm_state(num_features, param_dtype)
    self.mean = _param.param(state.mean, axis_names, nnx.BatchStat)
    self.var = _param.param(state.var, axis_names, nnx.BatchStat)
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)
    self.bias = (_init(bias_init, rngs, num_features, param_dtype,
                       axis_names) if use_bias else None)

  def __call__(self, x: jax.Array, *,
               use_running_average: bool | None = None) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``var``."""
    eval_mode = (self.use_running_average if use_running_average is None
                 else use_running_average)
    state = norms.BatchNormState(self.mean[...], self.var[...])
    y, new_state = norms.batch_norm(
        x, _maybe(self.scale), _maybe(self.bias), state,
        training=not eval_mode, momentum=self.momentum, eps=self.eps,
        axis_name=self.axis_name)
    if not eval_mode:
      self.mean[...] = new_state.mean
      self.var[...] = new_state.var
    return _cast(y, self.dtype)


class GroupNorm(nnx.Module):
  """GroupNorm of channels-last input; see `jaxnorm.norms.group_norm`."""

  def __init__(self, num_features: int, *, num_groups: int | None = 32,
               group_size: int | None = None, eps: float = 1e-6,
               use_scale: bool = True, use_bias: bool = True,
               scale_init: Initializer = nnx.initializers.ones,
               bias_init: Initializer = nnx.initializers.zeros,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    who = "GroupNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    if (num_groups is None) == (group_size is None):
      raise ValueError(f"{who}: give exactly one of num_groups and "
                       f"group_size, got {num_groups=} and {group_size=}")
    if group_size is not None:
      _checks.check_positive_int(who, "group_size", group_size)
      _checks.check_divisible(who, "num_features", num_features,
                              "group_size", group_size)
      num_groups = num_features // group_size
    _checks.check_positive_int(who, "num_groups", num_groups)
    _checks.check_divisible(who, "num_features", num_features, "num_groups",
                            num_groups)
    self.num_features, self.num_groups = num_features, num_groups
    self.eps, self.dtype = eps, dtype
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)
    self.bias = (_init(bias_init, rngs, num_features, param_dtype,
                       axis_names) if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.group_norm(x, _maybe(self.scale), _maybe(self.bias),
                         num_groups=self.num_groups, eps=self.eps)
    return _cast(y, self.dtype)


class InstanceNorm(nnx.Module):
  """InstanceNorm of channels-last input; see `jaxnorm.norms.instance_norm`."""

  def __init__(self, num_features: int, *, eps: float = 1e-6,
               use_scale: bool = True, use_bias: bool = True,
               scale_init: Initializer = nnx.initializers.ones,
               bias_init: Initializer = nnx.initializers.zeros,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("InstanceNorm", "num_features", num_features)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)
    self.bias = (_init(bias_init, rngs, num_features, param_dtype,
                       axis_names) if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.instance_norm(x, _maybe(self.scale), _maybe(self.bias),
                            eps=self.eps)
    return _cast(y, self.dtype)


class DyT(nnx.Module):
  """Dynamic Tanh; see `jaxnorm.norms.dyt`.

  ``alpha`` is one learnable scalar (shape ``(1,)``) initialized to
  ``alpha_init`` (0.5 for vision; the LLaMA recipe uses per-position values
  and ``use_bias=False``).
  """

  def __init__(self, num_features: int, *, alpha_init: float = 0.5,
               use_scale: bool = True, use_bias: bool = True,
               scale_init: Initializer = nnx.initializers.ones,
               bias_init: Initializer = nnx.initializers.zeros,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("DyT", "num_features", num_features)
    self.num_features, self.dtype = num_features, dtype
    self.alpha = _param.param(jnp.full((1,), alpha_init, param_dtype),
                              (None,) if axis_names is not None else None)
    self.scale = (_init(scale_init, rngs, num_features, param_dtype,
                        axis_names) if use_scale else None)
    self.bias = (_init(bias_init, rngs, num_features, param_dtype,
                       axis_names) if use_bias else None)

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

  def __init__(self, num_features: int, *, eps: float = 1e-6,
               num_heads: int = 1, dyn_scale_init: float = 1.0,
               dyn_scale_div_dim: bool = False,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    who = "SeeDNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_heads", num_heads)
    _checks.check_divisible(who, "num_features", num_features, "num_heads",
                            num_heads)
    self.num_features, self.eps, self.num_heads = num_features, eps, num_heads
    self.dyn_scale_div_dim, self.dtype = dyn_scale_div_dim, dtype
    del rngs  # Constant initialization only.
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.dyn_scale = _param.param(jnp.full(shape, dyn_scale_init, param_dtype),
                                  axis_names)
    self.dyn_proj = _param.param(jnp.zeros(shape, param_dtype), axis_names)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    y = norms.seed_norm(x, self.scale[...], self.dyn_scale[...],
                        self.dyn_proj[...], eps=self.eps,
                        num_heads=self.num_heads,
                        dyn_scale_div_dim=self.dyn_scale_div_dim)
    return _cast(y, self.dtype)


class EvoNormB0(nnx.Module):
  """EvoNorm-B0 of NHWC input; see `jaxnorm.norms.evo_norm_b0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``); running variance ``var`` is an `nnx.BatchStat`.
  ``momentum`` is Flax-style (0.9 = timm's 0.1). ``use_running_average``
  selects inference, as in `BatchNorm`.
  """

  def __init__(self, num_features: int, *, momentum: float = 0.9,
               eps: float = 1e-3, use_running_average: bool = False,
               apply_act: bool = True, axis_name: str | None = None,
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    _checks.check_positive_int("EvoNormB0", "num_features", num_features)
    del rngs  # Constant initialization only.
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (_param.param(jnp.ones(shape, param_dtype), axis_names)
              if apply_act else None)
    state = norms.init_evo_norm_b0_state(num_features, param_dtype)
    self.var = _param.param(state.var, axis_names, nnx.BatchStat)

  def __call__(self, x: jax.Array, *,
               use_running_average: bool | None = None) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``var``."""
    eval_mode = (self.use_running_average if use_running_average is None
                 else use_running_average)
    y, new_state = norms.evo_norm_b0(
        x, self.scale[...], self.bias[...], _maybe(self.v),
        norms.EvoNormB0State(self.var[...]), training=not eval_mode,
        momentum=self.momentum, eps=self.eps, axis_name=self.axis_name)
    if not eval_mode:
      self.var[...] = new_state.var
    return _cast(y, self.dtype)


class EvoNormS0(nnx.Module):
  """EvoNorm-S0 (or S0a) of NHWC input; see `jaxnorm.norms.evo_norm_s0`.

  Parameters ``scale`` (1), ``bias`` (0) and ``v`` (1, absent with
  ``apply_act=False``). Stateless.
  """

  def __init__(self, num_features: int, *, num_groups: int | None = 32,
               group_size: int | None = None, eps: float = 1e-5,
               apply_act: bool = True,
               variant: norms.EvoNormS0Variant = "s0",
               dtype: Any = None, param_dtype: Any = jnp.float32,
               axis_names: Names = ("norm",), rngs: nnx.Rngs):
    who = "EvoNormS0"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "variant", variant, ("s0", "s0a"))
    del rngs  # Constant initialization only.
    self.num_groups = norms._resolve_groups(who, "num_features", num_features,
                                            num_groups, group_size)
    self.num_features, self.eps, self.variant = num_features, eps, variant
    self.dtype = dtype
    shape = (num_features,)
    self.scale = _param.param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = _param.param(jnp.zeros(shape, param_dtype), axis_names)
    self.v = (_param.param(jnp.ones(shape, param_dtype), axis_names)
              if apply_act else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (NHWC) with this module's parameters."""
    y = norms.evo_norm_s0(x, self.scale[...], self.bias[...], _maybe(self.v),
                          num_groups=self.num_groups, eps=self.eps,
                          variant=self.variant)
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
  nnx.update(module, jax.tree.map(lambda v, d: v + d.astype(v.dtype),
                                  current, increments))


def _counter(names: Names) -> nnx.BatchStat:
  return _param.param(jnp.zeros((), jnp.int32),
                      None if names is None else (), nnx.BatchStat)


class PowerNorm(nnx.Module):
  """PowerNorm over the last axis; see `jaxnorm.norms.power_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count`` and
  ``running_phi``; `BackwardStat` ``grad_ema`` (updated through the
  backward pass, see `BackwardStat`). ``use_running_average`` selects
  inference, as in `BatchNorm`. Call with ``pad_mask`` (``x.shape[:-1]``,
  True at pads) for padded batches.
  """

  def __init__(self, num_features: int, *, eps: float = 1e-5,
               alpha_fwd: float = 0.9, alpha_bkw: float = 0.9,
               warmup_iters: int = 10000, num_groups: int | None = 1,
               group_eps: float = 1e-5,
               backward_stat: norms.BackwardStat = "batch",
               use_running_average: bool = False,
               axis_name: str | None = None, dtype: Any = None,
               param_dtype: Any = jnp.float32, axis_names: Names = ("norm",),
               rngs: nnx.Rngs):
    who = "PowerNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "backward_stat", backward_stat,
                         ("batch", "running"))
    if num_groups is not None:
      norms._resolve_groups(who, "num_features", num_features, num_groups,
                            None)
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
    self.running_phi = _param.param(state.running_phi, axis_names,
                                    nnx.BatchStat)
    self.grad_ema = _param.param(state.grad_ema, axis_names, BackwardStat)

  def state_tuple(self) -> norms.PowerNormState:
    """The module's statistics as a `jaxnorm.norms.PowerNormState`."""
    return norms.PowerNormState(self.count[...], self.running_phi[...],
                                self.grad_ema[...])

  def __call__(self, x: jax.Array, *, pad_mask: jax.Array | None = None,
               use_running_average: bool | None = None) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    eval_mode = (self.use_running_average if use_running_average is None
                 else use_running_average)
    y, new = norms.power_norm(
        x, self.scale[...], self.bias[...], self.state_tuple(),
        training=not eval_mode, pad_mask=pad_mask, eps=self.eps,
        alpha_fwd=self.alpha_fwd, alpha_bkw=self.alpha_bkw,
        warmup_iters=self.warmup_iters, num_groups=self.num_groups,
        group_eps=self.group_eps, backward_stat=self.backward_stat,
        axis_name=self.axis_name)
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

  def __init__(self, num_features: int, *,
               window_size: int | tuple[int, int] = 4,
               warmup_iters: int = 4000, eps: float = 1e-5,
               momentum: float = 0.9, outlier_filtration: bool = False,
               use_running_average: bool = False,
               axis_name: str | None = None, dtype: Any = None,
               param_dtype: Any = jnp.float32, axis_names: Names = ("norm",),
               rngs: nnx.Rngs):
    _checks.check_positive_int("UnifiedNorm", "num_features", num_features)
    del rngs  # Constant initialization only.
    state = norms.init_unified_norm_state(num_features, window_size,
                                          param_dtype)
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
    self.running_var = _param.param(state.running_var, axis_names,
                                    nnx.BatchStat)
    self.buf_x2 = _param.param(state.buf_x2, buf_names, nnx.BatchStat)
    self.grad_ema = _param.param(state.grad_ema, axis_names, BackwardStat)
    self.buf_gz = _param.param(state.buf_gz, buf_names, BackwardStat)

  def state_tuple(self) -> norms.UnifiedNormState:
    """The module's statistics as a `jaxnorm.norms.UnifiedNormState`."""
    return norms.UnifiedNormState(
        self.count[...], self.skip_count[...], self.running_var[...],
        self.grad_ema[...], self.buf_x2[...], self.buf_gz[...])

  def __call__(self, x: jax.Array, *, pad_mask: jax.Array | None = None,
               use_running_average: bool | None = None) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    eval_mode = (self.use_running_average if use_running_average is None
                 else use_running_average)
    y, new = norms.unified_norm(
        x, self.scale[...], self.bias[...], self.state_tuple(),
        training=not eval_mode, pad_mask=pad_mask,
        warmup_iters=self.warmup_iters, eps=self.eps,
        momentum=self.momentum, outlier_filtration=self.outlier_filtration,
        axis_name=self.axis_name)
    if not eval_mode:
      self.count[...] = new.count
      self.skip_count[...] = new.skip_count
      self.running_var[...] = new.running_var
      self.buf_x2[...] = new.buf_x2
    return _cast(y, self.dtype)

  def fold(self, kernel: jax.Array, kernel_bias: jax.Array | None = None, *,
           position: str = "next") -> tuple[jax.Array, jax.Array]:
    """Folds this layer into a linear layer; see `norms.fold_unified_norm`."""
    return norms.fold_unified_norm(
        self.scale[...], self.bias[...], self.running_var[...], kernel,
        kernel_bias, eps=self.eps, position=position)


NormName = Literal["layernorm", "rmsnorm", "crmsnorm", "batchnorm",
                   "groupnorm", "instancenorm", "dyt", "seednorm",
                   "evonormb0", "evonorms0", "powernorm", "unifiednorm"]

NORMS: Mapping[str, type[nnx.Module]] = types.MappingProxyType({
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
})


def make_norm(name: NormName, num_features: int, *, rngs: nnx.Rngs,
              **kwargs: Any) -> nnx.Module:
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
    raise ValueError(f"make_norm: unknown norm {name!r}; valid names are "
                     f"{', '.join(sorted(NORMS))}")
  return NORMS[name](num_features, rngs=rngs, **kwargs)
