"""Tests for the core norms in `jaxnorm.norms`.

Oracles: flax.linen layers (forward and VJP), NumPy float64 transcriptions of
the equations, and the invariants the papers state.
"""

import functools

import flax.linen as nn
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxnorm import norms, residual
from tests import helpers

F32_TOL = 1e-6


def _normal(key, shape, dtype=jnp.float32, scale=1.0, shift=0.0):
  return (jax.random.normal(key, shape, jnp.float32) * scale + shift).astype(
    dtype
  )


def _params(key, d):
  k1, k2 = jax.random.split(key)
  return 1.0 + 0.3 * _normal(k1, (d,)), 0.3 * _normal(k2, (d,))


# ---------------------------------------------------------------------------
# NumPy float64 transcriptions of the equations.


def np_layer_norm(x, scale, bias, eps=1e-6, axes=(-1,)):
  x = np.asarray(x, np.float64)
  mu = x.mean(axis=axes, keepdims=True)
  var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * np.asarray(scale) + np.asarray(bias)


def np_rms_norm(x, scale, eps=1e-6, eps_mode="inside"):
  x = np.asarray(x, np.float64)
  ms = (x**2).mean(-1, keepdims=True)
  denom = np.sqrt(ms + eps) if eps_mode == "inside" else np.sqrt(ms) + eps
  return x / denom * np.asarray(scale)


