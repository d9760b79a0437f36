"""Phase-Coherent Transformer (PCT) attention and its gates (Hioki).

PCT attention takes complex q, k, v (``H`` complex dims). Layouts,
masks and dtypes as in `jaxnorm.attention` (see `jaxnorm.cplx._attention`):
``query (B, T, N, H)`` or unbatched, ``key``, ``value (B, S, K, H)`` with
``N % K == 0``, boolean ``mask`` broadcastable to ``(B, N, T, S)`` (True
attends); statistics in float32 / complex64 (64-bit inputs stay 64-bit),
outputs in the query's dtype. Pallas has no complex support: there is no
kernel.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Complex, Float

from jaxnorm import _checks, _scope
from jaxnorm.attention import _core
from jaxnorm.cplx import _attention, _common, basics, norms


def _cubic(z: jax.Array) -> jax.Array:
  return z + z**3 / 6.0


PCT_GATES: Mapping[str, Callable[[jax.Array], jax.Array]] = (
  types.MappingProxyType(
    {
      "sigmoid": jax.nn.sigmoid,
      "tanh1": lambda z: jnp.tanh(z) + 1.0,
      "relu": jax.nn.relu,
      "clamped_relu": lambda z: jnp.clip(z, 0.0, 1.0),
      "softplus": jax.nn.softplus,
      "cubic": _cubic,
    }
  )
)
"""PCT gate name -> elementwise real gate. ``sigmoid`` is the PCT; the others
are the paper's condition ablations (C1 real, C2 bounded, C3 smooth with a
non-zero gradient on the negative side, C4 elementwise): ``tanh1`` keeps all
four, ``relu``/``clamped_relu`` delete negatively aligned phases, ``softplus``
and ``cubic`` are unbounded."""


def _pct_chunk(d, qn, kn, v, gate_bias, bias, allowed, gate, dtype, cdt):
  d2 = d._replace(head_dim=2 * d.head_dim, q_len=qn.shape[1])
  s = _core.raw_logits(
    d2, basics.to_real(qn), basics.to_real(kn), math.sqrt(d.head_dim), dtype
  )
  s = s + gate_bias
  if bias is not None:
    s = s + bias.astype(dtype)
  a = PCT_GATES[gate](s)
  if allowed is not None:
    a = jnp.where(allowed, a, 0.0)
  return _core.apply_weights(d2, a, v, cdt)


@_scope.scoped
def pct_attention(
  query: Complex[ArrayLike, "B T N H"],
  key: Complex[ArrayLike, "B S K H"],
  value: Complex[ArrayLike, "B S K Hv"],
  gate_bias: Float[ArrayLike, ""],
  bias: Float[ArrayLike, "B N T S"] | None = None,
  mask: Bool[ArrayLike, "B N T S"] | None = None,
  *,
  is_causal: bool = False,
  gate: str = "sigmoid",
  eps: float = 1e-8,
  chunk_size: int | None = None,
) -> Complex[Array, "B T N Hv"]:
  r"""Phase-Coherent Transformer attention: a smooth gate, no competition.

  .. math::
    \bar q = q / \sqrt{\textstyle\sum|q|^2 + \epsilon},\ \bar k \text{ alike},
    \quad s_{ij} = \sqrt H\, \mathrm{Re} \textstyle\sum_d \bar q^*_{id}
      \bar k_{jd} \in [-\sqrt H, \sqrt H],\quad
    o_i = \textstyle\sum_j \mathrm{gate}(s_{ij} + b)\, v_j

  Real weights on complex values, no row normalization (rows do not sum to
  1). ``gate_bias`` ``b`` is one real scalar per layer, shared by the heads
  (init ``-log 64`` in the code, a constant, not the runtime length). The
  weights are invariant to a common phase on q and k. ``bias`` is added to
  ``s`` before the gate. ``chunk_size`` computes the queries in chunks (a
  memory device; equal to the unchunked result).

  Deviation: the code masks with ``s = -1e9`` before the gate; here a
  masked weight is set to exactly 0 after it, the same for the saturating
  gates and the only sound choice for ``cubic`` (whose value at ``-1e9``
  is ``-inf``).

  Unverified: the paper body (arXiv:2605.10123) was not retrievable; the
  abstract gives the idea and the form is the author's code
  (``ComplexMultiHeadSigmoidAttention``).

  Args:
    query: complex ``(B, T, N, H)`` (or unbatched).
    key: complex ``(B, S, K, H)``.
    value: complex ``(B, S, K, Hv)``.
    gate_bias: real scalar ``b``.
    bias: real additive bias on ``s``, broadcastable to ``(B, N, T, S)``.
    mask: boolean, broadcastable to ``(B, N, T, S)``.
    is_causal: lower-triangular mask.
    gate: a `PCT_GATES` name.
    eps: inside the L2 norms of q and k.
    chunk_size: query chunk length dividing ``T``, or None.

  Returns:
    Complex ``(B, T, N, Hv)`` in ``query``'s dtype.

  Raises:
    TypeError: for non-complex q/k/v, a non-real bias or a non-boolean
      mask.
    ValueError: for mismatched shapes, an unknown gate, a non-scalar
      ``gate_bias`` or a chunk size that does not divide ``T``.

  Examples:
    >>> q = k = jnp.ones((1, 2, 1, 1), jnp.complex64)  # s = sqrt(H) = 1
    >>> v = jnp.array([1 + 0j, 1j]).reshape(1, 2, 1, 1)
    >>> out = cplx.pct_attention(q, k, v, jnp.array(-1.0))  # sigmoid(1 - 1)
    >>> print(np.asarray(out[0, :, 0, 0]).round(4))  # no normalization
    [0.5+0.5j 0.5+0.5j]

  References:
    Hioki, *Complex-Valued Phase-Coherent Transformer*, arXiv:2605.10123
    (2026); code ``leohio/phase-coherent-transformer-r-d``.
  """
  who = "pct_attention"
  d, q, k, v, bias, mask = _attention.prepare(
    who, query, key, value, bias, mask
  )
  _checks.check_choice(who, "gate", gate, tuple(PCT_GATES))
  _common.check_real(who, "gate_bias", gate_bias)
  _checks.check_scalar(who, "gate_bias", gate_bias)
  if chunk_size is not None:
    _checks.check_positive_int(who, "chunk_size", chunk_size)
    _checks.check_divisible(who, "T", d.q_len, "chunk_size", chunk_size)
  cdt = _common.complex_dtype(q, k, v)
  dtype = _common.real_dtype(cdt)
  qn = norms.complex_l2_normalize(q.astype(cdt), eps=eps)
  kn = norms.complex_l2_normalize(k.astype(cdt), eps=eps)
  b = jnp.asarray(gate_bias).astype(dtype).reshape(())
  allowed = _core.allowed_mask(d, mask, is_causal)
  chunk = d.q_len if chunk_size is None else chunk_size
  outs = []
  for start in range(0, d.q_len, chunk):
    rows = slice(start, start + chunk)

    def part(t: Any, rows=rows):
      return t if t is None or t.shape[2] == 1 else t[:, :, rows]

    outs.append(
      _pct_chunk(
        d, qn[:, rows], kn, v, b, part(bias), part(allowed), gate, dtype, cdt
      )
    )
  out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
  return _core.finish(d, out, jnp.asarray(query).dtype)
