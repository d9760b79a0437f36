"""Layers several models and modules share: `Dense`, `Conv`, `MLP`.

Plain parameter-holding layers with logical axis names (``embed``, ``mlp``,
``channels``, resolved by `jaxnorm.sharding`): the building blocks of
`jaxnorm.nn.models`, `jaxnorm.nn.graph` and `jaxnorm.nn.nap`, and the layer
`jaxnorm.nn.quant.Int8Dense` is a drop-in for. `rematerialize` runs a
layer's call under `nnx.remat` with a named `jax.checkpoint` policy
(`REMAT_POLICIES`), leaving its parameters where they are.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm.nn import _param
from jaxnorm.nn import activations as nn_activations

RematName = Literal["none", "full", "dots", "dots_no_batch"]

_POLICIES = jax.checkpoint_policies
REMAT_POLICIES: Mapping[str, Callable[..., bool]] = types.MappingProxyType(
  {
    "full": _POLICIES.nothing_saveable,
    "dots": _POLICIES.checkpoint_dots,
    "dots_no_batch": _POLICIES.checkpoint_dots_with_no_batch_dims,
  }
)
"""The ``remat`` names and their `jax.checkpoint` policies: ``full`` saves
nothing (the backward pass recomputes the whole layer), ``dots`` saves the
matrix products, ``dots_no_batch`` those without batch dimensions (the
weight products, not attention's scores). ``"none"`` (not a key) runs
without rematerialization."""
REMAT_CHOICES: tuple[str, ...] = ("none", *REMAT_POLICIES)
"""Every valid ``remat`` value."""


def check_remat(who: str, remat: str) -> None:
  """Raises `ValueError` unless ``remat`` is one of `REMAT_CHOICES`."""
  _checks.check_choice(who, "remat", remat, REMAT_CHOICES)


def rematerialize(fn: Callable[..., Any], remat: RematName) -> Callable:
  """``fn`` under `nnx.remat` with the policy ``remat`` names.

  ``"none"`` returns ``fn`` itself; the others wrap it with
  ``nnx.remat(fn, policy=REMAT_POLICIES[remat])``, so its arguments may be
  nnx modules (their state goes through `jax.checkpoint`).

  Deviation: an operation with a complex operand is never saved, whatever
  the policy (it is recomputed): `jax.checkpoint` rounds every saved
  residual with `jax.lax.reduce_precision`, which refuses complex dtypes
  (jax 0.10-0.12), so ``dots`` would fail to trace on a complex product.
  On an all-complex stack ``dots`` then saves about as little as ``full``.

  Args:
    fn: the function (of arrays and nnx modules).
    remat: one of `REMAT_CHOICES`.

  Returns:
    A function with ``fn``'s signature, outputs and gradients.

  Raises:
    ValueError: for a ``remat`` outside `REMAT_CHOICES` (the message lists
      them).

  References:
    Chen et al., *Training Deep Nets with Sublinear Memory Cost*,
    arXiv:1604.06174 (2016).

  Examples:
    >>> dense = Dense(4, 4, names=(None, None), rngs=nnx.Rngs(0))
    >>> call = rematerialize(lambda layer, x: layer(x), "full")
    >>> x = jnp.ones((2, 4), jnp.float32)
    >>> bool((call(dense, x) == dense(x)).all())  # the module's parameters
    True
  """
  check_remat("rematerialize", remat)
  if remat == "none":
    return fn
  policy = REMAT_POLICIES[remat]

  def saveable(prim: Any, *avals: Any, **params: Any) -> bool:
    if any(
      jnp.issubdtype(getattr(a, "dtype", jnp.float32), jnp.complexfloating)
      for a in avals
    ):
      return False
    return policy(prim, *avals, **params)

  return nnx.remat(fn, policy=saveable)


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
