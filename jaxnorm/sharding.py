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

Mesh-agnostic by default. Under a mesh whose axes are not jaxnorm's (gemma's
``("fsdp", "tp")``, say) a module still builds:

* a logical name without a rule in the active `nnx.logical_axis_rules` (or
  with no rules active at all) is replicated: the parameter stores ``None``
  for that axis, and an `UnmappedAxisWarning` names it (Python's default
  warning filter shows it once per name, not once per parameter);
* a name that is itself an axis of the mesh is kept (flax's physical names);
* a rule that targets a mesh axis the mesh lacks is a `ValueError` that
  points to `rules_for_mesh`, which derives jaxnorm's rules for the user's
  mesh: ``rules_for_mesh(mesh, {"tensor": "tp"})`` renames jaxnorm's
  ``tensor`` axis to ``tp`` and drops the axes the mesh does not have
  (``data`` here), so every jaxnorm name has a rule and none warns.

Only `jaxnorm.nn` norm parameters are resolved this way (`param_names`);
activations (`constrain`) with no rules active use `DEFAULT_RULES` restricted
to the active mesh.

flax equivalence. A jaxnorm module's ``axis_names=("norm",)`` is what flax
spells ``scale_metadata={"out_sharding": ("norm",)}`` (and ``bias_metadata``)
on ``nnx.LayerNorm``, or ``nnx.with_partitioning(init, ("norm",))`` on an
initializer: the logical names are stored as the variable's ``out_sharding``
metadata, the parameter is placed when it is created under `jax.set_mesh`,
and `nnx.get_partition_spec` (called inside the same
`nnx.logical_axis_rules`) resolves them to a `PartitionSpec` that
`jax.sharding.NamedSharding` accepts under that mesh. Deviation: flax keeps
a name without a rule as if it were a mesh axis (so construction fails under
a mesh without it); jaxnorm replicates it, as above.

Pure functions never see a mesh; only modules and the training engine do.

Examples:
  >>> rules = dict(DEFAULT_RULES)
  >>> rules["embed"], rules["heads"], rules["norm"]
  ('fsdp', 'tensor', None)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax.core import spmd
from jax.sharding import PartitionSpec

from jaxnorm import _checks

__all__ = [
  "DEFAULT_RULES",
  "LOGICAL_AXES",
  "MESH_AXES",
  "Rules",
  "UnmappedAxisWarning",
  "constrain",
  "has_mesh",
  "logical_to_mesh",
  "make_mesh",
  "param_names",
  "rules_for_mesh",
  "rules_with",
]

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
  "layers",
)

# First match wins. Weights: ``embed`` is FSDP-sharded, the per-head and MLP
# dimensions are tensor-parallel; norm vectors and residual streams are
# replicated (they are tiny and every shard needs them whole). ``layers`` is
# the leading axis of a scanned stack's parameters (`nnx.vmap` / `nnx.scan`
# with ``transform_metadata={nnx.PARTITION_NAME: "layers"}``): replicated,
# so each scan step reads its layer's slice whole.
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
  ("layers", None),
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

  Examples:
    >>> mesh = make_mesh((1, 1, 1))  # one device on each of jaxnorm's axes
    >>> mesh.axis_names, dict(mesh.shape)
    (('data', 'fsdp', 'tensor'), {'data': 1, 'fsdp': 1, 'tensor': 1})
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
  """True when a mesh is active through `jax.set_mesh`.

  Examples:
    >>> has_mesh()
    False
    >>> with jax.set_mesh(make_mesh((1, 1, 1))):
    ...     print(has_mesh())
    True
  """
  return not jax.sharding.get_abstract_mesh().empty


