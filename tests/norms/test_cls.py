"""Tests of `jaxnorm.norms.cls` ([CLS]-specialized norm and linear layers)
and of its module `jaxnorm.nn.CLSNorm`.
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


class TestSpecializedNorm:
  def _params(self, key, d=8):
    ks = jax.random.split(key, 4)
    return (
      common.vec(ks[0], d),
      common.vec(ks[1], d, 0.0),
      common.vec(ks[2], d),
      common.vec(ks[3], d, 0.0),
    )

  def test_claim_equal_params_is_layer_norm(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (2, 5, 8), shift=1.0)
    s, b, _, _ = self._params(kp)
    tt = norms.cls_token_type(5)
    helpers.assert_close(
      norms.specialized_layer_norm(x, tt, s, b, s, b),
      norms.layer_norm(x, s, b),
      atol=1e-6,
    )
    helpers.assert_close(
      norms.specialized_layer_norm(x, tt, s, None, s, None, kind="rms"),
      norms.rms_norm(x, s),
      atol=1e-6,
    )

  def test_tokens_select_their_affine(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (2, 5, 8))
    sc, bc, sp, bp = self._params(kp)
    tt = jnp.array([[1, 0, 0, 1, 0], [0, 0, 1, 0, 0]])
    y = np.asarray(norms.specialized_layer_norm(x, tt, sc, bc, sp, bp))
    cls = np.asarray(norms.layer_norm(x, sc, bc))
    patch = np.asarray(norms.layer_norm(x, sp, bp))
    sel = np.asarray(tt, bool)
    helpers.assert_close(y[sel], cls[sel], atol=1e-6)
    helpers.assert_close(y[~sel], patch[~sel], atol=1e-6)

  def test_claim_cls_scale_gradient_only_from_cls(self, key):
    kx, kp, kg = jax.random.split(key, 3)
    x = common.normal(kx, (2, 5, 8))
    sc, bc, sp, bp = self._params(kp)
    tt = norms.cls_token_type(5)
    gy = common.normal(kg, (2, 5, 8))
    g = jax.grad(
      lambda s: jnp.sum(gy * norms.specialized_layer_norm(x, tt, s, bc, sp, bp))
    )(sc)
    g_masked = jax.grad(
      lambda s: jnp.sum(
        gy.at[:, 1:].set(0.0)
        * norms.specialized_layer_norm(x, tt, s, bc, sp, bp)
      )
    )(sc)
    helpers.assert_close(g, g_masked, atol=1e-6)
    assert float(jnp.max(jnp.abs(g))) > 0

  def test_cls_token_type(self):
    np.testing.assert_array_equal(
      norms.cls_token_type(6, num_registers=2), [1, 0, 0, 0, 0, 0]
    )
    np.testing.assert_array_equal(
      norms.cls_token_type(6, num_registers=2, registers_with="cls"),
      [1, 1, 1, 0, 0, 0],
    )

  def test_specialized_linear(self, key):
    kx, k1, k2, k3, k4 = jax.random.split(key, 5)
    x = common.normal(kx, (2, 4, 6))
    wc, wp = common.normal(k1, (6, 3)), common.normal(k2, (6, 3))
    bc, bp = common.normal(k3, (3,)), common.normal(k4, (3,))
    tt = norms.cls_token_type(4)
    y = norms.specialized_linear(x, tt, wc, wp, bc, bp)
    helpers.assert_close(y[:, 0], x[:, 0] @ wc + bc[None], atol=1e-5)
    helpers.assert_close(y[:, 1:], x[:, 1:] @ wp + bp[None, None], atol=1e-5)
    helpers.assert_close(
      norms.specialized_linear(x, tt, wc, wc), x @ wc, atol=1e-6
    )

  def test_errors(self):
    x, p = jnp.ones((2, 5, 8)), jnp.ones(8)
    with pytest.raises(
      ValueError,
      match=r"token_type must have shape "
      r"x.shape\[:-1\]=\(2, 5\) or a suffix",
    ):
      norms.specialized_layer_norm(x, jnp.ones(4, jnp.int32), p, p, p, p)
    with pytest.raises(
      ValueError,
      match=r"give both bias_cls and "
      r"bias_patch or neither",
    ):
      norms.specialized_layer_norm(x, jnp.ones(5, jnp.int32), p, p, p, None)
    with pytest.raises(ValueError, match=r"kind must be one of"):
      norms.specialized_layer_norm(
        x, jnp.ones(5, jnp.int32), p, p, p, p, kind="group"
      )
    with pytest.raises(ValueError, match=r"need 0 <= num_cls_tokens"):
      norms.cls_token_type(3, num_registers=3)
    with pytest.raises(ValueError, match=r"registers_with must be one of"):
      norms.cls_token_type(3, registers_with="both")
    with pytest.raises(
      ValueError,
      match=r"kernel_patch must have shape "
      r"\(8, 3\)",
    ):
      norms.specialized_linear(
        x, jnp.ones(5, jnp.int32), jnp.ones((8, 3)), jnp.ones((8, 4))
      )
    with pytest.raises(ValueError, match=r"specialized_linear: give both"):
      norms.specialized_linear(
        x,
        jnp.ones(5, jnp.int32),
        jnp.ones((8, 3)),
        jnp.ones((8, 3)),
        jnp.ones(3),
      )


class TestCLSNormModule:
  def test_claim_clone_matches_shared(self, key):
    kx, ks = jax.random.split(key)
    x = common.normal(kx, (2, 5, 8), shift=0.5)
    for shared in (
      jnn.LayerNorm(8, rngs=nnx.Rngs(0)),
      jnn.RMSNorm(8, rngs=nnx.Rngs(0)),
    ):
      for name in ("scale", "bias"):
        var = getattr(shared, name, None)
        if var is not None:
          var[...] = var[...] + 0.3 * common.normal(ks, (8,))
      special = jnn.CLSNorm.from_shared(shared, num_registers=2)
      np.testing.assert_array_equal(special(x), shared(x))

  def test_registers_and_token_type(self, key):
    x = common.normal(key, (2, 5, 8))
    module = jnn.CLSNorm(
      8, num_registers=2, registers_with="cls", rngs=nnx.Rngs(0)
    )
    module.scale_cls[...] = jnp.full((8,), 2.0)
    y = module(x)
    ln = norms.layer_norm(x)
    helpers.assert_close(y[:, :3], 2.0 * ln[:, :3], atol=1e-6)
    helpers.assert_close(y[:, 3:], ln[:, 3:], atol=1e-6)
    y_given = module(x, jnp.array([0, 0, 0, 0, 1]))
    helpers.assert_close(y_given[:, 4], 2.0 * ln[:, 4], atol=1e-6)
    rms = jnn.CLSNorm(8, kind="rms", rngs=nnx.Rngs(0))
    assert rms.bias_cls is None

  def test_errors(self):
    with pytest.raises(
      TypeError,
      match=r"from_shared: norm must be a "
      r"LayerNorm or RMSNorm",
    ):
      jnn.CLSNorm.from_shared(jnn.DyT(4, rngs=nnx.Rngs(0)))
    with pytest.raises(
      ValueError,
      match=r"must have a scale and "
      r"scale_offset=0",
    ):
      jnn.CLSNorm.from_shared(
        jnn.RMSNorm(4, scale_offset=1.0, rngs=nnx.Rngs(0))
      )
    with pytest.raises(ValueError, match=r"shared LayerNorm must have a bias"):
      jnn.CLSNorm.from_shared(
        jnn.LayerNorm(4, use_bias=False, rngs=nnx.Rngs(0))
      )
    with pytest.raises(ValueError, match=r"must use eps_mode='inside'"):
      jnn.CLSNorm.from_shared(
        jnn.RMSNorm(4, eps_mode="outside", rngs=nnx.Rngs(0))
      )
    with pytest.raises(ValueError, match=r"CLSNorm: kind must be one of"):
      jnn.CLSNorm(4, kind="group", rngs=nnx.Rngs(0))
