"""Scale vectors: branch scales, dual placement, magnitude-direction."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer


@_scope.scoped
def magnitude_direction_scale(
  magnitude: Float[ArrayLike, " *one"],
  direction: Float[ArrayLike, " d"],
) -> Float[Array, " d"]:
  r"""A scale vector written as magnitude times unit direction.

  .. math:: \gamma = m \cdot \frac{u}{\|u\|_2} \sqrt{d}

  so ``magnitude = 1`` and ``direction = 1`` give :math:`\gamma = 1`.

  Unverified: the paper's OR / ER reparameterizations could not be read
  (abstract and digests only); this is one reading of "a global scalar
  magnitude times a direction vector". :math:`\|u\|` is clamped at 1e-12.

  Args:
    magnitude: scalar :math:`m`, shape ``()`` or ``(1,)``.
    direction: :math:`u`, shape ``(d,)``.

  Returns:
    :math:`\gamma`, shape ``(d,)``, in ``direction``'s dtype promoted to at
    least float32.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for a non-scalar magnitude or non-vector direction.

  Examples:
    >>> u = jnp.array([3.0, 4.0])
    >>> g = norms.magnitude_direction_scale(jnp.array(2.0), u)
    >>> print(np.asarray(g).round(4))  # 2 * [0.6, 0.8] * sqrt(2)
    [1.6971 2.2627]

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "magnitude_direction_scale"
  _checks.check_floating(who, "magnitude", magnitude)
  _checks.check_floating(who, "direction", direction)
  _checks.check_scalar(who, "magnitude", magnitude)
  _checks.check_ndim(who, "direction", direction, expected=1)
  u = jnp.asarray(direction)
  cdt = _numerics.compute_dtype(u)
  u = u.astype(cdt)
  m = jnp.asarray(magnitude).astype(cdt).reshape(())
  norm = jnp.maximum(jnp.linalg.norm(u), 1e-12)
  return m * u / norm * math.sqrt(u.shape[0])


@_scope.scoped
def branch_rms_norm(
  x: Float[ArrayLike, "... d"],
  scales: Sequence[Float[ArrayLike, " d"]],
  *,
  eps: float = 1e-6,
  eps_mode: layer.EpsMode = "inside",
) -> tuple[Float[Array, "... d"], ...]:
  r"""One affine-free RMSNorm read by several branches, each with its scale.

  Branch-specific heterogeneity (HG): instead of one scale shared by the
  readers of a norm (Q, K, V; or gate and up), reader ``i`` gets
  :math:`\gamma_i \odot \mathrm{RMS}(x)`. The function class is the same
  (each :math:`\gamma_i` folds into its reader's weight); the
  preconditioning differs. With equal scales every branch equals
  ``layer.rms_norm(x, scale)``.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input ``(..., d)``.
    scales: one ``(d,)`` scale per branch.
    eps: RMSNorm eps.
    eps_mode: RMSNorm eps placement.

  Returns:
    A tuple with one array per branch, each shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or scales.
    ValueError: for no scales or a bad scale shape.

  Examples:
    >>> x = jnp.array([3.0, 4.0])
    >>> q, k = norms.branch_rms_norm(x, [jnp.ones(2), jnp.full(2, 2.0)])
    >>> print(np.asarray(q).round(4), np.asarray(k).round(4))
    [0.8485 1.1314] [1.6971 2.2627]

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "branch_rms_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  scales = tuple(scales)
  if not scales:
    raise ValueError(
      f"{who}: scales must hold at least one (d,) vector, got {len(scales)}"
    )
  _numerics.check_channels(
    who, x, **{f"scales[{i}]": s for i, s in enumerate(scales)}
  )
  cdt = _numerics.compute_dtype(x)
  n = layer.rms_norm(x.astype(cdt), eps=eps, eps_mode=eps_mode)
  return tuple(
    (n * _numerics.channel(s, x.ndim, cdt)).astype(x.dtype) for s in scales
  )


@_scope.scoped
def dual_scaled_linear(
  x: Float[ArrayLike, "... d_in"],
  kernel: Float[ArrayLike, "d_in d_out"],
  scale_in: Float[ArrayLike, " d_in"] | None = None,
  scale_out: Float[ArrayLike, " d_out"] | None = None,
  *,
  dnp: bool = False,
  eps: float = 1e-6,
) -> Float[Array, "... d_out"]:
  r"""A linear map with scale vectors on both sides (dual placement, DP).

  .. math:: y = s_{out} \odot ((s_{in} \odot x) W)

  row- and column-wise preconditioning of ``W``; both scales start at 1,
  where this is the plain linear map. ``dnp=True`` (DNP) adds an
  affine-free RMS normalization of the result, after :math:`s_{out}`.

  Unverified: the position of DNP's extra normalization is our choice (the
  paper text could not be read).

  Args:
    x: input ``(..., d_in)``.
    kernel: ``(d_in, d_out)``.
    scale_in: :math:`s_{in}` or ``None`` (no input scale).
    scale_out: :math:`s_{out}` or ``None``.
    dnp: append the RMS normalization.
    eps: its eps.

  Returns:
    ``(..., d_out)`` array in ``x``'s dtype.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for mismatched shapes.

  Examples:
    >>> x = jnp.array([1.0, 2.0])
    >>> s_in, s_out = jnp.array([3.0, 1.0]), jnp.array([1.0, 10.0])
    >>> y = norms.dual_scaled_linear(x, jnp.eye(2), s_in, s_out)
    >>> print(np.asarray(y))  # s_out * ((s_in * x) @ W)
    [ 3. 20.]

  References:
    Wang et al., *Negligible in Size, Significant in Effect: On Scale
    Vectors in Large Language Models*, arXiv:2605.26895 (2026).
  """
  who = "dual_scaled_linear"
  _checks.check_floating(who, "x", x)
  _checks.check_floating(who, "kernel", kernel)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=1)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  d_in, d_out = jnp.shape(kernel)
  _checks.check_shape(
    who, "kernel", kernel, (x.shape[-1], d_out), "(x.shape[-1], d_out)"
  )
  for name, s, size in (
    ("scale_in", scale_in, d_in),
    ("scale_out", scale_out, d_out),
  ):
    if s is not None:
      _checks.check_floating(who, name, s)
      _checks.check_shape(who, name, s, (size,))
  cdt = _numerics.compute_dtype(x)
  h = x.astype(cdt)
  if scale_in is not None:
    h = h * _numerics.channel(scale_in, x.ndim, cdt)
  h = h @ jnp.asarray(kernel).astype(cdt)
  if scale_out is not None:
    h = h * _numerics.channel(scale_out, x.ndim, cdt)
  if dnp:
    h = layer.rms_norm(h, eps=eps)
  return h.astype(x.dtype)
