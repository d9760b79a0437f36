"""Tests for jaxnorm.residual.wiring: pre/post/sandwich norms, LayerNorm
Scaling (Python and traced indices), the fused pre-norm recurrence and the
scaled residuals (depth rule, SkipInit, ReZero, LayerScale), against their
equations."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import norms
from jaxnorm import residual as R
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.residual import _common as common
from tests.residual._common import Linear

# ---------------------------------------------------------------------------
# Wiring and LayerNorm Scaling.


def test_pre_post_sandwich_wiring(key):
  x = jax.random.normal(key, (2, 3, 8))
  w = jax.random.normal(jax.random.key(1), (8, 8))
  f = common.linear(w)
  helpers.assert_close(
    R.pre_norm(x, f, common.rms), x + f(common.rms(x)), atol=1e-6
  )
  helpers.assert_close(
    R.post_norm(x, f, common.rms), common.rms(x + f(x)), atol=1e-6
  )
  helpers.assert_close(
    R.sandwich_norm(x, f, common.rms, jnp.tanh),
    x + jnp.tanh(f(common.rms(x))),
    atol=1e-6,
  )


@pytest.mark.parametrize("layer_index", [0, 3, 11])
def test_layer_norm_scaling_rms(key, layer_index):
  # Spec 6 test 3: with unit gain the norm output has RMS 1/sqrt(l).
  x = 5.0 * jax.random.normal(key, (4, 64))
  seen = []

  def probe(h):
    seen.append(h)
    return jnp.zeros_like(h)

  R.pre_norm(x, probe, common.rms, layer_index=layer_index)
  rms = jnp.sqrt(jnp.mean(seen[0] ** 2, axis=-1))
  np.testing.assert_allclose(rms, 1 / math.sqrt(layer_index + 1), atol=1e-5)


# ---------------------------------------------------------------------------
# Scaled residuals.


def test_residual_scale_rules():
  assert R.residual_scale(8) == 1 / 8
  assert R.residual_scale(16, "1/sqrt(n)") == 0.25
  assert R.residual_scale(3, 0.7) == 0.7
  with pytest.raises(ValueError, match="rule must be one of"):
    R.residual_scale(3, "1/n^2")
  with pytest.raises(ValueError, match="positive float"):
    R.residual_scale(3, -1.0)
  with pytest.raises(ValueError, match="num_residuals must be a positive"):
    R.residual_scale(0)


def test_scaled_residual_forms(key):
  x = jax.random.normal(key, (2, 5, 6))
  f = common.linear(jax.random.normal(jax.random.key(2), (6, 6)))
  helpers.assert_close(
    R.scaled_residual(x, f, 0.25), x + 0.25 * f(x), atol=1e-6
  )
  alpha = jnp.asarray([0.3])
  helpers.assert_close(
    R.scaled_residual(x, f, alpha), x + 0.3 * f(x), atol=1e-6
  )
  gamma = jnp.arange(6, dtype=jnp.float32)
  helpers.assert_close(
    R.scaled_residual(x, f, gamma, norm=common.rms),
    x + gamma.reshape(1, 1, 6) * f(common.rms(x)),
    atol=1e-5,
  )
  # SkipInit / ReZero at init: the identity.
  helpers.assert_close(R.scaled_residual(x, f, jnp.zeros((1,))), x, atol=0)
  xb = x.astype(jnp.bfloat16)
  assert R.scaled_residual(xb, f, alpha).dtype == jnp.bfloat16


def test_scaled_residual_errors(key):
  x = jax.random.normal(key, (2, 6))
  with pytest.raises(
    ValueError,
    match=r"scale must be a scalar or have "
    r"shape \(x.shape\[-1\],\)=\(6,\)",
  ):
    R.scaled_residual(x, jnp.tanh, jnp.ones((3,)))
  with pytest.raises(TypeError, match="scale must have a floating dtype"):
    R.scaled_residual(x, jnp.tanh, jnp.ones((6,), jnp.int32))
  with pytest.raises(ValueError, match="sublayer must keep the shape"):
    R.scaled_residual(x, lambda h: h[..., :3], 0.5)


def test_depth_rule_linear_path_expansion():
  # Spec 5 test 1: the linear tower equals the sum over ordered subsets.
  rng = np.random.RandomState(0)
  n, d, lam = 6, 5, 1 / 6
  mats = [rng.randn(d, d) / np.sqrt(d) for _ in range(n)]
  x0 = rng.randn(d)
  expected = np.zeros(d)
  for size in range(n + 1):
    for subset in itertools.combinations(range(n), size):
      v = x0
      for k in subset:
        v = mats[k] @ v
      expected += lam**size * v
  x = jnp.asarray(x0, jnp.float32)
  for a in mats:
    x = R.scaled_residual(
      x, lambda h, a=a: jnp.asarray(a, h.dtype) @ h, R.residual_scale(n)
    )
  np.testing.assert_allclose(np.asarray(x), expected, atol=1e-5)


def test_depth_rule_bounded_with_orthogonal_branches():
  # Spec 5 test 2: lam = 1/n keeps ||x_n|| <= e ||x_0||; lam = 1 explodes.
  d, n = 8, 256
  qs = jax.random.orthogonal(jax.random.key(3), d, shape=(n,))
  x0 = jax.random.normal(jax.random.key(4), (d,))

  def tower(lam):
    def step(x, q):
      return R.scaled_residual(x, lambda h: q @ h, lam), None

    return jax.lax.scan(step, x0, qs)[0]

  ratio = jnp.linalg.norm(tower(R.residual_scale(n))) / jnp.linalg.norm(x0)
  assert ratio <= math.e + 1e-4
  assert jnp.linalg.norm(tower(1.0)) / jnp.linalg.norm(x0) > 1e6


# ---------------------------------------------------------------------------
# Traced layer indices (nnx.scan over layers) and the fused recurrence.


def test_traced_layer_index_equals_python_index(key):
  x = jax.random.normal(key, (2, 3, 8))
  f = common.linear(jax.random.normal(jax.random.key(1), (8, 8)))

  @jax.jit
  def traced(x, index):
    return R.pre_norm(x, f, common.rms, layer_index=index), R.sandwich_norm(
      x, f, common.rms, jnp.tanh, layer_index=index
    )

  for index in (0, 5):
    got = traced(x, jnp.asarray(index))
    helpers.assert_close(
      got[0], R.pre_norm(x, f, common.rms, layer_index=index), atol=1e-6
    )
    helpers.assert_close(
      got[1],
      R.sandwich_norm(x, f, common.rms, jnp.tanh, layer_index=index),
      atol=1e-6,
    )
  bf16 = R.pre_norm(
    x.astype(jnp.bfloat16), f, common.rms, layer_index=jnp.asarray(3)
  )
  assert bf16.dtype == jnp.bfloat16
  for k in (0, 5):
    want = R.hc_static_init(4, k)
    got = jax.jit(lambda k: R.hc_static_init(4, k))(jnp.asarray(k))
    for a, b in zip(got, want):
      helpers.assert_close(a, b, atol=0)


def test_layer_index_errors():
  x = jnp.ones((2, 8))
  with pytest.raises(
    ValueError, match="pre_norm: layer_index must be a non-negative integer"
  ):
    R.pre_norm(x, jnp.tanh, common.rms, layer_index=-1)
  with pytest.raises(
    ValueError, match="sandwich_norm: an array layer_index must be an integer"
  ):
    R.sandwich_norm(
      x, jnp.tanh, common.rms, common.rms, layer_index=jnp.float32(1.0)
    )
  with pytest.raises(ValueError, match="must be an integer scalar"):
    R.hc_static_init(4, jnp.arange(2))
  with pytest.raises(ValueError, match="hc_static_init: layer_index must be"):
    R.hc_static_init(4, None)


def test_fused_pre_norm_equals_unfused_stack(key):
  from jaxnorm import fused_norms

  d, depth = 16, 4
  kx, kw, ks = jax.random.split(key, 3)
  x = jax.random.normal(kx, (2, 5, d))
  fs = [common.linear(w / 4) for w in jax.random.normal(kw, (depth, d, d))]
  scales = 1.0 + 0.1 * jax.random.normal(ks, (depth, d))
  norm_k = [lambda h, s=s: norms.rms_norm(h, s) for s in scales]
  add_k = [
    lambda b, h, s=s: fused_norms.add_rms_norm(b, h, s, implementation="xla")
    for s in scales[1:]
  ]
  y, hidden = R.fused_pre_norm(x, fs, norm_k[0], add_k, return_hidden=True)
  ref, ref_hidden = x, []
  for f, norm in zip(fs, norm_k):
    ref = R.pre_norm(ref, f, norm)
    ref_hidden.append(ref)
  helpers.assert_close(y, ref, atol=1e-5)
  helpers.assert_close(hidden, jnp.stack(ref_hidden), atol=1e-5)
  helpers.assert_close(
    R.fused_pre_norm(x, fs[:1], norm_k[0], []), x + fs[0](norm_k[0](x)), atol=0
  )
  with pytest.raises(
    ValueError, match="fused_pre_norm: need at least one sublayer and one"
  ):
    R.fused_pre_norm(x, fs, norm_k[0], add_k[:1])


# ---------------------------------------------------------------------------
# The modules (jaxnorm.nn.residual.wiring).


def test_scaled_and_gated_modules():
  d = 8
  x = jax.random.normal(jax.random.key(0), (3, d))
  f = Linear(jax.random.normal(jax.random.key(1), (d, d)))
  blocks = [f, f, f, f]
  # Spec 5 test 3: ScaledResidual('1/n') = plain residual with branch / n.
  net = nn_res.make_residual(
    "scaled", blocks, num_features=d, rngs=nnx.Rngs(0), norm=None
  )
  expected = x
  for _ in range(4):
    expected = expected + f(expected) / 4
  helpers.assert_close(net(x), expected, atol=1e-6)
  # SkipInit / ReZero: identity network at init (spec 6 test 1).
  for name in ("skipinit", "rezero"):
    net = nn_res.make_residual(name, blocks, num_features=d, rngs=nnx.Rngs(0))
    helpers.assert_close(net(x), x, atol=0)
    assert all(step.norm is None for step in net.steps)
  ls = nn_res.make_residual(
    "layerscale", blocks, num_features=d, rngs=nnx.Rngs(0)
  )
  assert ls.steps[0].gate[...].shape == (d,)
  np.testing.assert_allclose(ls.steps[0].gate[...], 0.1)  # CaiT, depth 2.


def test_rezero_shares_one_gate_per_layer_as_the_official_code():
  # majumderb/rezero RZTXEncoderLayer: one `resweight` multiplies both the
  # attention and the feed-forward branch of a layer.
  d = 8
  x = jax.random.normal(jax.random.key(0), (3, d))
  fs = [
    Linear(jax.random.normal(jax.random.key(k), (d, d)) / d) for k in range(4)
  ]
  net = nn_res.make_residual("rezero", fs, num_features=d, rngs=nnx.Rngs(0))
  assert net.steps[0] is net.steps[1] and net.steps[2] is net.steps[3]
  assert net.steps[1] is not net.steps[2]
  assert len(jax.tree.leaves(nnx.state(net, nnx.Param))) == 4 + 2
  net.steps[0].gate[...] = jnp.array([0.5])
  net.steps[2].gate[...] = jnp.array([-0.25])
  want = x
  for f, a in zip(fs, (0.5, 0.5, -0.25, -0.25)):
    want = want + a * f(want)
  helpers.assert_close(net(x), want, atol=1e-6)
  # SkipInit keeps one gate per residual branch (official skipinit_gain).
  skip = nn_res.make_residual("skipinit", fs, num_features=d, rngs=nnx.Rngs(0))
  assert len({id(step) for step in skip.steps}) == 4
  per_branch = nn_res.make_residual(
    "rezero", fs, num_features=d, rngs=nnx.Rngs(0), shared=False
  )
  assert len({id(step) for step in per_branch.steps}) == 4


def test_lns_scales_per_layer_by_default():
  # Curse of Depth official code: both norms of layer l scale by 1/sqrt(l).
  d = 8
  fs = [
    Linear(jax.random.normal(jax.random.key(k), (d, d)) / d) for k in range(6)
  ]
  net = nn_res.make_residual("lns", fs, num_features=d, rngs=nnx.Rngs(0))
  assert [s.layer_index for s in net.steps] == [0, 0, 1, 1, 2, 2]
  x = jax.random.normal(jax.random.key(9), (3, d))
  want = x
  for k, f in enumerate(fs):
    normed = want / jnp.sqrt(jnp.mean(want**2, -1, keepdims=True) + 1e-6)
    want = want + f(normed / math.sqrt(k // 2 + 1))
  helpers.assert_close(net(x), want, atol=1e-5)
  resnet = nn_res.make_residual(
    "lns", fs, num_features=d, rngs=nnx.Rngs(0), sublayers_per_layer=1
  )
  assert [s.layer_index for s in resnet.steps] == list(range(6))
