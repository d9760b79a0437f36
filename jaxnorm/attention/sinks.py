"""Attention sinks (off-by-one, learnable per-head sink) and gated output."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope
from jaxnorm.attention import _core


@_scope.scoped
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
    ValueError: if ``axis`` is out of range (or ``logits`` a scalar).
    TypeError: if ``logits`` is not floating.

  Examples:
    >>> print(np.asarray(attention.softmax_off_by_one(jnp.zeros(2))).round(4))
    [0.3333 0.3333]
    >>> w = attention.softmax_off_by_one(jnp.zeros(2), sink=jnp.log(2.0))
    >>> print(np.asarray(w))  # 1 / (2 + 2)
    [0.25 0.25]

  References:
    E. Miller, *Attention Is Off By One* (2023, blog); OpenAI, *gpt-oss-120b
    & gpt-oss-20b Model Card*, arXiv:2508.10925 (2025).
  """
  _checks.check_floating("softmax_off_by_one", "logits", logits)
  (axis,) = _checks.normalize_axes("softmax_off_by_one", axis, jnp.ndim(logits))
  dtype = _numerics.compute_dtype(logits)
  x = logits.astype(dtype)
  s = jnp.asarray(sink, dtype)
  s = jnp.broadcast_to(s, jnp.max(x, axis=axis, keepdims=True).shape)
  m = jnp.maximum(
    jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True)),
    jax.lax.stop_gradient(s),
  )
  e = jnp.exp(x - m)
  return e / (jnp.exp(s - m) + jnp.sum(e, axis=axis, keepdims=True))


@_scope.scoped
@_core.refuses_flax_kwargs
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
  implementation: _dispatch.Implementation | None = None,
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
    implementation: ``"xla"`` (reference), ``"pallas"`` (the flash kernel
      `pallas_kernels.attention.sink_attention_pallas`, which folds the sink
      into the online softmax; no additive ``bias``) or None (the kernel on
      GPU/TPU when it covers the case, else the reference).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, including ``sinks`` not ``(N,)``, or
      an unknown ``implementation``.
    TypeError: on non-floating inputs or a non-boolean mask.
    NotImplementedError: for ``implementation="pallas"`` on a case the
      kernel does not cover.

  Examples:
    >>> q, k = jnp.zeros((1, 1, 1, 2)), jnp.zeros((1, 2, 1, 2))
    >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
    >>> out = attention.sink_attention(q, k, v)  # weights 1 / (1 + 2)
    >>> print(np.asarray(out[0, 0, 0]).round(4))
    [1.3333 0.6667]

  References:
    Qiu et al., *A Unified View of Attention and Residual Sinks:
    Outlier-Driven Rescaling*, arXiv:2601.22966 (2026); Xiao et al.,
    *Efficient Streaming Language Models with Attention Sinks*,
    arXiv:2309.17453 (2023); Miller, *Attention Is Off By One* (2023).
  """
  who = "sink_attention"
  d, q, k, v, bias4, mask4 = _core.prepare(who, query, key, value, bias, mask)
  if sinks is not None:
    _checks.check_shape(who, "sinks", sinks, (d.heads,), "one per query head")

  def reference():
    dtype = _numerics.compute_dtype(q, k, v)
    if sinks is None:
      s = jnp.zeros((1, 1, 1, 1), dtype)
    else:
      s = jnp.asarray(sinks).astype(dtype).reshape(1, d.heads, 1, 1)
    allowed = _core.allowed_mask(d, mask4, is_causal)
    logits = _core.masked_logits(
      d, q, k, bias4, allowed, _core.default_scale(d, scale), dtype
    )
    w = softmax_off_by_one(logits, sink=s)
    if allowed is not None:
      w = jnp.where(allowed, w, jnp.zeros((), dtype))
    return _core.finish(d, _core.apply_weights(d, w, v, dtype), query.dtype)

  return _dispatch.dispatch(
    who,
    implementation,
    "sink_attention_pallas",
    lambda kernel: kernel(
      query,
      key,
      value,
      bias,
      mask,
      sinks=sinks,
      scale=scale,
      is_causal=is_causal,
    ),
    reference,
    arrays=(query,),
  )


@_scope.scoped
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

  Examples:
    >>> out = jnp.array([2.0, 4.0]).reshape(1, 1, 1, 2)
    >>> y = attention.gated_attention_output(out, jnp.zeros((1, 1, 1, 1)))
    >>> print(np.asarray(y[0, 0, 0]))  # head-wise gate sigmoid(0)
    [1. 2.]

  References:
    Qiu et al., *Gated Attention for Large Language Models: Non-linearity,
    Sparsity, and Attention-Sink-Free*, arXiv:2505.06708 (2025); Qiu et al.,
    arXiv:2601.22966 (2026).
  """
  who = "gated_attention_output"
  _checks.check_floating(who, "attention_out", attention_out)
  attention_out = jnp.asarray(attention_out)
  _checks.check_ndim(who, "attention_out", attention_out, minimum=1)
  _checks.check_floating(who, "gate_logits", gate_logits)
  shape = attention_out.shape
  if gate_logits.shape not in (shape, shape[:-1] + (1,)):
    raise ValueError(
      f"{who}: gate_logits must have shape {shape} (elementwise) or "
      f"{shape[:-1] + (1,)} (head-wise), got {gate_logits.shape=}"
    )
  dtype = _numerics.compute_dtype(attention_out, gate_logits)
  gate = jax.nn.sigmoid(gate_logits.astype(dtype))
  return (attention_out.astype(dtype) * gate).astype(attention_out.dtype)
