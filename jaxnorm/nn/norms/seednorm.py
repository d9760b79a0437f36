"""SeeDNorm module; maths in `jaxnorm.norms.seed_norm`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  cast,
  param,
  promote,
)


class SeeDNorm(nnx.Module):
  """SeeDNorm over the last axis; see `jaxnorm.norms.seed_norm`.

  Parameters ``scale`` (gamma, init 1), ``dyn_scale`` (alpha, init
  ``dyn_scale_init`` = 1) and ``dyn_proj`` (beta, init 0), the paper's
  language-model init: the layer starts as RMSNorm while ``dyn_proj`` still
  receives gradient. The paper decays ``dyn_scale`` and ``dyn_proj`` (not
  ``scale``); build optimizer masks from those names. ``scale_init``
  initializes ``scale``; ``use_scale=False`` is refused (gamma is the base
  of the paper's dynamic scale) and there is no bias.

  Examples:
    >>> norm = SeeDNorm(2, rngs=nnx.Rngs(0))  # dyn_proj 0: starts as RMSNorm
    >>> [round(v, 4) for v in norm(jnp.array([3.0, 4.0])).tolist()]
    [0.8485, 1.1314]
    >>> sorted(nnx.state(norm, nnx.Param))
    ['dyn_proj', 'dyn_scale', 'scale']
  """

  @paper_affine(
    no_bias="the paper's rescaling gamma + alpha tanh(<x, beta>) multiplies "
    "an RMSNorm output; no shift",
    needs_scale="scale is gamma, the static part of the dynamic scale "
    "gamma + alpha tanh(<x, beta>)",
  )
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    num_heads: int = 1,
    scale_init: Initializer = nnx.initializers.ones,
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
    scale_key, _ = draw_keys(rngs)
    shape = (num_features,)
    self.scale = param(scale_init(scale_key, shape, param_dtype), axis_names)
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
