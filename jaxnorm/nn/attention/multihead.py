"""The attention registry and `MultiHeadAttention`, which runs any core."""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, sharding
from jaxnorm import attention as attn
from jaxnorm.nn import _param, registry
from jaxnorm.nn.attention import _base, cores

AttentionName = Literal[
  "softmax",
  "off_by_one",
  "sink",
  "gated",
  "affine_scaled",
  "soft",
  "nala",
  "lina",
  "causal_linear",
  "mxfp4",
  "sinkhorn",
]


def _lina_defaults(
  num_heads: int, head_dim: int, num_tokens: int | None
) -> dict[str, Any]:
  """Static KV gates over every position when the length is fixed."""
  del num_heads, head_dim
  return {} if num_tokens is None else {"max_len": num_tokens}


def _soft_defaults(
  num_heads: int, head_dim: int, num_tokens: int | None
) -> dict[str, Any]:
  """Landmark windows of 2 tokens, or 1 when 2 does not tile the length."""
  del num_heads, head_dim
  return {} if num_tokens is None else {"ratio": math.gcd(num_tokens, 2)}


ATTENTIONS: Mapping[str, registry.AttentionSpec] = types.MappingProxyType(
  {
    "softmax": registry.AttentionSpec(
      cores.SoftmaxAttention, "Vaswani et al., arXiv:1706.03762", kernel=True
    ),
    "off_by_one": registry.AttentionSpec(
      cores.OffByOneAttention,
      "Miller, Attention Is Off By One (2023)",
      kernel=True,
    ),
    "sink": registry.AttentionSpec(
      cores.SinkAttention, "OpenAI, arXiv:2508.10925", kernel=True
    ),
    "gated": registry.AttentionSpec(
      cores.GatedAttention, "Qiu et al., arXiv:2505.06708", kernel=True
    ),
    "affine_scaled": registry.AttentionSpec(
      cores.AffineScaledAttention, "Bae et al., arXiv:2602.23057", kernel=True
    ),
    "soft": registry.AttentionSpec(
      cores.SoftAttention,
      "Lu et al., arXiv:2110.11945",
      defaults=_soft_defaults,
      causal=False,
      takes_mask=False,
    ),
    "nala": registry.AttentionSpec(
      cores.NaLaAttention,
      "Meng et al., arXiv:2506.21137",
      causal=False,
      takes_mask=False,
    ),
    "lina": registry.AttentionSpec(
      cores.LinaAttention,
      "Wang et al., arXiv:2601.22630",
      defaults=_lina_defaults,
      causal=False,
      takes_mask=False,
    ),
    "causal_linear": registry.AttentionSpec(
      cores.CausalLinearAttention,
      "Katharopoulos et al., arXiv:2006.16236",
      takes_mask=False,
      kernel=True,
    ),
    "mxfp4": registry.AttentionSpec(
      cores.MXFP4Attention, "Yu et al., arXiv:2607.24377"
    ),
    "sinkhorn": registry.AttentionSpec(
      cores.SinkhornAttention, "Freytes, arXiv:2601.11618"
    ),
  }
)
"""Attention name -> `registry.AttentionSpec` (core class and capabilities).

Adding a paper: its core class in `cores`, one entry here and its name in
`AttentionName`."""

ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTIONS)


def _check_name(who: str, name: str) -> registry.AttentionSpec:
  if name not in ATTENTIONS:
    raise ValueError(
      f"{who}: unknown attention {name!r}; valid names are "
      f"{', '.join(ATTENTION_NAMES)}"
    )
  return ATTENTIONS[name]


