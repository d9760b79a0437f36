r"""Normalization as an analysis tool: MNN, matrix entropy, gauge fixing.

* `matrix_nuclear_norm`: Matrix Nuclear-Norm of a response's final hidden
  states, as the official code computes it (centre, row-normalize, sum of the
  top-:math:`D` column norms, divided by the token count);
* `matrix_entropy`: the official code's matrix-entropy baseline;
* `dual_encoder_gauge_fix`: whitening as gauge fixing for a dual encoder
  :math:`h(x, y) = f(x)^\top g(y)`.

Statistics are computed in float32 (float64 stays); outputs come back in that
compute dtype.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import analysis
  >>> r = jnp.array([[1.0, 2.0], [3.0, 2.0]])  # X = [[-1, 0], [1, 0]]
  >>> print(np.asarray(analysis.matrix_nuclear_norm(r)).round(4))
  0.7071
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "centered_row_normalize",
  "dual_encoder_gauge_fix",
  "matrix_entropy",
  "matrix_nuclear_norm",
]


def _hidden(who: str, hidden: ArrayLike) -> jax.Array:
  _checks.check_ndim(who, "hidden", hidden, minimum=2)
  x = jnp.asarray(hidden)
  _checks.check_floating(who, "hidden", x)
  return x.astype(_numerics.compute_dtype(x))


def _row_normalize(x: jax.Array, eps: float) -> jax.Array:
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
  return x / (jnp.maximum(norm, eps) if eps > 0 else norm)


@_scope.scoped
def centered_row_normalize(
  hidden: Float[ArrayLike, "... N d"], *, eps: float = 0.0
) -> Float[Array, "... N d"]:
  r"""MNN's normalization: centre each feature over tokens, unit-norm rows.

  .. math:: \bar R = R - \mathbf 1\,\mathrm{mean}_{rows}(R),\qquad
     X_i = \bar R_i / \max(\lVert \bar R_i\rVert_2, \epsilon)

  ``eps=0`` is the official code (a row equal to the mean gives NaN);
  ``eps > 0`` maps such a row to 0.

  Args:
    hidden: ``(..., N, d)`` hidden states (``N`` tokens).
    eps: lower bound of the row norm (0 = none).

  Returns:
    ``X`` of the shape of ``hidden`` in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for rank < 2 or a negative ``eps``.

  Examples:
    >>> r = jnp.array([[1.0, 2.0], [3.0, 2.0]])  # the column means are [2, 2]
    >>> print(np.asarray(analysis.centered_row_normalize(r)))
    [[-1.  0.]
     [ 1.  0.]]

  References:
    Li et al., *Large Language Model Evaluation via Matrix Nuclear-Norm*,
    arXiv:2410.10672 (2024); ``code/MNN.py`` of
    ``MLGroupJLU/MatrixNuclearNorm`` (official code, read).
  """
  who = "centered_row_normalize"
  _checks.check_nonnegative(who, "eps", eps)
  x = _hidden(who, hidden)
  return _row_normalize(x - jnp.mean(x, axis=-2, keepdims=True), eps)


@_scope.scoped
def matrix_nuclear_norm(
  hidden: Float[ArrayLike, "... N d"],
  *,
  top_d: int | None = None,
  per_token: bool = True,
  eps: float = 0.0,
) -> Float[Array, "..."]:
  r"""Matrix Nuclear-Norm (MNN) of hidden states, as the official code.

  .. math::
    X = \mathrm{centered\_row\_normalize}(R),\qquad
    \mathrm{MNN}(R) = \frac1N \sum_{j \in \mathrm{top}\text{-}D}
      \lVert X_{:,j}\rVert_2

  with :math:`D = \min(N, d)` by default: the :math:`L_{1,2}` norm (sum
  of column norms, largest :math:`D` kept) that the paper uses as a fast
  proxy of the nuclear norm. The official code applies it to the final
  hidden states of one response (after the final norm), **not** to a
  probability matrix, and reports it divided by the token count
  (``per_token=True``).

  Properties: invariant to adding a vector to every row and to a positive
  global scale; :math:`\sum_j \lVert X_{:,j}\rVert^2 = N`, so
  :math:`\mathrm{MNN}\cdot N \le \sqrt{D N}`. The full :math:`L_{1,2}`
  norm bounds the nuclear norm from above, but the top-:math:`D`
  truncation does not when :math:`N < d` (e.g. ``N=16, d=64``: 9.96 vs a
  nuclear norm of 15.16).

  Args:
    hidden: ``(..., N, d)``, one response per leading index.
    top_d: number of column norms kept (default ``min(N, d)``).
    per_token: divide by ``N`` (the reported score).
    eps: see `centered_row_normalize`.

  Returns:
    ``(...)`` scores in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for rank < 2, a non-positive ``top_d`` or one above ``d``.

  Examples:
    >>> r = jnp.array([[1.0, 2.0], [3.0, 2.0]])  # X = [[-1, 0], [1, 0]]
    >>> y = analysis.matrix_nuclear_norm(r)
    >>> print(np.asarray(y).round(4))  # column norms sqrt(2), 0 over N = 2
    0.7071

  References:
    Li et al., arXiv:2410.10672 (2024); official ``code/MNN.py``.
  """
  who = "matrix_nuclear_norm"
  x = centered_row_normalize(hidden, eps=eps)
  n, d = x.shape[-2:]
  k = min(n, d) if top_d is None else top_d
  _checks.check_positive_int(who, "top_d", k)
  if k > d:
    raise ValueError(
      f"{who}: top_d must be <= d={d} (the number of columns), got {top_d=}"
    )
  cols = jnp.sqrt(jnp.sum(x * x, axis=-2))
  top = jax.lax.top_k(cols, k)[0]
  total = jnp.sum(top, axis=-1)
  return total / n if per_token else total


@_scope.scoped
def matrix_entropy(
  hidden: Float[ArrayLike, "... N d"], *, eps: float = 0.0
) -> Float[Array, "..."]:
  r"""Normalized matrix entropy of hidden states (the MNN paper's baseline).

  .. math::
    Z = \mathrm{rownorm}(\mathrm{centered\_row\_normalize}(R)),\quad
    A = Z^\top Z / N,\quad \lambda = \mathrm{eig}(A/\mathrm{tr}A),\quad
    H = -\frac{\sum_j \lambda_j\log\lambda_j}{\log d}

  with :math:`0\log 0 = 0` (the official code's ``nansum``). The second
  row normalization is the official code's (``F.normalize``, eps
  ``1e-12``). :math:`H \in [0, 1]`.

  Args:
    hidden: ``(..., N, d)``.
    eps: see `centered_row_normalize`.

  Returns:
    ``(...)`` entropies in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for rank < 2, ``d < 2`` or a negative ``eps``.

  Examples:
    >>> r = jnp.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    >>> print(np.asarray(analysis.matrix_entropy(r)).round(4))  # isotropic: 1
    1.0
    >>> r = jnp.concatenate([r[:2], r])  # eigenvalues 2/3 and 1/3
    >>> print(np.asarray(analysis.matrix_entropy(r)).round(4))
    0.9183

  References:
    Li et al., arXiv:2410.10672 (2024), official
    ``code/compute_entropy_time.py``; Wei et al., *Large Language Model
    Evaluation via Matrix Entropy*, arXiv:2401.17139 (2024).
  """
  who = "matrix_entropy"
  x = centered_row_normalize(hidden, eps=eps)
  n, d = x.shape[-2:]
  if d < 2:
    raise ValueError(f"{who}: hidden must have d >= 2 features, got d={d}")
  z = _row_normalize(x, 1e-12)
  a = jnp.einsum("...ni,...nj->...ij", z, z) / n
  tr = jnp.trace(a, axis1=-2, axis2=-1)[..., None, None]
  lam = jnp.linalg.eigvalsh(a / tr)
  lam = jnp.clip(lam, 0.0, None)
  plogp = jnp.where(lam > 0, lam * jnp.log(jnp.where(lam > 0, lam, 1.0)), 0.0)
  return -jnp.sum(plogp, axis=-1) / jnp.log(jnp.asarray(d, lam.dtype))


@_scope.scoped
def dual_encoder_gauge_fix(
  f: Float[ArrayLike, "n k"],
  g: Float[ArrayLike, "m k"],
  *,
  balance: bool = False,
  eps: float = 1e-6,
) -> tuple[Float[Array, "n k"], Float[Array, "m k"], Float[Array, " k"]]:
  r"""Canonical gauge of a dual encoder :math:`h(x, y) = f(x)^\top g(y)`.

  The scores are invariant under :math:`f \to A f,\ g \to A^{-\top} g`
  for any invertible :math:`A`. Fix the gauge by whitening ``f`` and
  diagonalizing ``g``:

  .. math::
    \Sigma_f = \tfrac1n f^\top f,\quad f' = f\,\Sigma_f^{-1/2},\quad
    g' = g\,\Sigma_f^{1/2},\quad \tfrac1m g'^\top g' = U\Lambda U^\top,\quad
    \tilde f = f' U,\quad \tilde g = g' U

  so :math:`\tfrac1n\tilde f^\top\tilde f = I`,
  :math:`\tfrac1m\tilde g^\top\tilde g = \Lambda` (descending) and
  :math:`\tilde f\tilde g^\top = f g^\top`. With distinct
  :math:`\Lambda` the modes are unique up to sign; the sign is fixed so
  that the largest-magnitude entry of each column of :math:`\tilde f` is
  positive, which makes the result gauge-invariant. ``balance=True``
  rescales mode ``j`` by :math:`\Lambda_j^{1/4}` in ``f`` and
  :math:`\Lambda_j^{-1/4}` in ``g`` (both second moments become
  :math:`\Lambda^{1/2}`).

  Unverified [I]: designed here from the abstract of *Low-Interaction-Rank
  learning* (no paper body or code could be read); second moments are
  uncentred (the scores are bilinear, not affine).

  Args:
    f: ``(n, k)`` left embeddings (rows are samples).
    g: ``(m, k)`` right embeddings.
    balance: split :math:`\Lambda` evenly between the two sides.
    eps: floor of the eigenvalues of :math:`\Sigma_f` (and of
      :math:`\Lambda` when balancing).

  Returns:
    ``(f_tilde, g_tilde, lam)`` in the compute dtype; ``lam`` is ``(k,)``.

  Raises:
    TypeError: for non-floating input.
    ValueError: for non-matrix input or mismatched ``k``.

  Examples:
    >>> f = jnp.array([[2.0, 0.0], [0.0, 4.0]])  # Sigma_f = diag(2, 8)
    >>> g = jnp.array([[1.0, 1.0]])
    >>> ft, gt, lam = analysis.dual_encoder_gauge_fix(f, g)
    >>> print(np.asarray(lam).round(4))  # descending
    [10.  0.]
    >>> print(np.allclose(ft @ gt.T, f @ g.T, atol=1e-5))  # same scores
    True
  """
  who = "dual_encoder_gauge_fix"
  _checks.check_ndim(who, "f", f, expected=2)
  _checks.check_ndim(who, "g", g, expected=2)
  k = jnp.shape(f)[1]
  if jnp.shape(g)[1] != k:
    raise ValueError(
      f"{who}: g must have k={k} columns like f, got {jnp.shape(g)=}"
    )
  _checks.check_floating(who, "f", f)
  _checks.check_floating(who, "g", g)
  ff, gg = jnp.asarray(f), jnp.asarray(g)
  dt = _numerics.compute_dtype(ff, gg)
  ff, gg = ff.astype(dt), gg.astype(dt)
  s, v = jnp.linalg.eigh(ff.T @ ff / ff.shape[0])
  s = jnp.maximum(s, eps)
  f1 = ff @ (v * jax.lax.rsqrt(s)[None, :]) @ v.T
  g1 = gg @ (v * jnp.sqrt(s)[None, :]) @ v.T
  lam, u = jnp.linalg.eigh(g1.T @ g1 / gg.shape[0])
  lam, u = lam[::-1], u[:, ::-1]
  ft, gt = f1 @ u, g1 @ u
  idx = jnp.argmax(jnp.abs(ft), axis=0)
  sign = jnp.sign(jnp.take_along_axis(ft, idx[None, :], axis=0))
  sign = jnp.where(sign == 0, 1.0, sign)
  ft, gt = ft * sign, gt * sign
  if balance:
    q = jnp.maximum(lam, eps) ** 0.25
    ft, gt = ft * q[None, :], gt / q[None, :]
  return ft, gt, lam
