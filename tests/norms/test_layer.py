"""Tests of `jaxnorm.norms.layer`: LayerNorm, RMSNorm, CRMSNorm.

Oracles: flax.linen layers (forward and VJP), NumPy float64 transcriptions
of the equations, and the invariants the papers state.
"""

import functools

import flax.linen as nn
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref


class TestFlaxParity:
  def test_layer_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, (4, 7, 16), shift=0.5)
    scale, bias = common.params(kp, 16)
    ref = nn.LayerNorm(epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    helpers.assert_vjp_matches(
      norms.layer_norm,
      oracle,
      (x, scale, bias),
      key=kc,
      atol=common.F32_TOL,
      rtol=common.F32_TOL,
    )

  def test_layer_norm_multiple_axes(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, (3, 5, 6))
    s = 1.0 + 0.3 * common.normal(kp, (5, 6))
    ref = nn.LayerNorm(
      epsilon=1e-6,
      reduction_axes=(-2, -1),
      feature_axes=(-2, -1),
      use_bias=False,
    )
    oracle = lambda x, s: ref.apply({"params": {"scale": s}}, x)
    fn = lambda x, s: norms.layer_norm(x, s, axis=(-2, -1))
    helpers.assert_vjp_matches(
      fn, oracle, (x, s), key=kc, atol=common.F32_TOL, rtol=common.F32_TOL
    )

  def test_rms_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, (4, 7, 16), shift=0.5)
    scale, _ = common.params(kp, 16)
    ref = nn.RMSNorm(epsilon=1e-6)
    oracle = lambda x, s: ref.apply({"params": {"scale": s}}, x)
    helpers.assert_vjp_matches(
      norms.rms_norm,
      oracle,
      (x, scale),
      key=kc,
      atol=common.F32_TOL,
      rtol=common.F32_TOL,
    )


class TestFormulas:
  def test_layer_norm_numpy(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (5, 33), scale=3.0, shift=2.0)
    s, b = common.params(kp, 33)
    helpers.assert_close(
      norms.layer_norm(x, s, b), ref.layer_norm(x, s, b), atol=2e-6, rtol=1e-5
    )

  @pytest.mark.parametrize(
    "eps_mode,eps", [("inside", 1e-6), ("outside", 1e-8)]
  )
  def test_rms_norm_numpy(self, key, eps_mode, eps):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (5, 33), scale=3.0)
    s, _ = common.params(kp, 33)
    helpers.assert_close(
      norms.rms_norm(x, s, eps=eps, eps_mode=eps_mode),
      ref.rms_norm(x, s, eps, eps_mode),
      atol=2e-6,
      rtol=1e-5,
    )

  @pytest.mark.parametrize(
    "fn",
    [
      lambda x, s: norms.layer_norm(x, s, s, scale_offset=1.0),
      lambda x, s: norms.rms_norm(x, s, scale_offset=1.0),
      lambda x, s: norms.rms_norm(x, s, eps_mode="outside"),
    ],
  )
  def test_reference_is_differentiated_by_autodiff(self, fn):
    # No custom rule in what jax.grad differentiates: the hand-derived
    # backward is the kernel's (pallas_kernels.norms), tested against
    # autodiff of this reference.
    jaxpr = str(jax.make_jaxpr(fn)(jnp.ones((3, 10)), jnp.ones(10)))
    assert "custom_vjp" not in jaxpr and "custom_jvp" not in jaxpr

  @pytest.mark.parametrize(
    "fn",
    [
      lambda x, s: norms.layer_norm(x, s, s),
      lambda x, s: norms.layer_norm(x, s, s, scale_offset=1.0),
      lambda x, s: norms.rms_norm(x, s),
      lambda x, s: norms.rms_norm(x, s, scale_offset=1.0),
      lambda x, s: norms.rms_norm(x, s, eps_mode="outside"),
      lambda x, s: norms.rms_norm(x, s, eps_mode="outside", scale_offset=1.0),
      lambda x, s: norms.rms_norm(x),
      lambda x, s: norms.layer_norm(x),
    ],
  )
  def test_numerical_gradients(self, key, fn):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (3, 6))
    s, _ = common.params(kp, 6)
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
    x = common.normal(key, (2, 3, 8))
    helpers.assert_jit_matches_eager(fn, x)

  def test_vmap_equals_batched(self, key):
    x = common.normal(key, (4, 5, 8))
    s = jnp.linspace(0.5, 1.5, 8)
    helpers.assert_close(
      jax.vmap(lambda r: norms.rms_norm(r, s))(x),
      norms.rms_norm(x, s),
      atol=common.F32_TOL,
    )
    helpers.assert_close(
      jax.vmap(lambda r: norms.layer_norm(r, s))(x),
      norms.layer_norm(x, s),
      atol=common.F32_TOL,
    )

  def test_float64_inputs_stay_float64(self, key):
    with jax.enable_x64(True):
      x = np.asarray(jax.random.normal(key, (3, 9)), np.float64)
      s = np.linspace(0.5, 1.5, 9)
      y = norms.layer_norm(jnp.asarray(x), jnp.asarray(s))
      assert y.dtype == jnp.float64
      np.testing.assert_allclose(y, ref.layer_norm(x, s, 0.0), atol=1e-12)


