"""MXFP4 fake quantization and MXAttention."""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from jaxnorm import _checks, _scope
from jaxnorm.attention import _core

_UOS_QMAX: float = 7.25


def mxfp4_scale_exponent(
  amax: Float[Array, "..."],
  *,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = _UOS_QMAX,
) -> jax.Array:
  r"""The E8M0 block exponent ``e`` (scale ``2**e``) for block max ``amax``.

  * ``"ocp_floor"`` (OCP MX v1.0): :math:`e = \lfloor\log_2 \mathrm{amax}
    \rfloor - 2`, so ``amax / 2**e`` lies in ``[4, 8)`` and values above 6
    saturate.
  * ``"qmax"`` (UOS with ``qmax = 7.25``): the smallest ``e`` with
    ``amax <= qmax * 2**e``, i.e. :math:`\lceil\log_2(\mathrm{amax}/Q_{max})
    \rceil`, so ``amax / 2**e`` lies in ``(qmax/2, qmax]``. ``qmax = 6``
    never clips.

  Exponents are exact (from `jnp.frexp` and exact comparisons, never by
  casting to ``float8_e8m0fnu``, which rounds), clamped to ``[-127, 127]``;
  ``amax = 0`` gives ``-127``.

  Returns:
    int32 exponents of ``amax.shape``.

  Raises:
    ValueError: on an unknown ``scale_rule`` or ``qmax <= 0``.
  """
  who = "mxfp4_scale_exponent"
  _checks.check_choice(who, "scale_rule", scale_rule, ("qmax", "ocp_floor"))
  if not qmax > 0:
    raise ValueError(f"{who}: qmax must be > 0, got {qmax=}")
  amax = jnp.asarray(amax, jnp.float32)
  pos = amax > 0
  safe = jnp.where(pos, amax, 1.0)
  if scale_rule == "ocp_floor":
    _, p = jnp.frexp(safe)
    e = p - 3
  else:
    _, p = jnp.frexp(safe / qmax)
    e = p  # amax/qmax < 2**p, so e = p or p - 1 (or p - 2 after rounding).
    for _ in range(2):
      e = jnp.where(safe <= jnp.ldexp(jnp.float32(qmax), e - 1), e - 1, e)
    e = jnp.where(safe > jnp.ldexp(jnp.float32(qmax), e), e + 1, e)
  e = jnp.where(pos, e, -127)
  return jnp.clip(e, -127, 127).astype(jnp.int32)


