"""ScaleNorm module; maths in `jaxnorm.norms.scale_norm`."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  cast,
  flax_spelling,
  param,
  promote,
)


class ScaleNorm(nnx.Module):
  """ScaleNorm over the last axis: one scalar gain, init ``sqrt(d)``.

  The parameter ``scale`` has shape ``(1,)`` and no logical axis (it is
  replicated); as a scalar it is not weight-decayed. ``scale_init`` is a
  number (the initial gain), an initializer called with ``(key, (1,),
  param_dtype)`` as flax's, or None (``sqrt(num_features)``, the paper's).
  The gain is the method: ``use_scale=False`` is refused, and there is no
  bias.

  Examples:
    >>> norm = ScaleNorm(4, rngs=nnx.Rngs(0))  # g = sqrt(4) = 2
    >>> [round(v, 4) for v in norm(jnp.array([3.0, 4.0, 0.0, 0.0])).tolist()]
    [1.2, 1.6, 0.0, 0.0]
  """

  @flax_spelling
  @paper_affine(
    no_bias="y = g x / ||x|| has one scalar gain and no shift",
    needs_scale="the learned scalar gain g is ScaleNorm; without it every "
    "output has norm 1",
  )
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    scale_init: float | Initializer | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    scale_key, _ = draw_keys(rngs)
    _checks.check_positive_int("ScaleNorm", "num_features", num_features)
    if scale_init is None:
      g = jnp.full((1,), math.sqrt(num_features), param_dtype)
    elif callable(scale_init):
      g = scale_init(scale_key, (1,), param_dtype)
    else:
      g = jnp.full((1,), scale_init, param_dtype)
    self.num_features, self.eps, self.dtype = num_features, eps, dtype
    self.scale = param(g, (None,))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's gain."""
    x = promote(x, self)
    return cast(norms.scale_norm(x, self.scale[...], eps=self.eps), self)
