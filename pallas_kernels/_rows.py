"""Row-blocked Pallas machinery shared by the norm kernels.

Every norm kernel in this package sees its input as a matrix of ``rows``
independent rows of ``features`` elements (the normalized axes, flattened and
last). One grid step owns ``block_rows`` consecutive rows and the *whole*
feature width, so per-row statistics never cross grid steps; parameter
gradients are per-block partial sums written to a ``(num_blocks, 1, width)``
float32 array and reduced by a tiny second pass (`jnp.sum`) outside the
kernel, as in Apex/TransformerEngine.

Three lowerings share one kernel body (a `RowBody`, written against
`RowOps` so that it never spells a reduction or a broadcast itself):

* ``"mosaic_gpu"`` (the GPU default, `pallas_kernels.mosaic_gpu_rows`):
  registers-only blocks loaded straight from global memory in a coalesced
  `TiledLayout`, no shared-memory staging; see that module.
* ``"triton"`` (kept behind ``backend="triton"`` while the installed JAX has
  it): Triton tensors must have power-of-two sizes, so a block is
  ``(block_rows, next_pow2(features))``; loads and stores are masked with
  ``pltr.load``/``pltr.store`` (Triton does not bounds-check), padded
  columns load as zero and padded rows load as zero.
* ``"tpu"`` (Mosaic TPU): a block is ``(block_rows, features)``; the last dim
  is the full feature width, so any width is legal, and ``block_rows`` is a
  multiple of the sublane tile (8 for 32-bit, 16 for 16-bit dtypes) or the
  whole row count. Mosaic pads the last, partial block with garbage on read
  and drops its out-of-range rows on write, so only the partial sums need a
  row mask (a ``where``, which also discards NaN garbage).

`row_lowering` picks the lowering from ``backend`` and ``interpret``:
``backend=None`` means Mosaic GPU on an NVIDIA GPU of compute capability
>= 9.0 (Triton below that, or on ROCm), Mosaic TPU on a TPU; ``interpret=True``
runs the chosen kernel in its interpreter (the Mosaic GPU interpreter, the
generic one for Triton, the TPU interpreter for Mosaic TPU), and an
interpreter's parameter object (`pltpu.InterpretParams`,
``plgpu.InterpretGPUParams``) selects its backend.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import _checks, _target
from pallas_kernels import _cost

try:  # Triton is deprecated in newer JAX and may be gone from the install.
  from jax.experimental.pallas import triton as pltr
except ImportError:  # pragma: no cover - depends on the installed JAX
  pltr = None

# The row kernels' lowerings (`row_lowering`).
RowLowering = Literal["mosaic_gpu", "triton", "tpu"]
# Values of the row kernels' ``backend=`` knob (``None``: the device default).
BACKENDS = ("mosaic_gpu", "triton", "mosaic_tpu")
_BACKEND_LOWERING = {"mosaic_gpu": "mosaic_gpu", "triton": "triton"}
_BACKEND_LOWERING["mosaic_tpu"] = "tpu"

# Widest normalized row a one-block-per-row kernel handles (see
# `norm_block_heuristic`); wider rows need a column-split kernel.
MAX_FEATURES = 16384
# The Mosaic GPU kernel keeps a block in registers: at most 64 float32 per
# thread per tile in the smallest block (see `norm_block_heuristic`).
MOSAIC_GPU_MAX_FEATURES = 4096
MOSAIC_GPU_BLOCK_ELEMS = 128 * 64
_GPU_DTYPES = ("float32", "bfloat16", "float16")
_TPU_DTYPES = ("float32", "bfloat16")
_GPU_LOWERINGS = ("gpu", "triton", "mosaic_gpu")


def triton_available() -> bool:
  """Whether the installed JAX still has the Pallas Triton lowering."""
  return pltr is not None


def gpu_interpret_params() -> Any:
  """The Mosaic GPU interpreter's parameter class of the installed JAX.

  Public as ``plgpu.InterpretGPUParams`` in newer JAX; older releases (0.10)
  ship the same interpreter under ``jax._src`` only.
  """
  plgpu = importlib.import_module("jax.experimental.pallas.mosaic_gpu")
  cls = getattr(plgpu, "InterpretGPUParams", None)
  if cls is None:
    params = "jax._src.pallas.mosaic_gpu.interpret.params"
    cls = importlib.import_module(params).InterpretGPUParams
  return cls


def row_lowering(
  who: str, interpret: Any, backend: str | None, *arrays: Any
) -> RowLowering:
  """Picks a kernel's lowering from ``backend``, ``interpret`` and the target.

  Compiled kernels follow the devices the program is compiled for
  (`jaxnorm._target.current`: the current mesh, else the shardings of
  ``arrays``, else the default backend), so a program compiled for a
  deviceless H100 or TPU mesh on a CPU host lowers as on the chip. Mosaic GPU
  needs an NVIDIA GPU of compute capability >= 9.0 (ROCm devices report
  none); older NVIDIA GPUs get Triton while the installed JAX has it.

  Args:
    who: caller name for error messages.
    interpret: ``False`` (compile), ``True`` (the chosen kernel's
      interpreter), or an interpreter's parameter object, which implies its
      backend.
    backend: ``"mosaic_gpu"``, ``"triton"``, ``"mosaic_tpu"`` or ``None``
      (the target's default; Mosaic GPU under ``interpret=True``).
    *arrays: the kernel's array arguments (their shardings may name the
      target).

  Returns:
    ``"mosaic_gpu"``, ``"triton"`` or ``"tpu"``.

  Raises:
    ValueError: for an unknown ``backend`` or one that contradicts the
      interpreter object.
    NotImplementedError: for a backend the target or the installed JAX
      lacks (CPU without ``interpret``, Triton after its removal, a GPU
      backend on a TPU and vice versa).
  """
  _checks.check_choice(who, "backend", backend, (None, *BACKENDS))
  implied = None
  if isinstance(interpret, pltpu.InterpretParams):
    implied = "mosaic_tpu"
  elif isinstance(interpret, gpu_interpret_params()):
    implied = "mosaic_gpu"
  if implied is not None and backend not in (None, implied):
    raise ValueError(
      f"{who}: interpret={type(interpret).__name__}(...) runs the {implied} "
      f"kernel, got backend={backend!r}; pass backend={implied!r} or None"
    )
  backend = backend or implied
  if backend == "triton" and not triton_available():
    raise NotImplementedError(
      f"{who}: backend='triton' needs the Pallas Triton lowering, which the "
      f"installed jax {jax.__version__} no longer has; use "
      "backend='mosaic_gpu' (the default on GPU)"
    )
  if interpret:
    return _BACKEND_LOWERING[backend or "mosaic_gpu"]
  target = _target.current(*arrays)
  platform = target.platform
  if platform == "gpu":
    if backend is None:
      if (target.compute_capability or (0, 0)) >= (9, 0):
        return "mosaic_gpu"
      # Pallas-Triton reads a deviceless GPU from the mesh context only.
      seen = target.source != "arguments" or jax.default_backend() == "gpu"
      if triton_available() and seen:
        return "triton"
      raise NotImplementedError(
        f"{who}: no Pallas GPU lowering for device "
        f"{target.device_kind!r}: Mosaic GPU needs an NVIDIA GPU of "
        "compute capability >= 9.0, and Triton needs the installed jax to "
        "have it and the GPU to be named by the current mesh (jax.set_mesh), "
        "not only by the arguments' shardings; use the reference "
        "(implementation='xla')"
      )
    if backend != "mosaic_tpu":
      return _BACKEND_LOWERING[backend]
  elif platform == "tpu" and backend in (None, "mosaic_tpu"):
    return "tpu"
  raise NotImplementedError(
    f"{who}: no compiled Pallas lowering for backend {platform!r}"
    + ("" if backend is None else f" with backend={backend!r}")
    + f" (the target: {target.describe()}); compile under jax.set_mesh of "
    "a GPU or TPU mesh (jaxnorm.aot.topology for one without devices), pass "
    "interpret=True (the Mosaic GPU kernel, or the backend= "
    "kernel) or interpret=pltpu.InterpretParams() (TPU semantics) to run the "
    "kernel in the interpreter, or use the reference (implementation='xla')"
  )


def interpreter(lowering: RowLowering, interpret: Any) -> Any:
  """The ``interpret`` value to pass to Pallas for ``lowering``.

  ``True`` becomes the chosen kernel's interpreter: the Mosaic GPU one
  (``InterpretGPUParams()``) or the TPU one (``pltpu.InterpretParams()``);
  Triton kernels run in the generic interpreter (``True``).
  """
  if interpret is True and lowering == "mosaic_gpu":
    return gpu_interpret_params()()
  if interpret is True and lowering == "tpu":
    return pltpu.InterpretParams()
  return interpret


def check_dtype(who: str, dtype: Any, lowering: str) -> None:
  """Raises `NotImplementedError` for dtypes the lowering does not handle."""
  name = jnp.dtype(dtype).name
  allowed = _GPU_DTYPES if lowering in _GPU_LOWERINGS else _TPU_DTYPES
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


# Mosaic GPU register layout: every thread holds vectors of this many
# elements (16 bytes of float32, the widest cross-warp reduction Mosaic GPU
# emits; 8 bytes of a 16-bit input).
MOSAIC_GPU_VECTOR = 4
_WARPS = 4  # one warpgroup (128 threads) per block
_LANES = 32


def mosaic_gpu_split(features: int) -> tuple[int, int, int, int]:
  """How one warpgroup covers a ``(block_rows, features)`` Mosaic GPU block.

  Returns ``(warp_rows, warp_cols, lane_rows, lane_cols)``: the 4 warps are
  split ``warp_rows x warp_cols`` over rows and columns and each warp's 32
  lanes ``lane_rows x lane_cols``; every lane holds `MOSAIC_GPU_VECTOR`
  consecutive columns, and the base tile ``(warp_rows * lane_rows,
  warp_cols * lane_cols * 4)`` repeats over the block in registers. Lanes go
  along the columns first (32 lanes x 4 elements = 128 contiguous columns
  per warp and row, whole 128-byte lines: coalesced), then warps (wide rows
  use all 4 warps per row, so ``block_rows`` can be small); what is left
  spreads over rows. At least 8 lanes per row (32 columns) are needed: the
  Mosaic GPU of jax 0.12 rejects transfers that do not cover whole 32-byte
  sectors and 128-byte lines.

  Raises:
    ValueError: for ``features`` not a multiple of 32.
  """
  v = MOSAIC_GPU_VECTOR
  if features % (8 * v):
    raise ValueError(
      f"mosaic_gpu_split: features must be a multiple of {8 * v}, got "
      f"features={features}"
    )
  lane_cols = next(n for n in (32, 16, 8) if features % (n * v) == 0)
  warp_cols = next(n for n in (4, 2, 1) if features % (n * lane_cols * v) == 0)
  return _WARPS // warp_cols, warp_cols, _LANES // lane_cols, lane_cols


def _mosaic_gpu_min_rows(features: int) -> int:
  """Smallest legal ``block_rows``: the base tile's rows, and at least 2.

  With a single row per block the column reduction of the partial sums
  fails to lower on jax 0.12 (layout inference), so blocks hold >= 2 rows.
  """
  warp_rows, _, lane_rows, _ = mosaic_gpu_split(features)
  return max(2, warp_rows * lane_rows)


@dataclasses.dataclass(frozen=True)
class RowTiling:
  """Static tiling of a ``(rows, features)`` row-blocked kernel.

  Attributes:
    lowering: ``"mosaic_gpu"``, ``"triton"`` or ``"tpu"``.
    rows: number of independent rows.
    features: normalized width of each row.
    block_rows: rows per grid step.
    block_cols: columns per block: ``next_pow2(features)`` for Triton,
      ``features`` otherwise.
    sublanes: TPU sublane tile of the input dtype (``block_rows`` must be a
      multiple unless it equals ``rows``).
    num_warps: Triton warps per program (Triton only).
  """

  lowering: RowLowering
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
    if self.lowering == "triton":
      for name in ("block_rows", "block_cols"):
        v = getattr(self, name)
        if v & (v - 1):
          raise ValueError(
            f"RowTiling: the triton lowering needs a "
            f"power-of-two {name}, got {name}={v}"
          )
      if self.block_cols < self.features:
        raise ValueError(
          f"RowTiling: block_cols={self.block_cols} must "
          f"cover features={self.features}"
        )
      return
    if self.block_cols != self.features:
      raise ValueError(
        f"RowTiling: the {self.lowering} lowering needs block_cols == "
        f"features, got {self.block_cols} != {self.features}"
      )
    if self.lowering == "mosaic_gpu":
      unit = _mosaic_gpu_min_rows(self.features)
      if self.block_rows % unit:
        raise ValueError(
          f"RowTiling: the mosaic_gpu lowering needs block_rows to be a "
          f"multiple of {unit} for features={self.features} (see "
          f"mosaic_gpu_split), got block_rows={self.block_rows}"
        )
    elif self.block_rows % self.sublanes and self.block_rows != self.rows:
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
_TPU_MAX_ROWS = 512
# Mosaic's default scoped-VMEM limit where the chip is unknown (the
# interpreters, chips missing from `jaxnorm.aot.CHIPS`): v5e's and v5p's,
# the smallest of the supported TPUs.
_DEFAULT_SCOPED_VMEM = 16 << 20
# A TPU tile (one float32 block) takes this fraction of the scoped limit.
_TPU_TILES_PER_SCOPE = 16


def tpu_scoped_vmem(chip: Any) -> int:
  """The default scoped VMEM of a `jaxnorm.aot.Chip` (or of an unknown one)."""
  return getattr(chip, "scoped_vmem_bytes", 0) or _DEFAULT_SCOPED_VMEM


def tpu_vmem_bytes(block_rows: int, features: int, dtype: Any) -> int:
  """VMEM a row kernel's block takes, worst case over the norm kernels.

  The fused add + norm backward streams four ``(block_rows, features)``
  arrays (h, dy, dh in; d out), each double-buffered by the Pallas pipeline
  (8 blocks in the input dtype), and keeps about four float32 temporaries.
  """
  elems = block_rows * features
  return 8 * elems * jnp.dtype(dtype).itemsize + 4 * elems * 4


def norm_block_heuristic(
  who: str,
  lowering: RowLowering,
  rows: int,
  features: int,
  dtype: Any,
  block_rows: int | None = None,
  chip: Any = None,
  *,
  gpu_block_elems: int = MOSAIC_GPU_BLOCK_ELEMS,
) -> RowTiling:
  """Chooses the tile of a row-blocked norm kernel; the one place for sizes.

  Constants:

  * ``MAX_FEATURES = 16384``: one row block holds a whole row, so the row
    must fit on chip with several float32 temporaries. At 16384 the Triton
    kernel keeps 16384 / (32 * 16 warps) = 32 floats per thread per live
    tile (a backward pass holds about 4: x, dy, the product and dx) and the
    TPU tile is 16 rows x 64 KiB = 1 MiB. Wider rows raise
    `NotImplementedError` (a column-split kernel would be needed).
  * Mosaic GPU: one warpgroup (128 threads) per block, the whole block in
    registers, so the smallest legal block (`_mosaic_gpu_min_rows` rows)
    may hold at most ``MOSAIC_GPU_BLOCK_ELEMS = 128 * 64`` elements, 64
    float32 per thread per tile: a backward keeps about 3 tiles live, and
    ptxas (sm_90a, jax 0.12.0.1) gives the RMSNorm backward 216 registers
    and no spill at 2 rows x 4096, but 255 registers and 796 bytes spilled
    at 2 x 8192 (128 per thread). Widths must be multiples of 32
    (`mosaic_gpu_split`); that admits every multiple of 512 up to
    ``MOSAIC_GPU_MAX_FEATURES = 4096`` (2 rows x 4096) and narrower widths
    whose split needs more rows (96: 16 rows x 96), and rejects e.g. 4064
    (16 rows x 4064); wider rows run the reference under
    ``implementation=None``. Kernels whose backward keeps more live values
    pass a smaller ``gpu_block_elems`` (DyT, SeeDNorm: see
    `pallas_kernels.dyt_seed`).
    ``block_rows`` is the power of two nearest below ``_GPU_TILE_ELEMS =
    4096 / features`` (32 float32 per thread per tile, as for Triton),
    raised to the split's row unit (`_mosaic_gpu_min_rows`) and lowered to
    the largest multiple of it that does not exceed ``rows`` (a last,
    partial block is shifted back to end at the last row, see
    `pallas_kernels.mosaic_gpu_rows`).
  * Triton ``_GPU_TILE_ELEMS = 4096`` float32 elements per program: with 4
    warps (128 threads) that is 32 registers per thread per live tile,
    about 128 for the backward's four tiles, under Triton's 255 limit and
    leaving occupancy for latency hiding. ``block_rows = 4096 //
    next_pow2(features)`` clipped to ``[1, _GPU_MAX_ROWS = 64]`` (64 rows is
    enough to amortize the parameter loads) and to ``next_pow2(rows)``.
    ``num_warps = block elements / 1024`` clipped to ``[4, 16]`` so wide rows
    get more threads rather than more registers per thread.
  * TPU: one float32 tile takes 1/16 of the chip's default scoped VMEM
    (``chip``: 1 MiB on v5e and v5p, 2 MiB on v6e; 1 MiB when the chip is
    unknown). The backward streams up to four arrays (fused add: h, dy, dh
    in; d out), double-buffered by the Pallas pipeline (8 tiles in the input
    dtype) plus a few float32 temporaries (`tpu_vmem_bytes`), at most 12/16
    of the scoped limit. ``block_rows`` is rounded down to
    the sublane tile (8 rows for 32-bit, 16 for 16-bit dtypes) and capped
    at ``_TPU_MAX_ROWS = 512`` (larger tiles no longer improve the
    HBM-bound throughput, and a longer grid keeps both v7 TensorCores busy
    under "parallel" semantics). With ``rows <= block_rows`` the single
    block is the whole array, which any row count satisfies. A
    ``block_rows`` override whose `tpu_vmem_bytes` exceed the chip's scoped
    limit is refused before Mosaic sees it; so is a Mosaic GPU override
    whose block exceeds ``MOSAIC_GPU_BLOCK_ELEMS`` (it would spill).

  Args:
    who: caller name for error messages.
    lowering: ``"mosaic_gpu"``, ``"triton"`` or ``"tpu"``.
    rows: number of rows.
    features: row width.
    dtype: input dtype (TPU sublane tile).
    block_rows: user override, validated by `RowTiling`.
    chip: the target's `jaxnorm.aot.Chip` (on-chip limits), or ``None``.
    gpu_block_elems: the largest Mosaic GPU block of this kernel (kernels
      whose backward keeps more tiles or statistics live pass less).

  Returns:
    The `RowTiling`.

  Raises:
    NotImplementedError: for ``features > MAX_FEATURES``, for Mosaic GPU
      widths not a multiple of 32 or whose smallest block is too large, and
      for a ``block_rows`` override that does not fit the chip.
    ValueError: for an invalid ``block_rows`` override.
  """
  if features > MAX_FEATURES:
    raise NotImplementedError(
      f"{who}: kernels hold a whole row per block and support up to "
      f"{MAX_FEATURES} features, got {features}; use the reference "
      "(implementation='xla')"
    )
  sub = _sublanes(dtype)
  if lowering == "mosaic_gpu":
    if (
      features % 32
      or _mosaic_gpu_min_rows(features) * features > gpu_block_elems
    ):
      raise NotImplementedError(
        f"{who}: the mosaic_gpu kernel needs features to be a multiple of 32 "
        f"whose smallest block holds at most {gpu_block_elems} elements "
        f"(every multiple of 512 up to {gpu_block_elems // 2} for this "
        "kernel), "
        f"got features={features}; use the reference "
        "(implementation='xla') or backend='triton'"
      )
    if block_rows is None:
      unit = _mosaic_gpu_min_rows(features)
      # 0 for rows wider than a tile
      fit = min(_GPU_TILE_ELEMS, gpu_block_elems) // features
      target = 1 << max(0, fit.bit_length() - 1)  # power of two <= fit
      block_rows = max(unit, min(target, rows // unit * unit))
    elif block_rows * features > gpu_block_elems:
      raise NotImplementedError(
        f"{who}: block_rows={block_rows} x features={features} puts "
        f"{block_rows * features // 128} float32 per thread per tile in the "
        f"registers of one warpgroup, over the "
        f"{gpu_block_elems // 128} that fit without spilling; pass "
        f"block_rows <= {max(1, gpu_block_elems // features)}"
      )
    return RowTiling("mosaic_gpu", rows, features, block_rows, features, sub)
  if lowering == "triton":
    cols = pl.next_power_of_2(features)
    if block_rows is None:
      block_rows = max(
        1, min(_GPU_TILE_ELEMS // cols, _GPU_MAX_ROWS, pl.next_power_of_2(rows))
      )
    warps = min(16, max(4, block_rows * cols // 1024))
    return RowTiling("triton", rows, features, block_rows, cols, sub, warps)
  scoped = tpu_scoped_vmem(chip)
  if block_rows is None:
    tile = scoped // _TPU_TILES_PER_SCOPE
    fit = tile // (4 * features) // sub * sub
    block_rows = min(max(sub, fit), _TPU_MAX_ROWS)
  else:
    need = tpu_vmem_bytes(min(block_rows, rows), features, dtype)
    if need > scoped:
      name = getattr(chip, "name", "an unknown TPU")
      raise NotImplementedError(
        f"{who}: block_rows={block_rows} x features={features} in "
        f"{jnp.dtype(dtype).name} needs about {need / 2**20:.1f} MiB of VMEM "
        f"(8 double-buffered blocks and 4 float32 temporaries), over the "
        f"{scoped / 2**20:.0f} MiB default scoped limit of {name}; pass a "
        "smaller block_rows or None"
      )
  if block_rows >= rows:
    block_rows = rows
  return RowTiling("tpu", rows, features, block_rows, features, sub)


@dataclasses.dataclass(frozen=True)
class RowOps:
  """Row reductions and broadcasts of one block, as a `RowBody` sees them.

  A per-row statistic lives in "row form": ``(block_rows, 1)`` here, so it
  broadcasts against ``(block_rows, width)`` tiles and ``(1, width)``
  parameter rows implicitly (Triton and Mosaic TPU). The Mosaic GPU
  subclass keeps it ``(block_rows,)`` and broadcasts explicitly into the
  block's register layout.

  Attributes:
    features: true row width (the divisor of `mean`).
    width: block width (``>= features`` on Triton, whose padded columns hold
      zeros).
    colmask: ``(1, width)`` bool, true on real columns, when the block is
      wider than the row; else ``None``.
  """

  features: int
  width: int
  colmask: Any = None

  def sum(self, v: jax.Array) -> jax.Array:
    """Row sums of a tile, in row form."""
    return jnp.sum(v, axis=1, keepdims=True)

  def mean(self, v: jax.Array) -> jax.Array:
    """Row means of a tile, in row form; padded columns must hold zeros."""
    return self.sum(v) * (1.0 / self.features)

  def full(self, stat: jax.Array) -> jax.Array:
    """A row-form statistic, ready to combine with a tile."""
    return stat

  def sqrt(self, stat: jax.Array) -> jax.Array:
    """Square root of a non-negative row-form statistic."""
    return jnp.sqrt(stat)

  def col_ids(self) -> jax.Array:
    """Column indices, broadcastable against a tile."""
    return jax.lax.broadcasted_iota(jnp.int32, (1, self.width), 1)


# A row body maps float32 row tiles and parameter rows (all combinable with
# the tiles elementwise) to output tiles and per-element partial-sum
# contributions, using `RowOps` for every row reduction and broadcast.
RowBody = Callable[
  [Sequence[jax.Array], Sequence[jax.Array], RowOps],
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
  cost_estimate: pl.CostEstimate | None = None,
) -> tuple[list[jax.Array], list[jax.Array]]:
  """Runs ``body`` over row blocks of ``(rows, features)`` arrays.

  The Triton and Mosaic TPU lowerings; Mosaic GPU has the same contract in
  `pallas_kernels.mosaic_gpu_rows.row_call`.

  Args:
    body: the per-block math (`RowBody`); all its inputs are float32.
    tiling: the `RowTiling` (lowering ``"triton"`` or ``"tpu"``).
    row_inputs: arrays of shape ``(rows, features)``.
    params: arrays of shape ``(features,)`` (loaded once per block).
    out_dtypes: dtypes of the ``(rows, features)`` outputs.
    num_partials: how many per-element contributions ``body`` returns to be
      summed over all rows (parameter gradients).
    interpret: forwarded to `pl.pallas_call` (see `interpreter`).
    name: kernel name.
    cost_estimate: what XLA is told the kernel costs (TPU cost analysis
      counts a kernel's flops from it alone); ``None``:
      `pallas_kernels._cost.body_cost` of ``body`` on one block.

  Returns:
    ``(outputs, sums)``: the row outputs and, for each partial, its float32
    sum over rows, shape ``(features,)``.
  """
  t = tiling
  rows, feats, br, bc = t.rows, t.features, t.block_rows, t.block_cols
  grid = (t.num_blocks,)
  n_in, n_p, n_out = len(row_inputs), len(params), len(out_dtypes)
  gpu = t.lowering == "triton"

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
        pltr.load(r, mask=mask, other=0.0).astype(jnp.float32) for r in in_refs
      ]
      ps = [
        pltr.load(p, mask=cmask, other=0.0).astype(jnp.float32) for p in p_refs
      ]
      ops = RowOps(feats, bc, cmask if bc != feats else None)
    else:
      xs = [r[...].astype(jnp.float32) for r in in_refs]
      ps = [p[...].astype(jnp.float32) for p in p_refs]
      ops = RowOps(feats, bc)
    outs, contribs = body(xs, ps, ops)
    for ref, val in zip(out_refs, outs, strict=True):
      if gpu:
        pltr.store(ref, val.astype(ref.dtype), mask=mask)
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
    compiler_params = pltr.CompilerParams(num_warps=t.num_warps, num_stages=1)
  elif isinstance(interpret, pltpu.InterpretParams):
    # The TPU interpreter of jax 0.10 does not skip vmapped grid dims when it
    # reads dimension_semantics (the compiler does), so under vmap a
    # ("parallel",) tuple is one entry short; the semantics only let the
    # compiler split the grid across TensorCores, so leave them out here.
    compiler_params = pltpu.CompilerParams()
  else:
    compiler_params = pltpu.CompilerParams(dimension_semantics=("parallel",))
  if cost_estimate is None:

    def traced(xs, ps):
      col_ids = jax.lax.broadcasted_iota(jnp.int32, (1, bc), 1)
      colmask = col_ids < feats if gpu and bc != feats else None
      return body(xs, ps, RowOps(feats, bc, colmask))

    jaxpr = jax.make_jaxpr(traced)(
      [jax.ShapeDtypeStruct((br, bc), jnp.float32)] * n_in,
      [jax.ShapeDtypeStruct((1, bc), jnp.float32)] * n_p,
    )
    cost_estimate = _cost.body_cost(
      jaxpr, grid[0], br * bc, num_partials, [*row_inputs, *params], out_shape
    )
  results = pl.pallas_call(
    kernel,
    out_shape=out_shape,
    grid=grid,
    in_specs=[row_spec] * n_in + [param_spec] * n_p,
    out_specs=[row_spec] * n_out + [part_spec] * num_partials,
    compiler_params=compiler_params,
    interpret=interpret,
    name=name,
    cost_estimate=cost_estimate,
  )(*row_inputs, *[p.reshape(1, feats) for p in params])
  outs = list(results[:n_out])
  sums = [jnp.sum(r[:, 0, :feats], axis=0) for r in results[n_out:]]
  return outs, sums


def flatten_rows(x: jax.Array, num_axes: int) -> tuple[int, int]:
  """``(rows, features)`` of ``x`` with its last ``num_axes`` axes as row."""
  feats = math.prod(x.shape[x.ndim - num_axes :])
  rows = math.prod(x.shape[: x.ndim - num_axes])
  return rows, feats
