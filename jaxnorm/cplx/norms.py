"""Complex normalization: 2x2 whitening (batch and layer), RMS and L2 norms.

Deep Complex Networks whiten each complex feature with the inverse square
root of its 2x2 covariance of ``(Re, Im)``; CNet's TokenNorm (and the PCT's
``ComplexRMSNorm``) divides by the root mean square modulus. Statistics are
computed in complex64 / float32 (complex128 / float64 stays); outputs keep
the input dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.cplx import _common

_HALF_ROOT = 1.0 / math.sqrt(2.0)


class ComplexBatchNormState(NamedTuple):
  """Running statistics of `complex_batch_norm`.

  Attributes:
    mean: running complex mean, shape ``(C,)``.
    cov: running covariance rows ``(Vrr, Vri, Vii)``, real, shape ``(3, C)``;
      ``Vrr`` and ``Vii`` include ``eps`` (used as stored at inference).
  """

  mean: jax.Array
  cov: jax.Array


@_scope.scoped
def init_complex_batch_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.complex64
) -> ComplexBatchNormState:
  """Mean 0 and covariance ``(1/sqrt 2, 0, 1/sqrt 2)`` (the code's init).

  Args:
    num_features: ``C``.
    dtype: complex dtype of ``mean``; ``cov`` takes its real parts' dtype.

  Examples:
    >>> state = cplx.init_complex_batch_norm_state(2)
    >>> print(state.mean.dtype, state.cov.shape)  # cov rows (Vrr, Vri, Vii)
    complex64 (3, 2)
    >>> print(np.asarray(state.cov[:, 0]).round(4))
    [0.7071 0.     0.7071]
  """
  who = "init_complex_batch_norm_state"
  _checks.check_positive_int(who, "num_features", num_features)
  _common.check_complex(who, "dtype", jnp.zeros((), dtype))
  real = _common.real_dtype(dtype)
  cov = jnp.array([_HALF_ROOT, 0.0, _HALF_ROOT], real)[:, None]
  return ComplexBatchNormState(
    mean=jnp.zeros((num_features,), dtype),
    cov=jnp.broadcast_to(cov, (3, num_features)),
  )


@_scope.scoped
def init_whitening_scale(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> jax.Array:
  """``scale`` rows ``(γrr, γri, γii) = (1/sqrt 2, 0, 1/sqrt 2)``, ``(3, C)``.

  With it the whitened output has ``E|y|^2 = 1`` (Trabelsi et al.).

  Examples:
    >>> print(np.asarray(cplx.init_whitening_scale(2)).round(4))
    [[0.7071 0.7071]
     [0.     0.    ]
     [0.7071 0.7071]]
  """
  _checks.check_positive_int(
    "init_whitening_scale", "num_features", num_features
  )
  rows = jnp.array([_HALF_ROOT, 0.0, _HALF_ROOT], dtype)[:, None]
  return jnp.broadcast_to(rows, (3, num_features))


def _check_affine(
  who: str, scale: ArrayLike | None, bias: ArrayLike | None, c: int
) -> None:
  if scale is not None:
    _common.check_real(who, "scale", scale)
    _checks.check_shape(
      who, "scale", scale, (3, c), "rows (γrr, γri, γii) per feature"
    )
  if bias is not None:
    _common.check_complex(who, "bias", bias)
    _checks.check_shape(who, "bias", bias, (c,), "x.shape[axis]")


def _whiten(
  xc: jax.Array, vrr: jax.Array, vri: jax.Array, vii: jax.Array, eps: float
) -> jax.Array:
  r"""``V^{-1/2} [Re xc, Im xc]`` with the symmetric root of the 2x2 ``V``.

  ``det V`` is clamped below at ``eps^2``, its exact minimum when ``eps`` is
  already in ``Vrr`` and ``Vii``, so float rounding cannot make it negative.
  """
  det = jnp.maximum(vrr * vii - vri**2, eps**2)
  s = jnp.sqrt(det)
  t = jnp.sqrt(vrr + vii + 2.0 * s)
  inv = 1.0 / (s * t)
  wrr, wii, wri = (vii + s) * inv, (vrr + s) * inv, -vri * inv
  re, im = jnp.real(xc), jnp.imag(xc)
  return jax.lax.complex(wrr * re + wri * im, wri * re + wii * im)


def _affine(
  xhat: jax.Array,
  scale: ArrayLike | None,
  bias: ArrayLike | None,
  ax: int,
) -> jax.Array:
  """``Γ x̂ + β`` with ``Γ = [[γrr, γri], [γri, γii]]`` per feature."""
  if scale is not None:
    real = _common.real_dtype(xhat.dtype)
    g = jnp.asarray(scale).astype(real)
    grr, gri, gii = (_numerics.expand(r, xhat.ndim, (ax,), real) for r in g)
    re, im = jnp.real(xhat), jnp.imag(xhat)
    xhat = jax.lax.complex(grr * re + gri * im, gri * re + gii * im)
  if bias is not None:
    xhat = xhat + _numerics.expand(bias, xhat.ndim, (ax,), xhat.dtype)
  return xhat


def _covariance(
  xc: jax.Array, axes: tuple[int, ...], eps: float, axis_name=None
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(Vrr + eps, Vri, Vii + eps)`` of centred ``xc`` over ``axes``."""
  re, im = jnp.real(xc), jnp.imag(xc)

  def mean(t):
    return _numerics.pmean(jnp.mean(t, axis=axes, keepdims=True), axis_name)

  return mean(re * re) + eps, mean(re * im), mean(im * im) + eps


@_scope.scoped
def complex_batch_norm(
  x: Complex[ArrayLike, "... c"],
  scale: Float[ArrayLike, "3 c"] | None,
  bias: Complex[ArrayLike, " c"] | None,
  state: ComplexBatchNormState,
  *,
  training: bool,
  momentum: float = 0.9,
  eps: float = 1e-4,
  axis: int = -1,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Complex[Array, "... c"], ComplexBatchNormState]:
  r"""Complex batch normalization by 2x2 whitening (Trabelsi et al.).

  Per feature ``c``, over every other axis:

  .. math::
    \tilde x = x - \mu,\quad
    V = \begin{pmatrix} V_{rr} & V_{ri} \\ V_{ri} & V_{ii}\end{pmatrix}
      + \epsilon I,\quad
    \hat x = V^{-1/2} \begin{pmatrix}\mathrm{Re}\,\tilde x \\
      \mathrm{Im}\,\tilde x\end{pmatrix},\quad
    y = \Gamma \hat x + \beta

  with the symmetric root :math:`V^{-1/2} = \frac{1}{st}\begin{pmatrix}
  V_{ii} + s & -V_{ri} \\ -V_{ri} & V_{rr} + s\end{pmatrix}`,
  :math:`s = \sqrt{\det V}`, :math:`t = \sqrt{V_{rr} + V_{ii} + 2s}`, and
  :math:`\Gamma = \begin{pmatrix}\gamma_{rr} & \gamma_{ri} \\ \gamma_{ri} &
  \gamma_{ii}\end{pmatrix}` from the rows of ``scale``. The whitened
  ``x̂`` has identity covariance and zero pseudo-covariance ``E[x̂^2]``.

  Training uses the batch statistics and updates the running ones
  (``state <- m state + (1 - m) batch``, Keras/Flax convention, with
  ``eps`` already inside the stored ``Vrr`` and ``Vii``); inference uses the
  running statistics as stored and returns ``state`` unchanged. An empty
  batch leaves the state unchanged. Training statistics mix every example
  and position (not causal-safe); inference is per position.

  Deviation: the official Keras code takes the square roots with
  ``np.sqrt``-style ops that (per the cplxmodule notes) may block the
  gradient; here every statistic is differentiated. torchcomplex (used by
  the CV-CNN study) initializes ``Γ = I`` and uses torch momentum 0.1
  (``momentum=0.9`` here).

  Args:
    x: complex input with features on ``axis``.
    scale: real ``(3, C)`` rows ``(γrr, γri, γii)`` (init
      `init_whitening_scale`) or ``None`` (``Γ = I``).
    bias: complex ``(C,)`` or ``None``.
    state: running statistics (`init_complex_batch_norm_state`).
    training: batch statistics and a state update when True.
    momentum: decay of the running statistics (weight of the old value).
    eps: added to ``Vrr`` and ``Vii``.
    axis: the feature axis.
    axis_name: mapped axis name(s) across which the batch statistics are
      averaged (cross-device batch norm).

  Returns:
    ``(y, new_state)``: ``y`` with ``x``'s shape and dtype; ``new_state``
    with ``state``'s structure and dtypes.

  Raises:
    TypeError: for a non-complex ``x`` or ``bias``, a non-real ``scale``,
      or a state of another type.
    ValueError: for a bad ``axis``, rank below 2, or a bad parameter or
      state shape.

  Examples:
    >>> x = jnp.array([[1 + 0j], [-1 + 0j], [1j], [-1j]])  # 4 examples, C = 1
    >>> state = cplx.init_complex_batch_norm_state(1)
    >>> y, state = cplx.complex_batch_norm(
    ...     x, None, None, state, training=True, eps=0.0)
    >>> print(np.asarray(y[:, 0]).round(4))  # covariance I / 2: times sqrt 2
    [ 1.4142+0.j     -1.4142+0.j      0.    +1.4142j  0.    -1.4142j]

  References:
    Trabelsi et al., *Deep Complex Networks*, arXiv:1705.09792 (2018).
  """
  who = "complex_batch_norm"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  c = x.shape[feat]
  _check_affine(who, scale, bias, c)
  _numerics.check_state(
    who, state, ComplexBatchNormState, {"mean": (c,), "cov": (3, c)}
  )
  cdt = _common.complex_dtype(x)
  real = _common.real_dtype(cdt)
  xf = x.astype(cdt)
  reduce = _numerics.other_axes(x.ndim, (feat,))
  if training and not _numerics.is_empty(x, reduce):
    mean = _numerics.pmean(jnp.mean(xf, axis=reduce, keepdims=True), axis_name)
    xc = xf - mean
    vrr, vri, vii = _covariance(xc, reduce, eps, axis_name)
    batch_cov = jnp.stack([vrr.reshape(c), vri.reshape(c), vii.reshape(c)])
    new_state = ComplexBatchNormState(
      mean=_numerics.ema(state.mean, mean, momentum),
      cov=_numerics.ema(state.cov, batch_cov, momentum),
    )
  else:
    mean = _numerics.expand(state.mean, x.ndim, (feat,), cdt)
    xc = xf - mean
    vrr, vri, vii = (
      _numerics.expand(r, x.ndim, (feat,), real) for r in jnp.asarray(state.cov)
    )
    new_state = state
  y = _affine(_whiten(xc, vrr, vri, vii, eps), scale, bias, feat)
  return y.astype(x.dtype), new_state


@_scope.scoped
def complex_layer_norm(
  x: Complex[ArrayLike, "... d"],
  scale: Float[ArrayLike, "3 d"] | None = None,
  bias: Complex[ArrayLike, " d"] | None = None,
  *,
  eps: float = 1e-4,
  axis: int = -1,
) -> Complex[Array, "... d"]:
  r"""Complex layer normalization: 2x2 whitening over the feature axis.

  The whitening of `complex_batch_norm` with statistics over ``axis`` per
  example (per token).

  .. math:: y = \Gamma\, V_x^{-1/2} (x - \mu_x) + \beta

  with mean and covariance taken over the features of each example.
  Causal-safe on ``(batch, seq, d)`` (one statistic per token).

  Deviation (documented, not copied): Trabelsi et al.'s ``ComplexLayerNorm``
  code reduces over every non-batch, non-channel axis, i.e. per-sample
  per-channel instance whitening; this function is the layer-norm reading
  (statistics over the feature axis), with parameters per feature.

  Args:
    x: complex input, rank >= 1.
    scale: real ``(3, d)`` rows ``(γrr, γri, γii)`` or ``None``.
    bias: complex ``(d,)`` or ``None``.
    eps: added to ``Vrr`` and ``Vii``.
    axis: the feature axis.

  Returns:
    ``x``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``x`` or ``bias``, or a non-real ``scale``.
    ValueError: for a bad ``axis`` or parameter shape.

  Examples:
    >>> x = jnp.array([3 + 1j, 1 + 1j, 2 + 2j, 2 + 0j])  # mean 2 + i
    >>> y = cplx.complex_layer_norm(x, eps=0.0)  # covariance I / 2
    >>> print(np.asarray(y).round(4))  # sqrt(2) (x - mean)
    [ 1.4142+0.j     -1.4142+0.j      0.    +1.4142j  0.    -1.4142j]

  References:
    Trabelsi et al., *Deep Complex Networks*, arXiv:1705.09792 (2018).
  """
  who = "complex_layer_norm"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  _check_affine(who, scale, bias, x.shape[feat])
  xf = x.astype(_common.complex_dtype(x))
  xc = xf - jnp.mean(xf, axis=feat, keepdims=True)
  vrr, vri, vii = _covariance(xc, (feat,), eps)
  y = _affine(_whiten(xc, vrr, vri, vii, eps), scale, bias, feat)
  return y.astype(x.dtype)


@_scope.scoped
def complex_rms_norm(
  x: Complex[ArrayLike, "... d"],
  scale: Complex[ArrayLike, " d"] | None = None,
  *,
  eps: float = 1e-5,
  axis: int = -1,
) -> Complex[Array, "... d"]:
  r"""CNet's TokenNorm: division by the root mean square modulus.

  .. math:: r = \sqrt{\tfrac{1}{d}\textstyle\sum_j |x_j|^2 + \epsilon},
     \qquad y = \mathrm{scale} \odot x / r

  Phase-equivariant: :math:`f(e^{i\alpha}x) = e^{i\alpha}f(x)` for any
  complex ``scale``. With ``scale=None`` it equals
  ``to_complex(rms_norm(to_real(x), eps=eps/2)) / sqrt(2)``. CNet's
  hand-written backward is
  :math:`\partial L/\partial x = g_O/r - \bar x\,T/(2 d r^3)`,
  :math:`T = \sum (g_O x + g_{\bar O} \bar x)`, which is JAX's VJP under the
  Wirtinger mapping (tested). The PCT's ``ComplexRMSNorm``,
  :math:`x\gamma d^{-1/2} / \sqrt{\max(\sum|x|^2, 10^{-12})}`, is
  ``complex_rms_norm(x, γ / d)`` up to where its eps sits.

  Causal-safe on ``(batch, seq, d)`` (per token).

  Args:
    x: complex input.
    scale: complex ``(d,)`` gain (init 1) or ``None`` (CNet: none).
    eps: added to the mean square modulus.
    axis: the feature axis.

  Returns:
    ``x``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``x`` or ``scale``.
    ValueError: for a bad ``axis`` or ``scale`` shape.

  Examples:
    >>> y = cplx.complex_rms_norm(jnp.array([1 + 1j, 1 - 1j]), eps=0.0)
    >>> print(np.asarray(y).round(4))  # RMS modulus sqrt(2)
    [0.7071+0.7071j 0.7071-0.7071j]

  References:
    Crasmaru, *CNet* (C++/CUDA complex-valued network library, code
    ``crasmarum/CNet``; TokenNorm read in the code, not in the paper);
    Hioki, *Complex-Valued Phase-Coherent Transformer*, arXiv:2605.10123
    (2026).
  """
  who = "complex_rms_norm"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  if scale is not None:
    _common.check_complex(who, "scale", scale)
    _checks.check_shape(who, "scale", scale, (x.shape[feat],), "x.shape[axis]")
  xf = x.astype(_common.complex_dtype(x))
  ms = jnp.mean(_common.abs2(xf), axis=feat, keepdims=True)
  y = xf * jax.lax.rsqrt(ms + eps).astype(xf.dtype)
  if scale is not None:
    y = y * _numerics.expand(scale, x.ndim, (feat,), xf.dtype)
  return y.astype(x.dtype)


@_scope.scoped
def pct_rms_norm(
  x: Complex[ArrayLike, "... d"],
  scale: Complex[ArrayLike, " d"] | None = None,
  *,
  eps: float = 1e-12,
  axis: int = -1,
) -> Complex[Array, "... d"]:
  r"""The Phase-Coherent Transformer's ``ComplexRMSNorm`` (output RMS 1/d).

  .. math:: y = \mathrm{scale} \odot \frac{x}{\sqrt{d}\,
     \sqrt{\max(\sum_j |x_j|^2,\ \epsilon)}}

  The PCT's official norm (``baselines/lucidrains_cvt``, ``ComplexRMSNorm``
  as the PCT repository modified it: ``self.scale = dim ** -0.5`` where
  lucidrains has ``dim ** 0.5``): the L2-normalized token times a complex
  gain (init 1) and :math:`d^{-1/2}`, so with unit gain the token's L2 norm
  is :math:`d^{-1/2}` and its per-element RMS modulus :math:`1/d`, not 1 as
  in CNet's TokenNorm (`complex_rms_norm`). ``eps`` clamps the sum of
  squares from below (``clamp_min(1e-12)``), it is not added: away from 0
  this is exactly ``complex_rms_norm(x, scale / d, eps=0)``. An all-zero
  token returns zeros with a finite gradient. The sum of squares is taken
  of ``x / m`` with ``m = max(max_j |x_j|, sqrt(eps))`` (the same value in
  exact arithmetic), so tokens of modulus 1e30 normalize instead of
  overflowing to zero.

  Phase-equivariant (:math:`f(e^{i\alpha}x) = e^{i\alpha}f(x)`) and
  invariant to a positive rescaling of ``x`` (where the clamp is inactive).

  Args:
    x: complex input.
    scale: complex ``(d,)`` gain (the code's ``gamma``, init 1) or ``None``.
    eps: the lower clamp of :math:`\sum_j |x_j|^2`, > 0.
    axis: the feature axis.

  Returns:
    ``x``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``x`` or ``scale``.
    ValueError: for a bad ``axis`` or ``scale`` shape, or ``eps <= 0``.

  Examples:
    >>> y = cplx.pct_rms_norm(jnp.array([3 + 0j, 4j, 0j, 0j]))  # d = 4
    >>> print(np.asarray(y).round(4))  # x / (||x|| sqrt(d)), ||x|| = 5
    [0.3+0.j  0. +0.4j 0. +0.j  0. +0.j ]

  References:
    Hioki, *Complex-Valued Phase-Coherent Transformer*, arXiv:2605.10123
    (2026); code ``leohio/phase-coherent-transformer-r-d`` at commit
    ``aa228b76c47f10697f964a9b2782e367a32774e5``,
    ``code/complex_nn_experiment/baselines/lucidrains_cvt/``
    ``complex_valued_transformer.py``.
  """
  who = "pct_rms_norm"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  (feat,) = _checks.normalize_axes(who, axis, x.ndim)
  if scale is not None:
    _common.check_complex(who, "scale", scale)
    _checks.check_shape(who, "scale", scale, (x.shape[feat],), "x.shape[axis]")
  if not eps > 0:
    raise ValueError(
      f"{who}: eps must be > 0 (the clamp keeps an all-zero token finite), "
      f"got eps={eps!r}"
    )
  xf = x.astype(_common.complex_dtype(x))
  d = x.shape[feat]
  real = jnp.abs(xf).dtype
  # max(sum |x|^2, eps) = m^2 max(sum |x/m|^2, eps/m^2), with m >= sqrt(eps)
  # so that eps/m^2 <= 1 and |x/m| <= 1: no overflow, no 0/0.
  m = jax.lax.stop_gradient(
    jnp.maximum(
      jnp.max(jnp.abs(xf), axis=feat, keepdims=True),
      jnp.sqrt(jnp.asarray(eps, real)),
    )
  )
  u = xf / m.astype(xf.dtype)
  sq = jnp.sum(_common.abs2(u), axis=feat, keepdims=True)
  inv = jax.lax.rsqrt(jnp.maximum(sq, eps / jnp.square(m)) * d)
  y = u * inv.astype(xf.dtype)
  if scale is not None:
    y = y * _numerics.expand(scale, x.ndim, (feat,), xf.dtype)
  return y.astype(x.dtype)


@_scope.scoped
def complex_l2_normalize(
  z: Complex[ArrayLike, "..."],
  *,
  axis: int | tuple[int, ...] = -1,
  eps: float = 0.0,
) -> Complex[Array, "..."]:
  r"""``z / sqrt(sum |z|^2 + eps)`` over ``axis`` (CNet's block "SoftMax").

  CNet calls this layer ``SoftMax`` although it is not a softmax: it scales
  a whole block to unit L2 norm, and a 10-block model diverges without it
  (CNet paper, Table 1). The PCT normalizes queries and keys with it
  (``eps=1e-8``). A block that is all zero returns zeros (the norm is
  replaced by 1 there, so the gradient stays finite).

  Args:
    z: complex input.
    axis: axis or axes of the block.
    eps: added under the square root.

  Returns:
    ``z``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``z``.
    ValueError: for a bad ``axis``.

  Examples:
    >>> y = cplx.complex_l2_normalize(jnp.array([3 + 0j, 4j]))
    >>> print(np.asarray(y).round(4))
    [0.6+0.j  0. +0.8j]

  References:
    Crasmaru, *CNet* (paper §§5-6 and code ``crasmarum/CNet``).
  """
  who = "complex_l2_normalize"
  _common.check_complex(who, "z", z)
  z = jnp.asarray(z)
  axes = _checks.normalize_axes(who, axis, z.ndim)
  zf = z.astype(_common.complex_dtype(z))
  sq = jnp.sum(_common.abs2(zf), axis=axes, keepdims=True) + eps
  pos = sq > 0
  inv = jnp.where(pos, jax.lax.rsqrt(jnp.where(pos, sq, 1.0)), 0.0)
  return (zf * inv.astype(zf.dtype)).astype(z.dtype)
