"""Blockwise (flash) softmax attention, forward and backward, GPU and TPU.

Kernels of `jaxnorm.attention.dot_product_attention` and `sink_attention`
with their layouts and conventions (``(B, T, N, H)`` queries, GQA keys and
values ``(B, S, K, H)``, boolean masks broadcastable to ``(B, N, T, S)``
where True attends, ``is_causal`` as a lower-triangular mask, default scale
``1/sqrt(H)``, float32 softmax statistics, a fully masked row giving the
mean of ``value`` for plain attention and 0 with a sink).

Algorithm (FlashAttention-2): one program per (batch, head, query block)
streams the key/value blocks with an online softmax (running max ``m``,
normalizer ``l``, float32 accumulator) and writes the output and the row
log-sum-exp. A learned sink logit ``s_h`` is an extra key with value 0: it
starts the running statistics at ``m = s_h, l = 1``. Masked logits get the
same large finite negative as the reference, so the semantics of fully
masked rows carry over; keys added by padding are dropped exactly. Under
``is_causal`` the key loop stops at the diagonal. The backward recomputes
the probabilities from the saved log-sum-exp: one kernel per query block
for ``dq``, one per key block for ``dk``/``dv`` (per query head, summed over
each GQA group outside); ``delta = rowsum(dO * O)`` and the sink gradient
``-sum exp(s_h - lse) * delta`` are small jnp reductions.

Lowerings (``backend=``, as for the norm kernels, `_rows.row_lowering`):
``"mosaic_gpu"``, the GPU default (`pallas_kernels.mosaic_gpu_flash`:
the same online softmax on warpgroup MMAs with TMA-fed, double-buffered
key/value tiles, and the same two backward kernels; where the backward's
tiles exceed shared memory (head dims of 256) the backward is the jnp
reference's VJP, recomputed);
``"triton"``, kept behind that explicit choice while the installed JAX has
it (the kernels below); ``"mosaic_tpu"`` (the kernels below, on TPU).

Tiling (`attention_block_heuristic`): sequences are padded to the blocks in
the wrapper (so no load is ever out of bounds on any lowering); on Triton and
TPU the whole key/value sequence of one head sits in one block that the
kernel slices, on Mosaic GPU keys stream through shared memory. Unsupported,
raising `NotImplementedError` for dispatch: an additive ``bias``; on Mosaic
GPU dtypes other than bfloat16/float16 and head dims that are not multiples
of 64 up to 256; on Triton head dims that are not powers of two >= 16;
dtypes other than float32/bfloat16 (float16 on GPU); on Triton and TPU,
sequences whose per-head K/V exceed the on-chip budget.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Bool, Float

from jaxnorm import _checks, _target
from jaxnorm.attention import affine_scaled as affine_ref
from jaxnorm.attention import sinks as sinks_ref
from jaxnorm.attention import softmax as softmax_ref
from pallas_kernels import _flash_blocked as blocked
from pallas_kernels import _flash_tiling, _rows, sharding
from pallas_kernels import mosaic_gpu_attention as mga
from pallas_kernels import mosaic_gpu_flash as mgf

# K/V of one head live in one block: 2 * S * H elements; beyond this many
# bytes (per head, input dtype) the kernel would need a key grid axis. On
# TPU the block is double-buffered in VMEM, so the budget is a quarter of
# the chip's default scoped VMEM (`kv_budget`: 4 MiB on v5e/v5p, 8 MiB on
# v6e); on Triton it is this constant.
MAX_KV_BYTES = 4 << 20


def kv_budget(lowering: str, chip: Any) -> int:
  """Bytes one head's keys and values may take in the single-block kernels."""
  if lowering == "tpu":
    return _rows.tpu_scoped_vmem(chip) // 4
  return MAX_KV_BYTES


AttentionTiling = _flash_tiling.AttentionTiling


