"""Tests of `jaxnorm.norms.layer_norm_scaling` inside residual blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms, residual
from tests import helpers
from tests.norms import common


class TestLayerNormScaling:
  def _block(self, key):
    kw, ks = jax.random.split(key)
    w = common.normal(kw, (16, 16), scale=0.25)
    s, _ = common.params(ks, 16)
    return (lambda h: jnp.tanh(h @ w)), (lambda h: norms.rms_norm(h, s)), s

  def test_factor(self):
    assert norms.layer_norm_scaling(0) == 1.0
    assert norms.layer_norm_scaling(3) == 0.5

  def test_first_block_is_vanilla(self, key):
    f, norm, _ = self._block(key)
    x = common.normal(key, (4, 16))
    np.testing.assert_array_equal(
      residual.pre_norm(x, f, norm, layer_index=0),
      residual.pre_norm(x, f, norm),
    )

  def test_norm_output_scaled(self, key):
    _, norm, _ = self._block(key)
    x = common.normal(key, (4, 16))
    seen = []
    residual.pre_norm(x, lambda h: seen.append(h) or h, norm, layer_index=8)
    helpers.assert_close(seen[0], norm(x) / 3.0, atol=1e-6)

  def test_folding_into_scale_reproduces_forward(self, key):
    f, norm, s = self._block(key)
    x = common.normal(key, (4, 16))
    folded = lambda h: norms.rms_norm(h, s / 2.0)
    helpers.assert_close(
      residual.pre_norm(x, f, norm, layer_index=3),
      residual.pre_norm(x, f, folded),
      atol=1e-6,
    )

  def test_sandwich_and_post_norm(self, key):
    f, norm, _ = self._block(key)
    x = common.normal(key, (4, 16))
    helpers.assert_close(residual.post_norm(x, f, norm), norm(x + f(x)), atol=0)
    helpers.assert_close(
      residual.sandwich_norm(x, f, norm, norm, layer_index=3),
      x + norm(f(norm(x) / 2.0)),
      atol=1e-6,
    )


class TestErrors:
  def test_layer_norm_scaling_index(self):
    with pytest.raises(
      ValueError,
      match=r"layer_index must be a non-negative"
      r" integer",
    ):
      norms.layer_norm_scaling(-1)