def np_group_norm(x, scale, bias, groups, eps=1e-6):
  x = np.asarray(x, np.float64)
  n, c = x.shape[0], x.shape[-1]
  xg = x.reshape(n, -1, groups, c // groups)
  mu = xg.mean(axis=(1, 3), keepdims=True)
  var = ((xg - mu) ** 2).mean(axis=(1, 3), keepdims=True)
  y = ((xg - mu) / np.sqrt(var + eps)).reshape(x.shape)
  return y * np.asarray(scale) + np.asarray(bias)


def np_seed_norm(x, gamma, alpha, beta, heads=1, eps=1e-6):
  x = np.asarray(x, np.float64)
  d = x.shape[-1]
  xh = x.reshape(*x.shape[:-1], heads, d // heads)
  dot = (xh * np.asarray(beta, np.float64).reshape(heads, -1)).sum(-1)
  t = np.repeat(np.tanh(dot), d // heads, axis=-1)
  s = np.asarray(gamma) + np.asarray(alpha) * t
  return s * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


# ---------------------------------------------------------------------------
# flax.linen parity, forward and VJP, float32.


class TestFlaxParity:
  def test_layer_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (4, 7, 16), shift=0.5)
    scale, bias = _params(kp, 16)
    ref = nn.LayerNorm(epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    helpers.assert_vjp_matches(
      norms.layer_norm,
      oracle,
      (x, scale, bias),
      key=kc,
      atol=F32_TOL,
      rtol=F32_TOL,
    )

  def test_layer_norm_multiple_axes(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (3, 5, 6))
    s = 1.0 + 0.3 * _normal(kp, (5, 6))
    ref = nn.LayerNorm(
      epsilon=1e-6,
      reduction_axes=(-2, -1),
      feature_axes=(-2, -1),
      use_bias=False,
    )
    oracle = lambda x, s: ref.apply({"params": {"scale": s}}, x)
    fn = lambda x, s: norms.layer_norm(x, s, axis=(-2, -1))
    helpers.assert_vjp_matches(
      fn, oracle, (x, s), key=kc, atol=F32_TOL, rtol=F32_TOL
    )

  def test_rms_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (4, 7, 16), shift=0.5)
    scale, _ = _params(kp, 16)
    ref = nn.RMSNorm(epsilon=1e-6)
    oracle = lambda x, s: ref.apply({"params": {"scale": s}}, x)
    helpers.assert_vjp_matches(
      norms.rms_norm, oracle, (x, scale), key=kc, atol=F32_TOL, rtol=F32_TOL
    )

  def test_group_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (2, 5, 3, 12), shift=0.5)
    scale, bias = _params(kp, 12)
    ref = nn.GroupNorm(num_groups=4, epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    fn = functools.partial(norms.group_norm, num_groups=4)
    helpers.assert_vjp_matches(
      fn, oracle, (x, scale, bias), key=kc, atol=F32_TOL, rtol=F32_TOL
    )

  def test_group_norm_group_size(self, key):
    x = _normal(key, (2, 4, 12))
    np.testing.assert_array_equal(
      norms.group_norm(x, group_size=3, num_groups=None),
      norms.group_norm(x, num_groups=4),
    )

  def test_instance_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (2, 5, 3, 6), shift=0.5)
    scale, bias = _params(kp, 6)
    ref = nn.InstanceNorm(epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    helpers.assert_vjp_matches(
      norms.instance_norm,
      oracle,
      (x, scale, bias),
      key=kc,
      atol=F32_TOL,
      rtol=F32_TOL,
    )

  @pytest.mark.parametrize("training", [True, False])
  def test_batch_norm(self, key, training):
    kx, kp, ks, kc = jax.random.split(key, 4)
    x = _normal(kx, (6, 5, 8), shift=0.5)
    scale, bias = _params(kp, 8)
    k1, k2 = jax.random.split(ks)
    state = norms.BatchNormState(
      mean=0.1 * _normal(k1, (8,)), var=1.0 + 0.2 * jnp.abs(_normal(k2, (8,)))
    )
    ref = nn.BatchNorm(
      use_running_average=not training, momentum=0.9, epsilon=1e-5
    )
    variables = {
      "params": {"scale": scale, "bias": bias},
      "batch_stats": {"mean": state.mean, "var": state.var},
    }

    def oracle(x, s, b):
      v = {
        "params": {"scale": s, "bias": b},
        "batch_stats": variables["batch_stats"],
      }
      y, updates = ref.apply(v, x, mutable=["batch_stats"])
      return y, (updates["batch_stats"]["mean"], updates["batch_stats"]["var"])

    def fn(x, s, b):
      y, new = norms.batch_norm(x, s, b, state, training=training, momentum=0.9)
      return y, (new.mean, new.var)

    (y, stats), (y_ref, stats_ref) = fn(x, scale, bias), oracle(x, scale, bias)
    helpers.assert_close(y, y_ref, atol=F32_TOL, rtol=F32_TOL)
    helpers.assert_close(stats, stats_ref, atol=F32_TOL, rtol=F32_TOL)
    first = lambda f: lambda *a: f(*a)[0]
    helpers.assert_vjp_matches(
      first(fn),
      first(oracle),
      (x, scale, bias),
      key=kc,
      atol=F32_TOL,
      rtol=F32_TOL,
    )


# ---------------------------------------------------------------------------
# NumPy float64 oracles and the gradient path.


class TestFormulas:
  def test_layer_norm_numpy(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (5, 33), scale=3.0, shift=2.0)
    s, b = _params(kp, 33)
    helpers.assert_close(
      norms.layer_norm(x, s, b), np_layer_norm(x, s, b), atol=2e-6, rtol=1e-5
    )

  @pytest.mark.parametrize(
    "eps_mode,eps", [("inside", 1e-6), ("outside", 1e-8)]
  )
  def test_rms_norm_numpy(self, key, eps_mode, eps):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (5, 33), scale=3.0)
    s, _ = _params(kp, 33)
    helpers.assert_close(
      norms.rms_norm(x, s, eps=eps, eps_mode=eps_mode),
      np_rms_norm(x, s, eps, eps_mode),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_group_norm_numpy(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (2, 3, 4, 8), scale=2.0, shift=1.0)
    s, b = _params(kp, 8)
    helpers.assert_close(
      norms.group_norm(x, s, b, num_groups=2),
      np_group_norm(x, s, b, 2),
      atol=2e-6,
      rtol=1e-5,
    )

  @pytest.mark.parametrize("eps_mode", ["inside", "outside"])
  @pytest.mark.parametrize("offset", [0.0, 1.0])
  def test_rms_custom_vjp_equals_autodiff(self, key, eps_mode, offset):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (3, 4, 10), scale=2.0)
    s, _ = _params(kp, 10)

    def autodiff(x, s):
      ms = jnp.mean(x * x, axis=-1, keepdims=True)
      k = (
        jax.lax.rsqrt(ms + 1e-6)
        if eps_mode == "inside"
        else 1.0 / (jnp.sqrt(ms) + 1e-6)
      )
      return x * k * (s + offset)[None, None]

    fn = lambda x, s: norms.rms_norm(
      x, s, eps_mode=eps_mode, scale_offset=offset
    )
    helpers.assert_vjp_matches(
      fn, autodiff, (x, s), key=kc, atol=1e-5, rtol=1e-5
    )

  def test_layer_norm_custom_vjp_equals_autodiff(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = _normal(kx, (3, 4, 10), scale=2.0)
    s, b = _params(kp, 10)

    def autodiff(x, s, b):
      mu = jnp.mean(x, -1, keepdims=True)
      var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
      return (x - mu) * jax.lax.rsqrt(var + 1e-6) * (s + 1.0)[None, None] + b[
        None, None
      ]

    fn = lambda x, s, b: norms.layer_norm(x, s, b, scale_offset=1.0)
    helpers.assert_vjp_matches(
      fn, autodiff, (x, s, b), key=kc, atol=1e-5, rtol=1e-5
    )

  @pytest.mark.parametrize(
    "fn",
    [
      lambda x, s: norms.layer_norm(x, s, s),
      lambda x, s: norms.rms_norm(x, s),
      lambda x, s: norms.rms_norm(x, s, eps_mode="outside"),
      lambda x, s: norms.rms_norm(x),
      lambda x, s: norms.layer_norm(x),
    ],
  )
  def test_numerical_gradients(self, key, fn):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (3, 6))
    s, _ = _params(kp, 6)
    helpers.assert_grads_numerical(fn, (x, s))

  @pytest.mark.parametrize(
    "fn",
    [
      functools.partial(norms.layer_norm, eps=1e-5),
      norms.rms_norm,
      lambda x: norms.group_norm(x, num_groups=2),
      norms.instance_norm,
      lambda x: norms.crms_norm(x),
      lambda x: norms.dyt(x, jnp.float32(0.5)),
    ],
  )
  def test_jit_equals_eager(self, key, fn):
    x = _normal(key, (2, 3, 8))
    helpers.assert_jit_matches_eager(fn, x)

  def test_vmap_equals_batched(self, key):
    x = _normal(key, (4, 5, 8))
    s = jnp.linspace(0.5, 1.5, 8)
    helpers.assert_close(
      jax.vmap(lambda r: norms.rms_norm(r, s))(x),
      norms.rms_norm(x, s),
      atol=F32_TOL,
    )
    helpers.assert_close(
      jax.vmap(lambda r: norms.layer_norm(r, s))(x),
      norms.layer_norm(x, s),
      atol=F32_TOL,
    )

  def test_float64_inputs_stay_float64(self, key):
    with jax.enable_x64(True):
      x = np.asarray(jax.random.normal(key, (3, 9)), np.float64)
      s = np.linspace(0.5, 1.5, 9)
      y = norms.layer_norm(jnp.asarray(x), jnp.asarray(s))
      assert y.dtype == jnp.float64
      np.testing.assert_allclose(y, np_layer_norm(x, s, 0.0), atol=1e-12)


# ---------------------------------------------------------------------------
# The papers' claims.


class TestLayerRmsClaims:
  def test_layer_norm_is_rms_of_centered(self, key):
    x = _normal(key, (4, 32), shift=3.0)
    centered = x - jnp.mean(x, -1, keepdims=True)
    helpers.assert_close(
      norms.layer_norm(x), norms.rms_norm(centered), atol=2e-6
    )

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(a=st.floats(1e-2, 1e2), seed=st.integers(0, 2**16))
  def test_rms_scale_invariance(self, a, seed):
    x = _normal(jax.random.key(seed), (3, 16))
    y1 = norms.rms_norm(x * a, eps=0.0)
    y2 = norms.rms_norm(x, eps=0.0)
    helpers.assert_close(y1, y2, atol=1e-5)

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(
    a=st.floats(1e-1, 1e1), c=st.floats(-10, 10), seed=st.integers(0, 2**16)
  )
  def test_layer_norm_affine_invariance(self, a, c, seed):
    x = _normal(jax.random.key(seed), (3, 16))
    y1 = norms.layer_norm(x * a + c, eps=0.0)
    helpers.assert_close(y1, norms.layer_norm(x, eps=0.0), atol=5e-5)

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(seed=st.integers(0, 2**16))
  def test_rms_output_has_unit_rms(self, seed):
    x = _normal(jax.random.key(seed), (3, 64), scale=5.0)
    y = norms.rms_norm(x, eps=0.0)
    helpers.assert_close(jnp.sqrt(jnp.mean(y * y, -1)), jnp.ones(3), atol=1e-5)

  def test_eps_modes_agree_near_unit_rms(self, key):
    x = _normal(key, (8, 256))
    x = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True))
    helpers.assert_close(
      norms.rms_norm(x, eps=1e-8, eps_mode="inside"),
      norms.rms_norm(x, eps=1e-8, eps_mode="outside"),
      atol=1e-6,
    )

  def test_large_mean_keeps_precision(self, key):
    # Two-pass variance: a 1e4 offset does not swamp a unit-variance signal.
    x = _normal(key, (4, 64), shift=1e4)
    y = norms.layer_norm(x, eps=0.0)
    ref = np_layer_norm(np.asarray(x, np.float64), 1.0, 0.0, eps=0.0)
    helpers.assert_close(y, ref, atol=1e-2)


