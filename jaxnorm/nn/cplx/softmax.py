"""The complex softmax attention core for `jaxnorm.nn.MultiHeadAttention`.

The maths is `jaxnorm.cplx.complex_softmax_attention`
(`jaxnorm.cplx.softmax`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import cplx
from jaxnorm.nn.attention import _base
from jaxnorm.nn.cplx import _common


class ComplexSoftmaxAttention(_base.AttentionCore):
  """Complex softmax attention, `jaxnorm.cplx.complex_softmax_attention`.

  Complex heads, or real pairs with ``real_pairs=True``, as
  `BornAttention`. Causal form: ``is_causal=True``; boolean masks and real
  additive biases on the logits. No parameters.

  References:
    Eilers & Jiang, arXiv:2306.09827 (2023).
  """

  dtype_kind: ClassVar[str] = "complex"

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    real_pairs: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del param_dtype, rngs
    who = type(self).__name__
    if real_pairs:
      _common.even_head(who, dims)
    self.is_causal, self.real_pairs = is_causal, real_pairs
    self.options = _base.check_options(
      who, cplx.complex_softmax_attention, options
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: complex softmax attention of the heads."""
    del x
    return _common.heads(
      self,
      lambda q, k, v: cplx.complex_softmax_attention(
        q, k, v, bias, mask, is_causal=self.is_causal, **dict(self.options)
      ),
      q,
      k,
      v,
    )
