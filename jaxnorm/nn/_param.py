"""Parameter creation shared by the jaxnorm modules."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxnorm import sharding


def param(
  value: jax.Array,
  names: Sequence[str | None] | None,
  variable_type: type[nnx.Variable] = nnx.Param,
) -> nnx.Variable:
  """Wraps ``value`` as an nnx variable that carries logical axis names.

  The names are always stored as ``out_sharding`` metadata, so
  `nnx.get_partition_spec` resolves them under any rule table. The value is
  placed (sharded eagerly) only when a mesh is active; without one the module
  still builds, e.g. in a notebook on a single device. Under a mesh, a
  logical name without a rule in the active rules is replicated (with one
  warning) instead of failing (`jaxnorm.sharding.param_names`), so every
  module builds under a user's mesh with other axis names.
  """
  if names is None:
    return variable_type(value)
  names = sharding.param_names(names)
  if len(names) != value.ndim:
    raise ValueError(
      f"param: axis names must have one entry per axis, got {names=} for "
      f"shape {value.shape}"
    )
  return variable_type(
    value, out_sharding=tuple(names), eager_sharding=sharding.has_mesh()
  )


def paper_affine(
  *,
  no_bias: str | None = None,
  needs_scale: str | None = None,
  needs_bias: str | None = None,
  own_init: str | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
  """The affine keywords of flax on a module whose paper fixes its affine.

  Decorates a module's ``__init__``. flax's ``use_scale``, ``use_bias``,
  ``scale_init``, ``bias_init`` and ``promote_dtype`` that the ``__init__``
  does not declare itself are answered here: a value that agrees with the
  paper (``use_bias=False`` on a norm without bias, ``use_scale=True`` on
  one that needs its scale, ``promote_dtype=None``: flax's default rule,
  which every jaxnorm norm follows) is accepted and dropped; any other is a
  `ValueError` naming the keyword and the reason, never Python's bare
  "unexpected keyword" `TypeError`. Keywords outside this set pass through
  untouched.

  Args:
    no_bias: why the norm has no bias (``use_bias=True`` and
      ``bias_init`` are refused).
    needs_scale: why the paper needs its scale (``use_scale=False`` is
      refused).
    needs_bias: why the paper needs its bias (``use_bias=False`` is
      refused).
    own_init: why the parameters keep their own initialization
      (``scale_init`` and ``bias_init`` are refused).

  Returns:
    The decorator.
  """

  def decorate(init: Callable[..., None]) -> Callable[..., None]:
    own = set(inspect.signature(init).parameters)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
      who = type(self).__name__
      for name in sorted(set(kwargs) - own):
        value = kwargs[name]
        if name == "use_scale" and needs_scale is not None:
          if not value:
            raise ValueError(
              f"{who}: use_scale={value!r} is not available: the paper "
              f"needs its scale ({needs_scale})"
            )
          del kwargs[name]
        elif name == "use_bias" and no_bias is not None:
          if value:
            raise ValueError(
              f"{who}: use_bias={value!r} is not available: {who} has no "
              f"bias ({no_bias})"
            )
          del kwargs[name]
        elif name == "use_bias" and needs_bias is not None:
          if not value:
            raise ValueError(
              f"{who}: use_bias={value!r} is not available: the paper "
              f"needs its bias ({needs_bias})"
            )
          del kwargs[name]
        elif name == "bias_init" and no_bias is not None:
          raise ValueError(
            f"{who}: bias_init is not available: {who} has no bias ({no_bias})"
          )
        elif name in ("scale_init", "bias_init") and own_init is not None:
          raise ValueError(f"{who}: {name} is not available: {own_init}")
        elif name == "promote_dtype" and value is None:
          del kwargs[name]
        elif name == "promote_dtype":
          raise ValueError(
            f"{who}: promote_dtype is not available: {who} promotes its "
            "input with its parameters' dtypes (flax's default rule); "
            "LayerNorm, RMSNorm, BatchNorm, GroupNorm and InstanceNorm "
            "take promote_dtype="
          )
      init(self, *args, **kwargs)

    return wrapper

  return decorate


class OwnedParam(NamedTuple):
  """An `nnx.Param` of a model with the module that owns it."""

  path: tuple[Any, ...]  # Its path in ``nnx.state(model, nnx.Param)``.
  owner_path: tuple[Any, ...]  # Path of the innermost module above it.
  owner: nnx.Module
  name: str  # The owner's attribute (a list attribute names its items).
  value: jax.Array  # A `jax.ShapeDtypeStruct` in an abstract model.


def owned_params(model: nnx.Module) -> list[OwnedParam]:
  """Every `nnx.Param` of ``model`` with its owner, in state order.

  The order is that of ``nnx.to_flat_state(nnx.state(model, nnx.Param))``;
  an abstract model (`nnx.eval_shape`) gives its shape structs as values.
  """
  modules = {
    tuple(path): node
    for path, node in nnx.iter_graph(model)
    if isinstance(node, nnx.Module)
  }
  owned = []
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    path = tuple(path)
    depth = max(i for i in range(len(path)) if path[:i] in modules)
    owner_path = path[:depth]
    owned.append(
      OwnedParam(
        path,
        owner_path,
        modules[owner_path],
        str(path[depth]),
        var.get_value(),
      )
    )
  return owned
