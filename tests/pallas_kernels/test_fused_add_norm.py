"""Fused residual-add + norm kernels vs `jaxnorm.fused_norms` references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import fused_norms
from pallas_kernels import norms as pk
from tests import helpers
from tests.pallas_kernels import _common as c

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
pytestmark = pytest.mark.slow


def _xr(key, shape, dtype):
  x, _ = c.inputs(key, shape, dtype, 0)
  r, _ = c.inputs(jax.random.fold_in(key, 1), shape, dtype, 0, loc=-1.0)
  return x, r


@pytest.mark.parametrize(
  "lw,dtype,shape,block_rows",
  c.grid(c.SHAPES[:2], {("bf16", "37x96"), ("f32", "3x13x128-br16")}),
)
def test_add_rms_norm_matches_reference(lw, dtype, shape, block_rows, key):
  br = c.block_rows_for(lw, block_rows, dtype)
  x, r = _xr(key, shape, dtype)
  _, (s,) = c.inputs(key, shape, dtype, 1)
  c.check_fwd_vjp(
    lambda x, r, s: pk.add_rms_norm_pallas(x, r, s, block_rows=br, **lw),
    lambda x, r, s: fused_norms.add_rms_norm(x, r, s, implementation="xla"),
    (x, r, s),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=x.size // shape[-1],
  )


@pytest.mark.parametrize("lw,dtype", c.cases(c.DTYPES, {"f32"}))
def test_add_layer_norm_matches_reference(lw, dtype, key):
  shape = (37, 96)
  br = c.block_rows_for(lw, 16, dtype)
  x, r = _xr(key, shape, dtype)
  _, (s, b) = c.inputs(key, shape, dtype, 2)
  c.check_fwd_vjp(
    lambda x, r, s, b: pk.add_layer_norm_pallas(
      x, r, s, b, scale_offset=0.5, block_rows=br, **lw
    ),
    lambda x, r, s, b: fused_norms.add_layer_norm(
      x, r, s, b, scale_offset=0.5, implementation="xla"
    ),
    (x, r, s, b),
    key=key,
    n=96,
    dtype=dtype,
    nrows=37,
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_mixed_dtypes_stream_in_residual_dtype(lw, key):
  # bf16 branch output into an f32 stream: h and y come back in float32.
  x, r = _xr(key, (24, 64), jnp.float32)
  x = x.astype(jnp.bfloat16)
  h, y = jax.jit(lambda x, r: pk.add_rms_norm_pallas(x, r, **lw))(x, r)
  assert h.dtype == y.dtype == jnp.float32
  c.check_fwd_vjp(
    lambda x, r: pk.add_rms_norm_pallas(x, r, **lw),
    lambda x, r: fused_norms.add_rms_norm(x, r, implementation="xla"),
    (x, r),
    key=key,
    n=64,
    dtype=jnp.float32,
    nrows=24,
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_vmap(lw, key):
  x, r = _xr(key, (2, 12, 32), jnp.float32)
  h, y = jax.vmap(lambda a, b: pk.add_layer_norm_pallas(a, b, **lw))(x, r)
  hr, yr = fused_norms.add_layer_norm(x, r, implementation="xla")
  helpers.assert_close((h, y), (hr, yr), atol=1e-5, rtol=1e-5)


def test_errors():
  x = jnp.ones((4, 32))
  with pytest.raises(ValueError, match=r"residual must have shape \(4, 32\)"):
    pk.add_rms_norm_pallas(x, jnp.ones((4, 8)), interpret=True)
  with pytest.raises(TypeError, match="residual must have a floating"):
    pk.add_layer_norm_pallas(x, jnp.ones((4, 32), jnp.int32), interpret=True)
  with pytest.raises(NotImplementedError, match="tpu kernel supports"):
    pk.add_rms_norm_pallas(
      x, x.astype(jnp.float16), interpret=pltpu.InterpretParams()
    )
  with pytest.raises(ValueError, match="eps_mode must be one of"):
    pk.add_rms_norm_pallas(x, x, eps_mode="x", interpret=True)
