"""Small helpers shared by the optimizers: dtypes, counters, validation."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm import _numerics


def f32(x: jax.Array) -> jax.Array:
  """``x`` in its compute dtype (`jaxnorm._numerics.compute_dtype`)."""
  return x.astype(_numerics.compute_dtype(x))


def as_scalar(v: Any, like: jax.Array) -> jax.Array:
  """A hyperparameter as a scalar of ``like``'s dtype (strict promotion)."""
  return jnp.asarray(v).astype(like.dtype)


def increment(count: jax.Array) -> jax.Array:
  """``count + 1`` without overflowing int32 (as `optax.safe_increment`)."""
  big = jnp.iinfo(jnp.int32).max
  return jnp.where(count < big, count + 1, big).astype(jnp.int32)


def at_step(schedule: Any, count: jax.Array) -> Any:
  """A scalar-or-schedule hyperparameter's value at step ``count``."""
  return schedule(count) if callable(schedule) else schedule


def check_decay_params(who: str, params: Any, *decays: Any) -> bool:
  """Whether decay applies; raises if it does and ``params`` is missing.

  Returns:
    False when every decay is a literal 0 (then ``params`` may be None).

  Raises:
    ValueError: if some decay is not a literal 0 and ``params`` is None.
  """
  active = not all(
    isinstance(w, (int, float)) and not isinstance(w, bool) and w == 0
    for w in decays
  )
  if active and params is None:
    raise ValueError(
      f"{who}: params are required for weight decay; call "
      "update(grads, state, params)"
    )
  return active


def leaf_mask(who: str, mask: Any, tree: Any) -> list[bool]:
  """One bool per leaf of ``tree`` from an ``optax.adamw``-style ``mask``.

  Args:
    who: the calling function, for error messages.
    mask: ``None`` (every leaf), a pytree of bools with the structure of
      ``tree`` or a prefix of it, or a callable from ``tree`` to one (as
      ``optax.masked``).
    tree: the parameters.

  Returns:
    The flags in the leaf order of ``tree``.

  Raises:
    ValueError: if a mask entry is not a Python or NumPy bool.
  """
  treedef = jax.tree.structure(tree)
  if mask is None:
    return [True] * treedef.num_leaves
  m = mask(tree) if callable(mask) else mask

  def spread(flag, sub):
    if not isinstance(flag, (bool, np.bool_)):
      raise ValueError(
        f"{who}: mask entries must be Python bools (a static pytree or a "
        f"callable returning one, as optax.masked), got {flag!r}"
      )
    return jax.tree.map(lambda _: bool(flag), sub)

  flags = jax.tree.map(
    spread, m, tree, is_leaf=lambda x: isinstance(x, (bool, np.bool_))
  )
  return treedef.flatten_up_to(flags)


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
