r"""The Mosaic GPU flash attention kernels, forward and backward.

`flash_forward` and `flash_backward` (Hopper, ``sm_90``, and newer;
`pallas_kernels.attention` chooses them and owns the checks, the padding
and the VJP), on the helpers of `pallas_kernels.mosaic_gpu_attention`,
which describes the structure they share with the linear attention kernel.
A block of one warpgroup owns one (batch, head, query block) for the
forward and ``dq``, one (batch, query head, key block) for ``dk``/``dv``;
the key/value stream is double-buffered. The probabilities are stored to
shared memory in the input dtype and feed the second matmul from there.
The backward kernels run on tiles of their own, sized to the register file
(`flash_backward_blocks`).

Padded query rows are computed and sliced off; padded keys are excluded
exactly (logit ``-inf``, probability 0).

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
from pallas_kernels import mosaic_gpu_attention as mga
from pallas_kernels import mosaic_gpu_rows

# The reference's large finite negative for masked logits.
_NEG = attention_core.large_negative()


def flash_smem_bytes(block_q: int, block_k: int, h: int, hv: int, size: int):
  """Shared memory of `flash_forward`: q, p and o tiles, two k/v slots."""
  return size * (block_q * (h + block_k + hv) + 2 * block_k * (h + hv))


def _visited(cfg: FlashConfig, num_q: int, num_k: int, by_key: bool) -> int:
  """Logits one (batch, head) computes: ``block_q block_k`` per loop trip.

  Without the causal skip every block visits every tile; with it, query
  block ``i`` stops at key block ``ceil((i + 1) block_q / block_k)`` and
  key block ``j`` (``by_key``: the ``dk``/``dv`` kernel) starts at query
  block ``floor(j block_k / block_q)``, as the kernels' loop bounds.
  """
  bq, bk = cfg.block_q, cfg.block_k
  if not cfg.stop_at_diagonal:
    trips = num_q * num_k
  elif by_key:
    trips = sum(max(0, num_q - j * bk // bq) for j in range(num_k))
  else:
    trips = sum(min(num_k, -(-(i + 1) * bq // bk)) for i in range(num_q))
  return trips * bq * bk


def _scores(cfg, s, mask_ref, bi, ni, q0, k0):
  """Masked logits of one ``(block_q, block_k)`` tile.

  Returns ``(s, allowed, valid)``: ``s`` with disallowed logits set to the
  reference's large finite negative; ``allowed`` the mask (``None`` without
  one); ``valid`` the real (unpadded) keys (``None`` without padding).
  """
  shape = s.shape
  allowed = valid = None
  cols = k0 + mga._iota(shape, 1)
  if cfg.causal:
    allowed = q0 + mga._iota(shape, 0) >= cols
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
      s = mga._matmul(shape, q_smem, k_smem.at[slot].T) * cfg.scale
      s, _, valid = _scores(cfg, s, mask_ref, bi, ni, q0, j * bk)
      if valid is not None:
        s = jnp.where(valid, s, -jnp.inf)
      m_new = jnp.maximum(m, jnp.max(s, axis=1))
      corr = jnp.exp(m - m_new)
      p = jnp.exp(s - mga._rows_of(m_new, shape))
      norm = norm * corr + jnp.sum(p, axis=1)
      p_smem[...] = p.astype(dtype)
      plgpu.commit_smem()
      plgpu.barrier_wait(v_bar.at[slot])
      acc = acc * mga._rows_of(corr, acc.shape)
      acc = mga._accumulate(acc, p_smem, v_smem.at[slot], interpret)

      @pl.when(j + 2 < stop)
      def _():
        fetch(j + 2, slot)

      return m_new, norm, acc

    if cfg.has_sink:
      m0, l0 = mga._row_vector(sink_ref.at[ni]), mga._fill((bq,), 1.0)
    else:
      m0, l0 = mga._fill((bq,), -jnp.inf), mga._fill((bq,), 0.0)
    m, norm, acc = jax.lax.fori_loop(
      0, stop, step, (m0, l0, mga._fill((bq, hv), 0.0))
    )
    o_smem[...] = (acc / mga._rows_of(norm, acc.shape)).astype(dtype)
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
    mga._smem((bq, h), dtype),
    mga._smem((2, bk, h), dtype),
    mga._smem((2, bk, hv), dtype),
    mga._smem((bq, bk), dtype),
    mga._smem((bq, hv), dtype),
    plgpu.SMEM((bq,), jnp.float32),
    plgpu.SMEM((bq,), jnp.float32),
    plgpu.Barrier(num_barriers=1),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
  ]
  stats = jax.ShapeDtypeStruct((b, n, tp), jnp.float32)
  out_type = (jax.ShapeDtypeStruct((b, tp, n, hv), dtype), stats, stats)
  # Per logit: q k^T and p v (2 (H + Hv) flops) and the exponential of p;
  # per row and step (every bk logits) the running-max correction's.
  logits = b * n * _visited(cfg, tp // bq, num_k, by_key=False)
  return mga._call(
    kernel,
    out_type,
    args,
    (b, n, tp // bq),
    ("batch", "heads", "q"),
    scratch,
    interpret,
    "jaxnorm_flash_attention_fwd_mgpu",
    mga._cost(logits * 2 * (h + hv), logits + logits // bk, args, out_type),
  )


def _tile_regs(rows: int, cols: int) -> int:
  """Registers per thread of a float32 ``(rows, cols)`` tile in a warpgroup."""
  return rows * cols // 128


# Registers per thread the float32 tiles of the dq kernel may hold at once
# (`flash_backward_blocks`): of the 255 a thread can address, the rest hold
# addresses, loop state, row statistics, the mask's per-element temporaries
# and wgmma descriptors. Measured with ptxas (sm_90a, causal): 160 compiles
# without spills, 192 spills 40 bytes.
TILE_REGS = 160

BackwardBlocks = tuple[tuple[int, int], tuple[int, int]]


def flash_backward_blocks(block_k: int, h: int) -> BackwardBlocks:
  r"""Tiles of the two `flash_backward` kernels, of their own.

  Returns ``((block_q, block_k) of dq, (block_q, block_k) of dk/dv)``. The
  query blocks are 64 and the key blocks 64 or the forward's ``block_k``,
  so they divide the forward's padded lengths (the padding, the statistics
  and the mask serve both passes unchanged).

  Register arithmetic (`_tile_regs`: a float32 ``(r, c)`` tile over one
  warpgroup takes ``r c / 128`` registers per thread). Running sums are
  updated in place by the wgmma (`mosaic_gpu_attention._accumulate`), so
  the peak of each kernel is across its ``dO V^T`` matmul:

  - ``dq`` holds its accumulator ``(bq, H)`` with ``p`` and ``dp``
    ``(bq, bk)``: ``bq (H + 2 bk) / 128``. It keeps the forward's
    ``bk = 128`` while that stays within `TILE_REGS` (160): up to
    ``H = 64``; at ``H = 128`` it would be 192 (40 bytes spilled), so
    ``bk = 64`` (128).
  - ``dk``/``dv`` hold both accumulators over the whole query sweep,
    ``bk (H + Hv) / 128``, with ``p`` and ``dp`` (``2 bq bk / 128``). The
    forward's ``(64, 128)`` needs 384 at ``H = 128`` (ptxas: 2,232 bytes
    spilled, wgmma serialized) and 256 at ``H = 64`` (440 bytes spilled),
    so this kernel takes the smallest tiles, ``(64, 64)``: 192 and 128
    (both compile without spills). At ``H = Hv = 256`` it would need 320,
    and its shared memory exceeds `mosaic_gpu_attention.SMEM_BUDGET`
    (`flash_bwd_smem_bytes`): the caller then runs the reference's VJP.

  Args:
    block_k: the forward's key block.
    h: query/key head dim.

  Returns:
    The ``dq`` and ``dk``/``dv`` blocks.
  """
  bq = mga.BLOCKS[0]
  wide = _tile_regs(bq, h) + 2 * _tile_regs(bq, block_k) <= TILE_REGS
  return (bq, block_k if wide else bq), (bq, bq)


def flash_bwd_smem_bytes(blocks: BackwardBlocks, h: int, hv: int, size: int):
  """Shared memory of the larger of the two `flash_backward` kernels.

  ``dq``: the q and do tiles, two k/v slots, the ds tile. ``dk``/``dv``: the
  k and v tiles (reused for dk and dv), two q/do slots, the p and ds tiles.
  """
  (dq_q, dq_k), (kv_q, kv_k) = blocks
  width = h + hv
  dq = dq_q * width + 2 * dq_k * width + dq_q * dq_k
  dkv = kv_k * width + 2 * kv_q * width + 2 * kv_q * kv_k
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
  blocks: BackwardBlocks,
  interpret: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  r"""Flash attention backward on Mosaic GPU (FlashAttention-2 recompute).

  With :math:`P = e^{s - m} / l` recomputed per tile from the forward's
  statistics and :math:`D = \mathrm{rowsum}(dO \circ O)` (``delta``):

  .. math:: dS = P \circ (dO\, V^T - D),\quad dQ = c\, dS\, K,\quad
     dK = c\, dS^T Q,\quad dV = P^T dO

  (:math:`c` the scale). Masked logits are constants, so :math:`dS = 0`
  there; :math:`P` is already exactly 0 at them (``exp`` of the large
  negative minus a real row max underflows) except on a row with no
  allowed key, whose max is that constant and whose :math:`P` is uniform.
  So :math:`dS` is zeroed per row where :math:`m` equals the constant
  rather than per element, and the ``(block_q, block_k)`` mask need not
  stay live in registers across the :math:`dO\, V^T` matmul. One kernel
  per query block accumulates ``dq`` over the key blocks, one per key
  block and query head accumulates ``dk``/``dv`` over the query blocks
  (their GQA group sum is left to the caller), each on its own tiles
  (`flash_backward_blocks`). The transposed products take the probability
  tile from shared memory as a transposed operand.

  Args:
    q: ``(B, Tp, N, H)``, padded as for `flash_forward` (``do`` alike).
    k: ``(B, Sp, K, H)``.
    v: ``(B, Sp, K, Hv)``.
    mask: int32 ``(Bm, Nm, Tp, Sp)`` or ``None``.
    m: row maxima ``(B, N, Tp)`` from `flash_forward`.
    linv: inverse normalizers ``1 / l``, ``(B, N, Tp)``.
    delta: ``rowsum(do * out)`` in float32, ``(B, N, Tp)``.
    do: output cotangent ``(B, Tp, N, Hv)``.
    cfg: the forward's `FlashConfig` (its blocks are replaced by
      ``blocks``).
    blocks: the ``dq`` and ``dk``/``dv`` tiles, dividing ``Tp`` and ``Sp``
      (`flash_backward_blocks`).
    interpret: ``False`` or an ``InterpretGPUParams``.

  Returns:
    ``(dq, dk, dv)``: ``(B, Tp, N, H)``, and ``(B, Sp, N, H)``,
    ``(B, Sp, N, Hv)`` per query head.
  """
  b, tp, n, h = q.shape
  sp, hv = k.shape[1], v.shape[-1]
  dtype = q.dtype
  (dq_q, dq_k), (kv_q, kv_k) = blocks
  dq_cfg = dataclasses.replace(cfg, block_q=dq_q, block_k=dq_k)
  kv_cfg = dataclasses.replace(cfg, block_q=kv_q, block_k=kv_k)

  def probs(c, s, stats, bi, ni, q0, k0, mask_ref):
    """P of one tile from its raw scores (0 at padded keys)."""
    m_i, linv_i = stats
    s, _, valid = _scores(c, s * c.scale, mask_ref, bi, ni, q0, k0)
    p = jnp.exp(s - mga._rows_of(m_i, s.shape)) * mga._rows_of(linv_i, s.shape)
    if valid is not None:
      p = jnp.where(valid, p, 0.0)
    return p

  def dscores(p, dp, stats, delta_i):
    """The tile's dS; 0 on rows without an allowed key (a user mask)."""
    ds = p * (dp - mga._rows_of(delta_i, p.shape))
    if not cfg.has_mask:
      return ds
    keep = (stats[0] > _NEG).astype(jnp.float32)
    return ds * mga._rows_of(keep, p.shape)

  def dq_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, d_ref, *refs):
    bq, bk = dq_q, dq_k
    num_k = sp // bk
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
      mga._row_vector(m_ref.at[bi, ni, rows]),
      mga._row_vector(l_ref.at[bi, ni, rows]),
    )
    delta_i = mga._row_vector(d_ref.at[bi, ni, rows])
    plgpu.barrier_wait(q_bar.at[0])
    plgpu.barrier_wait(q_bar.at[1])

    def step(j, dq):
      slot = jax.lax.rem(j, 2)
      plgpu.barrier_wait(k_bar.at[slot])
      s = mga._matmul((bq, bk), q_smem, k_smem.at[slot].T)
      p = probs(dq_cfg, s, stats, bi, ni, q0, j * bk, mask_ref)
      plgpu.barrier_wait(v_bar.at[slot])
      dp = mga._matmul((bq, bk), do_smem, v_smem.at[slot].T)
      ds_smem[...] = dscores(p, dp, stats, delta_i).astype(dtype)
      plgpu.commit_smem()
      dq = mga._accumulate(dq, ds_smem, k_smem.at[slot], interpret)

      @pl.when(j + 2 < stop)
      def _():
        fetch(j + 2, slot)

      return dq

    dq = jax.lax.fori_loop(0, stop, step, mga._fill((bq, h), 0.0))
    q_smem[...] = (dq * cfg.scale).astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[bi, rows, ni])
    plgpu.wait_smem_to_gmem(0)

  def dkv_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, d_ref, *refs):
    bq, bk = kv_q, kv_k
    num_q = tp // bq
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
        mga._row_vector(m_ref.at[bi, ni, rows]),
        mga._row_vector(l_ref.at[bi, ni, rows]),
      )
      delta_i = mga._row_vector(d_ref.at[bi, ni, rows])
      plgpu.barrier_wait(q_bar.at[slot])
      s = mga._matmul((bq, bk), q_smem.at[slot], k_smem.T)
      p = probs(kv_cfg, s, stats, bi, ni, q0, k0, mask_ref)
      p_smem[...] = p.astype(dtype)
      plgpu.barrier_wait(do_bar.at[slot])
      dp = mga._matmul((bq, bk), do_smem.at[slot], v_smem.T)
      ds_smem[...] = dscores(p, dp, stats, delta_i).astype(dtype)
      plgpu.commit_smem()
      dv = mga._accumulate(dv, p_smem.T, do_smem.at[slot], interpret)
      dk = mga._accumulate(dk, ds_smem.T, q_smem.at[slot], interpret)

      @pl.when(i + 2 < num_q)
      def _():
        fetch(i + 2, slot)

      return dk, dv

    dk, dv = jax.lax.fori_loop(
      start, num_q, step, (mga._fill((bk, h), 0.0), mga._fill((bk, hv), 0.0))
    )
    k_smem[...] = (dk * cfg.scale).astype(dtype)
    v_smem[...] = dv.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[bi, keys, ni])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[bi, keys, ni])
    plgpu.wait_smem_to_gmem(0)

  args = [q, k, v, do, m, linv, delta] + ([mask] if cfg.has_mask else [])
  # Per logit: dq does q k^T, dO v^T and dS k (2 (2 H + Hv) flops), dk/dv
  # q k^T, dO v^T, P^T dO and dS^T q (4 (H + Hv)); both one exponential.
  dq_type = jax.ShapeDtypeStruct((b, tp, n, h), dtype)
  dq_logits = b * n * _visited(dq_cfg, tp // dq_q, sp // dq_k, by_key=False)
  dq = mga._call(
    dq_kernel,
    dq_type,
    args,
    (b, n, tp // dq_q),
    ("batch", "heads", "q"),
    [
      mga._smem((dq_q, h), dtype),
      mga._smem((dq_q, hv), dtype),
      mga._smem((2, dq_k, h), dtype),
      mga._smem((2, dq_k, hv), dtype),
      mga._smem((dq_q, dq_k), dtype),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
    ],
    interpret,
    "jaxnorm_flash_attention_dq_mgpu",
    mga._cost(dq_logits * 2 * (2 * h + hv), dq_logits, args, dq_type),
  )
  kv_type = (
    jax.ShapeDtypeStruct((b, sp, n, h), dtype),
    jax.ShapeDtypeStruct((b, sp, n, hv), dtype),
  )
  kv_logits = b * n * _visited(kv_cfg, tp // kv_q, sp // kv_k, by_key=True)
  dk, dv = mga._call(
    dkv_kernel,
    kv_type,
    args,
    (b, n, sp // kv_k),
    ("batch", "heads", "k"),
    [
      mga._smem((kv_k, h), dtype),
      mga._smem((kv_k, hv), dtype),
      mga._smem((2, kv_q, h), dtype),
      mga._smem((2, kv_q, hv), dtype),
      mga._smem((kv_q, kv_k), dtype),
      mga._smem((kv_q, kv_k), dtype),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
      plgpu.Barrier(num_barriers=2),
    ],
    interpret,
    "jaxnorm_flash_attention_dkv_mgpu",
    mga._cost(kv_logits * 4 * (h + hv), kv_logits, args, kv_type),
  )
  return dq, dk, dv
