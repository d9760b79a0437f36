"""Shared grid, tolerances and checks for the interpret-mode kernel tests.

Both lowerings run on CPU: ``interpret=True`` executes the GPU (Triton
semantics) kernel in the generic interpreter and ``pltpu.InterpretParams()``
the TPU (Mosaic) kernel in the TPU interpreter, which fills out-of-range
block padding with NaN, so a missing row mask shows up as NaN gradients.
Arrays stay at a few KiB and grids at <= 16 steps (PERFORMANCE.md 3.5).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from tests import helpers

LOWERINGS = [
  pytest.param(True, id="triton"),
  pytest.param(pltpu.InterpretParams(), id="mosaic"),
]
DTYPES = [
  pytest.param(jnp.float32, id="f32"),
  pytest.param(jnp.bfloat16, id="bf16"),
]
# (shape, block_rows): rows not a multiple of the block, widths not a power
# of two (GPU pads columns), several trailing dims, a single partial block.
SHAPES = [
  pytest.param((37, 96), None, id="37x96"),
  pytest.param((3, 13, 128), 16, id="3x13x128-br16"),
  pytest.param((5, 40), 8 * 2, id="5x40-br16"),
]

# Per-dtype base tolerances, scaled by sqrt(reduced length) (STYLE.md 9.3).
_BASE = {"float32": 1e-6, "bfloat16": 1e-3}
_RTOL = {"float32": 1e-5, "bfloat16": 2e-2}


def tol(dtype, n: int) -> dict[str, float]:
  name = jnp.dtype(dtype).name
  return {"atol": _BASE[name] * math.sqrt(n), "rtol": _RTOL[name]}


def block_rows_for(interpret, block_rows, dtype):
  """The TPU lowering needs a multiple of 16 rows for 16-bit dtypes."""
  if block_rows is None or not isinstance(interpret, pltpu.InterpretParams):
    return block_rows
  sub = 16 if jnp.dtype(dtype).itemsize == 2 else 8
  return max(sub, block_rows // sub * sub)


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
