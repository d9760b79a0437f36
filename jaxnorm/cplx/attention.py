"""Complex attention: Born rule (CNet), ComplexFormer, PCT gates, Fourier mix.

Layouts follow `jaxnorm.attention`: ``query (B, T, N, H)`` (or unbatched
``(T, N, H)``), ``key``/``value`` ``(B, S, K, H)`` with ``N % K == 0``
(grouped-query), boolean ``mask`` broadcastable to ``(B, N, T, S)`` (True
attends), ``is_causal`` lets query ``i`` see keys ``j <= i``. Born and PCT
attention take complex q, k, v (``H`` complex dims); ComplexFormer takes
real q, k, v whose head dim is split into halves ``[Re | Im]``. Statistics
in float32 / complex64 (64-bit inputs stay 64-bit); outputs in the query's
dtype. Pallas has no complex support: there is no kernel here.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Complex, Float, Int

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.attention import _core
from jaxnorm.cplx import _common, basics, norms

# The forward clamps of CNet's Born cross-entropy (``SequenceCrossEntropy``).
_BORN_TINY = 1e-15


def _prepare(who, query, key, value, bias, mask):
  """`jaxnorm.attention._core.prepare` for complex q, k, v."""
  arrays = [("query", query), ("key", key)]
  if value is not None:
    arrays.append(("value", value))
  for name, a in arrays:
    _common.check_complex(who, name, a)
  # Shapes only: the real layout checks of the real attention functions.
  shapes = [
    None if a is None else np.broadcast_to(np.float32(0), jnp.shape(a))
    for a in (query, key, value)
  ]
  d = _core.check_qkv(who, *shapes)
  bias = _core.check_logits_arg(who, "bias", bias, d)
  mask = _core.check_logits_arg(who, "mask", mask, d)
  if mask is not None and mask.dtype != jnp.bool_:
    raise TypeError(
      f"{who}: mask must be boolean (True attends), got {mask.dtype=}"
    )
  if bias is not None:
    _common.check_real(who, "bias", bias)
  arrays = [jnp.asarray(a) for a in (query, key)]
  arrays.append(None if value is None else jnp.asarray(value))
  if d.unbatched:
    arrays = [None if a is None else a[None] for a in arrays]
  return d, *arrays, bias, mask


def _safe_divide(num: jax.Array, den: jax.Array) -> jax.Array:
  """``num / den`` where ``den > 0``, else 0 (finite gradients either way)."""
  pos = den > 0
  return jnp.where(pos, num / jnp.where(pos, den, 1.0), 0.0)


# ---------------------------------------------------------------------------
# Born rule (CNet).


def born_probs(
  z: Complex[ArrayLike, "... v"], *, axis: int = -1
) -> Float[Array, "... v"]:
  r"""Born-rule probabilities :math:`p_k = |z_k|^2 / \sum_j |z_j|^2`.

  Scale- and phase-invariant (:math:`p(cz) = p(z)` for any complex
  :math:`c \neq 0`). An all-zero ``z`` gives all-zero probabilities.

  Args:
    z: complex amplitudes.
    axis: the outcome axis.

  Returns:
    Real probabilities (the parts' dtype), shape of ``z``.

  Raises:
    TypeError: for a non-complex ``z``.
    ValueError: for a bad ``axis``.

  References:
    Crasmaru, *CNet* (paper eq. 1; code ``crasmarum/CNet``).
  """
  who = "born_probs"
  _common.check_complex(who, "z", z)
  z = jnp.asarray(z)
  (ax,) = _checks.normalize_axes(who, axis, z.ndim)
  s = _common.abs2(z.astype(_common.complex_dtype(z)))
  return _safe_divide(s, jnp.sum(s, axis=ax, keepdims=True))


def _born_ce_parts(z, labels, smoothing):
  s = _common.abs2(z)
  total = jnp.maximum(jnp.sum(s, axis=-1), _BORN_TINY)
  sy = jnp.take_along_axis(s, labels[..., None], axis=-1)[..., 0]
  vocab = z.shape[-1]
  return s, total, sy, (sy + smoothing) / (total + vocab * smoothing)


def _born_ce(z, labels, target_floor, smoothing):
  _, _, _, py = _born_ce_parts(z, labels, smoothing)
  return jnp.mean(-jnp.log(jnp.maximum(py, _BORN_TINY)))


def _born_ce_fwd(z, labels, target_floor, smoothing):
  return _born_ce(z, labels, target_floor, smoothing), (z, labels)


def _born_ce_bwd(target_floor, smoothing, res, ct):
  z, labels = res
  _, total, sy, _ = _born_ce_parts(z, labels, smoothing)
  vocab = z.shape[-1]
  # dL/dz̄_k = z_k / (S + V s) - [k = y] z_y / max(|z_y|^2 + s, floor S).
  target = jnp.maximum(sy + smoothing, target_floor * total)
  target = jnp.maximum(target, _BORN_TINY * total)
  onehot = jax.nn.one_hot(labels, vocab, dtype=jnp.real(z).dtype)
  coef = 1.0 / (total + vocab * smoothing)
  dzbar = z * (coef[..., None] - onehot / target[..., None]).astype(z.dtype)
  count = math.prod(labels.shape)
  # JAX's cotangent for a real loss is conj(2 dL/dz̄).
  grad = jnp.conj(2.0 * dzbar) * (ct / count).astype(z.dtype)
  return grad, None


_born_ce_vjp = jax.custom_vjp(_born_ce, nondiff_argnums=(2, 3))
_born_ce_vjp.defvjp(_born_ce_fwd, _born_ce_bwd)


def born_cross_entropy(
  z: Complex[ArrayLike, "... v"],
  labels: Int[ArrayLike, "..."],
  *,
  target_floor: float = 0.0,
  smoothing: float = 0.0,
) -> Float[Array, ""]:
  r"""Born-rule cross-entropy :math:`-\log p_y`, averaged over positions.

  .. math:: p_y = \frac{|z_y|^2 + s}{S + V s},\qquad S = \sum_k |z_k|^2

  with ``s = smoothing`` (CNet's ``ce_smooth``). Forward clamps as CNet's
  ``SequenceCrossEntropy``: :math:`S \ge 10^{-15}`, :math:`p_y \ge
  10^{-15}`. The gradient is CNet's closed form,
  :math:`\partial L/\partial \bar z_k = z_k/(S + Vs) - [k=y]\,z_y /
  (|z_y|^2 + s)`, returned as JAX's cotangent :math:`\overline{2\,\partial L
  / \partial \bar z}`; ``target_floor`` (CNet's ``ce_eps``, recommended
  1e-3) clamps :math:`|z_y|^2 + s \ge \mathrm{floor}\cdot S` **in the
  backward only** (a `jax.custom_vjp`), which lets training leave the
  "unigram saddle" the authors report. With ``target_floor=0`` the gradient
  is the exact gradient of the forward (away from the clamps).

  Args:
    z: complex logits-amplitudes ``(..., V)``.
    labels: integer targets ``z.shape[:-1]``.
    target_floor: backward-only floor on the target's share.
    smoothing: additive smoothing ``s >= 0``.

  Returns:
    Scalar mean loss in the parts' dtype.

  Raises:
    TypeError: for a non-complex ``z`` or non-integer labels.
    ValueError: for mismatched shapes or negative hyperparameters.

  References:
    Crasmaru, *CNet* (paper eq. 1 and 2; code ``SequenceCrossEntropy``).
  """
  who = "born_cross_entropy"
  _common.check_complex(who, "z", z)
  z = jnp.asarray(z)
  _checks.check_ndim(who, "z", z, minimum=1)
  if not jnp.issubdtype(jnp.result_type(labels), jnp.integer):
    raise TypeError(
      f"{who}: labels must be integers, got "
      f"labels.dtype={jnp.result_type(labels)}"
    )
  _checks.check_shape(who, "labels", labels, z.shape[:-1], "z.shape[:-1]")
  _checks.check_nonnegative(who, "target_floor", target_floor)
  _checks.check_nonnegative(who, "smoothing", smoothing)
  zf = z.astype(_common.complex_dtype(z))
  labels = jnp.asarray(labels).astype(jnp.int32)
  return _born_ce_vjp(zf, labels, float(target_floor), float(smoothing))


def born_attention_weights(
  query: Complex[ArrayLike, "B T N H"],
  key: Complex[ArrayLike, "B S K H"],
  mask: Bool[ArrayLike, "B N T S"] | None = None,
  *,
  is_causal: bool = False,
  eps: float = 0.0,
) -> Float[Array, "B N T S"]:
  r"""Born attention weights :math:`A = |q k^H|^2 / (\sum |qk^H|^2 + \epsilon)`.

  See `born_attention`. Returns real ``(B, N, T, S)`` weights.

  Raises:
    TypeError: for non-complex q/k or a non-boolean mask.
    ValueError: for mismatched shapes.
  """
  d, q, k, _, _, mask = _prepare(
    "born_attention_weights", query, key, None, None, mask
  )
  w = _born_weights(d, q, k, mask, is_causal, eps)
  return w[0] if d.unbatched else w


def _born_weights(d, q, k, mask, is_causal, eps):
  cdt = _common.complex_dtype(q, k)
  g = d.heads // d.kv_heads
  qf = q.astype(cdt).reshape(d.batch, d.q_len, d.kv_heads, g, d.head_dim)
  c = jnp.einsum("btkgh,bskh->bkgts", qf, jnp.conj(k.astype(cdt)))
  s = _common.abs2(c).reshape(d.batch, d.heads, d.q_len, d.kv_len)
  allowed = _core.allowed_mask(d, mask, is_causal)
  if allowed is not None:
    s = jnp.where(allowed, s, 0.0)
  return _safe_divide(s, jnp.sum(s, axis=-1, keepdims=True) + eps)


def born_attention(
  query: Complex[ArrayLike, "B T N H"],
  key: Complex[ArrayLike, "B S K H"],
  value: Complex[ArrayLike, "B S K Hv"],
  mask: Bool[ArrayLike, "B N T S"] | None = None,
  *,
  is_causal: bool = False,
  eps: float = 0.0,
) -> Complex[Array, "B T N Hv"]:
  r"""CNet's Born-rule attention (no softmax, no :math:`1/\sqrt d`).

  .. math::
    c_{km} = \textstyle\sum_d Q_{kd} \bar K_{md},\quad s_{km} = |c_{km}|^2,
    \quad A_{km} = \frac{s_{km}}{\sum_{m' \text{ allowed}} s_{km'} +
    \epsilon},\quad O_k = \textstyle\sum_m A_{km} V_m

  Rows sum to 1 (``eps = 0``); the weights are invariant to a per-token
  phase on q or k and to real rescaling. A row whose scores are all zero
  gets weights 0. Causal form: ``is_causal`` (row 0 returns ``v_0``).
  CNet has one head; heads and grouped-query heads broadcast here. CNet's
  hand-written backward (``b_km = (a_m - ā)/S_k``,
  :math:`\partial L/\partial\bar Q_k \mathrel{+}= b_{km} c_{km} K_m`, ...) is
  JAX's VJP under the Wirtinger mapping (tested).

  Unverified: the CNet paper copy that was read has no Born-attention
  section; the equations are from the official code. The LM example passes
  an ``attn_eps`` to a constructor version not in the index; ``eps`` is
  ours.

  Args:
    query: complex ``(B, T, N, H)`` or ``(T, N, H)``.
    key: complex ``(B, S, K, H)``.
    value: complex ``(B, S, K, Hv)``.
    mask: boolean, broadcastable to ``(B, N, T, S)``.
    is_causal: lower-triangular mask.
    eps: added to each row's score sum.

  Returns:
    Complex ``(B, T, N, Hv)`` in ``query``'s dtype.

  Raises:
    TypeError: for non-complex q/k/v or a non-boolean mask.
    ValueError: for mismatched shapes.

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``, Born attention layer).
  """
  d, q, k, v, _, mask = _prepare(
    "born_attention", query, key, value, None, mask
  )
  w = _born_weights(d, q, k, mask, is_causal, eps)
  cdt = _common.complex_dtype(q, k, v)
  out = _core.apply_weights(d, w, v, cdt)
  return _core.finish(d, out, jnp.asarray(query).dtype)


# ---------------------------------------------------------------------------
# Causal Fourier mixing (CNet §6).


def _phasor(phase: jax.Array, dtype) -> jax.Array:
  """``exp(i phase)`` in the complex ``dtype``."""
  phase = phase.astype(_common.real_dtype(dtype))
  return jax.lax.complex(jnp.cos(phase), jnp.sin(phase))


def _unity_root_table(n: int, dtype) -> jax.Array:
  """``ω^{jk}``, ``ω = e^{-2πi/N}``, with ``jk mod N`` for accuracy."""
  j = jnp.arange(n)
  jk = ((j[:, None] * j[None, :]) % n).astype(_common.real_dtype(dtype))
  return _phasor((-2.0 * math.pi / n) * jk, dtype)


def _chirp(n: int, dtype) -> jax.Array:
  """``c_k = ω^{k²/2} = exp(-iπ k²/N)``, with ``k² mod 2N``."""
  k = jnp.arange(n)
  kk = ((k * k) % (2 * n)).astype(_common.real_dtype(dtype))
  return _phasor((-math.pi / n) * kk, dtype)


def causal_fourier_mix(
  h: Complex[ArrayLike, "..."],
  *,
  axis: int = -1,
  method: str = "bluestein",
) -> Complex[Array, "..."]:
  r"""CNet's causal (lower-triangular) unitary-DFT mixing along ``axis``.

  .. math:: \mathrm{Mix}(h)_k = N^{-1/2} \textstyle\sum_{j \le k}
     h_j\, \omega^{jk}, \qquad \omega = e^{-2\pi i/N}

  ``method="bluestein"`` (CNet paper §6) uses
  :math:`\omega^{jk} = c_k c_j \bar c_{k-j}`, :math:`c_k = e^{-i\pi
  k^2/N}`: :math:`\mathrm{Mix}_k = N^{-1/2} c_k \sum_{j\le k} (h_j c_j)\,
  \bar c_{k-j}`, a causal linear convolution computed with zero-padded FFTs
  in :math:`O(N \log N)`; output ``k`` depends on inputs ``j > k`` only
  through FFT rounding (~1e-7 relative in complex64). ``method="direct"``
  is the :math:`O(N^2)` masked matrix (CNet's ``TriangFourier``, the only
  form in the official code read), exactly causal. Without the mask the
  matrix is ``fft(norm="ortho")`` (CNet's ``FourierTrans``: the code's
  :math:`\omega = e^{-2\pi i/N}` is used, not the :math:`e^{+i\cdot}` that
  the paper's §5 prints).

  CNet applies it to the flattened token-major stream (length ``T E``), not
  along the token axis: reshape before calling to reproduce that.

  Args:
    h: complex input.
    axis: the mixed axis (length ``N``).
    method: ``"bluestein"`` or ``"direct"``.

  Returns:
    ``h``'s shape, complex compute dtype.

  Raises:
    TypeError: for a non-complex ``h``.
    ValueError: for a bad ``axis`` or ``method``.

  References:
    Crasmaru, *CNet* (paper §6; code ``TriangFourier``); Bluestein, *A linear
    filtering approach to the computation of the discrete Fourier transform*
    (1970).
  """
  who = "causal_fourier_mix"
  _common.check_complex(who, "h", h)
  _checks.check_choice(who, "method", method, ("bluestein", "direct"))
  h = jnp.asarray(h)
  (ax,) = _checks.normalize_axes(who, axis, h.ndim)
  dtype = _common.complex_dtype(h)
  x = jnp.moveaxis(h.astype(dtype), ax, -1)
  n = x.shape[-1]
  if n == 0:
    return jnp.moveaxis(x, -1, ax)
  norm = jnp.asarray(1.0 / math.sqrt(n), _common.real_dtype(dtype))
  if method == "direct":
    table = _unity_root_table(n, dtype)
    tri = jnp.tril(jnp.ones((n, n), bool))
    y = x @ jnp.where(tri, table, 0).T
  else:
    c = _chirp(n, dtype).reshape((1,) * (x.ndim - 1) + (n,))
    size = 1 << (2 * n - 1).bit_length()
    a = jnp.fft.fft(x * c, size)
    b = jnp.fft.fft(jnp.conj(c), size)
    y = jnp.fft.ifft(a * b)[..., :n] * c
  return jnp.moveaxis(y * norm.astype(dtype), -1, ax)


# ---------------------------------------------------------------------------
# ComplexFormer (Shao et al., withdrawn; official code).


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


# ---------------------------------------------------------------------------
# Phase-Coherent Transformer gates.


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

  References:
    Hioki, *Complex-Valued Phase-Coherent Transformer*, arXiv:2605.10123
    (2026); code ``leohio/phase-coherent-transformer-r-d``.
  """
  who = "pct_attention"
  d, q, k, v, bias, mask = _prepare(who, query, key, value, bias, mask)
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
