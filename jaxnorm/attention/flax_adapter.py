"""Any jaxnorm attention function as a flax ``attention_fn``."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm import _scope
from jaxnorm.attention import _core, softmax

# Functions whose attention weights are known, so attention dropout can be
# applied to the weights exactly as flax does.
_WEIGHTS: dict[Callable[..., Any], Callable[..., Any]] = {
  softmax.dot_product_attention: softmax.attention_weights,
}


def _params(fn: Callable[..., Any]) -> frozenset[str]:
  return frozenset(inspect.signature(fn).parameters)


def _flax_mask(mask: Any) -> jax.Array | None:
  """Flax masks: boolean, or float/int 0/1 (nonzero attends)."""
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  return mask if mask.dtype == jnp.bool_ else mask != 0


@_scope.scoped
def as_flax_attention_fn(
  fn: Callable[..., Any],
  *,
  weights_fn: Callable[..., Any] | None = None,
  **kwargs: Any,
) -> Callable[..., jax.Array]:
  r"""Wraps a jaxnorm attention function as a flax ``attention_fn``.

  The result has the signature of `flax.nnx.dot_product_attention`
  (``query, key, value, bias=None, mask=None, broadcast_dropout=True,
  dropout_rng=None, dropout_rate=0.0, deterministic=False, dtype=None,
  precision=None, module=None, promote_dtype=..., is_causal=False``), so it
  plugs into ``nnx.MultiHeadAttention(attention_fn=...)`` and linen's
  ``MultiHeadDotProductAttention``. ``kwargs`` are passed to ``fn`` on
  every call (e.g. ``logits_soft_cap=50.0``, ``sinks=...``).

  * ``mask``: boolean, or float/int 0/1 as flax accepts (nonzero attends),
    broadcastable to ``(batch, heads, q_len, kv_len)``; leading batch axes
    beyond one are flattened as flax does.
  * Attention dropout (``dropout_rate > 0`` and not ``deterministic``) is
    applied to the attention weights exactly as flax does (one Bernoulli
    draw from ``dropout_rng``, broadcast over batch and heads when
    ``broadcast_dropout``, scaled by ``1 / keep_prob``), so with the same
    key the result equals flax's. It needs the weights: known for
    `dot_product_attention` (`attention_weights`), otherwise pass
    ``weights_fn(query, key, bias=, mask=, is_causal=, **kwargs)``
    returning ``(B, N, T, S)`` weights. A
    function without weights refuses a nonzero rate with a `ValueError`
    instead of silently dropping the dropout.
  * ``module`` (flax's ``sow_weights``) sows the weights into
    ``nnx.Intermediate`` as ``"attention_weights"``, like flax; it also needs
    the weights.
  * ``dtype``, ``precision`` and ``promote_dtype`` are ignored: jaxnorm
    computes logits and statistics in float32 and returns ``query.dtype``
    (the projections of ``nnx.MultiHeadAttention`` already ran in
    ``dtype``).
  * ``bias``, ``mask`` and ``is_causal=True`` are refused with a
    `ValueError` when ``fn`` has no such argument (e.g. the linear
    attentions); ``is_causal=False`` is then not passed.

  Args:
    fn: a jaxnorm attention function ``fn(query, key, value, ...)``.
    weights_fn: the attention weights of ``fn``, for dropout and sowing.
    **kwargs: fixed keyword arguments of ``fn``.

  Returns:
    The flax-compatible attention function.

  Raises:
    ValueError: when called with a nonzero dropout rate (not
      deterministic) or a ``module`` and no weights are known, with dropout
      but no ``dropout_rng``, or with ``bias``/``mask``/``is_causal=True``
      that ``fn`` does not take.

  Examples:
    >>> fn = attention.as_flax_attention_fn(attention.sink_attention)
    >>> q, k = jnp.zeros((1, 1, 1, 2)), jnp.zeros((1, 2, 1, 2))
    >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
    >>> out = fn(q, k, v, deterministic=True)  # flax's attention_fn call
    >>> print(np.asarray(out[0, 0, 0]).round(4))
    [1.3333 0.6667]
  """
  who = f"as_flax_attention_fn({getattr(fn, '__name__', fn)!r})"
  weights_fn = weights_fn if weights_fn is not None else _WEIGHTS.get(fn)
  accepted = _params(fn)
  weight_kwargs = {}
  if weights_fn is not None:
    weight_params = _params(weights_fn)
    weight_kwargs = {k: v for k, v in kwargs.items() if k in weight_params}

  def attention_fn(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    broadcast_dropout: bool = True,
    dropout_rng: jax.Array | None = None,
    dropout_rate: float = 0.0,
    deterministic: bool = False,
    dtype: Any = None,
    precision: Any = None,
    module: Any = None,
    promote_dtype: Any = None,
    is_causal: bool = False,
  ) -> jax.Array:
    del dtype, precision, promote_dtype
    mask = _flax_mask(mask)
    call = dict(kwargs)
    for name, value_ in (("bias", bias), ("mask", mask)):
      if value_ is not None:
        if name not in accepted:
          raise ValueError(
            f"{who}: the function takes no {name}, got {name} with shape "
            f"{jnp.shape(value_)}; use an attention function with a {name}"
          )
        call[name] = value_
    if "is_causal" in accepted:
      call["is_causal"] = is_causal
    elif is_causal:
      raise ValueError(
        f"{who}: the function takes no is_causal, got is_causal=True"
      )
    lead = query.shape[:-3]
    if len(lead) > 1:  # flax allows several batch axes: flatten them.
      flat = functools.partial(_flatten, n=len(lead))
      query, key, value = flat(query), flat(key), flat(value)
      for name in ("bias", "mask"):
        if call.get(name) is not None and call[name].ndim == len(lead) + 3:
          call[name] = flat(call[name])
    dropout = not deterministic and dropout_rate > 0.0
    if (dropout or module is not None) and weights_fn is None:
      raise ValueError(
        f"{who}: attention dropout (dropout_rate={dropout_rate}, "
        f"deterministic={deterministic}) and sown weights need the attention "
        "weights, which are not known for this function; pass weights_fn=, "
        "set dropout_rate=0.0 or deterministic=True"
      )
    if not dropout and module is None:
      out = fn(query, key, value, **call)
    else:
      out = _with_weights(
        who,
        weights_fn,
        query,
        key,
        value,
        dict(weight_kwargs, **{k: call[k] for k in call if k not in kwargs}),
        dropout,
        dropout_rng,
        dropout_rate,
        broadcast_dropout,
        module,
      )
    return out.reshape(lead + out.shape[-3:]) if len(lead) > 1 else out

  return attention_fn


def _flatten(x: jax.Array, n: int) -> jax.Array:
  return x.reshape((math.prod(x.shape[:n]),) + x.shape[n:])


def _with_weights(
  who,
  weights_fn,
  query,
  key,
  value,
  kwargs,
  dropout,
  dropout_rng,
  dropout_rate,
  broadcast_dropout,
  module,
):
  """``dropout(weights) @ value`` as flax computes it."""
  unbatched = query.ndim == 3
  weights = weights_fn(query, key, **kwargs)
  if module is not None:
    from flax import nnx  # flax only matters to flax callers

    module.sow(nnx.Intermediate, "attention_weights", weights)
  if dropout:
    if dropout_rng is None:
      raise ValueError(
        f"{who}: dropout_rate={dropout_rate} with deterministic=False needs "
        "a dropout_rng"
      )
    keep_prob = 1.0 - dropout_rate
    shape = (
      (1,) * (weights.ndim - 2) + weights.shape[-2:]
      if broadcast_dropout
      else weights.shape
    )
    keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
    multiplier = keep.astype(weights.dtype) / jnp.asarray(
      keep_prob, weights.dtype
    )
    weights = weights * multiplier
  if query.ndim == 3:  # unbatched
    query, key, value, weights = (
      query[None],
      key[None],
      value[None],
      weights[None],
    )
  d = _core.check_qkv(who, query, key, value)
  out = _core.apply_weights(d, weights, value, weights.dtype)
  return out.astype(query.dtype)[0] if unbatched else out.astype(query.dtype)
