"""Compiled kernels on a real GPU / TPU (skipped elsewhere by conftest).

On a GPU both lowerings run: Mosaic GPU (the default) and Triton
(``backend="triton"``, expecting JAX's deprecation where it emits one).
999 rows leave the Mosaic GPU grid a shifted last block.
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jaxnorm import fused_norms, norms
from pallas_kernels import norms as pk
from tests.pallas_kernels import _common as c

CASES = {
  "rms": (pk.rms_norm_pallas, norms.rms_norm, 1),
  "layer": (pk.layer_norm_pallas, norms.layer_norm, 2),
  "dyt": (
    lambda x, s, b, **kw: pk.dyt_pallas(x, jnp.float32(0.5), s, b, **kw),
    lambda x, s, b: norms.dyt(x, jnp.float32(0.5), s, b),
    2,
  ),
  "seed": (
    lambda x, g, a, b, **kw: pk.seed_norm_pallas(
      x, g, a, b * 0.1, num_heads=4, **kw
    ),
    lambda x, g, a, b: norms.seed_norm(x, g, a, b * 0.1, num_heads=4),
    3,
  ),
  "add_rms": (
    lambda x, s, **kw: pk.add_rms_norm_pallas(x, x * 0.5, s, **kw),
    lambda x, s: fused_norms.add_rms_norm(x, x * 0.5, s, implementation="xla"),
    1,
  ),
  "add_layer": (
    lambda x, s, b, **kw: pk.add_layer_norm_pallas(x, x * 0.5, s, b, **kw),
    lambda x, s, b: fused_norms.add_layer_norm(
      x, x * 0.5, s, b, implementation="xla"
    ),
    2,
  ),
}
SHAPES = [
  pytest.param((1000, 1536), id="1000x1536"),
  pytest.param((999, 768), id="999x768"),
]


def _run(name, dtype, shape, key, **kw):
  kernel, ref, nparams = CASES[name]
  x, ps = c.inputs(key, shape, dtype, nparams)
  c.check_fwd_vjp(
    lambda *a: kernel(*a, **kw),
    ref,
    (x, *ps),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=shape[0],
  )


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_on_gpu(name, dtype, shape, key):
  _run(name, dtype, shape, key)


@pytest.mark.gpu
@c.TRITON_SKIP
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_triton_on_gpu(name, dtype, key):
  with c.expect_triton_deprecation():
    _run(name, dtype, (1000, 1536), key, backend="triton")


@pytest.mark.tpu
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_on_tpu(name, dtype, key):
  _run(name, dtype, (1000, 1536), key)
