"""Tests of `jaxnorm.norms.dyt`: bound, linear regime, gradients, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers
from tests.norms import common


class TestDyT:
  def test_bound(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (8, 16), scale=100.0)
    s, b = common.params(kp, 16)
    y = norms.dyt(x, jnp.float32(0.7), s, b)
    assert bool(jnp.all(jnp.abs(y - b[None]) <= jnp.abs(s[None]) + 1e-6))

  def test_small_alpha_is_linear(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (8, 16))
    x = x * (0.05 / (1e-3 * jnp.max(jnp.abs(x))))
    s, _ = common.params(kp, 16)
    alpha = jnp.float32(1e-3)
    y = norms.dyt(x, alpha, s) / alpha
    np.testing.assert_allclose(y, s[None] * x, rtol=1e-3)

  def test_rows_independent(self, key):
    x = common.normal(key, (4, 8))
    y1 = norms.dyt(x, jnp.float32(0.5))
    y2 = norms.dyt(x.at[2].set(100.0), jnp.float32(0.5))
    np.testing.assert_array_equal(np.delete(y1, 2, 0), np.delete(y2, 2, 0))

  def test_alpha_gradient_formula(self, key):
    kx, kp, kg = jax.random.split(key, 3)
    x = common.normal(kx, (4, 8))
    s, b = common.params(kp, 8)
    g = common.normal(kg, (4, 8))
    alpha = jnp.array([0.6])
    grad = jax.grad(lambda a: jnp.sum(g * norms.dyt(x, a, s, b)))(alpha)
    t = jnp.tanh(0.6 * x)
    expected = jnp.sum(g * s[None] * x * (1 - t * t))
    helpers.assert_close(grad, expected.reshape(1), atol=1e-5, rtol=1e-5)


class TestErrors:
  def test_dyt_alpha(self):
    with pytest.raises(
      ValueError,
      match=r"dyt: alpha must be a scalar of "
      r"shape \(\) or \(1,\), got alpha.shape=\(4,\)",
    ):
      norms.dyt(jnp.ones((2, 4)), jnp.ones(4))
    with pytest.raises(TypeError, match=r"dyt: alpha must have a floating"):
      norms.dyt(jnp.ones((2, 4)), 1)
