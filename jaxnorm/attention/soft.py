"""SOFT: softmax-free attention (Newton inverse) and its token-map layer."""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope, norms
from jaxnorm.attention import _grid, lina


def gaussian_kernel(
  a: Float[Array, "... n d"], b: Float[Array, "... m d"]
) -> Float[Array, "... n m"]:
  r"""SOFT's kernel :math:`\kappa(a, b) = \exp(-\|a - b\|^2 / 2)`.

  Computed as :math:`\|a\|^2 + \|b\|^2 - 2 a \cdot b` (clamped at 0) in
  float32.

  Args:
    a: ``(..., n, d)``.
    b: ``(..., m, d)`` with the same leading axes.

  Returns:
    ``(..., n, m)`` in ``promote(dtype, float32)``.

  Raises:
    ValueError: if the feature dims differ.
    TypeError: on non-floating inputs.
  """
  who = "gaussian_kernel"
  _checks.check_floating(who, "a", a)
  _checks.check_floating(who, "b", b)
  _checks.check_ndim(who, "a", a, minimum=2)
  if a.shape[-1] != b.shape[-1] or a.ndim != b.ndim:
    raise ValueError(
      f"{who}: a and b must have the same rank and feature dim, got "
      f"{a.shape=} and {b.shape=}"
    )
  dtype = _numerics.compute_dtype(a, b)
  a, b = a.astype(dtype), b.astype(dtype)
  aa = jnp.sum(a * a, axis=-1)[..., :, None]
  bb = jnp.sum(b * b, axis=-1)[..., None, :]
  ab = jnp.einsum("...nd,...md->...nm", a, b)
  return jnp.exp(-0.5 * jnp.maximum(aa + bb - 2.0 * ab, 0.0))


def _newton_alpha(a: jax.Array, p: jax.Array, init: str) -> jax.Array:
  """The init step ``alpha`` (``V_0 = alpha P^T``), see `newton_inverse`.

  Computed on ``a`` (the matrix before the ridge), as the official code.
  Differentiable in ``a``; the backtracking count is a constant.
  """
  rows = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)
  p_rows = jnp.max(jnp.sum(jnp.abs(p), axis=-1), axis=-1)
  # Deviation: where the step on A cannot converge (A = 0, or a ridge that
  # dominates A: alpha * max_row(P)^2 >= 2 bounds sigma_max(P)), it is taken
  # on P; with P = 0 too, V = 0 (the pseudo-inverse), never inf * 0 = NaN.
  p_rows = jnp.where(p_rows > 0, p_rows, 1.0)
  if init == "row_sum":
    on_a = jnp.where(rows > 0, rows, p_rows)
    ok = (rows > 0) & (1.8 * jnp.square(p_rows / on_a) < 2.0)
    alpha = 1.8 / jnp.square(jnp.where(ok, on_a, p_rows))
    return alpha[..., None, None]
  # "backtrack" (SOFT-Norm): global alpha, halved while ||I - P V||_1 > 1.01.
  top = jnp.max(rows)
  alpha0 = 2.0 / jnp.square(jnp.where(top > 0, top, jnp.max(p_rows)))
  m = p.shape[-1]
  eye = jnp.eye(m, dtype=p.dtype).reshape((1,) * (p.ndim - 2) + (m, m))
  ps = jax.lax.stop_gradient(p)
  pst = jnp.swapaxes(ps, -1, -2)

  def residual(alpha):
    r = eye - ps @ (alpha * pst)
    return jnp.max(jnp.sum(jnp.abs(r), axis=-2))

  def cond(state):
    alpha, tries = state
    return jnp.logical_and(residual(alpha) > 1.01, tries < 10)

  def body(state):
    alpha, tries = state
    return alpha * 0.5, tries + 1

  start = (jax.lax.stop_gradient(alpha0), jnp.int32(0))
  _, tries = jax.lax.while_loop(cond, body, start)
  return alpha0 * jnp.exp2(-tries.astype(alpha0.dtype))


