"""Attention as pure functions: softmax SDPA and the research variants.

Layout follows `jax.nn.dot_product_attention`: ``query`` is ``(B, T, N, H)``
(or unbatched ``(T, N, H)``), ``key`` and ``value`` are ``(B, S, K, H)``;
logits, ``bias`` and ``mask`` are ``(B, N, T, S)`` (each axis may be 1 to
broadcast). ``T`` is the query length, ``S`` the key length, ``N`` the query
heads, ``K`` the key/value heads (``N % K == 0``; ``K < N`` is grouped-query
attention, query head ``n`` reads kv head ``n // (N // K)``) and ``H`` the head
dim. A boolean ``mask`` is True where attending is allowed; ``is_causal`` lets
query ``i`` see keys ``j <= i`` (top-left aligned, as in JAX).

Every function computes logits, softmax statistics, normalizers and inverses
in ``promote_types(query.dtype, float32)`` and returns ``query.dtype``.
Shape problems raise ``ValueError`` at trace time, naming the argument.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks

# ---------------------------------------------------------------------------
# Shared validation and building blocks.
# ---------------------------------------------------------------------------


def _compute_dtype(*xs: jax.Array) -> jnp.dtype:
  with jax.numpy_dtype_promotion("standard"):
    return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def _large_negative() -> float:
  # As jax.nn: finite, so a fully masked row softmaxes to uniform, not NaN.
  return -0.7 * float(jnp.finfo(jnp.float32).max)


class _Dims(NamedTuple):
  batch: int
  q_len: int
  kv_len: int
  heads: int
  kv_heads: int
  head_dim: int
  value_dim: int
  unbatched: bool


def _check_qkv(
  who: str, query: jax.Array, key: jax.Array, value: jax.Array | None
) -> _Dims:
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
  return _Dims(b, t, s, n, kh, h, hv, unbatched)


def _check_logits_arg(
  who: str, name: str, x: jax.Array | None, d: _Dims
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


def _prepare(who: str, query, key, value, bias, mask):
  d = _check_qkv(who, query, key, value)
  bias = _check_logits_arg(who, "bias", bias, d)
  mask = _check_logits_arg(who, "mask", mask, d)
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


def _allowed(
  d: _Dims, mask: jax.Array | None, is_causal: bool
) -> jax.Array | None:
  """The combined boolean mask (broadcastable to BNTS), or None for all."""
  allowed = mask
  if is_causal:
    causal = jnp.tril(jnp.ones((d.q_len, d.kv_len), jnp.bool_))
    causal = causal.reshape(1, 1, d.q_len, d.kv_len)
    allowed = causal if allowed is None else jnp.logical_and(allowed, causal)
  return allowed


def _raw_logits(d: _Dims, query, key, scale, dtype) -> jax.Array:
  """``q k^T * scale`` in ``dtype``, shape (B, N, T, S), GQA-aware."""
  g = d.heads // d.kv_heads
  q = query.astype(dtype).reshape(d.batch, d.q_len, d.kv_heads, g, d.head_dim)
  k = key.astype(dtype)
  logits = jnp.einsum("btkgh,bskh->bkgts", q, k)
  logits = logits.reshape(d.batch, d.heads, d.q_len, d.kv_len)
  return logits * jnp.asarray(scale, dtype)


def _default_scale(d: _Dims, scale: float | None) -> float:
  return 1.0 / math.sqrt(d.head_dim) if scale is None else scale


def _masked_logits(d, query, key, bias, allowed, scale, dtype) -> jax.Array:
  logits = _raw_logits(d, query, key, scale, dtype)
  if bias is not None:
    logits = logits + bias.astype(dtype)
  if allowed is not None:
    logits = jnp.where(allowed, logits, jnp.asarray(_large_negative(), dtype))
  return logits


def _apply_weights(
  d: _Dims, weights: jax.Array, value: jax.Array, dtype
) -> jax.Array:
  """``weights @ value`` for (B, N, T, S) weights and (B, S, K, Hv) values."""
  g = d.heads // d.kv_heads
  w = weights.astype(dtype).reshape(d.batch, d.kv_heads, g, d.q_len, d.kv_len)
  out = jnp.einsum("bkgts,bskh->btkgh", w, value.astype(dtype))
  return out.reshape(d.batch, d.q_len, d.heads, d.value_dim)


def _finish(d: _Dims, out: jax.Array, dtype) -> jax.Array:
  out = out.astype(dtype)
  return out[0] if d.unbatched else out


def _row_count(d: _Dims, allowed: jax.Array | None, dtype) -> jax.Array:
  """Number of allowed keys per query row, shape broadcastable to BNT1."""
  if allowed is None:
    return jnp.full((1, 1, 1, 1), d.kv_len, dtype)
  return jnp.sum(allowed.astype(dtype), axis=-1, keepdims=True)


# ---------------------------------------------------------------------------
# Softmax attention.
# ---------------------------------------------------------------------------


def attention_weights(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
) -> Float[Array, "B N T S"]:
  r"""Softmax attention weights :math:`\mathrm{softmax}(q k^T s + b)`.

  Masked entries are excluded; a fully masked row is uniform over all keys
  (JAX's convention). Returned in float32 (or float64 for float64 inputs).

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)`` or ``(S, K, H)``.
    bias: additive logits bias, broadcastable to ``(B, N, T, S)``.
    mask: boolean, broadcastable to ``(B, N, T, S)``; True attends.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.

  Returns:
    Weights ``(B, N, T, S)`` (``(N, T, S)`` unbatched), rows summing to 1.

  Raises:
    ValueError: on mismatched shapes (naming the argument).
    TypeError: on non-floating q/k/bias or a non-boolean mask.
  """
  d, query, key, _, bias, mask = _prepare(
    "attention_weights", query, key, None, bias, mask
  )
  dtype = _compute_dtype(query, key)
  allowed = _allowed(d, mask, is_causal)
  logits = _masked_logits(
    d, query, key, bias, allowed, _default_scale(d, scale), dtype
  )
  w = jax.nn.softmax(logits, axis=-1)
  return w[0] if d.unbatched else w


def dot_product_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
) -> Float[Array, "B T N Hv"]:
  r"""Scaled dot-product attention with float32 softmax statistics.

  .. math:: \mathrm{out} = \mathrm{softmax}(q k^T \cdot s + b
     + \mathrm{mask}) \, v

  Follows `jax.nn.dot_product_attention` (the XLA implementation): same
  layouts, boolean masks (True attends), additive ``bias``, ``is_causal``,
  grouped-query and multi-query heads, default ``s = 1/sqrt(H)``. A fully
  masked row returns the mean of ``value`` over keys, as in JAX. Logits and
  softmax are computed in float32 even for bfloat16 inputs; the output has
  ``query.dtype``. Unlike JAX, ``value`` may have its own head dim ``Hv``.

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)`` or ``(S, K, H)``, with ``N % K == 0``.
    value: ``(B, S, K, Hv)`` or ``(S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask (query ``i`` sees ``j <= i``).

  Returns:
    ``(B, T, N, Hv)`` (or ``(T, N, Hv)``) in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, naming the argument.
    TypeError: on non-floating inputs or a non-boolean mask.

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017);
    Ainslie et al., *GQA*, arXiv:2305.13245 (2023).
  """
  d, q, k, v, bias, mask = _prepare(
    "dot_product_attention", query, key, value, bias, mask
  )
  dtype = _compute_dtype(q, k, v)
  allowed = _allowed(d, mask, is_causal)
  logits = _masked_logits(
    d, q, k, bias, allowed, _default_scale(d, scale), dtype
  )
  w = jax.nn.softmax(logits, axis=-1)
  return _finish(d, _apply_weights(d, w, v, dtype), query.dtype)


# ---------------------------------------------------------------------------
# Attention sinks and gated output.
# ---------------------------------------------------------------------------


def softmax_off_by_one(
  logits: Float[Array, "..."], *, axis: int = -1, sink: ArrayLike = 0.0
) -> Float[Array, "..."]:
  r"""Softmax with an extra implicit sink logit: ``exp(x)/(exp(s) + sum exp)``.

  .. math:: \mathrm{softmax}_1(x)_i = \frac{e^{x_i}}{e^{s} + \sum_j e^{x_j}}

  ``sink = 0`` is Miller's softmax-off-by-one (a zero key with a zero value);
  a learned ``sink`` is the GPT-OSS attention sink. Computed stably with
  ``m = max(s, max_j x_j)`` in float32. Rows sum to less than 1; all-``-inf``
  logits give zeros.

  Args:
    logits: any shape, floating.
    axis: the normalized axis.
    sink: the sink logit, broadcastable to ``logits`` with ``axis`` reduced.

  Returns:
    Weights of ``logits.shape`` in ``promote(logits.dtype, float32)``.

  Raises:
    TypeError: if ``logits`` is not floating.

  References:
    E. Miller, *Attention Is Off By One* (2023, blog); OpenAI, *gpt-oss-120b
    & gpt-oss-20b Model Card*, arXiv:2508.10925 (2025).
  """
  _checks.check_floating("softmax_off_by_one", "logits", logits)
  dtype = _compute_dtype(logits)
  x = logits.astype(dtype)
  s = jnp.asarray(sink, dtype)
  s = jnp.broadcast_to(s, jnp.max(x, axis=axis, keepdims=True).shape)
  m = jnp.maximum(
    jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True)),
    jax.lax.stop_gradient(s),
  )
  e = jnp.exp(x - m)
  return e / (jnp.exp(s - m) + jnp.sum(e, axis=axis, keepdims=True))


def sink_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  sinks: Float[Array, " N"] | None = None,
  scale: float | None = None,
  is_causal: bool = False,
) -> Float[Array, "B T N Hv"]:
  r"""Attention with a per-head sink logit (off-by-one / learnable sink).

  .. math:: w_{ij} = \frac{e^{x_{ij}}}{e^{s_h} + \sum_{j'} e^{x_{ij'}}},
     \quad \mathrm{out}_i = \sum_j w_{ij} v_j

  Equivalent to appending a key whose logit is ``s_h`` and whose value is 0.
  ``sinks=None`` uses ``s_h = 0`` (softmax-off-by-one, x-transformers
  ``add_zero_kv``); a learned ``(N,)`` vector is x-transformers'
  ``head_learned_sink`` / the GPT-OSS sink. A fully masked row gives 0 (all
  mass on the sink), unlike plain SDPA's mean of V.

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    sinks: per-head sink logits ``(N,)``; None means zeros.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, including ``sinks`` not ``(N,)``.
    TypeError: on non-floating inputs or a non-boolean mask.

  References:
    Qiu et al., *A Unified View of Attention and Residual Sinks:
    Outlier-Driven Rescaling*, arXiv:2601.22966 (2026); Xiao et al.,
    *Efficient Streaming Language Models with Attention Sinks*,
    arXiv:2309.17453 (2023); Miller, *Attention Is Off By One* (2023).
  """
  who = "sink_attention"
  d, q, k, v, bias, mask = _prepare(who, query, key, value, bias, mask)
  dtype = _compute_dtype(q, k, v)
  if sinks is None:
    s = jnp.zeros((1, 1, 1, 1), dtype)
  else:
    _checks.check_shape(who, "sinks", sinks, (d.heads,), "one per query head")
    s = jnp.asarray(sinks).astype(dtype).reshape(1, d.heads, 1, 1)
  allowed = _allowed(d, mask, is_causal)
  logits = _masked_logits(
    d, q, k, bias, allowed, _default_scale(d, scale), dtype
  )
  w = softmax_off_by_one(logits, sink=s)
  if allowed is not None:
    w = jnp.where(allowed, w, jnp.zeros((), dtype))
  return _finish(d, _apply_weights(d, w, v, dtype), query.dtype)


def gated_attention_output(
  attention_out: Float[Array, "B T N H"],
  gate_logits: Float[Array, "B T N Hg"],
) -> Float[Array, "B T N H"]:
  r"""Gated attention output: :math:`Y' = Y \odot \sigma(X W_g)`.

  The explicit gated rescaling of the sinks paper (G1 of the gated attention
  paper): the SDPA output is scaled elementwise by a sigmoid of a projection
  of the pre-normed hidden state, before the output projection. Pass
  ``gate_logits = x @ W_g`` reshaped to ``(B, T, N, H)`` (elementwise) or
  ``(B, T, N, 1)`` (head-wise). The sigmoid is taken in float32.

  Args:
    attention_out: ``(..., N, H)``, the per-head attention output.
    gate_logits: ``(..., N, H)`` or ``(..., N, 1)``.

  Returns:
    ``attention_out.shape`` in ``attention_out.dtype``.

  Raises:
    ValueError: if ``gate_logits`` is neither shape.
    TypeError: on non-floating inputs.

  References:
    Qiu et al., *Gated Attention for Large Language Models: Non-linearity,
    Sparsity, and Attention-Sink-Free*, arXiv:2505.06708 (2025); Qiu et al.,
    arXiv:2601.22966 (2026).
  """
  who = "gated_attention_output"
  _checks.check_floating(who, "attention_out", attention_out)
  _checks.check_floating(who, "gate_logits", gate_logits)
  shape = attention_out.shape
  if gate_logits.shape not in (shape, shape[:-1] + (1,)):
    raise ValueError(
      f"{who}: gate_logits must have shape {shape} (elementwise) or "
      f"{shape[:-1] + (1,)} (head-wise), got {gate_logits.shape=}"
    )
  dtype = _compute_dtype(attention_out, gate_logits)
  gate = jax.nn.sigmoid(gate_logits.astype(dtype))
  return (attention_out.astype(dtype) * gate).astype(attention_out.dtype)


# ---------------------------------------------------------------------------
# Affine-scaled attention.
# ---------------------------------------------------------------------------


def linear_clipping(x: Float[Array, "..."]) -> Float[Array, "..."]:
  r"""Affine-Scaled Attention's default gate, ``clip(0.1 x + 0.5, 0, 1)``.

  Zero for ``x <= -5``, one for ``x >= 5``, linear in between (the paper's
  "linear clipping"; the sigmoid is its ablation).
  """
  _checks.check_floating("linear_clipping", "x", x)
  dtype = _compute_dtype(x)
  y = jnp.clip(x.astype(dtype) * 0.1 + 0.5, 0.0, 1.0)
  return y.astype(x.dtype)


def affine_scaled_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  alpha: Float[Array, "B T N"],
  alpha_ma: Float[Array, "..."],
  scale: float | None = None,
  is_causal: bool = False,
  training: bool = False,
  rho: float = 0.9,
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "..."]]:
  r"""Affine-Scaled Attention: softmax weights with an input-dependent affine.

  .. math::
     P = \mathrm{softmax}(q k^T s), \quad
     \beta_i = \frac{\bar\alpha - \alpha_i}{N_i}, \quad
     \mathrm{out}_i = \sum_{j \in \mathcal{A}_i} (\alpha_i P_{ij} + \beta_i)
     v_j

  ``alpha`` is :math:`\phi(X W_a)` (`linear_clipping` by default), one scalar
  per query and head. :math:`\bar\alpha` is ``alpha_ma``, a running estimate
  of the batch mean of ``alpha``:
  :math:`\bar\alpha_t = \rho \bar\alpha_{t-1} + (1 - \rho) E[\alpha_t]`.
  Each weight row sums to :math:`\bar\alpha` (not 1) and may be negative.

  Conventions (unverified; the paper leaves them open):

  * ``N_i`` is the number of keys query ``i`` may attend to (its allowed set
    :math:`\mathcal{A}_i` from ``mask``/``is_causal``); ``beta`` is spread on
    those keys only, so masked keys get exactly 0. A query with no allowed key
    outputs 0.
  * The running estimate's axes follow ``alpha_ma.shape``: ``(N,)`` is one
    value per head (default in the module), ``()`` one per layer. The mean
    runs over batch and queries (and heads for ``()``), over rows with at
    least one allowed key.
  * In training the updated estimate (including this batch) is used, under
    ``stop_gradient``; in eval the stored one is used and returned unchanged.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    alpha: the scale ``(B, T, N)``.
    alpha_ma: running estimate, ``(N,)`` or ``()``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.
    training: update the running estimate (True) or use it (False).
    rho: EMA decay (paper: 0.9).

  Returns:
    ``(out, new_alpha_ma)``: ``(B, T, N, Hv)`` in ``query.dtype`` and the
    estimate in ``alpha_ma.dtype``.

  Raises:
    ValueError: on mismatched shapes (``alpha``, ``alpha_ma``, q/k/v,
      bias, mask) or ``rho`` outside ``[0, 1]``.
    TypeError: on non-floating inputs or a non-boolean mask.

  References:
    Bae et al., *Affine-Scaled Attention: Towards Flexible and Stable
    Transformer Attention*, arXiv:2602.23057 (2026), eqs. 6-11.
  """
  who = "affine_scaled_attention"
  d, q, k, v, bias, mask = _prepare(who, query, key, value, bias, mask)
  if d.unbatched:
    raise ValueError(
      f"{who}: query must be batched (B, T, N, H), got {query.shape=}"
    )
  _checks.check_floating(who, "alpha", alpha)
  _checks.check_shape(
    who, "alpha", alpha, (d.batch, d.q_len, d.heads), "(batch, q_len, heads)"
  )
  alpha_ma = jnp.asarray(alpha_ma)
  if alpha_ma.shape not in ((d.heads,), ()):
    raise ValueError(
      f"{who}: alpha_ma must have shape ({d.heads},) (per head) or () (per "
      f"layer), got {alpha_ma.shape=}"
    )
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f"{who}: rho must be in [0, 1], got {rho=}")
  dtype = _compute_dtype(q, k, v)
  allowed = _allowed(d, mask, is_causal)
  logits = _masked_logits(
    d, q, k, bias, allowed, _default_scale(d, scale), dtype
  )
  p = jax.nn.softmax(logits, axis=-1)
  a = jnp.transpose(alpha.astype(dtype), (0, 2, 1))[..., None]  # B N T 1
  count = _row_count(d, allowed, dtype)  # (B|1, N|1, T|1, 1)
  valid = jnp.broadcast_to(count > 0, a.shape)
  if training:
    wsum = jnp.where(valid, a, 0.0)
    axes = (0, 2, 3) if alpha_ma.ndim == 1 else (0, 1, 2, 3)
    n_valid = jnp.maximum(jnp.sum(valid.astype(dtype), axis=axes), 1.0)
    batch_mean = jnp.sum(wsum, axis=axes) / n_valid
    new_ma = rho * alpha_ma.astype(dtype) + (1.0 - rho) * batch_mean
    new_ma = jax.lax.stop_gradient(new_ma)
  else:
    new_ma = alpha_ma.astype(dtype)
  ma = new_ma.reshape((1, d.heads, 1, 1) if new_ma.ndim else (1, 1, 1, 1))
  beta = (ma - a) / jnp.maximum(count, 1.0)
  w = a * p + beta
  if allowed is not None:
    w = jnp.where(allowed, w, 0.0)
  w = jnp.where(valid, w, 0.0)
  out = _finish(d, _apply_weights(d, w, v, dtype), query.dtype)
  return out, new_ma.astype(alpha_ma.dtype)
