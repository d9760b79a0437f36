r"""What the Mosaic GPU attention kernels (flash and linear) share.

Kernels for Hopper (``sm_90``) and newer, written against
`jax.experimental.pallas.mosaic_gpu` (``plgpu``): flash attention forward
and backward (`pallas_kernels.mosaic_gpu_flash`: `flash_forward`,
`flash_backward`), chunked causal linear attention forward
(`pallas_kernels.mosaic_gpu_linear`: `linear_forward`; its backward is the
VJP of the jnp reference, recomputed). `pallas_kernels.attention` and
`pallas_kernels.linear_attention` choose them and own the checks, the
padding and the VJPs. This module holds what they share: the constraints
of the lowering and their checks (`check_supported`, `check_smem`,
`check_interpreter`), the shared-memory tile and accumulator helpers, and
the kernel call with its cost estimate (`_call`, `_cost`).

Structure (as in FlashAttention-3 and JAX's ``attention_mgpu`` example, but
one warpgroup per block and no warp specialization): a CUDA block of one
warpgroup (128 threads) owns one (batch, head, query block) for the flash
forward and ``dq``, one (batch, query head, key block) for ``dk``/``dv``,
one (batch, head) for linear attention. Operand tiles reach
shared memory by TMA copies (`plgpu.copy_gmem_to_smem`) straight from the
``(B, T, heads, H)`` arrays (the head is a strided TMA box, so the wrapper
never transposes), each signalling its own barrier. The key/value (or
chunk) stream is double-buffered: while step ``j`` computes on slot
``j % 2``, the copies of step ``j + 1`` are in flight, and slot ``j % 2`` is
refilled with step ``j + 2`` once its matmuls have completed. Matmuls are
warpgroup MMAs (`plgpu.wgmma`) from 128-byte-swizzled shared memory into
float32 accumulators in registers (the ``WGMMA`` layout). The probabilities
(or masked chunk scores) are stored to shared memory in the input dtype and
feed the second matmul from there: the Mosaic GPU interpreter takes
shared-memory operands only, and one body serves both (a register operand,
as in FlashAttention-3, would save that round trip on hardware). Compiled,
running sums accumulate in place (the wgmma adds into the carried
accumulator through `pl.run_state`, so one accumulator, not two, is live
across the matmul); the interpreter does not run accumulator writes, so
there they add a fresh product (`_accumulate`). The flash backward kernels
run on tiles of their own, sized to the register file
(`mosaic_gpu_flash.flash_backward_blocks`). Outputs leave through shared
memory by a TMA store.

Constraints of this lowering, raised as `NotImplementedError` (dispatch then
falls back to XLA): operands in bfloat16 or float16 (wgmma; float32 inputs
are refused rather than silently rounded), head dims multiples of 64 up to
256 (one 128-byte swizzle row per 64 half-precision elements), blocks of 64
or 128 rows, tiles within `SMEM_BUDGET` of shared memory. Each kernel's
module says how it treats padding.

Interpreting: ``interpret=InterpretGPUParams()`` runs these kernels in the
Mosaic GPU interpreter where it implements every primitive they use (the
layout casts of the register tiles: jax >= 0.12); older interpreters raise
`NotImplementedError` naming the gap. Cross-lowering (`jax.export` for
``"cuda"``) checks the Mosaic GPU lowering on every supported JAX.

References:
  Shah et al., *FlashAttention-3: Fast and Accurate Attention with Asynchrony
  and Low-precision*, arXiv:2407.08608 (2024); Dao, *FlashAttention-2*,
  arXiv:2307.08691 (2023).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import mosaic_gpu_rows

# Operand dtypes of wgmma this lowering accepts.
DTYPES = ("bfloat16", "float16")
# Head dims: multiples of one 128-byte swizzle row of 16-bit elements, and
# at most 256 (the float32 accumulator of a 64-row block then holds 128
# registers per thread).
HEAD_DIM_UNIT = 64
MAX_HEAD_DIM = 256
# Legal block sizes (wgmma M is 64 per warpgroup; N and K multiples of 64).
BLOCKS = (64, 128)
_SWIZZLE_BYTES = 128
# Shared memory a block may use: an H100/H200 block gets up to 227 KiB;
# leave room for the barriers and the allocator's alignment padding.
SMEM_BUDGET = 200 * 1024


def check_smem(who: str, nbytes: int, blocks: str) -> None:
  """Raises `NotImplementedError` when a kernel's tiles exceed the budget."""
  if nbytes > SMEM_BUDGET:
    raise NotImplementedError(
      f"{who}: the mosaic_gpu kernel's shared-memory tiles ({blocks}) take "
      f"{nbytes} bytes, over the budget of {SMEM_BUDGET}; use smaller blocks "
      "or head dims, or the reference (implementation='xla')"
    )


