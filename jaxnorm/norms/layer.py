"""LayerNorm, RMSNorm and CRMSNorm: per-token normalization over ``axis``.

The references (``implementation="xla"``) are the equations in
`jax.numpy`, differentiated by autodiff; the hand-derived backward (``dx`` in
one expression from recomputed per-row statistics) is the Pallas kernels'
(`pallas_kernels.norms`), tested against autodiff of these. All three are
per token, so they are causal-safe on ``(batch, seq, d)`` inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope
from jaxnorm.norms import masked

Axis = int | Sequence[int]
EpsMode = Literal["inside", "outside"]
EPS_MODES: tuple[str, ...] = ("inside", "outside")


@_scope.scoped
def layer_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  scale_offset: float = 0.0,
  mask: Bool[ArrayLike, "..."] | None = None,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Layer normalization over ``axis``.

  .. math::
    y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot
        \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \mathrm{bias},
    \quad \mu = \mathrm{mean}_{axis}(x),\;
    \sigma^2 = \mathrm{mean}_{axis}((x - \mu)^2)

  ``eps`` sits inside the square root, as in Flax and torch.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input of any rank, floating dtype.
    scale: gain of shape ``x.shape[axis]`` (a tuple of sizes for several
      axes); ``None`` means no gain.
    bias: offset, same shape as ``scale``; ``None`` means no offset.
    eps: added to the variance.
    axis: axis or axes to normalize over.
    scale_offset: constant added to ``scale`` (1.0 gives the ``1 + scale``
      parameterization of Gemma-style models).
    mask: boolean, flax's ``mask=``: the statistics run over the ``True``
      elements only (`jaxnorm.norms.masked`); features on the last axis.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Normalized array with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x``, ``scale`` or ``bias`` is not floating.
    ValueError: if ``axis`` is out of range or a parameter has the wrong shape.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  Examples:
    >>> y = norms.layer_norm(jnp.array([1.0, 2.0, 3.0]))  # mean 2, var 2/3
    >>> print(np.asarray(y).round(4))
    [-1.2247  0.      1.2247]
    >>> y = norms.layer_norm(jnp.array([1.0, 2.0, 3.0]), jnp.full(3, 2.0))
    >>> print(np.asarray(y).round(4))  # scale 2
    [-2.4495  0.      2.4495]

  References:
    Ba, Kiros & Hinton, *Layer Normalization*, arXiv:1607.06450 (2016).
  """
  who = "layer_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _numerics.check_param(who, "scale", scale, x, axes)
  _numerics.check_param(who, "bias", bias, x, axes)
  if mask is not None:
    masked.check_masked_call(who, axes, x.ndim, implementation)
    return masked.layer_norm(
      x, scale, bias, mask, eps=eps, scale_offset=scale_offset
    )
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "layer_norm_pallas",
    lambda k: k(x, scale, bias, eps=eps, axis=axes, scale_offset=scale_offset),
    arrays=(x,),
  )
  if out is not None:
    return out
  xf = x.astype(_numerics.compute_dtype(x))
  mean, var = _numerics.moments(xf, axes)
  y = (xf - mean) * jax.lax.rsqrt(var + eps)
  y = _numerics.affine(y, scale, bias, axes, scale_offset=scale_offset)
  return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# RMSNorm.


