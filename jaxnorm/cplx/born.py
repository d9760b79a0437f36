"""CNet's Born rule: probabilities, cross-entropy and attention.

Born attention takes complex q, k, v (``H`` complex dims). Layouts,
masks and dtypes as in `jaxnorm.attention` (see `jaxnorm.cplx._attention`):
``query (B, T, N, H)`` or unbatched, ``key``, ``value (B, S, K, H)`` with
``N % K == 0``, boolean ``mask`` broadcastable to ``(B, N, T, S)`` (True
attends); statistics in float32 / complex64 (64-bit inputs stay 64-bit),
outputs in the query's dtype. Pallas has no complex support: there is no
kernel.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Complex, Float, Int

from jaxnorm import _checks, _scope
from jaxnorm.attention import _core
from jaxnorm.cplx import _attention, _common

# The forward clamps of CNet's Born cross-entropy (``SequenceCrossEntropy``).
_BORN_TINY = 1e-15


def _safe_divide(num: jax.Array, den: jax.Array) -> jax.Array:
  """``num / den`` where ``den > 0``, else 0 (finite gradients either way)."""
  pos = den > 0
  return jnp.where(pos, num / jnp.where(pos, den, 1.0), 0.0)


@_scope.scoped
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

  Examples:
    >>> p = cplx.born_probs(jnp.array([1 + 1j, 2 + 0j, 0j]))
    >>> print(np.asarray(p).round(4))  # |z|^2 = 2, 4, 0
    [0.3333 0.6667 0.    ]

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


@_scope.scoped
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

  Examples:
    >>> z = jnp.array([[1 + 1j, 2 + 0j, 0j]])  # p = [1/3, 2/3, 0]
    >>> print(np.asarray(cplx.born_cross_entropy(z, jnp.array([1]))).round(4))
    0.4055

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


@_scope.scoped
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

  Examples:
    >>> q = jnp.ones((1, 1, 1, 1), jnp.complex64)
    >>> k = jnp.array([1 + 0j, 1j, 2 + 0j]).reshape(1, 3, 1, 1)
    >>> w = cplx.born_attention_weights(q, k)  # |q conj(k)|^2 = 1, 1, 4
    >>> print(np.asarray(w[0, 0, 0]).round(4))
    [0.1667 0.1667 0.6667]
  """
  d, q, k, _, _, mask = _attention.prepare(
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


@_scope.scoped
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

  Examples:
    >>> q = jnp.ones((1, 1, 1, 1), jnp.complex64)
    >>> k = jnp.array([1 + 0j, 1j, 2 + 0j]).reshape(1, 3, 1, 1)
    >>> v = jnp.array([6 + 0j, 6j, 0j]).reshape(1, 3, 1, 1)
    >>> print(np.asarray(cplx.born_attention(q, k, v)[0, 0, 0]).round(4))
    [1.+1.j]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``, Born attention layer).
  """
  d, q, k, v, _, mask = _attention.prepare(
    "born_attention", query, key, value, None, mask
  )
  w = _born_weights(d, q, k, mask, is_causal, eps)
  cdt = _common.complex_dtype(q, k, v)
  out = _core.apply_weights(d, w, v, cdt)
  return _core.finish(d, out, jnp.asarray(query).dtype)