def check_supported(who: str, dtype: Any, dims: dict[str, int]) -> None:
  """Raises `NotImplementedError` for operands this lowering cannot take.

  Args:
    who: caller name for error messages.
    dtype: the q/k/v dtype.
    dims: named head dims (``{"head_dim": 64, ...}``).
  """
  name = jnp.dtype(dtype).name
  if name not in DTYPES:
    raise NotImplementedError(
      f"{who}: the mosaic_gpu kernel multiplies {DTYPES} operands (wgmma), "
      f"got dtype={name}; cast the inputs, use backend='triton' where the "
      "installed jax has it, or the reference (implementation='xla')"
    )
  for what, d in dims.items():
    if d % HEAD_DIM_UNIT or d > MAX_HEAD_DIM:
      raise NotImplementedError(
        f"{who}: the mosaic_gpu kernel needs {what} to be a multiple of "
        f"{HEAD_DIM_UNIT} up to {MAX_HEAD_DIM}, got {what}={d}; use the "
        "reference (implementation='xla')"
      )


def check_interpreter(who: str, interpret: Any) -> None:
  """Raises `NotImplementedError` when the interpreter lacks layout casts."""
  if interpret and not mosaic_gpu_rows._INTERPRETER_RUNS_LAYOUTS:
    raise NotImplementedError(
      f"{who}: the Mosaic GPU interpreter of jax {jax.__version__} does not "
      "run the layout casts of the mosaic_gpu attention kernels (jax >= 0.12 "
      "does); cross-lower with jax.export, or interpret another backend"
    )


def _smem(shape: tuple[int, ...], dtype: Any) -> Any:
  """A 128-byte-swizzled shared-memory tile, as wgmma operands need."""
  cols = _SWIZZLE_BYTES // jnp.dtype(dtype).itemsize
  return plgpu.SMEM(
    shape,
    dtype,
    transforms=(
      plgpu.TilingTransform((8, cols)),
      plgpu.SwizzleTransform(_SWIZZLE_BYTES),
    ),
  )


def _rows_of(vec: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """A per-row ``(rows,)`` vector broadcast over a ``(rows, cols)`` tile."""
  return jax.lax.broadcast_in_dim(vec, shape, (0,))


def _fill(shape: tuple[int, ...], value: float) -> jax.Array:
  """A float32 constant in the accumulator layout (or its row reduction)."""
  layout = (
    plgpu.Layout.WGMMA if len(shape) == 2 else plgpu.Layout.WGMMA.reduce(1)
  )
  return plgpu.layout_cast(jnp.full(shape, value, jnp.float32), layout)


def _iota(shape: tuple[int, int], dim: int) -> jax.Array:
  """Row (0) or column (1) indices of an accumulator tile."""
  return plgpu.layout_cast(
    jax.lax.broadcasted_iota(jnp.int32, shape, dim), plgpu.Layout.WGMMA
  )


def _matmul(shape: tuple[int, int], a: Any, b: Any) -> jax.Array:
  """``a @ b`` (shared-memory operands) into a fresh float32 accumulator."""

  def run(acc):
    plgpu.wgmma(acc, a, b)
    return acc[...]

  return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _accumulate(acc: jax.Array, a: Any, b: Any, interpret: Any) -> jax.Array:
  """``acc + a @ b`` for a running float32 accumulator.

  Compiled, the wgmma accumulates into ``acc``'s registers in place
  (`pl.run_state` on ``plgpu.ACC.init``): a fresh product would hold a
  second accumulator of ``acc``'s size live across the matmul, which is
  what made ptxas spill the ``dk``/``dv`` kernel (head dim 128: dk, dv and
  the product, 192 registers of tiles). The Mosaic GPU interpreter does not
  run accumulator writes, so there the product is fresh and added; the
  two agree up to float32 rounding of the sum.
  """
  if interpret:
    return acc + _matmul(acc.shape, a, b)

  def run(acc_ref):
    plgpu.wgmma(acc_ref, a, b)

  return pl.run_state(run)(plgpu.ACC.init(acc))


def _call(kernel, out_type, args, grid, names, scratch, interpret, name, cost):
  kernel.__name__ = name
  return plgpu.kernel(
    kernel,
    out_type=out_type,
    grid=grid,
    grid_names=names,
    scratch_types=scratch,
    compiler_params=plgpu.CompilerParams(),
    interpret=interpret or None,
    # jax 0.10's plgpu.kernel takes no cost estimate.
    **({"cost_estimate": cost} if mosaic_gpu_rows._KERNEL_TAKES_COST else {}),
  )(*args)


def _cost(
  flops: int, transcendentals: int, args: list[Any], out_type: Any
) -> pl.CostEstimate:
  """A kernel's `pl.CostEstimate`, so that XLA's cost analysis counts it.

  ``bytes_accessed`` reads each input once and writes each output once
  (re-reads of the streamed tiles hit L2 and are not counted).
  """
  leaves = jax.tree.leaves((args, out_type))
  nbytes = sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)
  return pl.CostEstimate(
    flops=int(flops),
    transcendentals=int(transcendentals),
    bytes_accessed=int(nbytes),
  )


def _row_vector(ref: Any) -> jax.Array:
  """A float32 ``(rows,)`` slice of global memory, one value per tile row."""
  return mosaic_gpu_rows._load(ref, plgpu.Layout.WGMMA.reduce(1))