def attention_block_heuristic(
  lowering: str,
  q_len: int,
  kv_len: int,
  block_q: int | None = None,
  block_k: int | None = None,
  *,
  head_dims: tuple[int, int] = (128, 128),
  itemsize: int = 2,
) -> AttentionTiling:
  """Chooses the flash tiles; the one place for attention block sizes.

  Constants: 128 x 128 tiles are the standard FlashAttention-2 choice on
  both targets: a (128, 128) float32 logits tile is 64 KiB, a head-dim-128
  accumulator another 64 KiB, which fits the GPU register file at 4-8 warps
  and the TPU's VMEM many times over, while giving the matmul units full
  128-wide operands (MXU tile on TPU, wgmma/mma K on GPU). Short sequences
  shrink the query block to ``next_pow2(q_len)`` (GPU, at least 16, the
  Triton ``dot`` minimum) or to ``q_len`` rounded up to 8 sublanes (TPU) so
  tiny problems do not pad to 128 rows. The key block stays a lane multiple
  (128) on TPU because the mask tile is sliced along lanes; on Triton it
  shrinks like the query block.

  Mosaic GPU: one warpgroup owns a query block, so ``block_q = 64`` (one
  wgmma M tile; its float32 accumulator is 64 registers per thread at head
  dim 128, and the logits tile as many at ``block_k = 128``); keys stream in
  blocks of 128 (64 when the keys fit in 64), double-buffered in shared
  memory: ``2 * 128 * (H + Hv)`` 16-bit elements, 128 KiB at head dim 128;
  with the q, p and o tiles that must stay under
  `mosaic_gpu_attention.SMEM_BUDGET` (200 of the 227 KiB of an H100/H200
  block), else keys stream in blocks of 64 (head dims 256). The backward
  kernels tile themselves within these padded lengths
  (`mosaic_gpu_flash.flash_backward_blocks`): ``dk``/``dv`` carry two
  accumulators, so they take 64 x 64 tiles, and ``dq`` keeps 128 keys only
  up to head dim 64 (the register arithmetic is there).

  Args:
    lowering: ``"mosaic_gpu"``, ``"triton"`` or ``"tpu"``.
    q_len: query length.
    kv_len: key length.
    block_q: override for the query block.
    block_k: override for the key block.
    head_dims: ``(H, Hv)`` (Mosaic GPU shared-memory fit).
    itemsize: bytes per q/k/v element (Mosaic GPU shared-memory fit).

  Returns:
    The `AttentionTiling` with padded lengths.
  """
  if lowering == "mosaic_gpu":
    bq = block_q or 64
    fits = mgf.flash_smem_bytes(bq, 128, *head_dims, itemsize)
    wide = kv_len > 64 and fits <= mga.SMEM_BUDGET
    bk = block_k or (128 if wide else 64)
  elif lowering == "triton":
    bq = block_q or min(128, max(16, pl.next_power_of_2(q_len)))
    bk = block_k or min(128, max(16, pl.next_power_of_2(kv_len)))
  else:
    bq = block_q or min(128, pl.cdiv(q_len, 8) * 8)
    bk = block_k or 128
  return AttentionTiling(
    lowering, bq, bk, pl.cdiv(q_len, bq) * bq, pl.cdiv(kv_len, bk) * bk
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _mosaic_flash(q, k, v, sink, mask, st):
  """The Mosaic GPU kernels; backward kernels where their tiles fit."""
  return _mosaic_flash_fwd(q, k, v, sink, mask, st)[0]


def _mosaic_config(st):
  t = st.tiling
  return mgf.FlashConfig(
    block_q=t.block_q,
    block_k=t.block_k,
    scale=st.scale,
    causal=st.causal,
    stop_at_diagonal=blocked.skip_above_diagonal(st),
    kv_len=st.kv_len,
    group=st.group,
    mask_b=st.mask_b,
    mask_n=st.mask_n,
    has_mask=st.has_mask,
    has_sink=st.has_sink,
    padded_keys=t.kv_len != st.kv_len,
  )


def _pad_seq(x, length):
  """Pads axis 1 (the sequence of a (B, T, N, H) array) to ``length``."""
  return jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))


def _mosaic_flash_fwd(q, k, v, sink, mask, st):
  t = st.tiling
  rows = None
  if st.has_sink:
    n = q.shape[2]
    rows = jnp.broadcast_to(sink.astype(jnp.float32)[:, None], (n, t.block_q))
  out, m, norm = mgf.flash_forward(
    _pad_seq(q, t.q_len),
    _pad_seq(k, t.kv_len),
    _pad_seq(v, t.kv_len),
    mask,
    rows,
    _mosaic_config(st),
    st.interpret,
  )
  out = out[:, : st.q_len]
  return out, (q, k, v, sink, mask, out, m, norm)


