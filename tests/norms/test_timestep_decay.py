"""Tests of `jaxnorm.norms.timestep_decay_norm` (Gecko) and its module."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref

# One compiled function per shape, shared by the claims below.
_tdn = jax.jit(norms.timestep_decay_norm, static_argnames=("num_groups",))


class TestTimestepDecayNorm:
  def test_numpy_with_pads_bos_and_state(self, key):
    kx, kw, kb, kp, ko, k1, k2 = jax.random.split(key, 7)
    x = common.normal(kx, (2, 6, 8), scale=2.0, shift=0.5)
    w, b = common.vec(kw, 8, 0.0), common.vec(kb, 8, 0.0)
    pad = jax.random.bernoulli(kp, 0.3, (2, 6))
    bos = jax.random.bernoulli(ko, 0.3, (2, 6))
    state = norms.TimestepDecayNormState(
      jnp.array([0, 3], jnp.int32),
      0.3 * common.normal(k1, (2, 2)),
      jnp.abs(common.normal(k2, (2, 2))),
    )
    kw_ = {"num_groups": 2, "beta1": 0.9, "beta2": 0.99}
    y, new = jax.jit(functools.partial(norms.timestep_decay_norm, **kw_))(
      x, w, b, state, padding_mask=pad, bos_mask=bos
    )
    y_r, (n, m, v) = ref.timestep_decay_norm(
      x,
      w,
      b,
      2,
      beta1=0.9,
      beta2=0.99,
      state=state,
      pad=np.asarray(pad),
      bos=np.asarray(bos),
    )
    helpers.assert_close(y, y_r, atol=2e-5, rtol=1e-4)
    helpers.assert_close(
      new, norms.TimestepDecayNormState(n, m, v), atol=1e-6, rtol=1e-5
    )
    assert new.count.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(y)[np.asarray(pad)], 0.0)

  def test_claim_first_token_is_group_norm(self, key):
    kx, kw, kb = jax.random.split(key, 3)
    x = common.normal(kx, (3, 1, 8), scale=2.0, shift=0.5)
    w, b = common.vec(kw, 8, 0.0), common.vec(kb, 8, 0.0)
    y, _ = _tdn(x, w, b, num_groups=4)
    gn = norms.group_norm(x, 1 + w, b, num_groups=4, eps=1e-5)
    helpers.assert_close(y, gn, atol=2e-5, rtol=1e-4)

  def test_claim_identical_tokens(self, key):
    x = jnp.tile(common.normal(key, (2, 1, 8), scale=2.0), (1, 7, 1))
    y, _ = _tdn(x, num_groups=2)
    helpers.assert_close(y, jnp.tile(y[:, :1], (1, 7, 1)), atol=1e-4)

  def test_claim_causal(self, key):
    kx, kn = jax.random.split(key)
    x = common.normal(kx, (2, 6, 8))
    y1, _ = _tdn(x, num_groups=2)
    y2, _ = _tdn(
      x.at[:, 4:].set(common.normal(kn, (2, 2, 8), scale=10.0)), num_groups=2
    )
    np.testing.assert_array_equal(y1[:, :4], y2[:, :4])

  def test_claim_streaming(self, key):
    x = common.normal(key, (2, 9, 8), shift=0.3)
    step = jax.jit(
      functools.partial(
        norms.timestep_decay_norm, num_groups=2, beta1=0.9, beta2=0.95
      )
    )
    full, s_full = step(x, None, None, None)
    a, s_a = step(x[:, :4], None, None, None)
    b, s_b = step(x[:, 4:], None, None, s_a)
    common.assert_same_structure(s_a, s_b)
    helpers.assert_close(jnp.concatenate([a, b], 1), full, atol=1e-5)
    helpers.assert_close(s_b, s_full, atol=1e-6)

  def test_gradients_reach_incoming_state(self, key):
    x = common.normal(key, (2, 3, 8))
    st = norms.init_timestep_decay_norm_state(2, 2)._replace(
      count=jnp.array([2, 5], jnp.int32), var=jnp.ones((2, 2))
    )
    g = jax.jit(
      jax.grad(
        lambda m: jnp.sum(
          norms.timestep_decay_norm(
            x, None, None, st._replace(mean=m), num_groups=2
          )[0]
          ** 2
        )
      )
    )(jnp.zeros((2, 2)))
    assert float(jnp.max(jnp.abs(g))) > 0

  def test_errors(self):
    x = jnp.ones((2, 3, 8))
    with pytest.raises(
      ValueError,
      match=r"num_groups must be < "
      r"x.shape\[-1\]=8",
    ):
      norms.timestep_decay_norm(x, num_groups=8)
    with pytest.raises(
      ValueError,
      match=r"x.shape\[-1\]=8 must be "
      r"divisible by num_groups=3",
    ):
      norms.timestep_decay_norm(x, num_groups=3)
    with pytest.raises(TypeError, match=r"padding_mask must be boolean"):
      norms.timestep_decay_norm(x, num_groups=2, padding_mask=jnp.ones((2, 3)))
    with pytest.raises(
      ValueError,
      match=r"bos_mask must have shape "
      r"\(2, 3\)",
    ):
      norms.timestep_decay_norm(
        x, num_groups=2, bos_mask=jnp.ones((3, 2), bool)
      )
    with pytest.raises(
      ValueError,
      match=r"state.mean must have shape "
      r"\(2, 2\)",
    ):
      norms.timestep_decay_norm(
        x, None, None, norms.init_timestep_decay_norm_state(2, 4), num_groups=2
      )
    with pytest.raises(ValueError, match=r"x must have rank 3"):
      norms.timestep_decay_norm(jnp.ones((3, 8)), num_groups=2)


class TestTimestepDecayNormModule:
  def test_streaming_through_module(self, key):
    x = common.normal(key, (2, 6, 8))
    module = jnn.TimestepDecayNorm(8, num_groups=2, rngs=nnx.Rngs(0))
    full = module(x)
    a, state = module(x[:, :3], return_state=True)
    b = module(x[:, 3:], state=state)
    helpers.assert_close(jnp.concatenate([a, b], 1), full, atol=1e-5)
    with pytest.raises(
      ValueError,
      match=r"TimestepDecayNorm: num_groups "
      r"must be < num_features=8",
    ):
      jnn.TimestepDecayNorm(8, num_groups=8, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"num_features=8 must be divisible "
      r"by num_groups=3",
    ):
      jnn.TimestepDecayNorm(8, num_groups=3, rngs=nnx.Rngs(0))
