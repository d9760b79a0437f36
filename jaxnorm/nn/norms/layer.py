"""Per-token norms: LayerNorm, RMSNorm, CRMSNorm, DyT, SeeDNorm, L1 LN."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _dispatch, fused_norms, norms
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  cast,
  draw_keys,
  flax_spelling,
  maybe,
  optional,
  param,
  promote,
)


def fused_add_norm(
  module: LayerNorm | RMSNorm,
  fused: Callable[..., tuple[jax.Array, jax.Array]],
  x: jax.Array,
  residual: jax.Array,
  *params: jax.Array | None,
  **kwargs: Any,
) -> tuple[jax.Array, jax.Array]:
  """``module.add_and_norm``: the fused add+norm with its settings.

  ``h = x + residual`` has ``residual.dtype``; ``y`` equals ``module(h)``
  except that, with ``dtype=None`` and parameters wider than ``residual``,
  it is computed in ``residual.dtype`` and then promoted (Deviation: the
  fused kernel writes the stream's dtype).
  """
  h, y = fused(
    x,
    residual,
    *params,
    eps=module.eps,
    scale_offset=module.scale_offset,
    implementation=module.implementation,
    **kwargs,
  )
  return h, cast(promote(y, module), module)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis; maths in `jaxnorm.norms.layer_norm`."""

  @flax_spelling
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
      x: input ``(..., num_features)``.
      mask: boolean, as in flax: the statistics run over the ``True``
        elements only (``x.shape[:-1]`` masks positions, any other shape
        broadcasts against ``x``); see `jaxnorm.norms.masked`. The
        masked form has no Pallas kernel (``implementation`` None or
        ``"xla"``).

    Returns:
      The normalized ``x``.
    """
    x = promote(x, self)
    y = norms.layer_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      eps=self.eps,
      scale_offset=self.scale_offset,
      mask=mask,
      implementation=self.implementation,
    )
    return cast(y, self)

  def add_and_norm(
    self, x: jax.Array, residual: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Residual add then this norm, fused: ``(h, y)``, ``h = x + residual``.

    Calls `jaxnorm.fused_norms.add_layer_norm` with this module's
    parameters and ``implementation``; see `fused_add_norm`.
    """
    return fused_add_norm(
      self,
      fused_norms.add_layer_norm,
      x,
      residual,
      maybe(self.scale),
      maybe(self.bias),
    )


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis; maths in `jaxnorm.norms.rms_norm`."""

  @flax_spelling
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
    scale_key, _ = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters.

    Args:
      x: input ``(..., num_features)``.
      mask: boolean, as in flax (positional there too): the mean square
        runs over the ``True`` elements only; shapes as in `LayerNorm`.

    Returns:
      The normalized ``x``.
    """
    x = promote(x, self)
    y = norms.rms_norm(
      x,
      maybe(self.scale),
      eps=self.eps,
      eps_mode=self.eps_mode,
      scale_offset=self.scale_offset,
      mask=mask,
      implementation=self.implementation,
    )
    return cast(y, self)

  def add_and_norm(
    self, x: jax.Array, residual: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """Residual add then this norm, fused: ``(h, y)``, ``h = x + residual``.

    Calls `jaxnorm.fused_norms.add_rms_norm` with this module's parameters
    and ``implementation``; see `fused_add_norm`.
    """
    return fused_add_norm(
      self,
      fused_norms.add_rms_norm,
      x,
      residual,
      maybe(self.scale),
      eps_mode=self.eps_mode,
    )


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
    scale_key, _ = draw_keys(rngs)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    x = promote(x, self)
    y = norms.crms_norm(x, maybe(self.scale), eps=self.eps)
    return cast(y, self)


class DyT(nnx.Module):
  """Dynamic Tanh; see `jaxnorm.norms.dyt`.

  ``alpha`` is one learnable scalar (shape ``(1,)``) initialized to
  ``alpha_init`` (0.5 for vision; the LLaMA recipe uses per-position values
  and ``use_bias=False``). ``implementation`` picks the Pallas kernel
  (see `jaxnorm.norms.dyt`).
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
    implementation: _dispatch.Implementation | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("DyT", "num_features", num_features)
    _dispatch.check_implementation("DyT", implementation)
    self.num_features, self.dtype = num_features, dtype
    self.implementation = implementation
    self.alpha = param(
      jnp.full((1,), alpha_init, param_dtype),
      (None,) if axis_names is not None else None,
    )
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
    y = norms.dyt(
      x,
      self.alpha[...],
      maybe(self.scale),
      maybe(self.bias),
      implementation=self.implementation,
    )
    return cast(y, self)


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
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    shape = (num_features,)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.dyn_scale = param(
      jnp.full(shape, dyn_scale_init, param_dtype), axis_names
    )
    self.dyn_proj = param(jnp.zeros(shape, param_dtype), axis_names)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    x = promote(x, self)
    y = norms.seed_norm(
      x,
      self.scale[...],
      self.dyn_scale[...],
      self.dyn_proj[...],
      eps=self.eps,
      num_heads=self.num_heads,
      dyn_scale_div_dim=self.dyn_scale_div_dim,
    )
    return cast(y, self)


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
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_features, self.eps, self.kappa = num_features, eps, kappa
    self.eps_mode, self.dtype = eps_mode, dtype
    shape = (num_features,)
    self.scale = (
      param(jnp.ones(shape, param_dtype), axis_names) if use_scale else None
    )
    self.bias = (
      param(jnp.zeros(shape, param_dtype), axis_names) if use_bias else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    x = promote(x, self)
    y = norms.l1_layer_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      eps=self.eps,
      kappa=self.kappa,
      eps_mode=self.eps_mode,
    )
    return cast(y, self)