def _mosaic_flash_bwd(st, res, do):
  q, k, v, sink, mask, out, m, norm = res
  t = st.tiling
  size = q.dtype.itemsize
  h, hv = q.shape[-1], v.shape[-1]
  blocks = mgf.flash_backward_blocks(t.block_k, h)
  if mgf.flash_bwd_smem_bytes(blocks, h, hv, size) > mga.SMEM_BUDGET:
    return _reference_bwd(st, q, k, v, sink, mask, do)
  delta = jnp.sum(
    do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1
  ).transpose(0, 2, 1)  # (B, N, T)
  delta = jnp.pad(delta, ((0, 0), (0, 0), (0, t.q_len - st.q_len)))
  dq, dk, dv = mgf.flash_backward(
    _pad_seq(q, t.q_len),
    _pad_seq(k, t.kv_len),
    _pad_seq(v, t.kv_len),
    mask,
    m,
    1.0 / norm,
    delta,
    _pad_seq(do, t.q_len),
    _mosaic_config(st),
    blocks,
    st.interpret,
  )
  b, s, n = k.shape[0], st.kv_len, q.shape[2]
  kh = k.shape[2]

  def group_sum(x):  # the query heads of each GQA group, in f32
    x = x[:, :s].astype(jnp.float32).reshape(b, s, kh, n // kh, -1)
    return jnp.sum(x, axis=3)

  dk, dv = group_sum(dk).astype(k.dtype), group_sum(dv).astype(v.dtype)
  dsink = None
  if st.has_sink:
    sk = sink.astype(jnp.float32).reshape(1, n, 1)
    w = (jnp.exp(sk - m) / norm)[:, :, : st.q_len] * delta[:, :, : st.q_len]
    dsink = (-jnp.sum(w, axis=(0, 2))).astype(sink.dtype)
  dmask = None if mask is None else jnp.zeros(mask.shape, mask.dtype)
  return dq[:, : st.q_len], dk, dv, dsink, dmask


def _reference_bwd(st, q, k, v, sink, mask, do):
  """The jnp reference's VJP, recomputed (tiles too large for the kernels)."""
  kw = dict(scale=st.scale, is_causal=st.causal, implementation="xla")
  if st.has_mask:
    kw["mask"] = mask[:, :, : st.q_len, : st.kv_len] != 0
  if st.has_sink:

    def with_sink(q, k, v, sk):
      return sinks_ref.sink_attention(q, k, v, sinks=sk, **kw)

    dq, dk, dv, dsink = jax.vjp(with_sink, q, k, v, sink)[1](do)
  else:

    def plain(q, k, v):
      return softmax_ref.dot_product_attention(q, k, v, **kw)

    (dq, dk, dv), dsink = jax.vjp(plain, q, k, v)[1](do), None
  dmask = None if mask is None else jnp.zeros(mask.shape, mask.dtype)
  return dq, dk, dv, dsink, dmask


_mosaic_flash.defvjp(_mosaic_flash_fwd, _mosaic_flash_bwd)


def _check_head_dims(who, lowering, dtype, h, hv, interpret):
  """Raises `NotImplementedError` for head dims or dtypes a GPU kernel lacks."""
  if lowering == "mosaic_gpu":
    mga.check_supported(who, dtype, {"head_dim": h, "value head_dim": hv})
    mga.check_interpreter(who, interpret)
  elif lowering == "triton":
    for name, dim in (("head_dim", h), ("value head_dim", hv)):
      if dim < 16 or dim & (dim - 1):
        raise NotImplementedError(
          f"{who}: the triton kernel needs a power-of-two {name} "
          f">= 16, got {dim}; use the reference (implementation='xla')"
        )


def _attention(
  who,
  query,
  key,
  value,
  bias,
  mask,
  sinks,
  use_sink,
  scale,
  is_causal,
  block_q,
  block_k,
  backend,
  interpret,
):
  for name, a in (("query", query), ("key", key), ("value", value)):
    _checks.check_floating(who, name, a)
  query, key, value = map(jnp.asarray, (query, key, value))
  lowering = _rows.row_lowering(who, interpret, backend, query)
  interpret = _rows.interpreter(lowering, interpret)
  if bias is not None:
    raise NotImplementedError(
      f"{who}: the flash kernel has no additive bias (it would stream a "
      "(B, N, T, S) tensor); use the reference (implementation='xla')"
    )
  unbatched = query.ndim == 3
  if unbatched:
    query, key, value = query[None], key[None], value[None]
    if mask is not None and jnp.ndim(mask) == 3:
      mask = jnp.asarray(mask)[None]
  if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
    raise ValueError(
      f"{who}: query, key and value must have rank 4 (B, T, "
      f"N, H) or 3, got {query.shape=}, {key.shape=}, "
      f"{value.shape=}"
    )
  b, tq, n, h = query.shape
  _, s, kh, _ = key.shape
  if (
    key.shape[0] != b
    or key.shape[-1] != h
    or n % kh
    or (value.shape[:-1] != key.shape[:-1])
  ):
    raise ValueError(
      f"{who}: incompatible shapes {query.shape=}, "
      f"{key.shape=}, {value.shape=} (need equal batch and "
      "head_dim, N % K == 0, value matching key but the last "
      "axis)"
    )
  for a in (query, key, value):
    _rows.check_dtype(who, a.dtype, lowering)
  if len({query.dtype, key.dtype, value.dtype}) != 1:
    raise NotImplementedError(
      f"{who}: the kernel needs one dtype for q, k, "
      f"v, got {query.dtype}, {key.dtype}, "
      f"{value.dtype}"
    )
  hv = value.shape[-1]
  _check_head_dims(who, lowering, query.dtype, h, hv, interpret)
  size = query.dtype.itemsize
  tiling = attention_block_heuristic(
    lowering, tq, s, block_q, block_k, head_dims=(h, hv), itemsize=size
  )
  if lowering == "mosaic_gpu":
    mga.check_smem(
      who,
      mgf.flash_smem_bytes(tiling.block_q, tiling.block_k, h, hv, size),
      f"block_q={tiling.block_q}, block_k={tiling.block_k}, head dims "
      f"{h}, {hv}",
    )
  kv_bytes = tiling.kv_len * (h + hv) * query.dtype.itemsize
  budget = kv_budget(lowering, _target.current(query).chip)
  if lowering != "mosaic_gpu" and kv_bytes > budget:
    raise NotImplementedError(
      f"{who}: one head's keys and values ({kv_bytes} bytes after padding) "
      f"exceed the single-block budget of {budget} bytes on this chip; use "
      "the reference (implementation='xla')"
    )
  mask_b = mask_n = False
  mask_arr = None
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise TypeError(
        f"{who}: mask must be boolean (True attends), got {mask.dtype=}"
      )
    target = (b, n, tq, s)
    if mask.ndim != 4 or any(
      a not in (1, e) for a, e in zip(mask.shape, target)
    ):
      raise ValueError(
        f"{who}: mask must be broadcastable to (batch, heads,"
        f" q_len, kv_len)={target}, got {mask.shape=}"
      )
    mask_b, mask_n = mask.shape[0] == b > 1, mask.shape[1] == n > 1
    full = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], tq, s))
    mask_arr = jnp.pad(
      full.astype(jnp.int32),
      ((0, 0), (0, 0), (0, tiling.q_len - tq), (0, tiling.kv_len - s)),
      constant_values=1,
    )
  sink = None
  if use_sink:
    if sinks is None:
      sink = jnp.zeros((n,), jnp.float32)
    else:
      _checks.check_floating(who, "sinks", sinks)
      _checks.check_shape(who, "sinks", sinks, (n,), "one per query head")
      sink = jnp.asarray(sinks)
  scale = 1.0 / math.sqrt(h) if scale is None else float(scale)
  st = blocked.Static(
    tiling,
    interpret,
    scale,
    bool(is_causal),
    mask is not None,
    use_sink,
    tq,
    s,
    n // kh,
    mask_b,
    mask_n,
  )
  if lowering == "mosaic_gpu":
    out = _mosaic_flash(query, key, value, sink, mask_arr, st)
    return out[0] if unbatched else out

  def heads_first(x, length):
    x = jnp.swapaxes(x, 1, 2)
    return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))

  out = blocked.flash(
    heads_first(query, tiling.q_len),
    heads_first(key, tiling.kv_len),
    heads_first(value, tiling.kv_len),
    sink,
    mask_arr,
    st,
  )
  out = jnp.swapaxes(out[:, :, :tq], 1, 2)
  return out[0] if unbatched else out


