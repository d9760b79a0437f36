"""Small helpers shared by the optimizers: dtypes, counters, validation."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def compute_dtype(x: Any) -> jnp.dtype:
  """``promote_types(x.dtype, float32)``: half -> f32, f64 stays f64."""
  return jnp.promote_types(jnp.result_type(x), jnp.float32)


def f32(x: jax.Array) -> jax.Array:
  """``x`` in its compute dtype (see `compute_dtype`)."""
  return x.astype(compute_dtype(x))


def as_scalar(v: Any, like: jax.Array) -> jax.Array:
  """A hyperparameter as a scalar of ``like``'s dtype (strict promotion)."""
  return jnp.asarray(v).astype(like.dtype)


def increment(count: jax.Array) -> jax.Array:
  """``count + 1`` without overflowing int32 (as `optax.safe_increment`)."""
  big = jnp.iinfo(jnp.int32).max
  return jnp.where(count < big, count + 1, big).astype(jnp.int32)


def check_hyper(
  who: str,
  name: str,
  value: Any,
  *,
  low: float = 0.0,
  high: float | None = None,
  high_open: bool = True,
) -> None:
  """Checks a static (Python number) hyperparameter; arrays pass unchecked.

  Raises:
    ValueError: if ``value`` is a Python/NumPy number outside
      ``[low, high)`` (or ``[low, high]`` when ``high_open`` is False).
  """
  if isinstance(value, bool) or not isinstance(
    value, (int, float, np.integer, np.floating)
  ):
    return
  bad = value < low
  if high is not None:
    bad = bad or (value >= high if high_open else value > high)
  if bad:
    hi = "inf)" if high is None else (f"{high})" if high_open else f"{high}]")
    raise ValueError(
      f"{who}: {name} must lie in [{low}, {hi}, got {name}={value!r}"
    )


def standard_promotion(tx: Any) -> Any:
  """``tx`` with init/update traced under standard dtype promotion.

  optax's own transforms (``adamw``'s ``decay ** count``) mix Python floats
  with int32 counters, which raises under ``jax_numpy_dtype_promotion=strict``.
  The wrapped transform computes exactly the same values.
  """
  import optax

  def init_fn(params):
    with jax.numpy_dtype_promotion("standard"):
      return tx.init(params)

  def update_fn(updates, state, params=None, **extra_args):
    with jax.numpy_dtype_promotion("standard"):
      if extra_args:
        return tx.update(updates, state, params, **extra_args)
      return tx.update(updates, state, params)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def in_compute_dtype(tx: Any) -> Any:
  """``tx`` run on float32 (compute-dtype) copies of updates and params.

  Keeps the wrapped transform's moments in float32 for half-precision
  parameters (optax's ``adamw`` would store its second moment in the
  parameter dtype) and casts the updates back to each parameter's dtype.
  Also traces under standard dtype promotion (see `standard_promotion`).
  """
  inner = standard_promotion(tx)
  import optax

  def up(tree):
    return jax.tree.map(f32, tree)

  def init_fn(params):
    return inner.init(up(params))

  def update_fn(updates, state, params=None, **extra_args):
    out, state = inner.update(
      up(updates), state, None if params is None else up(params), **extra_args
    )
    out = jax.tree.map(lambda o, u: o.astype(u.dtype), out, updates)
    return out, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
