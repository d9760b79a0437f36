"""Tests of `jaxnorm.norms.power_norm` against a NumPy float64 transcription
of the official code, forward, backward and state over steps; and of its
module `jaxnorm.nn.PowerNorm` (backward-pass state through ``nnx.grad``).
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
from tests.norms import backward_stat, common
from tests.oracles import norms_family_numpy as ref


def _pn_step(x, gamma, beta, state, gy, **kw):
  """One training step: y, (dx, dgamma, dbeta), the state with nu updated."""

  def f(x, gamma, beta, nu):
    return norms.power_norm(
      x, gamma, beta, state._replace(grad_ema=nu), training=True, **kw
    )

  y, vjp, new = jax.vjp(f, x, gamma, beta, state.grad_ema, has_aux=True)
  dx, dg, db, dnu = vjp(gy)
  return y, (dx, dg, db), new._replace(grad_ema=new.grad_ema + dnu)


class TestPowerNorm:
  @pytest.mark.parametrize("backward_stat", ["batch", "running"])
  def test_numpy_forward_backward_over_steps(self, key, backward_stat):
    c = 6
    kg, kb, *ks = jax.random.split(key, 8)
    gamma, beta = common.vec(kg, c), common.vec(kb, c, 0.0)
    state = norms.init_power_norm_state(c)
    st = {"t": 0, "phi": np.ones(c), "nu": np.zeros(c)}
    step = jax.jit(
      functools.partial(
        _pn_step,
        warmup_iters=3,
        num_groups=None,
        alpha_fwd=0.8,
        alpha_bkw=0.7,
        backward_stat=backward_stat,
      )
    )
    for i, k in enumerate(ks[:5]):
      kx, ky, km = jax.random.split(k, 3)
      x = common.normal(kx, (4, 3, c), scale=1.0 + i, shift=0.3)
      gy = common.normal(ky, x.shape)
      pad = jax.random.bernoulli(km, 0.3, x.shape[:-1]).at[0, 0].set(False)
      y, grads, state = step(x, gamma, beta, state, gy, pad_mask=pad)
      y_r, dx_r, dg_r, db_r, st = ref.power_norm_step(
        x,
        gamma,
        beta,
        st,
        gy,
        warmup=3,
        afwd=0.8,
        abkw=0.7,
        pad_mask=np.asarray(pad),
        backward_stat=backward_stat,
      )
      helpers.assert_close(y, y_r, atol=2e-5, rtol=1e-5)
      helpers.assert_close(grads, (dx_r, dg_r, db_r), atol=2e-5, rtol=1e-5)
      helpers.assert_close(
        (state.running_phi, state.grad_ema),
        (st["phi"], st["nu"]),
        atol=2e-5,
        rtol=1e-5,
      )
      assert int(state.count) == st["t"] == i + 1
      common.assert_same_structure(state, norms.init_power_norm_state(c))

  def test_group_scaling_forward(self, key):
    x = common.normal(key, (3, 2, 8), scale=2.0)
    state = norms.init_power_norm_state(8)
    y, _ = norms.power_norm(x, None, None, state, training=True, num_groups=2)
    xs = ref.group_scale(x, 2)
    y_r, *_ = ref.power_norm_step(
      xs,
      np.ones(8),
      np.zeros(8),
      {"t": 0, "phi": np.ones(8), "nu": np.zeros(8)},
      np.zeros(x.shape),
      warmup=10000,
    )
    helpers.assert_close(y, y_r, atol=2e-6, rtol=1e-5)
    # G = 1: an affine-free per-token RMSNorm before the batch statistic.
    y1, _ = norms.power_norm(x, None, None, state, training=True)
    y1_ref, _ = norms.power_norm(
      norms.rms_norm(x, eps=1e-5),
      None,
      None,
      state,
      training=True,
      num_groups=None,
    )
    helpers.assert_close(y1, y1_ref, atol=1e-6)

  def test_claim_phi_after_two_steps(self, key):
    k1, k2 = jax.random.split(key)
    x1, x2 = (
      common.normal(k1, (5, 4), scale=2.0),
      common.normal(k2, (5, 4), shift=1.0),
    )
    state = norms.init_power_norm_state(4)
    kw = {"training": True, "num_groups": None, "warmup_iters": 5}
    _, s1 = norms.power_norm(x1, None, None, state, **kw)
    _, s2 = norms.power_norm(x2, None, None, s1, **kw)
    p1, p2 = ref.quad_mean(x1), ref.quad_mean(x2)
    helpers.assert_close(s1.running_phi, p1, atol=1e-6, rtol=1e-6)
    helpers.assert_close(
      s2.running_phi, 0.45 * p1 + 0.55 * p2, atol=1e-6, rtol=1e-6
    )

  def test_claim_first_step_gradient_is_stop_gradient_autodiff(self, key):
    kx, kg, ky = jax.random.split(key, 3)
    x = common.normal(kx, (4, 3, 8), scale=2.0, shift=0.5)
    gamma, gy = common.vec(kg, 8), common.normal(ky, (4, 3, 8))
    state = norms.init_power_norm_state(8)
    _, (dx, _, _), _ = _pn_step(x, gamma, None, state, gy, num_groups=2)

    def stopped(x):
      xs = norms.rms_norm(x.reshape(4, 3, 2, 4), eps=1e-5).reshape(x.shape)
      psi2 = jax.lax.stop_gradient(jnp.mean(xs * xs, axis=(0, 1)))
      return gamma[None, None] * xs / jnp.sqrt(psi2 + 1e-5)[None, None]

    expected = jax.vjp(stopped, x)[1](gy)[0]
    helpers.assert_close(dx, expected, atol=2e-6, rtol=1e-5)

    # Full autodiff differentiates through psi2 as well: not the same.
    def full(x):
      xs = norms.rms_norm(x.reshape(4, 3, 2, 4), eps=1e-5).reshape(x.shape)
      psi2 = jnp.mean(xs * xs, axis=(0, 1))
      return gamma[None, None] * xs / jnp.sqrt(psi2 + 1e-5)[None, None]

    assert float(jnp.max(jnp.abs(jax.vjp(full, x)[1](gy)[0] - dx))) > 1e-3

  def test_backward_differs_from_autodiff_after_warmup(self, key):
    kx, kg, ky, kn = jax.random.split(key, 4)
    x = common.normal(kx, (6, 5), scale=3.0)
    gamma, gy = common.vec(kg, 5), common.normal(ky, (6, 5))
    nu = 0.5 * common.normal(kn, (5,))
    phi = jnp.linspace(0.5, 2.0, 5)
    state = norms.PowerNormState(jnp.asarray(10, jnp.int32), phi, nu)
    kw = {"num_groups": None, "warmup_iters": 3}
    y, (dx, _, _), _ = _pn_step(x, gamma, None, state, gy, **kw)
    x, gamma, gy, nu, phi = (
      np.asarray(a, np.float64) for a in (x, gamma, gy, nu, phi)
    )
    # Forward after warmup uses Phi ...
    helpers.assert_close(y, gamma * x / np.sqrt(phi + 1e-5), atol=1e-5)
    # ... autodiff of that forward would divide by sqrt(Phi + eps) ...
    autodiff = gamma * gy / np.sqrt(phi + 1e-5)
    # ... the approximate backward subtracts (1 - a_b) nu z and divides by
    # the current batch statistic.
    z = x / np.sqrt(phi + 1e-5)
    psi2 = np.mean(x * x, axis=0)
    expected = (gamma * gy - 0.1 * nu * z) / np.sqrt(psi2 + 1e-5)
    helpers.assert_close(dx, expected, atol=2e-5, rtol=1e-5)
    assert float(np.max(np.abs(np.asarray(dx) - autodiff))) > 1e-2

  def test_claim_eval(self, key):
    kx, kg, kb = jax.random.split(key, 3)
    x = common.normal(kx, (3, 2, 8), scale=2.0)
    gamma, beta = common.vec(kg, 8), common.vec(kb, 8, 0.0)
    phi = jnp.linspace(0.5, 2.0, 8)
    state = norms.PowerNormState(jnp.asarray(7, jnp.int32), phi, jnp.zeros(8))
    y, same = norms.power_norm(
      x, gamma, beta, state, training=False, num_groups=2
    )
    assert same is state
    xs = ref.group_scale(x, 2)
    helpers.assert_close(
      y,
      np.asarray(gamma) * xs / np.sqrt(np.asarray(phi) + 1e-5)
      + np.asarray(beta),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_claim_pads_are_ignored(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (5, 2, 4), scale=2.0)
    pad = jnp.zeros((5, 2), bool).at[3:, 1].set(True)
    state = norms.init_power_norm_state(4)
    run = lambda x: norms.power_norm(
      x, None, None, state, training=True, pad_mask=pad
    )
    y1, s1 = run(x)
    y2, s2 = run(x.at[3:, 1].set(100.0 * common.normal(kp, (2, 4))))
    helpers.assert_close(s1, s2, atol=1e-6)
    keep = ~np.asarray(pad)
    helpers.assert_close(np.asarray(y1)[keep], np.asarray(y2)[keep], atol=1e-6)

  def test_cross_device(self, key):
    kx, ky, kg, kn = jax.random.split(key, 4)
    x = common.normal(kx, (8, 3, 6), scale=2.0, shift=0.5)
    gy = common.normal(ky, x.shape)
    gamma = common.vec(kg, 6)
    state = norms.init_power_norm_state(6)._replace(
      grad_ema=0.3 * common.normal(kn, (6,))
    )
    kw = {"num_groups": 2, "warmup_iters": 4}

    def local(x, gy):
      y, (dx, _, _), new = _pn_step(
        x, gamma, None, state, gy, axis_name="data", **kw
      )
      return y, dx, new

    sharded = jax.jit(
      jax.shard_map(
        local,
        mesh=common.mesh4(),
        in_specs=(P("data"), P("data")),
        out_specs=(P("data"), P("data"), norms.PowerNormState(P(), P(), P())),
        check_vma=False,
      )
    )
    y, dx, new = sharded(x, gy)
    y_r, (dx_r, _, _), new_r = _pn_step(x, gamma, None, state, gy, **kw)
    helpers.assert_close((y, dx), (y_r, dx_r), atol=2e-6, rtol=1e-5)
    helpers.assert_close(new, new_r, atol=1e-6, rtol=1e-5)

  def test_errors(self):
    x, st = jnp.ones((3, 4)), norms.init_power_norm_state(4)
    with pytest.raises(
      ValueError,
      match=r"power_norm: backward_stat must be "
      r"one of 'batch', 'running'",
    ):
      norms.power_norm(x, None, None, st, training=True, backward_stat="x")
    with pytest.raises(TypeError, match=r"pad_mask must be boolean"):
      norms.power_norm(x, None, None, st, training=True, pad_mask=jnp.zeros(3))
    with pytest.raises(ValueError, match=r"pad_mask must have shape \(3,\)"):
      norms.power_norm(
        x, None, None, st, training=True, pad_mask=jnp.zeros((4,), bool)
      )
    with pytest.raises(TypeError, match=r"state must be a PowerNormState"):
      norms.power_norm(x, None, None, tuple(st), training=True)
    with pytest.raises(
      ValueError,
      match=r"state.running_phi must have "
      r"shape \(4,\)",
    ):
      norms.power_norm(
        x, None, None, norms.init_power_norm_state(5), training=True
      )
    with pytest.raises(
      ValueError,
      match=r"x.shape\[-1\]=4 must be "
      r"divisible by num_groups=3",
    ):
      norms.power_norm(x, None, None, st, training=True, num_groups=3)
    with pytest.raises(ValueError, match=r"power_norm: x must have rank >= 2"):
      norms.power_norm(jnp.ones(4), None, None, st, training=True)
    with pytest.raises(ValueError, match=r"num_features must be a positive"):
      norms.init_power_norm_state(0)


class TestPowerNormModule:
  def test_train_step_matches_function(self, key):
    backward_stat.check_train_steps(
      key,
      "powernorm",
      norms.power_norm,
      ("grad_ema",),
      num_groups=2,
      warmup_iters=2,
    )

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