class TestCRMSNorm:
  def test_equals_rms_on_uncompressed_zero_mean(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (5, 17), scale=2.0)
    x = x - jnp.mean(x, -1, keepdims=True)
    s, _ = _params(kp, 16)
    full = norms.rms_norm(x, jnp.concatenate([s, jnp.ones(1)]))
    helpers.assert_close(norms.crms_norm(x[:, :-1], s), full[:, :-1], atol=2e-6)

  def test_formula_denominator_uses_full_width(self):
    z = jnp.array([[1.0, 2.0, 3.0]])
    expected = z / np.sqrt((14.0 + 36.0) / 4.0 + 1e-6)
    helpers.assert_close(norms.crms_norm(z), expected, atol=1e-6)


class TestSeeDNorm:
  def _params(self, key, d):
    k1, k2, k3 = jax.random.split(key, 3)
    return (
      1.0 + 0.2 * _normal(k1, (d,)),
      0.5 + 0.2 * _normal(k2, (d,)),
      0.3 * _normal(k3, (d,)),
    )

  def test_zero_proj_equals_flax_rms_norm(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (4, 6, 16))
    gamma, alpha, _ = self._params(kp, 16)
    ref = nn.RMSNorm(epsilon=1e-6).apply({"params": {"scale": gamma}}, x)
    y = norms.seed_norm(x, gamma, alpha, jnp.zeros(16))
    helpers.assert_close(y, ref, atol=F32_TOL)

  @pytest.mark.parametrize("heads", [1, 4])
  def test_matches_numpy(self, key, heads):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (3, 5, 16))
    g, a, b = self._params(kp, 16)
    helpers.assert_close(
      norms.seed_norm(x, g, a, b, num_heads=heads),
      np_seed_norm(x, g, a, b, heads),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_one_head_differs_from_rms_only_in_that_head(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (3, 16))
    g, a, b = self._params(kp, 16)
    b = b * (jnp.arange(16) // 4 == 2).astype(jnp.float32)
    y = norms.seed_norm(x, g, a, b, num_heads=4)
    rms = norms.rms_norm(x, g)
    diff = np.abs(np.asarray(y - rms)) > 1e-6
    assert not diff[:, :8].any() and not diff[:, 12:].any()
    assert diff[:, 8:12].any()

  def test_dynamic_scale_bound_for_large_inputs(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (64, 32))
    x = 1e4 * x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    g, a, b = self._params(kp, 32)
    y = norms.seed_norm(x, g, a, b)
    xhat = norms.rms_norm(x)
    s = y / xhat
    assert helpers.all_finite(y)
    assert bool(jnp.all(jnp.abs(s - g[None]) <= jnp.abs(a[None]) + 1e-5))
    # Saturated tanh: the bound is attained (|dot| is huge at norm 1e4).
    helpers.assert_close(
      jnp.abs(s - g[None]), jnp.broadcast_to(jnp.abs(a), s.shape), atol=1e-3
    )

  def test_init_gradients(self, key):
    x = _normal(key, (4, 16))
    ones, zeros = jnp.ones(16), jnp.zeros(16)
    target = jnp.linspace(-1, 1, 16)
    loss = lambda a, b: jnp.sum(
      (norms.seed_norm(x, ones, a, b) - target[None]) ** 2
    )
    ga, gb = jax.grad(loss, (0, 1))(ones, zeros)
    np.testing.assert_array_equal(ga, np.zeros(16))
    assert float(jnp.linalg.norm(gb)) > 1e-3

  def test_div_dim(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (3, 16))
    g, a, b = self._params(kp, 16)
    helpers.assert_close(
      norms.seed_norm(x, g, a, b, dyn_scale_div_dim=True),
      norms.seed_norm(x, g, a, b / 16),
      atol=1e-6,
    )

  def test_feature_axis(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (3, 16, 5))
    g, a, b = self._params(kp, 16)
    y = norms.seed_norm(x, g, a, b, axis=1, num_heads=2)
    ref = jnp.moveaxis(
      norms.seed_norm(jnp.moveaxis(x, 1, -1), g, a, b, num_heads=2), -1, 1
    )
    helpers.assert_close(y, ref, atol=1e-6)


class TestDyT:
  def test_bound(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (8, 16), scale=100.0)
    s, b = _params(kp, 16)
    y = norms.dyt(x, jnp.float32(0.7), s, b)
    assert bool(jnp.all(jnp.abs(y - b[None]) <= jnp.abs(s[None]) + 1e-6))

  def test_small_alpha_is_linear(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (8, 16))
    x = x * (0.05 / (1e-3 * jnp.max(jnp.abs(x))))
    s, _ = _params(kp, 16)
    alpha = jnp.float32(1e-3)
    y = norms.dyt(x, alpha, s) / alpha
    np.testing.assert_allclose(y, s[None] * x, rtol=1e-3)

  def test_rows_independent(self, key):
    x = _normal(key, (4, 8))
    y1 = norms.dyt(x, jnp.float32(0.5))
    y2 = norms.dyt(x.at[2].set(100.0), jnp.float32(0.5))
    np.testing.assert_array_equal(np.delete(y1, 2, 0), np.delete(y2, 2, 0))

  def test_alpha_gradient_formula(self, key):
    kx, kp, kg = jax.random.split(key, 3)
    x = _normal(kx, (4, 8))
    s, b = _params(kp, 8)
    g = _normal(kg, (4, 8))
    alpha = jnp.array([0.6])
    grad = jax.grad(lambda a: jnp.sum(g * norms.dyt(x, a, s, b)))(alpha)
    t = jnp.tanh(0.6 * x)
    expected = jnp.sum(g * s[None] * x * (1 - t * t))
    helpers.assert_close(grad, expected.reshape(1), atol=1e-5, rtol=1e-5)


class TestLayerNormScaling:
  def _block(self, key):
    kw, ks = jax.random.split(key)
    w = _normal(kw, (16, 16), scale=0.25)
    s, _ = _params(ks, 16)
    return (lambda h: jnp.tanh(h @ w)), (lambda h: norms.rms_norm(h, s)), s

  def test_factor(self):
    assert norms.layer_norm_scaling(0) == 1.0
    assert norms.layer_norm_scaling(3) == 0.5

  def test_first_block_is_vanilla(self, key):
    f, norm, _ = self._block(key)
    x = _normal(key, (4, 16))
    np.testing.assert_array_equal(
      residual.pre_norm(x, f, norm, layer_index=0),
      residual.pre_norm(x, f, norm),
    )

  def test_norm_output_scaled(self, key):
    _, norm, _ = self._block(key)
    x = _normal(key, (4, 16))
    seen = []
    residual.pre_norm(x, lambda h: seen.append(h) or h, norm, layer_index=8)
    helpers.assert_close(seen[0], norm(x) / 3.0, atol=1e-6)

  def test_folding_into_scale_reproduces_forward(self, key):
    f, norm, s = self._block(key)
    x = _normal(key, (4, 16))
    folded = lambda h: norms.rms_norm(h, s / 2.0)
    helpers.assert_close(
      residual.pre_norm(x, f, norm, layer_index=3),
      residual.pre_norm(x, f, folded),
      atol=1e-6,
    )

  def test_sandwich_and_post_norm(self, key):
    f, norm, _ = self._block(key)
    x = _normal(key, (4, 16))
    helpers.assert_close(residual.post_norm(x, f, norm), norm(x + f(x)), atol=0)
    helpers.assert_close(
      residual.sandwich_norm(x, f, norm, norm, layer_index=3),
      x + norm(f(norm(x) / 2.0)),
      atol=1e-6,
    )


# ---------------------------------------------------------------------------
# BatchNorm state and cross-device statistics.


class TestBatchNorm:
  def test_state_over_steps(self, key):
    state = norms.init_batch_norm_state(4)
    step = jax.jit(
      functools.partial(norms.batch_norm, training=True, momentum=0.9)
    )
    xs = [
      _normal(k, (8, 4), scale=2.0, shift=1.0) for k in jax.random.split(key, 3)
    ]
    mean, var = np.zeros(4), np.ones(4)
    for x in xs:
      _, state = step(x, None, None, state)
      xn = np.asarray(x, np.float64)
      mean = 0.9 * mean + 0.1 * xn.mean(0)
      var = 0.9 * var + 0.1 * xn.var(0)
      assert state.mean.dtype == jnp.float32
      assert jax.tree.structure(state) == jax.tree.structure(
        norms.init_batch_norm_state(4)
      )
    helpers.assert_close(state, norms.BatchNormState(mean, var), atol=1e-5)

  def test_eval_uses_running_stats(self, key):
    x = _normal(key, (8, 4))
    state = norms.BatchNormState(jnp.full(4, 0.5), jnp.full(4, 4.0))
    y, new = norms.batch_norm(x, None, None, state, training=False, eps=0.0)
    helpers.assert_close(y, (x - 0.5) / 2.0, atol=1e-6)
    assert new is state

  def test_cross_device_statistics(self, key):
    devices = jax.devices()[:4]
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    x = _normal(key, (16, 3, 6), scale=2.0, shift=1.0)
    scale, bias = _params(key, 6)
    state = norms.init_batch_norm_state(6)

    def local(x):
      return norms.batch_norm(
        x, scale, bias, state, training=True, axis_name="data"
      )

    sharded = jax.jit(
      jax.shard_map(
        local,
        mesh=mesh,
        in_specs=P("data"),
        out_specs=(P("data"), norms.BatchNormState(P(), P())),
      )
    )
    y, new_state = sharded(x)
    y_ref, state_ref = norms.batch_norm(x, scale, bias, state, training=True)
    helpers.assert_close(y, y_ref, atol=2e-6)
    helpers.assert_close(new_state, state_ref, atol=1e-6)


# ---------------------------------------------------------------------------
# Low precision and degenerate inputs.

_ALL_NORMS = {
  "layer_norm": lambda x, s: norms.layer_norm(x, s, s),
  "rms_norm": lambda x, s: norms.rms_norm(x, s),
  "rms_norm_outside": lambda x, s: norms.rms_norm(x, s, eps_mode="outside"),
  "crms_norm": lambda x, s: norms.crms_norm(x, s),
  "batch_norm": lambda x, s: norms.batch_norm(
    x, s, s, norms.init_batch_norm_state(x.shape[-1]), training=True
  )[0],
  "group_norm": lambda x, s: norms.group_norm(x, s, s, num_groups=4),
  "instance_norm": lambda x, s: norms.instance_norm(x, s, s),
  "dyt": lambda x, s: norms.dyt(x, jnp.ones((1,)), s, s),
  "seed_norm": lambda x, s: norms.seed_norm(x, s, s, s * 1e-3, num_heads=2),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("name", sorted(_ALL_NORMS))
@pytest.mark.parametrize("case", ["large", "zero_rows"])
def test_finite_outputs_and_gradients(key, dtype, name, case):
  if (
    name == "rms_norm_outside"
    and dtype == jnp.float16
    and (case == "zero_rows")
  ):
    pytest.skip(
      "the true slope at x=0 is 1/eps=1e6 > float16 max; "
      "test_outside_mode_slope_at_zero checks it"
    )
  fn = _ALL_NORMS[name]
  x = _normal(key, (2, 3, 8), scale=1e4 if case == "large" else 1.0)
  if case == "zero_rows":
    x = x.at[0].set(0.0).at[1, 1].set(0.0)
  x = x.astype(dtype)
  s = jnp.linspace(0.5, 1.5, 8)
  y = fn(x, s)
  assert y.dtype == dtype
  assert helpers.all_finite(y)
  grads = jax.grad(lambda x, s: jnp.sum(fn(x, s).astype(jnp.float32)), (0, 1))(
    x, s
  )
  assert grads[0].dtype == dtype and grads[1].dtype == jnp.float32
  assert helpers.all_finite(grads)


def test_outside_mode_slope_at_zero():
  # y = x / (rms(x) + eps) has slope 1/eps at x = 0, in every dtype.
  grad = jax.grad(
    lambda x: jnp.sum(
      norms.rms_norm(x, eps=1e-3, eps_mode="outside").astype(jnp.float32)
    )
  )
  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    g = grad(jnp.zeros((2, 4), dtype))
    helpers.assert_close(g, jnp.full((2, 4), 1e3, dtype), atol=0, rtol=4e-3)


def test_half_precision_statistics_in_float32(key):
  x = _normal(key, (4, 256), scale=3.0)
  y16 = norms.layer_norm(x.astype(jnp.bfloat16))
  ref = norms.layer_norm(x.astype(jnp.bfloat16).astype(jnp.float32))
  helpers.assert_close(y16, ref.astype(jnp.bfloat16), atol=0)


# ---------------------------------------------------------------------------
# Error paths.


class TestErrors:
  def test_integer_input(self):
    with pytest.raises(
      TypeError,
      match=r"layer_norm: x must have a floating"
      r" dtype .* got x.dtype=int32",
    ):
      norms.layer_norm(jnp.ones((2, 4), jnp.int32))

  def test_integer_scale(self):
    with pytest.raises(
      TypeError,
      match=r"rms_norm: scale must have a "
      r"floating dtype",
    ):
      norms.rms_norm(jnp.ones((2, 4)), jnp.ones(4, jnp.int32))

  def test_scale_shape(self):
    with pytest.raises(
      ValueError,
      match=r"rms_norm: scale must have shape "
      r"\(4,\) \(x.shape\[axis\] for axis=1\), got "
      r"scale.shape=\(3,\)",
    ):
      norms.rms_norm(jnp.ones((2, 4)), jnp.ones(3))

  def test_bias_shape(self):
    with pytest.raises(
      ValueError,
      match=r"layer_norm: bias must have shape "
      r"\(3, 4\)",
    ):
      norms.layer_norm(
        jnp.ones((2, 3, 4)), jnp.ones((3, 4)), jnp.ones(4), axis=(1, 2)
      )

  @pytest.mark.parametrize(
    "axis,match",
    [
      (2, r"axis must be integers in \[-2, 2\)"),
      ((), r"axis must name at least one axis"),
      ((0, -2), r"axis must not repeat"),
      (1.0, r"axis must be integers"),
    ],
  )
  def test_bad_axis(self, axis, match):
    with pytest.raises(ValueError, match=match):
      norms.layer_norm(jnp.ones((2, 4)), axis=axis)

  def test_eps_mode(self):
    with pytest.raises(
      ValueError,
      match=r"rms_norm: eps_mode must be one of "
      r"'inside', 'outside'; got 'middle'",
    ):
      norms.rms_norm(jnp.ones((2, 4)), eps_mode="middle")

  def test_errors_raise_at_trace_time(self):
    with pytest.raises(ValueError, match=r"scale must have shape"):
      jax.jit(norms.rms_norm).lower(
        jax.ShapeDtypeStruct((2, 4), jnp.float32),
        jax.ShapeDtypeStruct((5,), jnp.float32),
      )

  def test_group_norm_config(self):
    x = jnp.ones((2, 3, 6))
    with pytest.raises(
      ValueError,
      match=r"x.shape\[-1\]=6 must be divisible "
      r"by num_groups=4",
    ):
      norms.group_norm(x, num_groups=4)
    with pytest.raises(
      ValueError,
      match=r"exactly one of num_groups and "
      r"group_size",
    ):
      norms.group_norm(x, num_groups=2, group_size=3)
    with pytest.raises(
      ValueError,
      match=r"group_size must be a positive "
      r"integer, got group_size=0",
    ):
      norms.group_norm(x, num_groups=None, group_size=0)
    with pytest.raises(ValueError, match=r"divisible by group_size=4"):
      norms.group_norm(x, num_groups=None, group_size=4)
    with pytest.raises(ValueError, match=r"group_norm: x must have rank >= 2"):
      norms.group_norm(jnp.ones(6), num_groups=2)

  def test_instance_norm_rank(self):
    with pytest.raises(
      ValueError,
      match=r"instance_norm: x must have rank "
      r">= 3, got x.ndim=2",
    ):
      norms.instance_norm(jnp.ones((2, 6)))

  def test_batch_norm_state(self):
    x = jnp.ones((4, 6))
    with pytest.raises(TypeError, match=r"state must be a BatchNormState"):
      norms.batch_norm(
        x, None, None, (jnp.zeros(6), jnp.ones(6)), training=True
      )
    with pytest.raises(ValueError, match=r"state.mean must have shape \(6,\)"):
      norms.batch_norm(
        x, None, None, norms.init_batch_norm_state(5), training=True
      )
    bad_var = norms.BatchNormState(jnp.zeros(6), jnp.ones(5))
    with pytest.raises(ValueError, match=r"state.var must have shape \(6,\)"):
      norms.batch_norm(x, None, None, bad_var, training=True)
    with pytest.raises(ValueError, match=r"num_features must be a positive"):
      norms.init_batch_norm_state(0)

  def test_dyt_alpha(self):
    with pytest.raises(
      ValueError,
      match=r"dyt: alpha must be a scalar of "
      r"shape \(\) or \(1,\), got alpha.shape=\(4,\)",
    ):
      norms.dyt(jnp.ones((2, 4)), jnp.ones(4))
    with pytest.raises(TypeError, match=r"dyt: alpha must have a floating"):
      norms.dyt(jnp.ones((2, 4)), 1)

  def test_seed_norm(self):
    x, p = jnp.ones((2, 6)), jnp.ones(6)
    with pytest.raises(
      ValueError,
      match=r"x.shape\[axis\]=6 must be "
      r"divisible by num_heads=4",
    ):
      norms.seed_norm(x, p, p, p, num_heads=4)
    with pytest.raises(ValueError, match=r"seed_norm: dyn_proj is required"):
      norms.seed_norm(x, p, p, None)
    with pytest.raises(ValueError, match=r"dyn_scale must have shape \(6,\)"):
      norms.seed_norm(x, p, jnp.ones(5), p)
    with pytest.raises(ValueError, match=r"num_heads must be a positive"):
      norms.seed_norm(x, p, p, p, num_heads=0)

  def test_layer_norm_scaling_index(self):
    with pytest.raises(
      ValueError,
      match=r"layer_index must be a non-negative"
      r" integer",
    ):
      norms.layer_norm_scaling(-1)
