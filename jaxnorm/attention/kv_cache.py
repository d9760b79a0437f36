"""Decode-cache helpers: the mask of a cache and the StreamingLLM policy.

A decode step writes ``T`` new tokens into a key/value cache of ``L`` slots
``(B, L, K, H)`` and attends from the ``T`` queries to the cache. These
functions say which slot each new token goes to and which slots each query
may see; `jaxnorm.nn.attention.MultiHeadAttention` uses them for
``decode=True``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxnorm import _checks, _scope
from jaxnorm.attention import _core


@_scope.scoped
def decode_mask(
  query_start: Int[Array, ""] | int,
  q_len: int,
  max_length: int,
  *,
  local_window_size: _core.Window = None,
) -> Bool[Array, "1 1 T L"]:
  r"""Which cache slots each query of a decode step may attend to.

  Query ``i`` sits at slot :math:`p_i = \mathrm{query\_start} + i` (its own
  key is written there) and sees slots :math:`j \le p_i`: the causal mask
  of the cache, and slots not yet written (``j > p_i``) are never seen.
  With ``local_window_size = (left, right)`` (an int ``w`` is ``(w, w)``)
  it also needs :math:`j \ge p_i - \mathrm{left}` (``right`` is moot:
  later slots are already excluded), the rule of
  `dot_product_attention` in cache coordinates.

  Args:
    query_start: slot of the first new query (traced or static int).
    q_len: number of new queries ``T``.
    max_length: number of cache slots ``L``.
    local_window_size: ``(left, right)``, an int, or None.

  Returns:
    Boolean ``(1, 1, T, L)``, True where attending is allowed.

  Raises:
    ValueError: if ``q_len``/``max_length`` are not positive ints or the
      window is malformed.

  Examples:
    >>> mask = attention.decode_mask(2, 1, 4)  # one query at slot 2
    >>> print(np.asarray(mask[0, 0]))
    [[ True  True  True False]]
    >>> mask = attention.decode_mask(2, 1, 4, local_window_size=1)
    >>> print(np.asarray(mask[0, 0]))
    [[False  True  True False]]
  """
  who = "decode_mask"
  _checks.check_positive_int(who, "q_len", q_len)
  _checks.check_positive_int(who, "max_length", max_length)
  window = _core.window(who, local_window_size)
  pos = jnp.asarray(query_start, jnp.int32) + jnp.arange(q_len)[:, None]
  j = jnp.arange(max_length)[None, :]
  allowed = j <= pos
  if window is not None:
    allowed = jnp.logical_and(allowed, j >= pos - window[0])
  return allowed[None, None]


def _streaming_slots(who, cache_index, q_len, capacity, num_sink_tokens):
  """Source index into ``concat(cache, new)``, validity, first query slot."""
  _checks.check_positive_int(who, "q_len", q_len)
  if not isinstance(num_sink_tokens, int) or num_sink_tokens < 0:
    raise ValueError(
      f"{who}: num_sink_tokens must be an int >= 0, got {num_sink_tokens=}"
    )
  window = capacity - num_sink_tokens
  if q_len > window:
    raise ValueError(
      f"{who}: a call may add at most the window W = cache length "
      f"{capacity} - num_sink_tokens {num_sink_tokens} = {window} tokens, "
      f"got q_len={q_len}"
    )
  fill = jnp.minimum(jnp.asarray(cache_index, jnp.int32), capacity)
  drop = jnp.maximum(fill + q_len - capacity, 0)
  r = jnp.arange(capacity)
  u = jnp.where(r < num_sink_tokens, r, r + drop)  # Index in the stream.
  src = jnp.where(u < fill, u, capacity + u - fill)
  valid = u < fill + q_len
  return jnp.where(valid, src, 0), valid, fill - drop


@_scope.scoped
def streaming_cache_update(
  cached: Float[Array, "B L K H"],
  new: Float[Array, "B T K H"],
  cache_index: Int[Array, ""] | int,
  *,
  num_sink_tokens: int = 4,
) -> tuple[Float[Array, "B L K H"], Int[Array, ""]]:
  r"""StreamingLLM: keep the attention sinks and a window of recent tokens.

  The cache of ``L`` slots holds, in order, the first ``S =
  num_sink_tokens`` tokens of the stream (the attention sinks) and the most
  recent ``W = L - S`` tokens, so its size stays ``L`` however long the
  stream. ``cache_index`` counts the tokens seen before this call; the
  cache's first ``min(cache_index, L)`` slots are filled. The ``T`` new
  tokens are appended; when the cache would overflow, the oldest window
  tokens are evicted (the official ``StartRecentKVCache.evict_for_space``:
  keep ``[0, S)`` and the last ``W - T`` old tokens, then append), so after
  the call the cache holds the sinks and the last ``W`` tokens of the
  stream, new ones included, compacted in stream order.

  Positions are the slots (positions *within the cache*, not in the text):
  a cached token's position is its slot, and new query ``i`` sits at
  ``query_start + i`` (returned). The official code stores keys *before*
  RoPE and rotates the whole cache with ``arange(len(cache))`` at every
  step (``pos_shift/modify_llama.py``: ``key_position_ids =
  arange(kv_seq_len)``; queries get ``position_ids``, which after eviction
  is their index in the cache); so store un-rotated keys here and rotate
  them by slot, and mask with `decode_mask(query_start, T, L)`. Query ``i``
  of a call of ``T`` tokens after ``n`` then attends to the sinks and to
  the stream tokens ``max(S, n - W + T) <= j <= n + i``: one token at a
  time, the sinks and the ``W`` most recent tokens, itself included; a
  chunk evicts for all its tokens first (as the official code does for a
  prompt), so its earlier queries see fewer recent tokens.

  Deviation: the official perplexity script (``eval_long_ppl.py``) evicts
  *after* each forward, so its query sees ``W + 1`` recent tokens; here the
  cache length ``L`` includes the current token (``evict_for_space``, the
  official chat script).

  Args:
    cached: the cache ``(B, L, K, H)`` (keys before RoPE, or values).
    new: the new tokens' keys or values ``(B, T, K, H)``, ``T <= W``.
    cache_index: tokens seen before this call (int32 scalar).
    num_sink_tokens: ``S`` (paper default 4), ``0 <= S < L``.

  Returns:
    ``(updated, query_start)``: the cache after the call, in
    ``cached.dtype`` (unfilled slots 0), and the slot of the first new
    query (int32).

  Raises:
    ValueError: on mismatched ranks/shapes, ``S`` not in ``[0, L)`` or
      ``T > W``.

  Examples:
    >>> cache = jnp.arange(4.0).reshape(1, 4, 1, 1)  # a full cache, L = 4
    >>> new = jnp.full((1, 1, 1, 1), 9.0)
    >>> cache, start = attention.streaming_cache_update(
    ...     cache, new, 4, num_sink_tokens=1)  # keep sink 0, evict 1
    >>> print(np.asarray(cache[0, :, 0, 0]), int(start))
    [0. 2. 3. 9.] 3

  References:
    Xiao et al., *Efficient Streaming Language Models with Attention
    Sinks*, arXiv:2309.17453 (2023), Sec. 3.2 and the official code
    (mit-han-lab/streaming-llm).
  """
  who = "streaming_cache_update"
  _checks.check_ndim(who, "cached", cached, expected=4)
  cached = jnp.asarray(cached)
  _checks.check_ndim(who, "new", new, expected=4)
  if new.shape[:1] + new.shape[2:] != cached.shape[:1] + cached.shape[2:]:
    raise ValueError(
      f"{who}: new must match cached on every axis but the sequence axis, "
      f"got {new.shape=} and {cached.shape=}"
    )
  capacity = cached.shape[1]
  if isinstance(num_sink_tokens, int) and num_sink_tokens >= capacity:
    raise ValueError(
      f"{who}: num_sink_tokens must be below the cache length {capacity}, "
      f"got {num_sink_tokens=}"
    )
  src, valid, start = _streaming_slots(
    who, cache_index, new.shape[1], capacity, num_sink_tokens
  )
  both = jnp.concatenate([cached, new.astype(cached.dtype)], axis=1)
  kept = jnp.take(both, src, axis=1)
  zero = jnp.zeros((), cached.dtype)
  return jnp.where(valid[None, :, None, None], kept, zero), start
