"""DyT and SeeDNorm kernels vs `jaxnorm.norms.dyt` / `seed_norm` on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxnorm import norms
from pallas_kernels import norms as pk
from tests.pallas_kernels import _common as c

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
pytestmark = pytest.mark.slow

_DYT_CASES = [
  pytest.param(jnp.float32, (37, 96), None, id="f32-37x96"),
  pytest.param(jnp.bfloat16, (37, 96), None, id="bf16-37x96"),
  pytest.param(jnp.float32, (3, 13, 128), 16, id="f32-3x13x128-br16"),
]


@pytest.mark.parametrize(
  "lw,dtype,shape,block_rows",
  c.cases(_DYT_CASES, {"bf16-37x96", "f32-3x13x128-br16"}),
)
def test_dyt_matches_reference(lw, dtype, shape, block_rows, key):
  br = c.block_rows_for(lw, block_rows, dtype)
  x, (s, b) = c.inputs(key, shape, dtype, 2)
  alpha = jnp.array(0.7, jnp.float32)
  c.check_fwd_vjp(
    lambda x, a, s, b: pk.dyt_pallas(x, a, s, b, block_rows=br, **lw),
    lambda x, a, s, b: norms.dyt(x, a, s, b),
    (x, alpha, s, b),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=x.size // shape[-1],
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_dyt_without_params_alpha_shape_1(lw, key):
  x, _ = c.inputs(key, (3, 4, 24), jnp.float32, 0)
  alpha = jnp.array([0.3], jnp.float32)
  c.check_fwd_vjp(
    lambda x, a: pk.dyt_pallas(x, a, axis=(-2, -1), **lw),
    lambda x, a: norms.dyt(x, a, axis=(-2, -1)),
    (x, alpha),
    key=key,
    n=96,
    dtype=jnp.float32,
    nrows=3,
  )


_SEED_CASES = [
  pytest.param(jnp.float32, 1, False, id="f32-1head"),
  pytest.param(jnp.float32, 4, True, id="f32-4heads-div"),
  pytest.param(jnp.bfloat16, 3, False, id="bf16-3heads"),
]


@pytest.mark.parametrize(
  "lw,dtype,num_heads,div",
  c.cases(_SEED_CASES, {"f32-4heads-div", "bf16-3heads"}),
)
def test_seed_norm_matches_reference(lw, dtype, num_heads, div, key):
  shape = (37, 96)
  br = c.block_rows_for(lw, 16, dtype)
  x, (g, a, bt) = c.inputs(key, shape, dtype, 3)
  bt = bt * 0.1  # keep tanh off saturation so the dynamic term matters
  kw = dict(num_heads=num_heads, dyn_scale_div_dim=div, eps=1e-5)
  c.check_fwd_vjp(
    lambda x, g, a, bt: pk.seed_norm_pallas(
      x, g, a, bt, block_rows=br, **lw, **kw
    ),
    lambda x, g, a, bt: norms.seed_norm(x, g, a, bt, **kw),
    (x, g, a, bt),
    key=key,
    n=96,
    dtype=dtype,
    nrows=37,
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_vmap(lw, key):
  x, (g, a, bt) = c.inputs(key, (2, 9, 32), jnp.float32, 3)
  y = jax.vmap(
    lambda xi: pk.seed_norm_pallas(xi, g, a, bt * 0.1, num_heads=2, **lw)
  )(x)
  yr = norms.seed_norm(x, g, a, bt * 0.1, num_heads=2)
  c.helpers.assert_close(y, yr, atol=1e-5, rtol=1e-5)
  y = jax.vmap(lambda xi, al: pk.dyt_pallas(xi, al, g, **lw))(
    x, jnp.array([0.5, 1.5])
  )
  yr = jnp.stack([norms.dyt(x[0], 0.5, g), norms.dyt(x[1], 1.5, g)])
  c.helpers.assert_close(y, yr, atol=1e-6, rtol=1e-6)


def test_errors():
  x = jnp.ones((4, 32))
  p = jnp.ones((32,))
  with pytest.raises(ValueError, match="alpha must be a scalar"):
    pk.dyt_pallas(x, jnp.ones((2,)), interpret=True)
  with pytest.raises(TypeError, match="alpha must have a floating"):
    pk.dyt_pallas(x, jnp.ones((), jnp.int32), interpret=True)
  with pytest.raises(NotImplementedError, match="trailing axes only"):
    pk.dyt_pallas(x, 0.5, jnp.ones((4,)), axis=0, interpret=True)
  with pytest.raises(NotImplementedError, match="at most 64 heads"):
    pk.seed_norm_pallas(
      jnp.ones((2, 2080)),
      *[jnp.ones((2080,))] * 3,
      num_heads=65,
      interpret=True,
    )
  with pytest.raises(ValueError, match="divisible by num_heads=3"):
    pk.seed_norm_pallas(x, p, p, p, num_heads=3, interpret=True)
  with pytest.raises(ValueError, match="dyn_proj is required"):
    pk.seed_norm_pallas(x, p, p, None, interpret=True)
  with pytest.raises(ValueError, match="axis must be a single int"):
    pk.seed_norm_pallas(x, p, p, p, axis=(0, 1), interpret=True)
  with pytest.raises(ValueError, match="num_heads must be a positive"):
    pk.seed_norm_pallas(x, p, p, p, num_heads=0, interpret=True)
