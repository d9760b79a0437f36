"""Tests for the normalization-family modules in `jaxnorm.nn.norms`.

`tests/nn/test_norms.py` checks module == function, dtypes, jit and grad
for every registered norm; this file covers state updates through the
modules, train/eval switching, construction errors and helpers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm import norms
from tests import helpers


def _normal(key, shape, scale=1.0, shift=0.0):
  return jax.random.normal(key, shape, jnp.float32) * scale + shift


class TestEvoNorm:
  def test_b0_train_updates_and_eval_freezes(self, key):
    module = jnn.make_norm("evonormb0", 4, rngs=nnx.Rngs(0))
    x = _normal(key, (2, 3, 3, 4), scale=2.0)
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


class TestBackwardStatNorms:
  @pytest.mark.parametrize("name", ["powernorm", "unifiednorm"])
  def test_train_step_matches_function(self, key, name):
    kwargs = (
      {"num_groups": 2, "warmup_iters": 2}
      if name == "powernorm"
      else {"window_size": 2, "warmup_iters": 1}
    )
    module = jnn.make_norm(name, 4, rngs=nnx.Rngs(0), **kwargs)
    fn = norms.power_norm if name == "powernorm" else norms.unified_norm
    state = module.state_tuple()
    for k in jax.random.split(key, 3):
      kx, kg = jax.random.split(k)
      x, gy = _normal(kx, (3, 2, 4), scale=2.0), _normal(kg, (3, 2, 4))

      @nnx.jit
      def step(m, x, gy):
        loss = lambda m: jnp.sum(m(x) * gy)
        return nnx.grad(loss, argnums=nnx.DiffState(0, jnn.BACKWARD_DIFF))(m)

      grads = step(module, x, gy)
      jnn.apply_backward_updates(module, grads)
      fields = ("grad_ema",) if name == "powernorm" else ("grad_ema", "buf_gz")

      fn_kwargs = {k: v for k, v in kwargs.items() if k != "window_size"}

      def f(x, *stats):
        return fn(
          x,
          jnp.ones(4),
          jnp.zeros(4),
          state._replace(**dict(zip(fields, stats))),
          training=True,
          **fn_kwargs,
        )

      _, vjp, new = jax.vjp(
        f, x, *(getattr(state, n) for n in fields), has_aux=True
      )
      increments = vjp(gy)[1:]
      state = new._replace(
        **{n: getattr(new, n) + d for n, d in zip(fields, increments)}
      )
      helpers.assert_close(module.state_tuple(), state, atol=1e-6)
      assert isinstance(module.grad_ema, jnn.BackwardStat)
    assert int(module.count[...]) == 3
    # Plain nnx.grad (parameters only) leaves the backward statistics alone.
    before = module.grad_ema[...]
    nnx.grad(lambda m: jnp.sum(m(x) * gy))(module)
    np.testing.assert_array_equal(module.grad_ema[...], before)

  def test_unified_norm_fold(self, key):
    kx, kw = jax.random.split(key)
    module = jnn.UnifiedNorm(4, rngs=nnx.Rngs(0))
    module(_normal(kx, (3, 5, 4), scale=3.0))  # One training step.
    module.eval()
    x, w = _normal(kx, (2, 4)), _normal(kw, (4, 3))
    fw, fb = module.fold(w)
    helpers.assert_close(x @ fw + fb[None], module(x) @ w, atol=1e-5)

  def test_errors(self):
    with pytest.raises(
      ValueError,
      match=r"PowerNorm: backward_stat must be "
      r"one of",
    ):
      jnn.PowerNorm(4, backward_stat="paper", rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"PowerNorm: num_features=4 must be "
      r"divisible by num_groups=3",
    ):
      jnn.PowerNorm(4, num_groups=3, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"window_size must be an int or a "
      r"pair",
    ):
      jnn.UnifiedNorm(4, window_size=(1, 2, 3), rngs=nnx.Rngs(0))


class TestRegionNormModules:
  def test_rn_b_mask_resized(self, key):
    kx, km = jax.random.split(key)
    module = jnn.RegionNormB(3, rngs=nnx.Rngs(0))
    x = _normal(kx, (2, 4, 4, 3))
    mask = jax.random.bernoulli(km, 0.5, (2, 8, 8, 1)).astype(jnp.float32)
    small = norms.resize_mask_nearest(mask, (4, 4))
    helpers.assert_close(
      module(x, mask), norms.region_norm(x, small), atol=1e-6
    )
    bn, _ = norms.batch_norm(
      x, None, None, norms.init_batch_norm_state(3), training=True
    )
    helpers.assert_close(module(x), bn, atol=1e-5)

  def test_rn_l_torch_init_bounds(self):
    module = jnn.RegionNormL(4, kernel_size=3, rngs=nnx.Rngs(0))
    assert module.mask_kernel[...].shape == (3, 3, 2, 1)
    assert float(jnp.max(jnp.abs(module.mask_kernel[...]))) <= 1 / 18**0.5
    assert float(jnp.max(jnp.abs(module.scale_kernel[...]))) <= 1 / 3
    with pytest.raises(
      ValueError,
      match=r"RegionNormL: kernel_size must be "
      r"odd",
    ):
      jnn.RegionNormL(4, kernel_size=4, rngs=nnx.Rngs(0))


class TestUnMixTNSModule:
  def test_from_batch_norm_and_updates(self, key):
    bn = jnn.BatchNorm(5, rngs=nnx.Rngs(0))
    bn(_normal(key, (16, 5), scale=2.0, shift=1.0))
    bn.scale[...] = jnp.linspace(0.5, 1.5, 5)
    module = jnn.UnMixTNS.from_batch_norm(
      bn, num_components=1, rngs=nnx.Rngs(1)
    )
    assert module.eps == bn.eps
    helpers.assert_close(module.mean[...], bn.mean[...][None], atol=0)
    x = _normal(key, (4, 3, 3, 5))
    helpers.assert_close(
      module(x),
      norms.instance_norm(x, bn.scale[...], bn.bias[...], eps=bn.eps),
      atol=2e-5,
    )
    assert not np.allclose(module.mean[...], bn.mean[...][None])
    assert isinstance(module.mean, nnx.BatchStat)


class TestL1BatchNormModule:
  def test_train_eval(self, key):
    module = jnn.L1BatchNorm(4, momentum=0.0, rngs=nnx.Rngs(0))
    x = _normal(key, (16, 4), scale=2.0, shift=1.0)
    y_train = module(x)
    module.eval()
    helpers.assert_close(module(x), y_train, atol=1e-5)
    with pytest.raises(ValueError, match=r"L1BatchNorm: eps_mode must be"):
      jnn.L1BatchNorm(4, eps_mode="x", rngs=nnx.Rngs(0))


class TestScaleVectorModules:
  def test_switch_defaults_are_baseline(self, key):
    kx, kw = jax.random.split(key)
    x = _normal(kx, (2, 3, 8))
    helpers.assert_close(
      jnn.ScaleVectorNorm(8, rngs=nnx.Rngs(0))(x),
      norms.rms_norm(x, jnp.ones(8)),
      atol=0,
    )
    q, k, v = jnn.ScaleVectorNorm(
      8, num_branches=3, reparam=True, rngs=nnx.Rngs(0)
    )(x)
    for y in (q, k, v):
      helpers.assert_close(y, norms.rms_norm(x), atol=1e-6)
    lin = jnn.DualScaledLinear(8, 5, rngs=nnx.Rngs(0))
    dual = jnn.DualScaledLinear(8, 5, dual=True, rngs=nnx.Rngs(0))
    assert lin.scale_in is None
    helpers.assert_close(dual(x), lin(x), atol=1e-6)
    helpers.assert_close(lin(x), x @ lin.kernel[...], atol=1e-6)

  def test_branch_scales_get_their_own_gradients(self, key):
    x = _normal(key, (4, 8))
    module = jnn.ScaleVectorNorm(8, num_branches=2, rngs=nnx.Rngs(0))
    grads = nnx.grad(lambda m: jnp.sum(m(x)[0] ** 2))(module)
    g = grads["scale"][...]
    assert float(jnp.max(jnp.abs(g[0]))) > 0
    np.testing.assert_array_equal(g[1], np.zeros(8))

  def _model(self):
    class Block(nnx.Module):
      def __init__(self, rngs):
        self.attn_norm = jnn.RMSNorm(8, rngs=rngs)
        self.q_norm = jnn.RMSNorm(4, rngs=rngs)
        self.k_norm = jnn.LayerNorm(4, rngs=rngs)
        self.post_ffn_norm = jnn.RMSNorm(8, rngs=rngs)
        self.hg = jnn.ScaleVectorNorm(
          8, num_branches=2, reparam=True, rngs=rngs
        )
        self.qk = jnn.ScaleVectorNorm(4, role="output", rngs=rngs)
        self.proj = jnn.DualScaledLinear(8, 4, dual=True, rngs=rngs)
        self.dense = nnx.Linear(8, 8, rngs=rngs)
        self.final_norm = jnn.LayerNorm(8, rngs=rngs)

    return Block(nnx.Rngs(0))

  def test_weight_decay_mask_iwd(self):
    model = self._model()
    mask = jnn.weight_decay_mask(model)(nnx.state(model, nnx.Param))
    flat = {tuple(p): bool(v.get_value()) for p, v in nnx.to_flat_state(mask)}
    assert flat[("attn_norm", "scale")]
    assert flat[("final_norm", "scale")]
    assert not flat[("final_norm", "bias")]
    assert not flat[("q_norm", "scale")]
    assert not flat[("k_norm", "scale")] and not flat[("k_norm", "bias")]
    assert not flat[("post_ffn_norm", "scale")]
    assert flat[("hg", "scale_magnitude")] and flat[("hg", "scale_direction")]
    assert not flat[("qk", "scale")]
    assert flat[("proj", "scale_in")] and flat[("proj", "scale_out")]
    # The dual-placement matrix is a weight matrix: decayed (one rule).
    assert flat[("proj", "kernel")]
    assert flat[("dense", "kernel")] and flat[("dense", "bias")]
    none = jnn.weight_decay_mask(
      model, rule="none", decay_others=False, roles={"attn_norm": "output"}
    )
    assert not any(jax.tree.leaves(none(nnx.state(model, nnx.Param))))
    every = jnn.weight_decay_mask(model, rule="all")(
      nnx.state(model, nnx.Param)
    )
    assert bool(every["q_norm"]["scale"].get_value())

  def test_weight_decay_mask_with_optax(self):
    import optax

    model = self._model()
    tx = optax.masked(
      optax.add_decayed_weights(0.5), jnn.weight_decay_mask(model)
    )
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    zero = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    before = nnx.state(model, nnx.Param)
    before = jax.tree.map(lambda a: a, before)
    opt.update(model, zero)
    # Masked add_decayed_weights turns zero grads into 0.5 * param updates
    # (optax adds them; no learning rate here): decayed leaves change.
    helpers.assert_close(
      model.attn_norm.scale[...],
      1.5 * before["attn_norm"]["scale"][...],
      atol=1e-6,
    )
    helpers.assert_close(
      model.q_norm.scale[...], before["q_norm"]["scale"][...], atol=0
    )

  def test_errors(self):
    with pytest.raises(
      ValueError,
      match=r"weight_decay_mask: rule must be "
      r"one of 'iwd', 'all', 'none'",
    ):
      jnn.weight_decay_mask(self._model(), rule="some")
    with pytest.raises(ValueError, match=r"roles\['x'\] must be one of"):
      jnn.weight_decay_mask(self._model(), roles={"x": "middle"})
    mask_fn = jnn.weight_decay_mask(jnn.RMSNorm(4, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"is not a parameter of the model"):
      mask_fn({"other": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"ScaleVectorNorm: role must be one"):
      jnn.ScaleVectorNorm(4, role="hidden", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"num_branches must be a positive"):
      jnn.ScaleVectorNorm(4, num_branches=0, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"DualScaledLinear: out_features "
      r"must be a positive",
    ):
      jnn.DualScaledLinear(4, 0, rngs=nnx.Rngs(0))


class TestCLSNormModule:
  def test_claim_clone_matches_shared(self, key):
    kx, ks = jax.random.split(key)
    x = _normal(kx, (2, 5, 8), shift=0.5)
    for shared in (
      jnn.LayerNorm(8, rngs=nnx.Rngs(0)),
      jnn.RMSNorm(8, rngs=nnx.Rngs(0)),
    ):
      for name in ("scale", "bias"):
        var = getattr(shared, name, None)
        if var is not None:
          var[...] = var[...] + 0.3 * _normal(ks, (8,))
      special = jnn.CLSNorm.from_shared(shared, num_registers=2)
      np.testing.assert_array_equal(special(x), shared(x))

  def test_registers_and_token_type(self, key):
    x = _normal(key, (2, 5, 8))
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


class TestTimestepDecayNormModule:
  def test_streaming_through_module(self, key):
    x = _normal(key, (2, 6, 8))
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
