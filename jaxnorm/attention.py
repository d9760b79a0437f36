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

import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
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


def affine_scale_running_estimate(
  alpha: Float[Array, "..."],
  valid: Bool[Array, "..."],
  alpha_ma: Float[Array, "..."],
  *,
  head_axis: int,
  training: bool,
  rho: float,
) -> Float[Array, "..."]:
  r"""The running estimate :math:`\bar\alpha` of Affine-Scaled Attention.

  Training: :math:`\bar\alpha \leftarrow \rho\,\bar\alpha + (1 - \rho)
  \,\mathrm{mean}(\alpha)`, the mean over the query rows that have at least
  one allowed key (``valid``), per head when ``alpha_ma`` has shape ``(N,)``
  and over everything when it is a scalar; no gradient flows into the
  estimate. Inference returns ``alpha_ma`` unchanged. Shared by
  `affine_scaled_attention` and its Pallas kernel so both use one update.

  Args:
    alpha: per-row scales, a 4-d array with the heads on ``head_axis``, in
      the compute dtype.
    valid: rows with an allowed key, same shape as ``alpha``.
    alpha_ma: ``(N,)`` or ``()``.
    head_axis: the axis of ``alpha`` holding the ``N`` heads.
    training: update (True) or keep (False) the estimate.
    rho: EMA decay in ``[0, 1]``.

  Returns:
    The estimate in ``alpha``'s dtype (cast it back to ``alpha_ma.dtype``).
  """
  if not training:
    return alpha_ma.astype(alpha.dtype)
  axes = (
    tuple(i for i in range(alpha.ndim) if i != head_axis)
    if alpha_ma.ndim == 1
    else tuple(range(alpha.ndim))
  )
  n_valid = jnp.maximum(jnp.sum(valid.astype(alpha.dtype), axis=axes), 1.0)
  batch_mean = jnp.sum(jnp.where(valid, alpha, 0.0), axis=axes) / n_valid
  new_ma = rho * alpha_ma.astype(alpha.dtype) + (1.0 - rho) * batch_mean
  return jax.lax.stop_gradient(new_ma)


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
  new_ma = affine_scale_running_estimate(
    a, valid, alpha_ma, head_axis=1, training=training, rho=rho
  )
  ma = new_ma.reshape((1, d.heads, 1, 1) if new_ma.ndim else (1, 1, 1, 1))
  beta = (ma - a) / jnp.maximum(count, 1.0)
  w = a * p + beta
  if allowed is not None:
    w = jnp.where(allowed, w, 0.0)
  w = jnp.where(valid, w, 0.0)
  out = _finish(d, _apply_weights(d, w, v, dtype), query.dtype)
  return out, new_ma.astype(alpha_ma.dtype)


# ---------------------------------------------------------------------------
# Rotary position embedding (used by the module and by NaLa's numerator).
# ---------------------------------------------------------------------------


def rope(
  x: Float[Array, "B T N H"],
  positions: Float[Array, "B T"] | None = None,
  *,
  base: float = 10000.0,
) -> Float[Array, "B T N H"]:
  r"""Rotary position embedding (rotate-half layout) on the last axis.

  Pairs dimension ``i`` with ``i + H/2`` and rotates it by
  :math:`\theta_i p` with :math:`\theta_i = \mathrm{base}^{-2i/H}`, so
  :math:`\langle R_p q, R_{p'} k \rangle` depends on ``p - p'`` only.

  Args:
    x: ``(B, T, N, H)`` with even ``H``.
    positions: ``(B, T)`` or ``(T,)`` positions; default ``arange(T)``.
    base: the frequency base.

  Returns:
    ``x.shape`` in ``x.dtype`` (rotation computed in float32).

  Raises:
    ValueError: if ``x`` is not rank 4, ``H`` is odd, or ``positions`` has
      the wrong shape.

  References:
    Su et al., *RoFormer: Enhanced Transformer with Rotary Position
    Embedding*, arXiv:2104.09864 (2021).
  """
  who = "rope"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, expected=4)
  b, t, _, h = x.shape
  if h % 2:
    raise ValueError(f"{who}: the head dim must be even, got {x.shape=}")
  if positions is None:
    positions = jnp.arange(t, dtype=jnp.float32)
  positions = jnp.asarray(positions)
  if positions.shape == (t,):
    positions = positions[None]
  if positions.shape not in ((1, t), (b, t)):
    raise ValueError(
      f"{who}: positions must have shape ({t},) or ({b}, {t}), got "
      f"{positions.shape=}"
    )
  dtype = _compute_dtype(x)
  half = h // 2
  inv = base ** (-jnp.arange(half, dtype=dtype) * 2.0 / h)
  ang = positions.astype(dtype)[..., None] * inv.reshape(1, 1, half)
  cos = jnp.cos(ang)[:, :, None, :]
  sin = jnp.sin(ang)[:, :, None, :]
  x1, x2 = x[..., :half].astype(dtype), x[..., half:].astype(dtype)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _repeat_kv(d: _Dims, x: jax.Array) -> jax.Array:
  """Repeats kv heads ``(B, S, K, H)`` to ``(B, S, N, H)`` (GQA order)."""
  g = d.heads // d.kv_heads
  return x if g == 1 else jnp.repeat(x, g, axis=2)


# ---------------------------------------------------------------------------
# SOFT: softmax-free attention with a Gaussian kernel and a Newton inverse.
# ---------------------------------------------------------------------------


def gaussian_kernel(
  a: Float[Array, "... n d"], b: Float[Array, "... m d"]
) -> Float[Array, "... n m"]:
  r"""SOFT's kernel :math:`\kappa(a, b) = \exp(-\|a - b\|^2 / 2)`.

  Computed as :math:`\|a\|^2 + \|b\|^2 - 2 a \cdot b` (clamped at 0) in
  float32.

  Args:
    a: ``(..., n, d)``.
    b: ``(..., m, d)`` with the same leading axes.

  Returns:
    ``(..., n, m)`` in ``promote(dtype, float32)``.

  Raises:
    ValueError: if the feature dims differ.
    TypeError: on non-floating inputs.
  """
  who = "gaussian_kernel"
  _checks.check_floating(who, "a", a)
  _checks.check_floating(who, "b", b)
  if a.shape[-1] != b.shape[-1] or a.ndim != b.ndim:
    raise ValueError(
      f"{who}: a and b must have the same rank and feature dim, got "
      f"{a.shape=} and {b.shape=}"
    )
  dtype = _compute_dtype(a, b)
  a, b = a.astype(dtype), b.astype(dtype)
  aa = jnp.sum(a * a, axis=-1)[..., :, None]
  bb = jnp.sum(b * b, axis=-1)[..., None, :]
  ab = jnp.einsum("...nd,...md->...nm", a, b)
  return jnp.exp(-0.5 * jnp.maximum(aa + bb - 2.0 * ab, 0.0))


