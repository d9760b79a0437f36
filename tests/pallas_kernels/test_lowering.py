"""Cross-lowering on CPU: the compiled GPU (Triton) and TPU (Mosaic) paths.

No accelerator is needed to run Pallas' Python lowering: `jax.export` for
``platforms=["cuda"]`` lowers every kernel to Triton MLIR (checking Triton's
power-of-two tensor sizes, masked loads and stores, scalar types) and for
``["tpu"]`` to a Mosaic custom call (checking the (8, 128) block rules and
the dimension semantics, also under vmap). What remains unchecked without a
device is the backend compilation itself (PTX, Mosaic layout passes) and
speed; those run under the ``gpu`` / ``tpu`` markers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import export

from pallas_kernels import _rows
from pallas_kernels import norms as pk

# Ids avoid the words "gpu"/"tpu", which conftest treats as device markers.
PLATFORMS = [
  pytest.param("cuda", id="to-triton"),
  pytest.param("tpu", id="to-mosaic"),
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


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernels_lower_for_the_compiled_backends(monkeypatch, platform, name):
  lowering = "gpu" if platform == "cuda" else "tpu"
  monkeypatch.setattr(_rows, "lowering_for", lambda who, interpret: lowering)
  fn = jax.jit(_fwd_bwd(KERNELS[name]))
  for shape, dtype in (((37, 96), jnp.bfloat16), ((4, 300, 1024), jnp.float32)):
    x = jax.ShapeDtypeStruct(shape, dtype)
    s = jax.ShapeDtypeStruct(shape[-1:], jnp.float32)
    exp = export.export(fn, platforms=[platform], disabled_checks=_NO_CHECK)(
      x, s
    )
    text = exp.mlir_module()
    target = "xla.gpu.triton" if platform == "cuda" else "tpu_custom_call"
    assert text.count(target) >= 2  # forward and backward kernels


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vmapped_kernel_lowers(monkeypatch, platform):
  lowering = "gpu" if platform == "cuda" else "tpu"
  monkeypatch.setattr(_rows, "lowering_for", lambda who, interpret: lowering)
  fn = jax.jit(jax.vmap(_fwd_bwd(KERNELS["rms"])))
  x = jax.ShapeDtypeStruct((3, 40, 256), jnp.bfloat16)
  s = jax.ShapeDtypeStruct((3, 256), jnp.float32)
  export.export(fn, platforms=[platform], disabled_checks=_NO_CHECK)(x, s)


def test_triton_rejects_what_the_tiling_forbids(monkeypatch):
  # The lowering really checks: a non-power-of-two tile fails in Triton.
  monkeypatch.setattr(_rows, "lowering_for", lambda who, interpret: "gpu")
  monkeypatch.setattr(_rows.RowTiling, "__post_init__", lambda self: None)
  fn = jax.jit(lambda x: pk.rms_norm_pallas(x, block_rows=12))
  with pytest.raises(Exception, match="power of 2"):
    export.export(fn, platforms=["cuda"], disabled_checks=_NO_CHECK)(
      jax.ShapeDtypeStruct((40, 128), jnp.float32)
    )
