"""Softmax scaled dot-product attention (`jax.nn` conventions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from jaxnorm import _dispatch, _numerics, _scope
from jaxnorm.attention import _core

Window = _core.Window


def _check_soft_cap(who: str, logits_soft_cap: float | None) -> None:
  if logits_soft_cap is not None and not logits_soft_cap > 0:
    raise ValueError(
      f"{who}: logits_soft_cap must be None or > 0, got {logits_soft_cap=}"
    )


def _softmax_weights(
  d: _core.Dims,
  query: jax.Array,
  key: jax.Array,
  bias: jax.Array | None,
  allowed: jax.Array | None,
  scale: float | None,
  logits_soft_cap: float | None,
  dtype,
) -> jax.Array:
  """``softmax(cap(q k^T s) + b)`` over the allowed keys, (B, N, T, S)."""
  logits = _core.raw_logits(d, query, key, _core.default_scale(d, scale), dtype)
  if logits_soft_cap is not None:
    cap = jnp.asarray(logits_soft_cap, dtype)
    logits = cap * jnp.tanh(logits / cap)
  if bias is not None:
    logits = logits + bias.astype(dtype)
  if allowed is not None:
    neg = jnp.asarray(_core.large_negative(), dtype)
    logits = jnp.where(allowed, logits, neg)
  return jax.nn.softmax(logits, axis=-1)


@_scope.scoped
def attention_weights(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  logits_soft_cap: float | None = None,
  local_window_size: Window = None,
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
    logits_soft_cap: see `dot_product_attention`.
    local_window_size: see `dot_product_attention`.

  Returns:
    Weights ``(B, N, T, S)`` (``(N, T, S)`` unbatched), rows summing to 1.

  Raises:
    ValueError: on mismatched shapes (naming the argument) or a bad
      ``logits_soft_cap`` / ``local_window_size``.
    TypeError: on non-floating q/k/bias or a non-boolean mask.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 2))
    >>> w = attention.attention_weights(q, k, is_causal=True)  # (B, N, T, S)
    >>> print(np.asarray(w[0, 0]))
    [[1.  0. ]
     [0.5 0.5]]
  """
  who = "attention_weights"
  d, query, key, _, bias, mask = _core.prepare(
    who, query, key, None, bias, mask
  )
  _check_soft_cap(who, logits_soft_cap)
  window = _core.window(who, local_window_size)
  dtype = _numerics.compute_dtype(query, key)
  allowed = _core.allowed_mask(d, mask, is_causal, window)
  w = _softmax_weights(
    d, query, key, bias, allowed, scale, logits_soft_cap, dtype
  )
  return w[0] if d.unbatched else w


@_scope.scoped
@_core.refuses_flax_kwargs
def dot_product_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  logits_soft_cap: float | None = None,
  local_window_size: Window = None,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""Scaled dot-product attention with float32 softmax statistics.

  .. math:: \mathrm{out} = \mathrm{softmax}(c \tanh(q k^T s / c) + b
     + \mathrm{mask}) \, v

  Follows `jax.nn.dot_product_attention` (the XLA implementation): same
  layouts, boolean masks (True attends), additive ``bias``, ``is_causal``,
  ``local_window_size``, grouped-query and multi-query heads, default
  ``s = 1/sqrt(H)``. A fully masked row returns the mean of ``value`` over
  keys, as in JAX. Logits and softmax are computed in float32 even for
  bfloat16 inputs; the output has ``query.dtype``. Unlike JAX, ``value`` may
  have its own head dim ``Hv``.

  Gemma 2/3 options (tokamax / `jax.nn` names):

  * ``logits_soft_cap = c`` caps the scaled logits smoothly,
    :math:`c \tanh(q k^T s / c)`, before ``bias`` and the mask (Gemma 2:
    ``attn_logits_soft_cap = 50``); None disables it.
  * ``local_window_size = (left, right)`` (an int ``w`` means ``(w, w)``)
    lets query ``i`` see keys ``i - left <= j <= i + right``, combined with
    ``mask`` and ``is_causal`` (`jax.nn`'s rule). Gemma's sliding window
    ``W`` (keys with ``|i - j| < W``) is ``local_window_size=(W - 1, 0)``
    with ``is_causal=True``.

  ``implementation`` picks the flash kernel
  (`pallas_kernels.attention.dot_product_attention_pallas`, ``"pallas"``),
  the reference (``"xla"``) or, for ``None``, the kernel on GPU/TPU when it
  covers the case and the reference otherwise. The kernel has no additive
  ``bias`` and no ``logits_soft_cap`` (``"pallas"`` raises
  `NotImplementedError`, ``None`` falls back); a local window runs in the
  kernel as a boolean mask.

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)`` or ``(S, K, H)``, with ``N % K == 0``.
    value: ``(B, S, K, Hv)`` or ``(S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask (query ``i`` sees ``j <= i``).
    logits_soft_cap: the cap ``c > 0`` or None.
    local_window_size: ``(left, right)``, an int, or None.
    implementation: ``"xla"``, ``"pallas"`` or None (best available).

  Returns:
    ``(B, T, N, Hv)`` (or ``(T, N, Hv)``) in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, naming the argument; a bad
      ``logits_soft_cap``, ``local_window_size`` or ``implementation``.
    TypeError: on non-floating inputs or a non-boolean mask.
    NotImplementedError: for ``implementation="pallas"`` on a case the
      kernel does not cover.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 2))  # (B, T, N, H): equal logits
    >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
    >>> out = attention.dot_product_attention(q, k, v, is_causal=True)
    >>> print(np.asarray(out[0, :, 0]))  # row 0 sees v0, row 1 the mean
    [[1. 0.]
     [2. 1.]]

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017);
    Ainslie et al., *GQA*, arXiv:2305.13245 (2023); Gemma Team, *Gemma 2:
    Improving Open Language Models at a Practical Size*, arXiv:2408.00118
    (2024).
  """
  who = "dot_product_attention"
  d, q, k, v, bias4, mask4 = _core.prepare(who, query, key, value, bias, mask)
  _check_soft_cap(who, logits_soft_cap)
  window = _core.window(who, local_window_size)

  def call_kernel(kernel):
    if logits_soft_cap is not None:
      raise NotImplementedError(
        "the flash kernel has no logits_soft_cap; use implementation='xla'"
      )
    kmask = (
      mask if window is None else _core.allowed_mask(d, mask4, False, window)
    )
    return kernel(
      query, key, value, bias, kmask, scale=scale, is_causal=is_causal
    )

  def reference():
    dtype = _numerics.compute_dtype(q, k, v)
    allowed = _core.allowed_mask(d, mask4, is_causal, window)
    w = _softmax_weights(d, q, k, bias4, allowed, scale, logits_soft_cap, dtype)
    return _core.finish(d, _core.apply_weights(d, w, v, dtype), query.dtype)

  return _dispatch.dispatch(
    who,
    implementation,
    "dot_product_attention_pallas",
    call_kernel,
    reference,
    arrays=(query,),
  )
