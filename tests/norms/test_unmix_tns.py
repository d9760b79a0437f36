"""Tests of `jaxnorm.norms.unmix_tns` against NumPy float64 and its claims,
and of its module `jaxnorm.nn.UnMixTNS`.
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


class TestUnMixTNS:
  def _state(self, key, k=4, c=5):
    k1, k2, k3 = jax.random.split(key, 3)
    return norms.init_unmix_tns_state(
      0.5 * common.normal(k1, (c,)),
      common.vec(k2, c, 1.5, 0.3),
      k3,
      num_components=k,
    )

  def test_numpy_over_steps(self, key):
    kx, ks, kg, kb = jax.random.split(key, 4)
    state = self._state(ks)
    gamma, beta = common.vec(kg, 5), common.vec(kb, 5, 0.0)
    mu_k, var_k = np.asarray(state.mean), np.asarray(state.var)
    step = jax.jit(functools.partial(norms.unmix_tns, momentum=0.3))
    for k in jax.random.split(kx, 3):
      x = common.normal(k, (3, 4, 2, 5), scale=1.5, shift=0.4)
      y, state = step(x, gamma, beta, state)
      y_r, mu_k, var_k = ref.unmix_tns(
        x, gamma, beta, mu_k, var_k, momentum=0.3
      )
      helpers.assert_close(y, y_r, atol=2e-5, rtol=1e-5)
      helpers.assert_close(
        state, norms.UnMixTNSState(mu_k, var_k), atol=1e-5, rtol=1e-5
      )
      common.assert_same_structure(state, self._state(ks))

  def test_init(self, key):
    mean, var = jnp.linspace(-1, 1, 6), jnp.linspace(0.5, 2, 6)
    st = norms.init_unmix_tns_state(mean, var, key, num_components=4000)
    helpers.assert_close(
      st.var, np.broadcast_to(0.5 * np.asarray(var), (4000, 6)), atol=1e-6
    )
    # The mixture of the components has the source statistics.
    helpers.assert_close(jnp.mean(st.mean, 0), mean, atol=0.05)
    total = jnp.mean(st.var, 0) + jnp.var(st.mean, 0)
    helpers.assert_close(total, var, atol=0.1)
    one = norms.init_unmix_tns_state(mean, var, key, num_components=1)
    helpers.assert_close(
      one, norms.UnMixTNSState(mean[None], var[None]), atol=0
    )

  def test_claim_one_component_is_instance_norm(self, key):
    kx, ks, kg, kb = jax.random.split(key, 4)
    x = common.normal(kx, (3, 4, 4, 5), scale=2.0, shift=0.5)
    gamma, beta = common.vec(kg, 5), common.vec(kb, 5, 0.0)
    state = self._state(ks, k=1)
    y, _ = norms.unmix_tns(x, gamma, beta, state, eps=1e-5)
    helpers.assert_close(
      y, norms.instance_norm(x, gamma, beta, eps=1e-5), atol=2e-5
    )

  def test_claim_equal_components(self, key):
    kx, km = jax.random.split(key)
    x = common.normal(kx, (3, 4, 4, 5), scale=2.0, shift=0.5)
    mu_s, var_s = common.normal(km, (5,)), jnp.full((5,), 2.0)
    k = 4
    state = norms.UnMixTNSState(
      jnp.tile(mu_s[None], (k, 1)), jnp.tile(var_s[None], (k, 1))
    )
    # All components equal: p = 1/K, so mu_b = ((K-1)/K) mu_s + mu_t / K.
    y, _ = norms.unmix_tns(x, None, None, state, eps=0.0)
    xn = np.asarray(x, np.float64).reshape(3, -1, 5)
    mu_t, var_t = xn.mean(1), xn.var(1)
    mu_b = (k - 1) / k * np.asarray(mu_s) + mu_t / k
    m = np.stack([(1 - 1 / k) * np.asarray(mu_s) + mu_t / k] * k, 1)
    v = (1 - 1 / k) * 2.0 + var_t / k
    var_b = v + (m**2).mean(1) - mu_b**2
    expected = (xn - mu_b[:, None]) / np.sqrt(var_b[:, None])
    helpers.assert_close(y, expected.reshape(x.shape), atol=2e-5, rtol=1e-5)

  def test_claim_fixed_point(self):
    mu, var = jnp.array([1.0, -2.0, 0.5]), jnp.array([0.5, 2.0, 1.0])
    # Every instance has mean mu and variance var: +/- sqrt(var) around mu.
    x = (
      mu[None] + jnp.sqrt(var)[None] * jnp.array([1.0, -1.0])[:, None]
    ).reshape(1, 2, 1, 3)
    x = jnp.tile(x, (4, 1, 1, 1))
    state = norms.UnMixTNSState(
      jnp.tile(mu[None], (3, 1)), jnp.tile(var[None], (3, 1))
    )
    _, new = norms.unmix_tns(x, None, None, state, momentum=0.5)
    helpers.assert_close(new, state, atol=1e-6)

  def test_gradient_flows_through_instance_stats(self, key):
    kx, ks = jax.random.split(key)
    x = common.normal(kx, (2, 3, 3, 5))
    state = self._state(ks)
    g = jax.jit(
      jax.grad(
        lambda x: jnp.sum(
          norms.unmix_tns(x, None, None, state)[0]
          * jnp.arange(5.0)[None, None, None]
        )
      )
    )(x)
    assert helpers.all_finite(g) and float(jnp.max(jnp.abs(g))) > 0

  def test_momentum(self):
    assert norms.unmix_tns_momentum(64) == pytest.approx(0.1)
    assert norms.unmix_tns_momentum(16, max_batch_size=16) == pytest.approx(0.1)
    assert norms.unmix_tns_momentum(32) == pytest.approx(1 - 0.9**0.5)

  def test_update_false_and_cross_device(self, key):
    kx, ks = jax.random.split(key)
    x = common.normal(kx, (8, 3, 3, 5), scale=2.0)
    state = self._state(ks)
    _, same = norms.unmix_tns(x, None, None, state, update=False)
    assert same is state
    sharded = jax.jit(
      jax.shard_map(
        lambda x: norms.unmix_tns(x, None, None, state, axis_name="data"),
        mesh=common.mesh4(),
        in_specs=P("data"),
        out_specs=(P("data"), norms.UnMixTNSState(P(), P())),
      )
    )
    y, new = sharded(x)
    y_r, new_r = norms.unmix_tns(x, None, None, state)
    helpers.assert_close(y, y_r, atol=2e-6)
    helpers.assert_close(new, new_r, atol=1e-6)

  def test_errors(self, key):
    x, st = jnp.ones((2, 3, 3, 5)), self._state(key)
    with pytest.raises(TypeError, match=r"state must be a UnMixTNSState"):
      norms.unmix_tns(x, None, None, tuple(st))
    with pytest.raises(
      ValueError,
      match=r"state.mean must have shape "
      r"\(4, 5\)",
    ):
      norms.unmix_tns(
        x, None, None, norms.UnMixTNSState(jnp.ones((4, 4)), jnp.ones((4, 5)))
      )
    with pytest.raises(ValueError, match=r"unmix_tns: x must have rank >= 3"):
      norms.unmix_tns(jnp.ones((2, 5)), None, None, st)
    with pytest.raises(ValueError, match=r"var must have shape \(5,\)"):
      norms.init_unmix_tns_state(jnp.ones(5), jnp.ones(4), key)
    with pytest.raises(ValueError, match=r"num_components must be a positive"):
      norms.init_unmix_tns_state(
        jnp.ones(5), jnp.ones(5), key, num_components=0
      )
    with pytest.raises(ValueError, match=r"batch_size must be a positive"):
      norms.unmix_tns_momentum(0)


class TestUnMixTNSModule:
  def test_from_batch_norm_and_updates(self, key):
    bn = jnn.BatchNorm(5, rngs=nnx.Rngs(0))
    bn(common.normal(key, (16, 5), scale=2.0, shift=1.0))
    bn.scale[...] = jnp.linspace(0.5, 1.5, 5)
    module = jnn.UnMixTNS.from_batch_norm(
      bn, num_components=1, rngs=nnx.Rngs(1)
    )
    assert module.eps == bn.eps
    helpers.assert_close(module.mean[...], bn.mean[...][None], atol=0)
    x = common.normal(key, (4, 3, 3, 5))
    helpers.assert_close(
      module(x),
      norms.instance_norm(x, bn.scale[...], bn.bias[...], eps=bn.eps),
      atol=2e-5,
    )
    assert not np.allclose(module.mean[...], bn.mean[...][None])
    assert isinstance(module.mean, nnx.BatchStat)
