"""Shared grid, tolerances and checks for the interpret-mode kernel tests.

All three row-kernel lowerings run on CPU, each in its own interpreter: the
Mosaic GPU kernel (``interpret=True``, the default backend) in the Mosaic
GPU interpreter, the Triton kernel (``backend="triton"``) in the generic
interpreter (skipped where the installed JAX has no Triton lowering), and
the Mosaic TPU kernel (``pltpu.InterpretParams()``) in the TPU interpreter,
which fills out-of-range block padding with NaN, so a missing row mask shows
up as NaN gradients. Arrays stay at a few KiB and grids at <= 16 steps
(PERFORMANCE.md 3.5).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import _target
from pallas_kernels import _rows
from tests import helpers

H100 = _target.Target("gpu", "NVIDIA H100 80GB HBM3", "test", (9, 0))


def fake_target(monkeypatch, target=H100):
  """Dispatch and the kernels' lowering see ``target`` (a `_target.Target`)."""
  monkeypatch.setattr(_target, "current", lambda *arrays: target)


TRITON_SKIP = pytest.mark.skipif(
  not _rows.triton_available(),
  reason="the installed jax has no Pallas Triton lowering",
)
# Each lowering as the keyword arguments that select it. Ids avoid the words
# "gpu"/"tpu" (device markers).
MOSAIC_GPU = {"interpret": True}
TRITON = {"interpret": True, "backend": "triton"}
MOSAIC_TPU = {"interpret": pltpu.InterpretParams()}
LOWERINGS = [
  pytest.param(MOSAIC_GPU, id="mgpu"),
  pytest.param(TRITON, id="triton", marks=TRITON_SKIP),
  pytest.param(MOSAIC_TPU, id="mtpu"),
]
DTYPES = [
  pytest.param(jnp.float32, id="f32"),
  pytest.param(jnp.bfloat16, id="bf16"),
]
# (shape, block_rows): rows not a multiple of the block, widths not a power
# of two (Triton pads columns), several trailing dims, a single partial
# block; 5x40 is a width the Mosaic GPU kernel rejects (`unsupported`).
SHAPES = [
  pytest.param((37, 96), None, id="37x96"),
  pytest.param((3, 13, 128), 16, id="3x13x128-br16"),
  pytest.param((5, 40), 8 * 2, id="5x40-br16"),
]


def cases(params, mosaic_gpu_ids):
  """``(lowering, *case)`` params: every case for Triton and Mosaic TPU, the
  cases whose ids are in ``mosaic_gpu_ids`` for Mosaic GPU (whose interpreter
  costs seconds a call).
  """
  return [
    pytest.param(lw.values[0], *p.values, id=f"{lw.id}-{p.id}", marks=lw.marks)
    for lw in LOWERINGS
    for p in params
    if lw.id != "mgpu" or p.id in mosaic_gpu_ids
  ]


def grid(shapes, mosaic_gpu_cases):
  """``(lowering, dtype, shape, block_rows)`` params: Triton and Mosaic TPU
  over every dtype and shape, Mosaic GPU (whose interpreter costs seconds a
  call) over ``mosaic_gpu_cases``, ``(dtype id, shape id)`` pairs.
  """
  out = []
  for lw in LOWERINGS:
    for dt in DTYPES:
      for sh in shapes:
        if lw.id == "mgpu" and (dt.id, sh.id) not in mosaic_gpu_cases:
          continue
        out.append(
          pytest.param(
            lw.values[0],
            *dt.values,
            *sh.values,
            id=f"{lw.id}-{dt.id}-{sh.id}",
            marks=lw.marks,
          )
        )
  return out


# Per-dtype base tolerances, scaled by sqrt(reduced length) (STYLE.md 9.3).
# float32 base 2e-6: at XLA:CPU's lowest LLVM level (tests/conftest.py) the
# kernel and the reference round multiply-adds differently, which moves a
# gradient over 96 features by up to ~1.2e-5 (measured).
_BASE = {"float32": 2e-6, "bfloat16": 1e-3}
_RTOL = {"float32": 1e-5, "bfloat16": 2e-2}


def tol(dtype, n: int) -> dict[str, float]:
  name = jnp.dtype(dtype).name
  return {"atol": _BASE[name] * math.sqrt(n), "rtol": _RTOL[name]}


