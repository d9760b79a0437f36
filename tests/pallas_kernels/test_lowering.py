"""Cross-lowering on CPU: the compiled Mosaic GPU, Triton and Mosaic TPU paths.

No accelerator is needed to run Pallas' Python lowering: `jax.export` for
``platforms=["cuda"]`` lowers every kernel to a Mosaic GPU custom call
(checking the register layouts, the reductions across lanes and warps and
the global-memory transfers Mosaic GPU derives from them) or, with
``backend="triton"``, to Triton MLIR (power-of-two tensor sizes, masked loads
and stores), and for ``["tpu"]`` to a Mosaic TPU custom call (the (8, 128)
block rules and the dimension semantics, also under vmap). What remains
unchecked without a device is the backend compilation itself (PTX, Mosaic
layout passes) and speed; those run under the ``gpu`` / ``tpu`` markers.

Lowering to Triton emits JAX's deprecation of its Pallas Triton backend
where the installed JAX does (detected by `_common.triton_lowering_warns`),
so those tests expect it; they are skipped where Triton is gone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export

from pallas_kernels import _rows
from pallas_kernels import norms as pk
from tests.pallas_kernels import _common as c

# (export platform, row lowering, custom call target). Ids avoid the words
# "gpu"/"tpu" (device markers).
PLATFORMS = [
  pytest.param(("cuda", "mosaic_gpu", "@mosaic_gpu"), id="to-mosaic-g"),
  pytest.param(
    ("cuda", "triton", "@__gpu$xla.gpu.triton"),
    id="to-triton",
    marks=c.TRITON_SKIP,
  ),
  pytest.param(("tpu", "tpu", "@tpu_custom_call"), id="to-mosaic-t"),
]
_NO_CHECK = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]

KERNELS = {
  "rms": lambda x, s: pk.rms_norm_pallas(x, s, eps_mode="outside"),
  "layer": lambda x, s: pk.layer_norm_pallas(x, s, s),
  "add_rms": lambda x, s: pk.add_rms_norm_pallas(x, x, s),
  "add_layer": lambda x, s: pk.add_layer_norm_pallas(x, x, s, s),
  "dyt": lambda x, s: pk.dyt_pallas(x, jnp.float32(0.5), s, s),
  "seed": lambda x, s: pk.seed_norm_pallas(x, s, s, s, num_heads=2),
}


def _fwd_bwd(f):
  def run(x, s):
    y, vjp = jax.vjp(f, x, s)
    return y, vjp(y)

  return run


def _lower_as(monkeypatch, lowering):
  monkeypatch.setattr(
    _rows, "row_lowering", lambda who, interpret, backend, *arrays: lowering
  )


def _export(fn, platform, lowering, *args):
  run = export.export(fn, platforms=[platform], disabled_checks=_NO_CHECK)
  if lowering != "triton":
    return run(*args)
  with c.triton_target(), c.expect_triton_deprecation():
    return run(*args)


@pytest.mark.parametrize("target", PLATFORMS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernels_lower_for_the_compiled_backends(monkeypatch, target, name):
  platform, lowering, call = target
  _lower_as(monkeypatch, lowering)
  fn = jax.jit(_fwd_bwd(KERNELS[name]))
  for shape, dtype in (((37, 96), jnp.bfloat16), ((4, 300, 1024), jnp.float32)):
    x = jax.ShapeDtypeStruct(shape, dtype)
    s = jax.ShapeDtypeStruct(shape[-1:], jnp.float32)
    text = _export(fn, platform, lowering, x, s).mlir_module()
    # The forward and the backward kernel.
    assert text.count(f"custom_call {call}") == 2


@pytest.mark.parametrize(
  "shape,dtype",
  [
    pytest.param((5, 4096), jnp.float16, id="f16-widest"),
    pytest.param((3, 7, 768), jnp.bfloat16, id="bf16-2-warps-per-row"),
    pytest.param((3, 32), jnp.float32, id="f32-padded-rows"),
  ],
)
def test_mosaic_gpu_layouts_lower(monkeypatch, shape, dtype):
  # The other register splits of `mosaic_gpu_split`, float16, and an input
  # with fewer rows than one block.
  _lower_as(monkeypatch, "mosaic_gpu")
  fn = jax.jit(_fwd_bwd(KERNELS["add_layer"]))
  x = jax.ShapeDtypeStruct(shape, dtype)
  s = jax.ShapeDtypeStruct(shape[-1:], jnp.float32)
  text = _export(fn, "cuda", "mosaic_gpu", x, s).mlir_module()
  assert text.count("custom_call @mosaic_gpu") == 2  # forward and backward


@pytest.mark.parametrize("target", PLATFORMS)
def test_vmapped_kernel_lowers(monkeypatch, target):
  platform, lowering, _ = target
  _lower_as(monkeypatch, lowering)
  fn = jax.jit(jax.vmap(_fwd_bwd(KERNELS["rms"])))
  x = jax.ShapeDtypeStruct((3, 40, 256), jnp.bfloat16)
  s = jax.ShapeDtypeStruct((3, 256), jnp.float32)
  _export(fn, platform, lowering, x, s)


@c.TRITON_SKIP
def test_triton_rejects_what_the_tiling_forbids(monkeypatch):
  # The lowering really checks: a non-power-of-two tile fails in Triton.
  _lower_as(monkeypatch, "triton")
  monkeypatch.setattr(_rows.RowTiling, "__post_init__", lambda self: None)
  fn = jax.jit(lambda x: pk.rms_norm_pallas(x, block_rows=12))
  with pytest.raises(Exception, match="power of 2"):
    _export(fn, "cuda", "triton", jax.ShapeDtypeStruct((40, 128), jnp.float32))


def test_mosaic_gpu_rejects_what_the_split_avoids(monkeypatch):
  # The lowering really checks the layout: 8-float vectors (32 bytes a
  # thread) are rejected as global-memory transfers (jax 0.12) and overflow
  # the scratch of a reduction across warps (jax 0.10), which is why
  # `MOSAIC_GPU_VECTOR` is 4.
  _lower_as(monkeypatch, "mosaic_gpu")
  monkeypatch.setattr(_rows, "MOSAIC_GPU_VECTOR", 8)
  fn = jax.jit(_fwd_bwd(KERNELS["rms"]))
  x = jax.ShapeDtypeStruct((40, 128), jnp.float32)
  s = jax.ShapeDtypeStruct((128,), jnp.float32)
  with pytest.raises(Exception, match="reduction|vector length > 16 bytes"):
    _export(fn, "cuda", "mosaic_gpu", x, s)
