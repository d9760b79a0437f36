"""Tests of `jaxnorm.norms.scale_vectors`: HG, DP/DNP, magnitude-direction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers
from tests.norms import common


class TestScaleVectors:
  def test_claim_init_is_baseline(self, key):
    kx, kw = jax.random.split(key)
    x = common.normal(kx, (3, 8))
    ones = jnp.ones(8)
    for y in norms.branch_rms_norm(x, [ones, ones, ones]):
      np.testing.assert_array_equal(y, norms.rms_norm(x, ones))
    w = common.normal(kw, (8, 5))
    helpers.assert_close(
      norms.dual_scaled_linear(x, w, ones, jnp.ones(5)), x @ w, atol=1e-6
    )
    helpers.assert_close(
      norms.magnitude_direction_scale(jnp.ones(()), ones), ones, atol=1e-6
    )

  def test_claim_branch_scale_folds_into_weight(self, key):
    kx, kg, kw = jax.random.split(key, 3)
    x = common.normal(kx, (3, 8))
    g_q, g_k = common.vec(kg, 8), jnp.ones(8)
    w_q = common.normal(kw, (8, 4))
    q, _ = norms.branch_rms_norm(x, [g_q, g_k])
    folded = norms.rms_norm(x) @ (g_q[:, None] * w_q)
    helpers.assert_close(q @ w_q, folded, atol=1e-5)

  def test_branches_are_independent(self, key):
    kx, kg = jax.random.split(key)
    x = common.normal(kx, (3, 8))
    g = common.vec(kg, 8)
    q, k, v = norms.branch_rms_norm(x, [g, 2 * g, jnp.ones(8)])
    helpers.assert_close(k, 2 * q, atol=1e-6)
    helpers.assert_close(v, norms.rms_norm(x), atol=1e-6)
    grads = jax.grad(
      lambda s: jnp.sum(norms.branch_rms_norm(x, [s[0], s[1]])[0] ** 2)
    )(jnp.stack([g, g]))
    np.testing.assert_array_equal(grads[1], np.zeros(8))

  def test_dual_placement_and_dnp(self, key):
    kx, k1, k2, kw = jax.random.split(key, 4)
    x, w = common.normal(kx, (3, 8)), common.normal(kw, (8, 5))
    s_in, s_out = common.vec(k1, 8), common.vec(k2, 5)
    y = norms.dual_scaled_linear(x, w, s_in, s_out)
    expected = np.asarray(s_out) * (
      (np.asarray(x) * np.asarray(s_in)) @ np.asarray(w)
    )
    helpers.assert_close(y, expected, atol=1e-5)
    helpers.assert_close(
      norms.dual_scaled_linear(x, w, s_in, s_out, dnp=True),
      norms.rms_norm(y),
      atol=1e-5,
    )
    helpers.assert_close(norms.dual_scaled_linear(x, w), x @ w, atol=1e-6)

  def test_magnitude_direction(self, key):
    u = common.vec(key, 8)
    gamma = norms.magnitude_direction_scale(jnp.array([2.0]), u)
    helpers.assert_close(jnp.linalg.norm(gamma), 2.0 * np.sqrt(8), atol=1e-5)
    helpers.assert_close(
      gamma / jnp.linalg.norm(gamma), u / jnp.linalg.norm(u), atol=1e-6
    )
    helpers.assert_close(
      norms.magnitude_direction_scale(jnp.ones(()), 5.0 * u),
      norms.magnitude_direction_scale(jnp.ones(()), u),
      atol=1e-6,
    )

  def test_errors(self):
    x = jnp.ones((3, 8))
    with pytest.raises(
      ValueError,
      match=r"branch_rms_norm: scales must hold "
      r"at least one",
    ):
      norms.branch_rms_norm(x, [])
    with pytest.raises(ValueError, match=r"scales\[1\] must have shape"):
      norms.branch_rms_norm(x, [jnp.ones(8), jnp.ones(4)])
    with pytest.raises(
      ValueError,
      match=r"dual_scaled_linear: kernel must "
      r"have shape \(8, 5\)",
    ):
      norms.dual_scaled_linear(x, jnp.ones((4, 5)))
    with pytest.raises(
      ValueError,
      match=r"scale_out must have shape "
      r"\(5,\)",
    ):
      norms.dual_scaled_linear(x, jnp.ones((8, 5)), None, jnp.ones(8))
    with pytest.raises(ValueError, match=r"magnitude must be a scalar"):
      norms.magnitude_direction_scale(jnp.ones(2), jnp.ones(8))
    with pytest.raises(ValueError, match=r"direction must have rank 1"):
      norms.magnitude_direction_scale(jnp.ones(()), x)
