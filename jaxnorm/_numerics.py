"""Numerical helpers shared by every family of pure functions.

One rule for the compute dtype: half precision computes in float32, float32
and float64 stay as they are (``promote_types(x.dtype, float32)``), valid
under strict dtype promotion.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def compute_dtype(*xs: jax.Array) -> jnp.dtype:
  """``promote_types(result_type(*xs), float32)`` under strict promotion.

  Args:
    *xs: floating (or complex) arrays.

  Returns:
    float32 for half-precision inputs, else their common dtype.
  """
  with jax.numpy_dtype_promotion("standard"):
    return jnp.dtype(jnp.promote_types(jnp.result_type(*xs), jnp.float32))