class TestLayerRmsClaims:
  def test_layer_norm_is_rms_of_centered(self, key):
    x = common.normal(key, (4, 32), shift=3.0)
    centered = x - jnp.mean(x, -1, keepdims=True)
    helpers.assert_close(
      norms.layer_norm(x), norms.rms_norm(centered), atol=2e-6
    )

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(a=st.floats(1e-2, 1e2), seed=st.integers(0, 2**16))
  def test_rms_scale_invariance(self, a, seed):
    x = common.normal(jax.random.key(seed), (3, 16))
    y1 = norms.rms_norm(x * a, eps=0.0)
    y2 = norms.rms_norm(x, eps=0.0)
    helpers.assert_close(y1, y2, atol=1e-5)

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(
    a=st.floats(1e-1, 1e1), c=st.floats(-10, 10), seed=st.integers(0, 2**16)
  )
  def test_layer_norm_affine_invariance(self, a, c, seed):
    x = common.normal(jax.random.key(seed), (3, 16))
    y1 = norms.layer_norm(x * a + c, eps=0.0)
    helpers.assert_close(y1, norms.layer_norm(x, eps=0.0), atol=5e-5)

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(seed=st.integers(0, 2**16))
  def test_rms_output_has_unit_rms(self, seed):
    x = common.normal(jax.random.key(seed), (3, 64), scale=5.0)
    y = norms.rms_norm(x, eps=0.0)
    helpers.assert_close(jnp.sqrt(jnp.mean(y * y, -1)), jnp.ones(3), atol=1e-5)

  def test_eps_modes_agree_near_unit_rms(self, key):
    x = common.normal(key, (8, 256))
    x = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True))
    helpers.assert_close(
      norms.rms_norm(x, eps=1e-8, eps_mode="inside"),
      norms.rms_norm(x, eps=1e-8, eps_mode="outside"),
      atol=1e-6,
    )

  def test_large_mean_keeps_precision(self, key):
    # Two-pass variance: a 1e4 offset does not swamp a unit-variance signal.
    x = common.normal(key, (4, 64), shift=1e4)
    y = norms.layer_norm(x, eps=0.0)
    expected = ref.layer_norm(np.asarray(x, np.float64), 1.0, 0.0, eps=0.0)
    helpers.assert_close(y, expected, atol=1e-2)


class TestCRMSNorm:
  def test_equals_rms_on_uncompressed_zero_mean(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (5, 17), scale=2.0)
    x = x - jnp.mean(x, -1, keepdims=True)
    s, _ = common.params(kp, 16)
    full = norms.rms_norm(x, jnp.concatenate([s, jnp.ones(1)]))
    helpers.assert_close(norms.crms_norm(x[:, :-1], s), full[:, :-1], atol=2e-6)

  def test_formula_denominator_uses_full_width(self):
    z = jnp.array([[1.0, 2.0, 3.0]])
    expected = z / np.sqrt((14.0 + 36.0) / 4.0 + 1e-6)
    helpers.assert_close(norms.crms_norm(z), expected, atol=1e-6)


def test_outside_mode_slope_at_zero():
  # y = x / (rms(x) + eps) has slope 1/eps at x = 0, in every dtype (the
  # guarded root: autodiff through a bare sqrt gives NaN there).
  grad = jax.grad(
    lambda x: jnp.sum(
      norms.rms_norm(x, eps=1e-3, eps_mode="outside").astype(jnp.float32)
    )
  )
  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    g = grad(jnp.zeros((2, 4), dtype))
    helpers.assert_close(g, jnp.full((2, 4), 1e3, dtype), atol=0, rtol=4e-3)


def test_half_precision_statistics_in_float32(key):
  x = common.normal(key, (4, 256), scale=3.0)
  y16 = norms.layer_norm(x.astype(jnp.bfloat16))
  ref = norms.layer_norm(x.astype(jnp.bfloat16).astype(jnp.float32))
  helpers.assert_close(y16, ref.astype(jnp.bfloat16), atol=0)


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
