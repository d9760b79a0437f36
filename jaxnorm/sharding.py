"""Meshes, the logical axis vocabulary and the default logical-to-mesh rules.

Modules name parameter and activation axes with the logical names below; the
rule table maps them to the physical mesh axes ``data``, ``fsdp`` and
``tensor``. `DEFAULT_RULES` names each logical axis once, so flax's parameter
placement (which lets a later duplicate override an earlier one) and
`logical_to_mesh` (first match wins, each mesh axis used at most once per
tensor, as in MaxText) agree; build overrides with `rules_with`. Apply the
rules with

  with jax.set_mesh(mesh), nnx.logical_axis_rules(DEFAULT_RULES):
    model = ...

Pure functions never see a mesh; only modules and the training engine do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax.core import spmd
from jax.sharding import PartitionSpec

from jaxnorm import _checks

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

LOGICAL_AXES: tuple[str, ...] = (
  "batch",
  "seq",
  "embed",
  "heads",
  "kv_heads",
  "head_dim",
  "mlp",
  "vocab",
  "norm",
  "streams",
  "channels",
  "height",
  "width",
)

# First match wins. Weights: ``embed`` is FSDP-sharded, the per-head and MLP
# dimensions are tensor-parallel; norm vectors and residual streams are
# replicated (they are tiny and every shard needs them whole).
Rules = tuple[tuple[str, Any], ...]

DEFAULT_RULES: Rules = (
  ("batch", ("data", "fsdp")),
  ("seq", None),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  ("vocab", "tensor"),
  ("norm", None),
  ("streams", None),
  ("channels", "tensor"),
  ("height", None),
  ("width", None),
)


def make_mesh(
  shape: Sequence[int],
  axis_names: Sequence[str] = MESH_AXES,
  *,
  devices: Sequence[jax.Device] | None = None,
) -> jax.sharding.Mesh:
  """Builds a mesh with `AxisType.Auto` axes (classic sharding propagation).

  Args:
    shape: devices along each mesh axis; the product must equal the number of
      devices used.
    axis_names: one name per entry of ``shape``.
    devices: devices to lay out; defaults to ``jax.devices()[:prod(shape)]``.

  Returns:
    A `jax.sharding.Mesh` whose axes are all `AxisType.Auto`.

  Raises:
    ValueError: if the lengths differ or there are not enough devices.
  """
  shape = tuple(shape)
  axis_names = tuple(axis_names)
  if len(shape) != len(axis_names):
    raise ValueError(
      f"make_mesh: shape and axis_names must have the same length, got "
      f"{shape=} and {axis_names=}"
    )
  for size in shape:
    _checks.check_positive_int("make_mesh", "shape entries", size)
  size = int(np.prod(shape))
  pool = list(jax.devices() if devices is None else devices)
  if size > len(pool):
    raise ValueError(
      f"make_mesh: a mesh of shape {shape} needs {size} devices, but only "
      f"{len(pool)} are available ({jax.default_backend()} backend)"
    )
  axis_types = (jax.sharding.AxisType.Auto,) * len(shape)
  return jax.make_mesh(
    shape, axis_names, axis_types=axis_types, devices=pool[:size]
  )


def has_mesh() -> bool:
  """True when a mesh is active through `jax.set_mesh`."""
  return not jax.sharding.get_abstract_mesh().empty


def rules_with(overrides: Sequence[tuple[str, Any]] = ()) -> Rules:
  """`DEFAULT_RULES` with ``overrides`` taking precedence, one entry a name.

  Args:
    overrides: ``(logical_name, mesh_axes)`` pairs, e.g.
      ``[("norm", "tensor")]``.

  Returns:
    A rule table usable with `nnx.logical_axis_rules` and `logical_to_mesh`.
  """
  seen, out = set(), []
  for name, axes in (*overrides, *DEFAULT_RULES):
    if name not in seen:
      seen.add(name)
      out.append((name, axes))
  return tuple(out)


def logical_to_mesh(
  names: Sequence[str | None], rules: Rules | None = None
) -> PartitionSpec:
  """Resolves logical axis names to a `PartitionSpec`.

  The first rule naming an axis wins; a mesh axis already used by an earlier
  dimension of the same tensor is dropped, so no spec binds it twice.

  Args:
    names: one logical name (or None, replicated) per array axis.
    rules: rule table; defaults to the active `nnx.logical_axis_rules`
      context, else `DEFAULT_RULES`.

  Returns:
    The mesh `PartitionSpec`.
  """
  rules = rules or spmd.get_logical_axis_rules() or DEFAULT_RULES
  table: dict[str, Any] = {}
  for name, axes in rules:
    table.setdefault(name, axes)
  used: set[str] = set()
  spec = []
  for name in names:
    axes = table.get(name) if name is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    free = tuple(a for a in axes if a not in used)
    used.update(free)
    spec.append(free[0] if len(free) == 1 else (free or None))
  return PartitionSpec(*spec)


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains an activation's sharding by logical names; no-op without mesh.

  Args:
    x: the activation.
    names: one logical name (or None) per axis of ``x``.

  Returns:
    ``x``, with a sharding constraint when a mesh is active.
  """
  if len(names) != x.ndim:
    raise ValueError(
      f"constrain: names must have one entry per axis of x, got {names=} "
      f"for x.shape={x.shape}"
    )
  if not has_mesh():
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_mesh(names))
