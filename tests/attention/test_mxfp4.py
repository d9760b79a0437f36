"""MXFP4 fake quantization and MXAttention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import D, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = functools.partial(_common.qkv, t=6)


def test_e2m1_rounding_rules():
  x = jnp.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.3, 5.5, 7, 100])
  want = np.array([0, 1, 1, 2, 2, 4, 4, 0.5, 6, 6, 6])
  got = attn.mxfp4_quantize(x, block_size=11, scale_rule="qmax", qmax=6.0)
  # amax=100 -> scale 2**5; check the element grid directly instead.
  del got
  blk = jnp.zeros((32,)).at[:11].set(x)
  e = attn.mxfp4_scale_exponent(jnp.float32(6.0), qmax=6.0)
  assert int(e) == 0
  helpers.assert_close(
    blk.astype(jnp.float4_e2m1fn).astype(jnp.float32)[:11], want, atol=0
  )


def test_mxfp4_block_examples():
  blk = jnp.zeros((32,)).at[:4].set(jnp.array([7.5, 1.0, -0.3, 2.6]))
  ocp = attn.mxfp4_quantize(blk, scale_rule="ocp_floor")
  uos = attn.mxfp4_quantize(blk)
  helpers.assert_close(ocp[:4], np.array([6, 1, -0.5, 3.0]), atol=0)
  helpers.assert_close(uos[:4], np.array([8, 1, 0, 3.0]), atol=0)
  ramp = 0.1 * jnp.arange(32.0)
  for rule, qmax, e in (
    ("ocp_floor", 7.25, -1),
    ("qmax", 7.25, -1),
    ("qmax", 6.0, 0),
  ):
    got = attn.mxfp4_scale_exponent(jnp.max(ramp), scale_rule=rule, qmax=qmax)
    assert int(got) == e, (rule, qmax)
  helpers.assert_close(attn.mxfp4_quantize(ramp)[-1], np.float32(3.0), atol=0)
  assert int(attn.mxfp4_scale_exponent(jnp.float32(0.0))) == -127
  # Exact boundary: amax = 7.25 * 2**k maps to e = k.
  assert int(attn.mxfp4_scale_exponent(jnp.float32(7.25 * 4))) == 2
  assert int(attn.mxfp4_scale_exponent(jnp.float32(7.25 * 4 * 1.0001))) == 3


@pytest.mark.parametrize("rule", ["qmax", "ocp_floor"])
def test_mxfp4_equals_ml_dtypes_cast(key, rule):
  x = np.array(jax.random.normal(key, (6, 70)) * 3.0, np.float32)
  x[0, :32] = 0.0  # an all-zero block
  got = np.asarray(attn.mxfp4_quantize(jnp.asarray(x), scale_rule=rule))
  want = np.zeros_like(x, np.float64)
  for r in range(6):
    for s in range(0, 70, 32):
      blk = x[r, s : s + 32].astype(np.float64)
      amax = np.abs(blk).max()
      if amax == 0:
        continue
      if rule == "qmax":
        e = int(np.ceil(np.log2(amax / 7.25)))
      else:
        e = int(np.floor(np.log2(amax))) - 2
      scaled = (blk / 2.0**e).astype(ml_dtypes.float4_e2m1fn)
      want[r, s : s + 32] = scaled.astype(np.float64) * 2.0**e
  np.testing.assert_array_equal(got, want.astype(np.float32))
  # Other axis and a bfloat16 input keep their shapes/dtypes.
  xb = jnp.asarray(x.T, jnp.bfloat16)
  qb = attn.mxfp4_quantize(xb, axis=0)
  assert qb.dtype == jnp.bfloat16 and qb.shape == xb.shape


def test_mxfp4_ste_gradient_is_identity(key):
  x = jax.random.normal(key, (4, 32))
  g = jax.grad(lambda x: jnp.sum(attn.mxfp4_quantize(x) * 3.0))(x)
  helpers.assert_close(g, np.full((4, 32), 3.0), atol=0)


def test_uos_qmax_minimizes_gaussian_error(key):
  x = jax.random.normal(key, (20000, 32))
  grid = np.arange(6.0, 8.0001, 0.125)
  mse = [
    float(jnp.mean((attn.mxfp4_quantize(x, qmax=float(g)) - x) ** 2))
    for g in grid
  ]
  best = grid[int(np.argmin(mse))]
  assert 7.0 <= best <= 7.5, (best, mse)
  assert mse[list(grid).index(7.25)] < min(mse[0], mse[-1])


def test_hadamard_rotation(key):
  for signs in ("plain", "random_sign"):
    r = attn.hadamard_rotation(128, signs=signs)
    helpers.assert_close(r @ r.T, np.eye(128), atol=1e-5)
  q, k, _ = _qkv(key, h=16)
  r = attn.hadamard_rotation(16)
  kk = jnp.repeat(k, 2, 2)
  helpers.assert_close(
    jnp.einsum("btnh,bsnh->bnts", q @ r, kk @ r),
    jnp.einsum("btnh,bsnh->bnts", q, kk),
    atol=1e-5,
  )
  with pytest.raises(ValueError, match="dim must be a power of two"):
    attn.hadamard_rotation(12)


def test_mxfp4_attention_off_equals_sdpa(key):
  q, k, v = _qkv(key, h=16)
  for had in (None, "plain", "random_sign"):
    out = attn.mxfp4_attention(
      q, k, v, is_causal=True, quantize_qkv=False, p_quant="none", hadamard=had
    )
    helpers.assert_close(
      out, attn.dot_product_attention(q, k, v, is_causal=True), atol=1e-5
    )


def test_pnq_row_sums(key):
  kq, kk, _ = jax.random.split(key, 3)
  q = jax.random.normal(kq, (1, 64, 1, 64))
  k = jax.random.normal(kk, (1, 256, 1, 64))
  eye = jnp.eye(256).reshape(1, 256, 1, 256)  # V = I exposes the weights

  def rows(**kw):
    w = attn.mxfp4_attention(q, k, eye, quantize_qkv=False, hadamard=None, **kw)
    return np.asarray(w.sum(-1), np.float64)

  np.testing.assert_allclose(rows(p_quant="pnq"), 1.0, atol=1e-6)
  assert rows(p_quant="pnq", l_source="float").mean() < 0.99
  assert rows(p_quant="direct").mean() < 0.99


def test_mxfp4_attention_full_method(key):
  q, k, v = _qkv(key, t=8, s=40, h=32)
  mask = jnp.ones((2, 1, 8, 40), bool).at[0, 0, 2].set(False)
  out = jax.jit(lambda q, k, v: attn.mxfp4_attention(q, k, v, mask=mask))(
    q, k, v
  )
  ref = attn.dot_product_attention(q, k, v, mask=mask)
  assert helpers.all_finite(out)
  helpers.assert_close(out[0, 2], np.zeros((4, 32)), atol=0)
  err = float(jnp.abs(out - ref)[1].mean())
  assert 0 < err < 0.2
  g = jax.jit(
    jax.grad(lambda v: attn.mxfp4_attention(q, k, v, mask=mask).sum())
  )(v)
  assert helpers.all_finite(g)
  ob = jax.jit(attn.mxfp4_attention)(
    *(x.astype(jnp.bfloat16) for x in (q, k, v))
  )
  assert ob.dtype == jnp.bfloat16 and helpers.all_finite(ob)
  with pytest.raises(ValueError, match="p_quant must be one of"):
    attn.mxfp4_attention(q, k, v, p_quant="exact")
  with pytest.raises(ValueError, match="qmax must be > 0"):
    attn.mxfp4_attention(q, k, v, qmax=0.0)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.mxfp4).


def test_mxfp4_module_matches_function(key):
  x = _common.tokens(key)
  mx = nn_attn.make_attention(
    "mxfp4",
    D,
    N,
    rngs=nnx.Rngs(0),
    attention_kwargs={"p_quant": "direct", "hadamard": "plain"},
  )
  q, k, v = _common.project_qkv(mx, x)
  helpers.assert_close(
    mx(x),
    _common.project_out(
      mx, attn.mxfp4_attention(q, k, v, p_quant="direct", hadamard="plain")
    ),
    atol=1e-5,
  )
