"""Flash attention kernels vs `jaxnorm.attention` references, on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import attention as ref
from pallas_kernels import _rows
from pallas_kernels import attention as pa
from tests import helpers
from tests.attention import _common as attention_common
from tests.pallas_kernels import _common as pallas_common

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
# The Mosaic GPU kernels (bf16, head dims of 64) have their own tests in
# test_mosaic_gpu_attention.py; these cover Triton and Mosaic TPU.
pytestmark = pytest.mark.slow

TRITON = {"interpret": True, "backend": "triton"}
MOSAIC = {"interpret": pltpu.InterpretParams()}
_SKIP = pallas_common.TRITON_SKIP


def _qkv(key, b, t, s, n, k, h, dtype):
  kq, kk, kv = jax.random.split(key, 3)
  return tuple(
    jax.random.normal(kk_, shape, jnp.float32).astype(dtype)
    for kk_, shape in (
      (kq, (b, t, n, h)),
      (kk, (b, s, k, h)),
      (kv, (b, s, k, h)),
    )
  )


def _mask(key, b, t, s):
  m = jax.random.bernoulli(key, 0.7, (b, 1, t, s))
  return m.at[0, 0, 3].set(False)  # a fully masked query row


# (interpret, kind, dtype, kv_len, blocks): GQA with 2 query heads per key
# head everywhere; several query and key blocks so the online softmax and
# the causal early stop are exercised; a fully masked row in every mask.
CASES = [
  pytest.param(
    TRITON, "mask", jnp.float32, 50, (16, 16), id="triton-mask-f32", marks=_SKIP
  ),
  pytest.param(
    TRITON,
    "sink",
    jnp.bfloat16,
    50,
    (16, 32),
    id="triton-sink-mask-causal-bf16",
    marks=_SKIP,
  ),
  pytest.param(
    MOSAIC,
    "mask_causal",
    jnp.float32,
    130,
    (16, None),
    id="mosaic-mask-causal-f32",
  ),
  pytest.param(
    MOSAIC,
    "sink",
    jnp.float32,
    130,
    (16, None),
    id="mosaic-sink-mask-causal-f32",
  ),
  pytest.param(
    MOSAIC, "causal", jnp.bfloat16, 130, (None, None), id="mosaic-causal-bf16"
  ),
]


@pytest.mark.parametrize("interpret,kind,dtype,s,blocks", CASES)
def test_flash_matches_reference(interpret, kind, dtype, s, blocks, key):
  q, k, v = _qkv(key, 2, 40, s, 2, 1, 16, dtype)
  mask = _mask(jax.random.fold_in(key, 1), 2, 40, s)
  sinks = jnp.array([0.3, -1.0], jnp.float32)
  bq, bk = blocks
  kw = {
    "causal": dict(is_causal=True),
    "mask": dict(mask=mask),
    "mask_causal": dict(mask=mask, is_causal=True),
    "sink": dict(mask=mask, is_causal=True),
  }[kind]
  if kind == "sink":
    kernel = lambda q, k, v, sk: pa.sink_attention_pallas(
      q, k, v, sinks=sk, block_q=bq, block_k=bk, **interpret, **kw
    )
    oracle = lambda q, k, v, sk: ref.sink_attention(q, k, v, sinks=sk, **kw)
    args = (q, k, v, sinks)
  else:
    kernel = lambda q, k, v: pa.dot_product_attention_pallas(
      q, k, v, block_q=bq, block_k=bk, **interpret, **kw
    )
    oracle = lambda q, k, v: ref.dot_product_attention(q, k, v, **kw)
    args = (q, k, v)
  f32 = jnp.dtype(dtype) == jnp.float32
  tol = dict(atol=2e-5, rtol=1e-5) if f32 else dict(atol=4e-2, rtol=2e-2)
  out, vjp = jax.vjp(jax.jit(kernel), *args)
  out_ref, vjp_ref = jax.vjp(oracle, *args)
  helpers.assert_close(out, out_ref, **tol)
  ct = jax.random.normal(key, out.shape, jnp.float32).astype(out.dtype)
  grads, grads_ref = vjp(ct), vjp_ref(ct)
  assert helpers.all_finite(grads)
  for g, gr in zip(grads, grads_ref):
    assert g.dtype == gr.dtype and g.shape == gr.shape
  # the sink gradient sums over batch and queries: scale its tolerance
  helpers.assert_close(grads[:3], grads_ref[:3], **tol)
  if kind == "sink":
    helpers.assert_close(
      grads[3], grads_ref[3], atol=tol["atol"] * 100, rtol=tol["rtol"]
    )


def test_unbatched_and_vmap(key):
  q, k, v = _qkv(key, 2, 20, 24, 2, 2, 16, jnp.float32)
  f = lambda q, k, v: pa.dot_product_attention_pallas(
    q, k, v, is_causal=True, **MOSAIC
  )
  want = ref.dot_product_attention(q, k, v, is_causal=True)
  helpers.assert_close(jax.vmap(f)(q, k, v), want, atol=2e-5)
  helpers.assert_close(f(q[0], k[0], v[0]), want[0], atol=2e-5)


def test_tiling_heuristic():
  t = pa.attention_block_heuristic("triton", 4096, 4096)
  assert (t.block_q, t.block_k, t.q_len, t.kv_len) == (128, 128, 4096, 4096)
  t = pa.attention_block_heuristic("triton", 5, 70)
  assert (t.block_q, t.block_k, t.q_len, t.kv_len) == (16, 128, 16, 128)
  t = pa.attention_block_heuristic("tpu", 20, 130)
  assert (t.block_q, t.block_k, t.q_len, t.kv_len) == (24, 128, 24, 256)
  t = pa.attention_block_heuristic("mosaic_gpu", 4096, 4096)
  assert (t.block_q, t.block_k) == (64, 128)
  t = pa.attention_block_heuristic("mosaic_gpu", 64, 4096, head_dims=(256, 256))
  assert (t.block_q, t.block_k) == (64, 64)  # 128-key slots would not fit
  with pytest.raises(ValueError, match="power-of-two block_q >= 16"):
    pa.attention_block_heuristic("triton", 64, 64, block_q=24)
  with pytest.raises(ValueError, match=r"block_k in \(64, 128\)"):
    pa.attention_block_heuristic("mosaic_gpu", 64, 64, block_k=256)
  with pytest.raises(ValueError, match="multiple of 128"):
    pa.attention_block_heuristic("tpu", 64, 64, block_k=64)
  with pytest.raises(ValueError, match="block_q to be a multiple of 8"):
    pa.attention_block_heuristic("tpu", 64, 64, block_q=12)
  with pytest.raises(ValueError, match="block_k must be >= 1"):
    pa.AttentionTiling("tpu", 8, 0, 8, 128)
  with pytest.raises(ValueError, match="multiples of the blocks"):
    pa.AttentionTiling("tpu", 8, 128, 12, 128)


def test_errors(key):
  q, k, v = _qkv(key, 1, 8, 8, 2, 1, 16, jnp.float32)
  f = pa.dot_product_attention_pallas
  with pytest.raises(NotImplementedError, match="backend 'cpu'"):
    f(q, k, v)
  with pytest.raises(NotImplementedError, match="no additive bias"):
    f(q, k, v, jnp.zeros((1, 2, 8, 8)), **MOSAIC)
  with pytest.raises(NotImplementedError, match="one dtype for q, k, v"):
    f(q, k.astype(jnp.bfloat16), v, **MOSAIC)
  with pytest.raises(NotImplementedError, match="tpu kernel supports"):
    f(q.astype(jnp.float16), k, v, **MOSAIC)
  big = jax.ShapeDtypeStruct((1, 70000, 1, 16), jnp.float32)
  with pytest.raises(NotImplementedError, match="single-block budget"):
    jax.eval_shape(lambda k: f(q, k, k, **MOSAIC), big)
  with pytest.raises(TypeError, match="mask must be boolean"):
    f(q, k, v, mask=jnp.ones((1, 1, 8, 8)), **MOSAIC)
  with pytest.raises(ValueError, match="mask must be broadcastable"):
    f(q, k, v, mask=jnp.ones((1, 1, 8, 9), bool), **MOSAIC)
  with pytest.raises(ValueError, match="incompatible shapes"):
    f(q, k[..., :8], v, **MOSAIC)
  with pytest.raises(ValueError, match="must have rank 4"):
    f(q[0, 0], k[0, 0], v[0, 0], **MOSAIC)
  with pytest.raises(TypeError, match="query must have a floating"):
    f(q.astype(jnp.int32), k, v, **MOSAIC)
  with pytest.raises(ValueError, match=r"sinks must have shape \(2,\)"):
    pa.sink_attention_pallas(q, k, v, sinks=jnp.zeros((3,)), **MOSAIC)


@_SKIP
def test_triton_errors(key):
  q, k, v = _qkv(key, 1, 8, 8, 2, 1, 24, jnp.float32)
  with pytest.raises(NotImplementedError, match="power-of-two head_dim"):
    pa.dot_product_attention_pallas(q, k, v, **TRITON)


@pytest.mark.parametrize(
  "platform",
  [
    pytest.param("cuda", id="to-triton", marks=_SKIP),
    pytest.param("tpu", id="to-mosaic"),
  ],
)
def test_lowers_for_compiled_backends(monkeypatch, platform):
  # Mosaic GPU: test_mosaic_gpu_attention.py
  lowering = "triton" if platform == "cuda" else "tpu"
  monkeypatch.setattr(
    _rows, "row_lowering", lambda who, interpret, backend, *arrays: lowering
  )
  mask = jnp.ones((1, 1, 256, 256), bool)

  def fwd_bwd(q, k, v, sk):
    f = lambda q, k, v, sk: pa.sink_attention_pallas(
      q, k, v, mask=mask, sinks=sk, is_causal=True
    )
    out, vjp = jax.vjp(f, q, k, v, sk)
    return out, vjp(out)

  q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.bfloat16)
  sk = jax.ShapeDtypeStruct((4,), jnp.float32)
  checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  run = export.export(
    jax.jit(fwd_bwd), platforms=[platform], disabled_checks=checks
  )
  with attention_common.lowering_context(platform):
    text = run(q, kv, kv, sk).mlir_module()
  target = "xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
  assert text.count(target) >= 3  # forward, dq, dk/dv


@pytest.mark.parametrize(
  "interpret,variant",
  [
    pytest.param(
      TRITON, "mask-causal-train", id="triton-mask-causal-train", marks=_SKIP
    ),
    pytest.param(TRITON, "none-eval", id="triton-nomask-eval", marks=_SKIP),
    pytest.param(MOSAIC, "causal-train-layer", id="mosaic-causal-train"),
  ],
)
def test_affine_scaled_matches_reference(interpret, variant, key):
  q, k, v = _qkv(key, 2, 24, 24, 2, 1, 16, jnp.float32)
  mask = _mask(jax.random.fold_in(key, 1), 2, 24, 24)
  alpha = jax.random.uniform(jax.random.fold_in(key, 2), (2, 24, 2)) + 0.5
  kw = {
    "mask-causal-train": dict(mask=mask, is_causal=True, training=True),
    "none-eval": dict(training=False),
    "causal-train-layer": dict(is_causal=True, training=True),
  }[variant]
  ma = (
    jnp.array(0.8) if variant == "causal-train-layer" else jnp.array([0.9, 1.1])
  )
  kernel = jax.jit(
    lambda q, k, v, a: pa.affine_scaled_attention_pallas(
      q, k, v, alpha=a, alpha_ma=ma, **interpret, **kw
    )
  )
  oracle = lambda q, k, v, a: ref.affine_scaled_attention(
    q, k, v, alpha=a, alpha_ma=ma, **kw
  )
  (out, new_ma), vjp = jax.vjp(kernel, q, k, v, alpha)
  (out_ref, new_ma_ref), vjp_ref = jax.vjp(oracle, q, k, v, alpha)
  helpers.assert_close(
    (out, new_ma), (out_ref, new_ma_ref), atol=2e-5, rtol=1e-5
  )
  ct = (jax.random.normal(key, out.shape), jnp.zeros_like(new_ma))
  helpers.assert_close(vjp(ct), vjp_ref(ct), atol=5e-5, rtol=1e-5)


def test_affine_scaled_errors(key):
  q, k, v = _qkv(key, 1, 8, 8, 2, 1, 16, jnp.float32)
  f = pa.affine_scaled_attention_pallas
  a = jnp.ones((1, 8, 2))
  with pytest.raises(ValueError, match="query must be batched"):
    f(q[0], k[0], v[0], alpha=a, alpha_ma=jnp.ones(()), **MOSAIC)
  with pytest.raises(ValueError, match=r"alpha must have shape \(1, 8, 2\)"):
    f(q, k, v, alpha=a[:, :4], alpha_ma=jnp.ones(()), **MOSAIC)
  with pytest.raises(ValueError, match="alpha_ma must have shape"):
    f(q, k, v, alpha=a, alpha_ma=jnp.ones((3,)), **MOSAIC)
  with pytest.raises(ValueError, match="rho must be in"):
    f(q, k, v, alpha=a, alpha_ma=jnp.ones(()), rho=2.0, **MOSAIC)
  with pytest.raises(NotImplementedError, match="no additive bias"):
    f(
      q,
      k,
      v,
      jnp.zeros((1, 2, 8, 8)),
      alpha=a,
      alpha_ma=jnp.ones(()),
      **MOSAIC,
    )
