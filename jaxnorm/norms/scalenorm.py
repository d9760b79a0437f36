"""ScaleNorm: one learned scalar times the input's direction."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer


@_scope.scoped
def scale_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " "],
  *,
  eps: float = 1e-5,
  axis: layer.Axis = -1,
) -> Float[Array, "..."]:
  r"""ScaleNorm: project onto the sphere of radius ``scale``.

  .. math:: y = g\,\frac{x}{\max(\lVert x \rVert_2,\ \epsilon)}

  with one learnable scalar :math:`g` = ``scale`` for the whole layer (the
  paper initializes it to :math:`\sqrt{d}`, so ``y`` starts with unit RMS)
  and the norm taken over ``axis``. The official code clamps the norm at
  ``eps = 1e-5`` rather than adding ``eps``; here the clamp is applied to
  the squared norm (``sqrt(max(sum x^2, eps^2))``, the same forward), so the
  gradient at ``x = 0`` is finite (zero) instead of NaN.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token is
  normalized on its own.

  Args:
    x: input of any rank, floating dtype.
    scale: the scalar gain :math:`g`, shape ``()`` or ``(1,)``.
    eps: lower bound of the norm.
    axis: axis or axes the norm runs over.

  Returns:
    Array with the shape and dtype of ``x``; statistics in float32 or wider.

  Raises:
    TypeError: for non-floating ``x`` or ``scale``.
    ValueError: for a non-scalar ``scale`` or a bad ``axis``.

  Examples:
    >>> y = norms.scale_norm(jnp.array([3.0, 4.0]), jnp.array(10.0))
    >>> print(np.asarray(y).round(4))  # 10 x / |x|
    [6. 8.]

  References:
    Nguyen & Salazar, *Transformers without Tears: Improving the
    Normalization of Self-Attention*, arXiv:1910.05895 (2019).
  """
  who = "scale_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "scale", scale)
  x = jnp.asarray(x)
  _checks.check_scalar(who, "scale", scale)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  sum_sq = jnp.sum(jnp.square(xf), axis=axes, keepdims=True)
  norm = jnp.sqrt(jnp.maximum(sum_sq, jnp.asarray(eps, cdt) ** 2))
  g = jnp.asarray(scale).astype(cdt).reshape(())
  return (g * xf / norm).astype(x.dtype)
