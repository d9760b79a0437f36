"""Every kernel compiled for the chips its users have, without the chips.

Each case compiles one program (forward and backward where the kernel has
one) through the public jaxnorm function with ``implementation=None`` under
``jax.set_mesh`` of a deviceless topology (`jaxnorm.aot.topology`), so the
lowering and tiling are those dispatch picks on the chip: the real compilers
run (XLA:GPU, Mosaic GPU, ptxas; XLA:TPU and Mosaic TPU in libtpu). A case
asserts that the kernel is in the compiled program (``mosaic_gpu``,
``tpu_custom_call``, the Triton custom call) where jaxnorm documents a
lowering for it and that the XLA reference was compiled where it documents
none (`_expected`), and on GPU parses the ptxas report
(``MOSAIC_GPU_DUMP_PTXAS=1``, read from the process's stdout): zero spill
bytes and no wgmma serialized for lack of registers.

The matrix: every norm kernel at features 1024, 1152 (an odd multiple of
128), 4096, 8192 and 16384 in bfloat16 and float32 on H100, v5e and v6e,
and a subset on H200, A100 and v5p; every attention kernel (causal, boolean
mask, sinks, GQA, affine-scaled, chunked causal linear) at head dims 64, 128
and 256 on H100, v5e and v6e, sequence 2048 (32768 for causal attention),
float32 on one head dim, and causal attention on the other chips; the
kernels split over a 2x2 TPU mesh and an 8-GPU mesh. At 32768 tokens the
TPU flash kernels, which hold one head's keys and values in one VMEM block
(`pallas_kernels.attention.kv_budget`), refuse, and so does the XLA
reference's compile (its (T, T) logits exceed the HBM): that case asserts
the kernel's refusal.
"""

from __future__ import annotations

import contextlib
import functools
import os

os.environ.setdefault("MOSAIC_GPU_DUMP_PTXAS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxnorm import aot, attention, fused_norms, norms  # noqa: E402
from pallas_kernels import _rows, dyt_seed  # noqa: E402
from pallas_kernels import mosaic_gpu_linear as mgl  # noqa: E402
from pallas_kernels import norms as pk  # noqa: E402
from tests.pallas_kernels import _common as c  # noqa: E402

pytestmark = pytest.mark.aot

_CALLS = {
  "mosaic_gpu": "custom_call @mosaic_gpu",
  "triton": "__gpu$xla.gpu.triton",
  "tpu": "custom_call @tpu_custom_call",
}
_ANY_KERNEL = tuple(_CALLS.values())


@functools.cache
def _mesh(name):
  return aot.topology(name)


def _one_device(chip):
  return (
    f"{chip}:1"
    if aot.CHIPS[chip].platform == "gpu"
    else ("v5p:1x1x1" if chip == "v5p" else f"{chip}:1x1")
  )


def _lowering(chip):
  """The row/flash lowering dispatch picks for ``chip`` (or a device kind)."""
  spec = aot.CHIPS.get(chip) or aot.chip_of(chip)
  chip = spec.name
  if spec.platform == "tpu":
    return "tpu"
  return "mosaic_gpu" if chip in ("h100", "h200") else "triton"


def _compile(chip_or_mesh, fn, *args, capfd, shardings=None):
  """Compiles ``fn(*args)`` for a chip; returns (HLO text, ptxas stdout)."""
  mesh = chip_or_mesh
  if isinstance(mesh, str):
    mesh = _mesh(_one_device(mesh))
  capfd.readouterr()
  with jax.set_mesh(mesh):
    if shardings is not None:
      args = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s))
        for a, s in zip(args, shardings, strict=True)
      ]
    triton = _lowering(mesh.devices.flat[0].device_kind) == "triton"
    with c.expect_triton_deprecation() if triton else contextlib.nullcontext():
      lowered = jax.jit(fn).lower(*args)
      text = lowered.as_text()
      lowered.compile()
  return text, capfd.readouterr().out


def _check(chip, text, out, expect_kernel):
  lowering = _lowering(chip)
  if expect_kernel:
    assert _CALLS[lowering] in text, f"no {lowering} kernel for {chip}"
  else:
    assert not any(call in text for call in _ANY_KERNEL), (
      f"a kernel was compiled for {chip} where jaxnorm documents none"
    )
  if expect_kernel and lowering == "mosaic_gpu":
    assert "serialized due to insufficient register" not in out, out
    for k in aot.parse_ptxas(out):
      assert k.spill_stores == k.spill_loads == 0, k


def _fwd_bwd(f, num_args):
  """``f``'s output and its VJP for all ``num_args`` leading arguments."""

  def run(*args):
    y, vjp = jax.vjp(lambda *a: f(*a, *args[num_args:]), *args[:num_args])
    return y, vjp(jax.tree.map(jnp.ones_like, y))

  return run


