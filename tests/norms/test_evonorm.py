"""Tests of `jaxnorm.norms.evonorm`: timm golden vectors, NumPy float64,
the paper's claims, state, cross-device statistics, the per-token form; and
of its modules `jaxnorm.nn.EvoNormB0` / `EvoNormS0`.
"""

import functools
import importlib.util

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


class TestEvoNorm:
  @pytest.fixture
  def golden(self):
    with np.load(common.ORACLES / "evonorm_timm.npz") as f:
      return dict(f)

  def _check_golden(self, g):
    state = norms.EvoNormB0State(jnp.asarray(g["b0_running_var0"]))
    y, new = norms.evo_norm_b0(
      g["x1"], g["b0_scale"], g["b0_bias"], g["b0_v"], state, training=True
    )
    helpers.assert_close(y, g["b0_train_y"], atol=2e-5, rtol=1e-5)
    helpers.assert_close(new.var, g["b0_running_var1"], atol=1e-5, rtol=1e-5)
    y, same = norms.evo_norm_b0(
      g["x2"], g["b0_scale"], g["b0_bias"], g["b0_v"], new, training=False
    )
    assert same is new
    helpers.assert_close(y, g["b0_eval_y"], atol=2e-5, rtol=1e-5)
    for name, eps in (("s0", 1e-5), ("s0a", 1e-3)):
      y = norms.evo_norm_s0(
        g["x1"],
        g[f"{name}_scale"],
        g[f"{name}_bias"],
        g[f"{name}_v"],
        num_groups=2,
        eps=eps,
        variant=name,
      )
      helpers.assert_close(y, g[f"{name}_y"], atol=2e-5, rtol=1e-5)

  def test_golden_timm(self, golden):
    self._check_golden(golden)

  def test_live_timm(self, golden):
    pytest.importorskip("torch")
    if importlib.util.find_spec("timm") is None:
      pytest.skip("timm is not installed")
    from tests.oracles import evonorm_timm

    live = evonorm_timm.generate()
    for k, v in golden.items():
      np.testing.assert_allclose(live[k], v, atol=1e-6, err_msg=k)
    self._check_golden(live)

  def test_numpy_b0(self, key):
    kx, k1, k2, k3, k4 = jax.random.split(key, 5)
    x = common.normal(kx, (3, 4, 2, 6), scale=2.0, shift=0.5)
    s, b, v = (
      common.vec(k1, 6),
      common.vec(k2, 6, 0.0),
      common.vec(k3, 6, 1.0, 0.8),
    )
    rv = common.vec(k4, 6, 1.5, 0.2)
    for training in (True, False):
      y, new = norms.evo_norm_b0(
        x, s, b, v, norms.EvoNormB0State(rv), training=training
      )
      y_ref, rv_ref = ref.evo_b0(x, s, b, v, rv, training=training)
      helpers.assert_close(y, y_ref, atol=2e-6, rtol=1e-5)
      helpers.assert_close(new.var, rv_ref, atol=1e-6, rtol=1e-6)

  @pytest.mark.parametrize("groups", [1, 3, 6])
  def test_numpy_s0(self, key, groups):
    kx, k1, k2, k3 = jax.random.split(key, 4)
    x = common.normal(kx, (2, 3, 5, 6), scale=2.0, shift=0.5)
    s, b, v = (
      common.vec(k1, 6),
      common.vec(k2, 6, 0.0),
      common.vec(k3, 6, 1.0, 0.8),
    )
    helpers.assert_close(
      norms.evo_norm_s0(x, s, b, v, num_groups=groups),
      ref.evo_s0(x, s, b, v, groups=groups),
      atol=2e-6,
      rtol=1e-5,
    )
    np.testing.assert_array_equal(
      norms.evo_norm_s0(x, s, b, v, num_groups=None, group_size=6 // groups),
      norms.evo_norm_s0(x, s, b, v, num_groups=groups),
    )

  def test_claim_s0_v0_is_half_group_std(self, key):
    x = common.normal(key, (2, 3, 3, 8), shift=2.0)
    y = norms.evo_norm_s0(x, None, None, jnp.zeros(8), num_groups=2)
    var = ref.evo_s0(x, np.ones(8), np.zeros(8), np.zeros(8), groups=2)
    helpers.assert_close(y, var, atol=1e-6)
    # No mean subtraction: a shifted input keeps its sign pattern.
    std = np.sqrt(
      np.asarray(x, np.float64)
      .reshape(2, -1, 2, 4)
      .var(axis=(1, 3), keepdims=True)
      + 1e-5
    )
    expected = 0.5 * np.asarray(x).reshape(2, -1, 2, 4) / std
    helpers.assert_close(y, expected.reshape(x.shape), atol=1e-6)

  def test_claim_b0_eval_v0(self, key):
    kx, kr = jax.random.split(key)
    x = common.normal(kx, (2, 4, 4, 5), scale=3.0)
    rv = common.vec(kr, 5, 2.0, 0.5)
    y, _ = norms.evo_norm_b0(
      x, None, None, jnp.zeros(5), norms.EvoNormB0State(rv), training=False
    )
    var_i = jnp.var(x, axis=(1, 2), keepdims=True)
    expected = x / jnp.maximum(
      jnp.sqrt(rv + 1e-3)[None, None, None], jnp.sqrt(var_i + 1e-3)
    )
    helpers.assert_close(y, expected, atol=1e-6)

  def test_claim_b0_running_var_steps(self, key):
    step = jax.jit(functools.partial(norms.evo_norm_b0, training=True))
    state = norms.init_evo_norm_b0_state(4)
    xs = [
      common.normal(k, (2, 3, 3, 4), scale=2.0)
      for k in jax.random.split(key, 3)
    ]
    rv = np.ones(4)
    for i, x in enumerate(xs):
      _, new = step(x, None, None, jnp.ones(4), state)
      common.assert_same_structure(new, state)
      flat = np.asarray(x, np.float64).reshape(-1, 4)
      n = flat.shape[0]
      rv = 0.9 * rv + 0.1 * flat.var(0) * n / (n - 1)
      if i == 0:
        helpers.assert_close(
          new.var, 0.9 + 0.1 * flat.var(0) * n / (n - 1), atol=1e-6
        )
      state = new
    helpers.assert_close(state.var, rv, atol=1e-5)

  def test_train_eval_differ(self, key):
    x = common.normal(key, (4, 3, 3, 4), scale=3.0)
    state = norms.init_evo_norm_b0_state(4)
    y_train, _ = norms.evo_norm_b0(
      x, None, None, jnp.zeros(4), state, training=True
    )
    y_eval, _ = norms.evo_norm_b0(
      x, None, None, jnp.zeros(4), state, training=False
    )
    assert float(jnp.max(jnp.abs(y_train - y_eval))) > 1e-2

  def test_apply_act_false_is_affine(self, key):
    kx, k1, k2 = jax.random.split(key, 3)
    x = common.normal(kx, (2, 3, 3, 4))
    s, b = common.vec(k1, 4), common.vec(k2, 4, 0.0)
    state = norms.init_evo_norm_b0_state(4)
    y, new = norms.evo_norm_b0(x, s, b, None, state, training=True)
    affine = np.asarray(x) * np.asarray(s) + np.asarray(b)
    helpers.assert_close(y, affine, atol=1e-6)
    assert new is state
    helpers.assert_close(
      norms.evo_norm_s0(x, s, b, None, num_groups=2), affine, atol=1e-6
    )
    helpers.assert_close(
      norms.evo_norm_s0(x, None, None, None, num_groups=2, variant="s0a"),
      ref.evo_s0(x, np.ones(4), np.zeros(4), np.zeros(4), groups=2) * 2,
      atol=1e-5,
    )

  def test_cross_device(self, key):
    kx, kv = jax.random.split(key)
    x = common.normal(kx, (8, 3, 3, 6), scale=2.0, shift=0.5)
    v = common.vec(kv, 6, 1.0, 0.5)
    state = norms.init_evo_norm_b0_state(6)
    local = lambda x: norms.evo_norm_b0(
      x, None, None, v, state, training=True, axis_name="data"
    )
    sharded = jax.jit(
      jax.shard_map(
        local,
        mesh=common.mesh4(),
        in_specs=P("data"),
        out_specs=(P("data"), norms.EvoNormB0State(P())),
      )
    )
    y, new = sharded(x)
    y_ref, new_ref = norms.evo_norm_b0(x, None, None, v, state, training=True)
    helpers.assert_close(y, y_ref, atol=2e-6)
    helpers.assert_close(new, new_ref, atol=1e-6)

  def test_errors(self):
    x = jnp.ones((2, 3, 3, 4))
    state = norms.init_evo_norm_b0_state(4)
    with pytest.raises(
      ValueError,
      match=r"evo_norm_b0: x must have rank >= "
      r"3",
    ):
      norms.evo_norm_b0(
        jnp.ones((2, 4)), None, None, None, state, training=True
      )
    with pytest.raises(TypeError, match=r"state must be a EvoNormB0State"):
      norms.evo_norm_b0(x, None, None, None, (jnp.ones(4),), training=True)
    with pytest.raises(ValueError, match=r"state.var must have shape \(4,\)"):
      norms.evo_norm_b0(
        x, None, None, None, norms.init_evo_norm_b0_state(3), training=True
      )
    with pytest.raises(ValueError, match=r"v must have shape \(4,\)"):
      norms.evo_norm_b0(x, None, None, jnp.ones(3), state, training=True)
    with pytest.raises(ValueError, match=r"more than one value per channel"):
      norms.evo_norm_b0(
        jnp.ones((1, 1, 1, 4)), None, None, jnp.ones(4), state, training=True
      )
    with pytest.raises(ValueError, match=r"num_features must be a positive"):
      norms.init_evo_norm_b0_state(0)
    with pytest.raises(
      ValueError,
      match=r"evo_norm_s0: variant must be one "
      r"of 's0', 's0a'",
    ):
      norms.evo_norm_s0(x, None, None, None, num_groups=2, variant="s1")
    with pytest.raises(
      ValueError,
      match=r"x.shape\[-1\]=4 must be divisible "
      r"by num_groups=3",
    ):
      norms.evo_norm_s0(x, None, None, None, num_groups=3)
    with pytest.raises(ValueError, match=r"exactly one of num_groups"):
      norms.evo_norm_s0(x, None, None, None, num_groups=None)
    with pytest.raises(ValueError, match=r"divisible by group_size=3"):
      norms.evo_norm_s0(x, None, None, None, num_groups=None, group_size=3)
    with pytest.raises(
      TypeError,
      match=r"evo_norm_s0: x must have a "
      r"floating dtype",
    ):
      norms.evo_norm_s0(
        jnp.ones((2, 3, 4), jnp.int32), None, None, None, num_groups=2
      )


_s0_tokens = jax.jit(
  functools.partial(norms.evo_norm_s0, num_groups=3, reduction_axes=-1)
)


class TestEvoNormS0PerToken:
  def test_numpy(self, key):
    kx, k1, k2, k3 = jax.random.split(key, 4)
    x = common.normal(kx, (2, 5, 6), scale=2.0, shift=0.5)
    s, b = common.vec(k1, 6), common.vec(k2, 6, 0.0)
    v = common.vec(k3, 6, 1.0, 0.8)
    helpers.assert_close(
      _s0_tokens(x, s, b, v),
      ref.evo_s0(x, s, b, v, groups=3, per_token=True),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_causal(self, key):
    k1, k2 = jax.random.split(key)
    x = common.normal(k1, (2, 5, 6))
    x2 = x.at[:, -1].set(common.normal(k2, (2, 6), scale=4.0))
    v = jnp.ones(6)
    y, y2 = _s0_tokens(x, None, None, v), _s0_tokens(x2, None, None, v)
    np.testing.assert_array_equal(y[:, :-1], y2[:, :-1])
    assert not np.allclose(y[:, -1], y2[:, -1])

  def test_rank_two_rows(self, key):
    # A (tokens, d) matrix: each row is its own statistic.
    x = common.normal(key, (7, 6))
    v = jnp.ones(6)
    helpers.assert_close(
      _s0_tokens(x, None, None, v),
      _s0_tokens(x.reshape(1, 7, 6), None, None, v).reshape(7, 6),
      atol=0,
    )

  def test_errors(self):
    x, v = jnp.ones((2, 5, 6)), jnp.ones(6)
    with pytest.raises(
      ValueError,
      match=r"evo_norm_s0: reduction_axes must include the channel axis",
    ):
      norms.evo_norm_s0(x, None, None, v, num_groups=3, reduction_axes=(1,))
    with pytest.raises(ValueError, match=r"evo_norm_s0: x must have rank >= 3"):
      norms.evo_norm_s0(jnp.ones((5, 6)), None, None, v, num_groups=3)


class TestEvoNormModules:
  def test_b0_train_updates_and_eval_freezes(self, key):
    module = jnn.make_norm("evonormb0", 4, rngs=nnx.Rngs(0))
    x = common.normal(key, (2, 3, 3, 4), scale=2.0)
    y = module(x)
    y_fn, state = norms.evo_norm_b0(
      x,
      jnp.ones(4),
      jnp.zeros(4),
      jnp.ones(4),
      norms.init_evo_norm_b0_state(4),
      training=True,
    )
    helpers.assert_close(y, y_fn, atol=0)
    helpers.assert_close(module.var[...], state.var, atol=0)
    module.eval()
    module(x)
    helpers.assert_close(module.var[...], state.var, atol=0)
    assert isinstance(module.var, nnx.BatchStat)

  def test_apply_act_false(self):
    b0 = jnn.EvoNormB0(4, apply_act=False, rngs=nnx.Rngs(0))
    s0 = jnn.EvoNormS0(4, num_groups=2, apply_act=False, rngs=nnx.Rngs(0))
    assert b0.v is None and s0.v is None
    x = jnp.linspace(-2, 2, 36).reshape(1, 3, 3, 4)
    helpers.assert_close(b0(x), x, atol=0)
    helpers.assert_close(s0(x), x, atol=0)

  def test_errors(self):
    with pytest.raises(
      ValueError,
      match=r"EvoNormS0: num_features=6 must be "
      r"divisible by num_groups=4",
    ):
      jnn.EvoNormS0(6, num_groups=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"EvoNormS0: variant must be one of"):
      jnn.EvoNormS0(4, num_groups=2, variant="b0", rngs=nnx.Rngs(0))
    module = jnn.EvoNormS0(4, num_groups=None, group_size=2, rngs=nnx.Rngs(0))
    assert module.num_groups == 2
    np.testing.assert_array_equal(module.v[...], np.ones(4))
