"""LLM.int8(): spec goldens (bitsandbytes semantics), limits, error bound."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import quant
from jaxnorm.nn import layers, models
from jaxnorm.nn import quant as nn_quant

X = np.array([[1, -2, 0.5, 7], [0.25, 0.5, -1, -0.5]], np.float32)
WT = np.array(
  [[0.1, 0.2, -0.3, 0.05], [-0.5, 0.4, 0, 0.1], [0.3, -0.1, 0.2, -0.2]],
  np.float32,
)
W = WT.T.copy()


def _rand(seed, shape, scale=1.0):
  return (np.random.default_rng(seed).normal(size=shape) * scale).astype(
    np.float32
  )


def test_spec_golden_bnb():
  """Section 4.2: quantized codes, scales and the dequant-mode output."""
  assert np.asarray(quant.outlier_columns(X)).tolist() == [0, 0, 0, 1]
  qw, aw = quant.absmax_quantize(W, axis=0)
  np.testing.assert_array_equal(
    np.asarray(qw).T,
    [[42, 85, -127, 21], [-127, 102, 0, 25], [127, -42, 85, -85]],
  )
  np.testing.assert_allclose(aw.ravel(), [0.3, 0.5, 0.3], rtol=1e-7)
  regular = np.where([0, 0, 0, 1], 0.0, X).astype(np.float32)
  qx, ax = quant.absmax_quantize(regular)
  np.testing.assert_array_equal(qx, [[64, -127, 32, 0], [32, 64, -127, 0]])
  np.testing.assert_allclose(ax.ravel(), [2, 1])
  bnb = dict(absmax_mode="bnb", outlier_weight="dequant")
  got = quant.int8_mixed_matmul(
    X, W, dequant_scale=quant.BNB_DEQUANT_SCALE, **bnb
  )
  want = [[-0.105526, -0.618134, -0.803529], [0.401387, 0.027173, -0.074803]]
  np.testing.assert_allclose(got, want, atol=2e-6)
  # The exact 1/127^2 (default) differs by bnb's constant's rounding only.
  exact = [[-0.105518, -0.61811, -0.80354], [0.40138, 0.027172, -0.0748]]
  np.testing.assert_allclose(
    quant.int8_mixed_matmul(X, W, **bnb), exact, atol=2e-6
  )
  np.testing.assert_allclose(X @ W, [[-0.1, -0.6, -0.8], [0.4, 0.025, -0.075]])


def test_absmax_modes_golden():
  """x = [[.5,-1,8],[2,1,5.5]]: row scales [1, 2] (paper) vs [1, 5.5]."""
  x = np.array([[0.5, -1, 8], [2, 1, 5.5]], np.float32)
  eye = np.eye(3, dtype=np.float32)
  paper = np.asarray(quant.int8_mixed_matmul(x, eye, absmax_mode="paper"))
  bnb = np.asarray(quant.int8_mixed_matmul(x, eye, absmax_mode="bnb"))

  # Identity weights quantize exactly; the row scale sets the grid of x.
  def grid(v, a):
    return np.round(np.asarray(v) * 127 / a) * a / 127

  np.testing.assert_allclose(
    paper[:, :2], grid(x[:, :2], [[1], [2]]), atol=1e-6
  )
  np.testing.assert_allclose(
    bnb[:, :2], grid(x[:, :2], [[1], [5.5]]), atol=1e-6
  )
  np.testing.assert_allclose(paper[:, 2], x[:, 2])  # outlier column exact
  np.testing.assert_allclose(bnb[:, 2], x[:, 2])


def test_limits():
  x = _rand(0, (3, 5, 8))
  w = _rand(1, (8, 4))
  big = float(np.abs(x).max()) + 1.0
  np.testing.assert_array_equal(
    quant.int8_mixed_matmul(x, w, threshold=big),
    quant.int8_vectorwise_matmul(x, w),
  )
  np.testing.assert_array_equal(
    quant.int8_mixed_matmul(x, w, threshold=0.0),
    quant.int8_vectorwise_matmul(x, w),
  )
  np.testing.assert_allclose(
    quant.int8_mixed_matmul(x, w, threshold=1e-30), x @ w, rtol=1e-5, atol=1e-5
  )


def test_zero_rows_no_nan():
  x = _rand(2, (4, 6))
  x[1] = 0.0
  x[2, :] = [9.0, 0, 0, 0, 0, 0]  # int8 part of this row is all zero
  w = _rand(3, (6, 3))
  for mode in ("paper", "bnb"):
    out = np.asarray(quant.int8_mixed_matmul(x, w, absmax_mode=mode))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[1], 0.0)
  q, a = quant.absmax_quantize(np.zeros((2, 3), np.float32))
  assert np.all(np.asarray(q) == 0) and np.all(np.asarray(a) == 0)
  assert np.all(np.isfinite(quant.int8_vectorwise_matmul(x, w)))


def test_vectorwise_matches_numpy_and_error_bound():
  x = _rand(4, (16, 32))
  w = _rand(5, (32, 8), 0.2)
  xd, wd = x.astype(np.float64), w.astype(np.float64)
  ax = np.abs(xd).max(1, keepdims=True)
  aw = np.abs(wd).max(0, keepdims=True)
  qx = np.round(127 * xd / ax)
  qw = np.round(127 * wd / aw)
  want = (qx @ qw) * ax * aw / 127**2
  got = np.asarray(quant.int8_vectorwise_matmul(x, w))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  bound = (
    (np.abs(xd) @ np.ones_like(wd)) * aw / 254
    + ax * (np.ones_like(xd) @ np.abs(wd)) / 254
    + 32 * ax * aw / 254**2
  )
  assert np.all(np.abs(got - xd @ wd) <= bound + 1e-6)
  t = np.asarray(quant.int8_vectorwise_matmul(x, w, granularity="tensor"))
  a_x, a_w = np.abs(xd).max(), np.abs(wd).max()
  want_t = (np.round(127 * xd / a_x) @ np.round(127 * wd / a_w)) * a_x * a_w
  np.testing.assert_allclose(t, want_t / 127**2, rtol=1e-5, atol=1e-5)


def test_mixed_error_bound_and_function_preservation():
  x = _rand(6, (10, 12))
  x[:, 3] *= 20.0  # an outlier feature
  w = _rand(7, (12, 5), 0.3)
  c = 40.0
  got = np.asarray(quant.int8_mixed_matmul(x, w))
  o = np.asarray(quant.outlier_columns(x))
  assert o.tolist() == [j == 3 for j in range(12)]
  keep = ~o
  xd, wd = x.astype(np.float64), w.astype(np.float64)
  ax = np.abs(xd[:, keep]).max(1, keepdims=True)
  aw = np.abs(wd).max(0, keepdims=True)
  bound = (
    (np.abs(xd[:, keep]) @ np.ones_like(wd[keep])) * aw / 254
    + ax * (np.ones_like(xd[:, keep]) @ np.abs(wd[keep])) / 254
    + keep.sum() * ax * aw / 254**2
  )
  assert np.all(np.abs(got - xd @ wd) <= bound + 1e-5)
  # Scaling an outlier column of x by c and its weight row by 1/c: the
  # outlier path is float, so only the weight scale of the int8 part moves.
  x2, w2 = x.copy(), w.copy()
  x2[:, 3] *= c
  w2[3] /= c
  np.testing.assert_allclose(x2 @ w2, x @ w, rtol=1e-5, atol=1e-5)
  fp = dict(outlier_weight="fp")
  got2 = np.asarray(quant.int8_mixed_matmul(x2, w2, **fp))
  assert np.abs(got2 - x @ w).max() <= bound.max() * 2
  # The same rescaling of a regular column (staying below the threshold)
  # changes the int8 result: int8 is not function-preserving there.
  x3, w3 = x.copy(), w.copy()
  x3[:, 0] *= 1.5
  w3[0] /= 1.5
  assert np.asarray(quant.outlier_columns(x3)).tolist() == o.tolist()
  assert not np.allclose(quant.int8_mixed_matmul(x3, w3), got, atol=1e-7)


def test_jit_and_dtype():
  x = _rand(8, (2, 3, 8)).astype(jnp.bfloat16)
  w = _rand(9, (8, 4))
  f = jax.jit(lambda a, b: quant.int8_mixed_matmul(a, b, threshold=1.0))
  out = f(x, w)
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 3, 4)
  np.testing.assert_allclose(
    np.asarray(out, np.float32),
    np.asarray(quant.int8_mixed_matmul(x, w, threshold=1.0), np.float32),
  )


def test_int8_dense_is_a_drop_in():
  dense = layers.Dense(8, 4, names=(None, None), rngs=nnx.Rngs(0))
  dense.bias[...] = jnp.arange(4, dtype=jnp.float32)
  x = jnp.asarray(_rand(10, (2, 5, 8)))
  q = nn_quant.Int8Dense.from_dense(dense, quant_mode="none")
  np.testing.assert_allclose(q(x), dense(x), rtol=1e-6)
  same = nn_quant.Int8Dense(8, 4, names=(None, None), rngs=nnx.Rngs(0))
  assert jax.tree.structure(nnx.state(same)) == jax.tree.structure(
    nnx.state(dense)
  )
  np.testing.assert_allclose(same.kernel[...], dense.kernel[...])
  for mode in ("tensor", "vector", "mixed"):
    qm = nn_quant.Int8Dense.from_dense(dense, quant_mode=mode, threshold=1.0)
    np.testing.assert_allclose(
      qm(x),
      nn_quant.quantized_matmul(
        x, dense.kernel[...], quant_mode=mode, threshold=1.0
      )
      + dense.bias[...].reshape(1, 1, 4),
      rtol=1e-6,
    )


@pytest.mark.slow
def test_swap_dense_on_the_lm():
  cfg = models.LMConfig(
    width=16, depth=1, num_heads=2, max_len=8, tie_embeddings=False
  )
  lm = models.DecoderLM(cfg, rngs=nnx.Rngs(0))
  tokens = jnp.arange(8, dtype=jnp.int32).reshape(1, 8)
  want = lm(tokens)
  before = nnx.state(lm, nnx.Param)
  n = nn_quant.swap_dense(lm, quant_mode="none")
  assert n == 3  # MLP up, down and the untied head
  assert isinstance(lm.head, nn_quant.Int8Dense)
  assert isinstance(lm.head, layers.Dense)
  chex_equal = jax.tree.map(
    lambda a, b: bool(jnp.all(a == b)), before, nnx.state(lm, nnx.Param)
  )
  assert all(jax.tree.leaves(chex_equal))
  np.testing.assert_allclose(lm(tokens), want, rtol=1e-6, atol=1e-6)
  assert nn_quant.swap_dense(lm, quant_mode="vector") == 0
  nn_quant.swap_dense(lm, dense_type=nn_quant.Int8Dense, quant_mode="vector")
  got = lm(tokens)
  assert not np.array_equal(got, want)
  np.testing.assert_allclose(got, want, atol=0.05)


def test_errors():
  x, w = X, W
  with pytest.raises(ValueError, match="int8_mixed_matmul: w must have shape"):
    quant.int8_mixed_matmul(x, w.T)
  with pytest.raises(ValueError, match="w must have rank 2"):
    quant.int8_vectorwise_matmul(x, w[None])
  with pytest.raises(ValueError, match="absmax_mode must be one of"):
    quant.int8_mixed_matmul(x, w, absmax_mode="max")
  with pytest.raises(ValueError, match="outlier_weight must be one of"):
    quant.int8_mixed_matmul(x, w, outlier_weight="int4")
  with pytest.raises(ValueError, match="granularity must be one of"):
    quant.int8_vectorwise_matmul(x, w, granularity="row")
  with pytest.raises(ValueError, match="threshold must be >= 0"):
    quant.outlier_columns(x, threshold=-1.0)
  with pytest.raises(TypeError, match="x must have a floating dtype"):
    quant.absmax_quantize(np.ones(3, np.int32))
  with pytest.raises(ValueError, match="axis must be integers"):
    quant.absmax_quantize(x, axis=2)
  with pytest.raises(ValueError, match="quant_mode must be one of"):
    nn_quant.Int8Dense(
      4, 4, names=(None, None), quant_mode="fp8", rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match="quantized_matmul: quant_mode must be"):
    nn_quant.quantized_matmul(x, w, quant_mode="int4")


@pytest.mark.slow
def test_lm_quant_flag_swaps_every_dense():
  cfg = models.LMConfig(
    width=32, depth=1, num_heads=2, max_len=8, tie_embeddings=False
  )
  plain = models.DecoderLM(cfg, rngs=nnx.Rngs(0))
  quant = models.DecoderLM(
    dataclasses.replace(cfg, quant="mixed"), rngs=nnx.Rngs(0)
  )
  kinds = [type(m) for _, m in nnx.iter_modules(quant)]
  assert kinds.count(nn_quant.Int8Dense) == 3  # MLP up/down and the head.
  tokens = jnp.arange(16).reshape(2, 8) % 256
  a, b = plain(tokens), quant(tokens)
  assert not np.array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_allclose(a, b, atol=0.1 * float(jnp.max(jnp.abs(a))))
