"""Residual add fused with a normalization: the pre-norm block's hot loop.

A pre-norm block computes ``h = residual + branch(...)`` and immediately
``norm(h)`` for the next branch. Written separately that is three passes over
memory (read x, r; write h; read h; write y); the functions here return both
``h`` and ``y`` from one call, so ``implementation="pallas"`` can run them as
one fused kernel (`pallas_kernels.norms.add_rms_norm_pallas`). The
``"xla"`` path is the reference: the add, then `jaxnorm.norms.rms_norm` /
`layer_norm` on the stored stream.

Conventions: the add is done in ``promote_types(dtype, float32)`` and stored
in ``residual.dtype`` (the stream's precision); the norm normalizes that
stored value, so ``y == rms_norm(h)`` exactly; both outputs have
``residual.dtype``.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import fused_norms
  >>> h, y = fused_norms.add_rms_norm(jnp.array([1.0, 3.0]), jnp.ones(2))
  >>> print(np.asarray(h), np.asarray(y).round(4))  # rms_norm([2, 4])
  [2. 4.] [0.6325 1.2649]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope, norms

__all__ = ["add_layer_norm", "add_rms_norm"]


def _add(who: str, x: Any, residual: Any, axis: norms.Axis) -> jax.Array:
  """``residual + x`` in the compute dtype, stored in ``residual.dtype``.

  Checks the inputs and ``axis`` first, so errors name the fused function.
  """
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "residual", residual)
  x, residual = jnp.asarray(x), jnp.asarray(residual)
  _checks.check_shape(who, "residual", residual, x.shape, "x.shape")
  _checks.normalize_axes(who, axis, x.ndim)
  cdt = _numerics.compute_dtype(x, residual)
  return (x.astype(cdt) + residual.astype(cdt)).astype(residual.dtype)


def _unfused(implementation: Any) -> Any:
  """The norm's ``implementation`` when the fused reference runs.

  ``"xla"`` stays the reference all the way down; under ``None`` (the fused
  kernel absent or refusing the case) the unfused norm may still take its
  own kernel.
  """
  return "xla" if implementation == "xla" else None


@_scope.scoped
def add_rms_norm(
  x: Float[ArrayLike, "..."],
  residual: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: norms.Axis = -1,
  eps_mode: str = "inside",
  scale_offset: float = 0.0,
  implementation: _dispatch.Implementation | None = None,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  r"""Residual add followed by RMSNorm, returning both.

  .. math::
    h = \mathrm{residual} + x,\qquad
    y = \mathrm{rms\_norm}(h; \mathrm{scale}, \epsilon)

  Args:
    x: the branch output, any rank, floating.
    residual: the residual stream, same shape as ``x``.
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    eps: stabilizer (see `jaxnorm.norms.rms_norm`).
    axis: axis or axes to normalize over.
    eps_mode: ``"inside"`` or ``"outside"`` the square root.
    scale_offset: constant added to ``scale``.
    implementation: ``"xla"`` (reference), ``"pallas"`` (fused kernel) or
      ``None`` (the kernel on GPU/TPU when it supports the case).

  Returns:
    ``(h, y)``: the new stream and its normalized value, both in
    ``residual.dtype``.

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for mismatched shapes, bad axis, scale or implementation.
    NotImplementedError: ``implementation="pallas"`` on an unsupported case.

  Examples:
    >>> x, stream = jnp.array([1.0, 3.0]), jnp.array([2.0, 1.0])
    >>> h, y = fused_norms.add_rms_norm(x, stream)
    >>> print(np.asarray(h), np.asarray(y).round(4))  # h = [3, 4], rms_norm(h)
    [3. 4.] [0.8485 1.1314]

  References:
    Zhang & Sennrich, *Root Mean Square Layer Normalization*,
    arXiv:1910.07467 (2019); Xiong et al., *On Layer Normalization in the
    Transformer Architecture*, arXiv:2002.04745 (2020) (pre-norm).
  """
  who = "add_rms_norm"

  def reference():
    h = _add(who, x, residual, axis)
    return h, norms.rms_norm(
      h,
      scale,
      eps=eps,
      axis=axis,
      eps_mode=eps_mode,
      scale_offset=scale_offset,
      implementation=_unfused(implementation),
    )

  return _dispatch.dispatch(
    who,
    implementation,
    "add_rms_norm_pallas",
    lambda k: k(
      x,
      residual,
      scale,
      eps=eps,
      axis=axis,
      eps_mode=eps_mode,
      scale_offset=scale_offset,
    ),
    reference,
    arrays=(x,),
  )


@_scope.scoped
def add_layer_norm(
  x: Float[ArrayLike, "..."],
  residual: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: norms.Axis = -1,
  scale_offset: float = 0.0,
  implementation: _dispatch.Implementation | None = None,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  r"""Residual add followed by LayerNorm, returning both.

  .. math::
    h = \mathrm{residual} + x,\qquad
    y = \mathrm{layer\_norm}(h; \mathrm{scale}, \mathrm{bias}, \epsilon)

  Args:
    x: the branch output, any rank, floating.
    residual: the residual stream, same shape as ``x``.
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    bias: offset of shape ``x.shape[axis]`` or ``None``.
    eps: added to the variance.
    axis: axis or axes to normalize over.
    scale_offset: constant added to ``scale``.
    implementation: ``"xla"``, ``"pallas"`` or ``None`` (see
      `add_rms_norm`).

  Returns:
    ``(h, y)`` in ``residual.dtype``.

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for mismatched shapes, bad axis, parameters or
      implementation.
    NotImplementedError: ``implementation="pallas"`` on an unsupported case.

  Examples:
    >>> x, stream = jnp.array([1.0, 3.0]), jnp.array([2.0, 1.0])
    >>> h, y = fused_norms.add_layer_norm(x, stream)
    >>> print(np.asarray(h), np.asarray(y).round(4))  # layer_norm([3, 4])
    [3. 4.] [-1.  1.]

  References:
    Ba, Kiros & Hinton, *Layer Normalization*, arXiv:1607.06450 (2016).
  """
  who = "add_layer_norm"

  def reference():
    h = _add(who, x, residual, axis)
    return h, norms.layer_norm(
      h,
      scale,
      bias,
      eps=eps,
      axis=axis,
      scale_offset=scale_offset,
      implementation=_unfused(implementation),
    )

  return _dispatch.dispatch(
    who,
    implementation,
    "add_layer_norm_pallas",
    lambda k: k(
      x, residual, scale, bias, eps=eps, axis=axis, scale_offset=scale_offset
    ),
    reference,
    arrays=(x,),
  )
