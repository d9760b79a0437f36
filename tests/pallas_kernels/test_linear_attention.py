"""Chunked causal linear attention kernel vs the jnp reference, on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import attention as ref
from pallas_kernels import _rows
from pallas_kernels import linear_attention as pla
from tests import helpers
from tests.attention import _common as attention_common
from tests.pallas_kernels import _common as pallas_common

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
# The Mosaic GPU kernel (bf16, head dims of 64) has its own tests in
# test_mosaic_gpu_attention.py; these cover Triton and Mosaic TPU.
pytestmark = pytest.mark.slow

TRITON = {"interpret": True, "backend": "triton"}
MOSAIC = {"interpret": pltpu.InterpretParams()}
_SKIP = pallas_common.TRITON_SKIP


def _qkv(key, dtype, t=45):
  ks = jax.random.split(key, 3)
  shapes = ((2, t, 4, 16), (2, t, 2, 16), (2, t, 2, 16))
  return tuple(
    jax.random.normal(k, s, jnp.float32).astype(dtype)
    for k, s in zip(ks, shapes)
  )


@pytest.mark.parametrize(
  "interpret,feature_map,normalize,dtype",
  [
    pytest.param(
      TRITON, "elu_plus_one", True, jnp.float32, id="triton-elu", marks=_SKIP
    ),
    pytest.param(
      TRITON, "identity", False, jnp.bfloat16, id="triton-id-bf16", marks=_SKIP
    ),
    pytest.param(MOSAIC, "relu", True, jnp.float32, id="mosaic-relu"),
    pytest.param(
      MOSAIC,
      "elu_plus_one",
      True,
      jnp.bfloat16,
      id="mosaic-elu-bf16",
    ),
  ],
)
def test_matches_quadratic_reference(
  interpret, feature_map, normalize, dtype, key
):
  q, k, v = _qkv(key, dtype)
  kw = dict(feature_map=feature_map, normalize=normalize, chunk_size=16)
  kernel = jax.jit(
    lambda q, k, v: pla.causal_linear_attention_pallas(
      q, k, v, **interpret, **kw
    )
  )
  oracle = lambda q, k, v: ref.causal_linear_attention(
    q, k, v, algorithm="quadratic", **kw
  )
  f32 = jnp.dtype(dtype) == jnp.float32
  # unnormalized identity-map sums reach ~|45 * 16|: scale atol with them
  tol = dict(atol=5e-5, rtol=1e-5) if f32 else dict(atol=5e-2, rtol=2e-2)
  out, vjp = jax.vjp(kernel, q, k, v)
  out_ref, vjp_ref = jax.vjp(oracle, q, k, v)
  assert out.dtype == dtype
  helpers.assert_close(out, out_ref, **tol)
  ct = jax.random.normal(key, out.shape, jnp.float32).astype(dtype)
  helpers.assert_close(
    vjp(ct), vjp_ref(ct), **(tol if f32 else dict(atol=0.5, rtol=2e-2))
  )


def test_errors(key):
  q, k, v = _qkv(key, jnp.float32, t=8)
  f = pla.causal_linear_attention_pallas
  with pytest.raises(NotImplementedError, match="backend 'cpu'"):
    f(q, k, v)
  with pytest.raises(ValueError, match="feature_map must be one of"):
    f(q, k, v, feature_map="softmax", **MOSAIC)
  with pytest.raises(ValueError, match="chunk_size must be a positive"):
    f(q, k, v, chunk_size=0, **MOSAIC)
  with pytest.raises(ValueError, match="N % K == 0"):
    f(q, k[:, :4], v, **MOSAIC)
  with pytest.raises(NotImplementedError, match="tpu kernel supports"):
    f(q.astype(jnp.float16), k, v, **MOSAIC)
  with pytest.raises(TypeError, match="value must have a floating"):
    f(q, k, v.astype(jnp.int32), **MOSAIC)
  big = jax.ShapeDtypeStruct((1, 100000, 1, 16), jnp.float32)
  with pytest.raises(NotImplementedError, match="single-block budget"):
    jax.eval_shape(lambda x: f(x, x, x, **MOSAIC), big)


@_SKIP
def test_triton_errors(key):
  q, k, v = _qkv(key, jnp.float32, t=8)
  with pytest.raises(NotImplementedError, match="power-of-two head_dim"):
    pla.causal_linear_attention_pallas(q[..., :12], k[..., :12], v, **TRITON)


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
  x = jax.ShapeDtypeStruct((2, 512, 4, 64), jnp.bfloat16)
  checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  run = export.export(
    jax.jit(lambda q, k, v: pla.causal_linear_attention_pallas(q, k, v)),
    platforms=[platform],
    disabled_checks=checks,
  )
  with attention_common.lowering_context(platform):
    text = run(x, x, x).mlir_module()
  assert ("xla.gpu.triton" if platform == "cuda" else "tpu_custom_call") in text
