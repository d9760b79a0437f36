"""Layers several models and modules share: `Dense`, `Conv`, `MLP`.

Plain parameter-holding layers with logical axis names (``embed``, ``mlp``,
``channels``, resolved by `jaxnorm.sharding`): the building blocks of
`jaxnorm.nn.models`, `jaxnorm.nn.graph` and `jaxnorm.nn.nap`, and the layer
`jaxnorm.nn.quant.Int8Dense` is a drop-in for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.nn import _param
from jaxnorm.nn import activations as nn_activations


class Dense(nnx.Module):
  """``y = x @ kernel (+ bias)`` with a ``(in, out)`` kernel and axis names."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    names: tuple[str | None, str | None],
    use_bias: bool = True,
    kernel_init: Callable[..., jax.Array] | None = None,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    init = kernel_init or nnx.initializers.lecun_normal()
    self.kernel = _param.param(
      init(rngs.params(), (in_features, out_features), param_dtype), names
    )
    self.bias = (
      _param.param(jnp.zeros((out_features,), param_dtype), names[1:])
      if use_bias
      else None
    )
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the map to the last axis of ``x``."""
    y = jnp.matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
    if self.bias is not None:
      b = self.bias[...].astype(self.dtype)
      y = y + b.reshape((1,) * (y.ndim - 1) + b.shape)
    return y


class Conv(nnx.Module):
  """NHWC convolution with a ``(kh, kw, in, out)`` kernel, SAME padding."""

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    kernel_size: int = 3,
    stride: int = 1,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    init = nnx.initializers.he_normal(in_axis=(0, 1, 2), out_axis=3)
    shape = (kernel_size, kernel_size, in_features, out_features)
    self.kernel = _param.param(
      init(rngs.params(), shape, param_dtype), (None, None, None, "channels")
    )
    self.stride, self.dtype = stride, dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Convolves ``x`` of shape ``(n, h, w, in)``."""
    return jax.lax.conv_general_dilated(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      (self.stride, self.stride),
      "SAME",
      dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


class MLP(nnx.Module):
  """Position-wise MLP ``down(act(up(x)))``; gated names use ``a(x) * b``."""

  def __init__(
    self,
    width: int,
    hidden: int,
    *,
    activation: str,
    dtype: Any,
    use_bias: bool = True,
    rngs: nnx.Rngs,
  ):
    spec = nn_activations.ACTIVATIONS[activation]
    self.gated = spec.gated
    self.up = Dense(
      width,
      hidden * (2 if spec.gated else 1),
      names=("embed", "mlp"),
      use_bias=use_bias,
      dtype=dtype,
      rngs=rngs,
    )
    self.act = spec.fn if spec.build is None else spec.build(hidden, rngs)
    self.down = Dense(
      hidden,
      width,
      names=("mlp", "embed"),
      use_bias=use_bias,
      dtype=dtype,
      rngs=rngs,
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the MLP over the last axis."""
    h = self.up(x)
    if self.gated:
      a, b = jnp.split(h, 2, axis=-1)
      h = self.act(a) * b
    else:
      h = self.act(h)
    return self.down(h)
