r"""Chunked causal linear attention: a Pallas forward kernel, GPU and TPU.

Kernel of `jaxnorm.attention.causal_linear_attention` (chunked form). One
program per (batch, head) walks the sequence chunk by chunk, keeping the
running state :math:`S = \sum_j \phi(k_j) v_j^T` (``(F, Hv)``) and
normalizer :math:`z = \sum_j \phi(k_j)` in float32 registers / VMEM:

.. math::
  \mathrm{num}_c = \mathrm{tril}(\phi(Q_c) \phi(K_c)^T) V_c
  + \phi(Q_c) S,\quad
  \mathrm{den}_c = \mathrm{rowsum}(\mathrm{tril}(\cdot)) + \phi(Q_c) z

so each chunk costs two ``(C, C)`` and two ``(C, F)`` matmuls and the whole
pass reads ``q, k, v`` once. The feature map is applied in the wrapper
(element-wise, fused by XLA into the padding copy); padded keys are zero
after the map, so they add nothing.

Lowerings (``backend=``, `_rows.row_lowering`): ``"mosaic_gpu"``, the GPU
default (`pallas_kernels.mosaic_gpu_linear.linear_forward`: the same
recurrence on warpgroup MMAs, chunks streamed by TMA, the key chunk fed
transposed so both of its products take it as a plain operand);
``"triton"`` while the installed JAX has it, behind that explicit choice;
``"mosaic_tpu"``. The last two run the kernel below.

Backward: the VJP of the jnp chunked reference (recomputed), until a
backward kernel exists (STYLE.md 2). Unsupported (``NotImplementedError``):
on Mosaic GPU, dtypes other than bfloat16/float16 and feature/value head
dims that are not multiples of 64 up to 256 (chunks become 64 or 128); on
Triton, head dims or chunk sizes that are not powers of two >= 16; on
Triton and TPU, per-head sequences above the on-chip budget.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jaxtyping import Array, Float

from jaxnorm import _checks
from jaxnorm.attention import linear as reference
from pallas_kernels import _rows, sharding
from pallas_kernels import mosaic_gpu_attention as mga
from pallas_kernels import mosaic_gpu_linear as mgl

# q, k, v of one head sit in one block (the kernel slices the chunks).
MAX_HEAD_BYTES = 8 << 20


def _dot(a, b):
  return jax.lax.dot_general(
    a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
  )


def _kernel(chunk, num_chunks, normalize, eps, q_ref, k_ref, v_ref, o_ref):
  f, e = q_ref.shape[-1], v_ref.shape[-1]
  row = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
  col = jax.lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
  tri = row >= col

  def body(i, carry):
    state, z = carry  # (F, E), (1, F)
    sl = pl.ds(i * chunk, chunk)
    q = q_ref[sl, :].astype(jnp.float32)
    k = k_ref[sl, :].astype(jnp.float32)
    v = v_ref[sl, :].astype(jnp.float32)
    w = jnp.where(tri, _dot(q, k.T), 0.0)
    num = _dot(w, v) + _dot(q, state)
    if normalize:
      den = jnp.sum(w, axis=1, keepdims=True) + jnp.sum(
        q * z, axis=1, keepdims=True
      )
      num = num / (den + eps)
    o_ref[sl, :] = num.astype(o_ref.dtype)
    return state + _dot(k.T, v), z + jnp.sum(k, axis=0, keepdims=True)

  jax.lax.fori_loop(
    0,
    num_chunks,
    body,
    (jnp.zeros((f, e), jnp.float32), jnp.zeros((1, f), jnp.float32)),
  )


def _forward(fq, fk, v, *, chunk, group, normalize, eps, lowering, interpret):
  b, n, tp, f = fq.shape
  e = v.shape[-1]
  spec = lambda w, kv: pl.BlockSpec(  # noqa: E731
    (pl.squeezed, pl.squeezed, tp, w),
    (lambda b, h: (b, jax.lax.div(h, group), 0, 0))
    if kv
    else (lambda b, h: (b, h, 0, 0)),
  )
  if lowering == "triton":
    params = _rows.pltr.CompilerParams(num_warps=4, num_stages=1)
  elif isinstance(interpret, pltpu.InterpretParams):
    params = pltpu.CompilerParams()
  else:
    params = pltpu.CompilerParams(dimension_semantics=("parallel",) * 2)
  return pl.pallas_call(
    functools.partial(_kernel, chunk, tp // chunk, normalize, eps),
    out_shape=jax.ShapeDtypeStruct((b, n, tp, e), v.dtype),
    grid=(b, n),
    in_specs=[spec(f, False), spec(f, True), spec(e, True)],
    out_specs=spec(e, False),
    compiler_params=params,
    interpret=interpret,
    name="jaxnorm_causal_linear_attention_fwd",
    # Per chunk: the matmuls q k^T, w v, q S and k^T v, and the sums into
    # num, S, z; normalizing adds the row sums of w and q z, and a division.
    cost_estimate=pl.CostEstimate(
      flops=(b * n * (tp // chunk))
      * (
        2 * chunk * (chunk * (f + e) + 2 * f * e)
        + chunk * (e + f)
        + f * (e + 1)
        + (chunk * (chunk + 2 * f + e + 2) if normalize else 0)
      ),
      transcendentals=0,
      bytes_accessed=sum(a.size * a.dtype.itemsize for a in (fq, fk, v))
      + b * n * tp * e * v.dtype.itemsize,
    ),
  )(fq, fk, v)


@sharding.on_mesh_heads
def causal_linear_attention_pallas(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B T K H"],
  value: Float[Array, "B T K Hv"],
  *,
  feature_map: reference.FeatureMap = "elu_plus_one",
  normalize: bool = True,
  eps: float = 1e-6,
  chunk_size: int = 64,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "B T N Hv"]:
  r"""Chunked causal linear attention with a Pallas forward kernel.

  Same maths and arguments as `jaxnorm.attention.causal_linear_attention`
  (this is its ``algorithm="chunked"``, with the reference's feature-map
  table `jaxnorm.attention.linear.FEATURE_MAPS`; ``chunk_size`` is the
  kernel's block):

  .. math:: \mathrm{out}_i = \frac{\sum_{j \le i} (\phi(q_i)\cdot\phi(k_j))
     v_j}{\sum_{j \le i} \phi(q_i)\cdot\phi(k_j) + \epsilon}

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, T, K, H)``, ``N % K == 0``.
    value: ``(B, T, K, Hv)``.
    feature_map: ``"elu_plus_one"``, ``"relu"`` or ``"identity"``.
    normalize: divide by the running normalizer.
    eps: denominator epsilon.
    chunk_size: queries per chunk (clipped to the sequence length, then
      64 or 128 on Mosaic GPU, rounded to a power of two >= 16 on Triton and
      to a multiple of 8 on TPU).
    backend: ``"mosaic_gpu"`` (the GPU default), ``"triton"`` (while the
      installed JAX has it), ``"mosaic_tpu"`` or ``None`` (the device
      default).
    interpret: ``True`` runs the ``backend`` kernel in its interpreter
      (Mosaic GPU's by default), ``pltpu.InterpretParams()`` the TPU kernel
      in the TPU interpreter, ``False`` compiles.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    TypeError: on non-floating inputs.
    ValueError: on mismatched shapes or options.
    NotImplementedError: for a case the kernel does not cover.

  References:
    Katharopoulos et al., *Transformers are RNNs*, arXiv:2006.16236 (2020);
    Hua et al., *Transformer Quality in Linear Time*, arXiv:2202.10447
    (2022).
  """
  who = "causal_linear_attention_pallas"
  _checks.check_choice(
    who, "feature_map", feature_map, tuple(reference.FEATURE_MAPS)
  )
  _checks.check_positive_int(who, "chunk_size", chunk_size)
  for name, a in (("query", query), ("key", key), ("value", value)):
    _checks.check_floating(who, name, a)
  query, key, value = map(jnp.asarray, (query, key, value))
  lowering = _rows.row_lowering(who, interpret, backend, query)
  interpret = _rows.interpreter(lowering, interpret)
  if (
    query.ndim != 4
    or key.shape[:2] != query.shape[:2]
    or (
      key.shape[-1] != query.shape[-1]
      or query.shape[2] % key.shape[2]
      or value.shape[:-1] != key.shape[:-1]
    )
  ):
    raise ValueError(
      f"{who}: need query (B, T, N, H), key (B, T, K, H) and "
      f"value (B, T, K, Hv) with N % K == 0, got "
      f"{query.shape=}, {key.shape=}, {value.shape=}"
    )
  for a in (query, key, value):
    _rows.check_dtype(who, a.dtype, lowering)
  b, t, n, h = query.shape
  hv = value.shape[-1]
  c = min(chunk_size, t)
  if lowering == "mosaic_gpu":
    mga.check_supported(who, query.dtype, {"head_dim": h, "value head_dim": hv})
    mga.check_interpreter(who, interpret)
    if h > mgl.LINEAR_MAX_HEAD_DIM:
      raise NotImplementedError(
        f"{who}: the mosaic_gpu kernel keeps an (head_dim, 64) float32 state "
        f"in registers and supports head_dim up to "
        f"{mgl.LINEAR_MAX_HEAD_DIM} (ptxas spills at 256), got head_dim={h}; "
        "use the reference (implementation='xla')"
      )
    size = query.dtype.itemsize
    # Chunks of 128 where their tiles fit shared memory and, with the
    # (F, 64) state and normalizer, the registers: a (128, 128) score tile
    # is 128 float32 per thread, which spills beside F = 128 (ptxas).
    wide = mgl.linear_smem_bytes(128, h, hv, size) <= mga.SMEM_BUDGET
    wide = wide and h <= mga.HEAD_DIM_UNIT
    c = 128 if c > 64 and wide else 64
    mga.check_smem(
      who,
      mgl.linear_smem_bytes(c, h, hv, size),
      f"chunk={c}, head dims {h}, {hv}",
    )
  elif lowering == "triton":
    c = max(16, pl.next_power_of_2(c))
    for name, dim in (("head_dim", h), ("value head_dim", hv)):
      if dim < 16 or dim & (dim - 1):
        raise NotImplementedError(
          f"{who}: the triton kernel needs a power-of-two {name} "
          f">= 16, got {dim}; use the reference (implementation='xla')"
        )
  else:
    c = pl.cdiv(c, 8) * 8
  tp = pl.cdiv(t, c) * c
  nbytes = tp * (2 * h + hv) * query.dtype.itemsize
  if lowering != "mosaic_gpu" and nbytes > MAX_HEAD_BYTES:
    raise NotImplementedError(
      f"{who}: one head's q, k, v ({nbytes} bytes padded) exceed the "
      f"single-block budget of {MAX_HEAD_BYTES} bytes; use the reference "
      "(implementation='xla')"
    )
  static = dict(
    chunk=c,
    group=n // key.shape[2],
    normalize=bool(normalize),
    eps=float(eps),
    lowering=lowering,
    interpret=interpret,
  )
  return _linear(
    query, key, value, feature_map, chunk_size, tuple(sorted(static.items()))
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _linear(query, key, value, feature_map, chunk_size, static):
  st = dict(static)
  phi = reference.FEATURE_MAPS[feature_map]
  t, c = query.shape[1], st["chunk"]
  tp = pl.cdiv(t, c) * c

  def prep(x, mapped):
    x = jnp.swapaxes(x, 1, 2)
    if mapped:
      x = phi(x.astype(jnp.float32)).astype(x.dtype)
    # pad after the map: padded keys must be exactly zero
    return jnp.pad(x, ((0, 0), (0, 0), (0, tp - t), (0, 0)))

  if st["lowering"] == "mosaic_gpu":
    # keys transposed to (B, K, F, Tp): the kernel's plain matmul operand
    fkt = jnp.swapaxes(prep(key, True), 2, 3)
    out = mgl.linear_forward(
      jnp.swapaxes(prep(query, True), 1, 2),
      fkt,
      jnp.swapaxes(prep(value, False), 1, 2),
      chunk=c,
      group=st["group"],
      normalize=st["normalize"],
      eps=st["eps"],
      interpret=st["interpret"],
    )
    return out[:, :t].astype(query.dtype)
  out = _forward(prep(query, True), prep(key, True), prep(value, False), **st)
  return jnp.swapaxes(out[:, :, :t], 1, 2).astype(query.dtype)


def _linear_fwd(query, key, value, feature_map, chunk_size, static):
  out = _linear(query, key, value, feature_map, chunk_size, static)
  return out, (query, key, value)


def _linear_bwd(feature_map, chunk_size, static, res, g):
  st = dict(static)

  def ref(q, k, v):
    return reference.causal_linear_attention(
      q,
      k,
      v,
      feature_map=feature_map,
      normalize=st["normalize"],
      eps=st["eps"],
      chunk_size=chunk_size,
      algorithm="chunked",
      implementation="xla",
    )

  _, vjp = jax.vjp(ref, *res)
  return vjp(g)


_linear.defvjp(_linear_fwd, _linear_bwd)
