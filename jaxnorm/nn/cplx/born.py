"""CNet's Born attention core for `jaxnorm.nn.MultiHeadAttention`.

The maths is `jaxnorm.cplx.born_attention` (`jaxnorm.cplx.born`).
"""

from __future__ import annotations

import jax

from jaxnorm import cplx
from jaxnorm.nn.cplx import _common


class BornAttention(_common.FunctionCore):
  """CNet Born attention, `jaxnorm.cplx.born_attention`.

  Complex-valued (``dtype_kind = "complex"``): the heads ``q, k, v (B, T,
  N, H)`` are complex, as `MultiHeadAttention` projects them with a complex
  ``param_dtype`` from a complex input. With ``real_pairs=True`` the real
  heads ``(B, T, N, 2h)`` are read as complex ``(B, T, N, h)`` split halves
  and the output returns as ``[Re | Im]`` (a real projection of a real
  input is a widely-linear complex projection). Takes boolean masks, not
  additive biases (Born weights have no logits). Causal form:
  ``is_causal=True``. No parameters.

  Examples:
    >>> from flax import nnx
    >>> from jaxnorm.nn import HeadDims
    >>> core = BornAttention(HeadDims(1, 1, 1, 1), rngs=nnx.Rngs(0))
    >>> q = k = jax.numpy.ones((1, 3, 1, 1), "complex64")  # equal scores
    >>> v = jax.numpy.array([1, 3, 5], "complex64").reshape(1, 3, 1, 1)
    >>> [round(abs(z), 4) for z in core(None, q, k, v).reshape(-1).tolist()]
    [3.0, 3.0, 3.0]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``).
  """

  function = staticmethod(cplx.born_attention)

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: Born attention of the heads."""
    del x
    if bias is not None:
      raise ValueError(
        f"{type(self).__name__}: Born attention has no logits, so it takes "
        "no additive bias; pass a boolean mask instead"
      )
    return _common.heads(
      self,
      lambda q, k, v: cplx.born_attention(
        q, k, v, mask, is_causal=self.is_causal, **dict(self.options)
      ),
      q,
      k,
      v,
    )
