"""Tests of `jaxnorm.norms.batch`: BatchNorm, GroupNorm, InstanceNorm.

Oracles: flax.linen layers, NumPy float64 transcriptions; the empty batch,
the per-token (sequence) form of GroupNorm and its causality.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref


class TestFlaxParity:
  def test_group_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, (2, 5, 3, 12), shift=0.5)
    scale, bias = common.params(kp, 12)
    ref = nn.GroupNorm(num_groups=4, epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    fn = functools.partial(norms.group_norm, num_groups=4)
    helpers.assert_vjp_matches(
      fn,
      oracle,
      (x, scale, bias),
      key=kc,
      atol=common.F32_TOL,
      rtol=common.F32_TOL,
    )

  def test_group_norm_group_size(self, key):
    x = common.normal(key, (2, 4, 12))
    np.testing.assert_array_equal(
      norms.group_norm(x, group_size=3, num_groups=None),
      norms.group_norm(x, num_groups=4),
    )

  def test_instance_norm(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, (2, 5, 3, 6), shift=0.5)
    scale, bias = common.params(kp, 6)
    ref = nn.InstanceNorm(epsilon=1e-6)
    oracle = lambda x, s, b: ref.apply({"params": {"scale": s, "bias": b}}, x)
    helpers.assert_vjp_matches(
      norms.instance_norm,
      oracle,
      (x, scale, bias),
      key=kc,
      atol=common.F32_TOL,
      rtol=common.F32_TOL,
    )

  @pytest.mark.parametrize("training", [True, False])
  def test_batch_norm(self, key, training):
    kx, kp, ks, kc = jax.random.split(key, 4)
    x = common.normal(kx, (6, 5, 8), shift=0.5)
    scale, bias = common.params(kp, 8)
    k1, k2 = jax.random.split(ks)
    state = norms.BatchNormState(
      mean=0.1 * common.normal(k1, (8,)),
      var=1.0 + 0.2 * jnp.abs(common.normal(k2, (8,))),
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
    helpers.assert_close(y, y_ref, atol=common.F32_TOL, rtol=common.F32_TOL)
    helpers.assert_close(
      stats, stats_ref, atol=common.F32_TOL, rtol=common.F32_TOL
    )
    first = lambda f: lambda *a: f(*a)[0]
    helpers.assert_vjp_matches(
      first(fn),
      first(oracle),
      (x, scale, bias),
      key=kc,
      atol=common.F32_TOL,
      rtol=common.F32_TOL,
    )


class TestFormulas:
  def test_group_norm_numpy(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (2, 3, 4, 8), scale=2.0, shift=1.0)
    s, b = common.params(kp, 8)
    helpers.assert_close(
      norms.group_norm(x, s, b, num_groups=2),
      ref.group_norm(x, s, b, 2),
      atol=2e-6,
      rtol=1e-5,
    )


class TestBatchNorm:
  def test_state_over_steps(self, key):
    state = norms.init_batch_norm_state(4)
    step = jax.jit(
      functools.partial(norms.batch_norm, training=True, momentum=0.9)
    )
    xs = [
      common.normal(k, (8, 4), scale=2.0, shift=1.0)
      for k in jax.random.split(key, 3)
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
    x = common.normal(key, (8, 4))
    state = norms.BatchNormState(jnp.full(4, 0.5), jnp.full(4, 4.0))
    y, new = norms.batch_norm(x, None, None, state, training=False, eps=0.0)
    helpers.assert_close(y, (x - 0.5) / 2.0, atol=1e-6)
    assert new is state

  def test_cross_device_statistics(self, key):
    devices = jax.devices()[:4]
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    x = common.normal(key, (16, 3, 6), scale=2.0, shift=1.0)
    scale, bias = common.params(key, 6)
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


class TestErrors:
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


# ---------------------------------------------------------------------------
# Issue 12: the empty batch and the per-token (sequence) form of GroupNorm.

_bn_train = jax.jit(functools.partial(norms.batch_norm, training=True))


class TestEmptyBatch:
  def test_state_unchanged_and_output_empty(self):
    state = norms.BatchNormState(jnp.full(4, 0.25), jnp.full(4, 3.0))
    x = jnp.zeros((0, 5, 4), jnp.bfloat16)
    y, new = _bn_train(x, jnp.ones(4), jnp.zeros(4), state)
    assert y.shape == x.shape and y.dtype == x.dtype
    helpers.assert_close(new, state, atol=0)
    common.assert_same_structure(new, state)

  def test_gradients_are_empty_and_finite(self):
    state = norms.init_batch_norm_state(3)
    loss = lambda x, s: jnp.sum(_bn_train(x, s, None, state)[0])
    gx, gs = jax.grad(loss, (0, 1))(jnp.zeros((0, 3)), jnp.ones(3))
    assert gx.shape == (0, 3)
    np.testing.assert_array_equal(gs, np.zeros(3))


_TOKENS = (2, 5, 12)  # (batch, seq, d)
_gn_tokens = jax.jit(
  functools.partial(norms.group_norm, num_groups=4, reduction_axes=-1)
)


class TestGroupNormPerToken:
  def test_numpy(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, _TOKENS, scale=2.0, shift=1.0)
    s, b = common.params(kp, 12)
    helpers.assert_close(
      _gn_tokens(x, s, b),
      ref.group_norm(x, s, b, 4, per_token=True),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_flax_reduction_axes(self, key):
    kx, kp, kc = jax.random.split(key, 3)
    x = common.normal(kx, _TOKENS, shift=0.5)
    scale, bias = common.params(kp, 12)
    flax_gn = nn.GroupNorm(
      num_groups=4, epsilon=1e-6, reduction_axes=-1, use_fast_variance=False
    )
    oracle = lambda x, s, b: flax_gn.apply(
      {"params": {"scale": s, "bias": b}}, x
    )
    helpers.assert_vjp_matches(
      _gn_tokens, oracle, (x, scale, bias), key=kc, atol=1e-5, rtol=1e-5
    )

  def test_causal(self, key):
    k1, k2 = jax.random.split(key)
    x = common.normal(k1, _TOKENS)
    x2 = x.at[:, -1].set(common.normal(k2, (2, 12), scale=5.0))
    y, y2 = _gn_tokens(x, None, None), _gn_tokens(x2, None, None)
    np.testing.assert_array_equal(y[:, :-1], y2[:, :-1])
    assert not np.allclose(y[:, -1], y2[:, -1])
    # The image form takes statistics over the sequence: later tokens leak.
    full = functools.partial(norms.group_norm, num_groups=4)
    assert not np.allclose(full(x)[:, :-1], full(x2)[:, :-1])

  def test_one_group_per_token_is_layer_norm(self, key):
    x = common.normal(key, _TOKENS, shift=3.0)
    helpers.assert_close(
      norms.group_norm(x, num_groups=1, reduction_axes=-1, eps=1e-5),
      norms.layer_norm(x, eps=1e-5),
      atol=2e-6,
    )

  def test_explicit_axes_equal_default(self, key):
    x = common.normal(key, (2, 3, 4, 8))
    np.testing.assert_array_equal(
      norms.group_norm(x, num_groups=2, reduction_axes=(1, 2, 3)),
      norms.group_norm(x, num_groups=2),
    )

  def test_errors(self):
    x = jnp.ones(_TOKENS)
    with pytest.raises(
      ValueError,
      match=r"group_norm: reduction_axes must include the channel axis -1",
    ):
      norms.group_norm(x, num_groups=4, reduction_axes=1)
    with pytest.raises(
      ValueError, match=r"group_norm: reduction_axes must be integers in"
    ):
      norms.group_norm(x, num_groups=4, reduction_axes=(-1, 3))
    with pytest.raises(
      ValueError, match=r"group_norm: reduction_axes must name at least one"
    ):
      norms.group_norm(x, num_groups=4, reduction_axes=())
    with pytest.raises(
      ValueError, match=r"group_norm: reduction_axes=-1 needs an input of"
    ):
      norms.group_norm(jnp.float32(1.0), num_groups=1, reduction_axes=-1)
