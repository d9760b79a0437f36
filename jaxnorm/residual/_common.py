"""Shared types, checks and broadcasting helpers of `jaxnorm.residual`."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from jaxnorm import _checks

ArrayFn = Callable[[jax.Array], jax.Array]
AddNormFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
IndexLike = int | jax.Array


def check_layer_index(who: str, layer_index: IndexLike | None) -> None:
  """Raises `ValueError` unless ``layer_index`` is a 0-based layer index.

  A non-negative Python integer, ``None``, or an integer array of shape
  ``()`` (a traced index, e.g. the layer counter of an ``nnx.scan``; its
  value is not checked).
  """
  if layer_index is None:
    return
  if isinstance(layer_index, (jax.Array, np.ndarray)):
    if not jnp.issubdtype(layer_index.dtype, jnp.integer) or (
      layer_index.ndim != 0
    ):
      raise ValueError(
        f"{who}: an array layer_index must be an integer scalar, got "
        f"layer_index.dtype={layer_index.dtype}, "
        f"layer_index.shape={layer_index.shape}"
      )
    return
  if (
    isinstance(layer_index, bool)
    or not isinstance(layer_index, (int, np.integer))
    or layer_index < 0
  ):
    raise ValueError(
      f"{who}: layer_index must be a non-negative integer (0-based), an "
      f"integer scalar array or None, got {layer_index=}"
    )


def branch(
  who: str, x: jax.Array, sublayer: ArrayFn, norm: ArrayFn | None
) -> jax.Array:
  """``sublayer(norm(x))`` (``norm=None``: ``sublayer(x)``), shape checked.

  Raises:
    ValueError: if the branch output does not have the shape of ``x``.
  """
  y = sublayer(x if norm is None else norm(x))
  if y.shape != x.shape:
    raise ValueError(
      f"{who}: the sublayer must keep the shape of x, got "
      f"{x.shape=} and output shape {y.shape}"
    )
  return y


def leading(v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Explicitly broadcasts ``v`` (trailing dims match) to ``shape``."""
  v = jnp.reshape(v, (1,) * (len(shape) - v.ndim) + v.shape)
  return jnp.broadcast_to(v, shape)


def check_streams(who: str, h: ArrayLike) -> tuple[int, int]:
  _checks.check_floating(who, "h", h)
  _checks.check_ndim(who, "h", h, minimum=2)
  n, d = np.shape(h)[-2:]
  return int(n), int(d)


def check_scalar(who: str, name: str, v: ArrayLike) -> None:
  _checks.check_floating(who, name, v)
  if np.ndim(v) != 0 and tuple(np.shape(v)) != (1,):
    raise ValueError(
      f"{who}: {name} must be a scalar (shape () or (1,)), "
      f"got {name}.shape={np.shape(v)}"
    )


def scalar(v: ArrayLike, dtype: jnp.dtype) -> jax.Array:
  return jnp.reshape(jnp.asarray(v), ()).astype(dtype)


def unit(v: jax.Array, eps: float) -> jax.Array:
  """``v / max(||v||_2, eps)`` over the last axis, with finite gradients.

  Written as ``v * rsqrt(max(sum(v^2), eps^2))``: the same value, but an
  all-zero row differentiates through the constant branch of the max
  (gradient ``1/eps``) instead of through ``sqrt`` at 0 (NaN).
  """
  sq = jnp.sum(v * v, axis=-1, keepdims=True)
  return v * jax.lax.rsqrt(jnp.maximum(sq, eps * eps))