# name -> (function of x and parameters, number of (d,) parameters, number
# of differentiated row arrays)
NORMS = {
  "rms": (lambda x, s: norms.rms_norm(x, s), 1, 1),
  "layer": (lambda x, s, b: norms.layer_norm(x, s, b), 2, 1),
  "add_rms": (lambda x, r, s: fused_norms.add_rms_norm(x, r, s), 1, 2),
  "add_layer": (
    lambda x, r, s, b: fused_norms.add_layer_norm(x, r, s, b),
    2,
    2,
  ),
  "dyt": (lambda x, s, b: norms.dyt(x, jnp.float32(0.5), s, b), 2, 1),
  "seed": (
    lambda x, s, d, p: norms.seed_norm(x, s, d, p, num_heads=2),
    3,
    1,
  ),
}
FEATURES = (1024, 1152, 4096, 8192, 16384)
_FULL_CHIPS = ("h100", "v5e", "v6e")


def _norm_cases():
  for chip in ("h100", "h200", "a100", "v5e", "v5p", "v6e"):
    for name in NORMS:
      for feats in FEATURES:
        for dtype in ("bfloat16", "float32"):
          subset = (feats, dtype) in ((1152, "bfloat16"), (8192, "bfloat16"))
          subset = subset or (feats, dtype) == (4096, "float32")
          if chip in _FULL_CHIPS or subset:
            yield pytest.param(
              chip, name, feats, dtype, id=f"{chip}-{name}-{feats}-{dtype}"
            )


_GPU_BLOCK_ELEMS = {
  "dyt": dyt_seed.DYT_GPU_BLOCK_ELEMS,
  "seed": dyt_seed.SEED_GPU_BLOCK_ELEMS,
}


def _norm_has_kernel(chip, name, features):
  """Where jaxnorm documents a norm kernel (`_rows.norm_block_heuristic`)."""
  if _lowering(chip) == "mosaic_gpu":
    limit = _GPU_BLOCK_ELEMS.get(name, _rows.MOSAIC_GPU_BLOCK_ELEMS)
    unit = _rows._mosaic_gpu_min_rows(features)
    return unit * features <= limit
  return features <= _rows.MAX_FEATURES and (
    _lowering(chip) != "triton" or _rows.triton_available()
  )


@pytest.mark.parametrize("chip,name,features,dtype", list(_norm_cases()))
def test_norm_kernels_compile(chip, name, features, dtype, capfd):
  f, num_params, num_rows = NORMS[name]
  x = jax.ShapeDtypeStruct((2, 2048, features), jnp.dtype(dtype))
  p = jax.ShapeDtypeStruct((features,), jnp.float32)
  args = [x] * num_rows + [p] * num_params
  text, out = _compile(
    chip, _fwd_bwd(f, num_rows + num_params), *args, capfd=capfd
  )
  has_kernel = _norm_has_kernel(chip, name, features)
  _check(chip, text, out, has_kernel)
  if has_kernel:  # the forward and the backward kernel
    assert text.count(_CALLS[_lowering(chip)]) == 2


def _attention_args(variant, b, t, n, k, h, dtype):
  dt = jnp.dtype(dtype)
  q = jax.ShapeDtypeStruct((b, t, n, h), dt)
  kv = jax.ShapeDtypeStruct((b, t, k, h), dt)
  if variant == "causal" or variant == "gqa":
    return (
      (
        lambda q, k, v: attention.dot_product_attention(q, k, v, is_causal=True)
      ),
      (q, kv, kv),
      3,
    )
  if variant == "mask":
    every_third = (jnp.arange(t) % 3 == 0)[None, :]
    mask = (jnp.tril(jnp.ones((t, t), bool)) | every_third)[None, None]
    return (
      (lambda q, k, v: attention.dot_product_attention(q, k, v, mask=mask)),
      (q, kv, kv),
      3,
    )
  if variant == "sinks":
    s = jax.ShapeDtypeStruct((n,), jnp.float32)
    return (
      (
        lambda q, k, v, s: attention.sink_attention(
          q, k, v, sinks=s, is_causal=True
        )
      ),
      (q, kv, kv, s),
      4,
    )
  if variant == "affine":
    alpha = jax.ShapeDtypeStruct((b, t, n), jnp.float32)
    return (
      (
        lambda q, k, v, a: attention.affine_scaled_attention(
          q, k, v, alpha=a, alpha_ma=jnp.float32(1.0), is_causal=True
        )[0]
      ),
      (q, kv, kv, alpha),
      3,
    )
  assert variant == "linear"
  return (
    (lambda q, k, v: attention.causal_linear_attention(q, k, v)),
    (q, kv, kv),
    0,
  )


