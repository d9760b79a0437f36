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
under `jax.set_mesh` (or on an explicitly sharded input), so
``implementation=None`` dispatch runs them per device on a mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec


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
  batch_axis: str | None = "data",
  head_axis: str | None = "tensor",
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
    batch_axis: mesh axis for the batch, or ``None``.
    head_axis: mesh axis for the heads, or ``None``.
    **kernel_kwargs: static keyword arguments (``is_causal``, ``interpret``).

  Returns:
    ``f(query, key, value, *, mask=None, sinks=None)``.

  Raises:
    ValueError: for axes missing from ``mesh`` or heads not divisible by
      the ``head_axis`` size.
  """
  who = "shard_heads"
  for a in (batch_axis, head_axis):
    if a is not None and a not in mesh.axis_names:
      raise ValueError(
        f"{who}: axis {a!r} is not in mesh.axis_names={mesh.axis_names}"
      )
  qkv = PartitionSpec(batch_axis, None, head_axis, None)

  def run(query, key, value, *, mask=None, sinks=None):
    heads = 1 if head_axis is None else mesh.shape[head_axis]
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
