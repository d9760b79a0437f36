"""DyT module (Dynamic Tanh); maths in `jaxnorm.norms.dyt`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _dispatch, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  cast,
  maybe,
  optional,
  param,
  promote,
)


class DyT(nnx.Module):
  """Dynamic Tanh; see `jaxnorm.norms.dyt`.

  ``alpha`` is one learnable scalar (shape ``(1,)``) initialized to
  ``alpha_init`` (0.5 for vision; the LLaMA recipe uses per-position values
  and ``use_bias=False``). ``alpha`` is not flax's scale: ``scale`` and
  ``bias`` are the per-feature affine (``use_scale``, ``use_bias``,
  ``scale_init``, ``bias_init``). ``implementation`` picks the Pallas
  kernel (see `jaxnorm.norms.dyt`).

  Examples:
    >>> dyt = DyT(2, alpha_init=0.5, rngs=nnx.Rngs(0))  # tanh(alpha x)
    >>> [round(v, 4) for v in dyt(jnp.array([0.0, 2.0])).tolist()]
    [0.0, 0.7616]
  """

  @paper_affine()
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
