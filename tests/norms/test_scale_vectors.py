"""Tests of `jaxnorm.norms.scale_vectors` (HG, DP/DNP, magnitude-direction),
of its modules and of the IWD masks `jaxnorm.nn.weight_decay_mask`.
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


class TestScaleVectorModules:
  def test_switch_defaults_are_baseline(self, key):
    kx, kw = jax.random.split(key)
    x = common.normal(kx, (2, 3, 8))
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
    x = common.normal(key, (4, 8))
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
