"""Parameter creation shared by the jaxnorm modules."""

from __future__ import annotations

from collections.abc import Sequence

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
  still builds, e.g. in a notebook on a single device.
  """
  if names is None:
    return variable_type(value)
  if len(names) != value.ndim:
    raise ValueError(
      f"param: axis names must have one entry per axis, got {names=} for "
      f"shape {value.shape}"
    )
  return variable_type(
    value, out_sharding=tuple(names), eager_sharding=sharding.has_mesh()
  )
