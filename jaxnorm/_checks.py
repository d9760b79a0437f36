"""Static input validation shared by every jaxnorm function and module.

Each helper checks facts known at trace time (shapes, ranks, axes, dtypes,
config values) and raises before any math runs. Messages follow one pattern:
``"<who>: <argument> must <expectation>, got <what arrived>"``, so a user sees
which call failed, which argument was wrong and what would have been accepted.
No helper inspects array values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np


def check_floating(who: str, name: str, x: Any) -> None:
  """Raises `TypeError` unless ``x`` has a floating-point dtype."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
      f"{who}: {name} must have a floating dtype (float16, bfloat16, "
      f"float32 or float64), got {name}.dtype={dtype}; cast it with "
      f"{name}.astype(jnp.float32)"
    )


def check_ndim(
  who: str,
  name: str,
  x: Any,
  *,
  expected: int | None = None,
  minimum: int | None = None,
) -> None:
  """Raises `ValueError` unless ``x.ndim`` equals or reaches the given rank."""
  ndim = np.ndim(x)
  if expected is not None and ndim != expected:
    raise ValueError(
      f"{who}: {name} must have rank {expected}, got {name}.ndim={ndim} "
      f"({name}.shape={np.shape(x)})"
    )
  if minimum is not None and ndim < minimum:
    raise ValueError(
      f"{who}: {name} must have rank >= {minimum}, got {name}.ndim={ndim} "
      f"({name}.shape={np.shape(x)})"
    )


def normalize_axes(
  who: str, axis: int | Sequence[int], ndim: int, *, name: str = "axis"
) -> tuple[int, ...]:
  """Returns ``axis`` as a sorted tuple of non-negative, distinct axes.

  ``name`` is the argument's name in the messages.

  Raises:
    ValueError: if an axis is out of range for rank ``ndim`` (every axis
      is, for a rank-0 input), repeated, or ``axis`` is an empty sequence.
  """
  axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
  if not axes:
    raise ValueError(
      f"{who}: {name} must name at least one axis, got {name}={axis!r}"
    )
  if ndim == 0:
    raise ValueError(
      f"{who}: {name}={axis!r} needs an input of rank >= 1, got a scalar "
      "(rank 0)"
    )
  out = []
  for a in axes:
    if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
      raise ValueError(
        f"{who}: {name} must be integers in [-{ndim}, {ndim}) for an input "
        f"of rank {ndim}, got {name}={axis!r}"
      )
    out.append(int(a) % ndim)
  if len(set(out)) != len(out):
    raise ValueError(
      f"{who}: {name} must not repeat an axis, got {name}={axis!r}"
    )
  return tuple(sorted(out))


def check_shape(
  who: str, name: str, x: Any, expected: Sequence[int], hint: str = ""
) -> None:
  """Raises `ValueError` unless ``x.shape == expected``."""
  shape = tuple(np.shape(x))
  if shape != tuple(expected):
    where = f" ({hint})" if hint else ""
    raise ValueError(
      f"{who}: {name} must have shape {tuple(expected)}{where}, got "
      f"{name}.shape={shape}"
    )


def check_choice(
  who: str, name: str, value: Any, choices: Iterable[Any]
) -> None:
  """Raises `ValueError` unless ``value`` is one of ``choices``."""
  choices = tuple(choices)
  if value not in choices:
    valid = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{who}: {name} must be one of {valid}; got {value!r}")


def check_scalar(who: str, name: str, p: Any) -> None:
  """Raises `ValueError` unless ``p`` has shape ``()`` or ``(1,)``."""
  shape = tuple(np.shape(p))
  if shape not in ((), (1,)):
    raise ValueError(
      f"{who}: {name} must be a scalar of shape () or (1,), got "
      f"{name}.shape={shape}"
    )


def check_positive_int(who: str, name: str, value: Any) -> None:
  """Raises `ValueError` unless ``value`` is a positive Python integer."""
  if (
    isinstance(value, bool)
    or not isinstance(value, (int, np.integer))
    or (value <= 0)
  ):
    raise ValueError(
      f"{who}: {name} must be a positive integer, got {name}={value!r}"
    )


def check_divisible(
  who: str, name: str, value: int, divisor_name: str, divisor: int
) -> None:
  """Raises `ValueError` unless ``divisor`` divides ``value``."""
  if value % divisor:
    raise ValueError(
      f"{who}: {name}={value} must be divisible by {divisor_name}={divisor}"
    )


def check_nonnegative(who: str, name: str, value: float) -> None:
  """Raises `ValueError` if a static hyperparameter is negative."""
  if isinstance(value, (int, float, np.floating, np.integer)) and value < 0:
    raise ValueError(f"{who}: {name} must be >= 0, got {name}={value!r}")