@_scope.scoped
def rms_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  eps_mode: EpsMode = "inside",
  scale_offset: float = 0.0,
  mask: Bool[ArrayLike, "..."] | None = None,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Root-mean-square normalization over ``axis`` (no re-centering).

  .. math::
    y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot x \cdot k,\quad
    k = \begin{cases}
      1/\sqrt{\mathrm{mean}_{axis}(x^2) + \epsilon} & \text{inside}\\
      1/(\sqrt{\mathrm{mean}_{axis}(x^2)} + \epsilon) & \text{outside}
    \end{cases}

  ``eps_mode="inside"`` is the Flax, torch and LLaMA convention (and the
  default); ``"outside"`` is the official ``bzhangGo/rmsnorm`` torch code,
  which uses ``eps=1e-8``. There the gradient on an all-zero row is its
  limit, slope ``1/eps`` (the root is guarded at zero).

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input of any rank, floating dtype.
    scale: gain of shape ``x.shape[axis]``; ``None`` means no gain.
    eps: stabilizer, placed according to ``eps_mode``.
    axis: axis or axes to normalize over.
    eps_mode: ``"inside"`` or ``"outside"`` the square root.
    scale_offset: constant added to ``scale`` (1.0 for ``1 + scale``).
    mask: boolean, flax's ``mask=``: the mean square runs over the ``True``
      elements only (`jaxnorm.norms.masked`); features on the last axis.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Normalized array with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x`` or ``scale`` is not floating.
    ValueError: for a bad ``axis``, ``scale`` shape or ``eps_mode``.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  Examples:
    >>> y = norms.rms_norm(jnp.array([3.0, 4.0]), jnp.ones(2))  # RMS sqrt(12.5)
    >>> print(np.asarray(y).round(4))
    [0.8485 1.1314]
    >>> y = norms.rms_norm(jnp.array([3.0, 4.0]), jnp.ones(2), scale_offset=1.0)
    >>> print(np.asarray(y).round(4))  # gain 1 + scale = 2
    [1.6971 2.2627]

  References:
    Zhang & Sennrich, *Root Mean Square Layer Normalization*,
    arXiv:1910.07467 (2019).
  """
  who = "rms_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, EPS_MODES)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _numerics.check_param(who, "scale", scale, x, axes)
  if mask is not None:
    masked.check_masked_call(who, axes, x.ndim, implementation)
    return masked.rms_norm(
      x, scale, mask, eps=eps, eps_mode=eps_mode, scale_offset=scale_offset
    )
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "rms_norm_pallas",
    lambda k: k(
      x, scale, eps=eps, axis=axes, eps_mode=eps_mode, scale_offset=scale_offset
    ),
    arrays=(x,),
  )
  if out is not None:
    return out
  xf = x.astype(_numerics.compute_dtype(x))
  ms = jnp.mean(jnp.square(xf), axis=axes, keepdims=True)
  y = xf * _numerics.rms_factor(ms, eps, eps_mode)
  y = _numerics.affine(y, scale, None, axes, scale_offset=scale_offset)
  return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# CRMSNorm.


@_scope.scoped
def crms_norm(
  z: Float[ArrayLike, "... d_minus_1"],
  scale: Float[ArrayLike, " d_minus_1"] | None = None,
  *,
  eps: float = 1e-6,
  axis: int = -1,
) -> Float[Array, "... d_minus_1"]:
  r"""Compressed RMSNorm on the ``(d-1)``-dim form of zero-mean vectors.

  A zero-mean ``x`` in :math:`\mathbb{R}^d` is stored as its first ``d-1``
  coordinates ``z``; the dropped one is :math:`x_d = -\sum_i z_i`, so

  .. math::
    \mathrm{CRMS}(z) = \mathrm{scale} \odot
      \frac{z}{\sqrt{\left(\sum_i z_i^2 + (\sum_i z_i)^2\right) / d
      + \epsilon}},

  with ``d = z.shape[axis] + 1`` (the original width). For zero-mean ``x``,
  ``crms_norm(x[..., :-1]) == rms_norm(x)[..., :-1]``.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    z: compressed input, ``d-1`` features on ``axis``.
    scale: gain of shape ``(d-1,)``; ``None`` means none.
    eps: added inside the square root (the source model's LayerNorm eps).
    axis: the feature axis.

  Returns:
    Array with the shape and dtype of ``z``.

  Raises:
    TypeError: if ``z`` or ``scale`` is not floating.
    ValueError: for a bad ``axis`` or ``scale`` shape.

  Examples:
    >>> x = jnp.array([1.0, -3.0, 2.0])  # zero mean: stored as its first two
    >>> print(np.asarray(norms.crms_norm(x[:2])).round(4))
    [ 0.4629 -1.3887]
    >>> print(np.asarray(norms.rms_norm(x)).round(4))
    [ 0.4629 -1.3887  0.9258]

  References:
    Jiang, Gu, Zhu & Pan, *Pre-RMSNorm and Pre-CRMSNorm Transformers:
    Equivalent and Efficient Pre-LN Transformers*, NeurIPS 2023,
    arXiv:2305.14858.
  """
  who = "crms_norm"
  _checks.check_floating(who, "z", z)
  z = jnp.asarray(z)
  axes = _checks.normalize_axes(who, axis, z.ndim)
  _numerics.check_param(who, "scale", scale, z, axes)
  cdt = _numerics.compute_dtype(z)
  zf = z.astype(cdt)
  d = z.shape[axes[0]] + 1
  sq = jnp.sum(jnp.square(zf), axis=axes, keepdims=True)
  total = jnp.sum(zf, axis=axes, keepdims=True)
  y = zf * jax.lax.rsqrt((sq + jnp.square(total)) / d + eps)
  return _numerics.affine(y, scale, None, axes).astype(z.dtype)
