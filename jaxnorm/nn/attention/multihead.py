"""`MultiHeadAttention`, which runs any registered core.

The registry itself (`ATTENTIONS`) is `jaxnorm.nn.attention._registry`.

Examples:
  >>> mha = MultiHeadAttention(8, 2, attention="off_by_one", rngs=nnx.Rngs(0))
  >>> mha(jnp.ones((2, 3, 8), jnp.float32)).shape
  (2, 3, 8)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, sharding
from jaxnorm import attention as attn
from jaxnorm.nn import _param, norms
from jaxnorm.nn.attention import _base
from jaxnorm.nn.attention._registry import (
  ATTENTIONS,
  TOKEN_ATTENTIONS,
  AttentionName,
  check_name,
)


class MultiHeadAttention(nnx.Module):
  """Multi-head attention around a registered core (self, cross, decode).

  ``inputs_q (B, T, D)`` -> q ``(B, T, N, H)``; ``inputs_k``/``inputs_v (B,
  S, D_kv)`` (default ``inputs_q``: self-attention) -> k/v ``(B, S, K, H)``
  -> optional QK-norm (any `make_norm` name, over ``H``) -> optional RoPE ->
  the core ``ATTENTIONS[attention].core`` -> output projection to ``(B, T,
  D)``. The call follows `flax.nnx.MultiHeadAttention`: ``inputs_k`` and
  ``inputs_v`` as flax (``inputs_v`` defaults to ``inputs_k``; ``inputs_v``
  alone is an error), ``in_kv_features`` for a key/value width of its own,
  and ``init_cache`` + ``decode=True`` for autoregressive decoding.

  Cross-attention (``inputs_k`` given) runs on every core but those whose
  `AttentionCore.cross_refusal` says why not: SOFT (keys tied to queries),
  causal linear attention (always causal self-attention) and NaLaFormer's
  map form; they raise a `ValueError` naming the core. ``is_causal`` keeps
  the pure functions' top-left rule (query ``i`` sees keys ``j <= i``, as
  `jax.nn.dot_product_attention`); with RoPE the keys sit at ``arange(S)``.

  Decoding (``init_cache(input_shape, dtype)``, then ``decode=True`` calls
  of one or more tokens): the cores with ``supports_cache`` (softmax,
  off-by-one, sink, gated, affine-scaled in eval mode) attend from the new
  queries to the cache ``cached_key``/``cached_value (B, L, K, H)`` with
  `attention.decode_mask`; ``cache_index`` counts the tokens written. The
  ``"full"`` policy (flax's) writes token ``p`` at slot ``p`` with RoPE at
  ``p`` (or ``positions``); writing past ``L`` is undefined (the write is
  clamped), as in flax.
  The ``"streaming"`` policy is StreamingLLM's (`attention.
  streaming_cache_update`): a constant-size cache of ``num_sink_tokens``
  attention sinks and the most recent ``L - num_sink_tokens`` tokens, keys
  stored before RoPE and rotated at their positions within the cache.

  Parameter paths: ``q_kernel (D, N, H)``, ``k_kernel``/``v_kernel (D_kv,
  K, H)``, ``out_kernel (N, H, D)`` (logical names ``embed``, ``heads``,
  ``kv_heads``, ``head_dim``), biases ``q_bias``, ``k_bias``, ``v_bias``,
  ``out_bias`` with ``use_bias``, norms ``q_norm``/``k_norm`` with
  ``qk_norm``, and the core's own parameters and state under ``core`` (e.g.
  ``core.sinks``, ``core.alpha_ma``; table in `jaxnorm.nn.attention`). A
  core that ties keys to queries (``ties_keys``, SOFT) gets no key kernel,
  bias or norm.
  Projections are LeCun-normal (truncated).

  Train/eval behaviour lives in the cores (``use_running_average`` of
  Affine-Scaled Attention) and follows ``model.eval()`` / ``nnx.view``.
  Weights of a flax ``nnx.MultiHeadAttention`` load with
  `from_flax_attention`.

  Examples:
    Grouped-query causal attention with RoPE and a QK-norm:

    >>> mha = MultiHeadAttention(8, 2, num_kv_heads=1, is_causal=True,
    ...                          use_rope=True, qk_norm="rmsnorm",
    ...                          rngs=nnx.Rngs(0))
    >>> mha.q_kernel.shape, mha.k_kernel.shape, mha.out_kernel.shape
    ((8, 2, 4), (8, 1, 4), (2, 4, 8))

    Decoding one token at a time from the cache gives the full causal call:

    >>> x = jax.random.normal(jax.random.key(0), (1, 4, 8), jnp.float32)
    >>> full = mha(x)
    >>> mha.init_cache((1, 4, 8))  # (batch, max_length, features)
    >>> steps = [mha(x[:, t : t + 1], decode=True) for t in range(4)]
    >>> bool(jnp.allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5))
    True

  References:
    Xiao et al., *Efficient Streaming Language Models with Attention
    Sinks*, arXiv:2309.17453 (2023) (the ``"streaming"`` cache).
  """

  def __init__(
    self,
    num_features: int,
    num_heads: int,
    *,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    in_kv_features: int | None = None,
    attention: AttentionName = "softmax",
    attention_kwargs: Mapping[str, Any] | None = None,
    is_causal: bool = False,
    use_rope: bool = False,
    rope_base: float = 10000.0,
    qk_norm: str | None = None,
    qk_norm_kwargs: Mapping[str, Any] | None = None,
    use_bias: bool = False,
    decode: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    """Builds the projections, norms and the core.

    Args:
      num_features: model width ``D``.
      num_heads: query heads ``N``.
      num_kv_heads: key/value heads ``K`` (default ``N``).
      head_dim: ``H`` (default ``D // N``).
      in_kv_features: width ``D_kv`` of ``inputs_k``/``inputs_v``
        (default ``D``; flax's name).
      attention: the core's name in `ATTENTIONS`.
      attention_kwargs: the core's options (its constructor arguments and
        its pure function's keyword options, e.g. ``{"p_quant": "direct"}``
        for ``"mxfp4"``, ``{"headwise": True}`` for ``"gated"``).
      is_causal: query ``t`` sees keys ``<= t`` (refused by cores without
        a causal form).
      use_rope: rotate q and k (`attention.rope`).
      rope_base: RoPE frequency base.
      qk_norm: norm name for QK-norm over ``H``, or None.
      qk_norm_kwargs: its options.
      use_bias: biases on every projection.
      decode: default of ``__call__``'s ``decode`` (flax's attribute; also
        set by ``nnx.view(model, decode=True)``).
      dtype: compute dtype (default: the input's).
      param_dtype: parameter dtype.
      rngs: parameter RNG streams.

    Raises:
      ValueError: for an unknown attention or norm name, bad sizes,
        options the core does not take, or ``in_kv_features != D`` with a
        core that takes no ``inputs_k``.
    """
    who = "MultiHeadAttention"
    spec = check_name(who, attention)
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_heads", num_heads)
    kv = num_heads if num_kv_heads is None else num_kv_heads
    _checks.check_positive_int(who, "num_kv_heads", kv)
    _checks.check_divisible(who, "num_heads", num_heads, "num_kv_heads", kv)
    if head_dim is None:
      _checks.check_divisible(
        who, "num_features", num_features, "num_heads", num_heads
      )
      head_dim = num_features // num_heads
    _checks.check_positive_int(who, "head_dim", head_dim)
    d_kv = num_features if in_kv_features is None else in_kv_features
    _checks.check_positive_int(who, "in_kv_features", d_kv)
    dims = _base.HeadDims(num_features, num_heads, kv, head_dim)
    d, n, h = num_features, num_heads, head_dim
    self.dims, self.attention, self.is_causal = dims, attention, is_causal
    self.in_kv_features, self.decode = d_kv, decode
    self.use_rope, self.rope_base, self.dtype = use_rope, rope_base, dtype
    ties = spec.core.ties_keys
    pd = param_dtype
    kv_names = ("embed", "kv_heads", "head_dim")
    self.q_kernel = _base.dense_param(
      rngs, (d, n, h), 0, (1, 2), pd, ("embed", "heads", "head_dim")
    )
    self.k_kernel = (
      None
      if ties
      else _base.dense_param(rngs, (d_kv, kv, h), 0, (1, 2), pd, kv_names)
    )
    self.v_kernel = _base.dense_param(
      rngs, (d_kv, kv, h), 0, (1, 2), pd, kv_names
    )
    self.out_kernel = _base.dense_param(
      rngs, (n, h, d), (0, 1), 2, pd, ("heads", "head_dim", "embed")
    )

    def zeros(shape, names):  # A bias, or None without use_bias.
      return _param.param(jnp.zeros(shape, pd), names) if use_bias else None

    kv_bias = ("kv_heads", "head_dim")
    self.q_bias = zeros((n, h), ("heads", "head_dim"))
    self.k_bias = None if ties else zeros((kv, h), kv_bias)
    self.v_bias = zeros((kv, h), kv_bias)
    self.out_bias = zeros((d,), ("embed",))

    def qk(use: bool):  # A QK-norm over the head dim, or None.
      kw = dict(qk_norm_kwargs or {})
      return norms.make_norm(qk_norm, h, rngs=rngs, **kw) if use else None

    self.q_norm = qk(qk_norm is not None)
    self.k_norm = qk(qk_norm is not None and not ties)
    # Built last: the projections' init does not depend on the core.
    self.core = spec.core(
      dims,
      is_causal=is_causal,
      param_dtype=param_dtype,
      rngs=rngs,
      **dict(attention_kwargs or {}),
    )
    refusal = self.core.cross_refusal()
    if d_kv != d and refusal is not None:
      raise ValueError(
        f"{who}: in_kv_features={d_kv} differs from num_features={d}, but "
        f"the {attention!r} core takes no inputs_k: {refusal}"
      )
    # The decode cache (flax's names), set by init_cache.
    self.cached_key: nnx.Cache | None = nnx.data(None)
    self.cached_value: nnx.Cache | None = nnx.data(None)
    self.cache_index: nnx.Cache | None = nnx.data(None)
    self.cache_policy: str | None = None
    self.num_sink_tokens = 0

  def init_cache(
    self,
    input_shape: tuple[int, ...],
    dtype: Any = jnp.float32,
    *,
    policy: Literal["full", "streaming"] = "full",
    num_sink_tokens: int = 4,
  ) -> None:
    """Creates an empty decode cache (flax's ``init_cache`` signature).

    Args:
      input_shape: ``(batch, max_length, features)``: the cache holds
        ``max_length`` tokens ``L``.
      dtype: the cache's dtype.
      policy: ``"full"`` (every token up to ``L``, as flax) or
        ``"streaming"`` (StreamingLLM: the first ``num_sink_tokens`` tokens
        and the most recent ``L - num_sink_tokens``, see the class
        docstring).
      num_sink_tokens: attention sinks kept by ``"streaming"`` (paper: 4).

    Raises:
      ValueError: for a core without a cache (naming it), a malformed
        ``input_shape``, an unknown policy, ``num_sink_tokens`` outside
        ``[0, L)``, or ``"streaming"`` with a ``local_window_size``.
    """
    who = "MultiHeadAttention.init_cache"
    if not self.core.supports_cache:
      able = [n for n in TOKEN_ATTENTIONS if ATTENTIONS[n].core.supports_cache]
      raise ValueError(
        f"{who}: the {self.attention!r} core ({type(self.core).__name__}) "
        f"has no decode cache; cores with one: {', '.join(able)}"
      )
    _checks.check_choice(who, "policy", policy, ("full", "streaming"))
    if len(input_shape) != 3:
      raise ValueError(
        f"{who}: input_shape must be (batch, max_length, features), got "
        f"{input_shape=}"
      )
    b, length = input_shape[:2]
    _checks.check_positive_int(who, "batch", b)
    _checks.check_positive_int(who, "max_length", length)
    if policy == "streaming":
      if not (
        isinstance(num_sink_tokens, int) and 0 <= num_sink_tokens < length
      ):
        raise ValueError(
          f"{who}: num_sink_tokens must be an int in [0, max_length="
          f"{length}), got {num_sink_tokens=}"
        )
      if self.core.local_window() is not None:
        raise ValueError(
          f"{who}: policy='streaming' is a window of its own; build the "
          "core without local_window_size"
        )
    shape = (b, length, self.dims.num_kv_heads, self.dims.head_dim)
    self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
    self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
    self.cache_index = nnx.Cache(jnp.array(0, dtype=jnp.int32))
    self.cache_policy = policy
    self.num_sink_tokens = num_sink_tokens if policy == "streaming" else 0

  def set_view(self, decode: bool | None = None) -> None:
    """The `nnx.view` protocol: ``decode`` as flax's module takes it.

    Args:
      decode: the default of ``__call__``'s ``decode``; None leaves it.
    """
    if decode is not None:
      self.decode = decode

  def _project(self, x, kernel, bias, names):
    dt = x.dtype
    y = jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(dt))
    if bias is not None:
      y = y + bias[...].astype(dt).reshape((1, 1) + bias.shape)
    return sharding.constrain(y, names)

  def _check_input(self, who, name, a, features, batch=None):
    _checks.check_ndim(who, name, a, expected=3)
    if a.shape[-1] != features:
      width = "num_features" if name == "inputs_q" else "in_kv_features"
      raise ValueError(
        f"{who}: {name} must have {width}={features} features on its last "
        f"axis, got {name}.shape={a.shape}"
      )
    if batch is not None and a.shape[0] != batch:
      raise ValueError(
        f"{who}: {name} must have the batch size of inputs_q ({batch}), got "
        f"{name}.shape={a.shape}"
      )

  def _cross_inputs(self, who, inputs_q, inputs_k, inputs_v):
    """``(inputs_k, inputs_v)`` as flax resolves them, checked."""
    if inputs_k is None:
      if inputs_v is not None:
        raise ValueError(
          f"{who}: inputs_k cannot be None if inputs_v is not None (flax's "
          "rule); pass the same array as inputs_k and leave inputs_v None"
        )
      return None, None
    refusal = self.core.cross_refusal()
    if refusal is not None:
      raise ValueError(
        f"{who}: the {self.attention!r} core ({type(self.core).__name__}) "
        f"takes no inputs_k/inputs_v: {refusal}; call it without them "
        "(self-attention)"
      )
    inputs_v = inputs_k if inputs_v is None else inputs_v
    b = inputs_q.shape[0]
    self._check_input(who, "inputs_k", inputs_k, self.in_kv_features, b)
    self._check_input(who, "inputs_v", inputs_v, self.in_kv_features, b)
    if inputs_v.shape[1] != inputs_k.shape[1]:
      raise ValueError(
        f"{who}: inputs_v must have the length of inputs_k, got "
        f"{inputs_k.shape=} and {inputs_v.shape=}"
      )
    return inputs_k, inputs_v

  def __call__(
    self,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None = None,
    inputs_v: jax.Array | None = None,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    positions: jax.Array | None = None,
    decode: bool | None = None,
  ) -> jax.Array:
    """Attention from ``inputs_q (B, T, D)``; returns ``(B, T, D)``.

    Args:
      inputs_q: the (pre-normed) hidden states of the queries.
      inputs_k: keys' input ``(B, S, D_kv)``; None: ``inputs_q``.
      inputs_v: values' input ``(B, S, D_kv)``; None: ``inputs_k``.
      mask: boolean mask broadcastable to ``(B, N, T, S)`` (``(B, N, T,
        L)`` when decoding), True attends.
      bias: additive bias broadcastable to the same shape.
      positions: RoPE positions of the queries ``(B, T)`` or ``(T,)``;
        default ``arange(T)``, or ``cache_index + arange(T)`` when decoding
        with the ``"full"`` cache.
      decode: one decode step on the cache (see the class docstring);
        None takes the module's ``decode``.

    Raises:
      ValueError: on inputs of the wrong rank, width, batch or length;
        ``inputs_v`` without ``inputs_k``; cross inputs to a core that takes
        none, or to a decode step; a mask/bias for a core without one;
        decoding without ``init_cache``, with a core that cannot, with more
        tokens than the cache (``"full"``) or its window (``"streaming"``),
        or with ``positions`` on the ``"streaming"`` cache.
      TypeError: for a non-boolean mask when decoding.
    """
    who = "MultiHeadAttention"
    self._check_input(who, "inputs_q", inputs_q, self.dims.num_features)
    inputs_k, inputs_v = self._cross_inputs(who, inputs_q, inputs_k, inputs_v)
    decode = self.decode if decode is None else decode
    if decode and inputs_k is not None:
      raise ValueError(
        f"{who}: decode=True is cached self-attention; it takes no "
        "inputs_k/inputs_v"
      )
    dt = self.dtype or inputs_q.dtype
    x = inputs_q.astype(dt)
    xk = x if inputs_k is None else inputs_k.astype(dt)
    xv = x if inputs_v is None else inputs_v.astype(dt)
    heads = ("batch", "seq", "heads", "head_dim")
    kv_heads = ("batch", "seq", "kv_heads", "head_dim")
    q = self._project(x, self.q_kernel, self.q_bias, heads)
    k = (
      None
      if self.k_kernel is None
      else self._project(xk, self.k_kernel, self.k_bias, kv_heads)
    )
    v = self._project(xv, self.v_kernel, self.v_bias, kv_heads)
    if self.q_norm is not None:
      q = self.q_norm(q).astype(dt)
    if self.k_norm is not None:
      k = self.k_norm(k).astype(dt)
    if decode:
      y = self._decode_step(who, x, q, k, v, mask, bias, positions)
    else:
      if self.use_rope:
        q = attn.rope(q, positions, base=self.rope_base)
        if k is not None:
          kpos = positions if inputs_k is None else None
          k = attn.rope(k, kpos, base=self.rope_base)
      y = self.core(x, q, k, v, mask=mask, bias=bias)
    out = jnp.einsum(
      "btnh,nhd->btd", y.astype(dt), self.out_kernel[...].astype(dt)
    )
    if self.out_bias is not None:
      out = out + self.out_bias[...].astype(dt).reshape(1, 1, -1)
    return out

  def _decode_step(self, who, x, q, k, v, mask, bias, positions):
    """Writes the new keys/values into the cache and attends to it."""
    refusal = self.core.cache_refusal()
    if refusal is not None:
      raise ValueError(
        f"{who}: the {self.attention!r} core ({type(self.core).__name__}) "
        f"cannot decode: {refusal}"
      )
    if self.cached_key is None:
      raise ValueError(
        f"{who}: decode=True needs a cache; call init_cache(input_shape) first"
      )
    cache = self.cached_key[...]
    b, length = cache.shape[:2]
    t = q.shape[1]
    if q.shape[0] != b:
      raise ValueError(
        f"{who}: the cache was built for batch {b}, got inputs_q with batch "
        f"{q.shape[0]}"
      )
    if mask is not None and jnp.asarray(mask).dtype != jnp.bool_:
      raise TypeError(
        f"{who}: mask must be boolean (True attends), got "
        f"{jnp.asarray(mask).dtype=}"
      )
    index = self.cache_index[...]
    window = self.core.local_window()
    dt = q.dtype
    if self.cache_policy == "full":
      if t > length:
        raise ValueError(
          f"{who}: {t} tokens do not fit the cache of max_length={length}"
        )
      pos = index + jnp.arange(t) if positions is None else positions
      if self.use_rope:
        q = attn.rope(q, pos, base=self.rope_base)
        k = attn.rope(k, pos, base=self.rope_base)
      at = (0, index, 0, 0)
      keys = jax.lax.dynamic_update_slice(cache, k.astype(cache.dtype), at)
      values = jax.lax.dynamic_update_slice(
        self.cached_value[...], v.astype(cache.dtype), at
      )
      start, used = index, keys
    else:
      if positions is not None:
        raise ValueError(
          f"{who}: the 'streaming' cache assigns positions within the cache; "
          "positions must be None"
        )
      s = self.num_sink_tokens
      keys, start = attn.streaming_cache_update(
        cache, k, index, num_sink_tokens=s
      )
      values, _ = attn.streaming_cache_update(
        self.cached_value[...], v, index, num_sink_tokens=s
      )
      used = keys
      if self.use_rope:
        q = attn.rope(q, start + jnp.arange(t), base=self.rope_base)
        used = attn.rope(keys, jnp.arange(length), base=self.rope_base)
    self.cached_key[...] = keys
    self.cached_value[...] = values
    self.cache_index[...] = index + t
    allowed = attn.decode_mask(start, t, length, local_window_size=window)
    mask = allowed if mask is None else jnp.logical_and(mask, allowed)
    return self.core(
      x,
      q,
      used.astype(dt),
      values.astype(dt),
      mask=mask,
      bias=bias,
      cached=True,
    )


_MHA_ARGS = frozenset(inspect.signature(MultiHeadAttention.__init__).parameters)


def make_attention(
  name: str, num_features: int, num_heads: int, *, rngs: nnx.Rngs, **kwargs: Any
) -> MultiHeadAttention:
  """Builds a `MultiHeadAttention` whose core is ``name``.

  Args:
    name: one of `TOKEN_ATTENTIONS` (the ``images`` names are built by
      `make_image_attention`).
    num_features: model width ``D``.
    num_heads: query heads ``N``.
    rngs: parameter RNG streams.
    **kwargs: `MultiHeadAttention` arguments; any other keyword is an option
      of the core (merged into ``attention_kwargs``), e.g. ``headwise=True``
      for ``"gated"`` or ``max_len=64`` for ``"lina"``.

  Returns:
    The module.

  Raises:
    ValueError: for an unknown name (the message lists every valid name), an
      ``images`` name (the message points to `make_image_attention`) or an
      option the core does not take.

  Examples:
    >>> mha = make_attention("gated", 8, 2, headwise=True, rngs=nnx.Rngs(0))
    >>> type(mha.core).__name__, mha.core.gate_kernel.shape  # (D, N, 1)
    ('GatedAttention', (8, 2, 1))
    >>> mha(jnp.ones((2, 3, 8), jnp.float32)).shape
    (2, 3, 8)
  """
  check_name("make_attention", name)
  core_kwargs = dict(kwargs.pop("attention_kwargs", None) or {})
  core_kwargs.update({k: kwargs.pop(k) for k in set(kwargs) - _MHA_ARGS})
  return MultiHeadAttention(
    num_features,
    num_heads,
    attention=name,
    attention_kwargs=core_kwargs,
    rngs=rngs,
    **kwargs,
  )