def _newton_init(p: jax.Array, init: str) -> jax.Array:
  """The starting iterate ``alpha * p^T`` (see `newton_inverse`)."""
  pt = jnp.swapaxes(p, -1, -2)
  rows = jnp.sum(jnp.abs(p), axis=-1)
  if init == "row_sum":
    alpha = 1.8 / jnp.square(jnp.max(rows, axis=-1))
    return alpha[..., None, None] * pt
  # "backtrack" (SOFT-Norm): global alpha, halved while ||I - P V||_1 > 1.01.
  m = p.shape[-1]
  eye = jnp.eye(m, dtype=p.dtype).reshape((1,) * (p.ndim - 2) + (m, m))

  def residual(alpha):
    r = eye - p @ (alpha * pt)
    return jnp.max(jnp.sum(jnp.abs(r), axis=-2))

  def cond(state):
    alpha, tries = state
    return jnp.logical_and(residual(alpha) > 1.01, tries < 10)

  def body(state):
    alpha, tries = state
    return alpha * 0.5, tries + 1

  alpha0 = 2.0 / jnp.square(jnp.max(rows))
  alpha, _ = jax.lax.while_loop(cond, body, (alpha0, jnp.int32(0)))
  return alpha * pt


def _newton_iterate(p: jax.Array, num_iters: int, init: str) -> jax.Array:
  v0 = jax.lax.stop_gradient(_newton_init(p, init))
  return jax.lax.fori_loop(0, num_iters, lambda _, v: 2.0 * v - v @ p @ v, v0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _newton_implicit(p: jax.Array, num_iters: int, init: str) -> jax.Array:
  return _newton_iterate(p, num_iters, init)


def _newton_implicit_fwd(p, num_iters, init):
  v = _newton_iterate(p, num_iters, init)
  return v, v


def _newton_implicit_bwd(num_iters, init, v, g):
  del num_iters, init
  vt = jnp.swapaxes(v, -1, -2)
  return (-(vt @ g @ vt),)


_newton_implicit.defvjp(_newton_implicit_fwd, _newton_implicit_bwd)


def newton_inverse(
  a: Float[Array, "... m m"],
  *,
  num_iters: int = 20,
  reg: float = 0.01,
  init: Literal["row_sum", "backtrack"] = "row_sum",
  grad: Literal["implicit", "unrolled"] = "implicit",
) -> Float[Array, "... m m"]:
  r"""Newton-Raphson (Newton-Schulz) approximation of :math:`(A + rI)^{-1}`.

  With :math:`P = A + r I`: :math:`V_0 = \alpha P^T`, then
  :math:`V \leftarrow 2V - V P V` for ``num_iters`` steps. SOFT's init
  (``"row_sum"``) is :math:`\alpha = 0.9 \cdot 2 / (\max_i \sum_j
  |A_{ij}|)^2` per matrix; SOFT-Norm's (``"backtrack"``) is
  :math:`2/(\max \sum_j |A_{ij}|)^2` taken over the whole batch and halved
  (at most 10 times) while :math:`\|I - P V_0\|_1 > 1.01`.

  Deviation: the row sums are of :math:`|A_{ij}|` (SOFT sums signed
  entries). They agree for SOFT's entrywise-positive Gaussian kernels, and
  the absolute sums bound :math:`\sigma_{\max}`, so the iteration also
  converges on symmetric matrices with negative entries instead of diverging.
  Convergence needs about :math:`\log_2 \mathrm{cond}(P)` plus a few steps:
  20 steps reach 1e-4 only up to a condition number of roughly 100.

  ``grad="implicit"`` (SOFT's custom gradient) differentiates the exact
  inverse at the Newton result: :math:`\bar A = -V^T G V^T`; the iterations
  are not differentiated. ``"unrolled"`` backpropagates through them (the
  SOFT-Norm code path). The init is under ``stop_gradient`` in both.

  Args:
    a: ``(..., m, m)`` matrices.
    num_iters: Newton steps (SOFT: 20).
    reg: ridge ``r`` added to the diagonal (SOFT: 0.01; SOFT-Norm: 0).
    init: ``"row_sum"`` or ``"backtrack"``.
    grad: ``"implicit"`` or ``"unrolled"``.

  Returns:
    ``(..., m, m)`` in ``promote(a.dtype, float32)``.

  Raises:
    ValueError: if ``a`` is not square, or on a bad option.
    TypeError: if ``a`` is not floating.

  References:
    Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity*,
    arXiv:2110.11945 (2021); Lu et al., *Softmax-free Linear Transformers*,
    arXiv:2207.03341 (2024).
  """
  who = "newton_inverse"
  _checks.check_floating(who, "a", a)
  _checks.check_ndim(who, "a", a, minimum=2)
  if a.shape[-1] != a.shape[-2]:
    raise ValueError(
      f"{who}: a must be square on its last two axes, got {a.shape=}"
    )
  _checks.check_choice(who, "init", init, ("row_sum", "backtrack"))
  _checks.check_choice(who, "grad", grad, ("implicit", "unrolled"))
  _checks.check_nonnegative(who, "num_iters", num_iters)
  dtype = _compute_dtype(a)
  m = a.shape[-1]
  eye = jnp.eye(m, dtype=dtype).reshape((1,) * (a.ndim - 2) + (m, m))
  p = a.astype(dtype) + reg * eye
  if grad == "implicit":
    return _newton_implicit(p, int(num_iters), init)
  return _newton_iterate(p, int(num_iters), init)


def soft_landmarks(
  query: Float[Array, "B T N H"], ratio: int, *, scale: float | None = None
) -> Float[Array, "B M N H"]:
  """Parameter-free SOFT landmarks: means of ``ratio`` consecutive tokens.

  Deviation: SOFT builds landmarks with a strided ``ratio x ratio`` conv on
  the 2-D token map followed by LayerNorm and GELU. For 1-D sequences
  jaxnorm pools the scaled query (``query * scale``, default ``H**-0.25``)
  over windows of ``ratio`` tokens, giving ``M = T / ratio`` landmarks.

  Raises:
    ValueError: if ``T`` is not divisible by ``ratio``.
  """
  who = "soft_landmarks"
  _checks.check_floating(who, "query", query)
  _checks.check_ndim(who, "query", query, expected=4)
  _checks.check_positive_int(who, "ratio", ratio)
  b, t, n, h = query.shape
  _checks.check_divisible(who, "query.shape[1]", t, "ratio", ratio)
  s = h**-0.25 if scale is None else scale
  dtype = _compute_dtype(query)
  q = query.astype(dtype) * s
  return jnp.mean(q.reshape(b, t // ratio, ratio, n, h), axis=2)


def soft_attention(
  query: Float[Array, "B T N H"],
  value: Float[Array, "B T N Hv"],
  landmarks: Float[Array, "B M N H"],
  *,
  scale: float | None = None,
  num_iters: int = 20,
  reg: float = 0.01,
  init: Literal["row_sum", "backtrack"] = "row_sum",
  grad: Literal["implicit", "unrolled"] = "implicit",
  symmetric_norm: bool = False,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT: softmax-free attention with a Gaussian kernel, linear in ``T``.

  .. math::
     \hat q = q \cdot s, \quad K_1 = \kappa(\hat q, \tilde q), \quad
     K_2 = \kappa(\tilde q, \tilde q), \quad
     \mathrm{out} = K_1 \, \mathrm{inv}(K_2) \, (K_1^T v)

  Query and key are tied (``K = Q``); ``landmarks`` :math:`\tilde q` are
  given in the scaled space (e.g. `soft_landmarks`); ``inv`` is
  `newton_inverse` (approximating :math:`(K_2 + rI)^{-1}`). With
  ``symmetric_norm`` (SOFT-Norm) the inverse becomes
  :math:`D^{-1/2}\,\mathrm{inv}(K_2)\,D^{-1/2}` with
  :math:`D = \mathrm{diag}(K_2 \mathbf{1})`. Evaluated right to left:
  :math:`O(T M H + M^3)` per head. SOFT's local depthwise-conv branch on
  ``v`` and the projections are the module's job.

  Args:
    query: ``(B, T, N, H)``.
    value: ``(B, T, N, Hv)``.
    landmarks: ``(B, M, N, H)``.
    scale: query scale, default ``H**-0.25``.
    num_iters: Newton steps.
    reg: diagonal ridge of the inverse.
    init: Newton init, see `newton_inverse`.
    grad: ``"implicit"`` (custom VJP) or ``"unrolled"``.
    symmetric_norm: SOFT-Norm's symmetric normalization.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes.
    TypeError: on non-floating inputs.

  References:
    Lu et al., arXiv:2110.11945 (2021); Lu et al., arXiv:2207.03341 (2024).
  """
  who = "soft_attention"
  for name, x in (("query", query), ("value", value), ("landmarks", landmarks)):
    _checks.check_floating(who, name, x)
    _checks.check_ndim(who, name, x, expected=4)
  b, t, n, h = query.shape
  if value.shape[:3] != (b, t, n):
    raise ValueError(
      f"{who}: value must be (batch, seq, heads, dv)=({b}, {t}, {n}, dv) "
      f"like query (SOFT ties keys to queries), got {value.shape=}"
    )
  if landmarks.shape[0] != b or landmarks.shape[2:] != (n, h):
    raise ValueError(
      f"{who}: landmarks must have shape ({b}, M, {n}, {h}), got "
      f"{landmarks.shape=}"
    )
  s = h**-0.25 if scale is None else scale
  dtype = _compute_dtype(query, value, landmarks)
  q = jnp.swapaxes(query.astype(dtype) * s, 1, 2)  # B N T H
  lm = jnp.swapaxes(landmarks.astype(dtype), 1, 2)  # B N M H
  v = jnp.swapaxes(value.astype(dtype), 1, 2)  # B N T Hv
  k1 = gaussian_kernel(q, lm)  # B N T M
  k2 = gaussian_kernel(lm, lm)  # B N M M
  inv = newton_inverse(k2, num_iters=num_iters, reg=reg, init=init, grad=grad)
  if symmetric_norm:
    dvec = jax.lax.rsqrt(jnp.sum(k2, axis=-1))
    inv = dvec[..., :, None] * inv * dvec[..., None, :]
  kv = jnp.einsum("bntm,bnte->bnme", k1, v)
  out = jnp.einsum("bntm,bnme->bnte", k1, inv @ kv)
  return jnp.swapaxes(out, 1, 2).astype(query.dtype)


# ---------------------------------------------------------------------------
# Norm-aware (NaLaFormer) and LINA linear attention.
# ---------------------------------------------------------------------------


def _sign_split(x: jax.Array) -> jax.Array:
  return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)


def _safe_pow(x: jax.Array, p: jax.Array) -> jax.Array:
  """``x ** p`` for ``x >= 0`` with finite gradients at ``x = 0``."""
  pos = x > 0
  return jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, x, 1.0))), 0.0)


def nala_query_feature(
  q: Float[Array, "... h"], *, power_scale: float = 3.0, eps: float = 1e-6
) -> Float[Array, "... 2h"]:
  r"""NaLaFormer's norm-aware query map.

  .. math:: r = \|q\|, \quad p(r) = \lambda (0.5 + \tanh r), \quad
     \phi_q(q) = [(\mathrm{ReLU}(q)/r)^{p}; (\mathrm{ReLU}(-q)/r)^{p}]

  The direction ``q/r`` carries the angle; the norm enters as the exponent
  (a temperature): larger norms give spikier weights. ``r`` is clamped at
  ``eps``. Float32 output.
  """
  _checks.check_floating("nala_query_feature", "q", q)
  dtype = _compute_dtype(q)
  q = q.astype(dtype)
  r = jnp.maximum(jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True)), eps)
  p = power_scale * (0.5 + jnp.tanh(r))
  return _safe_pow(_sign_split(q / r), p)


def nala_key_feature(k: Float[Array, "... h"]) -> Float[Array, "... 2h"]:
  r"""NaLaFormer's key map :math:`[\mathrm{ReLU}(k^3); \mathrm{ReLU}(-k^3)]`.

  The sign split preserves the norm of ``k**3`` and makes
  :math:`\phi(q)\cdot\phi(k)` the sum of same-sign products (the "cosine
  inhibit"). Float32 output.
  """
  _checks.check_floating("nala_key_feature", "k", k)
  k = k.astype(_compute_dtype(k))
  return _sign_split(k * k * k)


def _rotate_every_two(x: jax.Array) -> jax.Array:
  x1, x2 = x[..., 0::2], x[..., 1::2]
  return jnp.stack([-x2, x1], axis=-1).reshape(x.shape)


def nala_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  *,
  power_scale: float = 3.0,
  eps: float = 1e-6,
  rope_sin_cos: tuple[jax.Array, jax.Array] | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""NaLaFormer norm-aware linear attention (non-causal, linear in length).

  .. math::
     z_i = \frac{1}{\phi_q(q_i)\cdot \overline{\phi_k(k)} + \epsilon}, \quad
     \mathrm{out}_i = z_i \, \tilde\phi_q(q_i)^T \Big(\frac1S \sum_j
     \tilde\phi_k(k_j) v_j^T\Big)

  with `nala_query_feature` and `nala_key_feature` (feature dim ``2H``).
  :math:`\tilde\phi` are the features after an optional rotate-every-two RoPE
  (``rope_sin_cos = (sin, cos)``, each broadcastable to ``(T, 2H)``; needs
  ``S == T``), applied in the numerator only, as in the official code; the
  denominator uses the un-rotated features. Without RoPE the implied weights
  are non-negative and rows sum to 1 up to ``eps``. Computed in float32.
  The LePE conv, output gate and LayerNorm of the block are the module's job.

  Unverified: v1 of the paper may use a ``[cos; sin]`` lift instead of the
  sign split; this follows the ICML-2026 code (``NALA.py``).

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    power_scale: :math:`\lambda` (code: 3; also the key's cube).
    eps: denominator and norm clamp epsilon.
    rope_sin_cos: optional ``(sin, cos)`` for the numerator's features.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or RoPE tables.
    TypeError: on non-floating inputs.

  References:
    Meng et al., *NaLaFormer: Norm-Aware Linear Attention for Transformer
    Models*, arXiv:2506.21137 (2025); ICML 2026 version *Norm x Direction:
    Restoring the Missing Query Norm in Vision Linear Attention*.
  """
  who = "nala_attention"
  d, q, k, v, _, _ = _prepare(who, query, key, value, None, None)
  dtype = _compute_dtype(q, k, v)
  k, v = _repeat_kv(d, k), _repeat_kv(d, v).astype(dtype)
  fq = nala_query_feature(q, power_scale=power_scale, eps=eps)
  fk = nala_key_feature(k)
  den = jnp.einsum("btnf,bnf->btn", fq, jnp.mean(fk, axis=1)) + eps
  if rope_sin_cos is not None:
    if d.q_len != d.kv_len:
      raise ValueError(
        f"{who}: rope_sin_cos needs q_len == kv_len, got {query.shape=} "
        f"and {key.shape=}"
      )
    sin, cos = (jnp.asarray(a, dtype) for a in rope_sin_cos)
    f = 2 * d.head_dim
    for name, a in (("sin", sin), ("cos", cos)):
      if a.ndim != 2 or a.shape[1] != f or a.shape[0] not in (1, d.q_len):
        raise ValueError(
          f"{who}: rope_sin_cos {name} must have shape ({d.q_len}, {f}), "
          f"got {a.shape}"
        )
    sin, cos = sin[None, :, None, :], cos[None, :, None, :]
    fq = fq * cos + _rotate_every_two(fq) * sin
    fk = fk * cos + _rotate_every_two(fk) * sin
  kv = jnp.einsum("bsnf,bsne->bnfe", fk, v) / d.kv_len
  num = jnp.einsum("btnf,bnfe->btne", fq, kv)
  return _finish(d, num / den[..., None], query.dtype)


_KERNELS = {
  "relu": lambda x: jax.nn.relu(x) + 1e-6,
  "identity": lambda x: x,
  "leaky_relu": jax.nn.leaky_relu,
  "exp": jnp.exp,
}


def _gate(who: str, name: str, g, d: _Dims, dtype) -> jax.Array | None:
  if g is None:
    return None
  g = jnp.asarray(g)
  _checks.check_floating(who, name, g)
  if g.shape == (d.kv_len, d.kv_heads):
    g = g[None]
  if g.shape not in (
    (d.batch, d.kv_len, d.kv_heads),
    (1, d.kv_len, d.kv_heads),
  ):
    raise ValueError(
      f"{who}: {name} must have shape (kv_len, kv_heads)=({d.kv_len}, "
      f"{d.kv_heads}) (static) or (batch, kv_len, kv_heads)=({d.batch}, "
      f"{d.kv_len}, {d.kv_heads}) (dynamic), got {name}.shape={g.shape}"
    )
  return g.astype(dtype)[..., None]


def lina_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  *,
  normalization: Literal["division", "subtraction"] = "division",
  kernel: Literal["relu", "identity", "leaky_relu", "exp"] = "relu",
  key_gate: Float[Array, "S K"] | None = None,
  value_gate: Float[Array, "S K"] | None = None,
  scale: float | None = None,
  eps: float = 1e-6,
) -> Float[Array, "B T N Hv"]:
  r"""LINA linear attention (non-causal), division or subtraction normalized.

  With :math:`\phi` = ``kernel`` (default :math:`\mathrm{ReLU}(x) + 10^{-6}`)
  and gated keys/values :math:`\kappa_j = g^k_j \phi(k_j)`,
  :math:`\nu_j = g^v_j v_j`:

  * division (LINA's default):
    :math:`\mathrm{out}_i = \phi(q_i)^T (\frac1S\sum_j \kappa_j \nu_j^T) /
    (\phi(q_i)\cdot\bar\kappa + \epsilon)`;
  * subtraction (the InLine-style ablation, :math:`s` = ``scale``, default
    ``H**-0.5``): :math:`\mathrm{out}_i = \frac{s}{S}\phi(q_i)^T \sum_j
    \kappa_j \nu_j^T + (1 - s\,\phi(q_i)\cdot\bar\kappa)\,\bar\nu`; its
    implied weights sum to exactly 1 per row and may be negative.

  The KV gate (``key_gate``/``value_gate``) is LINA's data-independent
  per-token, per-head scalar (shape ``(S, K)``, init 1 in the module) or a
  dynamic ``(B, S, K)`` gate. A constant key gate cancels in the division
  form. LINA's depthwise conv on the block input is `lina_depthwise_conv`.
  Computed in float32 (the paper notes fp32 is needed to avoid NaN loss).

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    normalization: ``"division"`` or ``"subtraction"``.
    kernel: feature map ``"relu"``, ``"identity"``, ``"leaky_relu"`` or
      ``"exp"``.
    key_gate: optional key gate ``(S, K)`` or ``(B, S, K)``.
    value_gate: optional value gate, same shapes.
    scale: subtraction-form scale ``s``.
    eps: division-form denominator epsilon.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or unknown options.
    TypeError: on non-floating inputs.

  References:
    Wang et al., *LINA: Linear Autoregressive Image Generative Models with
    Continuous Tokens*, arXiv:2601.22630 (2026); Han et al., *Bridging the
    Divide: Reconsidering Softmax and Linear Attention* (InLine),
    arXiv:2412.06590 (2024).
  """
  who = "lina_attention"
  _checks.check_choice(
    who, "normalization", normalization, ("division", "subtraction")
  )
  _checks.check_choice(who, "kernel", kernel, tuple(_KERNELS))
  d, q, k, v, _, _ = _prepare(who, query, key, value, None, None)
  dtype = _compute_dtype(q, k, v)
  gk = _gate(who, "key_gate", key_gate, d, dtype)
  gv = _gate(who, "value_gate", value_gate, d, dtype)
  phi = _KERNELS[kernel]
  fq = phi(q.astype(dtype))
  fk = phi(k.astype(dtype))
  vv = v.astype(dtype)
  if gk is not None:
    fk = fk * gk
  if gv is not None:
    vv = vv * gv
  fk, vv = _repeat_kv(d, fk), _repeat_kv(d, vv)
  kv = jnp.einsum("bsnf,bsne->bnfe", fk, vv) / d.kv_len
  kmean = jnp.mean(fk, axis=1)  # B N F
  num = jnp.einsum("btnf,bnfe->btne", fq, kv)
  qk = jnp.einsum("btnf,bnf->btn", fq, kmean)[..., None]
  if normalization == "division":
    out = num / (qk + eps)
  else:
    s = d.head_dim**-0.5 if scale is None else scale
    out = s * num + (1.0 - s * qk) * jnp.mean(vv, axis=1)[:, None]
  return _finish(d, out, query.dtype)


def lina_depthwise_conv(
  x: Float[Array, "B L C"],
  kernel: Float[Array, "k k C"],
  bias: Float[Array, " C"] | None = None,
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
) -> Float[Array, "B L C"]:
  """LINA's local branch: a depthwise ``k x k`` conv over the image tokens.

  Tokens ``x[:, num_prefix:]`` are reshaped to ``grid_shape`` (row-major),
  convolved per channel with zero ``SAME`` padding, and flattened back; the
  ``num_prefix`` conditioning tokens get 0. LINA adds this (computed on the
  block input, 5x5) to the attention output before the out-projection.

  Raises:
    ValueError: if the token count does not match ``grid_shape`` or the
      kernel/bias shapes do not match the channels.
  """
  who = "lina_depthwise_conv"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, expected=3)
  b, length, c = x.shape
  gh, gw = grid_shape
  if length - num_prefix != gh * gw:
    raise ValueError(
      f"{who}: x must have num_prefix + prod(grid_shape)="
      f"{num_prefix + gh * gw} tokens, got {x.shape=}"
    )
  if (
    kernel.ndim != 3
    or kernel.shape[0] != kernel.shape[1]
    or (kernel.shape[2] != c)
  ):
    raise ValueError(
      f"{who}: kernel must have shape (k, k, {c}), got {kernel.shape=}"
    )
  dtype = _compute_dtype(x)
  img = x[:, num_prefix:].astype(dtype).reshape(b, gh, gw, c)
  rhs = kernel.astype(dtype).reshape(kernel.shape[0], kernel.shape[1], 1, c)
  y = jax.lax.conv_general_dilated(
    img,
    rhs,
    (1, 1),
    "SAME",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
    feature_group_count=c,
  )
  if bias is not None:
    _checks.check_shape(who, "bias", bias, (c,), "one per channel")
    y = y + bias.astype(dtype).reshape(1, 1, 1, c)
  y = y.reshape(b, gh * gw, c)
  pad = jnp.zeros((b, num_prefix, c), dtype)
  return jnp.concatenate([pad, y], axis=1).astype(x.dtype)


# ---------------------------------------------------------------------------
# Causal linear attention, chunked (O(T) memory).
# ---------------------------------------------------------------------------

_FEATURE_MAPS = {
  "elu_plus_one": lambda x: jax.nn.elu(x) + 1.0,
  "relu": lambda x: jax.nn.relu(x) + 1e-6,
  "identity": lambda x: x,
}


def causal_linear_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B T K H"],
  value: Float[Array, "B T K Hv"],
  *,
  feature_map: Literal["elu_plus_one", "relu", "identity"] = "elu_plus_one",
  normalize: bool = True,
  eps: float = 1e-6,
  chunk_size: int = 64,
  implementation: Literal["chunked", "quadratic"] = "chunked",
) -> Float[Array, "B T N Hv"]:
  r"""Causal linear attention, computed chunk by chunk with O(T) memory.

  .. math:: \mathrm{out}_i = \frac{\sum_{j \le i} (\phi(q_i)\cdot\phi(k_j))
     v_j}{\sum_{j \le i} \phi(q_i)\cdot\phi(k_j) + \epsilon}

  (no denominator when ``normalize=False``). ``"chunked"`` scans over chunks
  of ``chunk_size`` queries: inside a chunk it uses the masked quadratic form,
  across chunks the running state :math:`\sum_j \phi(k_j) v_j^T` and
  :math:`\sum_j \phi(k_j)`; memory is :math:`O(T\,H + C^2)` per head instead
  of :math:`O(T^2)`. ``"quadratic"`` materializes the ``(T, T)`` weights and
  is the reference. Statistics in float32.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, T, K, H)`` (self-attention: same length as ``query``).
    value: ``(B, T, K, Hv)``.
    feature_map: :math:`\phi`: ``"elu_plus_one"`` (Katharopoulos et al.),
      ``"relu"`` (+1e-6) or ``"identity"``.
    normalize: divide by the running normalizer.
    eps: denominator epsilon.
    chunk_size: queries per chunk (the sequence is zero-padded to a
      multiple; padded keys are excluded).
    implementation: ``"chunked"`` or ``"quadratic"``.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or options.
    TypeError: on non-floating inputs.

  References:
    Katharopoulos et al., *Transformers are RNNs: Fast Autoregressive
    Transformers with Linear Attention*, arXiv:2006.16236 (2020);
    Hua et al., *Transformer Quality in Linear Time* (chunked form),
    arXiv:2202.10447 (2022).
  """
  who = "causal_linear_attention"
  _checks.check_choice(who, "feature_map", feature_map, tuple(_FEATURE_MAPS))
  _checks.check_choice(
    who, "implementation", implementation, ("chunked", "quadratic")
  )
  _checks.check_positive_int(who, "chunk_size", chunk_size)
  d, q, k, v, _, _ = _prepare(who, query, key, value, None, None)
  if d.q_len != d.kv_len:
    raise ValueError(
      f"{who}: key must have the query's length ({d.q_len}) for causal "
      f"self-attention, got {key.shape=}"
    )
  dtype = _compute_dtype(q, k, v)
  phi = _FEATURE_MAPS[feature_map]
  fq = phi(q.astype(dtype))
  fk = _repeat_kv(d, phi(k.astype(dtype)))
  vv = _repeat_kv(d, v.astype(dtype))
  t = d.q_len
  if implementation == "quadratic":
    w = jnp.einsum("btnf,bsnf->bnts", fq, fk)
    w = jnp.where(jnp.tril(jnp.ones((t, t), jnp.bool_)), w, 0.0)
    out = jnp.einsum("bnts,bsne->btne", w, vv)
    if normalize:
      out = out / (jnp.transpose(jnp.sum(w, -1), (0, 2, 1))[..., None] + eps)
    return _finish(d, out, query.dtype)
  c = min(chunk_size, t)
  nc = -(-t // c)
  pad = nc * c - t

  def chunks(x):
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return jnp.moveaxis(x.reshape(d.batch, nc, c, *x.shape[2:]), 1, 0)

  valid = (jnp.arange(nc * c) < t).astype(dtype).reshape(nc, c, 1, 1)
  fqc, fkc, vc = chunks(fq), chunks(fk), chunks(vv)
  fkc = fkc * valid[:, None]
  tri = jnp.tril(jnp.ones((c, c), jnp.bool_))

  def step(carry, xs):
    state, norm = carry  # B N F E, B N F
    fq_i, fk_i, v_i = xs
    w = jnp.where(tri, jnp.einsum("btnf,bsnf->bnts", fq_i, fk_i), 0.0)
    num = jnp.einsum("bnts,bsne->btne", w, v_i)
    num = num + jnp.einsum("btnf,bnfe->btne", fq_i, state)
    den = jnp.transpose(jnp.sum(w, -1), (0, 2, 1))
    den = den + jnp.einsum("btnf,bnf->btn", fq_i, norm)
    state = state + jnp.einsum("bsnf,bsne->bnfe", fk_i, v_i)
    norm = norm + jnp.sum(jnp.swapaxes(fk_i, 1, 2), axis=2)
    out = num / (den[..., None] + eps) if normalize else num
    return (state, norm), out

  f = fq.shape[-1]
  init = (
    jnp.zeros((d.batch, d.heads, f, d.value_dim), dtype),
    jnp.zeros((d.batch, d.heads, f), dtype),
  )
  _, outs = jax.lax.scan(step, init, (fqc, fkc, vc))
  out = jnp.moveaxis(outs, 0, 1).reshape(d.batch, nc * c, d.heads, d.value_dim)[
    :, :t
  ]
  return _finish(d, out, query.dtype)


# ---------------------------------------------------------------------------
# MXFP4 fake quantization and MXAttention.
# ---------------------------------------------------------------------------

E2M1_MAX: float = 6.0
UOS_QMAX: float = 7.25


def mxfp4_scale_exponent(
  amax: Float[Array, "..."],
  *,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = UOS_QMAX,
) -> jax.Array:
  r"""The E8M0 block exponent ``e`` (scale ``2**e``) for block max ``amax``.

  * ``"ocp_floor"`` (OCP MX v1.0): :math:`e = \lfloor\log_2 \mathrm{amax}
    \rfloor - 2`, so ``amax / 2**e`` lies in ``[4, 8)`` and values above 6
    saturate.
  * ``"qmax"`` (UOS with ``qmax = 7.25``): the smallest ``e`` with
    ``amax <= qmax * 2**e``, i.e. :math:`\lceil\log_2(\mathrm{amax}/Q_{max})
    \rceil`, so ``amax / 2**e`` lies in ``(qmax/2, qmax]``. ``qmax = 6``
    never clips.

  Exponents are exact (from `jnp.frexp` and exact comparisons, never by
  casting to ``float8_e8m0fnu``, which rounds), clamped to ``[-127, 127]``;
  ``amax = 0`` gives ``-127``.

  Returns:
    int32 exponents of ``amax.shape``.

  Raises:
    ValueError: on an unknown ``scale_rule`` or ``qmax <= 0``.
  """
  who = "mxfp4_scale_exponent"
  _checks.check_choice(who, "scale_rule", scale_rule, ("qmax", "ocp_floor"))
  if not qmax > 0:
    raise ValueError(f"{who}: qmax must be > 0, got {qmax=}")
  amax = jnp.asarray(amax, jnp.float32)
  pos = amax > 0
  safe = jnp.where(pos, amax, 1.0)
  if scale_rule == "ocp_floor":
    _, p = jnp.frexp(safe)
    e = p - 3
  else:
    _, p = jnp.frexp(safe / qmax)
    e = p  # amax/qmax < 2**p, so e = p or p - 1 (or p - 2 after rounding).
    for _ in range(2):
      e = jnp.where(safe <= jnp.ldexp(jnp.float32(qmax), e - 1), e - 1, e)
    e = jnp.where(safe > jnp.ldexp(jnp.float32(qmax), e), e + 1, e)
  e = jnp.where(pos, e, -127)
  return jnp.clip(e, -127, 127).astype(jnp.int32)


def mxfp4_quantize(
  x: Float[Array, "..."],
  *,
  axis: int = -1,
  block_size: int = 32,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = UOS_QMAX,
  straight_through: bool = True,
) -> Float[Array, "..."]:
  r"""MXFP4 fake quantization: E2M1 elements with a shared E8M0 block scale.

  .. math:: \hat x = 2^{e} \cdot \mathrm{E2M1}(x / 2^{e})

  over blocks of ``block_size`` consecutive elements along ``axis`` (the
  matmul's contraction axis), with ``e`` from `mxfp4_scale_exponent` on the
  block's max ``|x|``. E2M1 rounds to nearest, ties to even, and saturates
  at ±6 (a cast through ``jnp.float4_e2m1fn``, identical to
  ``ml_dtypes.float4_e2m1fn``). A ragged last block is zero-padded (zeros do
  not change ``amax``). With ``straight_through`` the gradient is the
  identity (:math:`x + \mathrm{sg}(\hat x - x)`); the exponent gets none.

  Args:
    x: any shape, floating.
    axis: the blocked axis.
    block_size: elements per scale (MX: 32).
    scale_rule: ``"qmax"`` (UOS, default) or ``"ocp_floor"``.
    qmax: UOS boundary (7.25 for E2M1).
    straight_through: use the straight-through estimator.

  Returns:
    ``x.shape`` in ``x.dtype``.

  Raises:
    ValueError: on a bad axis, block size or option.
    TypeError: if ``x`` is not floating.

  References:
    OCP, *Microscaling Formats (MX) v1.0 Specification* (2023); Yu et al.,
    *MXAttention: Data-Free Optimal Scaling and Pre-Normalization
    Quantization for MXFP4 Attention*, arXiv:2607.24377 (2026).
  """
  who = "mxfp4_quantize"
  _checks.check_floating(who, "x", x)
  _checks.check_positive_int(who, "block_size", block_size)
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  xf = jnp.moveaxis(x.astype(jnp.float32), ax, -1)
  n = xf.shape[-1]
  nb = -(-n // block_size)
  pad = nb * block_size - n
  xp = jnp.pad(xf, [(0, 0)] * (xf.ndim - 1) + [(0, pad)])
  blocks = xp.reshape(*xf.shape[:-1], nb, block_size)
  amax = jax.lax.stop_gradient(jnp.max(jnp.abs(blocks), axis=-1))
  e = mxfp4_scale_exponent(amax, scale_rule=scale_rule, qmax=qmax)[..., None]
  scaled = jnp.ldexp(jax.lax.stop_gradient(blocks), -e)
  q = scaled.astype(jnp.float4_e2m1fn).astype(jnp.float32)
  deq = jnp.ldexp(q, e).reshape(xp.shape)[..., :n]
  deq = jnp.moveaxis(deq, -1, ax)
  xc = x.astype(jnp.float32)
  if straight_through:
    deq = xc + jax.lax.stop_gradient(deq - xc)
  return deq.astype(x.dtype)


def hadamard_rotation(
  dim: int,
  *,
  signs: Literal["random_sign", "plain"] = "random_sign",
  seed: int = 1234,
) -> Float[Array, "dim dim"]:
  r"""The orthogonal rotation :math:`R = \mathrm{diag}(s) H_d / \sqrt d`.

  :math:`H_d` is the Sylvester Walsh-Hadamard matrix; ``s`` is all ones
  (``"plain"``) or random ±1 drawn from ``jax.random.key(seed)``. MXAttention
  applies the same ``R`` to queries and keys, which leaves :math:`QK^T`
  unchanged and spreads outliers across a block. Deviation: the official code
  draws the signs with torch's generator (seed 1234), so the sign pattern
  differs; any fixed pattern is orthogonal.

  Raises:
    ValueError: if ``dim`` is not a power of two, or on a bad option.
  """
  who = "hadamard_rotation"
  _checks.check_positive_int(who, "dim", dim)
  _checks.check_choice(who, "signs", signs, ("random_sign", "plain"))
  if dim & (dim - 1):
    raise ValueError(f"{who}: dim must be a power of two, got {dim=}")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < dim:  # Sylvester construction, static in dim.
    h = np.block([[h, h], [h, -h]])
  h = jnp.asarray(h)
  h = h / math.sqrt(dim)
  if signs == "plain":
    return h
  s = jax.random.rademacher(jax.random.key(seed), (dim,), jnp.float32)
  return s[:, None] * h


def mxfp4_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  quantize_qkv: bool = True,
  p_quant: Literal["pnq", "direct", "none"] = "pnq",
  l_source: Literal["quantized", "float"] = "quantized",
  hadamard: Literal["random_sign", "plain"] | None = "random_sign",
  hadamard_seed: int = 1234,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = UOS_QMAX,
  block_size: int = 32,
) -> Float[Array, "B T N Hv"]:
  r"""MXAttention: softmax attention with MXFP4 fake quantization.

  1. Rotate (``hadamard``): :math:`Q \leftarrow QR`, :math:`K \leftarrow KR`.
  2. Quantize (``quantize_qkv``) Q and K in blocks along the head dim and V
     along the key axis (`mxfp4_quantize`, UOS scale with ``qmax = 7.25``).
  3. :math:`S = \hat Q \hat K^T s + b` (masked), then by ``p_quant``:

     * ``"pnq"`` (pre-normalization quantization, the paper's method):
       :math:`\tilde P = \exp(S - m_i)` with the row max :math:`m_i`,
       :math:`\hat P = Q_4(\tilde P)` in blocks along keys, and
       :math:`O = \hat P \hat V / \ell` with
       :math:`\ell = \mathrm{rowsum}(\hat P)` (``l_source="quantized"``, so
       the effective weights sum to exactly 1) or
       :math:`\mathrm{rowsum}(\tilde P)` (``"float"``, the mismatch
       ablation);
     * ``"direct"``: :math:`O = Q_4(\mathrm{softmax}(S))\,\hat V`;
     * ``"none"``: :math:`O = \mathrm{softmax}(S)\,\hat V`.

  This is the materialized one-tile reference: a tiled kernel agrees only
  approximately (the quantized tiles depend on the running max). All
  quantizers are straight-through, so gradients flow through the weights the
  forward actually used. Fully masked rows give 0 under ``"pnq"`` and the mean
  of V otherwise (softmax convention). Deviation: MindIE-SD pads sequences to
  a multiple of 512 with keys that join the softmax; jaxnorm masks instead.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.
    quantize_qkv: fake-quantize Q, K and V.
    p_quant: ``"pnq"``, ``"direct"`` or ``"none"``.
    l_source: PNQ row-sum source, ``"quantized"`` or ``"float"``.
    hadamard: ``"random_sign"``, ``"plain"`` or None (needs a power-of-two
      ``H``).
    hadamard_seed: seed of the random signs.
    scale_rule: ``"qmax"`` or ``"ocp_floor"``.
    qmax: UOS boundary.
    block_size: MX block size.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or options.
    TypeError: on non-floating inputs or a non-boolean mask.

  References:
    Yu et al., arXiv:2607.24377 (2026); OCP MX v1.0 (2023).
  """
  who = "mxfp4_attention"
  _checks.check_choice(who, "p_quant", p_quant, ("pnq", "direct", "none"))
  _checks.check_choice(who, "l_source", l_source, ("quantized", "float"))
  _checks.check_choice(
    who, "hadamard", hadamard, ("random_sign", "plain", None)
  )
  d, q, k, v, bias, mask = _prepare(who, query, key, value, bias, mask)
  dtype = jnp.float32
  q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
  if hadamard is not None:
    r = hadamard_rotation(d.head_dim, signs=hadamard, seed=hadamard_seed)
    q, k = q @ r, k @ r
  quant = functools.partial(
    mxfp4_quantize, block_size=block_size, scale_rule=scale_rule, qmax=qmax
  )
  if quantize_qkv:
    q, k, v = quant(q, axis=-1), quant(k, axis=-1), quant(v, axis=1)
  allowed = _allowed(d, mask, is_causal)
  logits = _masked_logits(
    d, q, k, bias, allowed, _default_scale(d, scale), dtype
  )
  if p_quant == "pnq":
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    p = jnp.exp(logits - m)
    if allowed is not None:
      p = jnp.where(allowed, p, 0.0)
    ph = quant(p, axis=-1)
    src = ph if l_source == "quantized" else p
    den = jnp.sum(src, axis=-1, keepdims=True)
    w = ph / jnp.where(den > 0, den, 1.0)
  else:
    w = jax.nn.softmax(logits, axis=-1)
    if p_quant == "direct":
      w = quant(w, axis=-1)
  return _finish(d, _apply_weights(d, w, v, dtype), query.dtype)


# ---------------------------------------------------------------------------
# Sinkhorn (entropic optimal transport) attention weights.
# ---------------------------------------------------------------------------


def _safe_logsumexp(x: jax.Array, axis: int) -> jax.Array:
  """Logsumexp that returns -inf (with zero gradients) on all -inf slices."""
  m = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
  m = jnp.where(jnp.isfinite(m), m, 0.0)
  s = jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True)
  out = jnp.log(jnp.where(s > 0, s, 1.0)) + m
  return jnp.where(s > 0, out, -jnp.inf)


def sinkhorn_weights(
  logits: Float[Array, "... T S"],
  mask: Bool[Array, "... T S"] | None = None,
  *,
  num_iters: int = 20,
  row_mass: float = 1.0,
  col_mass: float | None = None,
) -> Float[Array, "... T S"]:
  r"""Attention weights as an entropic optimal-transport plan (Sinkhorn).

  The Gibbs kernel :math:`G = \exp(\mathrm{logits})` (masked entries 0) is
  scaled to :math:`\mathrm{diag}(e^f)\,G\,\mathrm{diag}(e^g)` by alternating
  row steps :math:`f = \log r - \mathrm{LSE}_j(L + g)` and column steps
  :math:`g = \log c - \mathrm{LSE}_i(L + f)` in the log domain, ``num_iters``
  times, then one final row step so each query's weights sum to
  ``row_mass``. ``num_iters = 0`` is exactly softmax (row anchoring). The
  default ``col_mass = T/S * row_mass`` balances total mass, so a square
  matrix becomes doubly stochastic. Fully masked rows give zeros. Unrolled
  autodiff; float32.

  Unverified: this is jaxnorm's reading of the "plan-based anchors (entropic
  OT / Sinkhorn)" regime named in the Geometric Attention abstract; the
  paper's parameterization (marginals, iterations, final row step) was not
  readable.

  Args:
    logits: ``(..., T, S)`` (already scaled, e.g. by ``1/sqrt(H)``).
    mask: optional boolean, broadcastable to ``logits``; True allowed.
    num_iters: row/column iterations before the final row step.
    row_mass: each row's mass ``r``.
    col_mass: each column's mass ``c``; default ``T/S * r``.

  Returns:
    ``(..., T, S)`` in ``promote(logits.dtype, float32)``.

  Raises:
    ValueError: if ``logits`` has rank < 2, ``mask`` does not broadcast, or
      a mass is not positive.
    TypeError: if ``logits`` is not floating or ``mask`` not boolean.

  References:
    Freytes, *Geometric Attention: A Regime-Explicit Operator Semantics for
    Transformer Attention*, arXiv:2601.11618 (2026); Cuturi, *Sinkhorn
    Distances*, arXiv:1306.0895 (2013).
  """
  who = "sinkhorn_weights"
  _checks.check_floating(who, "logits", logits)
  _checks.check_ndim(who, "logits", logits, minimum=2)
  _checks.check_nonnegative(who, "num_iters", num_iters)
  t, s = logits.shape[-2:]
  if col_mass is None:
    col_mass = row_mass * t / s
  if not (row_mass > 0 and col_mass > 0):
    raise ValueError(
      f"{who}: row_mass and col_mass must be > 0, got {row_mass=}, {col_mass=}"
    )
  dtype = _compute_dtype(logits)
  lg = logits.astype(dtype)
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise TypeError(f"{who}: mask must be boolean, got {mask.dtype=}")
    if mask.ndim != lg.ndim or any(
      a not in (1, e) for a, e in zip(mask.shape, lg.shape)
    ):
      raise ValueError(
        f"{who}: mask must be broadcastable to logits.shape={lg.shape} (same "
        f"rank, each axis 1 or equal), got {mask.shape=}"
      )
    lg = jnp.where(mask, lg, -jnp.inf)
  log_r, log_c = math.log(row_mass), math.log(col_mass)

  def row_step(g):
    f = log_r - _safe_logsumexp(lg + g, axis=-1)
    return jnp.where(jnp.isfinite(f), f, 0.0)

  def col_step(f):
    g = log_c - _safe_logsumexp(lg + f, axis=-2)
    return jnp.where(jnp.isfinite(g), g, 0.0)

  def body(_, g):
    return col_step(row_step(g))

  g0 = jnp.zeros(lg.shape[:-2] + (1, s), dtype)
  g = jax.lax.fori_loop(0, int(num_iters), body, g0)
  f = row_step(g)
  return jnp.exp(lg + f + g)


def sinkhorn_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  num_iters: int = 20,
) -> Float[Array, "B T N Hv"]:
  r"""Attention with Sinkhorn (entropic OT plan) weights, `sinkhorn_weights`.

  Logits are :math:`q k^T s + b` (default ``s = 1/sqrt(H)``); the weights are
  the plan with unit row mass and ``T/S`` column mass, ending with a row
  step, so ``num_iters = 0`` equals `dot_product_attention` (except that a
  fully masked row gives 0). Needs the full ``(T, S)`` matrix: not
  flash-compatible; cost :math:`O(\mathrm{iters}\cdot T S)` per head.

  Raises:
    ValueError: on mismatched shapes.
    TypeError: on non-floating inputs or a non-boolean mask.

  References:
    Freytes, arXiv:2601.11618 (2026) (unverified reading, see
    `sinkhorn_weights`).
  """
  who = "sinkhorn_attention"
  d, q, k, v, bias, mask = _prepare(who, query, key, value, bias, mask)
  dtype = _compute_dtype(q, k, v)
  allowed = _allowed(d, mask, is_causal)
  logits = _raw_logits(d, q, k, _default_scale(d, scale), dtype)
  if bias is not None:
    logits = logits + bias.astype(dtype)
  if allowed is not None:
    allowed = jnp.broadcast_to(allowed, allowed.shape[:2] + (d.q_len, d.kv_len))
  w = sinkhorn_weights(logits, allowed, num_iters=num_iters)
  return _finish(d, _apply_weights(d, w, v, dtype), query.dtype)
