"""RMSNorm / LayerNorm kernels vs `jaxnorm.norms`, both lowerings, on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import norms
from pallas_kernels import _rows
from pallas_kernels import norms as pk
from tests import helpers
from tests.pallas_kernels import _common as c

TPU = pltpu.InterpretParams()


@pytest.mark.parametrize("interpret", c.LOWERINGS)
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("shape,block_rows", c.SHAPES)
def test_rms_norm_matches_reference(interpret, dtype, shape, block_rows, key):
  br = c.block_rows_for(interpret, block_rows, dtype)
  x, (s,) = c.inputs(key, shape, dtype, 1)
  c.check_fwd_vjp(
    lambda x, s: pk.rms_norm_pallas(x, s, block_rows=br, interpret=interpret),
    lambda x, s: norms.rms_norm(x, s),
    (x, s),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=x.size // shape[-1],
  )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("shape,block_rows", c.SHAPES[:2])
def test_layer_norm_matches_reference(interpret, dtype, shape, block_rows, key):
  br = c.block_rows_for(interpret, block_rows, dtype)
  x, (s, b) = c.inputs(key, shape, dtype, 2)
  c.check_fwd_vjp(
    lambda x, s, b: pk.layer_norm_pallas(
      x, s, b, block_rows=br, interpret=interpret
    ),
    lambda x, s, b: norms.layer_norm(x, s, b),
    (x, s, b),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=x.size // shape[-1],
  )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
@pytest.mark.parametrize(
  "kwargs",
  [
    dict(eps_mode="outside", eps=1e-3),
    dict(scale_offset=1.0),
    dict(eps=0.5),
  ],
  ids=["outside", "offset", "eps"],
)
def test_rms_norm_options(interpret, kwargs, key):
  x, (s,) = c.inputs(key, (24, 48), jnp.float32, 1)
  x = x.at[3].set(0.0)  # an all-zero row: the "outside" bwd guard
  c.check_fwd_vjp(
    lambda x, s: pk.rms_norm_pallas(x, s, interpret=interpret, **kwargs),
    lambda x, s: norms.rms_norm(x, s, **kwargs),
    (x, s),
    key=key,
    n=48,
    dtype=jnp.float32,
    nrows=24,
  )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
def test_no_params_and_two_trailing_axes(interpret, key):
  x, _ = c.inputs(key, (6, 4, 24), jnp.float32, 0)
  for kernel, ref in (
    (pk.rms_norm_pallas, norms.rms_norm),
    (pk.layer_norm_pallas, norms.layer_norm),
  ):
    c.check_fwd_vjp(
      lambda x: kernel(x, axis=(-2, -1), scale_offset=0.5, interpret=interpret),
      lambda x: ref(x, axis=(-2, -1), scale_offset=0.5),
      (x,),
      key=key,
      n=96,
      dtype=jnp.float32,
      nrows=6,
    )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
def test_layer_norm_scale_only_and_bias_only(interpret, key):
  x, (p,) = c.inputs(key, (16, 40), jnp.float32, 1)
  c.check_fwd_vjp(
    lambda x, p: pk.layer_norm_pallas(x, p, None, interpret=interpret),
    lambda x, p: norms.layer_norm(x, p, None),
    (x, p),
    key=key,
    n=40,
    dtype=jnp.float32,
    nrows=16,
  )
  c.check_fwd_vjp(
    lambda x, p: pk.layer_norm_pallas(x, None, p, interpret=interpret),
    lambda x, p: norms.layer_norm(x, None, p),
    (x, p),
    key=key,
    n=40,
    dtype=jnp.float32,
    nrows=16,
  )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
def test_large_mean_layer_norm_is_two_pass(interpret, key):
  # |mean| >> std: a one-pass E[x^2] - E[x]^2 would lose every digit.
  x, (s, b) = c.inputs(key, (16, 64), jnp.float32, 2, loc=1e4, scale=1.0)
  y = jax.jit(lambda x: pk.layer_norm_pallas(x, s, b, interpret=interpret))(x)
  helpers.assert_close(y, norms.layer_norm(x, s, b), atol=2e-3)


@pytest.mark.parametrize("interpret", c.LOWERINGS)
def test_vmap_and_grad_under_jit(interpret, key):
  x, (s,) = c.inputs(key, (3, 10, 32), jnp.float32, 1)

  def loss(fn):
    return lambda x, s: jnp.sum(jnp.sin(jax.vmap(lambda xi: fn(xi, s))(x)))

  kern = jax.jit(
    jax.grad(
      loss(
        lambda xi, s: pk.rms_norm_pallas(
          xi, s, block_rows=8, interpret=interpret
        )
      ),
      argnums=(0, 1),
    )
  )
  ref = jax.grad(loss(lambda xi, s: norms.rms_norm(xi, s)), argnums=(0, 1))
  helpers.assert_close(kern(x, s), ref(x, s), atol=1e-5, rtol=1e-5)
  y = jax.vmap(
    lambda xi: pk.layer_norm_pallas(xi, s, s, interpret=interpret),
    in_axes=1,
    out_axes=1,
  )(x)
  helpers.assert_close(y, norms.layer_norm(x, s, s), atol=1e-5, rtol=1e-5)


def test_jit_matches_eager(key):
  x, (s,) = c.inputs(key, (8, 32), jnp.float32, 1)
  helpers.assert_jit_matches_eager(
    pk.rms_norm_pallas, x, s, interpret=True, atol=1e-6
  )


def test_kernel_is_sensitive_to_eps(key):
  # The comparisons above can fail: a different eps is visible at atol.
  x, (s,) = c.inputs(key, (8, 32), jnp.float32, 1, scale=0.05, loc=0.0)
  y = pk.rms_norm_pallas(x, s, eps=1e-2, interpret=True)
  with pytest.raises(AssertionError):
    helpers.assert_close(y, norms.rms_norm(x, s), **c.tol(jnp.float32, 32))


# ---------------------------------------------------------------------------
# Heuristic and errors.


def test_heuristic_tiles():
  t = _rows.norm_block_heuristic("f", "gpu", 1000, 96, jnp.float32)
  assert (t.block_rows, t.block_cols, t.num_warps) == (32, 128, 4)
  t = _rows.norm_block_heuristic("f", "gpu", 3, 16384, jnp.bfloat16)
  assert (t.block_rows, t.block_cols, t.num_warps) == (1, 16384, 16)
  t = _rows.norm_block_heuristic("f", "tpu", 100000, 4096, jnp.bfloat16)
  assert (t.block_rows, t.block_cols) == (64, 4096)
  t = _rows.norm_block_heuristic("f", "tpu", 100000, 128, jnp.float32)
  assert t.block_rows == 512 and t.num_blocks == 196
  t = _rows.norm_block_heuristic("f", "tpu", 20, 128, jnp.float32)
  assert t.block_rows == 20 and t.num_blocks == 1


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (
      dict(lowering="gpu", block_rows=12, block_cols=128),
      "power-of-two block_rows",
    ),
    (dict(lowering="gpu", block_rows=8, block_cols=64), "must cover features"),
    (dict(lowering="tpu", block_rows=12, block_cols=96), "multiple of 8"),
    (
      dict(lowering="tpu", block_rows=16, block_cols=128),
      "block_cols == features",
    ),
    (dict(lowering="tpu", block_rows=0, block_cols=96), "block_rows must"),
  ],
)
def test_tiling_rejects_bad_tiles(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _rows.RowTiling(rows=40, features=96, **kwargs)
  with pytest.raises(ValueError, match="rows and features"):
    _rows.RowTiling("tpu", 0, 96, 8, 96)


@pytest.mark.parametrize("fn", [pk.rms_norm_pallas, pk.layer_norm_pallas])
def test_unsupported_cases_raise_not_implemented(fn):
  x = jnp.ones((4, 16), jnp.float32)
  with pytest.raises(
    NotImplementedError, match="no compiled Pallas lowering for backend 'cpu'"
  ):
    fn(x)
  with pytest.raises(NotImplementedError, match="trailing axes only"):
    fn(x, axis=0, interpret=True)
  with pytest.raises(NotImplementedError, match="up to 16384 features"):
    fn(jnp.ones((2, 16385), jnp.float32), interpret=True)
  with pytest.raises(NotImplementedError, match="tpu kernel supports"):
    fn(x.astype(jnp.float16), interpret=TPU)
  with pytest.raises(NotImplementedError, match="non-empty input"):
    fn(jnp.ones((0, 16), jnp.float32), interpret=True)


@pytest.mark.parametrize("fn", [pk.rms_norm_pallas, pk.layer_norm_pallas])
def test_invalid_inputs_raise(fn):
  x = jnp.ones((40, 96), jnp.float32)
  with pytest.raises(TypeError, match="floating dtype"):
    fn(jnp.ones((4, 16), jnp.int32), interpret=True)
  with pytest.raises(ValueError, match=r"scale must have shape \(96,\)"):
    fn(x, jnp.ones((95,)), interpret=True)
  with pytest.raises(ValueError, match="power-of-two block_rows"):
    fn(x, block_rows=12, interpret=True)
  with pytest.raises(ValueError, match="multiple of 8"):
    fn(x, block_rows=12, interpret=TPU)
  with pytest.raises(ValueError, match="axis must be integers"):
    fn(x, axis=2, interpret=True)


def test_rms_norm_bad_eps_mode():
  with pytest.raises(ValueError, match="eps_mode must be one of"):
    pk.rms_norm_pallas(jnp.ones((4, 16)), eps_mode="middle", interpret=True)
