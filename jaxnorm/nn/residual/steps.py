"""Single-stream residual steps: pre, post, sandwich, scaled and gated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param
from jaxnorm.nn.residual._common import (
  NormSpec,
  Sublayer,
  build_norm,
  check_input,
  params_key,
  read_index,
  store_index,
)


def _identity(x: jax.Array) -> jax.Array:
  return x


class PreNormResidual(nnx.Module):
  """Pre-norm step ``x + f(norm(x))``; see `jaxnorm.residual.pre_norm`.

  ``layer_index`` (0-based Transformer layer: a Python integer, or an
  integer scalar array when the layers are created under ``nnx.vmap`` for
  ``nnx.scan``) enables LayerNorm Scaling. ``norm=None`` is the norm-free
  step ``x + f(x)``.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "PreNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = params_key(rngs)
    self.num_features = num_features
    self.layer_index = store_index(layer_index)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    norm = _identity if self.norm is None else self.norm
    return residual.pre_norm(
      x, sublayer, norm, layer_index=read_index(self.layer_index)
    )


class PostNormResidual(nnx.Module):
  """Post-norm step ``norm(x + f(x))``; see `jaxnorm.residual.post_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "layernorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("PostNormResidual", "num_features", num_features)
    key = params_key(rngs)
    self.num_features = num_features
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.post_norm(x, sublayer, self.norm)


class SandwichNormResidual(nnx.Module):
  """Sandwich step ``x + norm_out(f(norm_in(x)))``.

  See `jaxnorm.residual.sandwich_norm`; both norms are built by name.
  ``layer_index`` applies LayerNorm Scaling to ``norm_in`` as in
  `PreNormResidual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "SandwichNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = params_key(rngs)
    self.num_features = num_features
    self.layer_index = store_index(layer_index)
    self.norm_in = build_norm(norm, num_features, norm_kwargs, key, 0)
    self.norm_out = build_norm(norm, num_features, norm_kwargs, key, 1)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.sandwich_norm(
      x,
      sublayer,
      self.norm_in,
      self.norm_out,
      layer_index=read_index(self.layer_index),
    )


class ScaledResidual(nnx.Module):
  """Constant depth-scaled step ``x + lam * f(norm(x))``.

  ``lam = residual.residual_scale(num_residuals, scale)``: ``"1/n"`` (the
  rule of Dherin & Munn), ``"1/sqrt(n)"`` or a float. ``norm=None`` (the
  paper's normalization-free setting) drops the norm. No parameters beyond
  the norm's. See `jaxnorm.residual.scaled_residual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_residuals: int,
    scale: residual.ScaleRule | float = "1/n",
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("ScaledResidual", "num_features", num_features)
    key = params_key(rngs)
    self.num_features = num_features
    self.scale = residual.residual_scale(num_residuals, scale)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.scale, norm=self.norm)


class GatedResidual(nnx.Module):
  """Learned branch gate ``x + g * f(norm(x))`` (SkipInit, ReZero, LayerScale).

  ``shape="scalar"``: one ``gate`` (shape ``(1,)``), SkipInit / ReZero with
  ``init_value=0`` and ``norm=None``: the gate multiplies the end of the
  residual branch, as SkipInit's official code (``skipinit_gain``, one per
  residual block) and ReZero's (``resweight``; one per Transformer layer,
  shared by its attention and MLP: `make_residual` shares one module across
  the sublayers of a layer). ``shape="vector"``: a per-channel ``gate``
  (shape ``(d,)``), LayerScale with a pre-norm and a small ``init_value``
  (CaiT: 0.1 up to depth 18, 1e-5 at 24, 1e-6 beyond). See
  `jaxnorm.residual.scaled_residual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    shape: Literal["scalar", "vector"] = "scalar",
    init_value: float = 0.0,
    norm: NormSpec = None,
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "GatedResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "shape", shape, ("scalar", "vector"))
    key = params_key(rngs)
    self.num_features = num_features
    size = 1 if shape == "scalar" else num_features
    names = (None,) if shape == "scalar" else ("norm",)
    self.gate = _param.param(jnp.full((size,), init_value, param_dtype), names)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.gate[...], norm=self.norm)