@_scope.scoped
def mxfp4_quantize(
  x: Float[Array, "..."],
  *,
  axis: int = -1,
  block_size: int = 32,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = _UOS_QMAX,
  straight_through: bool = True,
) -> Float[Array, "..."]:
  r"""MXFP4 fake quantization: E2M1 elements with a shared E8M0 block scale.

  .. math:: \hat x = 2^{e} \cdot \mathrm{E2M1}(x / 2^{e})

  over blocks of ``block_size`` consecutive elements along ``axis`` (the
  matmul's contraction axis), with ``e`` from `mxfp4_scale_exponent` on the
  block's max ``|x|``. E2M1 rounds to nearest, ties to even, and saturates
  at ±6 (a cast through ``jnp.float4_e2m1fn``, identical to
  ``ml_dtypes.float4_e2m1fn``). A ragged last block is zero-padded (zeros do
  not change ``amax``). With ``straight_through`` the gradient is the
  identity (:math:`x + \mathrm{sg}(\hat x - x)`); the exponent gets none.

  Args:
    x: any shape, floating.
    axis: the blocked axis.
    block_size: elements per scale (MX: 32).
    scale_rule: ``"qmax"`` (UOS, default) or ``"ocp_floor"``.
    qmax: UOS boundary (7.25 for E2M1).
    straight_through: use the straight-through estimator.

  Returns:
    ``x.shape`` in ``x.dtype``.

  Raises:
    ValueError: on a bad axis, block size or option.
    TypeError: if ``x`` is not floating.

  Examples:
    >>> x = jnp.array([0.3, -1.7, 6.0, 2.2])  # one block, max 6: scale 1
    >>> print(np.asarray(attention.mxfp4_quantize(x, block_size=4)))
    [ 0.5 -1.5  6.   2. ]

  References:
    OCP, *Microscaling Formats (MX) v1.0 Specification* (2023); Yu et al.,
    *MXAttention: Data-Free Optimal Scaling and Pre-Normalization
    Quantization for MXFP4 Attention*, arXiv:2607.24377 (2026).
  """
  who = "mxfp4_quantize"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_positive_int(who, "block_size", block_size)
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  xf = jnp.moveaxis(x.astype(jnp.float32), ax, -1)
  n = xf.shape[-1]
  nb = -(-n // block_size)
  pad = nb * block_size - n
  xp = jnp.pad(xf, [(0, 0)] * (xf.ndim - 1) + [(0, pad)])
  blocks = xp.reshape(*xf.shape[:-1], nb, block_size)
  amax = jax.lax.stop_gradient(jnp.max(jnp.abs(blocks), axis=-1))
  e = mxfp4_scale_exponent(amax, scale_rule=scale_rule, qmax=qmax)[..., None]
  scaled = jnp.ldexp(jax.lax.stop_gradient(blocks), -e)
  q = scaled.astype(jnp.float4_e2m1fn).astype(jnp.float32)
  deq = jnp.ldexp(q, e).reshape(xp.shape)[..., :n]
  deq = jnp.moveaxis(deq, -1, ax)
  xc = x.astype(jnp.float32)
  if straight_through:
    deq = xc + jax.lax.stop_gradient(deq - xc)
  return deq.astype(x.dtype)


def hadamard_rotation(
  dim: int,
  *,
  signs: Literal["random_sign", "plain"] = "random_sign",
  seed: int = 1234,
) -> Float[Array, "dim dim"]:
  r"""The orthogonal rotation :math:`R = \mathrm{diag}(s) H_d / \sqrt d`.

  :math:`H_d` is the Sylvester Walsh-Hadamard matrix; ``s`` is all ones
  (``"plain"``) or random ±1 drawn from ``jax.random.key(seed)``. MXAttention
  applies the same ``R`` to queries and keys, which leaves :math:`QK^T`
  unchanged and spreads outliers across a block. Deviation: the official code
  draws the signs with torch's generator (seed 1234), so the sign pattern
  differs; any fixed pattern is orthogonal.

  Raises:
    ValueError: if ``dim`` is not a power of two, or on a bad option.
  """
  who = "hadamard_rotation"
  _checks.check_positive_int(who, "dim", dim)
  _checks.check_choice(who, "signs", signs, ("random_sign", "plain"))
  if dim & (dim - 1):
    raise ValueError(f"{who}: dim must be a power of two, got {dim=}")
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < dim:  # Sylvester construction, static in dim.
    h = np.block([[h, h], [h, -h]])
  h = jnp.asarray(h)
  h = h / math.sqrt(dim)
  if signs == "plain":
    return h
  s = jax.random.rademacher(jax.random.key(seed), (dim,), jnp.float32)
  return s[:, None] * h


@_scope.scoped
def mxfp4_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  quantize_qkv: bool = True,
  p_quant: Literal["pnq", "direct", "none"] = "pnq",
  l_source: Literal["quantized", "float"] = "quantized",
  hadamard: Literal["random_sign", "plain"] | None = "random_sign",
  hadamard_seed: int = 1234,
  scale_rule: Literal["qmax", "ocp_floor"] = "qmax",
  qmax: float = _UOS_QMAX,
  block_size: int = 32,
  value_blocks: Literal["keys", "features"] | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""MXAttention: softmax attention with MXFP4 fake quantization.

  1. Rotate (``hadamard``): :math:`Q \leftarrow QR`, :math:`K \leftarrow KR`.
  2. Quantize (``quantize_qkv``) Q and K in blocks along the head dim and V
     along the key axis (``value_blocks="keys"``, the official code) or along
     its head dim (``"features"``) (`mxfp4_quantize`, UOS scale with
     ``qmax = 7.25``).
  3. :math:`S = \hat Q \hat K^T s + b` (masked), then by ``p_quant``:

     * ``"pnq"`` (pre-normalization quantization, the paper's method):
       :math:`\tilde P = \exp(S - m_i)` with the row max :math:`m_i`,
       :math:`\hat P = Q_4(\tilde P)` in blocks along keys, and
       :math:`O = \hat P \hat V / \ell` with
       :math:`\ell = \mathrm{rowsum}(\hat P)` (``l_source="quantized"``, so
       the effective weights sum to exactly 1) or
       :math:`\mathrm{rowsum}(\tilde P)` (``"float"``, the mismatch
       ablation);
     * ``"direct"``: :math:`O = Q_4(\mathrm{softmax}(S))\,\hat V`;
     * ``"none"``: :math:`O = \mathrm{softmax}(S)\,\hat V`.

  This is the materialized one-tile reference: a tiled kernel agrees only
  approximately (the quantized tiles depend on the running max). All
  quantizers are straight-through, so gradients flow through the weights the
  forward actually used. Fully masked rows give 0 under ``"pnq"`` and the mean
  of V otherwise (softmax convention).

  Causal mode: with ``is_causal=True`` (the default ``value_blocks=None``
  then means ``"features"``), V is scaled per token, in blocks of
  ``block_size`` along its head dim, so no output at ``t`` depends on a
  token after ``t``. Blocking V along the keys (the official non-causal
  layout for video diffusion, where ``P V`` contracts over keys) shares one
  scale among 32 consecutive tokens, so a later token's magnitude changes
  the quantized values of earlier ones. This is also what an MXFP4 KV cache
  does in a decoder: each token's K and V rows are quantized once when
  written, with per-token blocks along the head dim, and never re-scaled by
  later tokens. Q and K are blocked along the head dim in both modes, and
  P's blocks (along keys, within one query row) only see the allowed keys,
  so they are causal already. Deviation: MindIE-SD pads sequences to
  a multiple of 512 with keys that join the softmax; jaxnorm masks instead.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.
    quantize_qkv: fake-quantize Q, K and V.
    p_quant: ``"pnq"``, ``"direct"`` or ``"none"``.
    l_source: PNQ row-sum source, ``"quantized"`` or ``"float"``.
    hadamard: ``"random_sign"``, ``"plain"`` or None (needs a power-of-two
      ``H``).
    hadamard_seed: seed of the random signs.
    scale_rule: ``"qmax"`` or ``"ocp_floor"``.
    qmax: UOS boundary.
    block_size: MX block size.
    value_blocks: V's blocked axis, ``"keys"`` (official) or ``"features"``
      (causal, per token); None picks ``"features"`` under ``is_causal``
      and ``"keys"`` otherwise.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or options.
    TypeError: on non-floating inputs or a non-boolean mask.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 32))  # one MX block of 32 per head
    >>> v = jnp.full((1, 2, 1, 32), 0.3)  # 0.3 * 2**4 = 4.8 rounds to 4
    >>> out = attention.mxfp4_attention(q, k, v, hadamard=None)
    >>> print(np.asarray(out[0, :, 0, :3]))
    [[0.25 0.25 0.25]
     [0.25 0.25 0.25]]

  References:
    Yu et al., arXiv:2607.24377 (2026); OCP MX v1.0 (2023).
  """
  who = "mxfp4_attention"
  _checks.check_choice(who, "p_quant", p_quant, ("pnq", "direct", "none"))
  _checks.check_choice(who, "l_source", l_source, ("quantized", "float"))
  _checks.check_choice(
    who, "hadamard", hadamard, ("random_sign", "plain", None)
  )
  _checks.check_choice(
    who, "value_blocks", value_blocks, ("keys", "features", None)
  )
  d, q, k, v, bias, mask = _core.prepare(who, query, key, value, bias, mask)
  dtype = jnp.float32
  q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
  if hadamard is not None:
    r = hadamard_rotation(d.head_dim, signs=hadamard, seed=hadamard_seed)
    q, k = q @ r, k @ r
  quant = functools.partial(
    mxfp4_quantize, block_size=block_size, scale_rule=scale_rule, qmax=qmax
  )
  if value_blocks is None:
    value_blocks = "features" if is_causal else "keys"
  if quantize_qkv:
    v_axis = 1 if value_blocks == "keys" else -1
    q, k, v = quant(q, axis=-1), quant(k, axis=-1), quant(v, axis=v_axis)
  allowed = _core.allowed_mask(d, mask, is_causal)
  logits = _core.masked_logits(
    d, q, k, bias, allowed, _core.default_scale(d, scale), dtype
  )
  if p_quant == "pnq":
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    p = jnp.exp(logits - m)
    if allowed is not None:
      p = jnp.where(allowed, p, 0.0)
    ph = quant(p, axis=-1)
    src = ph if l_source == "quantized" else p
    den = jnp.sum(src, axis=-1, keepdims=True)
    w = ph / jnp.where(den > 0, den, 1.0)
  else:
    w = jax.nn.softmax(logits, axis=-1)
    if p_quant == "direct":
      w = quant(w, axis=-1)
  return _core.finish(d, _core.apply_weights(d, w, v, dtype), query.dtype)
