"""Modules for `jaxnorm.vision`: ELA and polarized self-attention (NHWC).

They hold the conv / norm weights and call the pure functions; see those for
the maths. Parameters carry the logical axis name ``channels``.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, vision
from jaxnorm.nn import _param


class ELA(nnx.Module):
  """Efficient local attention (see `vision.efficient_local_attention`).

  ``variant`` picks the T/B/S/L preset (`vision.ela_config`); the conv kernel
  ``(k, C/G, C)`` uses torch's default init (uniform in
  ``±1/sqrt(fan_in)``), the GroupNorm scale 1 and bias 0.
  """

  def __init__(
    self,
    channels: int,
    *,
    variant: str = "B",
    eps: float = 1e-5,
    dtype=None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    k, groups, norm_groups = vision.ela_config(variant, channels)
    self.norm_groups = norm_groups
    self.eps = eps
    self.dtype = dtype
    per = channels // groups
    bound = 1.0 / math.sqrt(per * k)
    kern = jax.random.uniform(
      rngs.params(), (k, per, channels), param_dtype, -bound, bound
    )
    self.conv_kernel = _param.param(kern, (None, None, "channels"))
    self.norm_scale = _param.param(
      jnp.ones((channels,), param_dtype), ("channels",)
    )
    self.norm_bias = _param.param(
      jnp.zeros((channels,), param_dtype), ("channels",)
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ELA to ``(B, H, W, C)``."""
    dt = self.dtype or x.dtype
    return vision.efficient_local_attention(
      x.astype(dt),
      self.conv_kernel[...],
      self.norm_scale[...],
      self.norm_bias[...],
      norm_groups=self.norm_groups,
      eps=self.eps,
    )


class PolarizedSelfAttention(nnx.Module):
  """Polarized self-attention (see `vision.polarized_self_attention`).

  1x1 conv weights use Kaiming-normal fan-in init (as the official code);
  ``C' = C/2``; the channel-branch LayerNorm starts at scale 1, bias 0.
  """

  def __init__(
    self,
    channels: int,
    *,
    layout: Literal["parallel", "sequential"] = "parallel",
    eps: float = 1e-5,
    dtype=None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "PolarizedSelfAttention"
    _checks.check_positive_int(who, "channels", channels)
    _checks.check_divisible(who, "channels", channels, "2", 2)
    _checks.check_choice(who, "layout", layout, ("parallel", "sequential"))
    self.layout = layout
    self.eps = eps
    self.dtype = dtype
    cp = channels // 2
    init = jax.nn.initializers.he_normal()

    def w(shape, names):
      return _param.param(init(rngs.params(), shape, param_dtype), names)

    self.channel_query = w((channels, 1), ("channels", None))
    self.channel_value = w((channels, cp), ("channels", None))
    self.channel_out = w((cp, channels), (None, "channels"))
    self.spatial_query = w((channels, cp), ("channels", None))
    self.spatial_value = w((channels, cp), ("channels", None))
    self.norm_scale = _param.param(
      jnp.ones((channels,), param_dtype), ("channels",)
    )
    self.norm_bias = _param.param(
      jnp.zeros((channels,), param_dtype), ("channels",)
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies PSA to ``(B, H, W, C)``."""
    dt = self.dtype or x.dtype
    return vision.polarized_self_attention(
      x.astype(dt),
      channel_query=self.channel_query[...],
      channel_value=self.channel_value[...],
      channel_out=self.channel_out[...],
      norm_scale=self.norm_scale[...],
      norm_bias=self.norm_bias[...],
      spatial_query=self.spatial_query[...],
      spatial_value=self.spatial_value[...],
      layout=self.layout,
      eps=self.eps,
    )