def rules_with(overrides: Sequence[tuple[str, Any]] = ()) -> Rules:
  """`DEFAULT_RULES` with ``overrides`` taking precedence, one entry a name.

  Args:
    overrides: ``(logical_name, mesh_axes)`` pairs, e.g.
      ``[("norm", "tensor")]``.

  Returns:
    A rule table usable with `nnx.logical_axis_rules` and `logical_to_mesh`.

  Examples:
    >>> rules = rules_with([("norm", "tensor")])
    >>> rules[0], dict(rules)["embed"]  # the override first, then defaults
    (('norm', 'tensor'), 'fsdp')
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
      context, else `DEFAULT_RULES` (restricted to the active mesh's axes
      by `rules_for_mesh` when a mesh is active).

  Returns:
    The mesh `PartitionSpec`.

  Examples:
    >>> tuple(logical_to_mesh(("batch", "seq", "embed"), DEFAULT_RULES))
    (('data', 'fsdp'), None, None)

    (``embed`` maps to ``fsdp``, which ``batch`` already binds.)
  """
  rules = rules or spmd.get_logical_axis_rules() or _mesh_default_rules()
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

  Examples:
    >>> x = np.ones((2, 4), np.float32)
    >>> constrain(x, ("batch", "embed")) is x  # no mesh: a no-op
    True
  """
  if len(names) != x.ndim:
    raise ValueError(
      f"constrain: names must have one entry per axis of x, got {names=} "
      f"for x.shape={x.shape}"
    )
  if not has_mesh():
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_mesh(names))


class UnmappedAxisWarning(UserWarning):
  """A logical axis name has no rule in the active rules: it is replicated.

  Examples:
    >>> import warnings
    >>> with jax.set_mesh(make_mesh((1, 1, 1))), warnings.catch_warnings(
    ...     record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     names = param_names(("data", "norm"))  # no rules active
    >>> names, caught[0].category.__name__
    (('data', None), 'UnmappedAxisWarning')
  """


def _axes_of(value: Any) -> tuple[str, ...]:
  """The mesh axes of a rule's right-hand side (None, a name or a tuple)."""
  if value is None:
    return ()
  return (value,) if isinstance(value, str) else tuple(value)


def _mesh_axis_names(mesh: Any) -> tuple[str, ...]:
  """Axis names of a `Mesh`, an `AbstractMesh` or a sequence of names."""
  names = getattr(mesh, "axis_names", mesh)
  if isinstance(names, str) or not all(isinstance(n, str) for n in names):
    raise ValueError(
      "rules_for_mesh: mesh must be a jax Mesh, an AbstractMesh or a "
      f"sequence of axis names, got {mesh!r}"
    )
  return tuple(names)


def _mesh_default_rules() -> Rules:
  """`DEFAULT_RULES`, restricted to the active mesh's axes if one is set."""
  if not has_mesh():
    return DEFAULT_RULES
  return rules_for_mesh(jax.sharding.get_abstract_mesh())


def rules_for_mesh(
  mesh: Any,
  rename: Mapping[str, str | None] | None = None,
  *,
  rules: Rules = DEFAULT_RULES,
) -> Rules:
  """Derives a rule table for a mesh whose axis names are not jaxnorm's.

  Each mesh axis named by ``rules`` is renamed through ``rename`` (jaxnorm's
  axis -> the user's axis, or ``None`` to drop it); axes the mesh does not
  have are then dropped, so a logical name whose axes all vanish maps to
  ``None`` (replicated). Every logical name of ``rules`` keeps a rule, so no
  `UnmappedAxisWarning` is raised for jaxnorm's names.

  Example: gemma's ``("fsdp", "tp")`` mesh, ``rules_for_mesh(mesh,
  {"tensor": "tp"})``: ``batch -> fsdp`` (``data`` dropped), ``embed ->
  fsdp``, ``heads``/``mlp``/``vocab -> tp``, ``norm -> None``.

  Args:
    mesh: a `jax.sharding.Mesh`, an `AbstractMesh` or its axis names.
    rename: jaxnorm mesh axis (as named in ``rules``) -> the user's mesh
      axis or ``None``; axes not listed keep their names.
    rules: the table to adapt; `DEFAULT_RULES` by default.

  Returns:
    A rule table for `nnx.logical_axis_rules` and `logical_to_mesh`.

  Raises:
    ValueError: if ``mesh`` is not a mesh or names, or ``rename`` maps an
      axis that ``rules`` does not use, or to an axis the mesh lacks.

  Examples:
    >>> rules = dict(rules_for_mesh(("fsdp", "tp"), {"tensor": "tp"}))
    >>> rules["batch"], rules["embed"], rules["heads"], rules["norm"]
    ('fsdp', 'fsdp', 'tp', None)
  """
  who = "rules_for_mesh"
  axis_names = _mesh_axis_names(mesh)
  rename = dict(rename or {})
  used = sorted({a for _, v in rules for a in _axes_of(v)})
  for src, dst in rename.items():
    if src not in used:
      raise ValueError(
        f"{who}: rename maps {src!r}, which the rules do not use; the rules "
        f"use the mesh axes {', '.join(used)}"
      )
    if dst is not None and dst not in axis_names:
      raise ValueError(
        f"{who}: rename maps {src!r} to {dst!r}, which is not an axis of "
        f"the mesh; its axes are {', '.join(axis_names)}"
      )
  out = []
  for name, value in rules:
    axes = tuple(
      a
      for a in (rename.get(a, a) for a in _axes_of(value))
      if a is not None and a in axis_names
    )
    out.append((name, axes[0] if len(axes) == 1 else (axes or None)))
  return tuple(out)


def param_names(
  names: Sequence[str | None] | None,
) -> tuple[str | None, ...] | None:
  """The axis names to store on a parameter created now, mesh-agnostic.

  Without an active mesh the names are returned unchanged (placement and
  rules are deferred to `nnx.get_partition_spec`). Under `jax.set_mesh`,
  each name is kept when the active `nnx.logical_axis_rules` has a rule for
  it (flax resolves it) or when it is an axis of the mesh; any other name
  becomes ``None`` (replicated) with an `UnmappedAxisWarning`, which
  Python's default filter shows once per name.

  Args:
    names: one logical name (or None) per parameter axis, or ``None``.

  Returns:
    The names to pass as ``out_sharding``.

  Raises:
    ValueError: if an active rule maps a name to a mesh axis the mesh does
      not have; the message names `rules_for_mesh`.

  Examples:
    >>> from flax import nnx
    >>> param_names(("embed", None))  # no mesh: unchanged
    ('embed', None)
    >>> with jax.set_mesh(make_mesh((1, 1, 1))), nnx.logical_axis_rules(
    ...     DEFAULT_RULES):
    ...     print(param_names(("embed", "norm")))  # both have rules
    ('embed', 'norm')
  """
  if names is None or not has_mesh():
    return None if names is None else tuple(names)
  mesh_axes = tuple(jax.sharding.get_abstract_mesh().axis_names)
  table = dict(spmd.get_logical_axis_rules())
  out = []
  for name in names:
    if name is None or (name in mesh_axes and name not in table):
      out.append(name)
      continue
    if name not in table:
      warnings.warn(
        f"jaxnorm: logical axis name {name!r} has no rule in the active "
        "nnx.logical_axis_rules; parameters that name it are replicated. "
        "Give it a rule, or derive jaxnorm's rules for your mesh with "
        "jaxnorm.sharding.rules_for_mesh",
        UnmappedAxisWarning,
        stacklevel=1,
      )
      out.append(None)
      continue
    missing = [a for a in _axes_of(table[name]) if a not in mesh_axes]
    if missing:
      raise ValueError(
        f"param_names: the active rules map logical axis {name!r} to mesh "
        f"axis {missing[0]!r}, but the mesh has axes {', '.join(mesh_axes)}; "
        "derive rules for this mesh with jaxnorm.sharding.rules_for_mesh("
        "mesh, rename={...})"
      )
    out.append(name)
  return tuple(out)