def block_rows_for(lowering, block_rows, dtype):
  """The TPU lowering needs a multiple of 16 rows for 16-bit dtypes."""
  if block_rows is None or lowering is not MOSAIC_TPU:
    return block_rows
  sub = 16 if jnp.dtype(dtype).itemsize == 2 else 8
  return max(sub, block_rows // sub * sub)


def unsupported(lowering, features):
  """``pytest.raises`` for a width the Mosaic GPU kernel lacks, else a no-op.

  The Mosaic GPU kernel needs ``features % 32 == 0``
  (`_rows.mosaic_gpu_split`); the other lowerings take any width.
  """
  if lowering is MOSAIC_GPU and features % 32:
    return pytest.raises(NotImplementedError, match="multiple of 32")
  return contextlib.nullcontext()


def triton_target():
  """Context naming an H100 as the Triton cross-lowering's target device.

  Lowering to Triton reads the GPU's compute capability; without a GPU,
  jax 0.12 takes it from the abstract device of an abstract mesh (and
  raises otherwise), while jax 0.10 assumes a default.
  """
  mesh = jax.sharding.AbstractMesh(
    (1,),
    ("x",),
    abstract_device=jax.sharding.AbstractDevice("NVIDIA H100", None, "gpu"),
  )
  return jax.sharding.use_abstract_mesh(mesh)


@functools.cache
def triton_lowering_warns() -> bool:
  """Whether lowering a Pallas kernel to Triton emits JAX's deprecation.

  Feature detection, not a version check: cross-lowers a one-element
  Triton kernel once and looks for the warning.
  """
  if not _rows.triton_available():
    return False

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]

  fn = jax.jit(
    lambda x: pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
      compiler_params=_rows.pltr.CompilerParams(),
    )(x)
  )
  with warnings.catch_warnings(record=True) as caught, triton_target():
    warnings.simplefilter("always")
    jax.export.export(
      fn,
      platforms=["cuda"],
      disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
      ],
    )(jax.ShapeDtypeStruct((16,), jnp.float32))
  return any(
    issubclass(w.category, DeprecationWarning)
    and "Triton backend is deprecated" in str(w.message)
    for w in caught
  )


def expect_triton_deprecation():
  """Expects JAX's Triton deprecation where lowering to Triton emits it."""
  if triton_lowering_warns():
    return pytest.warns(
      DeprecationWarning, match="Pallas Triton backend is deprecated"
    )
  return contextlib.nullcontext()


def inputs(key, shape, dtype, num_params, *, loc=0.5, scale=2.0):
  kx, *kp = jax.random.split(key, num_params + 1)
  x = (jax.random.normal(kx, shape, jnp.float32) * scale + loc).astype(dtype)
  ps = [jax.random.normal(k, shape[-1:], jnp.float32) * 0.5 + 1.0 for k in kp]
  return x, ps


def check_fwd_vjp(kernel_fn, ref_fn, args, *, key, n, dtype, nrows):
  """Forward and VJP of the jitted kernel against the reference.

  Row outputs use tol(dtype, n); parameter gradients, summed over ``nrows``
  rows, use the float32 tol(n * nrows) scaled by their largest entry.
  """
  k = jax.jit(kernel_fn)
  out, vjp = jax.vjp(k, *args)
  out_ref, vjp_ref = jax.vjp(ref_fn, *args)
  helpers.assert_close(out, out_ref, **tol(dtype, n))
  leaves, treedef = jax.tree.flatten(out)
  keys = jax.random.split(key, len(leaves))
  cot = jax.tree.unflatten(
    treedef,
    [
      jax.random.normal(kk, leaf.shape, jnp.float32).astype(leaf.dtype)
      for kk, leaf in zip(keys, leaves)
    ],
  )
  grads, grads_ref = vjp(cot), vjp_ref(cot)
  assert helpers.all_finite(grads)
  for g, gr in zip(grads, grads_ref):
    assert g.dtype == gr.dtype and g.shape == gr.shape
    if g.shape == args[0].shape:
      helpers.assert_close(g, gr, **tol(dtype, n))
    else:
      # Parameter gradients are float32 sums over rows whose terms may
      # cancel, so the error scales with the largest entry.
      t = tol(jnp.float32, n * nrows)
      t["atol"] *= max(1.0, float(jnp.max(jnp.abs(gr))))
      helpers.assert_close(g, gr, **t)
