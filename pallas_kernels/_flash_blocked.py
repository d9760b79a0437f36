"""The Triton and Mosaic TPU lowerings of the flash attention kernels.

The blocked FlashAttention-2 kernels behind `pallas_kernels.attention` on
Triton and Mosaic TPU (the Mosaic GPU kernels are in
`pallas_kernels.mosaic_gpu_flash`): one program per (batch, head, query
block) slices the whole key/value sequence of its head from one block and
streams it with an online softmax; the backward recomputes the
probabilities from the saved statistics, one kernel per query block for
``dq`` and one per key block for ``dk``/``dv``. `Static` is the static
description of one call, shared with the Mosaic GPU path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxnorm.attention import _core as attention_core
from pallas_kernels import _flash_tiling, _rows

# The reference's masked logit (finite, as jax.nn), so fully masked rows
# keep its semantics.
_NEG = attention_core.large_negative()


@dataclasses.dataclass(frozen=True)
class Static:
  tiling: _flash_tiling.AttentionTiling
  interpret: Any
  scale: float
  causal: bool
  has_mask: bool
  has_sink: bool
  q_len: int
  kv_len: int
  group: int
  mask_b: bool  # the mask varies over batch
  mask_n: bool  # the mask varies over heads


def _compiler_params(st: Static, num_dims: int):
  if st.tiling.lowering == "triton":
    return _rows.pltr.CompilerParams(num_warps=4, num_stages=2)
  if isinstance(st.interpret, pltpu.InterpretParams):
    return pltpu.CompilerParams()  # see _rows.row_call (interpreter + vmap)
  return pltpu.CompilerParams(dimension_semantics=("parallel",) * num_dims)


def _dot(a, b, contract_b: int):
  """``a @ b`` (contract_b=0) or ``a @ b.T`` (contract_b=1), f32 result."""
  return jax.lax.dot_general(
    a, b, (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32
  )


def _logits(st, q, k, q0, k0, mask):
  """Scaled, masked logits tile, its real (unpadded) keys, the mask."""
  bq, bk = q.shape[0], k.shape[0]
  s = _dot(q, k, 1) * st.scale
  qi = q0 + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  kj = k0 + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  allowed = None
  if st.has_mask or st.causal:
    allowed = jnp.ones((bq, bk), jnp.bool_)
    if st.has_mask:
      allowed = mask != 0
    if st.causal:
      allowed = jnp.logical_and(allowed, qi >= kj)
    s = jnp.where(allowed, s, _NEG)
  return s, kj < st.kv_len, allowed


def _masked(ds, allowed):
  """Masked logits are constants: no gradient flows through them."""
  return ds if allowed is None else jnp.where(allowed, ds, 0.0)


def skip_above_diagonal(st) -> bool:
  """Whether causal blocks above the diagonal may be skipped.

  Not with a user mask in plain attention: there a fully masked row must
  average ``value`` over *all* keys (the reference semantics), including
  those above the diagonal. With a sink such a row is 0 either way.
  """
  return st.causal and (st.has_sink or not st.has_mask)


def _kv_stop(st, q_block):
  """Number of key blocks a query block needs (stops at the diagonal)."""
  t = st.tiling
  n = t.kv_len // t.block_k
  if not skip_above_diagonal(st):
    return n
  # lax.div (truncation) on these non-negative ints: jnp's floor division
  # emits a sign op that Mosaic cannot lower without a TPU attached.
  return jnp.minimum(
    n, jax.lax.div((q_block + 1) * t.block_q + t.block_k - 1, t.block_k)
  )


def _fwd_kernel(st, q_ref, k_ref, v_ref, *refs):
  refs = list(refs)
  mask_ref = refs.pop(0) if st.has_mask else None
  sink_ref = refs.pop(0) if st.has_sink else None
  o_ref, m_ref, l_ref = refs
  t = st.tiling
  i = pl.program_id(2)
  q = q_ref[...]
  bq, bk = t.block_q, t.block_k
  if st.has_sink:
    m0 = sink_ref[...].astype(jnp.float32)
    l0 = jnp.ones((bq, 1), jnp.float32)
  else:
    m0 = jnp.full((bq, 1), -jnp.inf, jnp.float32)
    l0 = jnp.zeros((bq, 1), jnp.float32)
  acc0 = jnp.zeros((bq, o_ref.shape[-1]), jnp.float32)

  def body(j, carry):
    m, norm, acc = carry
    k = k_ref[pl.ds(j * bk, bk), :]
    v = v_ref[pl.ds(j * bk, bk), :]
    mask = mask_ref[:, pl.ds(j * bk, bk)] if st.has_mask else None
    s, valid, _ = _logits(st, q, k, i * bq, j * bk, mask)
    m_new = jnp.maximum(
      m, jnp.max(jnp.where(valid, s, -jnp.inf), axis=1, keepdims=True)
    )
    p = jnp.where(valid, jnp.exp(s - m_new), 0.0)
    corr = jnp.exp(m - m_new)
    l_new = corr * norm + jnp.sum(p, axis=1, keepdims=True)
    acc_new = corr * acc + _dot(p.astype(v.dtype), v, 0)
    return m_new, l_new, acc_new

  m, norm, acc = jax.lax.fori_loop(0, _kv_stop(st, i), body, (m0, l0, acc0))
  o_ref[...] = (acc / norm).astype(o_ref.dtype)
  # m and l, not m + log(l): for a fully masked row m is -0.7 * f32 max and
  # log(l) would be lost to rounding, giving wrong backward probabilities.
  m_ref[...] = m
  l_ref[...] = norm


def _dq_kernel(
  st, q_ref, k_ref, v_ref, do_ref, m_ref, linv_ref, delta_ref, *refs
):
  refs = list(refs)
  mask_ref = refs.pop(0) if st.has_mask else None
  (dq_ref,) = refs
  t = st.tiling
  i = pl.program_id(2)
  bq, bk = t.block_q, t.block_k
  q, do = q_ref[...], do_ref[...]
  m, linv, delta = m_ref[...], linv_ref[...], delta_ref[...]

  def body(j, dq):
    k = k_ref[pl.ds(j * bk, bk), :]
    v = v_ref[pl.ds(j * bk, bk), :]
    mask = mask_ref[:, pl.ds(j * bk, bk)] if st.has_mask else None
    s, valid, allowed = _logits(st, q, k, i * bq, j * bk, mask)
    p = jnp.where(valid, jnp.exp(s - m) * linv, 0.0)
    ds = _masked(p * (_dot(do, v, 1) - delta), allowed)
    return dq + _dot(ds.astype(k.dtype), k, 0)

  dq = jax.lax.fori_loop(
    0, _kv_stop(st, i), body, jnp.zeros((bq, q.shape[-1]), jnp.float32)
  )
  dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(
  st, q_ref, k_ref, v_ref, do_ref, m_ref, linv_ref, delta_ref, *refs
):
  refs = list(refs)
  mask_ref = refs.pop(0) if st.has_mask else None
  dk_ref, dv_ref = refs
  t = st.tiling
  j = pl.program_id(2)
  bq, bk = t.block_q, t.block_k
  k, v = k_ref[...], v_ref[...]
  nq = t.q_len // bq
  start = jax.lax.div(j * bk, bq) if skip_above_diagonal(st) else 0

  def body(i, carry):
    dk, dv = carry
    q = q_ref[pl.ds(i * bq, bq), :]
    do = do_ref[pl.ds(i * bq, bq), :]
    m = m_ref[pl.ds(i * bq, bq), :]
    linv = linv_ref[pl.ds(i * bq, bq), :]
    delta = delta_ref[pl.ds(i * bq, bq), :]
    mask = mask_ref[pl.ds(i * bq, bq), :] if st.has_mask else None
    s, valid, allowed = _logits(st, q, k, i * bq, j * bk, mask)
    p = jnp.where(valid, jnp.exp(s - m) * linv, 0.0)
    dv = dv + _dot(p.astype(do.dtype).T, do, 0)
    ds = _masked(p * (_dot(do, v, 1) - delta), allowed)
    dk = dk + _dot(ds.astype(q.dtype).T, q, 0)
    return dk, dv

  dk, dv = jax.lax.fori_loop(
    start,
    nq,
    body,
    (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)),
  )
  dk_ref[...] = (dk * st.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _tiles(st, key_major: bool) -> int:
  """``(block_q, block_k)`` score tiles one (batch, head) program computes.

  Query-major (forward, ``dq``): each query block runs to `_kv_stop`;
  key-major (``dk``/``dv``): each key block runs from its diagonal.
  """
  t = st.tiling
  nq, nk = t.q_len // t.block_q, t.kv_len // t.block_k
  skip = skip_above_diagonal(st)
  if key_major:
    return sum(
      nq - (j * t.block_k // t.block_q if skip else 0) for j in range(nk)
    )
  if not skip:
    return nq * nk
  return sum(
    min(nk, ((i + 1) * t.block_q + t.block_k - 1) // t.block_k)
    for i in range(nq)
  )


def _cost(st, heads, per_tile, args, out_shape, key_major=False):
  """The `pl.CostEstimate` of one flash kernel.

  Args:
    st: the `Static`.
    heads: batch times query heads (the grid's first two dimensions).
    per_tile: ``(flops, transcendentals)`` of one score tile.
    args: the kernel's operands.
    out_shape: its output shapes.
    key_major: whether the kernel loops over queries per key block.

  Returns:
    flops and transcendentals: ``per_tile`` times `_tiles` times ``heads``;
    bytes: each operand read once and each output written once.
  """
  tiles = heads * _tiles(st, key_major)
  leaves = jax.tree.leaves((args, out_shape))
  return pl.CostEstimate(
    flops=tiles * per_tile[0],
    transcendentals=tiles * per_tile[1],
    bytes_accessed=sum(
      math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in leaves
    ),
  )


def _mask_spec(st, rows, cols, row_blocked):
  def index(b, n, x):
    bb = b if st.mask_b else 0
    nn = n if st.mask_n else 0
    return (bb, nn, x, 0) if row_blocked else (bb, nn, 0, x)

  return pl.BlockSpec((pl.squeezed, pl.squeezed, rows, cols), index)


def _forward(q, k, v, sink, mask, st):
  t = st.tiling
  b, n, _, h = q.shape
  hv = v.shape[-1]
  g = st.group
  in_specs = [
    pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.block_q, h), lambda b, n, i: (b, n, i, 0)
    ),
    pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.kv_len, h),
      lambda b, n, i: (b, jax.lax.div(n, g), 0, 0),
    ),
    pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.kv_len, hv),
      lambda b, n, i: (b, jax.lax.div(n, g), 0, 0),
    ),
  ]
  args = [q, k, v]
  if st.has_mask:
    in_specs.append(_mask_spec(st, t.block_q, t.kv_len, True))
    args.append(mask)
  if st.has_sink:
    in_specs.append(
      pl.BlockSpec((pl.squeezed, t.block_q, 1), lambda b, n, i: (n, i, 0))
    )
    args.append(
      jnp.broadcast_to(
        sink.astype(jnp.float32).reshape(n, 1, 1), (n, t.q_len, 1)
      )
    )

  def row(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.block_q, w), lambda b, n, i: (b, n, i, 0)
    )

  out_shape = [
    jax.ShapeDtypeStruct((b, n, t.q_len, hv), q.dtype),
    jax.ShapeDtypeStruct((b, n, t.q_len, 1), jnp.float32),
    jax.ShapeDtypeStruct((b, n, t.q_len, 1), jnp.float32),
  ]
  # Per score tile: q k^T and p v, 4 flops per logit (scale, max, subtract,
  # sum), an exp per logit and a rescaling exp per query.
  tile = t.block_q * t.block_k
  per_tile = (2 * tile * (h + hv) + 4 * tile, tile + t.block_q)
  return pl.pallas_call(
    functools.partial(_fwd_kernel, st),
    out_shape=out_shape,
    grid=(b, n, t.q_len // t.block_q),
    in_specs=in_specs,
    out_specs=[row(hv), row(1), row(1)],
    compiler_params=_compiler_params(st, 3),
    interpret=st.interpret,
    name="jaxnorm_flash_attention_fwd",
    cost_estimate=_cost(st, b * n, per_tile, args, out_shape),
  )(*args)


def _backward(q, k, v, mask, o, m, norm, do, st):
  t = st.tiling
  b, n, _, h = q.shape
  hv = v.shape[-1]
  g = st.group
  delta = jnp.sum(
    do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True
  )
  linv = 1.0 / norm

  def qblk(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.block_q, w), lambda b, n, i: (b, n, i, 0)
    )

  def qall(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.q_len, w), lambda b, n, j: (b, n, 0, 0)
    )

  def kall(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.kv_len, w),
      lambda b, n, i: (b, jax.lax.div(n, g), 0, 0),
    )

  def kblk(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.block_k, w),
      lambda b, n, j: (b, jax.lax.div(n, g), j, 0),
    )

  def kout(w):
    return pl.BlockSpec(
      (pl.squeezed, pl.squeezed, t.block_k, w), lambda b, n, j: (b, n, j, 0)
    )

  args = [q, k, v, do, m, linv, delta, *([mask] if st.has_mask else [])]
  # Per score tile, both kernels: an exp per logit and 5 flops per logit
  # (scale, subtract m, times 1/l, subtract delta, times p). Matmuls: dq
  # recomputes q k^T and do v^T and adds ds k; dk/dv recompute the same two
  # and add p^T do and ds^T q.
  tile = t.block_q * t.block_k
  dq_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
  dq = pl.pallas_call(
    functools.partial(_dq_kernel, st),
    out_shape=dq_shape,
    grid=(b, n, t.q_len // t.block_q),
    in_specs=[qblk(h), kall(h), kall(hv), qblk(hv), qblk(1), qblk(1), qblk(1)]
    + ([_mask_spec(st, t.block_q, t.kv_len, True)] if st.has_mask else []),
    out_specs=qblk(h),
    compiler_params=_compiler_params(st, 3),
    interpret=st.interpret,
    name="jaxnorm_flash_attention_dq",
    cost_estimate=_cost(
      st, b * n, (2 * tile * (2 * h + hv) + 5 * tile, tile), args, dq_shape
    ),
  )(*args)
  dkv_shape = [
    jax.ShapeDtypeStruct((b, n, t.kv_len, h), k.dtype),
    jax.ShapeDtypeStruct((b, n, t.kv_len, hv), v.dtype),
  ]
  dk, dv = pl.pallas_call(
    functools.partial(_dkv_kernel, st),
    out_shape=dkv_shape,
    grid=(b, n, t.kv_len // t.block_k),
    in_specs=[qall(h), kblk(h), kblk(hv), qall(hv), qall(1), qall(1), qall(1)]
    + ([_mask_spec(st, t.q_len, t.block_k, False)] if st.has_mask else []),
    out_specs=[kout(h), kout(hv)],
    compiler_params=_compiler_params(st, 3),
    interpret=st.interpret,
    name="jaxnorm_flash_attention_dkv",
    cost_estimate=_cost(
      st,
      b * n,
      (4 * tile * (h + hv) + 5 * tile, tile),
      args,
      dkv_shape,
      key_major=True,
    ),
  )(*args)
  if g > 1:  # sum the query heads of each GQA group (f32, then cast)
    kh = n // g
    dk = jnp.sum(
      dk.astype(jnp.float32).reshape(b, kh, g, t.kv_len, h), axis=2
    ).astype(k.dtype)
    dv = jnp.sum(
      dv.astype(jnp.float32).reshape(b, kh, g, t.kv_len, hv), axis=2
    ).astype(v.dtype)
  return dq, dk, dv, delta


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def flash(q, k, v, sink, mask, st):
  return _flash_fwd(q, k, v, sink, mask, st)[0]


def _flash_fwd(q, k, v, sink, mask, st):
  o, m, norm = _forward(q, k, v, sink, mask, st)
  return o, (q, k, v, sink, mask, o, m, norm)


def _flash_bwd(st, res, do):
  q, k, v, sink, mask, o, m, norm = res
  dq, dk, dv, delta = _backward(q, k, v, mask, o, m, norm, do, st)
  dsink = None
  if sink is not None:
    n = q.shape[1]
    s = sink.astype(jnp.float32).reshape(1, n, 1, 1)
    w = (jnp.exp(s - m) / norm * delta)[:, :, : st.q_len]
    dsink = (-jnp.sum(w, axis=(0, 2, 3))).astype(sink.dtype)
  dmask = None if mask is None else jnp.zeros(mask.shape, mask.dtype)
  return dq, dk, dv, dsink, dmask


flash.defvjp(_flash_fwd, _flash_bwd)
