"""Complex-native multi-head attention: the complex LM's mixing layer.

`ComplexMultiHeadAttention` projects complex tokens, rotates them with
complex RoPE and mixes them with a complex core of
`jaxnorm.nn.attention.ATTENTIONS` (Born, PCT, complex softmax); the maths
lives in `jaxnorm.cplx`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _common, _param
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn.attention import _base
from jaxnorm.nn.cplx.layers import cnet_input_init, complex_glorot


class ComplexMultiHeadAttention(nnx.Module):
  """Complex multi-head self-attention (causal): projections, RoPE, core.

  ``x (B, T, D)`` complex -> ``q, k, v (B, T, N, H)`` complex -> complex
  RoPE on q and k (`cplx.complex_rope`, with ``use_rope``) -> the causal
  core ``ATTENTIONS[attention].core`` (built with ``is_causal=True``, the
  spec's defaults and ``attention_kwargs``, e.g. ``{"gate": "tanh1"}`` for
  ``"pct"``) -> output projection to ``(B, T, D)``. Parameters:
  ``q_kernel``, ``k_kernel``, ``v_kernel (D, N, H)`` and ``out_kernel (N,
  H, D)``, complex Glorot, no bias (``init``: ``"glorot"``, each kernel its
  own Glorot fans; ``"fused_glorot"``, q, k and v drawn as one ``(D, 3 N
  H)`` Glorot matrix, the PCT's fused ``to_qkv``, whose fan-out is ``3 N
  H``; ``"cnet"``, `jaxnorm.nn.cplx.layers.cnet_input_init`, CNet's
  ``CInput`` init over each ``D x N H`` matrix); the core's own under
  ``core`` (PCT's ``core.gate_bias ()``, init ``-log 64``).

  Examples:
    >>> mha = ComplexMultiHeadAttention(4, 2, rngs=nnx.Rngs(0))  # Born core
    >>> x = jax.random.normal(jax.random.key(0), (1, 3, 4), jnp.complex64)
    >>> y = mha(x)
    >>> y.shape, y.dtype, bool(jnp.allclose(mha(x[:, :2]), y[:, :2], atol=1e-6))
    ((1, 3, 4), dtype('complex64'), True)
  """

  def __init__(
    self,
    num_features: int,
    num_heads: int,
    *,
    head_dim: int | None = None,
    attention: str = "born",
    attention_kwargs: Mapping[str, Any] | None = None,
    use_rope: bool = True,
    init: str = "glorot",
    param_dtype: Any = jnp.complex64,
    rngs: nnx.Rngs,
  ):
    """Builds the projections and the core.

    Args:
      num_features: complex model width ``D``.
      num_heads: heads ``N``.
      head_dim: ``H`` (default ``D // N``).
      attention: a complex core's name in `jaxnorm.nn.attention.ATTENTIONS`
        (``dtype_kind="complex"``) with a causal form.
      attention_kwargs: the core's options, over its spec's defaults.
      use_rope: rotate q and k with complex RoPE.
      init: ``"glorot"``, ``"fused_glorot"`` (the PCT) or ``"cnet"``.
      param_dtype: the complex dtype of the projections.
      rngs: parameter RNG streams.

    Raises:
      ValueError: for an attention that is unknown, real-valued or has no
        causal form (the message lists the valid names), bad sizes, or
        options the core does not take.
    """
    who = "ComplexMultiHeadAttention"
    _common.check_parts(
      who,
      layout="tokens",
      causal=True,
      attention=attention,
      dtype_kind="complex",
    )
    _checks.check_positive_int(who, "num_heads", num_heads)
    _checks.check_choice(who, "init", init, ("glorot", "fused_glorot", "cnet"))
    if head_dim is None:
      _checks.check_divisible(
        who, "num_features", num_features, "num_heads", num_heads
      )
      head_dim = num_features // num_heads
    self.attention, self.use_rope = attention, use_rope
    d, n, h = num_features, num_heads, head_dim

    def draw(shape, in_axis, out_axis):
      if init == "cnet":
        return cnet_input_init(rngs.params(), shape, param_dtype)
      return complex_glorot(
        rngs.params(), shape, param_dtype, in_axis=in_axis, out_axis=out_axis
      )

    qkv = ("embed", "heads", "head_dim")
    if init == "fused_glorot":
      # One (D, 3, N, H) Glorot draw: fan-in D, fan-out 3 N H.
      w = draw((d, 3, n, h), 0, (1, 2, 3))
      q, k, v = w[:, 0], w[:, 1], w[:, 2]
    else:
      q, k, v = (draw((d, n, h), 0, (1, 2)) for _ in range(3))
    self.q_kernel = _param.param(q, qkv)
    self.k_kernel = _param.param(k, qkv)
    self.v_kernel = _param.param(v, qkv)
    self.out_kernel = _param.param(
      draw((n, h, d), (0, 1), 2), ("heads", "head_dim", "embed")
    )
    spec = nn_attention.ATTENTIONS[attention]
    self.core = spec.core(
      _base.HeadDims(d, n, n, h),
      is_causal=True,
      param_dtype=param_dtype,
      rngs=rngs,
      **{**spec.defaults(n, h, None), **dict(attention_kwargs or {})},
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Causal mixing of complex ``x (B, T, D)``; returns ``(B, T, D)``."""

    def proj(kernel):
      return jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(x.dtype))

    q, k, v = proj(self.q_kernel), proj(self.k_kernel), proj(self.v_kernel)
    if self.use_rope:
      q, k = cplx.complex_rope(q), cplx.complex_rope(k)
    y = self.core(x, q, k, v)
    return jnp.einsum("btnh,nhd->btd", y, self.out_kernel[...].astype(y.dtype))