@sharding.on_mesh_heads
def dot_product_attention_pallas(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  scale: float | None = None,
  is_causal: bool = False,
  block_q: int | None = None,
  block_k: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "B T N Hv"]:
  r"""Flash attention kernel of `jaxnorm.attention.dot_product_attention`.

  .. math:: \mathrm{out} = \mathrm{softmax}(q k^T s + \mathrm{mask})\, v

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)``, ``N % K == 0``.
    value: ``(B, S, K, Hv)``.
    bias: must be ``None`` (additive bias is not supported by the kernel).
    mask: boolean, broadcastable to ``(B, N, T, S)``; True attends.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: query ``i`` attends keys ``j <= i``.
    block_q: query block (default: `attention_block_heuristic`).
    block_k: key block (default: `attention_block_heuristic`).
    backend: ``"mosaic_gpu"`` (the GPU default), ``"triton"`` (while the
      installed JAX has it), ``"mosaic_tpu"`` or ``None`` (the device
      default), as for `pallas_kernels.norms.rms_norm_pallas`.
    interpret: ``True`` runs the ``backend`` kernel in its interpreter
      (Mosaic GPU's by default), ``pltpu.InterpretParams()`` the TPU kernel
      in the TPU interpreter, ``False`` compiles.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    TypeError: for non-floating inputs or a non-boolean mask.
    ValueError: for incompatible shapes or invalid blocks.
    NotImplementedError: for a case the kernel does not cover (module
      docstring).

  References:
    Dao, *FlashAttention-2: Faster Attention with Better Parallelism and
    Work Partitioning*, arXiv:2307.08691 (2023).
  """
  return _attention(
    "dot_product_attention_pallas",
    query,
    key,
    value,
    bias,
    mask,
    None,
    False,
    scale,
    is_causal,
    block_q,
    block_k,
    backend,
    interpret,
  )


