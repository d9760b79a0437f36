"""The Mosaic GPU lowering of the row kernels (`pallas_kernels._rows`).

Normalization is memory-bound, so the kernel serves coalesced global-memory
access and nothing else, as tokamax's Mosaic GPU normalization does: one
block (a CUDA thread block of one warpgroup, 128 threads) loads its
``(block_rows, features)`` rows straight from global memory into registers,
reduces them there and writes the results back. There is no shared-memory
staging and no pipeline: the TMA copies that a `pl.BlockSpec` pipeline would
issue cover at most 256 elements per dimension, narrower than a normalized
row, and several resident blocks per SM hide the load latency instead.

* Layout: `_rows.mosaic_gpu_split` spreads the 4 warps and 32 lanes of the
  warpgroup over a base tile that repeats over the block in registers; each
  lane holds `_rows.MOSAIC_GPU_VECTOR` consecutive columns, so a warp reads
  whole 128-byte lines. Row statistics are lane shuffles, plus a small
  shared-memory exchange when several warps share a row; parameter partial
  sums reduce over the rows in the same way.
* Last block: loads cannot be masked, so a last, partial block is shifted
  back to end at the last row. Its first rows are also the previous block's;
  both blocks write the same values there (each row's math is the same), and
  its partial sums skip them. Inputs with fewer rows than one block are
  padded with zero rows (a copy of under one block) and the outputs sliced.
* Entry point: `plgpu.kernel` (a `pl.pallas_call` with Mosaic GPU compiler
  parameters has no GPU lowering on jax 0.12: it reaches Triton's registry
  and fails an assertion). Its batching rule handles `jax.vmap`.

Interpreting: ``interpret=InterpretGPUParams()`` runs the kernel in the
Mosaic GPU interpreter. Where that interpreter implements the Mosaic GPU
load and layout-cast primitives (jax >= 0.12, which exports the class as
``plgpu.InterpretGPUParams``) it runs this exact body; on older JAX it runs
the same body with plain ``ref[...]`` loads and no layout annotations, which
checks the maths and the indexing but not the layouts. The layouts are
checked by cross-lowering (`jax.export` for ``"cuda"``) on both versions;
what needs a GPU is the compilation to PTX and the speed.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import TiledLayout
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import _cost, _rows

# jax 0.10 takes the index positionally (``load(ref, idx, ...)``), jax 0.12
# only the ref (``load(ref.at[idx], ...)``).
_LOAD_TAKES_INDEX = "idx" in inspect.signature(plgpu.load).parameters
# Whether the Mosaic GPU interpreter runs `plgpu.load` and `layout_cast`.
_INTERPRETER_RUNS_LAYOUTS = hasattr(plgpu, "InterpretGPUParams")
# jax 0.10's `plgpu.kernel` takes no cost estimate.
_KERNEL_TAKES_COST = (
  "cost_estimate" in inspect.signature(plgpu.kernel).parameters
)


def block_layout(features: int) -> Any:
  """The register layout of a ``(block_rows, features)`` block.

  A `TiledLayout` (see `_rows.mosaic_gpu_split` for the split): the tiling
  ``(R, C)(lane_rows, lane_cols * v)(1, v)`` of the base tile ``(R, C) =
  (warp_rows * lane_rows, warp_cols * lane_cols * v)`` unfolds it into
  ``(warp_rows, warp_cols, lane_rows, lane_cols, 1, v)``: the first two
  dimensions go to warps, the next two to lanes, ``v`` is the vector.
  """
  warp_rows, warp_cols, lane_rows, lane_cols = _rows.mosaic_gpu_split(features)
  v = _rows.MOSAIC_GPU_VECTOR
  tiling = plgpu.Tiling(
    (
      (warp_rows * lane_rows, warp_cols * lane_cols * v),
      (lane_rows, lane_cols * v),
      (1, v),
    )
  )
  layout = TiledLayout(
    tiling,
    warp_dims=(-6, -5),
    lane_dims=(-4, -3),
    vector_dim=-1,
    _check_canonical=False,
  ).canonicalize()
  return plgpu.Layout.TILED(
    layout.tiling,
    warp_dims=layout.warp_dims,
    lane_dims=layout.lane_dims,
    vector_dim=layout.vector_dim,
  )


def _load(ref: Any, layout: Any) -> jax.Array:
  """Global memory to registers, in ``layout`` (``None``: a plain read)."""
  if layout is None:
    return ref[...]
  if _LOAD_TAKES_INDEX:
    return plgpu.load(ref, (), layout=layout, optimized=False)
  return plgpu.load(ref, layout=layout, optimized=False)


@dataclasses.dataclass(frozen=True)
class MosaicRowOps(_rows.RowOps):
  """`RowOps` of a Mosaic GPU block: row form is ``(block_rows,)``.

  Attributes:
    block_rows: rows of the block.
    layout: the block's register layout, or ``None`` in an interpreter that
      does not run layout annotations.
  """

  block_rows: int = 1
  layout: Any = None

  def _cast(self, v: jax.Array, layout: Any) -> jax.Array:
    return v if self.layout is None else plgpu.layout_cast(v, layout)

  def sum(self, v: jax.Array) -> jax.Array:
    """Row sums of a tile, shape ``(block_rows,)``."""
    return jnp.sum(v, axis=1)

  def full(self, stat: jax.Array) -> jax.Array:
    """A ``(block_rows,)`` statistic broadcast into the block's layout."""
    shape = (self.block_rows, self.width)
    return self._cast(jax.lax.broadcast_in_dim(stat, shape, (0,)), self.layout)

  def sqrt(self, stat: jax.Array) -> jax.Array:
    """``m * rsqrt(m)``, 0 at 0: the Mosaic GPU of jax 0.10 lowers no sqrt."""
    pos = stat > 0
    return jnp.where(pos, stat * jax.lax.rsqrt(jnp.where(pos, stat, 1.0)), 0.0)

  def row(self, param: jax.Array) -> jax.Array:
    """A ``(width,)`` parameter vector broadcast over the block's rows."""
    shape = (self.block_rows, self.width)
    return self._cast(jax.lax.broadcast_in_dim(param, shape, (1,)), self.layout)

  def iota(self, dimension: int) -> jax.Array:
    """Row (``0``) or column (``1``) indices in the block's layout."""
    shape = (self.block_rows, self.width)
    return self._cast(
      jax.lax.broadcasted_iota(jnp.int32, shape, dimension), self.layout
    )

  def col_ids(self) -> jax.Array:
    """Column indices of the block, in its layout."""
    return self.iota(1)