def _newton_iterate(
  a: jax.Array, p: jax.Array, num_iters: int, init: str
) -> jax.Array:
  v0 = _newton_alpha(a, p, init) * jnp.swapaxes(p, -1, -2)
  return jax.lax.fori_loop(0, num_iters, lambda _, v: 2.0 * v - v @ p @ v, v0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _newton_implicit(
  a: jax.Array, p: jax.Array, num_iters: int, init: str
) -> jax.Array:
  return _newton_iterate(a, p, num_iters, init)


def _newton_implicit_fwd(a, p, num_iters, init):
  v = _newton_iterate(a, p, num_iters, init)
  return v, v


def _newton_implicit_bwd(num_iters, init, v, g):
  del num_iters, init
  vt = jnp.swapaxes(v, -1, -2)
  return jnp.zeros_like(v), -(vt @ g @ vt)


_newton_implicit.defvjp(_newton_implicit_fwd, _newton_implicit_bwd)


@_scope.scoped
def newton_inverse(
  a: Float[Array, "... m m"],
  *,
  num_iters: int = 20,
  reg: float = 0.01,
  init: Literal["row_sum", "backtrack"] = "row_sum",
  grad: Literal["implicit", "unrolled"] = "implicit",
) -> Float[Array, "... m m"]:
  r"""Newton-Raphson (Newton-Schulz) approximation of :math:`(A + rI)^{-1}`.

  With :math:`P = A + r I`: :math:`V_0 = \alpha P^T`, then
  :math:`V \leftarrow 2V - V P V` for ``num_iters`` steps. The step
  :math:`\alpha` is computed on :math:`A` (before the ridge), as in the
  official code (Deviation: on :math:`P` where that step cannot converge,
  e.g. for :math:`A = 0`). SOFT's init (``"row_sum"``,
  ``SOFT/kernel/inverse.py``) is
  :math:`\alpha = 0.9 \cdot 2 / (\max_i \sum_j |A_{ij}|)^2` per matrix;
  SOFT-Norm's (``"backtrack"``, ``SoftmaxFreeNormAttentionKernel``) is
  :math:`2/(\max \sum_j |A_{ij}|)^2` taken over the whole batch and halved
  (at most 10 times) while :math:`\|I - P V_0\|_1 > 1.01`.

  Deviation: :math:`V_0 = \alpha P^T` (the official code uses
  :math:`\alpha P`): equal for symmetric matrices, and so are the gradients
  that flow into a symmetric :math:`A` (e.g. from landmarks); the transpose
  makes the iteration converge on non-symmetric matrices too. The row sums
  are of :math:`|A_{ij}|` (SOFT sums signed
  entries). They agree for SOFT's entrywise-positive Gaussian kernels, and
  the absolute sums bound :math:`\sigma_{\max}`, so the iteration also
  converges on symmetric matrices with negative entries instead of diverging.
  Convergence needs about :math:`\log_2 \mathrm{cond}(P)` plus a few steps:
  20 steps reach 1e-4 only up to a condition number of roughly 100.
  SOFT-Norm's step sits on the divergence boundary for a matrix whose top
  eigenvalue equals the largest row sum (every ``2 x 2`` kernel):
  :math:`\alpha \lambda_{\max}^2 = 2` and :math:`\|I - P V_0\|_1 = 1`, so
  backtracking keeps :math:`\alpha` and float rounding decides whether the
  iteration converges (as in the official code; a 2-landmark float32 case
  diverged to inf); use ``"row_sum"`` (factor 0.9) or more landmarks.

  ``grad="implicit"`` (SOFT's custom gradient) differentiates the exact
  inverse at the Newton result: :math:`\bar A = -V^T G V^T`; the iterations
  are not differentiated. ``"unrolled"`` backpropagates through the
  iterations and the init :math:`V_0 = \alpha P^T` (with :math:`\alpha` a
  function of :math:`A`; the number of backtracking halvings is a constant),
  as autograd does in the SOFT-Norm code.

  Args:
    a: ``(..., m, m)`` matrices.
    num_iters: Newton steps (SOFT: 20).
    reg: ridge ``r`` added to the diagonal (SOFT: 0.01; SOFT-Norm: 0).
    init: ``"row_sum"`` or ``"backtrack"``.
    grad: ``"implicit"`` or ``"unrolled"``.

  Returns:
    ``(..., m, m)`` in ``promote(a.dtype, float32)``.

  Raises:
    ValueError: if ``a`` is not square, or on a bad option.
    TypeError: if ``a`` is not floating.

  Examples:
    >>> a = jnp.array([[2.0, 0.0], [0.0, 4.0]])
    >>> print(np.asarray(attention.newton_inverse(a, reg=0.0)).round(4))
    [[0.5  0.  ]
     [0.   0.25]]

  References:
    Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity*,
    arXiv:2110.11945 (2021); Lu et al., *Softmax-free Linear Transformers*,
    arXiv:2207.03341 (2024).
  """
  who = "newton_inverse"
  _checks.check_floating(who, "a", a)
  _checks.check_ndim(who, "a", a, minimum=2)
  if a.shape[-1] != a.shape[-2]:
    raise ValueError(
      f"{who}: a must be square on its last two axes, got {a.shape=}"
    )
  _checks.check_choice(who, "init", init, ("row_sum", "backtrack"))
  _checks.check_choice(who, "grad", grad, ("implicit", "unrolled"))
  _checks.check_nonnegative(who, "num_iters", num_iters)
  dtype = _numerics.compute_dtype(a)
  m = a.shape[-1]
  eye = jnp.eye(m, dtype=dtype).reshape((1,) * (a.ndim - 2) + (m, m))
  a = a.astype(dtype)
  p = a + reg * eye
  if grad == "implicit":
    return _newton_implicit(a, p, int(num_iters), init)
  return _newton_iterate(a, p, int(num_iters), init)


@_scope.scoped
def soft_landmarks(
  query: Float[Array, "B T N H"], ratio: int, *, scale: float | None = None
) -> Float[Array, "B M N H"]:
  """Parameter-free SOFT landmarks: means of ``ratio`` consecutive tokens.

  Deviation: SOFT builds landmarks with a strided ``ratio x ratio`` conv on
  the 2-D token map followed by LayerNorm and GELU. For 1-D sequences
  jaxnorm pools the scaled query (``query * scale``, default ``H**-0.25``)
  over windows of ``ratio`` tokens, giving ``M = T / ratio`` landmarks.

  Raises:
    ValueError: if ``T`` is not divisible by ``ratio``.

  Examples:
    >>> q = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1, 1)
    >>> lm = attention.soft_landmarks(q, 2, scale=1.0)  # means of 2 tokens
    >>> print(np.asarray(lm[0, :, 0, 0]))
    [1.5 3.5]
  """
  who = "soft_landmarks"
  _checks.check_floating(who, "query", query)
  _checks.check_ndim(who, "query", query, expected=4)
  _checks.check_positive_int(who, "ratio", ratio)
  b, t, n, h = query.shape
  _checks.check_divisible(who, "query.shape[1]", t, "ratio", ratio)
  s = h**-0.25 if scale is None else scale
  dtype = _numerics.compute_dtype(query)
  q = query.astype(dtype) * s
  lm = jnp.mean(q.reshape(b, t // ratio, ratio, n, h), axis=2)
  return lm.astype(jnp.result_type(query))


@_scope.scoped
def soft_attention(
  query: Float[Array, "B T N H"],
  value: Float[Array, "B T N Hv"],
  landmarks: Float[Array, "B M N H"],
  *,
  scale: float | None = None,
  num_iters: int = 20,
  reg: float | None = None,
  init: Literal["row_sum", "backtrack"] | None = None,
  grad: Literal["implicit", "unrolled"] | None = None,
  symmetric_norm: bool = False,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT: softmax-free attention with a Gaussian kernel, linear in ``T``.

  .. math::
     \hat q = q \cdot s, \quad K_1 = \kappa(\hat q, \tilde q), \quad
     K_2 = \kappa(\tilde q, \tilde q), \quad
     \mathrm{out} = K_1 \, \mathrm{inv}(K_2) \, (K_1^T v)

  Query and key are tied (``K = Q``); ``landmarks`` :math:`\tilde q` are
  given in the scaled space (e.g. `soft_landmarks`); ``inv`` is
  `newton_inverse` (approximating :math:`(K_2 + rI)^{-1}`).

  Two official variants, selected by ``symmetric_norm``:

  * SOFT (NeurIPS'21, ``symmetric_norm=False``): ``reg=0.01``,
    ``init="row_sum"``, ``grad="implicit"`` (the custom VJP of
    ``SOFT/kernel/inverse.py``).
  * SOFT-Norm (IJCV'24, ``symmetric_norm=True``,
    ``SoftmaxFreeNormAttentionKernel``): ``reg=0``, ``init="backtrack"``,
    ``grad="unrolled"``, and the inverse becomes
    :math:`D^{-1/2}\,\mathrm{inv}(K_2)\,D^{-1/2}` with
    :math:`D = \mathrm{diag}(K_2 \mathbf{1})`.

  ``reg``, ``init`` and ``grad`` default to None, meaning the chosen
  variant's official values; an explicit value overrides it (e.g.
  ``symmetric_norm=True, reg=0.01`` is jaxnorm's earlier symmetric option).
  Evaluated right to left:
  :math:`O(T M H + M^3)` per head. SOFT's local depthwise-conv branch on
  ``v`` and the projections are the module's job.

  Args:
    query: ``(B, T, N, H)``.
    value: ``(B, T, N, Hv)``.
    landmarks: ``(B, M, N, H)``.
    scale: query scale, default ``H**-0.25``.
    num_iters: Newton steps.
    reg: diagonal ridge of the inverse; None is the variant's (0.01 / 0).
    init: Newton init, see `newton_inverse`; None is the variant's.
    grad: ``"implicit"`` (custom VJP) or ``"unrolled"``; None is the
      variant's.
    symmetric_norm: SOFT-Norm (True) or SOFT (False).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes.
    TypeError: on non-floating inputs.

  Examples:
    >>> q = jnp.zeros((1, 2, 1, 1))  # every Gaussian kernel entry is 1
    >>> v = jnp.array([1.0, 3.0]).reshape(1, 2, 1, 1)
    >>> out = attention.soft_attention(q, v, jnp.zeros((1, 1, 1, 1)))
    >>> print(np.asarray(out[0, :, 0, 0]).round(4))  # sum(v) / (1 + 0.01)
    [3.9604 3.9604]

  References:
    Lu et al., arXiv:2110.11945 (2021); Lu et al., arXiv:2207.03341 (2024).
  """
  who = "soft_attention"
  for name, x in (("query", query), ("value", value), ("landmarks", landmarks)):
    _checks.check_floating(who, name, x)
    _checks.check_ndim(who, name, x, expected=4)
  query = jnp.asarray(query)
  b, t, n, h = query.shape
  if value.shape[:3] != (b, t, n):
    raise ValueError(
      f"{who}: value must be (batch, seq, heads, dv)=({b}, {t}, {n}, dv) "
      f"like query (SOFT ties keys to queries), got {value.shape=}"
    )
  if landmarks.shape[0] != b or landmarks.shape[2:] != (n, h):
    raise ValueError(
      f"{who}: landmarks must have shape ({b}, M, {n}, {h}), got "
      f"{landmarks.shape=}"
    )
  s = h**-0.25 if scale is None else scale
  dtype = _numerics.compute_dtype(query, value, landmarks)
  q = jnp.swapaxes(query.astype(dtype) * s, 1, 2)  # B N T H
  lm = jnp.swapaxes(landmarks.astype(dtype), 1, 2)  # B N M H
  v = jnp.swapaxes(value.astype(dtype), 1, 2)  # B N T Hv
  k1 = gaussian_kernel(q, lm)  # B N T M
  k2 = gaussian_kernel(lm, lm)  # B N M M
  norm = symmetric_norm
  inv = newton_inverse(
    k2,
    num_iters=num_iters,
    reg=(0.0 if norm else 0.01) if reg is None else reg,
    init=("backtrack" if norm else "row_sum") if init is None else init,
    grad=("unrolled" if norm else "implicit") if grad is None else grad,
  )
  if symmetric_norm:
    dvec = jax.lax.rsqrt(jnp.sum(k2, axis=-1))
    inv = dvec[..., :, None] * inv * dvec[..., None, :]
  kv = jnp.einsum("bntm,bnte->bnme", k1, v)
  out = jnp.einsum("bntm,bnme->bnte", k1, inv @ kv)
  return jnp.swapaxes(out, 1, 2).astype(query.dtype)


def soft_conv_landmarks(
  query: Float[Array, "B T N H"],
  kernel: Float[Array, "r r H H"],
  norm_scale: Float[Array, " H"],
  norm_bias: Float[Array, " H"],
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  scale: float | None = None,
  eps: float = 1e-5,
) -> Float[Array, "B M N H"]:
  r"""SOFT's learned landmarks: strided conv, LayerNorm and GELU on the map.

  .. math::
     \tilde q = \mathrm{GELU}\big(\mathrm{LN}_H(\mathrm{Conv}_{r \times r,
       \mathrm{stride}\ r}(q \cdot s))\big)

  Per head, the scaled queries ``q * s`` (default ``s = H**-0.25``) of the
  map tokens form an ``(h, w, H)`` image; a bias-free ``r x r`` conv with
  stride ``r`` (``H -> H`` channels, shared by the heads, no padding, so
  ``M = (h // r) * (w // r)`` as torch floors) gives the landmarks, then a
  LayerNorm over ``H`` (eps 1e-5) and the exact (erf) GELU. Prefix tokens
  are not pooled. The landmarks live in the scaled space
  `attention.soft_attention` expects.

  Args:
    query: ``(B, T, N, H)`` with ``T = num_prefix + h * w``.
    kernel: ``(r, r, H, H)`` (``HWIO``; torch's ``(out, in, r, r)``
      transposed).
    norm_scale: ``(H,)``.
    norm_bias: ``(H,)``.
    grid_shape: ``(h, w)``.
    num_prefix: tokens before the map.
    scale: query scale, default ``H**-0.25``.
    eps: LayerNorm epsilon.

  Returns:
    ``(B, M, N, H)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, a bad grid or ``r`` above a side of
      the grid.
    TypeError: if ``query`` is not floating.

  References:
    Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity*,
    arXiv:2110.11945 (2021); code ``fudan-zvg/SOFT
    models/softmax_free_transformer.py`` (``Qlandmark_op``, ``Qnorm_act``).
  """
  who = "soft_conv_landmarks"
  _checks.check_floating(who, "query", query)
  query = jnp.asarray(query)
  _checks.check_ndim(who, "query", query, expected=4)
  b, t, n, h = query.shape
  gh, gw = _grid.check_grid(who, grid_shape, num_prefix, t)
  r = _grid.check_square_kernel(who, "kernel", kernel, (h, h), odd=False)
  if r > min(gh, gw):
    raise ValueError(
      f"{who}: the landmark window r={r} must fit the grid {grid_shape}"
    )
  _checks.check_shape(who, "norm_scale", norm_scale, (h,), "head_dim")
  _checks.check_shape(who, "norm_bias", norm_bias, (h,), "head_dim")
  s = h**-0.25 if scale is None else scale
  dtype = _numerics.compute_dtype(query)
  q = query[:, num_prefix:].astype(dtype) * s
  img = q.reshape(b, gh, gw, n, h).transpose(0, 3, 1, 2, 4)
  y = jax.lax.conv_general_dilated(
    img.reshape(b * n, gh, gw, h),
    kernel.astype(dtype),
    (r, r),
    "VALID",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )
  y = y.reshape(b, n, -1, h)
  y = jax.nn.gelu(
    norms.layer_norm(y, norm_scale, norm_bias, eps=eps), approximate=False
  )
  return jnp.swapaxes(y, 1, 2).astype(query.dtype)


def soft_local_conv(
  value: Float[Array, "B T N Hv"],
  kernel: Float[Array, "k k N"],
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT's local branch: a per-head depthwise conv of ``v`` on the map.

  .. math:: y_{n} = \mathrm{Conv}_{k \times k}(v_{n};\ w_n)

  One bias-free ``k x k`` kernel per head, shared by the head's ``Hv``
  value channels (official ``Conv2d(N, N, k, padding=k // 2, groups=N)``
  applied to each channel of the head), zero padding. The ``num_prefix``
  tokens pass their value through unchanged, as the official code does for
  [CLS] in its ratio-1 path.

  Args:
    value: ``(B, T, N, Hv)`` with ``T = num_prefix + h * w``.
    kernel: ``(k, k, N)``, odd ``k``.
    grid_shape: ``(h, w)``.
    num_prefix: tokens before the map.

  Returns:
    ``(B, T, N, Hv)`` in ``value.dtype``.

  Raises:
    ValueError: on mismatched shapes or a bad grid.
    TypeError: if ``value`` is not floating.

  References:
    Lu et al., arXiv:2110.11945 (2021); code ``fudan-zvg/SOFT``
    (``SoftmaxFreeAttentionKernel.conv``).
  """
  who = "soft_local_conv"
  _checks.check_floating(who, "value", value)
  value = jnp.asarray(value)
  _checks.check_ndim(who, "value", value, expected=4)
  b, t, n, e = value.shape
  _grid.check_grid(who, grid_shape, num_prefix, t)
  _grid.check_square_kernel(who, "kernel", kernel, (n,), odd=True)
  y = lina.lina_depthwise_conv(
    value.reshape(b, t, n * e),
    jnp.repeat(kernel, e, axis=-1),  # Channel n * Hv + j reads head n.
    grid_shape=grid_shape,
    num_prefix=num_prefix,
  ).reshape(b, t, n, e)
  return y.at[:, :num_prefix].set(value[:, :num_prefix])


@_scope.scoped
def soft_grid_attention(
  query: Float[Array, "B T N H"],
  value: Float[Array, "B T N Hv"],
  *,
  landmark_kernel: Float[Array, "r r H H"],
  landmark_scale: Float[Array, " H"],
  landmark_bias: Float[Array, " H"],
  local_kernel: Float[Array, "k k N"] | None,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  scale: float | None = None,
  norm_eps: float = 1e-5,
  **options: Any,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT's attention layer on a token map (official ``SOFT`` kernel).

  .. math::
     \mathrm{out} = \mathrm{SOFT}(q, v;\ \tilde q) + \mathrm{DWConv}(v)

  ``\tilde q`` are `soft_conv_landmarks`, ``SOFT`` is
  `jaxnorm.attention.soft_attention` (keys tied to queries, Gaussian
  kernel, Newton inverse) and the local branch `soft_local_conv` (skipped
  when ``local_kernel`` is None, the official ``use_conv = 0``). Computed in
  ``promote_types(dtype, float32)``.

  Deviation: the official ratio-1 path (a linear landmark map over every
  token and no inverse) is not reproduced; ``r = 1`` here is the general
  formula with a 1x1 conv.

  Args:
    query: ``(B, T, N, H)``.
    value: ``(B, T, N, Hv)``.
    landmark_kernel: ``(r, r, H, H)``.
    landmark_scale: landmark LayerNorm scale ``(H,)``.
    landmark_bias: landmark LayerNorm bias ``(H,)``.
    local_kernel: ``(k, k, N)`` or None.
    grid_shape: ``(h, w)`` with ``T = num_prefix + h * w``.
    num_prefix: tokens before the map.
    scale: query scale, default ``H**-0.25``.
    norm_eps: landmark LayerNorm epsilon.
    **options: the other keyword options of `attention.soft_attention`
      (``num_iters``, ``reg``, ``init``, ``grad``, ``symmetric_norm``).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or a bad grid.
    TypeError: on non-floating inputs.

  Examples:
    >>> q = jnp.zeros((1, 4, 1, 1))  # a 2 x 2 map, N = H = 1
    >>> v = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1, 1)
    >>> kw = dict(landmark_kernel=jnp.zeros((2, 2, 1, 1)), grid_shape=(2, 2),
    ...           landmark_scale=jnp.ones(1), landmark_bias=jnp.zeros(1))
    >>> y0 = attention.soft_grid_attention(q, v, local_kernel=None, **kw)
    >>> two = jnp.full((1, 1, 1), 2.0)  # a 1 x 1 depthwise kernel
    >>> y1 = attention.soft_grid_attention(q, v, local_kernel=two, **kw)
    >>> print(np.asarray(y1 - y0)[0, :, 0, 0].round(4))  # the local branch 2 v
    [2. 4. 6. 8.]

  References:
    Lu et al., arXiv:2110.11945 (2021); Lu et al., arXiv:2207.03341 (2024).
  """
  who = "soft_grid_attention"
  _checks.check_floating(who, "query", query)
  _checks.check_floating(who, "value", value)
  query = jnp.asarray(query)
  dtype = _numerics.compute_dtype(query, value)
  q, v = query.astype(dtype), value.astype(dtype)
  landmarks = soft_conv_landmarks(
    q,
    landmark_kernel,
    landmark_scale,
    landmark_bias,
    grid_shape=grid_shape,
    num_prefix=num_prefix,
    scale=scale,
    eps=norm_eps,
  )
  y = soft_attention(q, v, landmarks, scale=scale, **options)
  if local_kernel is not None:
    y = y + soft_local_conv(
      v, local_kernel, grid_shape=grid_shape, num_prefix=num_prefix
    )
  return y.astype(query.dtype)
