"""The ELA module (the maths is `jaxnorm.attention.ela`), NHWC.

It holds the conv / norm weights and calls the pure function. Parameters
carry the logical axis name ``channels``.

Examples:
  >>> from jaxnorm.attention import ela_config
  >>> ela_config("B", 16)  # (kernel_size, conv_groups, norm_groups)
  (7, 16, 16)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import _param


class ELA(nnx.Module):
  """Efficient local attention (see `attention.efficient_local_attention`).

  ``variant`` picks the T/B/S/L preset (`attention.ela_config`); the conv kernel
  ``(k, C/G, C)`` uses torch's default init (uniform in
  ``±1/sqrt(fan_in)``), the GroupNorm scale 1 and bias 0.

  Examples:
    >>> ela = ELA(16, variant="B", rngs=nnx.Rngs(0))  # kernel 7, depthwise
    >>> ela.conv_kernel.shape, ela.norm_groups  # (k, C/G, C)
    ((7, 1, 16), 16)
    >>> x = jnp.ones((2, 4, 4, 16), jnp.float32)  # (B, H, W, C)
    >>> y = ela(x)  # x times sigmoid gates on H and W
    >>> y.shape, bool(((0 < y) & (y < x)).all())
    ((2, 4, 4, 16), True)
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
    k, groups, norm_groups = attn.ela_config(variant, channels)
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
    return attn.efficient_local_attention(
      x.astype(dt),
      self.conv_kernel[...],
      self.norm_scale[...],
      self.norm_bias[...],
      norm_groups=self.norm_groups,
      eps=self.eps,
    )