def row_call(
  body: _rows.RowBody,
  tiling: _rows.RowTiling,
  row_inputs: Sequence[jax.Array],
  params: Sequence[jax.Array],
  out_dtypes: Sequence[Any],
  num_partials: int,
  *,
  interpret: Any,
  name: str,
  cost_estimate: pl.CostEstimate | None = None,
) -> tuple[list[jax.Array], list[jax.Array]]:
  """Runs ``body`` over row blocks on Mosaic GPU; contract of `_rows.row_call`.

  Args:
    body: the per-block math (`_rows.RowBody`); all its inputs are float32.
    tiling: a `_rows.RowTiling` with lowering ``"mosaic_gpu"``.
    row_inputs: arrays of shape ``(rows, features)``.
    params: arrays of shape ``(features,)``.
    out_dtypes: dtypes of the ``(rows, features)`` outputs.
    num_partials: how many per-element contributions ``body`` returns to be
      summed over all rows.
    interpret: ``False`` or an ``InterpretGPUParams`` (`_rows.interpreter`).
    name: kernel name.
    cost_estimate: what XLA is told the kernel costs; ``None``:
      `_cost.body_cost` of ``body`` on one block. Dropped where
      `plgpu.kernel` takes none (jax < 0.12).

  Returns:
    ``(outputs, sums)`` as in `_rows.row_call`.
  """
  t = tiling
  rows, feats, br = t.rows, t.features, t.block_rows
  # Fewer rows than one block: pad with zero rows (under one block copied).
  padded = max(rows, br)
  if padded != rows:
    row_inputs = [jnp.pad(a, ((0, padded - rows), (0, 0))) for a in row_inputs]
  nb = t.num_blocks
  n_in, n_p, n_out = len(row_inputs), len(params), len(out_dtypes)
  layout = block_layout(feats)
  if interpret and not _INTERPRETER_RUNS_LAYOUTS:
    layout = None

  def kernel(*refs):
    in_refs = refs[:n_in]
    p_refs = refs[n_in : n_in + n_p]
    out_refs = refs[n_in + n_p : n_in + n_p + n_out]
    part_refs = refs[n_in + n_p + n_out :]
    i = jax.lax.axis_index("rows")
    # The last block is shifted back to end at the last (padded) row.
    start = jnp.minimum(i * br, padded - br)
    window = pl.ds(start, br)
    ops = MosaicRowOps(feats, feats, block_rows=br, layout=layout)
    xs = [_load(r.at[window], layout).astype(jnp.float32) for r in in_refs]
    p_layout = None if layout is None else layout.reduce(0)
    ps = [ops.row(_load(p, p_layout).astype(jnp.float32)) for p in p_refs]
    outs, contribs = body(xs, ps, ops)
    for ref, val in zip(out_refs, outs, strict=True):
      ref[window, :] = val.astype(ref.dtype)
    if part_refs:
      # Rows the previous block owns, and zero padding, add nothing.
      row_ids = start + ops.iota(0)
      own = jnp.logical_and(row_ids >= i * br, row_ids < rows)
      for ref, c in zip(part_refs, contribs, strict=True):
        ref[i] = jnp.sum(jnp.where(own, c, 0.0), axis=0)

  out_type = [jax.ShapeDtypeStruct((padded, feats), d) for d in out_dtypes] + [
    jax.ShapeDtypeStruct((nb, feats), jnp.float32)
  ] * num_partials
  if cost_estimate is None:
    cost_ops = MosaicRowOps(feats, feats, block_rows=br)
    jaxpr = jax.make_jaxpr(
      lambda xs, ps: body(xs, [cost_ops.row(p) for p in ps], cost_ops)
    )(
      [jax.ShapeDtypeStruct((br, feats), jnp.float32)] * n_in,
      [jax.ShapeDtypeStruct((feats,), jnp.float32)] * n_p,
    )
    cost_estimate = _cost.body_cost(
      jaxpr, nb, br * feats, num_partials, [*row_inputs, *params], out_type
    )
  cost = {"cost_estimate": cost_estimate} if _KERNEL_TAKES_COST else {}
  kernel.__name__ = name
  results = plgpu.kernel(
    kernel,
    out_type=tuple(out_type),
    grid=(nb,),
    grid_names=("rows",),
    compiler_params=plgpu.CompilerParams(),
    interpret=interpret or None,
    **cost,
  )(*row_inputs, *params)
  outs = [r[:rows] if padded != rows else r for r in results[:n_out]]
  sums = [jnp.sum(r, axis=0) for r in results[n_out:]]
  return outs, sums
