r"""The Mosaic GPU chunked causal linear attention kernel (forward).

`linear_forward` (Hopper, ``sm_90``, and newer; its backward is the VJP of
the jnp reference, recomputed): `pallas_kernels.linear_attention` chooses
it and owns the checks, the padding and the VJP. It runs on the helpers of
`pallas_kernels.mosaic_gpu_attention`, which describes the structure it
shares with the flash kernels: a block of one warpgroup owns one (batch,
head) and one block of `VALUE_BLOCK` value columns; the chunk stream is
double-buffered, and the masked chunk scores are stored to shared memory in
the input dtype and feed the second matmul from there.

Padded linear-attention positions are zero after the feature map and add
nothing.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import mosaic_gpu_attention as mga

# Value columns one linear-attention block owns (`linear_forward`).
VALUE_BLOCK = 64
# Widest query/key head dim of `linear_forward`: at 256 its (256, 64)
# float32 state is 128 registers per thread and ptxas spills (16 bytes).
LINEAR_MAX_HEAD_DIM = 128


def linear_smem_bytes(chunk: int, f: int, e: int, size: int) -> int:
  """Shared memory of `linear_forward`.

  Two q/k/v slots, the masked scores, the state operand and the output tile
  (values in blocks of `VALUE_BLOCK` columns).
  """
  e = min(e, VALUE_BLOCK)
  return size * (2 * chunk * (2 * f + e) + chunk * chunk + f * e + chunk * e)


def linear_normalizer(fq: jax.Array, fkt: jax.Array, group: int) -> jax.Array:
  r"""Row normalizers :math:`\phi(q_i) \cdot \sum_{j \le i} \phi(k_j)`.

  The causal denominator of linear attention in float32, from an inclusive
  cumulative sum of the mapped keys over the sequence (XLA, one extra read
  of ``fq`` and ``fkt``); `linear_forward` divides by it.

  Args:
    fq: feature-mapped queries ``(B, Tp, N, F)``.
    fkt: feature-mapped keys, transposed, ``(B, K, F, Tp)``.
    group: query heads per key head.

  Returns:
    ``(B, N, Tp)`` float32.
  """
  b, tp, n, f = fq.shape
  z = jnp.cumsum(fkt.astype(jnp.float32), axis=-1)
  q = fq.astype(jnp.float32).reshape(b, tp, n // group, group, f)
  return jnp.einsum("btkgf,bkft->bkgt", q, z).reshape(b, n, tp)


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
    \mathrm{out} = \mathrm{num} / (\mathrm{den} + \epsilon)

  with ``den`` the causal normalizer (`linear_normalizer`, computed before
  the kernel and read as one float32 per row). One block owns one (batch,
  head) and `VALUE_BLOCK` = 64 columns of the values (the grid's third
  axis), so that its state is ``(F, 64)``. Register arithmetic (a float32
  ``(r, c)`` tile over one warpgroup is ``r c / 128`` per thread): at ``F =
  E = 128`` the whole-width state (128) and an in-kernel normalizer matrix
  (64) left no room for the chunk's tiles, and ptxas spilled 516 bytes and
  serialized the wgmma (chunk 128); with value blocks the normalizer matrix
  still spilled 188 bytes at chunk 64. Without it a block carries the state
  (64) and per chunk ``W`` (32) and ``num`` (32). Each value block
  recomputes the chunk's ``W`` (``E / 64 - 1`` extra ``Q K^T`` per chunk),
  which costs flops, not memory traffic.

  Deviation: the matmul operands are 16-bit, so ``W`` and ``S`` are rounded
  to the input dtype where they enter a product (relative error about 2^-9
  for bfloat16); sums and the normalizer stay float32.

  Args:
    fq: feature-mapped queries ``(B, Tp, N, F)``.
    fkt: feature-mapped keys, transposed, ``(B, K, F, Tp)``.
    v: values ``(B, Tp, K, E)``.
    chunk: chunk length (64 or 128), dividing ``Tp``.
    group: query heads per key head.
    normalize: divide by the causal normalizer.
    eps: denominator epsilon.
    interpret: ``False`` or an ``InterpretGPUParams``.

  Returns:
    ``(B, Tp, N, E)`` in ``v.dtype``.
  """
  if chunk not in mga.BLOCKS:
    raise ValueError(
      "linear_forward: the mosaic_gpu lowering needs chunk in "
      f"{mga.BLOCKS}, got chunk={chunk}"
    )
  b, tp, n, f = fq.shape
  e, dtype = v.shape[-1], v.dtype
  ev = min(e, VALUE_BLOCK)
  num_chunks = tp // chunk
  shape = (chunk, chunk)

  def kernel(q_ref, kt_ref, v_ref, *refs):
    refs = list(refs)
    den_ref = refs.pop(0) if normalize else None
    o_ref, q_smem, kt_smem, v_smem, w_smem, s_smem, o_smem = refs[:7]
    q_bar, kt_bar, v_bar = refs[7:]
    bi = jax.lax.axis_index("batch")
    ni = jax.lax.axis_index("heads")
    cols = pl.ds(jax.lax.axis_index("value") * ev, ev)
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
        v_ref.at[bi, rows, kh, cols], v_smem.at[slot], v_bar.at[slot]
      )

    fetch(0, 0)
    if num_chunks > 1:
      fetch(1, 1)
    s_smem[...] = mga._fill((f, ev), 0.0).astype(dtype)
    plgpu.commit_smem()

    def step(c, state):
      slot = jax.lax.rem(c, 2)
      rows = pl.ds(c * chunk, chunk)
      plgpu.barrier_wait(q_bar.at[slot])
      plgpu.barrier_wait(kt_bar.at[slot])
      plgpu.barrier_wait(v_bar.at[slot])
      q, kt, vc = q_smem.at[slot], kt_smem.at[slot], v_smem.at[slot]
      w = mga._matmul(shape, q, kt)  # the causal mask after: not live across it
      w = jnp.where(mga._iota(shape, 0) >= mga._iota(shape, 1), w, 0.0)
      w_smem[...] = w.astype(dtype)
      plgpu.commit_smem()
      num = mga._matmul((chunk, ev), w_smem, vc)
      num = mga._accumulate(num, q, s_smem, interpret)
      if normalize:
        den = mga._row_vector(den_ref.at[bi, ni, rows]) + eps
        num = num / mga._rows_of(den, num.shape)
      state = mga._accumulate(state, kt, vc, interpret)
      s_smem[...] = state.astype(dtype)
      plgpu.wait_smem_to_gmem(0)  # the previous chunk's output has left
      o_smem[...] = num.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bi, rows, ni, cols])

      @pl.when(c + 2 < num_chunks)
      def _():
        fetch(c + 2, slot)

      return state

    jax.lax.fori_loop(0, num_chunks, step, mga._fill((f, ev), 0.0))
    plgpu.wait_smem_to_gmem(0)

  scratch = [
    mga._smem((2, chunk, f), dtype),
    mga._smem((2, f, chunk), dtype),
    mga._smem((2, chunk, ev), dtype),
    mga._smem(shape, dtype),
    mga._smem((f, ev), dtype),
    mga._smem((chunk, ev), dtype),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
    plgpu.Barrier(num_barriers=2),
  ]
  args = [fq, fkt, v]
  if normalize:
    args.append(linear_normalizer(fq, fkt, group))
  out_type = jax.ShapeDtypeStruct((b, tp, n, e), dtype)
  # Per chunk and value block: the scores, W V, q S and the state update
  # (2 chunk (chunk (F + Ev) + 2 F Ev) flops); no transcendentals (the
  # feature map is applied outside).
  per_chunk = 2 * chunk * (chunk * (f + ev) + 2 * f * ev) * (e // ev)
  return mga._call(
    kernel,
    out_type,
    args,
    (b, n, e // ev),
    ("batch", "heads", "value"),
    scratch,
    interpret,
    "jaxnorm_causal_linear_attention_fwd_mgpu",
    mga._cost(b * n * num_chunks * per_chunk, 0, args, out_type),
  )
