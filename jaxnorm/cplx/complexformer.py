"""ComplexFormer: head-specific complex-vector attention (Shao et al.).

ComplexFormer takes real q, k, v whose head dim is split into halves
``[Re | Im]``. Layouts, masks and dtypes as in `jaxnorm.attention` (see
`jaxnorm.cplx._attention`): ``query (B, T, N, H)`` or unbatched, ``key``,
``value (B, S, K, H)`` with ``N % K == 0``, boolean ``mask`` broadcastable
to ``(B, N, T, S)`` (True attends); statistics in float32 / complex64
(64-bit inputs stay 64-bit), outputs in the query's dtype. No kernel: the
softmax runs in `jaxnorm.attention.dot_product_attention` (XLA).

The paper (arXiv:2505.10222) was withdrawn; the formulas follow the
official code ``shaojintian/complexFormer``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _scope
from jaxnorm import attention as attn
from jaxnorm.attention import _core
from jaxnorm.cplx import _common, basics


def _positions(who, name, p, batch, length, dtype):
  p = jnp.arange(length, dtype=dtype) if p is None else jnp.asarray(p)
  if p.shape == (length,):
    p = p[None]
  if p.shape not in ((1, length), (batch, length)):
    raise ValueError(
      f"{who}: {name} must have shape ({length},) or ({batch}, {length}), "
      f"got {name}.shape={p.shape}"
    )
  return p.astype(dtype)[:, :, None, None]


def _euler_features(x, delta, phase_bias, pos, base, eps, dtype):
  """``[r cos α | r sin α]`` with ``α = δ θ + b + p g`` (per head)."""
  half = x.shape[-1] // 2
  xf = x.astype(dtype)
  re, im = xf[..., :half], xf[..., half:]
  sq = re * re + im * im + eps
  pos_sq = sq > 0
  r = jnp.where(pos_sq, jnp.sqrt(jnp.where(pos_sq, sq, 1.0)), 0.0)
  theta = basics.phase(jax.lax.complex(re, im))
  g = base ** (-jnp.arange(half, dtype=dtype) * 2.0 / x.shape[-1])
  g = g.reshape(1, 1, 1, half)
  alpha = delta * theta + phase_bias + pos * g
  return jnp.concatenate([r * jnp.cos(alpha), r * jnp.sin(alpha)], axis=-1)


def _complexformer_prepare(
  who,
  query,
  key,
  value,
  delta,
  phase_bias,
  positions,
  key_positions,
  base,
  eps,
):
  """The Euler features of q and k (heads repeated to ``N``) and ``v``."""
  d = _core.check_qkv(who, query, key, value)
  if d.head_dim % 2:
    raise ValueError(
      f"{who}: the head dim must be even (split halves [Re | Im]), got "
      f"{jnp.shape(query)=}"
    )
  half = d.head_dim // 2
  for name, p in (("delta", delta), ("phase_bias", phase_bias)):
    _checks.check_floating(who, name, p)
    _checks.check_shape(who, name, p, (d.heads, half), "(num_heads, H/2)")
  q, k = jnp.asarray(query), jnp.asarray(key)
  v = None if value is None else jnp.asarray(value)
  if d.unbatched:
    q, k = q[None], k[None]
    v = None if v is None else v[None]
  dtype = jnp.promote_types(
    _common.real_dtype(_common.complex_dtype(q, k)), jnp.float32
  )
  pq = _positions(who, "positions", positions, d.batch, d.q_len, dtype)
  pk = _positions(who, "key_positions", key_positions, d.batch, d.kv_len, dtype)
  dl = jnp.asarray(delta).astype(dtype)[None, None]
  pb = jnp.asarray(phase_bias).astype(dtype)[None, None]
  fq = _euler_features(q, dl, pb, pq, base, eps, dtype)
  fk = _euler_features(_core.repeat_kv(d, k), dl, 0.0, pk, base, eps, dtype)
  v = None if v is None else _core.repeat_kv(d, v)
  return d, fq, fk, v


@_scope.scoped
def complexformer_logits(
  query: Float[ArrayLike, "B T N H"],
  key: Float[ArrayLike, "B S K H"],
  delta: Float[ArrayLike, "N h"],
  phase_bias: Float[ArrayLike, "N h"],
  *,
  positions: Float[ArrayLike, "B T"] | None = None,
  key_positions: Float[ArrayLike, "B S"] | None = None,
  base: float = 10000.0,
  eps: float = 1e-9,
) -> Float[Array, "B N T S"]:
  r"""ComplexFormer's head-specific complex-vector logits.

  Each head's real ``H`` dims are split halves ``[Re | Im]`` of ``h = H/2``
  complex dims with modulus :math:`r = \sqrt{re^2 + im^2 + \epsilon}` and
  phase :math:`\theta = \mathrm{atan2}(im, re)`:

  .. math::
    \mathrm{logit}_{mn} = \textstyle\sum_j r^q_{mj} r^k_{nj}
      \cos(\delta_j (\theta^q_{mj} - \theta^k_{nj}) + b_j + (p_m - p_n) g_j),
    \quad g_j = \mathrm{base}^{-2j/H}

  with ``delta``, ``phase_bias`` per head. Computed exactly as the real dot
  product of :math:`[r\cos\alpha \mid r\sin\alpha]` features
  (:math:`\alpha_m = \delta\theta^q_m + b + p_m g`, :math:`\beta_n =
  \delta\theta^k_n + p_n g`, :math:`\cos(\alpha - \beta) = \cos\alpha
  \cos\beta + \sin\alpha\sin\beta`), so no ``(T, S, h)`` tensor is built.
  With ``delta = 1``, ``phase_bias = 0`` the logits equal
  ``rope(q) . rope(k)`` (tested). For non-integer ``delta`` the logit jumps
  where a phase crosses ``±π`` (as in the official code).

  Deviations from the official code (quirks not copied): ``g`` and the
  scores are float32 here, not bfloat16; queries are not chunked (the
  chunks of 8 are a memory device). Positions: ``positions`` are the query
  positions (default ``arange(T)``; a KV cache offsets them by the cache
  length), ``key_positions`` those of the keys (default ``arange(S)``).

  Unverified: the paper (arXiv:2505.10222) was withdrawn (v2 is empty);
  only its abstract (a per-head Euler transform and the rotation
  :math:`\exp[i(\mathrm{Adapt}(AS) + \Delta(P))]`) was read; the formula is
  the author's repository.

  Args:
    query: real ``(B, T, N, H)`` (or unbatched), even ``H``.
    key: real ``(B, S, K, H)``.
    delta: ``(N, H/2)`` semantic-angle gains (code init
      ``N(0, (H/2)^{-1/2})``).
    phase_bias: ``(N, H/2)`` (init 0).
    positions: query positions ``(B, T)`` or ``(T,)``.
    key_positions: key positions ``(B, S)`` or ``(S,)``.
    base: frequency base.
    eps: inside the modulus' square root.

  Returns:
    Real ``(B, N, T, S)`` logits (float32, or float64).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for mismatched shapes or an odd head dim.

  Examples:
    >>> q = k = jnp.array([1.0, 0.0]).reshape(1, 1, 1, 2)  # one complex dim: 1
    >>> zero = jnp.zeros((1, 1))
    >>> lg = cplx.complexformer_logits(q, k, zero, zero)
    >>> print(np.asarray(lg[0, 0]).round(4))  # r^q r^k cos(0)
    [[1.]]

  References:
    Shao et al., *ComplexFormer: Disruptively Advancing Transformer
    Inference Ability via Head-Specific Complex Vector Attention*,
    arXiv:2505.10222 (2025, withdrawn); code ``shaojintian/complexFormer``.
  """
  who = "complexformer_logits"
  d, fq, fk, _ = _complexformer_prepare(
    who,
    query,
    key,
    None,
    delta,
    phase_bias,
    positions,
    key_positions,
    base,
    eps,
  )
  logits = jnp.einsum("btnh,bsnh->bnts", fq, fk)
  return logits[0] if d.unbatched else logits


@_scope.scoped
def complexformer_attention(
  query: Float[ArrayLike, "B T N H"],
  key: Float[ArrayLike, "B S K H"],
  value: Float[ArrayLike, "B S K Hv"],
  delta: Float[ArrayLike, "N h"],
  phase_bias: Float[ArrayLike, "N h"],
  bias: Float[ArrayLike, "B N T S"] | None = None,
  mask: Bool[ArrayLike, "B N T S"] | None = None,
  *,
  is_causal: bool = False,
  scale: float = 1.0,
  positions: Float[ArrayLike, "B T"] | None = None,
  key_positions: Float[ArrayLike, "B S"] | None = None,
  base: float = 10000.0,
  eps: float = 1e-9,
) -> Float[Array, "B T N Hv"]:
  r"""ComplexFormer attention: softmax over `complexformer_logits` times V.

  :math:`\mathrm{out} = \mathrm{softmax}(s \cdot \mathrm{logit} + b +
  \mathrm{mask})\, v` with real ``v``; the official code has no
  :math:`1/\sqrt d`, hence ``scale=1.0``. Runs
  `jaxnorm.attention.dot_product_attention` on the Euler features (same
  masks, causal form, fully-masked-row convention). With ``delta = 1``,
  ``phase_bias = 0`` it equals ``dot_product_attention(rope(q), rope(k), v,
  scale=1.0)``.

  Args:
    query: real ``(B, T, N, H)`` (or unbatched), even ``H``.
    key: real ``(B, S, K, H)``.
    value: real ``(B, S, K, Hv)``.
    delta: ``(N, H/2)``, see `complexformer_logits`.
    phase_bias: ``(N, H/2)``.
    bias: additive logits bias, broadcastable to ``(B, N, T, S)``.
    mask: boolean mask, broadcastable to ``(B, N, T, S)``.
    is_causal: lower-triangular mask.
    scale: logit scale.
    positions: query positions, see `complexformer_logits`.
    key_positions: key positions.
    base: frequency base.
    eps: inside the modulus' square root.

  Returns:
    ``(B, T, N, Hv)`` in ``query``'s dtype.

  Raises:
    TypeError: for non-floating inputs or a non-boolean mask.
    ValueError: for mismatched shapes or an odd head dim.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 2))  # equal logits
    >>> v = jnp.array([1.0, 3.0]).reshape(1, 2, 1, 1)
    >>> zero = jnp.zeros((1, 1))
    >>> out = cplx.complexformer_attention(q, k, v, zero, zero, is_causal=True)
    >>> print(np.asarray(out[0, :, 0, 0]))
    [1. 2.]

  References:
    Shao et al., arXiv:2505.10222 (2025, withdrawn); code
    ``shaojintian/complexFormer``.
  """
  who = "complexformer_attention"
  d, fq, fk, v = _complexformer_prepare(
    who,
    query,
    key,
    value,
    delta,
    phase_bias,
    positions,
    key_positions,
    base,
    eps,
  )
  if d.unbatched:
    bias = None if bias is None else jnp.asarray(bias)[None]
    mask = None if mask is None else jnp.asarray(mask)[None]
  out = attn.dot_product_attention(
    fq,
    fk,
    v,
    bias,
    mask,
    scale=scale,
    is_causal=is_causal,
    implementation="xla",
  )
  out = out.astype(jnp.asarray(query).dtype)
  return out[0] if d.unbatched else out
