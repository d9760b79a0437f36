"""Complex softmax attention: the softmax of the real part of ``q^H k``.

Complex softmax attention takes complex q, k, v (``H`` complex dims).
Layouts, masks and dtypes as in `jaxnorm.attention` (see
`jaxnorm.cplx._attention`): ``query (B, T, N, H)`` or unbatched, ``key``,
``value (B, S, K, H)`` with ``N % K == 0``, boolean ``mask`` broadcastable
to ``(B, N, T, S)`` (True attends), real additive ``bias``; statistics in
float32 / complex64 (64-bit inputs stay 64-bit), outputs in the query's
dtype. Pallas has no complex support: there is no kernel.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Complex, Float

from jaxnorm import _scope
from jaxnorm.attention import _core, softmax
from jaxnorm.cplx import _attention, _common, basics


@_scope.scoped
def complex_softmax_attention(
  query: Complex[ArrayLike, "B T N H"],
  key: Complex[ArrayLike, "B S K H"],
  value: Complex[ArrayLike, "B S K Hv"],
  bias: Float[ArrayLike, "B N T S"] | None = None,
  mask: Bool[ArrayLike, "B N T S"] | None = None,
  *,
  is_causal: bool = False,
) -> Complex[Array, "B T N Hv"]:
  r"""Complex softmax attention (Eilers' ℂAtt, the PCT's complex baseline).

  .. math::
    A = \mathrm{softmax}\big(\mathrm{Re}(q k^H)/\sqrt H + b\big),\qquad
    o_i = \textstyle\sum_j A_{ij}\, v_j

  Real softmax weights on complex values; ``H`` is the number of complex
  dims. ``Re(q^H k)`` is the real dot product of the split halves ``[Re |
  Im]``, so this is `jaxnorm.attention.dot_product_attention` (the ``"xla"``
  reference) on `to_real` views with scale ``1/sqrt(H)``; a fully masked
  row returns the mean of ``value``, as there. Causal form: ``is_causal``.
  The weights are invariant to a common phase on q and k.

  Unverified: the paper (arXiv:2306.09827) was not read here; the form is
  the complex baseline of the PCT code.

  Args:
    query: complex ``(B, T, N, H)`` (or unbatched).
    key: complex ``(B, S, K, H)``.
    value: complex ``(B, S, K, Hv)``.
    bias: real additive bias on the logits, broadcastable to ``(B, N, T,
      S)``.
    mask: boolean, broadcastable to ``(B, N, T, S)``.
    is_causal: lower-triangular mask.

  Returns:
    Complex ``(B, T, N, Hv)`` in ``query``'s dtype.

  Raises:
    TypeError: for non-complex q/k/v, a non-real bias or a non-boolean
      mask.
    ValueError: for mismatched shapes.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 1), jnp.complex64)
    >>> v = jnp.array([1 + 0j, 1j]).reshape(1, 2, 1, 1)
    >>> out = cplx.complex_softmax_attention(q, k, v, is_causal=True)
    >>> print(np.asarray(out[0, :, 0, 0]))
    [1. +0.j  0.5+0.5j]

  References:
    Eilers & Jiang, *Building Blocks for a Complex-Valued Transformer
    Architecture*, arXiv:2306.09827 (2023); Hioki, *Complex-Valued
    Phase-Coherent Transformer*, arXiv:2605.10123 (2026) (the baseline).
  """
  d, q, k, v, bias, mask = _attention.prepare(
    "complex_softmax_attention", query, key, value, bias, mask
  )
  cdt = _common.complex_dtype(q, k, v)
  q, k, v = (basics.to_real(a.astype(cdt)) for a in (q, k, v))
  out = softmax.dot_product_attention(
    q,
    k,
    v,
    None if bias is None else bias.astype(q.dtype),
    mask,
    scale=1.0 / math.sqrt(d.head_dim),
    is_causal=is_causal,
    implementation="xla",
  )
  return _core.finish(d, basics.to_complex(out), jnp.asarray(query).dtype)
