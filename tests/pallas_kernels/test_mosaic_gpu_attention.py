"""Mosaic GPU attention kernels: the interpreter against the references, and
cross-lowering for ``"cuda"``.

The interpreter tests run the exact kernel bodies (TMA copies, barriers,
wgmma) in the Mosaic GPU interpreter, which runs their layout casts on
jax >= 0.12 only; they cost seconds each and are marked slow (CI runs them).
Flash attention has Mosaic GPU backward kernels (dq; dk/dv) where their
tiles fit (the reference's VJP otherwise); linear attention's backward is
the reference's VJP, so its gradient check covers the custom-VJP wiring. The
cross-lowering tests are fast and run on every JAX: they lower the kernels
through Mosaic GPU (layouts, TMA boxes, swizzled shared memory) without a
device.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

from jaxnorm import attention as ref
from pallas_kernels import _rows, mosaic_gpu_rows
from pallas_kernels import attention as pa
from pallas_kernels import linear_attention as pla
from pallas_kernels import mosaic_gpu_flash as mgf
from tests import helpers

INTERPRETER = pytest.mark.skipif(
  not mosaic_gpu_rows._INTERPRETER_RUNS_LAYOUTS,
  reason="this jax's Mosaic GPU interpreter does not run layout casts",
)
BF16 = dict(atol=4e-2, rtol=2e-2)


def _qkv(key, b, t, s, n, k, h, hv=None, dtype=jnp.bfloat16):
  kq, kk, kv = jax.random.split(key, 3)
  shapes = ((kq, (b, t, n, h)), (kk, (b, s, k, h)), (kv, (b, s, k, hv or h)))
  return tuple(
    jax.random.normal(r, shape, jnp.float32).astype(dtype)
    for r, shape in shapes
  )


def _mask(key, b, n, t, s):
  m = jax.random.bernoulli(key, 0.7, (b, n, t, s))
  return m.at[0, 0, 3].set(False)  # a fully masked query row


def _check_vjp(kernel, oracle, args, key, grad_tol):
  out, vjp = jax.vjp(jax.jit(kernel), *args)
  out_ref, vjp_ref = jax.vjp(oracle, *args)
  assert out.dtype == out_ref.dtype and out.shape == out_ref.shape
  helpers.assert_close(out, out_ref, **BF16)
  ct = jax.random.normal(key, out.shape, jnp.float32).astype(out.dtype)
  grads, grads_ref = vjp(ct), vjp_ref(ct)
  for g, gr in zip(grads, grads_ref, strict=True):
    assert g.dtype == gr.dtype and g.shape == gr.shape
  helpers.assert_close(grads, grads_ref, **grad_tol)


# (kind, kv_len, head dims, mask shape): odd lengths padded to the blocks,
# several key blocks (kv 130: blocks of 128 with one padded block), GQA with
# 2 query heads per key head, masks varying over batch and over heads, a
# fully masked row, a value head dim unlike the key's.
FLASH = [
  pytest.param("mask_causal", 130, (64, 64), (2, 1), id="mask-b-causal"),
  pytest.param("sink", 130, (64, 128), (1, 4), id="sink-mask-n-causal"),
  pytest.param("causal", 50, (128, 64), None, id="causal-short"),
  # head dim 128: the forward streams 128 keys, both backward kernels 64
  # (`flash_backward_blocks`), with a fully masked row and a fully padded
  # 64-key block.
  pytest.param("mask_causal", 130, (128, 128), (1, 1), id="mask-h128"),
]


@pytest.mark.slow
@INTERPRETER
@pytest.mark.parametrize("kind,s,dims,mask_bn", FLASH)
def test_flash_interpreter_matches_reference(kind, s, dims, mask_bn, key):
  h, hv = dims
  q, k, v = _qkv(key, 2, 70, s, 4, 2, h, hv)
  kw = dict(is_causal=True)
  if mask_bn is not None:
    kw["mask"] = _mask(jax.random.fold_in(key, 1), *mask_bn, 70, s)
  if kind == "sink":
    sinks = jnp.array([0.3, -1.0, 2.0, 0.0], jnp.float32)
    kernel = lambda q, k, v, sk: pa.sink_attention_pallas(
      q, k, v, sinks=sk, interpret=True, **kw
    )
    oracle = lambda q, k, v, sk: ref.sink_attention(q, k, v, sinks=sk, **kw)
    args = (q, k, v, sinks)
  else:
    kernel = lambda q, k, v: pa.dot_product_attention_pallas(
      q, k, v, interpret=True, **kw
    )
    oracle = lambda q, k, v: ref.dot_product_attention(q, k, v, **kw)
    args = (q, k, v)
  # the sink gradient sums over batch and queries: a wider atol
  _check_vjp(kernel, oracle, args, key, dict(atol=0.1, rtol=2e-2))


@pytest.mark.slow
@INTERPRETER
def test_affine_scaled_interpreter_matches_reference(key):
  q, k, v = _qkv(key, 2, 70, 70, 2, 1, 64)
  alpha = jax.random.uniform(jax.random.fold_in(key, 2), (2, 70, 2)) + 0.5
  kw = dict(alpha_ma=jnp.array([0.9, 1.1]), is_causal=True, training=True)
  kernel = jax.jit(
    lambda q, k, v, a: pa.affine_scaled_attention_pallas(
      q, k, v, alpha=a, interpret=True, **kw
    )
  )
  oracle = lambda q, k, v, a: ref.affine_scaled_attention(
    q, k, v, alpha=a, **kw
  )
  (out, ma), vjp = jax.vjp(kernel, q, k, v, alpha)
  (out_ref, ma_ref), vjp_ref = jax.vjp(oracle, q, k, v, alpha)
  helpers.assert_close((out, ma), (out_ref, ma_ref), **BF16)
  ct = (jax.random.normal(key, out.shape).astype(out.dtype), jnp.zeros_like(ma))
  helpers.assert_close(vjp(ct), vjp_ref(ct), atol=0.1, rtol=2e-2)


@pytest.mark.slow
@INTERPRETER
@pytest.mark.parametrize(
  "feature_map,normalize,t,chunk",
  [
    pytest.param("elu_plus_one", True, 150, 64, id="elu-3-chunks"),
    pytest.param("relu", False, 70, 128, id="relu-unnormalized-128"),
  ],
)
def test_linear_interpreter_matches_reference(
  feature_map, normalize, t, chunk, key
):
  q, k, v = _qkv(key, 1, t, t, 4, 2, 64)
  kw = dict(feature_map=feature_map, normalize=normalize)
  kernel = lambda q, k, v: pla.causal_linear_attention_pallas(
    q, k, v, chunk_size=chunk, interpret=True, **kw
  )
  oracle = lambda q, k, v: ref.causal_linear_attention(
    q, k, v, algorithm="quadratic", **kw
  )
  out, vjp = jax.vjp(jax.jit(kernel), q, k, v)
  want, vjp_ref = jax.vjp(oracle, q, k, v)
  assert out.dtype == want.dtype
  # bf16 operands (the state enters q @ S rounded): relative to the scale
  scale = float(jnp.max(jnp.abs(want.astype(jnp.float32))))
  helpers.assert_close(out, want, atol=2e-2 * scale, rtol=2e-2)
  ct = jax.random.normal(key, out.shape, jnp.float32).astype(out.dtype)
  helpers.assert_close(vjp(ct), vjp_ref(ct), atol=0.5, rtol=2e-2)


def _lower_as_mosaic_gpu(monkeypatch):
  monkeypatch.setattr(
    _rows, "row_lowering", lambda who, interpret, backend, *arrays: "mosaic_gpu"
  )


def _mosaic_calls(fn, *args):
  text = export.export(jax.jit(fn), platforms=["cuda"])(*args).mlir_module()
  return text.count("custom_call @mosaic_gpu")


def test_flash_lowers_to_mosaic_gpu(monkeypatch):
  _lower_as_mosaic_gpu(monkeypatch)
  mask = jnp.ones((2, 1, 200, 300), bool)

  def fwd_bwd(q, k, v, sk):
    f = lambda q, k, v, sk: pa.sink_attention_pallas(
      q, k, v, mask=mask, sinks=sk, is_causal=True
    )
    out, vjp = jax.vjp(f, q, k, v, sk)
    return out, vjp(out)

  q = jax.ShapeDtypeStruct((2, 200, 4, 128), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((2, 300, 2, 128), jnp.bfloat16)
  sk = jax.ShapeDtypeStruct((4,), jnp.float32)
  assert _mosaic_calls(fwd_bwd, q, kv, kv, sk) == 3  # forward, dq, dk/dv
  plain = lambda q, k, v: pa.dot_product_attention_pallas(q, k, v)
  x = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.float16)
  assert _mosaic_calls(plain, x, x, x) == 1
  # Head dims of 256: the dk/dv tiles exceed shared memory, so the
  # backward is the reference's VJP (XLA).
  wide = jax.ShapeDtypeStruct((1, 64, 2, 256), jnp.bfloat16)
  grad = jax.value_and_grad(
    lambda q, k, v: plain(q, k, v).astype(jnp.float32).sum()
  )
  assert _mosaic_calls(grad, wide, wide, wide) == 1


def test_linear_lowers_to_mosaic_gpu(monkeypatch):
  _lower_as_mosaic_gpu(monkeypatch)
  x = jax.ShapeDtypeStruct((2, 300, 4, 64), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((2, 300, 2, 64), jnp.bfloat16)
  # chunks of 64 (value head dim 128, where 128 would not fit) and of 128
  for normalize, v in ((True, x.update(shape=(2, 300, 2, 128))), (False, k)):
    fn = lambda q, k, v, n=normalize: pla.causal_linear_attention_pallas(
      q, k, v, normalize=n, chunk_size=128
    )
    assert _mosaic_calls(fn, x, k, v) == 1


def test_mosaic_gpu_refuses_what_it_lacks(monkeypatch, key):
  # Every refusal comes before a kernel runs, so on any jax.
  monkeypatch.setattr(mosaic_gpu_rows, "_INTERPRETER_RUNS_LAYOUTS", True)
  q, k, v = _qkv(key, 1, 8, 8, 2, 1, 64, dtype=jnp.float32)
  f = pa.dot_product_attention_pallas
  lin = pla.causal_linear_attention_pallas
  for fn in (f, lin):
    with pytest.raises(NotImplementedError, match="mosaic_gpu kernel multip"):
      fn(q, k, v, interpret=True)
  q, k, v = (a.astype(jnp.bfloat16) for a in (q, k, v))
  for fn in (f, lin):
    with pytest.raises(NotImplementedError, match="value head_dim to be a m"):
      fn(q, k, v[..., :48], interpret=True)
  with pytest.raises(NotImplementedError, match="head_dim to be a multiple"):
    f(q[..., :32], k[..., :32], v, interpret=True)
  with pytest.raises(ValueError, match=r"block_q in \(64, 128\)"):
    f(q, k, v, block_q=32, interpret=True)
  q2, k2, v2 = _qkv(key, 1, 8, 8, 2, 1, 256)
  with pytest.raises(NotImplementedError, match="shared-memory tiles"):
    f(q2, k2, v2, block_k=128, interpret=True)
  with pytest.raises(NotImplementedError, match="head_dim up to 128"):
    lin(q2, k2, v2, interpret=True)
  monkeypatch.setattr(mosaic_gpu_rows, "_INTERPRETER_RUNS_LAYOUTS", False)
  for fn in (f, lin):
    with pytest.raises(NotImplementedError, match="does not run the layout"):
      fn(q, k, v, interpret=True)


def test_heuristic_blocks():
  t = pa.attention_block_heuristic("mosaic_gpu", 70, 130)
  assert (t.block_q, t.block_k, t.q_len, t.kv_len) == (64, 128, 128, 256)
  t = pa.attention_block_heuristic("mosaic_gpu", 8, 50)
  assert (t.block_q, t.block_k, t.q_len, t.kv_len) == (64, 64, 64, 64)
  # The backward's own tiles: dq keeps 128 keys up to head dim 64, dk/dv
  # take 64 x 64.
  assert mgf.flash_backward_blocks(128, 64) == ((64, 128), (64, 64))
  assert mgf.flash_backward_blocks(128, 128) == ((64, 64), (64, 64))
  assert mgf.flash_backward_blocks(64, 64) == ((64, 64), (64, 64))


@pytest.mark.skipif(
  not mosaic_gpu_rows._KERNEL_TAKES_COST,
  reason="this jax's plgpu.kernel takes no cost estimate",
)
def test_flash_cost_estimates(monkeypatch):
  _lower_as_mosaic_gpu(monkeypatch)

  def fwd_bwd(q, k, v):
    f = lambda q, k, v: pa.dot_product_attention_pallas(q, k, v, is_causal=True)
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(out)

  x = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.bfloat16)
  text = export.export(jax.jit(fwd_bwd), platforms=["cuda"])(x, x, x)
  costs = re.findall(
    r"cost_estimate_json = \"\{\\22flops\\22: (\d+), "
    r"\\22transcendentals\\22: (\d+), \\22bytes_accessed\\22: (\d+)",
    text.mlir_module(),
  )
  tile = 64 * 128  # the forward's and dq's tiles; dk/dv's are 64 x 64
  # Per head, causal: the forward and dq visit 1 + 1 + 2 + 2 tiles of the
  # 4 x 2, dk/dv 4 + 3 + 2 + 1 of the 4 x 4; flops per tile element are
  # 2 (H + Hv), 2 (2 H + Hv) and 4 (H + Hv); exponentials one per element
  # (the forward's one more per row and step). The forward reads q, k, v
  # and writes out and its two float32 statistics.
  fwd = (2 * 6 * tile * 256, 2 * 6 * 64 * 129, 4 * 256 * 2 * 64 * 2 + 4096)
  dq = 2 * 6 * tile * 384
  dkv = 2 * 10 * (tile // 2) * 512
  flops = sorted(int(c[0]) for c in costs)
  assert flops == [fwd[0], dq, dkv]
  assert tuple(int(c) for c in costs[0]) == fwd


def _gpu_dispatch(monkeypatch):
  """Dispatch sees a GPU; the flash kernel runs interpreted; its outcomes
  ("ran" or "refused") are recorded."""
  from tests.pallas_kernels import _common as c

  c.fake_target(monkeypatch)
  calls = []
  kernel = pa.dot_product_attention_pallas

  def recorded(*a, **kw):
    try:
      out = kernel(*a, interpret=True, **kw)
    except NotImplementedError:
      calls.append("refused")
      raise
    calls.append("ran")
    return out

  monkeypatch.setattr(pa, "dot_product_attention_pallas", recorded)
  return calls


def test_none_on_gpu_falls_back_where_mosaic_gpu_refuses(monkeypatch, key):
  calls = _gpu_dispatch(monkeypatch)
  monkeypatch.setattr(mosaic_gpu_rows, "_INTERPRETER_RUNS_LAYOUTS", True)
  for dtype, h in ((jnp.float32, 64), (jnp.bfloat16, 48)):
    q, k, v = _qkv(key, 1, 8, 8, 2, 1, h, dtype=dtype)
    got = ref.dot_product_attention(q, k, v, is_causal=True)
    want = ref.dot_product_attention(
      q, k, v, is_causal=True, implementation="xla"
    )
    helpers.assert_close(got, want, atol=0.0)
  assert calls == ["refused", "refused"]  # tried, then the reference ran


@pytest.mark.slow
@INTERPRETER
def test_none_on_gpu_picks_mosaic_gpu(monkeypatch, key):
  calls = _gpu_dispatch(monkeypatch)
  q, k, v = _qkv(key, 1, 8, 8, 2, 1, 64)
  got = ref.dot_product_attention(q, k, v, is_causal=True)
  want = ref.dot_product_attention(
    q, k, v, is_causal=True, implementation="xla"
  )
  assert calls == ["ran"]
  helpers.assert_close(got, want, **BF16)
