"""Compiled kernels on a real GPU / TPU (skipped elsewhere by conftest)."""

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
    lambda x, s, b: pk.dyt_pallas(x, jnp.float32(0.5), s, b),
    lambda x, s, b: norms.dyt(x, jnp.float32(0.5), s, b),
    2,
  ),
  "seed": (
    lambda x, g, a, b: pk.seed_norm_pallas(x, g, a, b * 0.1, num_heads=4),
    lambda x, g, a, b: norms.seed_norm(x, g, a, b * 0.1, num_heads=4),
    3,
  ),
  "add_rms": (
    lambda x, s: pk.add_rms_norm_pallas(x, x * 0.5, s),
    lambda x, s: fused_norms.add_rms_norm(x, x * 0.5, s, implementation="xla"),
    1,
  ),
}


def _run(name, dtype, key):
  kernel, ref, nparams = CASES[name]
  x, ps = c.inputs(key, (1000, 1536), dtype, nparams)
  c.check_fwd_vjp(
    kernel, ref, (x, *ps), key=key, n=1536, dtype=dtype, nrows=1000
  )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_on_gpu(name, dtype, key):
  _run(name, dtype, key)


@pytest.mark.tpu
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_on_tpu(name, dtype, key):
  _run(name, dtype, key)