@sharding.on_mesh_heads
def sink_attention_pallas(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  sinks: Float[Array, " N"] | None = None,
  scale: float | None = None,
  is_causal: bool = False,
  block_q: int | None = None,
  block_k: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "B T N Hv"]:
  r"""Flash attention kernel of `jaxnorm.attention.sink_attention`.

  .. math:: w_{ij} = \frac{e^{x_{ij}}}{e^{s_h} + \sum_{j'} e^{x_{ij'}}}

  The sink is an extra key with logit ``s_h`` and value 0, folded into the
  online softmax's initial state; ``sinks=None`` means ``s_h = 0``
  (softmax-off-by-one). A fully masked row gives 0.

  Args:
    query: ``(B, T, N, H)`` or ``(T, N, H)``.
    key: ``(B, S, K, H)``, ``N % K == 0``.
    value: ``(B, S, K, Hv)``.
    bias: must be ``None``.
    mask: boolean, broadcastable to ``(B, N, T, S)``; True attends.
    sinks: per-head sink logits ``(N,)`` (differentiable) or ``None``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: query ``i`` attends keys ``j <= i``.
    block_q: query block (default: `attention_block_heuristic`).
    block_k: key block (default: `attention_block_heuristic`).
    backend: see `dot_product_attention_pallas`.
    interpret: see `dot_product_attention_pallas`.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    TypeError: for non-floating inputs or a non-boolean mask.
    ValueError: for incompatible shapes, ``sinks`` not ``(N,)`` or invalid
      blocks.
    NotImplementedError: for a case the kernel does not cover.

  References:
    Xiao et al., *Efficient Streaming Language Models with Attention Sinks*,
    arXiv:2309.17453 (2023); Dao, arXiv:2307.08691 (2023).
  """
  return _attention(
    "sink_attention_pallas",
    query,
    key,
    value,
    bias,
    mask,
    sinks,
    True,
    scale,
    is_causal,
    block_q,
    block_k,
    backend,
    interpret,
  )


