"""Tests of `jaxnorm.norms.scale_norm` and its module `nn.ScaleNorm`.

The worked example of CONTRIBUTING.md: this file, the function file, the
module file and one registry entry are all a new norm needs; the
registry-driven tests (degenerate inputs, causality, state, decay sets,
smoke training in the models) cover ``"scalenorm"`` without an edit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm import norms
from tests import helpers
from tests.norms import common


def _oracle(x, g, eps=1e-5):
  """The official layer in NumPy float64: g x / clamp(||x||, min=eps)."""
  x = np.asarray(x, np.float64)
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return g * x / np.maximum(norm, eps)


def test_matches_the_official_formula(key):
  x = common.normal(key, (3, 5, 16), scale=3.0)
  y = norms.scale_norm(x, jnp.float32(1.7))
  np.testing.assert_allclose(y, _oracle(x, 1.7), rtol=1e-6, atol=1e-6)


def test_output_lies_on_the_sphere_of_radius_scale(key):
  x = common.normal(key, (4, 32), shift=5.0)
  y = norms.scale_norm(x, jnp.float32(2.5))
  np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), 2.5, rtol=1e-6)


def test_invariant_to_positive_rescaling(key):
  x = common.normal(key, (4, 16))
  g = jnp.float32(1.3)
  helpers.assert_close(
    norms.scale_norm(37.0 * x, g), norms.scale_norm(x, g), atol=1e-6
  )


def test_clamp_below_eps_is_linear(key):
  x = 1e-8 * common.normal(key, (2, 8))
  y = norms.scale_norm(x, jnp.float32(2.0), eps=1e-5)
  np.testing.assert_allclose(y, 2.0 * x / 1e-5, rtol=1e-5)


def test_zero_rows_have_finite_gradients():
  x = jnp.zeros((2, 8)).at[1].set(1.0)
  gx, gs = jax.grad(
    lambda x, s: jnp.sum(norms.scale_norm(x, s) ** 2), argnums=(0, 1)
  )(x, jnp.float32(1.0))
  assert bool(jnp.all(jnp.isfinite(gx))) and bool(jnp.isfinite(gs))
  np.testing.assert_array_equal(gx[0], 0.0)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_at_1e4_keeps_dtype(dtype, key):
  x = common.normal(key, (2, 64), dtype=dtype, scale=1e4)
  y = norms.scale_norm(x, jnp.float32(8.0))
  assert y.dtype == dtype
  np.testing.assert_allclose(
    np.asarray(y, np.float32),
    _oracle(np.asarray(x, np.float32), 8.0),
    rtol=1e-2,
    atol=1e-2,
  )


def test_module_equals_function_and_initializes_to_sqrt_d(key):
  module = jnn.make_norm("scalenorm", 16, rngs=nnx.Rngs(0))
  assert isinstance(module, jnn.ScaleNorm)
  np.testing.assert_allclose(module.scale[...], [4.0])
  module.scale[...] = jnp.array([1.9])
  x = common.normal(key, (2, 3, 16))
  helpers.assert_close(module(x), norms.scale_norm(x, jnp.float32(1.9)), atol=0)


def test_errors():
  with pytest.raises(ValueError, match=r"scale_norm: scale must be a scalar"):
    norms.scale_norm(jnp.ones((2, 4)), jnp.ones(4))
  with pytest.raises(TypeError, match=r"scale_norm: x must have a floating"):
    norms.scale_norm(jnp.ones((2, 4), jnp.int32), jnp.float32(1.0))
  with pytest.raises(ValueError, match=r"scale_norm: axis=-1 needs an input"):
    norms.scale_norm(jnp.float32(1.0), jnp.float32(1.0))
  with pytest.raises(ValueError, match=r"ScaleNorm: num_features must be"):
    jnn.ScaleNorm(0, rngs=nnx.Rngs(0))
