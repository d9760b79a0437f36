"""Running the row kernels on a device mesh with `jax.shard_map`.

A Pallas call is a per-device program: XLA cannot partition it, so on a
mesh it must sit inside `jax.shard_map`. The norm kernels are row-local (each
row's statistics use only that row), so any sharding of the *leading* (row)
dimensions is exact without communication: batch over ``data``, sequence
over ``tensor`` (sequence parallelism), or any other split. The normalized
trailing axes must be unsharded on the mesh, since a row must live on one
device. Parameters are replicated; their gradients are the per-device
partial sums, which `shard_map`'s transpose adds across the mesh (a psum over
the axes the parameters are replicated on).

Example::

  mesh = jaxnorm.sharding.make_mesh((2, 2), ("data", "tensor"))
  norm = shard_rows(rms_norm_pallas, mesh, P("data", "tensor", None))
  y = jax.jit(norm)(x, scale)           # x: (batch, seq, d)

The row kernels of `pallas_kernels.norms` also call `shard_rows` themselves
under `jax.set_mesh` (or on an explicitly sharded input), and the attention
kernels go through `shard_heads` the same way (`on_mesh_heads`), so
``implementation=None`` dispatch runs every kernel per device on a mesh.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, PartitionSpec

Axes = str | tuple[str, ...] | None


def shard_rows(
  kernel: Callable[..., Any],
  mesh: Mesh,
  row_spec: PartitionSpec,
  *,
  num_row_args: int = 1,
  num_feature_axes: int = 1,
  **kernel_kwargs: Any,
) -> Callable[..., Any]:
  """Wraps a row kernel to run per device on ``mesh`` via `jax.shard_map`.

  Args:
    kernel: a `pallas_kernels.norms` function (or any row-local function
      with the same calling convention: row arrays first, then parameters).
    mesh: the device mesh, e.g. axes ``("data", "tensor")`` (a `Mesh` or
      an `AbstractMesh`).
    row_spec: `PartitionSpec` of every row array (and every output); its
      entries for the ``num_feature_axes`` trailing axes must be ``None``.
    num_row_args: how many leading positional arguments are row arrays
      (2 for the fused residual-add kernels: ``x`` and ``residual``).
    num_feature_axes: how many trailing axes are normalized.
    **kernel_kwargs: static keyword arguments for ``kernel`` (``eps``,
      ``interpret``, ...).

  Returns:
    A function of the kernel's positional arguments; parameters (the
    arguments after the row arrays, ``None`` allowed) are replicated.

  Raises:
    ValueError: when ``row_spec`` shards a normalized axis, names an axis
      missing from ``mesh``, or has more entries than the rows have axes.
  """
  who = "shard_rows"
  specs = tuple(row_spec)
  trailing = (
    specs[len(specs) - num_feature_axes :]
    if len(specs) >= (num_feature_axes)
    else specs
  )
  if any(s is not None for s in trailing):
    raise ValueError(
      f"{who}: the {num_feature_axes} normalized trailing axes must be "
      f"unsharded (None), got {row_spec=}; a row must live on one device"
    )
  names = set()
  for s in specs:
    names.update(s if isinstance(s, tuple) else () if s is None else (s,))
  missing = names - set(mesh.axis_names)
  if missing:
    raise ValueError(
      f"{who}: row_spec names axes {sorted(missing)} that "
      f"mesh.axis_names={mesh.axis_names} lacks"
    )

  def run(*args):
    rows, params = args[:num_row_args], args[num_row_args:]
    for i, a in enumerate(rows):
      if len(specs) != a.ndim:
        raise ValueError(
          f"{who}: row_spec has {len(specs)} entries but row argument {i} "
          f"has shape {a.shape}; give one entry per axis"
        )
    in_specs = (row_spec,) * num_row_args + tuple(
      None if p is None else PartitionSpec() for p in params
    )

    def local(*local_args):
      return kernel(*local_args, **kernel_kwargs)

    # Pallas calls carry no varying-manual-axes rules, so the type check of
    # shard_map is off; every output is row-sharded exactly like the inputs
    # (one spec, a prefix of the output tree).
    return jax.shard_map(
      local, mesh=mesh, in_specs=in_specs, out_specs=row_spec, check_vma=False
    )(*args)

  return run


def shard_heads(
  kernel: Callable[..., Any],
  mesh: Mesh,
  *,
  batch_axis: Axes = "data",
  head_axis: Axes = "tensor",
  **kernel_kwargs: Any,
) -> Callable[..., Any]:
  """Wraps an attention kernel to run per device: batch and heads split.

  Attention is independent across batch elements and heads, so ``query``,
  ``key`` and ``value`` (``(B, T, N, H)`` / ``(B, S, K, H)``) are split on
  ``batch_axis`` along B and on ``head_axis`` along the head axis, with no
  communication. Each device must hold whole GQA groups, so the mesh's
  ``head_axis`` size must divide ``K`` (and hence ``N``). Keyword array
  arguments are sharded by name: ``mask`` (``(B|1, N|1, T, S)``) like the
  logits, ``sinks`` (``(N,)``) along heads; the remaining keyword arguments
  are static and passed through.

  Args:
    kernel: `pallas_kernels.attention` / `linear_attention` function.
    mesh: the device mesh.
    batch_axis: mesh axis (or tuple of axes) for the batch, or ``None``.
    head_axis: mesh axis (or tuple of axes) for the heads, or ``None``.
    **kernel_kwargs: static keyword arguments (``is_causal``, ``interpret``).

  Returns:
    ``f(query, key, value, *, mask=None, sinks=None)``.

  Raises:
    ValueError: for axes missing from ``mesh`` or heads not divisible by
      the ``head_axis`` size.
  """
  who = "shard_heads"
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
  for a in (*_names(batch_axis), *_names(head_axis)):
    if a not in sizes:
      raise ValueError(
        f"{who}: axis {a!r} is not in mesh.axis_names={mesh.axis_names}"
      )
  qkv = PartitionSpec(batch_axis, None, head_axis, None)

  def run(query, key, value, *, mask=None, sinks=None):
    heads = math.prod(sizes[a] for a in _names(head_axis))
    if key.shape[2] % heads:
      raise ValueError(
        f"{who}: the {key.shape[2]} key heads must be divisible by the "
        f"{head_axis!r} axis size {heads} (each device holds whole GQA "
        "groups)"
      )
    arrays = {"mask": mask, "sinks": sinks}
    specs = {
      "mask": None
      if mask is None
      else PartitionSpec(
        batch_axis if mask.shape[0] > 1 else None,
        head_axis if mask.shape[1] > 1 else None,
        None,
        None,
      ),
      "sinks": None if sinks is None else PartitionSpec(head_axis),
    }

    def local(q, k, v, m, s):
      extra = {n: a for n, a in (("mask", m), ("sinks", s)) if a is not None}
      return kernel(q, k, v, **extra, **kernel_kwargs)

    return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(qkv, qkv, qkv, specs["mask"], specs["sinks"]),
      out_specs=qkv,
      check_vma=False,
    )(query, key, value, arrays["mask"], arrays["sinks"])

  return run


def _names(axes: Axes) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def heads_plan(query: Any, key: Any) -> tuple[Any, Axes, Axes] | None:
  """``(mesh, batch_axes, head_axes)`` to run attention per device, or None.

  The mesh is the context one (`jax.set_mesh`), else that of a sharded
  ``query``. ``None`` without a mesh of more than one device, inside a
  `shard_map` (manual axes) and for an unbatched ``query``. Each mesh axis
  goes to the batch while the batch size stays divisible, else to the key
  heads while they stay divisible (whole GQA groups per device), else it
  replicates the work (every device of that axis computes the same block).
  """
  if jnp.ndim(query) != 4:
    return None
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    mesh = getattr(jax.typeof(query).sharding, "mesh", mesh)
  if mesh.empty or mesh.size == 1:
    return None
  if any(t == AxisType.Manual for t in mesh.axis_types):
    return None
  batch, heads, nb, nh = [], [], 1, 1
  for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True):
    if size == 1:
      continue
    if query.shape[0] % (nb * size) == 0:
      batch.append(name)
      nb *= size
    elif key.shape[2] % (nh * size) == 0:
      heads.append(name)
      nh *= size
  return mesh, tuple(batch) or None, tuple(heads) or None


def on_mesh_heads(kernel: Callable[..., Any]) -> Callable[..., Any]:
  """Runs an attention kernel per device on the context mesh (`heads_plan`).

  The kernel's calling convention: ``(query, key, value, bias=None,
  mask=None, *, sinks=..., **static)``; off a mesh it is called as is.

  Raises:
    NotImplementedError: an additive ``bias`` on a mesh (the kernels have
      none).
  """

  @functools.wraps(kernel)
  def run(query, key, value, *args, **kwargs):
    plan = heads_plan(query, key)
    if plan is None:
      return kernel(query, key, value, *args, **kwargs)
    bias, mask = (*args, None, None)[:2]
    bias, mask = kwargs.pop("bias", bias), kwargs.pop("mask", mask)
    if bias is not None:
      raise NotImplementedError(
        f"{kernel.__name__}: no additive bias; use implementation='xla'"
      )
    sinks = kwargs.pop("sinks", None)
    mesh, batch, heads = plan
    return shard_heads(
      kernel, mesh, batch_axis=batch, head_axis=heads, **kwargs
    )(query, key, value, mask=mask, sinks=sinks)

  return run
