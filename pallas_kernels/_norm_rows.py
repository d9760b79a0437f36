"""Shared plumbing of the row-norm kernels (`norms`, `dyt_seed`).

Static call data, input preparation, the row call through `_rows`, the
mesh wrapper and parameter checks; see `pallas_kernels.norms` for the
kernels and their contract.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec

from jaxnorm import _checks, _target
from pallas_kernels import _rows, mosaic_gpu_rows, sharding

Axis = int | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Static:
  """Hashable static configuration of one kernel call."""

  tiling: _rows.RowTiling
  interpret: Any
  eps: float = 0.0
  offset: float = 0.0
  eps_mode: str = "inside"
  has_scale: bool = False
  has_bias: bool = False
  kind: str = "rms"
  h_dtype: str = "float32"
  x_dtype: str = "float32"
  num_heads: int = 1
  div_dim: bool = False


def _prepare(
  who: str,
  x: Any,
  axis: Axis,
  block_rows: int | None,
  interpret: Any,
  backend: str | None,
  gpu_block_elems: int = _rows.MOSAIC_GPU_BLOCK_ELEMS,
) -> tuple[jax.Array, tuple[int, ...], _rows.RowTiling, Any]:
  """Validates the kernel-specific facts and builds the tiling.

  Returns ``(x, axes, tiling, interpret)`` with ``interpret`` the value to
  pass to Pallas (`_rows.interpreter`); ``gpu_block_elems`` is the kernel's
  largest Mosaic GPU block (`_rows.norm_block_heuristic`).
  """
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  lowering = _rows.row_lowering(who, interpret, backend, x)
  _rows.trailing_axes(who, axes, x.ndim)
  _rows.check_dtype(who, x.dtype, lowering)
  if x.size == 0:
    raise NotImplementedError(
      f"{who}: kernels need a non-empty input, got x.shape={x.shape}"
    )
  rows, feats = _rows.flatten_rows(x, len(axes))
  tiling = _rows.norm_block_heuristic(
    who,
    lowering,
    rows,
    feats,
    x.dtype,
    block_rows,
    _target.current(x).chip,
    gpu_block_elems=gpu_block_elems,
  )
  return x, axes, tiling, _rows.interpreter(lowering, interpret)


def _row_call(
  st: _Static, body, row_inputs, params, out_dtypes, partials, name
):
  """`_rows.row_call` or its Mosaic GPU twin, per the tiling's lowering."""
  call = (
    mosaic_gpu_rows.row_call
    if st.tiling.lowering == "mosaic_gpu"
    else _rows.row_call
  )
  return call(
    body,
    st.tiling,
    row_inputs,
    params,
    out_dtypes,
    partials,
    interpret=st.interpret,
    name=name,
  )


def _mesh_rows(
  who: str, x: Any, axis: Any
) -> tuple[Any, PartitionSpec, int] | None:
  """``(mesh, row_spec, num_feature_axes)`` to run per device, or ``None``.

  The mesh is the context one (`jax.set_mesh`), else that of a sharded
  ``x`` (a `NamedSharding`). ``None`` without a mesh of more than one
  device, inside a `shard_map` (manual axes: already per device), and for
  arguments the kernel itself rejects (it raises its own error).

  Raises:
    NotImplementedError: when ``x`` is explicitly sharded along a
      normalized axis (a row must live on one device).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:  # a sharded input carries its mesh
    mesh = getattr(jax.typeof(x).sharding, "mesh", mesh)
  if mesh.empty or mesh.size == 1:
    return None
  if any(t == AxisType.Manual for t in mesh.axis_types):
    return None
  ndim = jnp.ndim(x)
  try:
    axes = _checks.normalize_axes(who, axis, ndim)
  except (TypeError, ValueError):
    return None
  nf = len(axes)
  if axes != tuple(range(ndim - nf, ndim)):
    return None
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  spec += (None,) * (ndim - len(spec))
  if any(s is not None for s in spec[ndim - nf :]):
    raise NotImplementedError(
      f"{who}: x is sharded along a normalized axis, sharding "
      f"spec={spec}; a row must live on one device, so reshard it or use "
      "the reference (implementation='xla')"
    )
  if not any(s is not None for s in spec):
    spec = _split_rows(mesh, jnp.shape(x)[: ndim - nf]) + (None,) * nf
  return mesh, PartitionSpec(*spec), nf


def _split_rows(mesh: Any, lead: tuple[int, ...]) -> tuple[Any, ...]:
  """Each mesh axis over the first leading axis whose size it divides."""
  left, names = list(lead), [[] for _ in lead]
  for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True):
    for d, n in enumerate(left):
      if size > 1 and n % size == 0:
        names[d].append(name)
        left[d] //= size
        break
  return tuple(
    None if not n else n[0] if len(n) == 1 else tuple(n) for n in names
  )


def _on_mesh(num_row_args: int):
  """Runs the decorated kernel per device on the context mesh.

  `_mesh_rows` decides whether and how; the kernel then goes through
  `sharding.shard_rows` with its keyword arguments, and the parameters
  (the positional arguments after the ``num_row_args`` row arrays) are
  replicated.
  """

  def wrap(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
      plan = _mesh_rows(fn.__name__, args[0], kwargs.get("axis", -1))
      if plan is None:
        return fn(*args, **kwargs)
      mesh, spec, nf = plan
      return sharding.shard_rows(
        fn,
        mesh,
        spec,
        num_row_args=num_row_args,
        num_feature_axes=nf,
        **kwargs,
      )(*args)

    return run

  return wrap


def _check_param(
  who: str, name: str, p: Any, x: jax.Array, axes: tuple[int, ...]
) -> None:
  if p is None:
    return
  _checks.check_floating(who, name, p)
  _checks.check_shape(
    who, name, p, tuple(x.shape[a] for a in axes), "x.shape[axis]"
  )


def _flat(p: Any, feats: int) -> jax.Array:
  return jnp.asarray(p).reshape(feats)


def _gain(ps: list[jax.Array], st: _Static) -> jax.Array | float:
  """``scale + offset`` as a (1, width) row, or the scalar ``1 + offset``."""
  if st.has_scale:
    return ps[0] + st.offset
  return 1.0 + st.offset


def _params(*ps):
  return [p for p in ps if p is not None]


def _rms_k(x: jax.Array, st: _Static, ops: _rows.RowOps):
  """Mean square and the normalizing factor ``k`` of each row (row form)."""
  ms = ops.mean(x * x)
  if st.eps_mode == "inside":
    return ms, jax.lax.rsqrt(ms + st.eps)
  return ms, 1.0 / (ops.sqrt(ms) + st.eps)
