"""Rotary position embedding (used by the module and NaLa's numerator)."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope


@_scope.scoped
def rope(
  x: Float[Array, "B T N H"],
  positions: Float[Array, "B T"] | None = None,
  *,
  base: float = 10000.0,
) -> Float[Array, "B T N H"]:
  r"""Rotary position embedding (rotate-half layout) on the last axis.

  Pairs dimension ``i`` with ``i + H/2`` and rotates it by
  :math:`\theta_i p` with :math:`\theta_i = \mathrm{base}^{-2i/H}`, so
  :math:`\langle R_p q, R_{p'} k \rangle` depends on ``p - p'`` only.

  Args:
    x: ``(B, T, N, H)`` with even ``H``.
    positions: ``(B, T)`` or ``(T,)`` positions; default ``arange(T)``.
    base: the frequency base.

  Returns:
    ``x.shape`` in ``x.dtype`` (rotation computed in float32).

  Raises:
    ValueError: if ``x`` is not rank 4, ``H`` is odd, or ``positions`` has
      the wrong shape.

  Examples:
    >>> x = jnp.ones((1, 2, 1, 2))  # positions 0 and 1, theta = 1
    >>> y = attention.rope(x)
    >>> print(np.asarray(y[0, :, 0]).round(4))  # [cos - sin, sin + cos] at 1
    [[ 1.      1.    ]
     [-0.3012  1.3818]]

  References:
    Su et al., *RoFormer: Enhanced Transformer with Rotary Position
    Embedding*, arXiv:2104.09864 (2021).
  """
  who = "rope"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=4)
  b, t, _, h = x.shape
  if h % 2:
    raise ValueError(f"{who}: the head dim must be even, got {x.shape=}")
  if positions is None:
    positions = jnp.arange(t, dtype=jnp.float32)
  positions = jnp.asarray(positions)
  if positions.shape == (t,):
    positions = positions[None]
  if positions.shape not in ((1, t), (b, t)):
    raise ValueError(
      f"{who}: positions must have shape ({t},) or ({b}, {t}), got "
      f"{positions.shape=}"
    )
  dtype = _numerics.compute_dtype(x)
  half = h // 2
  inv = base ** (-jnp.arange(half, dtype=dtype) * 2.0 / h)
  ang = positions.astype(dtype)[..., None] * inv.reshape(1, 1, half)
  cos = jnp.cos(ang)[:, :, None, :]
  sin = jnp.sin(ang)[:, :, None, :]
  x1, x2 = x[..., :half].astype(dtype), x[..., half:].astype(dtype)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