class MultiHeadAttention(nnx.Module):
  """Multi-head self-attention around a registered core.

  ``x (B, T, D)`` -> q ``(B, T, N, H)``, k/v ``(B, T, K, H)`` -> optional
  QK-norm (any `make_norm` name, over ``H``) -> optional RoPE -> the core
  ``ATTENTIONS[attention].core`` -> output projection to ``(B, T, D)``.

  Parameter paths: ``q_kernel (D, N, H)``, ``k_kernel``/``v_kernel (D, K,
  H)``, ``out_kernel (N, H, D)`` (logical names ``embed``, ``heads``,
  ``kv_heads``, ``head_dim``), biases ``q_bias``, ``k_bias``, ``v_bias``,
  ``out_bias`` with ``use_bias``, norms ``q_norm``/``k_norm`` with
  ``qk_norm``, and the core's own parameters and state under ``core`` (e.g.
  ``core.sinks``, ``core.alpha_ma``; table in `cores`). A core that ties keys
  to queries (``ties_keys``, SOFT) gets no key kernel, bias or norm.
  Projections are LeCun-normal (truncated).

  Train/eval behaviour lives in the cores (``use_running_average`` of
  Affine-Scaled Attention) and follows ``model.eval()`` / ``nnx.view``.
  """

  def __init__(
    self,
    num_features: int,
    num_heads: int,
    *,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    attention: AttentionName = "softmax",
    attention_kwargs: Mapping[str, Any] | None = None,
    is_causal: bool = False,
    use_rope: bool = False,
    rope_base: float = 10000.0,
    qk_norm: str | None = None,
    qk_norm_kwargs: Mapping[str, Any] | None = None,
    use_bias: bool = False,
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
      dtype: compute dtype (default: the input's).
      param_dtype: parameter dtype.
      rngs: parameter RNG streams.

    Raises:
      ValueError: for an unknown attention or norm name, bad sizes, or
        options the core does not take.
    """
    who = "MultiHeadAttention"
    spec = _check_name(who, attention)
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
    dims = _base.HeadDims(num_features, num_heads, kv, head_dim)
    d, n, h = num_features, num_heads, head_dim
    self.dims, self.attention, self.is_causal = dims, attention, is_causal
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
      else _base.dense_param(rngs, (d, kv, h), 0, (1, 2), pd, kv_names)
    )
    self.v_kernel = _base.dense_param(rngs, (d, kv, h), 0, (1, 2), pd, kv_names)
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
    from jaxnorm.nn import norms  # Lazy: the norm family is independent.

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

  def _project(self, x, kernel, bias, names):
    dt = x.dtype
    y = jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(dt))
    if bias is not None:
      y = y + bias[...].astype(dt).reshape((1, 1) + bias.shape)
    return sharding.constrain(y, names)

  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    positions: jax.Array | None = None,
  ) -> jax.Array:
    """Self-attention over ``x (B, T, D)``; returns ``(B, T, D)``.

    Args:
      x: the (pre-normed) hidden states.
      mask: boolean mask broadcastable to ``(B, N, T, T)``.
      bias: additive bias broadcastable to ``(B, N, T, T)``.
      positions: RoPE positions ``(B, T)`` or ``(T,)``; default arange.

    Raises:
      ValueError: if ``x`` does not have ``num_features`` features, or a
        mask/bias is given to a core without one.
    """
    who = "MultiHeadAttention"
    _checks.check_ndim(who, "x", x, expected=3)
    if x.shape[-1] != self.dims.num_features:
      raise ValueError(
        f"{who}: x must have num_features={self.dims.num_features} "
        f"features on its last axis, got {x.shape=}"
      )
    dt = self.dtype or x.dtype
    x = x.astype(dt)
    heads = ("batch", "seq", "heads", "head_dim")
    kv_heads = ("batch", "seq", "kv_heads", "head_dim")
    q = self._project(x, self.q_kernel, self.q_bias, heads)
    k = (
      None
      if self.k_kernel is None
      else self._project(x, self.k_kernel, self.k_bias, kv_heads)
    )
    v = self._project(x, self.v_kernel, self.v_bias, kv_heads)
    if self.q_norm is not None:
      q = self.q_norm(q).astype(dt)
    if self.k_norm is not None:
      k = self.k_norm(k).astype(dt)
    if self.use_rope:
      q = attn.rope(q, positions, base=self.rope_base)
      if k is not None:
        k = attn.rope(k, positions, base=self.rope_base)
    y = self.core(x, q, k, v, mask=mask, bias=bias)
    out = jnp.einsum(
      "btnh,nhd->btd", y.astype(dt), self.out_kernel[...].astype(dt)
    )
    if self.out_bias is not None:
      out = out + self.out_bias[...].astype(dt).reshape(1, 1, -1)
    return out


_MHA_ARGS = frozenset(inspect.signature(MultiHeadAttention.__init__).parameters)


def make_attention(
  name: str, num_features: int, num_heads: int, *, rngs: nnx.Rngs, **kwargs: Any
) -> MultiHeadAttention:
  """Builds a `MultiHeadAttention` whose core is ``name``.

  Args:
    name: one of `ATTENTION_NAMES`.
    num_features: model width ``D``.
    num_heads: query heads ``N``.
    rngs: parameter RNG streams.
    **kwargs: `MultiHeadAttention` arguments; any other keyword is an option
      of the core (merged into ``attention_kwargs``), e.g. ``headwise=True``
      for ``"gated"`` or ``max_len=64`` for ``"lina"``.

  Returns:
    The module.

  Raises:
    ValueError: for an unknown name (the message lists every valid name) or
      an option the core does not take.
  """
  _check_name("make_attention", name)
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
