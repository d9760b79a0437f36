r"""Looped linear self-attention with a norm: one loop, one power iteration.

A looped transformer applies the same block ``T`` times. With linear
self-attention (LSA) on the tokens

.. math::
  Z = \begin{pmatrix} x_1 & \cdots & x_n & 0 \\ 0 & \cdots & 0 & v
  \end{pmatrix} \in \mathbb R^{2d\times(n+1)}

(``n`` data tokens and one query token carrying the iterate ``v``), the
construction ``w_kq[:d, d:] = I``, ``w_pv[d:, :d] = I`` makes the query
token's output :math:`\hat\Sigma v` with :math:`\hat\Sigma = X^\top X/n`,
and an L2 (or RMS) norm after each loop makes the loop exactly one step of
the power method. `looped_lsa` is that block with trainable ``w_kq``,
``w_pv`` shared across loops, `power_iteration` the oracle.

Unverified [A + I]: only the abstract of the paper could be read (no code);
the token layout, the query-only update, the re-injected data slot and the
norm placement are designed here so that the construction is exact; they are
spec choices, not the paper's. A centring LayerNorm breaks exactness.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import looped
  >>> x = jnp.array([[2.0, 0.0], [0.0, 1.0]])  # Sigma = X^T X / n
  >>> w_kq, w_pv = looped.power_construction(2)
  >>> v = looped.looped_lsa(x, jnp.ones(2), w_kq, w_pv, num_loops=1)
  >>> print(np.asarray(v).round(4))  # Sigma v / |Sigma v|, Sigma = (2, 0.5)
  [[0.9701 0.2425]]

References:
  Wu, Zhang and Cao, *Looped Transformers with LayerNorm Provably Learn the
  Power Method*, arXiv:2606.00605 (2026).
  von Oswald et al., *Transformers Learn In-Context by Gradient Descent*,
  arXiv:2212.07677 (2023) (the LSA parameterization).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "LoopNorm",
  "linear_self_attention",
  "looped_lsa",
  "power_construction",
  "power_iteration",
]

LoopNorm = Literal["l2", "rms", "layernorm", "none"]
_LOOP_NORMS = ("l2", "rms", "layernorm", "none")


def _as(who: str, name: str, x: ArrayLike, dt=None) -> jax.Array:
  x = jnp.asarray(x)
  _checks.check_floating(who, name, x)
  return x.astype(dt or _numerics.compute_dtype(x))


def _check_weights(who: str, w_kq: ArrayLike, w_pv: ArrayLike, dim: int):
  for name, w in (("w_kq", w_kq), ("w_pv", w_pv)):
    _checks.check_shape(who, name, w, (dim, dim), "(2d, 2d)")


@_scope.scoped
def linear_self_attention(
  z: Float[ArrayLike, "... D m"],
  w_kq: Float[ArrayLike, "D D"],
  w_pv: Float[ArrayLike, "D D"],
  *,
  n: int,
) -> Float[Array, "... D m"]:
  r"""Linear self-attention in the column layout, first ``n`` tokens keys.

  .. math:: \mathrm{LSA}(Z) = W^{PV} Z M (Z^\top W^{KQ} Z)/n,\qquad
     M = \mathrm{diag}(\mathbf 1_n, \mathbf 0_{m-n})

  (columns are tokens; ``M`` keeps the query tokens out of the keys).

  Args:
    z: ``(..., D, m)`` tokens as columns.
    w_kq: ``(D, D)`` merged key-query matrix.
    w_pv: ``(D, D)`` merged projection-value matrix.
    n: number of key tokens (the first ``n`` columns), ``1 <= n <= m``.

  Returns:
    ``(..., D, m)`` in the compute dtype of ``z``.

  Raises:
    TypeError: for non-floating input.
    ValueError: for bad shapes or ``n``.

  Examples:
    >>> z = jnp.array([[1.0, 2.0, 0.0]])  # D = 1; two key tokens, one query
    >>> one = jnp.ones((1, 1))
    >>> y = looped.linear_self_attention(z, one, one, n=2)
    >>> print(np.asarray(y))  # sum over keys of z_j (z_j z_i) / n
    [[2.5 5.  0. ]]

  References:
    von Oswald et al., arXiv:2212.07677 (2023).
  """
  who = "linear_self_attention"
  _checks.check_ndim(who, "z", z, minimum=2)
  dim, m = jnp.shape(z)[-2:]
  _check_weights(who, w_kq, w_pv, dim)
  _checks.check_positive_int(who, "n", n)
  if n > m:
    raise ValueError(f"{who}: n must be <= the token count m={m}, got {n=}")
  zf = _as(who, "z", z)
  wkq = _as(who, "w_kq", w_kq, zf.dtype)
  wpv = _as(who, "w_pv", w_pv, zf.dtype)
  scores = jnp.einsum("...di,de,...ej->...ij", zf, wkq, zf)
  keys = zf[..., :n]
  return jnp.einsum("de,...ei,...ij->...dj", wpv, keys, scores[..., :n, :]) / n


def _loop_norm(v: jax.Array, norm: str, eps: float) -> jax.Array:
  if norm == "none":
    return v
  if norm == "layernorm":
    v = v - jnp.mean(v, axis=-1, keepdims=True)
  ss = jnp.sum(v * v, axis=-1, keepdims=True)
  if norm != "l2":
    ss = ss / v.shape[-1]
  # A zero iterate (ss + eps == 0 only for v == 0) stays 0, not 0 * inf.
  return v * jax.lax.rsqrt(jnp.where(ss + eps > 0, ss + eps, 1.0))


@_scope.scoped
def looped_lsa(
  x: Float[ArrayLike, "... n d"],
  v0: Float[ArrayLike, "... d"],
  w_kq: Float[ArrayLike, "2d 2d"],
  w_pv: Float[ArrayLike, "2d 2d"],
  *,
  num_loops: int,
  norm: LoopNorm = "l2",
  residual: bool = False,
  eps: float = 0.0,
  return_all: bool = True,
) -> Float[Array, "... T d"] | Float[Array, "... d"]:
  r"""``num_loops`` applications of one LSA block with a norm on the query.

  Each loop builds :math:`Z` from the data ``x`` (re-injected unchanged)
  and the iterate :math:`v`, and updates only the query token:

  .. math:: v \leftarrow \mathrm{Norm}\big(\mathrm{LSA}(Z)_{d:,\,n} +
     \mathrm{residual}\cdot v\big)

  ``norm``: ``"l2"`` (:math:`v/\lVert v\rVert`), ``"rms"``
  (:math:`\sqrt d\,v/\lVert v\rVert`), ``"layernorm"`` (centred, then
  RMS; no affine) or ``"none"``. ``eps`` is added to the (mean) square
  inside the square root. With the exact construction
  (`power_construction`) and ``"l2"``, loop ``t`` returns
  :math:`\hat\Sigma^t v_0/\lVert\hat\Sigma^t v_0\rVert`.

  Args:
    x: ``(..., n, d)`` data rows :math:`x_i`.
    v0: ``(..., d)`` start vector.
    w_kq: ``(2d, 2d)``, shared by all loops.
    w_pv: ``(2d, 2d)``, shared by all loops.
    num_loops: ``T``.
    norm: see above.
    residual: add the incoming iterate before the norm.
    eps: stabilizer of the norm (0: exact).
    return_all: return every loop's iterate ``(..., T, d)`` or the last.

  Returns:
    Iterates in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for bad shapes, ``num_loops`` or ``norm``.

  Examples:
    >>> x = jnp.array([[2.0, 0.0], [0.0, 1.0]])  # data: Sigma = diag(2, 0.5)
    >>> w_kq, w_pv = looped.power_construction(2)
    >>> v = looped.looped_lsa(x, jnp.array([1.0, 1.0]), w_kq, w_pv, num_loops=2)
    >>> print(np.asarray(v).round(4))  # the power iterates of Sigma
    [[0.9701 0.2425]
     [0.9981 0.0624]]

  References:
    Wu, Zhang and Cao, arXiv:2606.00605 (2026).
  """
  who = "looped_lsa"
  _checks.check_ndim(who, "x", x, minimum=2)
  n, d = jnp.shape(x)[-2:]
  _checks.check_shape(who, "v0", v0, jnp.shape(x)[:-2] + (d,))
  _check_weights(who, w_kq, w_pv, 2 * d)
  _checks.check_positive_int(who, "num_loops", num_loops)
  _checks.check_choice(who, "norm", norm, _LOOP_NORMS)
  _checks.check_nonnegative(who, "eps", eps)
  xf = _as(who, "x", x)
  dt = _numerics.compute_dtype(xf, jnp.asarray(v0))
  xf = xf.astype(dt)
  v = _as(who, "v0", v0, dt)
  wkq = _as(who, "w_kq", w_kq, dt)
  wpv = _as(who, "w_pv", w_pv, dt)
  # Only the query column of LSA(Z) is used: its scores against the n data
  # keys z_i = [x_i; 0] are z_i^T W^KQ [0; v] = x_i^T W^KQ[:d, d:] v, and
  # W^PV z_i = W^PV[:, :d] x_i, whose bottom half is W^PV[d:, :d] x_i.
  a = wkq[:d, d:]
  b = wpv[d:, :d]

  def step(v, _):
    scores = jnp.einsum("...nd,de,...e->...n", xf, a, v)
    out = jnp.einsum("fd,...nd,...n->...f", b, xf, scores) / n
    v = _loop_norm(out + v if residual else out, norm, eps)
    return v, v

  v, vs = jax.lax.scan(step, v, None, length=num_loops)
  if return_all:
    return jnp.moveaxis(vs, 0, -2)
  return v


@_scope.scoped
def power_construction(d: int, *, dtype=jnp.float32) -> tuple[Array, Array]:
  """``(w_kq, w_pv)`` with ``w_kq[:d, d:] = I``, ``w_pv[d:, :d] = I``.

  Examples:
    >>> w_kq, w_pv = looped.power_construction(1)
    >>> print(np.asarray(w_kq), np.asarray(w_pv))
    [[0. 1.]
     [0. 0.]] [[0. 0.]
     [1. 0.]]
  """
  _checks.check_positive_int("power_construction", "d", d)
  eye = jnp.eye(d, dtype=dtype)
  z = jnp.zeros((d, d), dtype)
  return jnp.block([[z, eye], [z, z]]), jnp.block([[z, z], [eye, z]])


@_scope.scoped
def power_iteration(
  s: Float[ArrayLike, "... d d"],
  v0: Float[ArrayLike, "... d"],
  num_iters: int,
) -> Float[Array, "... T d"]:
  r"""Normalized power iterates :math:`p_t = S^t v_0/\lVert S^t v_0\rVert`.

  Args:
    s: ``(..., d, d)`` matrix.
    v0: ``(..., d)`` start vector.
    num_iters: ``T``.

  Returns:
    ``(..., T, d)`` iterates ``p_1 .. p_T`` in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for bad shapes or ``num_iters``.

  Examples:
    >>> s = jnp.diag(jnp.array([2.0, 0.5]))
    >>> p = looped.power_iteration(s, jnp.ones(2), 2)
    >>> print(np.asarray(p).round(4))  # S v / |S v|, S^2 v / |S^2 v|
    [[0.9701 0.2425]
     [0.9981 0.0624]]
  """
  who = "power_iteration"
  _checks.check_ndim(who, "s", s, minimum=2)
  d = jnp.shape(s)[-1]
  _checks.check_shape(who, "s", s, jnp.shape(s)[:-2] + (d, d), "square")
  _checks.check_shape(who, "v0", v0, jnp.shape(s)[:-1])
  _checks.check_positive_int(who, "num_iters", num_iters)
  sf = _as(who, "s", s)
  v = _as(who, "v0", v0, sf.dtype)

  def step(v, _):
    v = jnp.einsum("...de,...e->...d", sf, v)
    # A zero iterate (s v = 0) stays 0 instead of 0 / 0.
    ss = jnp.sum(v * v, axis=-1, keepdims=True)
    v = v * jax.lax.rsqrt(jnp.where(ss > 0, ss, 1.0))
    return v, v

  _, vs = jax.lax.scan(step, v, None, length=num_iters)
  return jnp.moveaxis(vs, 0, -2)
