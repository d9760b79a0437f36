"""The complex softmax attention core for `jaxnorm.nn.MultiHeadAttention`.

The maths is `jaxnorm.cplx.complex_softmax_attention`
(`jaxnorm.cplx.softmax`).
"""

from __future__ import annotations

import jax

from jaxnorm import cplx
from jaxnorm.nn.cplx import _common


class ComplexSoftmaxAttention(_common.FunctionCore):
  """Complex softmax attention, `jaxnorm.cplx.complex_softmax_attention`.

  Complex heads, or real pairs with ``real_pairs=True``, as
  `BornAttention`. Causal form: ``is_causal=True``; boolean masks and real
  additive biases on the logits. No parameters.

  Examples:
    >>> from flax import nnx
    >>> from jaxnorm.nn import HeadDims
    >>> core = ComplexSoftmaxAttention(HeadDims(1, 1, 1, 1), is_causal=True,
    ...                                rngs=nnx.Rngs(0))
    >>> q = k = jax.numpy.ones((1, 3, 1, 1), "complex64")  # equal scores
    >>> v = jax.numpy.array([1, 3, 5], "complex64").reshape(1, 3, 1, 1)
    >>> [round(abs(z), 4) for z in core(None, q, k, v).reshape(-1).tolist()]
    [1.0, 2.0, 3.0]

  References:
    Eilers & Jiang, arXiv:2306.09827 (2023).
  """

  function = staticmethod(cplx.complex_softmax_attention)

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
