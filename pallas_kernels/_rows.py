"""Row-blocked Pallas machinery shared by the norm kernels.

Every norm kernel in this package sees its input as a matrix of ``rows``
independent rows of ``features`` elements (the normalized axes, flattened and
last). One grid step owns ``block_rows`` consecutive rows and the *whole*
feature width, so per-row statistics never cross grid steps; parameter
gradients are per-block partial sums written to a ``(num_blocks, 1, width)``
float32 array and reduced by a tiny second pass (`jnp.sum`) outside the
kernel, as in Apex/TransformerEngine.

Two lowerings share one kernel body:

* ``"gpu"`` (Triton semantics, ``pl.pallas_call`` without Mosaic-GPU params):
  Triton tensors must have power-of-two sizes, so a block is
  ``(block_rows, next_pow2(features))``; loads and stores are masked with
  ``plgpu.load``/``plgpu.store`` (Triton does not bounds-check), padded
  columns load as zero and padded rows load as zero.
* ``"tpu"`` (Mosaic): a block is ``(block_rows, features)``; the last dim is
  the full feature width, so any width is legal, and ``block_rows`` is a
  multiple of the sublane tile (8 for 32-bit, 16 for 16-bit dtypes) or the
  whole row count. Mosaic pads the last, partial block with garbage on read
  and drops its out-of-range rows on write, so only the partial sums need a
  row mask (a ``where``, which also discards NaN garbage).

The lowering follows ``interpret``: ``pltpu.InterpretParams()`` selects the
TPU kernel run by the TPU-semantics interpreter, ``True`` the GPU kernel run
by the generic interpreter, ``False`` the current backend's compiled kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

Lowering = Literal["gpu", "tpu"]

# Widest normalized row a one-block-per-row kernel handles (see
# `norm_block_heuristic`); wider rows need a column-split kernel.
MAX_FEATURES = 16384
_GPU_DTYPES = ("float32", "bfloat16", "float16")
_TPU_DTYPES = ("float32", "bfloat16")


def lowering_for(who: str, interpret: Any) -> Lowering:
  """Picks the kernel lowering from ``interpret`` and the default backend.

  Raises:
    NotImplementedError: on a backend without a Pallas lowering (CPU) when
      ``interpret`` is false.
  """
  if isinstance(interpret, pltpu.InterpretParams):
    return "tpu"
  if interpret:
    return "gpu"
  backend = jax.default_backend()
  if backend in ("gpu", "cuda", "rocm"):
    return "gpu"
  if backend == "tpu":
    return "tpu"
  raise NotImplementedError(
    f"{who}: no compiled Pallas lowering for backend {backend!r}; pass "
    "interpret=True (GPU semantics) or interpret=pltpu.InterpretParams() "
    "(TPU semantics) to run the kernel in the interpreter, or use the "
    "reference (implementation='xla')"
  )


def check_dtype(who: str, dtype: Any, lowering: Lowering) -> None:
  """Raises `NotImplementedError` for dtypes the lowering does not handle."""
  name = jnp.dtype(dtype).name
  allowed = _GPU_DTYPES if lowering == "gpu" else _TPU_DTYPES
  if name not in allowed:
    raise NotImplementedError(
      f"{who}: the {lowering} kernel supports x.dtype in {allowed}, got "
      f"x.dtype={name}; use the reference (implementation='xla')"
    )


def trailing_axes(who: str, axes: tuple[int, ...], ndim: int) -> None:
  """Kernels need the normalized axes to be the trailing, contiguous ones.

  Raises:
    NotImplementedError: otherwise (a transpose would cost a full extra
      round trip through memory, more than the kernel saves).
  """
  if axes != tuple(range(ndim - len(axes), ndim)):
    raise NotImplementedError(
      f"{who}: kernels normalize over the trailing axes only, got "
      f"axis={axes} for rank {ndim}; move the axis last (jnp.moveaxis) or "
      "use the reference (implementation='xla')"
    )


def _sublanes(dtype: Any) -> int:
  return 8 * max(1, 4 // jnp.dtype(dtype).itemsize)


@dataclasses.dataclass(frozen=True)
class RowTiling:
  """Static tiling of a ``(rows, features)`` row-blocked kernel.

  Attributes:
    lowering: ``"gpu"`` or ``"tpu"``.
    rows: number of independent rows.
    features: normalized width of each row.
    block_rows: rows per grid step.
    block_cols: columns per block: ``next_pow2(features)`` on GPU (Triton),
      ``features`` on TPU.
    sublanes: TPU sublane tile of the input dtype (``block_rows`` must be a
      multiple unless it equals ``rows``).
    num_warps: Triton warps per program (GPU only).
  """

  lowering: Lowering
  rows: int
  features: int
  block_rows: int
  block_cols: int
  sublanes: int = 8
  num_warps: int | None = None

  def __post_init__(self):
    if self.rows < 1 or self.features < 1:
      raise ValueError(
        f"RowTiling: rows and features must be >= 1, got "
        f"rows={self.rows}, features={self.features}"
      )
    if self.block_rows < 1:
      raise ValueError(
        f"RowTiling: block_rows must be >= 1, got block_rows={self.block_rows}"
      )
    if self.lowering == "gpu":
      for name in ("block_rows", "block_cols"):
        v = getattr(self, name)
        if v & (v - 1):
          raise ValueError(
            f"RowTiling: the gpu (Triton) lowering needs a "
            f"power-of-two {name}, got {name}={v}"
          )
      if self.block_cols < self.features:
        raise ValueError(
          f"RowTiling: block_cols={self.block_cols} must "
          f"cover features={self.features}"
        )
    else:
      if self.block_cols != self.features:
        raise ValueError(
          f"RowTiling: the tpu lowering needs block_cols == "
          f"features, got {self.block_cols} != "
          f"{self.features}"
        )
      if self.block_rows % self.sublanes and self.block_rows != self.rows:
        raise ValueError(
          f"RowTiling: the tpu lowering needs block_rows to be a multiple "
          f"of {self.sublanes} (the sublane tile of this dtype) or equal "
          f"to rows={self.rows}, got block_rows={self.block_rows}"
        )

  @property
  def num_blocks(self) -> int:
    """Grid size along the rows."""
    return pl.cdiv(self.rows, self.block_rows)


# Heuristic constants (see `norm_block_heuristic`).
_GPU_TILE_ELEMS = 4096
_GPU_MAX_ROWS = 64
_TPU_TILE_BYTES = 1 << 20
_TPU_MAX_ROWS = 512


def norm_block_heuristic(
  who: str,
  lowering: Lowering,
  rows: int,
  features: int,
  dtype: Any,
  block_rows: int | None = None,
) -> RowTiling:
  """Chooses the tile of a row-blocked norm kernel; the one place for sizes.

  Constants:

  * ``MAX_FEATURES = 16384``: one row block holds a whole row, so the row
    must fit on chip with several float32 temporaries. At 16384 the GPU
    kernel keeps 16384 / (32 * 16 warps) = 32 floats per thread per live
    tile (a backward pass holds about 4: x, dy, the product and dx) and the
    TPU tile is 16 rows x 64 KiB = 1 MiB. Wider rows raise
    `NotImplementedError` (a column-split kernel would be needed).
  * GPU ``_GPU_TILE_ELEMS = 4096`` float32 elements per program: with 4
    warps (128 threads) that is 32 registers per thread per live tile,
    about 128 for the backward's four tiles, under Triton's 255 limit and
    leaving occupancy for latency hiding. ``block_rows = 4096 //
    next_pow2(features)`` clipped to ``[1, _GPU_MAX_ROWS = 64]`` (64 rows is
    enough to amortize the parameter loads) and to ``next_pow2(rows)``.
    ``num_warps = block elements / 1024`` clipped to ``[4, 16]`` so wide rows
    get more threads rather than more registers per thread.
  * TPU ``_TPU_TILE_BYTES = 1 MiB`` per float32 tile: the backward streams up
    to four arrays (fused add: h, dy, dh in; d out), double-buffered by the
    Pallas pipeline (8 tiles at most 1 MiB each in the input dtype) plus a
    few float32 temporaries, about 12 MiB in all, under the 16 MiB default
    scoped VMEM of v5e (32 MiB on v6e). ``block_rows`` is rounded down to
    the sublane tile (8 rows for 32-bit, 16 for 16-bit dtypes) and capped
    at ``_TPU_MAX_ROWS = 512`` (larger tiles no longer improve the
    HBM-bound throughput, and a longer grid keeps both v7 TensorCores busy
    under "parallel" semantics). With ``rows <= block_rows`` the single
    block is the whole array, which any row count satisfies.

  Args:
    who: caller name for error messages.
    lowering: ``"gpu"`` or ``"tpu"``.
    rows: number of rows.
    features: row width.
    dtype: input dtype (TPU sublane tile).
    block_rows: user override, validated by `RowTiling`.

  Returns:
    The `RowTiling`.

  Raises:
    NotImplementedError: for ``features > MAX_FEATURES``.
    ValueError: for an invalid ``block_rows`` override.
  """
  if features > MAX_FEATURES:
    raise NotImplementedError(
      f"{who}: kernels hold a whole row per block and support up to "
      f"{MAX_FEATURES} features, got {features}; use the reference "
      "(implementation='xla')"
    )
  sub = _sublanes(dtype)
  if lowering == "gpu":
    cols = pl.next_power_of_2(features)
    if block_rows is None:
      block_rows = max(
        1, min(_GPU_TILE_ELEMS // cols, _GPU_MAX_ROWS, pl.next_power_of_2(rows))
      )
    warps = min(16, max(4, block_rows * cols // 1024))
    return RowTiling("gpu", rows, features, block_rows, cols, sub, warps)
  if block_rows is None:
    fit = _TPU_TILE_BYTES // (4 * features) // sub * sub
    block_rows = min(max(sub, fit), _TPU_MAX_ROWS)
  if block_rows >= rows:
    block_rows = rows
  return RowTiling("tpu", rows, features, block_rows, features, sub)


# A row body maps float32 row tiles and (1, width) parameter rows to output
# tiles and per-element partial-sum contributions. ``colmask`` is a (1, width)
# bool array on GPU when the block is wider than the row, else None.
RowBody = Callable[
  [Sequence[jax.Array], Sequence[jax.Array], "jax.Array | None"],
  tuple[Sequence[jax.Array], Sequence[jax.Array]],
]


def row_call(
  body: RowBody,
  tiling: RowTiling,
  row_inputs: Sequence[jax.Array],
  params: Sequence[jax.Array],
  out_dtypes: Sequence[Any],
  num_partials: int,
  *,
  interpret: Any,
  name: str,
) -> tuple[list[jax.Array], list[jax.Array]]:
  """Runs ``body`` over row blocks of ``(rows, features)`` arrays.

  Args:
    body: the per-block math (`RowBody`); all its inputs are float32.
    tiling: the `RowTiling`.
    row_inputs: arrays of shape ``(rows, features)``.
    params: arrays of shape ``(features,)`` (loaded once per block).
    out_dtypes: dtypes of the ``(rows, features)`` outputs.
    num_partials: how many per-element contributions ``body`` returns to be
      summed over all rows (parameter gradients).
    interpret: forwarded to `pl.pallas_call`.
    name: kernel name.

  Returns:
    ``(outputs, sums)``: the row outputs and, for each partial, its float32
    sum over rows, shape ``(features,)``.
  """
  t = tiling
  rows, feats, br, bc = t.rows, t.features, t.block_rows, t.block_cols
  grid = (t.num_blocks,)
  n_in, n_p, n_out = len(row_inputs), len(params), len(out_dtypes)
  gpu = t.lowering == "gpu"

  def kernel(*refs):
    in_refs = refs[:n_in]
    p_refs = refs[n_in : n_in + n_p]
    out_refs = refs[n_in + n_p : n_in + n_p + n_out]
    part_refs = refs[n_in + n_p + n_out :]
    i = pl.program_id(0)
    row_ids = i * br + jax.lax.broadcasted_iota(jnp.int32, (br, 1), 0)
    rmask = row_ids < rows
    if gpu:
      col_ids = jax.lax.broadcasted_iota(jnp.int32, (1, bc), 1)
      cmask = col_ids < feats
      mask = jnp.logical_and(rmask, cmask)
      xs = [
        plgpu.load(r, mask=mask, other=0.0).astype(jnp.float32) for r in in_refs
      ]
      ps = [
        plgpu.load(p, mask=cmask, other=0.0).astype(jnp.float32) for p in p_refs
      ]
      colmask = cmask if bc != feats else None
    else:
      xs = [r[...].astype(jnp.float32) for r in in_refs]
      ps = [p[...].astype(jnp.float32) for p in p_refs]
      colmask = None
    outs, contribs = body(xs, ps, colmask)
    for ref, val in zip(out_refs, outs, strict=True):
      if gpu:
        plgpu.store(ref, val.astype(ref.dtype), mask=mask)
      else:
        ref[...] = val.astype(ref.dtype)
    for ref, c in zip(part_refs, contribs, strict=True):
      ref[...] = jnp.sum(jnp.where(rmask, c, 0.0), axis=0, keepdims=True)

  row_spec = pl.BlockSpec((br, bc), lambda i: (i, 0))
  param_spec = pl.BlockSpec((1, bc), lambda i: (0, 0))
  part_spec = pl.BlockSpec((pl.squeezed, 1, bc), lambda i: (i, 0, 0))
  out_shape = [jax.ShapeDtypeStruct((rows, feats), d) for d in out_dtypes] + [
    jax.ShapeDtypeStruct((grid[0], 1, bc), jnp.float32)
  ] * num_partials
  if gpu:
    compiler_params = plgpu.CompilerParams(num_warps=t.num_warps, num_stages=1)
  elif isinstance(interpret, pltpu.InterpretParams):
    # The TPU interpreter of jax 0.10 does not skip vmapped grid dims when it
    # reads dimension_semantics (the compiler does), so under vmap a
    # ("parallel",) tuple is one entry short; the semantics only let the
    # compiler split the grid across TensorCores, so leave them out here.
    compiler_params = pltpu.CompilerParams()
  else:
    compiler_params = pltpu.CompilerParams(dimension_semantics=("parallel",))
  results = pl.pallas_call(
    kernel,
    out_shape=out_shape,
    grid=grid,
    in_specs=[row_spec] * n_in + [param_spec] * n_p,
    out_specs=[row_spec] * n_out + [part_spec] * num_partials,
    compiler_params=compiler_params,
    interpret=interpret,
    name=name,
  )(*row_inputs, *[p.reshape(1, feats) for p in params])
  outs = list(results[:n_out])
  sums = [jnp.sum(r[:, 0, :feats], axis=0) for r in results[n_out:]]
  return outs, sums


def row_mean(v: jax.Array, features: int) -> jax.Array:
  """Mean over the feature axis of a (block_rows, width) tile (keepdims).

  Padded GPU columns hold zeros, so the sum is divided by the true width.
  """
  return jnp.sum(v, axis=1, keepdims=True) * (1.0 / features)


def flatten_rows(x: jax.Array, num_axes: int) -> tuple[int, int]:
  """``(rows, features)`` of ``x`` with its last ``num_axes`` axes as row."""
  feats = math.prod(x.shape[x.ndim - num_axes :])
  rows = math.prod(x.shape[: x.ndim - num_axes])
  return rows, feats
