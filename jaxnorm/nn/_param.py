"""Parameter creation shared by the jaxnorm modules."""

from __future__ import annotations

from collections.abc import Sequence
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
