"""Tests of `jaxnorm.norms.l1`: L1 LayerNorm and L1 BatchNorm, functions and
modules.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxnorm import nn as jnn
from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref


class TestL1Norm:
  def test_numpy(self, key):
    kx, kg, kb = jax.random.split(key, 3)
    x = common.normal(kx, (4, 33), scale=3.0, shift=1.0)
    g, b = common.vec(kg, 33), common.vec(kb, 33, 0.0)
    helpers.assert_close(
      norms.l1_layer_norm(x, g, b),
      ref.l1_layer_norm(x, g, b),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_claim_gaussian_unit_std(self, key):
    y = norms.l1_layer_norm(
      common.normal(key, (4, 4096), scale=3.0, shift=2.0), eps=0.0
    )
    np.testing.assert_allclose(np.std(np.asarray(y), axis=-1), 1.0, atol=0.02)

  def test_claim_affine_invariance(self, key):
    x = common.normal(key, (3, 16))
    for a, c in ((0.1, -3.0), (7.0, 5.0)):
      helpers.assert_close(
        norms.l1_layer_norm(x * a + c, eps=0.0),
        norms.l1_layer_norm(x, eps=0.0),
        atol=5e-5,
      )

  def test_eps_modes(self, key):
    x = common.normal(key, (3, 16))
    xn = np.asarray(x, np.float64)
    s1 = np.abs(xn - xn.mean(-1, keepdims=True)).mean(-1, keepdims=True)
    k = np.sqrt(np.pi / 2)
    inside = norms.l1_layer_norm(x, eps=0.1, eps_mode="inside")
    helpers.assert_close(
      inside,
      (xn - xn.mean(-1, keepdims=True)) / np.sqrt((k * s1) ** 2 + 0.1),
      atol=1e-6,
    )
    helpers.assert_close(
      norms.l1_layer_norm(x, eps=0.1, kappa=1.0),
      (xn - xn.mean(-1, keepdims=True)) / (s1 + 0.1),
      atol=1e-6,
    )

  def test_claim_running_stats_converge(self, key):
    x = common.normal(key, (64, 6), scale=2.0, shift=1.0)
    state = norms.init_l1_batch_norm_state(6)
    step = jax.jit(
      functools.partial(norms.l1_batch_norm, training=True, momentum=0.5)
    )
    for _ in range(40):
      y_train, state = step(x, None, None, state)
      common.assert_same_structure(state, norms.init_l1_batch_norm_state(6))
    xn = np.asarray(x, np.float64)
    mu = xn.mean(0)
    dev = np.sqrt(np.pi / 2) * np.abs(xn - mu).mean(0)
    helpers.assert_close(state, norms.L1BatchNormState(mu, dev), atol=1e-5)
    y_eval, same = norms.l1_batch_norm(x, None, None, state, training=False)
    assert same is state
    helpers.assert_close(y_eval, y_train, atol=1e-5)
    helpers.assert_close(y_train, (xn - mu) / (dev + 1e-5), atol=1e-5)

  def test_cross_device(self, key):
    x = common.normal(key, (8, 3, 4), scale=2.0, shift=0.5)
    state = norms.init_l1_batch_norm_state(4)
    sharded = jax.jit(
      jax.shard_map(
        lambda x: norms.l1_batch_norm(
          x, None, None, state, training=True, axis_name="data"
        ),
        mesh=common.mesh4(),
        in_specs=P("data"),
        out_specs=(P("data"), norms.L1BatchNormState(P(), P())),
      )
    )
    y, new = sharded(x)
    y_r, new_r = norms.l1_batch_norm(x, None, None, state, training=True)
    helpers.assert_close((y, new), (y_r, new_r), atol=2e-6)

  def test_errors(self):
    x = jnp.ones((3, 4))
    with pytest.raises(
      ValueError,
      match=r"l1_layer_norm: eps_mode must be "
      r"one of",
    ):
      norms.l1_layer_norm(x, eps_mode="around")
    with pytest.raises(
      ValueError,
      match=r"l1_layer_norm: scale must have "
      r"shape \(4,\)",
    ):
      norms.l1_layer_norm(x, jnp.ones(3))
    with pytest.raises(TypeError, match=r"state must be a L1BatchNormState"):
      norms.l1_batch_norm(
        x, None, None, (jnp.ones(4), jnp.ones(4)), training=True
      )
    with pytest.raises(ValueError, match=r"state.dev must have shape"):
      norms.l1_batch_norm(
        x,
        None,
        None,
        norms.L1BatchNormState(jnp.ones(4), jnp.ones(3)),
        training=True,
      )
    with pytest.raises(ValueError, match=r"num_features must be a positive"):
      norms.init_l1_batch_norm_state(0)


def test_l1_batch_norm_empty_batch_keeps_state():
  state = norms.L1BatchNormState(jnp.full(3, 0.5), jnp.full(3, 2.0))
  y, new = jax.jit(functools.partial(norms.l1_batch_norm, training=True))(
    jnp.zeros((0, 3), jnp.float16), None, None, state
  )
  assert y.shape == (0, 3) and y.dtype == jnp.float16
  helpers.assert_close(new, state, atol=0)


class TestL1BatchNormModule:
  def test_train_eval(self, key):
    module = jnn.L1BatchNorm(4, momentum=0.0, rngs=nnx.Rngs(0))
    x = common.normal(key, (16, 4), scale=2.0, shift=1.0)
    y_train = module(x)
    module.eval()
    helpers.assert_close(module(x), y_train, atol=1e-5)
    with pytest.raises(ValueError, match=r"L1BatchNorm: eps_mode must be"):
      jnn.L1BatchNorm(4, eps_mode="x", rngs=nnx.Rngs(0))
