"""Gecko's timestep-decay norm (causal running statistics)."""

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
  maybe,
  optional,
  promote,
)


class TimestepDecayNorm(nnx.Module):
  """Gecko timestep-decay norm; see `jaxnorm.norms.timestep_decay_norm`.

  Parameters ``scale`` (used as ``1 + scale``) and ``bias``, both 0. The
  streaming state is not stored in the module: pass ``state`` and set
  ``return_state=True`` to carry it across segments. flax's ``use_scale``
  and ``use_bias`` drop a parameter (``use_scale=False``: a gain of 1);
  ``scale_init`` initializes the stored ``scale`` (so zeros is gain 1).

  Examples:
    >>> norm = TimestepDecayNorm(4, num_groups=2, rngs=nnx.Rngs(0))
    >>> x = jax.random.normal(jax.random.key(0), (1, 3, 4))  # (B, L, D)
    >>> y, state = norm(x, return_state=True)  # state: for the next segment
    >>> y.shape, bool(jnp.allclose(norm(x[:, :2]), y[:, :2]))  # causal
    ((1, 3, 4), True)
  """

  @paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    num_groups: int = 64,
    beta1: float = 0.999,
    beta2: float = 0.9999,
    eps: float = 1e-5,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.zeros,
    bias_init: Initializer = nnx.initializers.zeros,
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
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.num_groups = num_features, num_groups
    self.beta1, self.beta2, self.eps, self.dtype = beta1, beta2, eps, dtype
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

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
    x = promote(x, self)
    y, new = norms.timestep_decay_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      state,
      num_groups=self.num_groups,
      beta1=self.beta1,
      beta2=self.beta2,
      eps=self.eps,
      padding_mask=padding_mask,
      bos_mask=bos_mask,
    )
    y = cast(y, self)
    return (y, new) if return_state else y
