"""LayerNorm, RMSNorm and CRMSNorm modules; maths in `jaxnorm.norms.layer`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, fused_norms, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  PromoteDtype,
  cast,
  flax_spelling,
  maybe,
  optional,
  promote,
  promote_args,
)

_RMS_NO_BIAS = (
  "it re-scales without re-centring, as Zhang & Sennrich's RMSNorm; "
  "LayerNorm has a bias"
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
  fused kernel writes the stream's dtype). A ``promote_dtype`` of the
  module promotes the parameters as in ``module(h)``.
  """
  ref, *params = promote_args(module, residual, *params)
  h, y = fused(
    x,
    residual,
    *params,
    eps=module.eps,
    scale_offset=module.scale_offset,
    implementation=module.implementation,
    **kwargs,
  )
  return h, cast(y.astype(ref.dtype), module)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis; maths in `jaxnorm.norms.layer_norm`.

  flax's ``nnx.LayerNorm`` keywords: ``use_scale``/``use_bias`` (False
  drops the parameter), ``scale_init``/``bias_init``, ``dtype`` (output),
  ``param_dtype`` and ``promote_dtype`` (None: the input promoted with the
  parameters' dtypes, upcast to an explicit ``dtype``; a callable:
  ``promote_dtype((x, scale, bias), dtype=dtype)`` as in flax).

  Examples:
    >>> norm = LayerNorm(2, rngs=nnx.Rngs(0))  # scale 1, bias 0
    >>> y = norm(jnp.array([1.0, 3.0]))  # mean 2, variance 1
    >>> [round(v, 4) for v in y.tolist()]
    [-1.0, 1.0]
  """

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
    promote_dtype: PromoteDtype | None = None,
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
      x: input ``(..., num_features)``.
      mask: boolean, as in flax: the statistics run over the ``True``
        elements only (``x.shape[:-1]`` masks positions, any other shape
        broadcasts against ``x``); see `jaxnorm.norms.masked`. The
        masked form has no Pallas kernel (``implementation`` None or
        ``"xla"``).

    Returns:
      The normalized ``x``.
    """
    x, scale, bias = promote_args(self, x, maybe(self.scale), maybe(self.bias))
    y = norms.layer_norm(
      x,
      scale,
      bias,
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
  """RMSNorm over the last axis; maths in `jaxnorm.norms.rms_norm`.

  flax's ``nnx.RMSNorm`` keywords as in `LayerNorm` (``promote_dtype``
  receives ``(x, scale)``); it has no bias, so ``use_bias=True`` and
  ``bias_init`` are a `ValueError` (``use_bias=False`` is accepted).

  Examples:
    >>> norm = RMSNorm(2, rngs=nnx.Rngs(0))  # unit scale
    >>> y = norm(jnp.array([3.0, 4.0]))  # RMS sqrt(12.5)
    >>> [round(v, 4) for v in y.tolist()]
    [0.8485, 1.1314]
  """

  @flax_spelling
  @paper_affine(no_bias=_RMS_NO_BIAS)
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
    promote_dtype: PromoteDtype | None = None,
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
    self.promote_dtype = promote_dtype
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
    x, scale = promote_args(self, x, maybe(self.scale))
    y = norms.rms_norm(
      x,
      scale,
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

  ``num_features`` is the compressed width ``d-1``. No bias (as RMSNorm).

  Examples:
    >>> norm = CRMSNorm(2, rngs=nnx.Rngs(0))  # d - 1 = 2 stored features
    >>> y = norm(jnp.array([1.0, 1.0]))  # zero-mean [1, 1, -2]: RMS sqrt(2)
    >>> [round(v, 4) for v in y.tolist()]
    [0.7071, 0.7071]
  """

  @paper_affine(no_bias=_RMS_NO_BIAS)
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
