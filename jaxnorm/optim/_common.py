"""Small helpers shared by the optimizers: dtypes, counters, validation."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax.core import meta
from jax.typing import DTypeLike

from jaxnorm import _checks, _numerics, _scope

_Factory = TypeVar("_Factory", bound=Callable[..., Any])


def f32(x: jax.Array) -> jax.Array:
  """``x`` in its compute dtype (`jaxnorm._numerics.compute_dtype`)."""
  return x.astype(_numerics.compute_dtype(x))


def as_scalar(v: Any, like: jax.Array) -> jax.Array:
  """A hyperparameter as a scalar of ``like``'s dtype (strict promotion)."""
  return jnp.asarray(v).astype(like.dtype)


def moment_dtype(mu_dtype: DTypeLike | None, p: jax.Array) -> jnp.dtype:
  """A moment's dtype: ``mu_dtype`` if given, else ``p``'s compute dtype.

  ``None`` means jaxnorm's default (float32 for half-precision ``p``, else
  ``p.dtype``); any dtype-like (``jnp.bfloat16``, ``"float32"``,
  ``np.dtype(...)``) forces it, canonicalized as optax does.
  """
  if mu_dtype is None:
    return _numerics.compute_dtype(p)
  return jax.dtypes.canonicalize_dtype(mu_dtype)


def _is_box(x: Any) -> bool:
  return isinstance(x, (nnx.Variable, meta.AxisMetadata))


def box_structure(tree: Any) -> Any:
  """The treedef of ``tree`` with parameter boxes as leaves.

  nnx ``Variable`` and linen ``AxisMetadata`` boxes (``nn.Partitioned``)
  hold one array each. A state tree unflattened from this treedef has the
  parameters' structure, so ``optax.tree.map_params`` finds it, but bare
  arrays at the boxes: leaves that are not parameter-shaped (a basis, a
  norm) carry no parameter sharding metadata.
  """
  return jax.tree.structure(tree, is_leaf=_is_box)


def per_leaf(tree: Any, values: list[Any]) -> Any:
  """One value per array leaf of ``tree`` as a tree of its structure.

  ``values`` are in leaf order, ``None`` for a leaf without an entry. The
  result has bare values at parameter boxes (see `box_structure`). ``None``
  entries become `optax.MaskedNode`, optax's empty placeholder
  (no leaves, so ``jax.tree.map`` and ``optax.tree.map_params`` skip it).
  """
  return box_structure(tree).unflatten(
    [optax.MaskedNode() if v is None else v for v in values]
  )


def leaves_of(tree: Any, state_tree: Any) -> list[Any]:
  """A `per_leaf` tree's entries in the leaf order of ``tree``."""
  return box_structure(tree).flatten_up_to(state_tree)


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
  if mask is None or treedef.num_leaves == 0:
    # No leaves (optax.tree.map_params' placeholder): nothing to mask, and
    # a mask callable or pytree would not fit it.
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


def check_step_count(who: str, name: str, value: Any) -> None:
  """Checks an integer hyperparameter that may arrive as an array.

  A Python or NumPy integer must be positive; an array (traced under
  ``optax.inject_hyperparams``, which injects ints as int32 scalars) must
  be an integer scalar, whose value is not checked.

  Raises:
    ValueError: for a non-positive or non-integer Python number.
    TypeError: for an array that is not an integer scalar.
  """
  if not isinstance(value, (jax.Array, np.ndarray)):
    _checks.check_positive_int(who, name, value)
  elif value.ndim or not jnp.issubdtype(value.dtype, jnp.integer):
    raise TypeError(
      f"{who}: {name} must be a positive int or an integer scalar array, "
      f"got an array of shape {value.shape} and dtype {value.dtype}"
    )


def standard_promotion(tx: Any) -> Any:
  """``tx`` with init/update traced under standard dtype promotion.

  optax's own transforms (``adamw``'s ``decay ** count``) mix Python floats
  with int32 counters, which raises under ``jax_numpy_dtype_promotion=strict``.
  The wrapped transform computes exactly the same values. Extra keyword
  arguments of ``update`` (``optax.GradientTransformationExtraArgs``) reach
  ``tx`` if it takes them and are ignored otherwise, as in ``optax.chain``.
  """
  tx = optax.with_extra_args_support(tx)

  def init_fn(params):
    with jax.numpy_dtype_promotion("standard"):
      return tx.init(params)

  def update_fn(updates, state, params=None, **extra_args):
    with jax.numpy_dtype_promotion("standard"):
      return tx.update(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def in_compute_dtype(tx: Any) -> Any:
  """``tx`` run on float32 (compute-dtype) copies of updates and params.

  Keeps the wrapped transform's moments in float32 for half-precision
  parameters (optax's ``adamw`` would store its second moment in the
  parameter dtype) and casts the updates back to each parameter's dtype.
  Also traces under standard dtype promotion (see `standard_promotion`).
  """
  inner = standard_promotion(tx)

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


def scoped_transform(factory: _Factory) -> _Factory:
  """The transforms ``factory`` builds run under its `jax.named_scope`.

  Decorates a public transform factory (``scale_by_adamp``, ``adamp``,
  ``nap_project``, ...): the returned transform's ``init`` and ``update``
  run under ``jax.named_scope(factory.__name__)``, so a profile or an HLO
  dump names the optimizer's ops after it (``adamp/scale_by_adamp/...``
  for a chain of scoped transforms), as `jaxnorm._scope.scoped` does for
  the pure functions. The transform keeps its class
  (`optax.GradientTransformationExtraArgs` stays one, with its extra
  keyword arguments); the factory keeps its name, docstring and signature
  (so ``optax.inject_hyperparams`` binds its arguments) and carries the
  scope name as `jaxnorm._scope.SCOPE_ATTR`. tests/test_named_scope.py
  checks every transform factory in ``jaxnorm.optim.__all__``.
  """
  name = factory.__name__

  @functools.wraps(factory)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    tx = factory(*args, **kwargs)

    def init_fn(params):
      with jax.named_scope(name):
        return tx.init(params)

    if isinstance(tx, optax.GradientTransformationExtraArgs):

      def update_extra(updates, state, params=None, **extra_args):
        with jax.named_scope(name):
          return tx.update(updates, state, params, **extra_args)

      return optax.GradientTransformationExtraArgs(init_fn, update_extra)

    def update_fn(updates, state, params=None):
      with jax.named_scope(name):
        return tx.update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)

  setattr(wrapper, _scope.SCOPE_ATTR, name)
  return wrapper  # type: ignore[return-value]
