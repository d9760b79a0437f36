"""Token maps: the sequence layout of the SOFT and NaLaFormer map layers.

A token sequence ``(B, T, ...)`` holds ``num_prefix`` tokens without a
position (e.g. a ViT's [CLS]) followed by the ``grid_shape = (h, w)`` map in
row-major order, ``T = num_prefix + h * w``.
"""

from __future__ import annotations

from typing import Any

import jax

from jaxnorm import _checks


def grid_tokens(
  grid_shape: tuple[int, int], num_prefix: int = 0, *, who: str = "grid_tokens"
) -> int:
  """The token count ``num_prefix + h * w`` of a token map.

  Args:
    grid_shape: ``(h, w)``, two positive ints.
    num_prefix: tokens before the map (e.g. 1 for a [CLS]), ``>= 0``.
    who: the caller's name, for the message.

  Returns:
    ``num_prefix + h * w``.

  Raises:
    ValueError: if ``grid_shape`` is not two positive ints or
      ``num_prefix`` is not a non-negative int.
  """
  if (
    not isinstance(grid_shape, tuple)
    or len(grid_shape) != 2
    or not all(
      isinstance(g, int) and not isinstance(g, bool) and g > 0
      for g in grid_shape
    )
  ):
    raise ValueError(
      f"{who}: grid_shape must be a tuple of two positive ints (h, w), got "
      f"{grid_shape=}"
    )
  if isinstance(num_prefix, bool) or not isinstance(num_prefix, int):
    raise ValueError(
      f"{who}: num_prefix must be a non-negative int, got {num_prefix=}"
    )
  _checks.check_nonnegative(who, "num_prefix", num_prefix)
  return num_prefix + grid_shape[0] * grid_shape[1]


def check_grid(
  who: str, grid_shape: Any, num_prefix: Any, length: int
) -> tuple[int, int]:
  """Checks ``grid_shape``/``num_prefix`` against a sequence length."""
  total = grid_tokens(grid_shape, num_prefix, who=who)
  if length != total:
    raise ValueError(
      f"{who}: the sequence must hold num_prefix + h * w = {num_prefix} + "
      f"{grid_shape[0]} * {grid_shape[1]} = {total} tokens, got {length}"
    )
  return grid_shape


def check_square_kernel(
  who: str, name: str, kernel: jax.Array, tail: tuple[int, ...], odd: bool
) -> int:
  """Checks a ``(k, k, *tail)`` kernel; returns ``k``."""
  k = kernel.shape[0] if kernel.ndim else 0
  if (
    kernel.ndim != 2 + len(tail)
    or kernel.shape[1] != k
    or tuple(kernel.shape[2:]) != tail
    or (odd and k % 2 == 0)
  ):
    kind = "odd k" if odd else "k"
    raise ValueError(
      f"{who}: {name} must have shape (k, k, {', '.join(map(str, tail))}) "
      f"with {kind}, got {name}.shape={kernel.shape}"
    )
  return k
