"""The Phase-Coherent Transformer core for `jaxnorm.nn.MultiHeadAttention`.

The maths is `jaxnorm.cplx.pct_attention` (`jaxnorm.cplx.pct`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base
from jaxnorm.nn.cplx import _common


class PCTAttention(_base.AttentionCore):
  """Phase-Coherent Transformer attention, `jaxnorm.cplx.pct_attention`.

  Complex heads, or real pairs with ``real_pairs=True``, as
  `BornAttention`. Parameter: ``gate_bias ()``, one real scalar per layer
  (the real dtype of ``param_dtype``), init ``-log(gate_bias_len)`` (64 in
  the code). Causal form: ``is_causal=True``; masks and additive biases on
  the score.

  Examples:
    >>> from jaxnorm.nn import HeadDims
    >>> core = PCTAttention(HeadDims(2, 1, 1, 2), rngs=nnx.Rngs(0))
    >>> q = k = v = jnp.ones((1, 3, 1, 2), jnp.complex64)  # (B, T, N, H)
    >>> y = core(None, q, k, v)
    >>> y.shape, round(float(core.gate_bias[...]), 4)  # gate bias -log 64
    ((1, 3, 1, 2), -4.1589)

  References:
    Hioki, arXiv:2605.10123 (2026); code
    ``leohio/phase-coherent-transformer-r-d``.
  """

  dtype_kind: ClassVar[str] = "complex"

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    real_pairs: bool = False,
    gate_bias_len: int = 64,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs
    who = type(self).__name__
    if real_pairs:
      _common.even_head(who, dims)
    _checks.check_positive_int(who, "gate_bias_len", gate_bias_len)
    self.is_causal, self.real_pairs = is_causal, real_pairs
    self.options = _base.check_options(
      who, cplx.pct_attention, options, owned=("gate_bias",)
    )
    real_dtype = jnp.finfo(param_dtype).dtype
    self.gate_bias = _param.param(
      jnp.asarray(-math.log(gate_bias_len), real_dtype), ()
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: PCT attention of the heads."""
    del x
    return _common.heads(
      self,
      lambda q, k, v: cplx.pct_attention(
        q,
        k,
        v,
        self.gate_bias[...],
        bias,
        mask,
        is_causal=self.is_causal,
        **dict(self.options),
      ),
      q,
      k,
      v,
    )
