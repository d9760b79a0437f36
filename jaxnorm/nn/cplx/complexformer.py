"""ComplexFormer's attention core for `jaxnorm.nn.MultiHeadAttention`.

The maths is `jaxnorm.cplx.complexformer_attention`
(`jaxnorm.cplx.complexformer`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import cplx
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base
from jaxnorm.nn.cplx import _common
from jaxnorm.nn.cplx.layers import _zeros


class ComplexFormerAttention(_base.AttentionCore):
  """ComplexFormer attention, `jaxnorm.cplx.complexformer_attention`.

  Parameters: ``delta (N, H/2)``, init ``N(0, (H/2)^{-1/2})``, and
  ``phase_bias (N, H/2)``, init 0 (the official code's init); not decayed.
  The core applies its own relative rotation: build the attention without
  RoPE. Causal form: ``is_causal=True``; masks and biases as softmax.

  Examples:
    >>> from jaxnorm.nn import HeadDims
    >>> core = ComplexFormerAttention(HeadDims(4, 1, 1, 4), rngs=nnx.Rngs(0))
    >>> q = k = v = jnp.ones((1, 3, 1, 4))  # real heads (B, T, N, H)
    >>> core(None, q, k, v).shape, core.delta[...].shape  # delta (N, H / 2)
    ((1, 3, 1, 4), (1, 2))

  References:
    Shao et al., arXiv:2505.10222 (2025, withdrawn); code
    ``shaojintian/complexFormer``.
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _common.even_head(who, dims)
    self.is_causal = is_causal
    self.options = _base.check_options(
      who,
      cplx.complexformer_attention,
      options,
      owned=("positions", "key_positions"),
    )
    half = dims.head_dim // 2
    std = half**-0.5
    self.delta = _param.param(
      std
      * jax.random.normal(rngs.params(), (dims.num_heads, half), param_dtype),
      ("heads", None),
    )
    self.phase_bias = _zeros(
      (dims.num_heads, half), param_dtype, ("heads", None)
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: ComplexFormer attention."""
    del x
    return cplx.complexformer_attention(
      q,
      k,
      v,
      _base.cast_param(self.delta, q),
      _base.cast_param(self.phase_bias, q),
      bias,
      mask,
      is_causal=self.is_causal,
      **dict(self.options),
    )
