"""ScaleNorm module; maths in `jaxnorm.norms.scale_norm`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn.norms._common import (
  cast,
  flax_spelling,
  param,
  promote,
)


class ScaleNorm(nnx.Module):
  """ScaleNorm over the last axis: one scalar gain, init ``sqrt(d)``.

  The parameter ``scale`` has shape ``(1,)`` and no logical axis (it is
  replicated); as a scalar it is not weight-decayed.
  """

  @flax_spelling
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    scale_init: float | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    _checks.check_positive_int("ScaleNorm", "num_features", num_features)
    g = math.sqrt(num_features) if scale_init is None else scale_init
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.scale = param(jnp.full((1,), g, param_dtype), (None,))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's gain."""
    x = promote(x, self)
    return cast(norms.scale_norm(x, self.scale[...], eps=self.eps), self)
