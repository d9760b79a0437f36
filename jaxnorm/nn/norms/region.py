"""Region Normalization modules RN-B and RN-L (`jaxnorm.norms.region`)."""

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
  Names,
  cast,
  param,
  promote,
)


class RegionNormB(nnx.Module):
  """RN-B, region normalization with a given mask; see `norms.region_norm_b`.

  Parameters ``scale_fg``, ``bias_fg``, ``scale_bg``, ``bias_bg`` (all 0,
  used as ``1 + scale``). Call with ``mask`` (1 = foreground, e.g. hole
  pixels), ``(n, *spatial, 1)`` at any resolution: it is resized to the
  feature map with torch-style nearest interpolation. Without a mask the
  whole map is one region (training-mode BatchNorm plus the fg affine and
  both shifts). ``scale_init`` and ``bias_init`` initialize the stored
  ``scale_*`` and ``bias_*`` of both regions (zeros: gain 1, shift 0);
  the per-region affine is the method, so ``use_scale=False`` and
  ``use_bias=False`` are refused.

  Examples:
    >>> norm = RegionNormB(1, rngs=nnx.Rngs(0))  # no mask: one region
    >>> y = norm(jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(4, 1, 1, 1))
    >>> [round(v, 4) for v in y.reshape(-1).tolist()]  # as training BatchNorm
    [-1.3416, -0.4472, 0.4472, 1.3416]
  """

  @paper_affine(
    needs_scale="RN-B's per-region gains scale_fg and scale_bg",
    needs_bias="RN-B's per-region shifts bias_fg and bias_bg",
  )
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    masked_bias: bool = False,
    axis_name: str | None = None,
    scale_init: Initializer = nnx.initializers.zeros,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("RegionNormB", "num_features", num_features)
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.eps = num_features, eps
    self.masked_bias, self.axis_name, self.dtype = masked_bias, axis_name, dtype

    # A fresh array per parameter (a train step donates every buffer), the
    # two regions from the same key.
    def init(fn, key):
      return param(fn(key, (num_features,), param_dtype), axis_names)

    self.scale_fg = init(scale_init, scale_key)
    self.bias_fg = init(bias_init, bias_key)
    self.scale_bg = init(scale_init, scale_key)
    self.bias_bg = init(bias_init, bias_key)

  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Normalizes NHWC ``x`` within the regions of ``mask``."""
    x = promote(x, self)
    if mask is None:
      mask = jnp.ones((*x.shape[:-1], 1), jnp.float32)
    elif mask.shape[1:-1] != x.shape[1:-1]:
      mask = norms.resize_mask_nearest(mask, x.shape[1:-1])
    y = norms.region_norm_b(
      x,
      mask,
      self.scale_fg[...],
      self.bias_fg[...],
      self.scale_bg[...],
      self.bias_bg[...],
      eps=self.eps,
      masked_bias=self.masked_bias,
      axis_name=self.axis_name,
    )
    return cast(y, self)


def _torch_uniform(
  key: jax.Array, shape: tuple[int, ...], fan_in: int, dtype: Any
) -> jax.Array:
  """The torch default conv init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

  Kaiming-uniform with ``a = sqrt(5)`` for the weight gives this bound, and
  torch draws the bias from the same range.
  """
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(
    dtype
  )


class RegionNormL(nnx.Module):
  """RN-L, region normalization with a learned mask (`norms.region_norm_l`).

  Parameters (HWIO convs, torch default init): ``mask_kernel``
  ``(k, k, 2, 1)``; ``scale_kernel``/``scale_bias`` and
  ``bias_kernel``/``bias_bias`` (``(k, k, 1, 1)`` and ``(1,)``), from five
  keys split from the first of the module's two draws. The learned maps
  are the method: flax's ``use_scale=False``, ``use_bias=False``,
  ``scale_init`` and ``bias_init`` are refused.

  Examples:
    >>> norm = RegionNormL(2, kernel_size=3, rngs=nnx.Rngs(0))
    >>> y = norm(jax.random.normal(jax.random.key(0), (1, 4, 4, 2)))  # NHWC
    >>> y.shape, norm.mask_kernel[...].shape, norm.scale_kernel[...].shape
    ((1, 4, 4, 2), (3, 3, 2, 1), (3, 3, 1, 1))
  """

  @paper_affine(
    needs_scale="RN-L's gain is a learned map of its mask (scale_kernel, "
    "scale_bias)",
    needs_bias="RN-L's shift is a learned map of its mask (bias_kernel, "
    "bias_bias)",
    own_init="RN-L's gain and shift are convolutions of its mask, "
    "initialized as torch's conv (kernel and bias uniform in "
    "+-1/sqrt(fan_in))",
  )
  def __init__(
    self,
    num_features: int,
    *,
    kernel_size: int = 7,
    threshold: float = 0.8,
    eps: float = 1e-5,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "RegionNormL"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "kernel_size", kernel_size)
    if kernel_size % 2 == 0:
      raise ValueError(f"{who}: kernel_size must be odd, got {kernel_size=}")
    self.num_features, self.threshold, self.eps = num_features, threshold, eps
    self.axis_name, self.dtype = axis_name, dtype
    k = kernel_size
    conv_names = None if axis_names is None else (None,) * 4
    keys = iter(jax.random.split(draw_keys(rngs)[0], 5))
    bias_names = None if axis_names is None else (None,)
    self.mask_kernel = param(
      _torch_uniform(next(keys), (k, k, 2, 1), 2 * k * k, param_dtype),
      conv_names,
    )
    self.scale_kernel = param(
      _torch_uniform(next(keys), (k, k, 1, 1), k * k, param_dtype), conv_names
    )
    self.scale_bias = param(
      _torch_uniform(next(keys), (1,), k * k, param_dtype), bias_names
    )
    self.bias_kernel = param(
      _torch_uniform(next(keys), (k, k, 1, 1), k * k, param_dtype), conv_names
    )
    self.bias_bias = param(
      _torch_uniform(next(keys), (1,), k * k, param_dtype), bias_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes NHWC ``x`` within its learned regions."""
    x = promote(x, self)
    y = norms.region_norm_l(
      x,
      self.mask_kernel[...],
      self.scale_kernel[...],
      self.scale_bias[...],
      self.bias_kernel[...],
      self.bias_bias[...],
      threshold=self.threshold,
      eps=self.eps,
      axis_name=self.axis_name,
    )
    return cast(y, self)
