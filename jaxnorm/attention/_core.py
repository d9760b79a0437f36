"""Shared validation and building blocks of the attention functions."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp

from jaxnorm import _checks

Window = int | tuple[int, int] | None
_F = TypeVar("_F", bound=Callable[..., Any])

# Keywords flax passes to an ``attention_fn`` that jaxnorm functions lack.
_FLAX_ONLY = frozenset(
  {
    "broadcast_dropout",
    "deterministic",
    "dropout_rate",
    "dropout_rng",
    "dtype",
    "module",
    "precision",
    "promote_dtype",
  }
)


def refuses_flax_kwargs(fn: _F) -> _F:
  """Turns flax's ``attention_fn`` keywords into an error naming the adapter.

  ``nnx.MultiHeadAttention(attention_fn=fn)`` calls ``fn`` with
  ``dropout_rng=``, ``deterministic=`` ...; without this guard Python's
  bare "unexpected keyword" `TypeError` would not say what to do. Only
  keywords ``fn`` does not take are refused; the signature
  (`inspect.signature`) is ``fn``'s own.
  """
  refused = _FLAX_ONLY - frozenset(inspect.signature(fn).parameters)

  @functools.wraps(fn)
  def guarded(*args: Any, **kwargs: Any) -> Any:
    flax_only = sorted(refused & set(kwargs))
    if flax_only:
      raise TypeError(
        f"{fn.__name__}: got flax attention_fn keyword(s) "
        f"{', '.join(flax_only)}; a jaxnorm attention function is not a flax "
        "attention_fn, wrap it: attention_fn=jaxnorm.attention."
        f"as_flax_attention_fn({fn.__name__}) (flax's dropout, 0/1 masks)"
      )
    return fn(*args, **kwargs)

  return guarded  # type: ignore[return-value]


def large_negative() -> float:
  # As jax.nn: finite, so a fully masked row softmaxes to uniform, not NaN.
  return -0.7 * float(jnp.finfo(jnp.float32).max)


class Dims(NamedTuple):
  batch: int
  q_len: int
  kv_len: int
  heads: int
  kv_heads: int
  head_dim: int
  value_dim: int
  unbatched: bool


def check_qkv(
  who: str, query: jax.Array, key: jax.Array, value: jax.Array | None
) -> Dims:
  """Validates the q/k/v layouts and returns the named dimensions."""
  arrays = [("query", query), ("key", key)]
  if value is not None:
    arrays.append(("value", value))
  for name, a in arrays:
    _checks.check_floating(who, name, a)
  if query.ndim not in (3, 4):
    raise ValueError(
      f"{who}: query must have rank 4 (batch, seq, heads, head_dim) or 3 "
      f"(seq, heads, head_dim), got {query.shape=}"
    )
  for name, a in arrays[1:]:
    if a.ndim != query.ndim:
      raise ValueError(
        f"{who}: {name} must have the same rank as query ({query.ndim}), "
        f"got {name}.shape={a.shape} and {query.shape=}"
      )
  unbatched = query.ndim == 3
  q = query[None] if unbatched else query
  k = key[None] if unbatched else key
  b, t, n, h = q.shape
  bk, s, kh, hk = k.shape
  if bk != b:
    raise ValueError(
      f"{who}: key batch size must equal query's ({b}), got {key.shape=} "
      f"and {query.shape=}"
    )
  if hk != h:
    raise ValueError(
      f"{who}: key head_dim must equal query's ({h}), got {key.shape=} and "
      f"{query.shape=}"
    )
  if n % kh:
    raise ValueError(
      f"{who}: the number of query heads ({n}) must be a multiple of the "
      f"number of key heads ({kh}), got {query.shape=} and {key.shape=}"
    )
  hv = h
  if value is not None:
    if value.shape[:-1] != key.shape[:-1]:
      raise ValueError(
        f"{who}: value must match key on every axis but the last, got "
        f"{value.shape=} and {key.shape=}"
      )
    hv = value.shape[-1]
  return Dims(b, t, s, n, kh, h, hv, unbatched)


def check_logits_arg(
  who: str, name: str, x: jax.Array | None, d: Dims
) -> jax.Array | None:
  """Checks a bias or mask broadcastable to ``(B, N, T, S)``; returns 4-D."""
  if x is None:
    return None
  x = jnp.asarray(x)
  target = (d.batch, d.heads, d.q_len, d.kv_len)
  if d.unbatched and x.ndim == 3:
    x = x[None]
  if x.ndim != 4 or any(a not in (1, e) for a, e in zip(x.shape, target)):
    raise ValueError(
      f"{who}: {name} must be broadcastable to (batch, heads, q_len, kv_len)"
      f"={target}, each axis 1 or equal, got {name}.shape={x.shape}"
    )
  return x


def prepare(who: str, query, key, value, bias, mask):
  d = check_qkv(who, query, key, value)
  bias = check_logits_arg(who, "bias", bias, d)
  mask = check_logits_arg(who, "mask", mask, d)
  if mask is not None and mask.dtype != jnp.bool_:
    raise TypeError(
      f"{who}: mask must be boolean (True attends); put an additive mask in "
      f"bias, got {mask.dtype=}"
    )
  if bias is not None:
    _checks.check_floating(who, "bias", bias)
  if d.unbatched:
    query, key = query[None], key[None]
    value = None if value is None else value[None]
  return d, query, key, value, bias, mask


def window(who: str, local_window_size) -> tuple[int, int] | None:
  """``local_window_size`` as ``(left, right)`` (an int is symmetric).

  Raises:
    ValueError: unless None, an int >= 0 or a pair of ints >= 0.
  """
  if local_window_size is None:
    return None
  pair = (
    (local_window_size, local_window_size)
    if isinstance(local_window_size, int)
    else tuple(local_window_size)
  )
  if len(pair) != 2 or not all(
    isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in pair
  ):
    raise ValueError(
      f"{who}: local_window_size must be an int >= 0 or a pair (left, right) "
      f"of ints >= 0, got {local_window_size=}"
    )
  return pair


def allowed_mask(
  d: Dims,
  mask: jax.Array | None,
  is_causal: bool,
  local_window: tuple[int, int] | None = None,
) -> jax.Array | None:
  """The combined boolean mask (broadcastable to BNTS), or None for all.

  ``local_window = (left, right)`` lets query ``i`` see keys
  ``i - left <= j <= i + right`` (`jax.nn.dot_product_attention`'s rule).
  """
  allowed = mask
  i = jnp.arange(d.q_len)[:, None]
  j = jnp.arange(d.kv_len)[None, :]
  structural = []
  if is_causal:
    structural.append(j <= i)
  if local_window is not None:
    left, right = local_window
    structural.append(jnp.logical_and(j >= i - left, j <= i + right))
  for extra in structural:
    extra = extra.reshape(1, 1, d.q_len, d.kv_len)
    allowed = extra if allowed is None else jnp.logical_and(allowed, extra)
  return allowed


def raw_logits(d: Dims, query, key, scale, dtype) -> jax.Array:
  """``q k^T * scale`` in ``dtype``, shape (B, N, T, S), GQA-aware."""
  g = d.heads // d.kv_heads
  q = query.astype(dtype).reshape(d.batch, d.q_len, d.kv_heads, g, d.head_dim)
  k = key.astype(dtype)
  logits = jnp.einsum("btkgh,bskh->bkgts", q, k)
  logits = logits.reshape(d.batch, d.heads, d.q_len, d.kv_len)
  return logits * jnp.asarray(scale, dtype)


def default_scale(d: Dims, scale: float | None) -> float:
  return 1.0 / math.sqrt(d.head_dim) if scale is None else scale


def masked_logits(d, query, key, bias, allowed, scale, dtype) -> jax.Array:
  logits = raw_logits(d, query, key, scale, dtype)
  if bias is not None:
    logits = logits + bias.astype(dtype)
  if allowed is not None:
    logits = jnp.where(allowed, logits, jnp.asarray(large_negative(), dtype))
  return logits


def apply_weights(
  d: Dims, weights: jax.Array, value: jax.Array, dtype
) -> jax.Array:
  """``weights @ value`` for (B, N, T, S) weights and (B, S, K, Hv) values."""
  g = d.heads // d.kv_heads
  w = weights.astype(dtype).reshape(d.batch, d.kv_heads, g, d.q_len, d.kv_len)
  out = jnp.einsum("bkgts,bskh->btkgh", w, value.astype(dtype))
  return out.reshape(d.batch, d.q_len, d.heads, d.value_dim)


def finish(d: Dims, out: jax.Array, dtype) -> jax.Array:
  # ``dtype`` is the caller's query.dtype, float64 for a NumPy array: cast to
  # what JAX computes (float32 without x64) instead of warning.
  out = out.astype(jax.dtypes.canonicalize_dtype(dtype))
  return out[0] if d.unbatched else out


def row_count(d: Dims, allowed: jax.Array | None, dtype) -> jax.Array:
  """Number of allowed keys per query row, shape broadcastable to BNT1."""
  if allowed is None:
    return jnp.full((1, 1, 1, 1), d.kv_len, dtype)
  return jnp.sum(allowed.astype(dtype), axis=-1, keepdims=True)


def repeat_kv(d: Dims, x: jax.Array) -> jax.Array:
  """Repeats kv heads ``(B, S, K, H)`` to ``(B, S, N, H)`` (GQA order)."""
  g = d.heads // d.kv_heads
  return x if g == 1 else jnp.repeat(x, g, axis=2)
