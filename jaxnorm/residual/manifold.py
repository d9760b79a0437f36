"""Manifold-constrained stream mixing: mHC, oHC and iHC.

Sinkhorn-Knopp projection onto doubly stochastic matrices, SO(4) rotations
from two quaternions, and the mHC / oHC / iHC maps they feed to
`jaxnorm.residual.hyper_connection`.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.residual._common import (
  IndexLike,
  check_layer_index,
  check_scalar,
  check_streams,
  leading,
  scalar,
  unit,
)

ResidualMap = Literal["sinkhorn", "quaternion", "identity"]
RESIDUAL_MAPS: tuple[str, ...] = ("sinkhorn", "quaternion", "identity")


# ---------------------------------------------------------------------------
# Sinkhorn-Knopp and quaternion rotations.


@_scope.scoped
def sinkhorn_knopp(
  logits: Float[ArrayLike, "... n n"],
  *,
  num_iters: int = 20,
  temperature: float = 1.0,
  log_domain: bool = True,
  eps: float = 0.0,
) -> Float[Array, "... n n"]:
  r"""Projects logits onto (near) doubly stochastic matrices (mHC Eq. 9).

  .. math::
    M^{(0)} = \exp(\mathrm{logits} / \tau),\qquad
    M^{(t)} = T_r(T_c(M^{(t-1)})),\quad t = 1..t_{max},

  where :math:`T_c` divides each column by its sum and :math:`T_r` each row.
  The row step is last, so rows sum to 1 to rounding; columns converge to 1
  (within about 1e-5 after 20 iterations for logits of scale 2). The
  operation order equals ``hyper_connections``' ``sinkhorn_knopps``
  (normalize axis -2, then -1) on the same matrix.

  ``log_domain=True`` (default) alternates ``log_softmax`` over axis -2 and
  -1 and exponentiates once at the end (stable for any logit scale); the
  direct form subtracts the column max (Sinkhorn is invariant to column
  scaling) and divides, adding ``eps`` to every denominator like DeepSeek's
  reference kernel (``eps=1e-6`` there). Gradients flow through every
  iteration (``fori_loop``, reverse-differentiable). Computed in float32 (or
  float64), cast back to the logits dtype.

  Unverified: the paper has no temperature (its only logit scale is the
  gate :math:`a_{res}`); ``temperature`` is a jaxnorm extension, default 1.

  Args:
    logits: ``(..., n, n)``.
    num_iters: :math:`t_{max}`, the paper's 20 by default.
    temperature: :math:`\tau > 0`.
    log_domain: iterate on log-probabilities.
    eps: denominator guard of the direct form (must be 0 in log domain).

  Returns:
    Non-negative ``(..., n, n)`` with unit row sums and near-unit column
    sums, in the dtype of ``logits``.

  Raises:
    TypeError: for non-floating logits.
    ValueError: for a non-square matrix, non-positive ``num_iters`` or
      ``temperature``, negative ``eps``, or ``eps`` in log domain.

  Examples:
    >>> logits = jnp.log(jnp.array([[1.0, 2.0], [1.0, 1.0]]))
    >>> p = residual.sinkhorn_knopp(logits)
    >>> print(np.asarray(p).round(4))  # rows and columns sum to 1
    [[0.4142 0.5858]
     [0.5858 0.4142]]

  References:
    Sinkhorn & Knopp, *Concerning nonnegative matrices and doubly
    stochastic matrices*, Pacific J. Math. 21 (1967); Xie et al., *mHC:
    Manifold-Constrained Hyper-Connections*, arXiv:2512.24880 (2025).
  """
  who = "sinkhorn_knopp"
  _checks.check_floating(who, "logits", logits)
  _checks.check_ndim(who, "logits", logits, minimum=2)
  shape = np.shape(logits)
  if shape[-1] != shape[-2]:
    raise ValueError(
      f"{who}: logits must be square in the last two axes, "
      f"got logits.shape={shape}"
    )
  _checks.check_positive_int(who, "num_iters", num_iters)
  if not temperature > 0:
    raise ValueError(f"{who}: temperature must be > 0, got {temperature=}")
  _checks.check_nonnegative(who, "eps", eps)
  if log_domain and eps:
    raise ValueError(
      f"{who}: eps applies to the direct form only; use "
      f"log_domain=False with {eps=}"
    )
  logits = jnp.asarray(logits)
  ct = _numerics.compute_dtype(logits)
  z = logits.astype(ct) / temperature
  m = _sinkhorn_iterations(
    z, num_iters=num_iters, log_domain=log_domain, eps=float(eps)
  )
  return m.astype(logits.dtype)


@functools.partial(jax.jit, static_argnames=("num_iters", "log_domain", "eps"))
def _sinkhorn_iterations(
  z: jax.Array, *, num_iters: int, log_domain: bool, eps: float
) -> jax.Array:
  """The iterations of `sinkhorn_knopp` on logits ``z`` (compute dtype).

  Jitted so that eager callers (one call per layer) compile the loop once
  per shape instead of once per call; inside a traced caller it inlines.
  """
  if log_domain:

    def body(_, z):
      z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True)
      return z - jax.nn.logsumexp(z, axis=-1, keepdims=True)

    return jnp.exp(jax.lax.fori_loop(0, num_iters, body, z))
  z = z - jax.lax.stop_gradient(jnp.max(z, axis=-2, keepdims=True))

  def body(_, m):
    m = m / (jnp.sum(m, axis=-2, keepdims=True) + eps)
    return m / (jnp.sum(m, axis=-1, keepdims=True) + eps)

  return jax.lax.fori_loop(0, num_iters, body, jnp.exp(z))


def _check_quaternion(who: str, name: str, p: ArrayLike) -> None:
  _checks.check_floating(who, name, p)
  _checks.check_ndim(who, name, p, minimum=1)
  if np.shape(p)[-1] != 4:
    raise ValueError(
      f"{who}: {name} must have 4 components in its last "
      f"axis (a quaternion), got {name}.shape={np.shape(p)}"
    )


def quaternion_left_matrix(
  p: Float[ArrayLike, "... 4"],
) -> Float[Array, "... 4 4"]:
  r"""Matrix :math:`L(p)` of left multiplication :math:`x \mapsto p\,x`.

  With :math:`p = p_0 + p_1 i + p_2 j + p_3 k` as a vector of :math:`R^4`,
  :math:`L(p) = [[p_0,-p_1,-p_2,-p_3],[p_1,p_0,-p_3,p_2],
  [p_2,p_3,p_0,-p_1],[p_3,-p_2,p_1,p_0]]`; in SO(4) for unit ``p``.

  Raises:
    TypeError: for a non-floating ``p``.
    ValueError: unless ``p.shape[-1] == 4``.
  """
  _check_quaternion("quaternion_left_matrix", "p", p)
  p0, p1, p2, p3 = jnp.moveaxis(jnp.asarray(p), -1, 0)
  rows = [
    [p0, -p1, -p2, -p3],
    [p1, p0, -p3, p2],
    [p2, p3, p0, -p1],
    [p3, -p2, p1, p0],
  ]
  return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def quaternion_right_matrix(
  q: Float[ArrayLike, "... 4"],
) -> Float[Array, "... 4 4"]:
  r"""Matrix :math:`R(q)` of right multiplication :math:`x \mapsto x\,q`.

  :math:`R(q) = [[q_0,-q_1,-q_2,-q_3],[q_1,q_0,q_3,-q_2],
  [q_2,-q_3,q_0,q_1],[q_3,q_2,-q_1,q_0]]`; commutes with every
  :math:`L(p)`, and :math:`R(\bar q) = R(q)^\top`.

  Raises:
    TypeError: for a non-floating ``q``.
    ValueError: unless ``q.shape[-1] == 4``.
  """
  _check_quaternion("quaternion_right_matrix", "q", q)
  q0, q1, q2, q3 = jnp.moveaxis(jnp.asarray(q), -1, 0)
  rows = [
    [q0, -q1, -q2, -q3],
    [q1, q0, q3, -q2],
    [q2, -q3, q0, q1],
    [q3, q2, -q1, q0],
  ]
  return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


@_scope.scoped
def quaternion_rotation(
  p: Float[ArrayLike, "... 4"],
  q: Float[ArrayLike, "... 4"],
  *,
  eps: float = 1e-12,
) -> Float[Array, "... 4 4"]:
  r"""The SO(4) rotation :math:`x \mapsto \hat p\, x\, \bar{\hat q}`.

  .. math::
    M = L(\hat p)\, R(\bar{\hat q}) = L(\hat p)\, R(\hat q)^\top,\quad
    \hat p = p / \max(\lVert p\rVert, \epsilon),

  closed form, no iteration. Every rotation of SO(4) has this form
  (:math:`S^3 \times S^3` double cover: ``(p, q)`` and ``(-p, -q)`` give the
  same matrix); :math:`p = q = 1` gives the identity and :math:`p = q` the
  SO(3) subgroup fixing the real axis.

  Unverified (oHC paper text not read): whether oHC uses
  :math:`p x \bar q` or :math:`p x q`; both lie in SO(4), only the conjugate
  form is the identity at :math:`p = q = 1`, so it is used here.

  Args:
    p: left quaternion generator ``(..., 4)``; need not be unit.
    q: right quaternion generator ``(..., 4)``.
    eps: floor of the norms.

  Returns:
    ``(..., 4, 4)`` orthogonal with determinant +1, in float32 (float64 for
    float64 input).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: unless both have 4 components and equal shapes.

  Examples:
    >>> one = jnp.array([1.0, 0.0, 0.0, 0.0])
    >>> print(np.asarray(residual.quaternion_rotation(one, one)))  # identity
    [[1. 0. 0. 0.]
     [0. 1. 0. 0.]
     [0. 0. 1. 0.]
     [0. 0. 0. 1.]]
    >>> i = jnp.array([0.0, 1.0, 0.0, 0.0])
    >>> print(np.asarray(residual.quaternion_rotation(i, one)) @ np.ones(4))
    [-1.  1. -1.  1.]

  References:
    Guo et al., *oHC: Orthogonal Hyper-Connections on SO(4) via
    Quaternions*, arXiv:2609.02672 (2026).
  """
  who = "quaternion_rotation"
  _check_quaternion(who, "p", p)
  _check_quaternion(who, "q", q)
  if np.shape(p) != np.shape(q):
    raise ValueError(
      f"{who}: p and q must have the same shape, got "
      f"{np.shape(p)=} and {np.shape(q)=}"
    )
  p, q = jnp.asarray(p), jnp.asarray(q)
  ct = _numerics.compute_dtype(p)
  p, q = p.astype(ct), q.astype(ct)
  p, q = unit(p, eps), unit(q, eps)
  return quaternion_left_matrix(p) @ jnp.swapaxes(
    quaternion_right_matrix(q), -1, -2
  )


# ---------------------------------------------------------------------------
# mHC, oHC and iHC maps.


@_scope.scoped
def mhc_maps(
  h: Float[ArrayLike, "... n d"],
  *,
  phi_pre: Float[ArrayLike, "nd n"] | None,
  phi_post: Float[ArrayLike, "nd n"] | None,
  phi_res: Float[ArrayLike, "nd m"] | None,
  b_pre: Float[ArrayLike, " n"],
  b_post: Float[ArrayLike, " n"],
  b_res: Float[ArrayLike, "*r"] | None,
  a_pre: Float[ArrayLike, ""] | float = 0.01,
  a_post: Float[ArrayLike, ""] | float = 0.01,
  a_res: Float[ArrayLike, ""] | float = 0.01,
  residual: ResidualMap = "sinkhorn",
  num_iters: int = 20,
  temperature: float = 1.0,
  log_domain: bool = True,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  r"""Coefficient maps of mHC (and of the oHC / iHC residual variants).

  mHC (paper Eq. 7-9), with the stream state flattened stream-major to
  :math:`x_v \in R^{nd}` and :math:`x' = x_v / \sqrt{\mathrm{mean}(x_v^2) +
  \epsilon}`:

  .. math::
    \tilde H^{pre} = a_{pre}\, x'\phi_{pre} + b_{pre},\quad
    \tilde H^{post} = a_{post}\, x'\phi_{post} + b_{post},\quad
    \tilde H^{res} = a_{res}\, \mathrm{mat}_{n\times n}(x'\phi_{res})
      + b_{res},

  .. math::
    H^{pre} = \sigma(\tilde H^{pre}),\quad
    H^{post} = 2\sigma(\tilde H^{post}),\quad
    H^{res} = \mathrm{SinkhornKnopp}(\tilde H^{res}).

  No tanh (unlike HC). :math:`H^{pre} \ge 0`, :math:`H^{post} \in (0, 2)`,
  :math:`H^{res}` doubly stochastic (rows exactly, columns to ~1e-5).

  ``residual`` selects the mixing matrix:

  * ``"sinkhorn"`` (mHC): ``phi_res`` ``(nd, n*n)``, ``b_res`` ``(n, n)``;
    ``mat`` is a row-major reshape, rows are target streams.
  * ``"quaternion"`` (oHC, ``n = 4``): ``phi_res`` ``(nd, 8)``, ``b_res``
    ``(8,)``; the 8 numbers are quaternions ``[p, q]`` and
    :math:`H^{res} = L(\hat p) R(\bar{\hat q})` (`quaternion_rotation`), an
    SO(4) rotation with no iteration. Biases ``(1,0,0,0)`` twice give the
    identity at init.
  * ``"identity"`` (iHC baseline): :math:`H^{res} = I_n`; ``phi_res`` and
    ``b_res`` must be ``None``.

  Unverified (oHC, paper not read): whether the quaternions are produced
  per token from the mHC head (as here) or are static per layer (pass
  ``phi_res=None``), and the unit-norm handling (here a division by the
  norm).

  The RMSNorm weight of Eq. 7 is folded into ``phi`` (paper Sec. 4.3), so
  there is none here. ``phi_* = None`` drops the input-dependent term (a
  static map). Coefficient maths in float32 (paper: ``phi`` in TF32,
  gates, biases and coefficients in FP32).

  Deviation: the paper's config uses RMSNorm eps 1e-20; the default here is
  the official DeepSeek kernels' 1e-6.

  Args:
    h: stream state ``(..., n, d)``.
    phi_pre: ``(n*d, n)`` or ``None``.
    phi_post: ``(n*d, n)`` or ``None``.
    phi_res: see ``residual``.
    b_pre: ``(n,)``.
    b_post: ``(n,)``.
    b_res: see ``residual``.
    a_pre: gating factor, scalar (paper init 0.01).
    a_post: gating factor, scalar.
    a_res: gating factor, scalar.
    residual: ``"sinkhorn"``, ``"quaternion"`` or ``"identity"``.
    num_iters: Sinkhorn iterations (paper 20).
    temperature: Sinkhorn temperature (jaxnorm extension, default 1).
    log_domain: log-domain Sinkhorn iterations.
    eps: RMSNorm epsilon.

  Returns:
    ``(h_pre, h_post, h_res)`` for `hyper_connection`, per token (shapes
    ``h.shape[:-1]``, ``h.shape[:-1]``, ``h.shape[:-2] + (n, n)``) or
    static when no ``phi`` is given; float32 (float64 for float64 input).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for an unknown ``residual``, ``n != 4`` with quaternions, or
      any shape that does not match ``n = h.shape[-2]``, ``d = h.shape[-1]``.

  Examples:
    >>> b_pre, b_post, b_res = residual.mhc_static_init(2, res_diag=0.75)
    >>> h_pre, h_post, h_res = residual.mhc_maps(
    ...     jnp.ones((2, 3)), phi_pre=None, phi_post=None, phi_res=None,
    ...     b_pre=b_pre, b_post=b_post, b_res=b_res)  # static: no phi
    >>> print(np.asarray(h_pre), np.asarray(h_post))  # sigmoid(0), 2 sigmoid(0)
    [0.5 0.5] [1. 1.]
    >>> print(np.asarray(h_res).round(4))
    [[0.75 0.25]
     [0.25 0.75]]

  References:
    Xie et al., *mHC: Manifold-Constrained Hyper-Connections*,
    arXiv:2512.24880 (2025); Guo et al., *oHC: Orthogonal Hyper-Connections
    on SO(4) via Quaternions*, arXiv:2609.02672 (2026).
  """
  who = "mhc_maps"
  n, d = check_streams(who, h)
  _checks.check_choice(who, "residual", residual, RESIDUAL_MAPS)
  h = jnp.asarray(h)
  if residual == "quaternion" and n != 4:
    raise ValueError(
      f"{who}: residual='quaternion' (oHC) needs n = 4 "
      f"streams, got h.shape[-2]={n}"
    )
  res_out = {"sinkhorn": n * n, "quaternion": 8, "identity": 0}[residual]
  res_bias = {"sinkhorn": (n, n), "quaternion": (8,), "identity": ()}[residual]
  if residual == "identity":
    if phi_res is not None or b_res is not None:
      raise ValueError(
        f"{who}: residual='identity' (iHC) takes no phi_res or b_res; pass None"
      )
  else:
    if b_res is None:
      raise ValueError(
        f"{who}: residual={residual!r} needs b_res of shape {res_bias}"
      )
    _checks.check_floating(who, "b_res", b_res)
    _checks.check_shape(
      who, "b_res", b_res, res_bias, f"residual={residual!r}, n={n}"
    )
  for name, b in (("b_pre", b_pre), ("b_post", b_post)):
    _checks.check_floating(who, name, b)
    _checks.check_shape(who, name, b, (n,), "(n,) with n = h.shape[-2]")
  for name, a in (("a_pre", a_pre), ("a_post", a_post), ("a_res", a_res)):
    if not isinstance(a, (int, float)):
      check_scalar(who, name, a)
  for name, phi, out in (
    ("phi_pre", phi_pre, n),
    ("phi_post", phi_post, n),
    ("phi_res", phi_res, res_out),
  ):
    if phi is not None:
      _checks.check_floating(who, name, phi)
      _checks.check_shape(
        who, name, phi, (n * d, out), f"(n*d, {out}) with n, d = h.shape[-2:]"
      )
  ct = _numerics.compute_dtype(h)
  if any(phi is not None for phi in (phi_pre, phi_post, phi_res)):
    xv = jnp.reshape(h.astype(ct), (*h.shape[:-2], n * d))
    xn = xv * jax.lax.rsqrt(jnp.mean(xv * xv, axis=-1, keepdims=True) + eps)
  else:
    xn = None

  def logits(phi, b, a):
    b = jnp.asarray(b).astype(ct)
    if phi is None:
      return b
    z = xn @ jnp.asarray(phi).astype(ct)
    z = jnp.reshape(z, (*z.shape[:-1], *b.shape))
    return scalar(a, ct) * z + leading(b, z.shape)

  h_pre = jax.nn.sigmoid(logits(phi_pre, b_pre, a_pre))
  h_post = 2.0 * jax.nn.sigmoid(logits(phi_post, b_post, a_post))
  if residual == "identity":
    h_res = jnp.eye(n, dtype=ct)
  elif residual == "sinkhorn":
    h_res = sinkhorn_knopp(
      logits(phi_res, b_res, a_res),
      num_iters=num_iters,
      temperature=temperature,
      log_domain=log_domain,
    )
  else:
    pq = logits(phi_res, b_res, a_res)
    h_res = quaternion_rotation(pq[..., :4], pq[..., 4:])
  return h_pre, h_post, h_res


def _logit(p: float) -> float:
  """The sigmoid's inverse: the bias whose sigmoid is ``p`` in (0, 1)."""
  return math.log(p / (1.0 - p))


@_scope.scoped
def mhc_static_init(
  num_streams: int,
  *,
  residual: ResidualMap = "sinkhorn",
  res_diag: float = 0.99,
  layer_index: IndexLike | None = None,
  pre_focus: float = 0.9,
  dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  r"""Initial biases ``(b_pre, b_post, b_res)`` for `mhc_maps`.

  Unverified: the mHC paper states only the gate init (0.01); the biases
  are jaxnorm's choice, the paper's own "disabled mapping" values (Table 1)
  as a neutral start:

  * :math:`H^{pre} = 1/n` (``b_pre = logit(1/n)``) without a
    ``layer_index``: the branch reads the mean of the streams. With one
    (what the models pass), sublayer ``k`` reads stream ``k mod n`` with
    weight ``pre_focus`` and each other stream with ``(1 - pre_focus) /
    (n - 1)``, after HC's one-hot read ``e_{k mod n}`` (sigmoid cannot
    reach one-hot; 0.9 keeps its slope at 0.09);
  * :math:`H^{post} = 1` (``b_post = 0``);
  * :math:`H^{res}` with diagonal ``res_diag`` and the rest spread evenly:
    diagonal logit :math:`\log(\mathrm{res\_diag}\,(n - 1) /
    (1 - \mathrm{res\_diag}))`, off-diagonal 0. That matrix is already doubly
    stochastic, so Sinkhorn returns it exactly. For oHC the quaternion biases
    are ``(1, 0, 0, 0)`` twice (:math:`H^{res} = I`); iHC has none.

  With identical streams (`expand_streams`) and ``phi = 0``, any such
  network equals ``n`` copies of the Pre-Norm residual network, because the
  rows of :math:`H^{res}` sum to 1 and :math:`\sum_i H^{pre}_i = 1`. With
  the uniform read it stays so through training: every stream gets the same
  gradient, so the streams never separate and the mixing is never used
  (measured by `experiments.residual_streams`: stream spread 0). The focused
  read keeps the same function at init, but the backward pass reaches
  each stream with a different weight, so the streams separate as HC's do.

  Args:
    num_streams: ``n`` (4 for quaternions).
    residual: as in `mhc_maps`.
    res_diag: diagonal of the initial Sinkhorn matrix, in ``[1/n, 1)``.
    layer_index: 0-based sublayer index ``k`` (a Python integer or a traced
      integer scalar), or ``None`` for the uniform read.
    pre_focus: initial :math:`H^{pre}` on stream ``k mod n``, in ``[1/n,
      1)``; used only with ``layer_index``.
    dtype: dtype of the returned arrays.

  Returns:
    Arrays built with ``jnp`` ops (they follow an active mesh); ``b_res`` is
    ``None`` for ``"identity"``.

  Raises:
    ValueError: for a bad ``num_streams``, ``residual`` or ``res_diag``.

  Examples:
    >>> b_pre, b_post, b_res = residual.mhc_static_init(2, res_diag=0.75)
    >>> print(np.asarray(b_pre).round(4), np.asarray(b_post))  # logit(1/2) = 0
    [0. 0.] [0. 0.]
    >>> print(np.asarray(b_res).round(4))  # log(0.75 / 0.25) on the diagonal
    [[1.0986 0.    ]
     [0.     1.0986]]
  """
  who = "mhc_static_init"
  _checks.check_positive_int(who, "num_streams", num_streams)
  _checks.check_choice(who, "residual", residual, RESIDUAL_MAPS)
  check_layer_index(who, layer_index)
  n = num_streams
  if n == 1:
    b_pre = jnp.full((1,), 30.0, dtype)
  elif layer_index is None:
    b_pre = jnp.full((n,), _logit(1.0 / n), dtype)
  else:
    if not 1.0 / n <= pre_focus < 1.0:
      raise ValueError(
        f"{who}: pre_focus must lie in [1/n, 1) = [{1.0 / n}, 1), got "
        f"{pre_focus=}"
      )
    read = jax.nn.one_hot(jnp.asarray(layer_index) % n, n, dtype=dtype)
    rest = _logit((1.0 - pre_focus) / (n - 1))
    b_pre = rest + (_logit(pre_focus) - rest) * read
  b_post = jnp.zeros((n,), dtype)
  if residual == "identity":
    return b_pre, b_post, None
  if residual == "quaternion":
    if n != 4:
      raise ValueError(
        f"{who}: residual='quaternion' needs num_streams=4, got {num_streams=}"
      )
    return b_pre, b_post, jnp.tile(jnp.eye(4, dtype=dtype)[0], 2)
  if n == 1:
    return b_pre, b_post, jnp.zeros((1, 1), dtype)
  if not 1.0 / n <= res_diag < 1.0:
    raise ValueError(
      f"{who}: res_diag must lie in [1/n, 1) = [{1.0 / n}, 1), got {res_diag=}"
    )
  diag = math.log(res_diag * (n - 1) / (1.0 - res_diag))
  return b_pre, b_post, jnp.eye(n, dtype=dtype) * diag