def affine_scaled_attention_pallas(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  alpha: Float[Array, "B T N"],
  alpha_ma: Float[Array, "..."],
  scale: float | None = None,
  is_causal: bool = False,
  training: bool = False,
  rho: float = 0.9,
  block_q: int | None = None,
  block_k: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "..."]]:
  r"""Affine-scaled attention with the softmax part as the flash kernel.

  Same maths, conventions and running-estimate update as
  `jaxnorm.attention.affine_scaled_attention` (beta uses the estimate from
  before the batch; the returned one includes it):

  .. math::
     \mathrm{out}_i = \alpha_i\,(P v)_i + \beta_i \sum_{j \in A_i} v_j,
     \quad \beta_i = (\bar\alpha - \alpha_i) / N_i

  :math:`P v` (the exponentials, the :math:`O(T S)` part) runs in the flash
  kernel (`dot_product_attention_pallas`); the masked value sums
  :math:`\sum_{j \in A_i} v_j` and counts :math:`N_i` are a jnp reduction:
  ``sum`` over keys without a mask, a ``cumsum`` under ``is_causal`` alone,
  and a 0/1 matmul with the user's ``(B|1, N|1, T, S)`` mask otherwise.
  Rows with no allowed key output 0. Gradients flow through the kernel's
  VJP and jnp autodiff.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: must be ``None``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    alpha: the scale ``(B, T, N)``.
    alpha_ma: running estimate, ``(N,)`` or ``()``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.
    training: update the running estimate (True) or use it (False).
    rho: EMA decay.
    block_q: query block (default: `attention_block_heuristic`).
    block_k: key block (default: `attention_block_heuristic`).
    backend: see `dot_product_attention_pallas`.
    interpret: see `dot_product_attention_pallas`.

  Returns:
    ``(out, new_alpha_ma)`` as in the reference.

  Raises:
    TypeError: for non-floating inputs or a non-boolean mask.
    ValueError: for mismatched shapes, ``alpha``/``alpha_ma`` or ``rho``.
    NotImplementedError: for a case the kernel does not cover, and on a
      device mesh (the running estimate is a mean over the whole batch, which
      a per-device kernel would not see; dispatch then runs the reference).

  References:
    Bae et al., *Affine-Scaled Attention: Towards Flexible and Stable
    Transformer Attention*, arXiv:2602.23057 (2026).
  """
  who = "affine_scaled_attention_pallas"
  query, key, value = map(jnp.asarray, (query, key, value))
  if query.ndim != 4:
    raise ValueError(
      f"{who}: query must be batched (B, T, N, H), got {query.shape=}"
    )
  if sharding.heads_plan(query, key) is not None:
    raise NotImplementedError(
      f"{who}: not on a device mesh (alpha_ma averages over the whole "
      "batch); use implementation='xla'"
    )
  soft = _attention(
    who,
    query,
    key,
    value,
    bias,
    mask,
    None,
    False,
    scale,
    is_causal,
    block_q,
    block_k,
    backend,
    interpret,
  )
  b, t, n, _ = query.shape
  s, kh = key.shape[1], key.shape[2]
  alpha_ma = affine_ref.check_affine_args(who, b, t, n, alpha, alpha_ma, rho)
  f32 = jnp.float32
  v = jnp.repeat(value.astype(f32), n // kh, axis=2)  # (B, S, N, Hv)
  if mask is None and not is_causal:
    count = jnp.full((1, 1, 1, 1), float(s), f32)
    vsum = jnp.sum(v, axis=1, keepdims=True)
  elif mask is None:
    idx = jnp.minimum(jnp.arange(t), s - 1)
    count = jnp.minimum(jnp.arange(t) + 1, s).astype(f32).reshape(1, t, 1, 1)
    vsum = jnp.cumsum(v, axis=1)[:, idx]
  else:
    allowed = jnp.asarray(mask)
    if is_causal:
      tri = jnp.tril(jnp.ones((t, s), jnp.bool_)).reshape(1, 1, t, s)
      allowed = jnp.logical_and(allowed, tri)
    w = allowed.astype(f32)
    count = jnp.transpose(jnp.sum(w, axis=-1), (0, 2, 1))[..., None]
    vsum = jnp.einsum("bnts,bsnh->btnh", jnp.broadcast_to(w, (b, n, t, s)), v)
  a = alpha.astype(f32)[..., None]  # (B, T, N, 1)
  valid = jnp.broadcast_to(count > 0, a.shape)
  new_ma = affine_ref.affine_scale_running_estimate(
    a, valid, alpha_ma, head_axis=2, training=training, rho=rho
  )
  old = jax.lax.stop_gradient(alpha_ma.astype(f32))  # the pre-batch estimate
  ma = old.reshape((1, 1, n, 1) if old.ndim else (1, 1, 1, 1))
  beta = (ma - a) / jnp.maximum(count, 1.0)
  out = a * soft.astype(f32) + beta * vsum
  out = jnp.where(valid, out, 0.0).astype(query.dtype)
  return out, new_ma.astype(alpha_ma.dtype)
