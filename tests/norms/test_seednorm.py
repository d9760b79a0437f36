"""Tests of `jaxnorm.norms.seed_norm`: NumPy oracle and the paper's claims."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref


class TestSeeDNorm:
  def _params(self, key, d):
    k1, k2, k3 = jax.random.split(key, 3)
    return (
      1.0 + 0.2 * common.normal(k1, (d,)),
      0.5 + 0.2 * common.normal(k2, (d,)),
      0.3 * common.normal(k3, (d,)),
    )

  def test_zero_proj_equals_flax_rms_norm(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (4, 6, 16))
    gamma, alpha, _ = self._params(kp, 16)
    ref = nn.RMSNorm(epsilon=1e-6).apply({"params": {"scale": gamma}}, x)
    y = norms.seed_norm(x, gamma, alpha, jnp.zeros(16))
    helpers.assert_close(y, ref, atol=common.F32_TOL)

  @pytest.mark.parametrize("heads", [1, 4])
  def test_matches_numpy(self, key, heads):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (3, 5, 16))
    g, a, b = self._params(kp, 16)
    helpers.assert_close(
      norms.seed_norm(x, g, a, b, num_heads=heads),
      ref.seed_norm(x, g, a, b, heads),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_one_head_differs_from_rms_only_in_that_head(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (3, 16))
    g, a, b = self._params(kp, 16)
    b = b * (jnp.arange(16) // 4 == 2).astype(jnp.float32)
    y = norms.seed_norm(x, g, a, b, num_heads=4)
    rms = norms.rms_norm(x, g)
    diff = np.abs(np.asarray(y - rms)) > 1e-6
    assert not diff[:, :8].any() and not diff[:, 12:].any()
    assert diff[:, 8:12].any()

  def test_dynamic_scale_bound_for_large_inputs(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (64, 32))
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
    x = common.normal(key, (4, 16))
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
    x = common.normal(kx, (3, 16))
    g, a, b = self._params(kp, 16)
    helpers.assert_close(
      norms.seed_norm(x, g, a, b, dyn_scale_div_dim=True),
      norms.seed_norm(x, g, a, b / 16),
      atol=1e-6,
    )

  def test_feature_axis(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (3, 16, 5))
    g, a, b = self._params(kp, 16)
    y = norms.seed_norm(x, g, a, b, axis=1, num_heads=2)
    ref = jnp.moveaxis(
      norms.seed_norm(jnp.moveaxis(x, 1, -1), g, a, b, num_heads=2), -1, 1
    )
    helpers.assert_close(y, ref, atol=1e-6)


class TestErrors:
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