def _attention_has_kernel(chip, variant, h, dtype, t):
  lowering = _lowering(chip)
  if lowering == "mosaic_gpu":
    wide = variant == "linear" and h > mgl.LINEAR_MAX_HEAD_DIM
    return dtype != "float32" and not wide
  if lowering == "triton":
    return _rows.triton_available() and t * 2 * h * jnp.dtype(
      dtype
    ).itemsize <= (4 << 20)
  if variant == "linear":
    return True
  budget = _rows.tpu_scoped_vmem(aot.CHIPS[chip]) // 4
  return t * 2 * h * jnp.dtype(dtype).itemsize <= budget


def _attention_cases():
  variants = ("causal", "mask", "sinks", "gqa", "affine", "linear")
  for chip in _FULL_CHIPS:
    for variant in variants:
      for h in (64, 128, 256):
        yield pytest.param(
          chip, variant, h, "bfloat16", 2048, id=f"{chip}-{variant}-{h}-bf16"
        )
      yield pytest.param(
        chip, variant, 128, "float32", 2048, id=f"{chip}-{variant}-128-f32"
      )
    yield pytest.param(
      chip, "causal", 128, "bfloat16", 32768, id=f"{chip}-causal-128-bf16-32k"
    )
  for chip in ("h200", "a100", "v5p"):
    yield pytest.param(
      chip, "causal", 128, "bfloat16", 2048, id=f"{chip}-causal-128-bf16"
    )


@pytest.mark.parametrize("chip,variant,h,dtype,t", list(_attention_cases()))
def test_attention_kernels_compile(chip, variant, h, dtype, t, capfd):
  n, k = (8, 2) if variant == "gqa" else (4, 4)
  f, args, num_diff = _attention_args(variant, 1, t, n, k, h, dtype)
  fn = _fwd_bwd(f, num_diff) if num_diff else f
  has_kernel = _attention_has_kernel(chip, variant, h, dtype, t)
  if not has_kernel and t > 8192:
    # No kernel, and the reference's (T, T) logits exceed the chip's HBM:
    # the kernel's refusal names its budget before any compiler runs.
    with jax.set_mesh(_mesh(_one_device(chip))):
      with pytest.raises(NotImplementedError, match="single-block budget"):
        jax.jit(
          lambda q, k, v: attention.dot_product_attention(
            q, k, v, is_causal=True, implementation="pallas"
          )
        ).lower(*args)
    return
  text, out = _compile(chip, fn, *args, capfd=capfd)
  _check(chip, text, out, has_kernel)


def test_norm_kernels_split_over_a_tpu_mesh(capfd):
  mesh = _mesh("v5e:2x2")
  f, _, _ = NORMS["rms"]
  x = jax.ShapeDtypeStruct((8, 1024, 4096), jnp.bfloat16)
  s = jax.ShapeDtypeStruct((4096,), jnp.float32)
  text, _ = _compile(
    mesh, _fwd_bwd(f, 2), x, s, capfd=capfd, shardings=(P("x", "y"), P())
  )
  assert text.count(_CALLS["tpu"]) == 2
  assert "shard_map" in text or "sdy.manual_computation" in text


def test_attention_kernels_split_over_an_8_gpu_mesh(capfd):
  mesh = _mesh("h100:8")
  f, args, num_diff = _attention_args("causal", 2, 2048, 8, 8, 128, "bfloat16")
  spec = P(None, None, "x")
  text, out = _compile(
    mesh, _fwd_bwd(f, num_diff), *args, capfd=capfd, shardings=(spec,) * 3
  )
  assert "custom_call @mosaic_gpu" in text
  assert "sdy.manual_computation" in text or "shard_map" in text
  _check("h100", text, out, True)


def test_a_tiling_that_cannot_fit_is_refused_before_the_compiler():
  for chip in ("v5e", "v5p", "v6e"):
    with jax.set_mesh(_mesh(_one_device(chip))):
      with pytest.raises(NotImplementedError, match=f"scoped limit of {chip}"):
        jax.jit(lambda x, s: pk.rms_norm_pallas(x, s, block_rows=512)).lower(
          jax.ShapeDtypeStruct((4096, 16384), jnp.float32),
          jax.ShapeDtypeStruct((16384,), jnp.float32),
        )
  with jax.set_mesh(_mesh("h100:1")):
    with pytest.raises(NotImplementedError, match="that fit without spilling"):
      jax.jit(lambda x, s: pk.rms_norm_pallas(x, s, block_rows=64)).lower(
        jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16),
        jax.ShapeDtypeStruct((4096,), jnp.float32),
      )
