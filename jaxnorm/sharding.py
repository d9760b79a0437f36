"""Meshes, the logical axis vocabulary and the default logical-to-mesh rules.

Modules name parameter and activation axes with the logical names below; the
rule table maps them to the physical mesh axes ``data``, ``fsdp`` and
``tensor``. Resolution is first-match-wins and a mesh axis is used at most once
per tensor (flax's ``nnx.logical_axis_rules`` semantics). Apply the rules with

  with jax.set_mesh(mesh), nnx.logical_axis_rules(DEFAULT_RULES):
    model = ...

Pure functions never see a mesh; only modules and the training engine do.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from jaxnorm import _checks

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")

LOGICAL_AXES: tuple[str, ...] = (
    "batch", "seq", "embed", "heads", "kv_heads", "head_dim", "mlp", "vocab",
    "norm", "streams", "channels", "height", "width",
)

# First match wins. Weights: ``embed`` is FSDP-sharded, the per-head and MLP
# dimensions are tensor-parallel; norm vectors and residual streams are
# replicated (they are tiny and every shard needs them whole).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
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


def make_mesh(shape: Sequence[int],
              axis_names: Sequence[str] = MESH_AXES,
              *, devices: Sequence[jax.Device] | None = None
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
        f"{shape=} and {axis_names=}")
  for size in shape:
    _checks.check_positive_int("make_mesh", "shape entries", size)
  size = int(np.prod(shape))
  pool = list(jax.devices() if devices is None else devices)
  if size > len(pool):
    raise ValueError(
        f"make_mesh: a mesh of shape {shape} needs {size} devices, but only "
        f"{len(pool)} are available ({jax.default_backend()} backend)")
  axis_types = (jax.sharding.AxisType.Auto,) * len(shape)
  return jax.make_mesh(shape, axis_names, axis_types=axis_types,
                       devices=pool[:size])


def has_mesh() -> bool:
  """True when a mesh is active through `jax.set_mesh`."""
  return not jax.sharding.get_abstract_mesh().empty


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
        f"for x.shape={x.shape}")
  if not has_mesh():
    return x
  spec = nnx.logical_to_mesh_axes(tuple(names))
  return jax.lax.with_sharding_constraint(x, spec)
