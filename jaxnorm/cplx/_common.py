"""Checks and dtype rules shared by the complex-valued functions."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm import _numerics


def check_complex(who: str, name: str, x: Any) -> None:
  """Raises `TypeError` unless ``x`` has a complex dtype.

  `jaxnorm._checks.check_floating` rejects complex dtypes, so every complex
  function checks its complex arguments here.
  """
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.complexfloating):
    raise TypeError(
      f"{who}: {name} must have a complex dtype (complex64 or complex128), "
      f"got {name}.dtype={dtype}; build it with jaxnorm.cplx.to_complex "
      f"from split real halves [Re | Im] or with {name}.astype(jnp.complex64)"
    )


def check_real(who: str, name: str, x: Any) -> None:
  """Raises `TypeError` unless ``x`` has a real floating dtype."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(
      f"{who}: {name} must have a real floating dtype, got {name}.dtype={dtype}"
    )


def complex_dtype(*xs: Any) -> jnp.dtype:
  """The complex compute dtype: complex64, or complex128 for 64-bit inputs.

  Half-precision and float32 reals (and complex64) give complex64; float64
  and complex128 give complex128. There is no complex bfloat16.
  """
  parts = []
  for x in xs:
    dtype = jnp.result_type(x)
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    parts.append(real_dtype(dtype) if complex_ else dtype)
  real = _numerics.compute_dtype(*parts)
  return jnp.dtype(jnp.complex64 if real == jnp.float32 else jnp.complex128)


def real_dtype(dtype: Any) -> jnp.dtype:
  """The real dtype of a complex dtype's parts (complex64 -> float32)."""
  return jnp.dtype(jnp.finfo(jnp.dtype(dtype)).dtype)


def abs2(z: jax.Array) -> jax.Array:
  """``|z|^2 = Re(z)^2 + Im(z)^2``: real, smooth everywhere (no kink)."""
  return jnp.real(z) ** 2 + jnp.imag(z) ** 2
