r"""The Mosaic GPU lowering of the attention kernels (flash and linear).

Kernels for Hopper (``sm_90``) and newer, written against
`jax.experimental.pallas.mosaic_gpu` (``plgpu``): flash attention forward
and backward (`flash_forward`, `flash_backward`), chunked causal linear
attention forward (`linear_forward`; its backward is the VJP of the jnp
reference, recomputed). `pallas_kernels.attention` and
`pallas_kernels.linear_attention` choose them and own the checks, the
padding and the VJPs.

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
as in FlashAttention-3, would save that round trip on hardware). Running
sums add fresh products in registers for the same reason (the interpreter
does not run accumulation in place through `pl.run_state`). Outputs leave
through shared memory by a TMA store.

Constraints of this lowering, raised as `NotImplementedError` (dispatch then
falls back to XLA): operands in bfloat16 or float16 (wgmma; float32 inputs
are refused rather than silently rounded), head dims multiples of 64 up to
256 (one 128-byte swizzle row per 64 half-precision elements), blocks of 64
or 128 rows, tiles within `SMEM_BUDGET` of shared memory. Padded query rows
are computed and sliced off; padded keys are excluded exactly (logit
``-inf``, probability 0); padded linear-attention positions are zero after
the feature map and add nothing.

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

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxnorm.attention import _core as attention_core
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
_NEG = attention_core.large_negative()
# Shared memory a block may use: an H100/H200 block gets up to 227 KiB;
# leave room for the barriers and the allocator's alignment padding.
SMEM_BUDGET = 200 * 1024


def flash_smem_bytes(block_q: int, block_k: int, h: int, hv: int, size: int):
  """Shared memory of `flash_forward`: q, p and o tiles, two k/v slots."""
  return size * (block_q * (h + block_k + hv) + 2 * block_k * (h + hv))


def linear_smem_bytes(chunk: int, f: int, e: int, size: int) -> int:
  """Shared memory of `linear_forward`.

  Two q/k/v slots, the masked scores, the state and normalizer operands, the
  selector and the output tile.
  """
  sel = HEAD_DIM_UNIT
  return size * (
    2 * chunk * (2 * f + e) + chunk * chunk + f * (e + sel) + chunk * (sel + e)
  )


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


def _call(kernel, out_type, args, grid, names, scratch, interpret, name):
  kernel.__name__ = name
  return plgpu.kernel(
    kernel,
    out_type=out_type,
    grid=grid,
    grid_names=names,
    scratch_types=scratch,
    compiler_params=plgpu.CompilerParams(),
    interpret=interpret or None,
  )(*args)


def _scores(cfg, s, mask_ref, bi, ni, q0, k0):
  """Masked logits of one ``(block_q, block_k)`` tile.

  Returns ``(s, allowed, valid)``: ``s`` with disallowed logits set to the
  reference's large finite negative; ``allowed`` the mask (``None`` without
  one); ``valid`` the real (unpadded) keys (``None`` without padding).
  """
  shape = s.shape
  allowed = valid = None
  cols = k0 + _iota(shape, 1)
  if cfg.causal:
    allowed = q0 + _iota(shape, 0) >= cols
  if cfg.has_mask:
    tile = mask_ref.at[
      bi if cfg.mask_b else 0,
      ni if cfg.mask_n else 0,
      pl.ds(q0, shape[0]),
      pl.ds(k0, shape[1]),
    ]
    given = mosaic_gpu_rows._load(tile, plgpu.Layout.WGMMA) != 0
    allowed = given if allowed is None else allowed & given
  if allowed is not None:
    s = jnp.where(allowed, s, _NEG)
  if cfg.padded_keys:
    valid = cols < cfg.kv_len
  return s, allowed, valid


def _row_vector(ref: Any) -> jax.Array:
  """A float32 ``(rows,)`` slice of global memory, one value per tile row."""
  return mosaic_gpu_rows._load(ref, plgpu.Layout.WGMMA.reduce(1))


@dataclasses.dataclass(frozen=True)
class FlashConfig:
  """Static description of one flash forward call.

  Attributes:
    block_q: query rows per block (64 or 128, as validated by
      `pallas_kernels.attention.AttentionTiling`).
    block_k: keys per step (64 or 128).
    scale: logit scale.
    causal: lower-triangular mask.
    stop_at_diagonal: whether causal key steps above the diagonal are
      skipped (`pallas_kernels.attention` decides).
    kv_len: true key length (keys at or beyond it are padding).
    group: query heads per key head (GQA).
    mask_b: the int32 mask varies over batch.
    mask_n: the int32 mask varies over heads.
    has_mask: an int32 mask ``(Bm, Nm, Tp, Sp)`` is passed (non-zero
      attends).
    has_sink: per-head sink logits, passed as ``(N, block_q)`` float32.
    padded_keys: the padded key length exceeds ``kv_len``.
  """

  block_q: int
  block_k: int
  scale: float
  causal: bool
  stop_at_diagonal: bool
  kv_len: int
  group: int
  mask_b: bool
  mask_n: bool
  has_mask: bool
  has_sink: bool
  padded_keys: bool


def flash_forward(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array | None,
  sink: jax.Array | None,
  cfg: FlashConfig,
  interpret: Any,
) -> jax.Array:
  """Flash attention forward on Mosaic GPU.

  Args:
    q: ``(B, Tp, N, H)``, ``Tp`` a multiple of ``cfg.block_q``.
    k: ``(B, Sp, K, H)``, ``Sp`` a multiple of ``cfg.block_k``.
    v: ``(B, Sp, K, Hv)``.
    mask: int32 ``(Bm, Nm, Tp, Sp)`` or ``None``.
    sink: float32 ``(N, block_q)`` (each head's logit repeated) or ``None``.
    cfg: the `FlashConfig`.
    interpret: ``False`` or an ``InterpretGPUParams``.

  Returns:
    ``(out, m, l)``: ``(B, Tp, N, Hv)`` in ``q.dtype`` and the float32
    softmax statistics ``(B, N, Tp)`` (row max including the sink, and the
    normalizer relative to it) that `flash_backward` takes.
  """
  b, tp, n, h = q.shape
  sp, hv = k.shape[1], v.shape[-1]
  bq, bk, dtype = cfg.block_q, cfg.block_k, q.dtype
  num_k = sp // bk

  def kernel(q_ref, k_ref, v_ref, *refs):
    refs = list(refs)
    mask_ref = refs.pop(0) if cfg.has_mask else None
    sink_ref = refs.pop(0) if cfg.has_sink else None
    o_ref, m_ref, l_ref, q_smem, k_smem, v_smem, p_smem, o_smem = refs[:8]
    m_smem, l_smem, q_bar, k_bar, v_bar = refs[8:]
    bi = jax.lax.axis_index("batch")
    ni = jax.lax.axis_index("heads")
    qi = jax.lax.axis_index("q")
    kh = jax.lax.div(ni, jnp.int32(cfg.group))
    q0 = qi * bq
    stop = num_k
    if cfg.stop_at_diagonal:
      stop = jnp.minimum(num_k, jax.lax.div(q0 + bq + bk - 1, jnp.int32(bk)))

    def fetch(j, slot):
      keys = (bi, pl.ds(j * bk, bk), kh)
      plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[slot], k_bar.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[slot], v_bar.at[slot])

    plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(q0, bq), ni], q_smem, q_bar)
    fetch(0, 0)

    if num_k > 1:

      @pl.when(stop > 1)
      def _():
        fetch(1, 1)

    plgpu.barrier_wait(q_bar)
    shape = (bq, bk)

    def step(j, carry):
      m, norm, acc = carry
      slot = jax.lax.rem(j, 2)
      plgpu.barrier_wait(k_bar.at[slot])
      s = _matmul(shape, q_smem, k_smem.at[slot].T) * cfg.scale
      s, _, valid = _scores(cfg, s, mask_ref, bi, ni, q0, j * bk)
      if valid is not None:
        s = jnp.where(valid, s, -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(s, axis=1))
      corr = jnp.exp(m - m_new)
      p = jnp.exp(s - _rows_of(m_new, shape))
      norm = norm * corr + jnp.sum(p, axis=1)
      p_smem[...] = p.astype(dtype)
      plgpu.commit_smem()
      plgpu.barrier_wait(v_bar.at[slot])
      pv = _matmul(acc.shape, p_smem, v_smem.at[slot])
      acc = acc * _rows_of(corr, acc.shape) + pv

      @pl.when(j + 2 < stop)
      def _():
        fetch(j + 2, slot)

      return m_new, norm, acc

    if cfg.has_sink:
      m0, l0 = _row_vector(sink_ref.at[ni]), _fill((bq,), 1.0)
    else:
      m0, l0 = _fill((bq,), -jnp.inf), _fill((bq,), 0.0)
    m, norm, acc = jax.lax.fori_loop(
      0, stop, step, (m0, l0, _fill((bq, hv), 0.0))
    )
    o_smem[...] = (acc / _rows_of(norm, acc.shape)).astype(dtype)
    # m and l, not m + log(l): see `pallas_kernels.attention._fwd_kernel`.
    m_smem[...] = m
    l_smem[...] = norm
    plgpu.commit_smem()
    rows = pl.ds(q0, bq)
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bi, rows, ni])
    plgpu.copy_smem_to_gmem(m_smem, m_ref.at[bi, ni, rows])
    plgpu.copy_smem_to_gmem(l_smem, l_ref.at[bi, ni, rows])
    plgpu.wait_smem_to_gmem(0)

  args = [q, k, v]
  if cfg.has_mask:
    args.append(mask)
  if cfg.has_sink:
    args.append(sink)
  scratch = [
    _smem((bq, h), dtype),
    _smem((2, bk, h), dtype),
    _smem((2, bk, hv), dtype),
    _smem((bq, bk), dtype),
    _smem((bq, hv), dtype),
    plgpu.SMEM((bq,), jnp.float32),
    plgpu.SMEM((bq,), jnp.float32),
    plgpu.Barrier(num_barriers=1),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
  ]
  stats = jax.ShapeDtypeStruct((b, n, tp), jnp.float32)
  return _call(
    kernel,
    (jax.ShapeDtypeStruct((b, tp, n, hv), dtype), stats, stats),
    args,
    (b, n, tp // bq),
    ("batch", "heads", "q"),
    scratch,
    interpret,
    "jaxnorm_flash_attention_fwd_mgpu",
  )


def flash_bwd_smem_bytes(block_q: int, block_k: int, h: int, hv: int, size):
  """Shared memory of the larger of the two `flash_backward` kernels.

  ``dq``: the q and do tiles, two k/v slots, the ds tile. ``dk``/``dv``: the
  k and v tiles (reused for dk and dv), two q/do slots, the p and ds tiles.
  """
  width = h + hv
  dq = block_q * width + 2 * block_k * width + block_q * block_k
  dkv = block_k * width + 2 * block_q * width + 2 * block_q * block_k
  return size * max(dq, dkv)


def flash_backward(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  mask: jax.Array | None,
  m: jax.Array,
  linv: jax.Array,
  delta: jax.Array,
  do: jax.Array,
  cfg: FlashConfig,
  interpret: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  r"""Flash attention backward on Mosaic GPU (FlashAttention-2 recompute).

  With :math:`P = e^{s - m} / l` recomputed per tile from the forward's
  statistics and :math:`D = \mathrm{rowsum}(dO \circ O)` (``delta``):

  .. math:: dS = P \circ (dO\, V^T - D),\quad dQ = c\, dS\, K,\quad
     dK = c\, dS^T Q,\quad dV = P^T dO

  (:math:`c` the scale; masked logits are constants, so :math:`dS = 0`
  there). One kernel per query block accumulates ``dq`` over the key
  blocks, one per key block and query head accumulates ``dk``/``dv`` over
  the query blocks (their GQA group sum is left to the caller). The
  transposed products take the probability tile from shared memory as a
  transposed operand.

  Args:
    q: ``(B, Tp, N, H)``, padded as for `flash_forward` (``do`` alike).
    k: ``(B, Sp, K, H)``.
    v: ``(B, Sp, K, Hv)``.
    mask: int32 ``(Bm, Nm, Tp, Sp)`` or ``None``.
    m: row maxima ``(B, N, Tp)`` from `flash_forward`.
    linv: inverse normalizers ``1 / l``, ``(B, N, Tp)``.
    delta: ``rowsum(do * out)`` in float32, ``(B, N, Tp)``.
    do: output cotangent ``(B, Tp, N, Hv)``.
    cfg: the forward's `FlashConfig`.
    interpret: ``False`` or an ``InterpretGPUParams``.

  Returns:
    ``(dq, dk, dv)``: ``(B, Tp, N, H)``, and ``(B, Sp, N, H)``,
    ``(B, Sp, N, Hv)`` per query head.
  """
  b, tp, n, h = q.shape
  sp, hv = k.shape[1], v.shape[-1]
  bq, bk, dtype = cfg.block_q, cfg.block_k, q.dtype
  num_q, num_k = tp // bq, sp // bk
  shape = (bq, bk)

  def probs(s, stats, bi, ni, q0, k0, mask_ref):
    """P and the mask of one tile from its raw scores."""
    m_i, linv_i = stats
    s, allowed, valid = _scores(cfg, s * cfg.scale, mask_ref, bi, ni, q0, k0)
    p = jnp.exp(s - _rows_of(m_i, shape)) * _rows_of(linv_i, shape)
    if valid is not None:
      p = jnp.where(valid, p, 0.0)
    return p, allowed

  def dscores(p, dp, delta_i, allowed):
    ds = p * (dp - _rows_of(delta_i, shape))
    return ds if allowed is None else jnp.where(allowed, ds, 0.0)

  def dq_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, d_ref, *refs):
    refs = list(refs)
    mask_ref = refs.pop(0) if cfg.has_mask else None
    dq_ref, q_smem, do_smem, k_smem, v_smem, ds_smem = refs[:6]
    q_bar, k_bar, v_bar = refs[6:]
    bi = jax.lax.axis_index("batch")
    ni = jax.lax.axis_index("heads")
    q0 = jax.lax.axis_index("q") * bq
    kh = jax.lax.div(ni, jnp.int32(cfg.group))
    stop = num_k
    if cfg.stop_at_diagonal:
      stop = jnp.minimum(num_k, jax.lax.div(q0 + bq + bk - 1, jnp.int32(bk)))
    rows = pl.ds(q0, bq)

    def fetch(j, slot):
      keys = (bi, pl.ds(j * bk, bk), kh)
      plgpu.copy_gmem_to_smem(k_ref.at[keys], k_smem.at[slot], k_bar.at[slot])
      plgpu.copy_gmem_to_smem(v_ref.at[keys], v_smem.at[slot], v_bar.at[slot])

    plgpu.copy_gmem_to_smem(q_ref.at[bi, rows, ni], q_smem, q_bar.at[0])
    plgpu.copy_gmem_to_smem(do_ref.at[bi, rows, ni], do_smem, q_bar.at[1])
    fetch(0, 0)
    if num_k > 1:

      @pl.when(stop > 1)
      def _():
        fetch(1, 1)

    stats = (
      _row_vector(m_ref.at[bi, ni, rows]),
      _row_vector(l_ref.at[bi, ni, rows]),
    )
    delta_i = _row_vector(d_ref.at[bi, ni, rows])
    plgpu.barrier_wait(q_bar.at[0])
    plgpu.barrier_wait(q_bar.at[1])

    def step(j, dq):
      slot = jax.lax.rem(j, 2)
      plgpu.barrier_wait(k_bar.at[slot])
      s = _matmul(shape, q_smem, k_smem.at[slot].T)
      p, allowed = probs(s, stats, bi, ni, q0, j * bk, mask_ref)
      plgpu.barrier_wait(v_bar.at[slot])
      dp = _matmul(shape, do_smem, v_smem.at[slot].T)
      ds_smem[...] = dscores(p, dp, delta_i, allowed).astype(dtype)
      plgpu.commit_smem()
      dq = dq + _matmul((bq, h), ds_smem, k_smem.at[slot])

      @pl.when(j + 2 < stop)
      def _():
        fetch(j + 2, slot)

      return dq

    dq = jax.lax.fori_loop(0, stop, step, _fill((bq, h), 0.0))
    q_smem[...] = (dq * cfg.scale).astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[bi, rows, ni])
    plgpu.wait_smem_to_gmem(0)

  def dkv_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, d_ref, *refs):
    refs = list(refs)
    mask_ref = refs.pop(0) if cfg.has_mask else None
    dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem = refs[:8]
    kv_bar, q_bar, do_bar = refs[8:]
    bi = jax.lax.axis_index("batch")
    ni = jax.lax.axis_index("heads")
    k0 = jax.lax.axis_index("k") * bk
    kh = jax.lax.div(ni, jnp.int32(cfg.group))
    keys = pl.ds(k0, bk)
    start = jax.lax.div(k0, jnp.int32(bq)) if cfg.stop_at_diagonal else 0

    def fetch(i, slot):
      rows = (bi, pl.ds(i * bq, bq), ni)
      plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem.at[slot], q_bar.at[slot])
      plgpu.copy_gmem_to_smem(
        do_ref.at[rows], do_smem.at[slot], do_bar.at[slot]
      )

    plgpu.copy_gmem_to_smem(k_ref.at[bi, keys, kh], k_smem, kv_bar.at[0])
    plgpu.copy_gmem_to_smem(v_ref.at[bi, keys, kh], v_smem, kv_bar.at[1])
    fetch(start, 0)

    @pl.when(start + 1 < num_q)
    def _():
      fetch(start + 1, 1)

    plgpu.barrier_wait(kv_bar.at[0])
    plgpu.barrier_wait(kv_bar.at[1])

    def step(i, carry):
      dk, dv = carry
      slot = jax.lax.rem(i - start, 2)
      q0 = i * bq
      rows = pl.ds(q0, bq)
      stats = (
        _row_vector(m_ref.at[bi, ni, rows]),
        _row_vector(l_ref.at[bi, ni, rows]),
      )
      delta_i = _row_vector(d_ref.at[bi, ni, rows])
      plgpu.barrier_wait(q_bar.at[slot])
      s = _matmul(shape, q_smem.at[slot], k_smem.T)
      p, allowed = probs(s, stats, bi, ni, q0, k0, mask_ref)
      p_smem[...] = p.astype(dtype)
      plgpu.barrier_wait(do_bar.at[slot])
      dp = _matmul(shape, do_smem.at[slot], v_smem.T)
      ds_smem[...] = dscores(p, dp, delta_i, allowed).astype(dtype)
      plgpu.commit_smem()
      dv = dv + _matmul((bk, hv), p_smem.T, do_smem.at[slot])
      dk = dk + _matmul((bk, h), ds_smem.T, q_smem.at[slot])

      @pl.when(i + 2 < num_q)
      def _():
        fetch(i + 2, slot)

      return dk, dv

    dk, dv = jax.lax.fori_loop(
      start, num_q, step, (_fill((bk, h), 0.0), _fill((bk, hv), 0.0))
    )
    k_smem[...] = (dk * cfg.scale).astype(dtype)
    v_smem[...] = dv.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[bi, keys, ni])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[bi, keys, ni])
    plgpu.wait_smem_to_gmem(0)

  args = [q, k, v, do, m, linv, delta] + ([mask] if cfg.has_mask else [])
  dq = _call(
    dq_kernel,
    jax.ShapeDtypeStruct((b, tp, n, h), dtype),
    args,
    (b, n, num_q),
    ("batch", "heads", "q"),
    [
      _smem((bq, h), dtype),
      _smem((bq, hv), dtype),
      _smem((2, bk, h), dtype),
      _smem((2, bk, hv), dtype),
      _smem(shape, dtype),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
    ],
    interpret,
    "jaxnorm_flash_attention_dq_mgpu",
  )
  dk, dv = _call(
    dkv_kernel,
    (
      jax.ShapeDtypeStruct((b, sp, n, h), dtype),
      jax.ShapeDtypeStruct((b, sp, n, hv), dtype),
    ),
    args,
    (b, n, num_k),
    ("batch", "heads", "k"),
    [
      _smem((bk, h), dtype),
      _smem((bk, hv), dtype),
      _smem((2, bq, h), dtype),
      _smem((2, bq, hv), dtype),
      _smem(shape, dtype),
      _smem(shape, dtype),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
    ],
    interpret,
    "jaxnorm_flash_attention_dkv_mgpu",
  )
  return dq, dk, dv


def linear_forward(
  fq: jax.Array,
  fkt: jax.Array,
  v: jax.Array,
  *,
  chunk: int,
  group: int,
  normalize: bool,
  eps: float,
  interpret: Any,
) -> jax.Array:
  r"""Chunked causal linear attention forward on Mosaic GPU.

  Per chunk :math:`c` of one (batch, head), with the state
  :math:`S = \sum_{j < c} \phi(k_j) v_j^T` (float32, registers):

  .. math::
    W = \mathrm{tril}(\phi(Q_c) \phi(K_c)^T),\quad
    \mathrm{num} = W V_c + \phi(Q_c) S,\quad
    \mathrm{den} = \mathrm{rowsum}(W) + \phi(Q_c) z

  The normalizer :math:`z = \sum_j \phi(k_j)` is accumulated as the first
  column of a ``(F, 64)`` matrix :math:`Z \mathrel{+}= \phi(K_c)^T E` with
  :math:`E` a ``(chunk, 64)`` selector (ones in column 0), so that it rides
  the same warpgroup MMAs; :math:`\phi(Q_c) z` is the row sum of
  :math:`\phi(Q_c) Z`.

  Deviation: the matmul operands are 16-bit, so ``W``, ``S`` and ``Z`` are
  rounded to the input dtype where they enter a product (relative error
  about 2^-9 for bfloat16); sums stay float32.

  Args:
    fq: feature-mapped queries ``(B, Tp, N, F)``.
    fkt: feature-mapped keys, transposed, ``(B, K, F, Tp)``.
    v: values ``(B, Tp, K, E)``.
    chunk: chunk length (64 or 128), dividing ``Tp``.
    group: query heads per key head.
    normalize: divide by the running normalizer.
    eps: denominator epsilon.
    interpret: ``False`` or an ``InterpretGPUParams``.

  Returns:
    ``(B, Tp, N, E)`` in ``v.dtype``.
  """
  if chunk not in BLOCKS:
    raise ValueError(
      f"linear_forward: the mosaic_gpu lowering needs chunk in {BLOCKS}, got "
      f"chunk={chunk}"
    )
  b, tp, n, f = fq.shape
  e, dtype = v.shape[-1], v.dtype
  num_chunks = tp // chunk
  sel_cols = HEAD_DIM_UNIT
  shape = (chunk, chunk)

  def kernel(q_ref, kt_ref, v_ref, sel_ref, o_ref, *scratch):
    q_smem, kt_smem, v_smem, w_smem, s_smem, z_smem, sel_smem, o_smem = scratch[
      :8
    ]
    q_bar, kt_bar, v_bar, sel_bar = scratch[8:]
    bi = jax.lax.axis_index("batch")
    ni = jax.lax.axis_index("heads")
    kh = jax.lax.div(ni, jnp.int32(group))

    def fetch(c, slot):
      rows = pl.ds(c * chunk, chunk)
      plgpu.copy_gmem_to_smem(
        q_ref.at[bi, rows, ni], q_smem.at[slot], q_bar.at[slot]
      )
      plgpu.copy_gmem_to_smem(
        kt_ref.at[bi, kh, :, rows], kt_smem.at[slot], kt_bar.at[slot]
      )
      plgpu.copy_gmem_to_smem(
        v_ref.at[bi, rows, kh], v_smem.at[slot], v_bar.at[slot]
      )

    fetch(0, 0)
    if num_chunks > 1:
      fetch(1, 1)
    if normalize:
      plgpu.copy_gmem_to_smem(sel_ref, sel_smem, sel_bar)
      z_smem[...] = _fill((f, sel_cols), 0.0).astype(dtype)
    s_smem[...] = _fill((f, e), 0.0).astype(dtype)
    plgpu.commit_smem()
    if normalize:
      plgpu.barrier_wait(sel_bar)
    tri = _iota(shape, 0) >= _iota(shape, 1)

    def step(c, carry):
      state, z = carry
      slot = jax.lax.rem(c, 2)
      plgpu.barrier_wait(q_bar.at[slot])
      plgpu.barrier_wait(kt_bar.at[slot])
      plgpu.barrier_wait(v_bar.at[slot])
      q, kt, vc = q_smem.at[slot], kt_smem.at[slot], v_smem.at[slot]
      w = jnp.where(tri, _matmul(shape, q, kt), 0.0)
      w_smem[...] = w.astype(dtype)
      plgpu.commit_smem()
      num = _matmul((chunk, e), w_smem, vc) + _matmul((chunk, e), q, s_smem)
      if normalize:
        qz = _matmul((chunk, sel_cols), q, z_smem)
        den = jnp.sum(w, axis=1) + jnp.sum(qz, axis=1)
        num = num / _rows_of(den + eps, num.shape)
      state = state + _matmul((f, e), kt, vc)
      if normalize:
        z = z + _matmul((f, sel_cols), kt, sel_smem)
        z_smem[...] = z.astype(dtype)
      s_smem[...] = state.astype(dtype)
      plgpu.wait_smem_to_gmem(0)  # the previous chunk's output has left
      o_smem[...] = num.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bi, pl.ds(c * chunk, chunk), ni])

      @pl.when(c + 2 < num_chunks)
      def _():
        fetch(c + 2, slot)

      return state, z

    jax.lax.fori_loop(
      0,
      num_chunks,
      step,
      (_fill((f, e), 0.0), _fill((f, sel_cols), 0.0)),
    )
    plgpu.wait_smem_to_gmem(0)

  sel = jnp.zeros((chunk, sel_cols), dtype).at[:, 0].set(1)
  scratch = [
    _smem((2, chunk, f), dtype),
    _smem((2, f, chunk), dtype),
    _smem((2, chunk, e), dtype),
    _smem(shape, dtype),
    _smem((f, e), dtype),
    _smem((f, sel_cols), dtype),
    _smem((chunk, sel_cols), dtype),
    _smem((chunk, e), dtype),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=1),
  ]
  return _call(
    kernel,
    jax.ShapeDtypeStruct((b, tp, n, e), dtype),
    [fq, fkt, v, sel],
    (b, n),
    ("batch", "heads"),
    scratch,
    interpret,
    "jaxnorm_causal_linear_attention_fwd_mgpu",
  )
