"""Loading a flax ``nnx.MultiHeadAttention`` into `MultiHeadAttention`.

Examples:
  >>> flax_mha = nnx.MultiHeadAttention(2, 8, normalize_qk=True,
  ...                                   decode=False, rngs=nnx.Rngs(0))
  >>> type(from_flax_attention(flax_mha).q_norm).__name__
  'LayerNorm'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from jaxnorm.nn.attention import _registry, multihead

# flax submodule -> (kernel path, bias path) in jaxnorm.
_PROJECTIONS = (
  ("query", "q_kernel", "q_bias"),
  ("key", "k_kernel", "k_bias"),
  ("value", "v_kernel", "v_bias"),
  ("out", "out_kernel", "out_bias"),
)


def from_flax_attention(
  flax_mha: nnx.MultiHeadAttention,
  *,
  attention: _registry.AttentionName = "softmax",
  attention_kwargs: Mapping[str, Any] | None = None,
  is_causal: bool = False,
  use_rope: bool = False,
  rngs: nnx.Rngs | None = None,
) -> multihead.MultiHeadAttention:
  """A `MultiHeadAttention` with the weights of a flax one.

  Parameter map (both store ``(in, heads, head_dim)`` kernels, so the
  values are copied as they are): ``query.kernel``/``query.bias`` ->
  ``q_kernel``/``q_bias``, ``key.*`` -> ``k_*``, ``value.*`` -> ``v_*``,
  ``out.kernel (N, H, D)``/``out.bias`` -> ``out_kernel``/``out_bias``;
  ``normalize_qk=True`` (flax: a LayerNorm without bias over ``H``) ->
  ``qk_norm="layernorm"`` with ``use_bias=False`` and flax's epsilon,
  ``query_ln.scale``/``key_ln.scale`` -> ``q_norm.scale``/
  ``k_norm.scale``. Sizes (``num_heads``, ``num_kv_heads``, ``head_dim =
  qkv_features / num_heads``, ``in_kv_features``), ``use_bias``, ``dtype``
  and ``param_dtype`` are read from ``flax_mha``. With the default softmax
  core the outputs equal flax's to float32 round-off, for self- and
  cross-attention (`nnx.dot_product_attention` is the same maths).

  Not carried: flax's ``attention_fn`` (the core is ``attention``; a
  core's own parameters, e.g. sink logits or gates, keep their init),
  attention dropout (jaxnorm's module has none; flax's output in
  deterministic mode is matched) and the ``decode`` cache (call
  ``init_cache`` on the result).

  Args:
    flax_mha: the flax module.
    attention: the core's name in `ATTENTIONS`.
    attention_kwargs: the core's options.
    is_causal: as `MultiHeadAttention` (flax passes causality as a mask).
    use_rope: as `MultiHeadAttention` (flax's module has no RoPE).
    rngs: RNG streams for the parameters flax has no value for (the
      core's); default ``nnx.Rngs(0)``.

  Returns:
    The jaxnorm module.

  Raises:
    ValueError: if ``flax_mha`` is not an ``nnx.MultiHeadAttention`` or its
      ``out_features`` differ from ``in_features`` (jaxnorm's output width
      is its input width).

  Examples:
    >>> import jax
    >>> flax_mha = nnx.MultiHeadAttention(2, 8, decode=False, rngs=nnx.Rngs(0))
    >>> mha = from_flax_attention(flax_mha, is_causal=False)
    >>> x = jax.random.normal(jax.random.key(0), (1, 3, 8), jnp.float32)
    >>> bool(jnp.allclose(mha(x), flax_mha(x), atol=1e-5))
    True
  """
  who = "from_flax_attention"
  if not isinstance(flax_mha, nnx.MultiHeadAttention):
    raise ValueError(
      f"{who}: flax_mha must be a flax.nnx.MultiHeadAttention, got "
      f"{type(flax_mha).__name__}"
    )
  f = flax_mha
  if f.out_features != f.in_features:
    raise ValueError(
      f"{who}: jaxnorm's MultiHeadAttention returns its input width, so "
      f"out_features must equal in_features={f.in_features}, got "
      f"out_features={f.out_features}"
    )
  qk = {}
  if f.normalize_qk:
    norm_kwargs = {"eps": f.query_ln.epsilon, "use_bias": False}
    qk = {"qk_norm": "layernorm", "qk_norm_kwargs": norm_kwargs}
  m = multihead.MultiHeadAttention(
    f.in_features,
    f.num_heads,
    num_kv_heads=f.num_kv_heads,
    head_dim=f.head_dim,
    in_kv_features=f.in_kv_features,
    attention=attention,
    attention_kwargs=attention_kwargs,
    is_causal=is_causal,
    use_rope=use_rope,
    use_bias=f.use_bias,
    dtype=f.dtype,
    param_dtype=f.param_dtype,
    rngs=nnx.Rngs(0) if rngs is None else rngs,
    **qk,
  )
  for name, kernel, bias in _PROJECTIONS:
    src = getattr(f, name)
    _copy(getattr(m, kernel), src.kernel)
    if f.use_bias:
      _copy(getattr(m, bias), src.bias)
  if f.normalize_qk:
    _copy(m.q_norm.scale, f.query_ln.scale)
    _copy(m.k_norm.scale, f.key_ln.scale)
  return m


def _copy(dst: nnx.Variable, src: nnx.Variable) -> None:
  """Copies a flax parameter's value (same shape) into ``dst``."""
  dst[...] = jnp.asarray(src[...]).astype(dst[...].dtype).reshape(dst.shape)
