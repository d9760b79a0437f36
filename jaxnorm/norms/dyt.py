"""Dynamic Tanh (DyT), an element-wise stand-in for a normalization."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope
from jaxnorm.norms import layer


@_scope.scoped
def dyt(
  x: Float[ArrayLike, "..."],
  alpha: Float[ArrayLike, " "],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  axis: layer.Axis = -1,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "..."]:
  r"""Dynamic Tanh, an element-wise stand-in for a normalization layer.

  .. math:: y = \mathrm{scale} \odot \tanh(\alpha\,x) + \mathrm{bias}

  ``alpha`` is one learnable scalar (initialized to 0.5 for vision models;
  the LLaMA recipe uses 0.8/0.2 for 7B attention/FFN inputs and no bias).
  No statistics are computed, so rows never interact.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input of any rank, floating dtype.
    alpha: scalar, shape ``()`` or ``(1,)``.
    scale: gain over ``axis`` or ``None``.
    bias: offset over ``axis`` or ``None``.
    axis: axis or axes that ``scale`` and ``bias`` run along.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a non-scalar ``alpha``, a bad ``axis`` or parameter shape.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  Examples:
    >>> y = norms.dyt(jnp.array([0.0, 1.0, 100.0]), jnp.array(0.5))
    >>> print(np.asarray(y).round(4))  # tanh(x / 2)
    [0.     0.4621 1.    ]

  References:
    Zhu, Chen, He, LeCun & Liu, *Transformers without Normalization*,
    arXiv:2503.10622 (2025).
  """
  who = "dyt"
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "alpha", alpha)
  x = jnp.asarray(x)
  _checks.check_scalar(who, "alpha", alpha)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _numerics.check_param(who, "scale", scale, x, axes)
  _numerics.check_param(who, "bias", bias, x, axes)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "dyt_pallas",
    lambda k: k(x, alpha, scale, bias, axis=axes),
    arrays=(x,),
  )
  if out is not None:
    return out
  cdt = _numerics.compute_dtype(x)
  a = jnp.asarray(alpha).astype(cdt).reshape(())
  y = _numerics.affine(jnp.tanh(a * x.astype(cdt)), scale, bias, axes)
  return y.astype(x.dtype)
