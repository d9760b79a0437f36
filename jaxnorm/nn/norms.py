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


NormName = Literal["layernorm", "rmsnorm", "crmsnorm", "batchnorm",
                   "groupnorm", "instancenorm", "dyt", "seednorm",
                   "evonormb0", "evonorms0"]

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
