"""Tests for the normalization family in `jaxnorm.norms` (spec sections 5-9,
11, 13, 15b, 15c): golden vectors, NumPy float64 transcriptions, the papers'
claims, state handling, cross-device statistics, low precision and errors.
"""

import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxnorm import norms
from tests import helpers
from tests.oracles import norms_family_numpy as ref

ORACLES = pathlib.Path(__file__).parent / "oracles"


def _normal(key, shape, dtype=jnp.float32, scale=1.0, shift=0.0):
  return (jax.random.normal(key, shape, jnp.float32) * scale + shift).astype(
    dtype
  )


def _vec(key, c, center=1.0, spread=0.3):
  return center + spread * _normal(key, (c,))


def _mesh4():
  return jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))


def _assert_same_structure(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert la.dtype == lb.dtype and la.shape == lb.shape


# ---------------------------------------------------------------------------
# EvoNorm (section 5).


class TestEvoNorm:
  @pytest.fixture
  def golden(self):
    with np.load(ORACLES / "evonorm_timm.npz") as f:
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
    x = _normal(kx, (3, 4, 2, 6), scale=2.0, shift=0.5)
    s, b, v = _vec(k1, 6), _vec(k2, 6, 0.0), _vec(k3, 6, 1.0, 0.8)
    rv = _vec(k4, 6, 1.5, 0.2)
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
    x = _normal(kx, (2, 3, 5, 6), scale=2.0, shift=0.5)
    s, b, v = _vec(k1, 6), _vec(k2, 6, 0.0), _vec(k3, 6, 1.0, 0.8)
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
    x = _normal(key, (2, 3, 3, 8), shift=2.0)
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
    x = _normal(kx, (2, 4, 4, 5), scale=3.0)
    rv = _vec(kr, 5, 2.0, 0.5)
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
    xs = [_normal(k, (2, 3, 3, 4), scale=2.0) for k in jax.random.split(key, 3)]
    rv = np.ones(4)
    for i, x in enumerate(xs):
      _, new = step(x, None, None, jnp.ones(4), state)
      _assert_same_structure(new, state)
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
    x = _normal(key, (4, 3, 3, 4), scale=3.0)
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
    x = _normal(kx, (2, 3, 3, 4))
    s, b = _vec(k1, 4), _vec(k2, 4, 0.0)
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
    x = _normal(kx, (8, 3, 3, 6), scale=2.0, shift=0.5)
    v = _vec(kv, 6, 1.0, 0.5)
    state = norms.init_evo_norm_b0_state(6)
    local = lambda x: norms.evo_norm_b0(
      x, None, None, v, state, training=True, axis_name="data"
    )
    sharded = jax.jit(
      jax.shard_map(
        local,
        mesh=_mesh4(),
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


# ---------------------------------------------------------------------------
# PowerNorm (section 6).


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
    gamma, beta = _vec(kg, c), _vec(kb, c, 0.0)
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
      x = _normal(kx, (4, 3, c), scale=1.0 + i, shift=0.3)
      gy = _normal(ky, x.shape)
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
      _assert_same_structure(state, norms.init_power_norm_state(c))

  def test_group_scaling_forward(self, key):
    x = _normal(key, (3, 2, 8), scale=2.0)
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
    x1, x2 = _normal(k1, (5, 4), scale=2.0), _normal(k2, (5, 4), shift=1.0)
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
    x = _normal(kx, (4, 3, 8), scale=2.0, shift=0.5)
    gamma, gy = _vec(kg, 8), _normal(ky, (4, 3, 8))
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
    x = _normal(kx, (6, 5), scale=3.0)
    gamma, gy = _vec(kg, 5), _normal(ky, (6, 5))
    nu = 0.5 * _normal(kn, (5,))
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
    x = _normal(kx, (3, 2, 8), scale=2.0)
    gamma, beta = _vec(kg, 8), _vec(kb, 8, 0.0)
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
    x = _normal(kx, (5, 2, 4), scale=2.0)
    pad = jnp.zeros((5, 2), bool).at[3:, 1].set(True)
    state = norms.init_power_norm_state(4)
    run = lambda x: norms.power_norm(
      x, None, None, state, training=True, pad_mask=pad
    )
    y1, s1 = run(x)
    y2, s2 = run(x.at[3:, 1].set(100.0 * _normal(kp, (2, 4))))
    helpers.assert_close(s1, s2, atol=1e-6)
    keep = ~np.asarray(pad)
    helpers.assert_close(np.asarray(y1)[keep], np.asarray(y2)[keep], atol=1e-6)

  def test_cross_device(self, key):
    kx, ky, kg, kn = jax.random.split(key, 4)
    x = _normal(kx, (8, 3, 6), scale=2.0, shift=0.5)
    gy = _normal(ky, x.shape)
    gamma = _vec(kg, 6)
    state = norms.init_power_norm_state(6)._replace(
      grad_ema=0.3 * _normal(kn, (6,))
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
        mesh=_mesh4(),
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


# ---------------------------------------------------------------------------
# Unified Normalization (section 7).


def _un_step(x, gamma, beta, state, gy, **kw):
  def f(x, gamma, beta, ema, buf):
    return norms.unified_norm(
      x,
      gamma,
      beta,
      state._replace(grad_ema=ema, buf_gz=buf),
      training=True,
      **kw,
    )

  y, vjp, new = jax.vjp(
    f, x, gamma, beta, state.grad_ema, state.buf_gz, has_aux=True
  )
  dx, dg, db, dema, dbuf = vjp(gy)
  return (
    y,
    (dx, dg, db),
    new._replace(grad_ema=new.grad_ema + dema, buf_gz=new.buf_gz + dbuf),
  )


def _un_ref_state(state):
  return {
    "t": int(state.count),
    "skips": int(state.skip_count),
    "phi": np.asarray(state.running_var, np.float64),
    "ema": np.asarray(state.grad_ema, np.float64),
    "bx": np.asarray(state.buf_x2, np.float64),
    "bg": np.asarray(state.buf_gz, np.float64),
  }


class TestUnifiedNorm:
  @pytest.mark.parametrize(
    "start,filtration", [(0, False), (0, True), (1002, False), (1002, True)]
  )
  def test_numpy_over_steps(self, key, start, filtration):
    c = 4
    kg, kb, *ks = jax.random.split(key, 9)
    gamma, beta = _vec(kg, c), _vec(kb, c, 0.0)
    state = norms.init_unified_norm_state(c, (3, 2))._replace(
      count=jnp.asarray(start, jnp.int32)
    )
    st = _un_ref_state(state)
    kw = {"warmup_iters": start + 2, "outlier_filtration": filtration}
    step = jax.jit(functools.partial(_un_step, **kw))
    scales = [1.0, 1.2, 0.9, 1.1, 8.0, 1.0, 1.05]
    for k, sc in zip(ks, scales):
      kx, ky, km = jax.random.split(k, 3)
      x = _normal(kx, (3, 4, c), scale=sc, shift=0.2)
      gy = _normal(ky, x.shape)
      pad = jax.random.bernoulli(km, 0.2, x.shape[:-1]).at[0, 0].set(False)
      y, grads, state = step(x, gamma, beta, state, gy, pad_mask=pad)
      y_r, dx_r, dg_r, db_r, st = ref.unified_norm_step(
        x,
        gamma,
        beta,
        st,
        gy,
        warmup=start + 2,
        filtration=filtration,
        pad_mask=np.asarray(pad),
      )
      helpers.assert_close(y, y_r, atol=2e-5, rtol=1e-4)
      helpers.assert_close(grads, (dx_r, dg_r, db_r), atol=2e-5, rtol=1e-4)
      got = _un_ref_state(state)
      for name in st:
        helpers.assert_close(got[name], st[name], atol=2e-5, rtol=1e-4)
      _assert_same_structure(state, norms.init_unified_norm_state(c, (3, 2)))
    if filtration:
      assert st["skips"] > 0  # The x8 batch is filtered as an outlier.

  def test_claim_forward_inside_window(self, key):
    kx, kg, kb = jax.random.split(key, 3)
    gamma, beta = _vec(kg, 5), _vec(kb, 5, 0.0)
    state = norms.init_unified_norm_state(5)
    for k in jax.random.split(kx, 4):  # t = 1 .. W_f
      x = _normal(k, (3, 4, 5), scale=2.0)
      y, state = norms.unified_norm(x, gamma, beta, state, training=True)
      psi2 = ref.quad_mean(x)
      helpers.assert_close(
        y,
        np.asarray(gamma) * np.asarray(x) / np.sqrt(psi2 + 1e-5)
        + np.asarray(beta),
        atol=2e-6,
        rtol=1e-5,
      )

  def test_window_of_one_always_uses_the_batch(self, key):
    state = norms.init_unified_norm_state(3, (1, 1))._replace(
      count=jnp.asarray(2000, jnp.int32)
    )
    x = _normal(key, (4, 3), scale=2.0)
    y, new = norms.unified_norm(
      x, None, None, state, training=True, warmup_iters=1
    )
    helpers.assert_close(
      y, np.asarray(x) / np.sqrt(ref.quad_mean(x) + 1e-5), atol=1e-6
    )
    assert int(new.skip_count) == 0  # Only filtered outliers are counted.
    st = _un_ref_state(state)
    *_, st = ref.unified_norm_step(
      x, np.ones(3), np.zeros(3), st, np.ones(x.shape), warmup=1
    )
    assert st["skips"] == 0

  def test_claim_first_step_gradient(self, key):
    kx, kg, ky = jax.random.split(key, 3)
    x = _normal(kx, (3, 4, 5), scale=2.0)
    gamma, gy = _vec(kg, 5), _normal(ky, (3, 4, 5))
    _, (dx, _, _), _ = _un_step(
      x, gamma, None, norms.init_unified_norm_state(5), gy
    )
    psi2 = ref.quad_mean(x)
    z = np.asarray(x, np.float64) / np.sqrt(psi2 + 1e-5)
    g = np.asarray(gamma, np.float64) * np.asarray(gy, np.float64)
    gz = np.mean(g * z, axis=(0, 1))
    helpers.assert_close(
      dx, (g - 0.1 * gz * z) / np.sqrt(psi2 + 1e-5), atol=2e-6, rtol=1e-5
    )

  def test_claim_gm_le_am(self, key):
    state = norms.init_unified_norm_state(6)
    for k in jax.random.split(key, 6):
      _, state = norms.unified_norm(
        _normal(k, (4, 6), scale=3.0), None, None, state, training=True
      )
    buf = np.asarray(state.buf_x2, np.float64)
    assert np.all(np.exp(np.log(buf).mean(0)) <= buf.mean(0) + 1e-9)

  @pytest.mark.parametrize("position", ["next", "previous"])
  def test_claim_folded_linear_equals_unfused(self, key, position):
    kx, kg, kb, kv, kw, kc = jax.random.split(key, 6)
    c = 6
    gamma, beta = _vec(kg, c), _vec(kb, c, 0.0)
    state = norms.init_unified_norm_state(c)._replace(
      running_var=_vec(kv, c, 2.0, 0.5)
    )
    x = _normal(kx, (4, 5, c))
    un = lambda h: norms.unified_norm(h, gamma, beta, state, training=False)[0]
    if position == "next":
      w, b = _normal(kw, (c, 3)), _normal(kc, (3,))
      unfused = un(x) @ w + b[None, None]
    else:
      w, b = _normal(kw, (c, c)), _normal(kc, (c,))
      unfused = un(x @ w + b[None, None])
    fw, fb = norms.fold_unified_norm(
      gamma, beta, state.running_var, w, b, position=position
    )
    helpers.assert_close(x @ fw + fb[None, None], unfused, atol=1e-5)

  def test_cross_device(self, key):
    kx, ky = jax.random.split(key)
    x = _normal(kx, (8, 3, 6), scale=2.0, shift=0.5)
    gy = _normal(ky, x.shape)
    state = norms.init_unified_norm_state(6)._replace(
      count=jnp.asarray(1003, jnp.int32),
      buf_x2=jnp.full((4, 6), 3.0),
      buf_gz=jnp.full((4, 6), 0.1),
    )
    kw = {"warmup_iters": 2, "outlier_filtration": True}

    def local(x, gy):
      y, (dx, _, _), new = _un_step(
        x, None, None, state, gy, axis_name="data", **kw
      )
      return y, dx, new

    spec = norms.UnifiedNormState(*([P()] * 6))
    sharded = jax.jit(
      jax.shard_map(
        local,
        mesh=_mesh4(),
        in_specs=(P("data"), P("data")),
        out_specs=(P("data"), P("data"), spec),
        check_vma=False,
      )
    )
    y, dx, new = sharded(x, gy)
    y_r, (dx_r, _, _), new_r = _un_step(x, None, None, state, gy, **kw)
    helpers.assert_close((y, dx), (y_r, dx_r), atol=2e-6, rtol=1e-5)
    helpers.assert_close(new, new_r, atol=1e-6, rtol=1e-5)

  def test_errors(self):
    x, st = jnp.ones((3, 4)), norms.init_unified_norm_state(4)
    with pytest.raises(TypeError, match=r"state must be a UnifiedNormState"):
      norms.unified_norm(x, None, None, tuple(st), training=True)
    with pytest.raises(
      ValueError,
      match=r"unified_norm: state.running_var "
      r"must have shape \(4,\)",
    ):
      norms.unified_norm(
        x, None, None, norms.init_unified_norm_state(5), training=True
      )
    with pytest.raises(
      ValueError,
      match=r"window_size must be an int or a "
      r"pair",
    ):
      norms.init_unified_norm_state(4, (1, 2, 3))
    with pytest.raises(ValueError, match=r"window_size must be a positive"):
      norms.init_unified_norm_state(4, 0)
    with pytest.raises(
      ValueError,
      match=r"fold_unified_norm: position must "
      r"be one of 'next', 'previous'",
    ):
      norms.fold_unified_norm(
        None, None, jnp.ones(4), jnp.ones((4, 2)), position="both"
      )
    with pytest.raises(
      ValueError,
      match=r"running_var must have shape "
      r"\(2,\) \(kernel.shape\[1\]\)",
    ):
      norms.fold_unified_norm(
        None, None, jnp.ones(4), jnp.ones((4, 2)), position="previous"
      )
    with pytest.raises(ValueError, match=r"kernel_bias must have shape"):
      norms.fold_unified_norm(
        None, None, jnp.ones(4), jnp.ones((4, 2)), jnp.ones(4)
      )
    with pytest.raises(ValueError, match=r"kernel must have rank 2"):
      norms.fold_unified_norm(None, None, jnp.ones(4), jnp.ones(4))


# ---------------------------------------------------------------------------
# Region Normalization (section 8).


def _mask(key, shape, p=0.4):
  return jax.random.bernoulli(key, p, shape).astype(jnp.float32)


class TestRegionNorm:
  @pytest.mark.parametrize("channels_in_mask", [False, True])
  def test_claim_closed_form_equals_fill_construction(
    self, key, channels_in_mask
  ):
    kx, km = jax.random.split(key)
    x = _normal(kx, (2, 5, 4, 3), scale=2.0, shift=0.5)
    mask = _mask(km, (2, 5, 4, 3 if channels_in_mask else 1))
    helpers.assert_close(
      norms.region_norm(x, mask),
      ref.region_norm_fill(x, mask),
      atol=2e-5,
      rtol=1e-5,
    )

  def test_claim_full_mask_is_batch_norm(self, key):
    x = _normal(key, (3, 4, 4, 5), scale=2.0, shift=1.0)
    bn, _ = norms.batch_norm(
      x, None, None, norms.init_batch_norm_state(5), training=True
    )
    for mask in (jnp.ones((3, 4, 4, 1)), jnp.zeros((3, 4, 4, 1))):
      helpers.assert_close(norms.region_norm(x, mask), bn, atol=2e-6)

  def test_claim_zero_mean_regions_and_permutation(self, key):
    kx, km, kp = jax.random.split(key, 3)
    x = _normal(kx, (2, 4, 4, 3), scale=2.0, shift=1.0)
    mask = _mask(km, (2, 4, 4, 1))
    y = np.asarray(norms.region_norm(x, mask))
    m = np.broadcast_to(np.asarray(mask), y.shape).astype(bool)
    for region in (m, ~m):
      sums = np.where(region, y, 0).sum((0, 1, 2))
      np.testing.assert_allclose(sums, np.zeros(3), atol=1e-4)
    # Permuting pixels inside the foreground permutes the output.
    flat_x, flat_m = np.asarray(x).reshape(-1, 3), np.asarray(mask).reshape(-1)
    fg = np.flatnonzero(flat_m)
    perm = np.arange(flat_m.size)
    perm[fg] = fg[np.asarray(jax.random.permutation(kp, fg.size))]
    y_perm = norms.region_norm(flat_x[perm].reshape(x.shape), mask)
    helpers.assert_close(
      np.asarray(y_perm).reshape(-1, 3), y.reshape(-1, 3)[perm], atol=1e-6
    )

  def test_empty_region_contributes_zero(self, key):
    x = _normal(key, (1, 3, 3, 2))
    y = norms.region_norm(x, jnp.ones((1, 3, 3, 1)).at[0, 0, 0, 0].set(0.0))
    assert helpers.all_finite(y)

  @pytest.mark.parametrize("masked_bias", [False, True])
  def test_rn_b(self, key, masked_bias):
    kx, km, *kp = jax.random.split(key, 6)
    x = _normal(kx, (2, 4, 4, 3))
    mask = _mask(km, (2, 4, 4, 1))
    gf, bf, gb, bb = (0.3 * _normal(k, (3,)) for k in kp)
    y = norms.region_norm_b(x, mask, gf, bf, gb, bb, masked_bias=masked_bias)
    rn = ref.region_norm_fill(x, mask)
    m = np.asarray(mask)
    f = lambda a: np.asarray(a, np.float64)
    expected = rn * m * (1 + f(gf)) + rn * (1 - m) * (1 + f(gb))
    expected += (
      (m * f(bf) + (1 - m) * f(bb)) if masked_bias else (f(bf) + f(bb))
    )
    helpers.assert_close(y, expected, atol=2e-5, rtol=1e-5)
    zero = jnp.zeros(3)
    helpers.assert_close(
      norms.region_norm_b(x, mask, zero, zero, zero, zero),
      rn,
      atol=2e-5,
      rtol=1e-5,
    )

  def test_resize_mask_nearest_is_torch_style(self):
    mask = jnp.arange(16.0).reshape(1, 4, 4, 1)
    small = norms.resize_mask_nearest(mask, (2, 2))
    np.testing.assert_array_equal(small[0, :, :, 0], [[0, 2], [8, 10]])
    big = norms.resize_mask_nearest(jnp.arange(2.0).reshape(1, 2, 1, 1), (4, 3))
    np.testing.assert_array_equal(big[0, :, 0, 0], [0, 0, 1, 1])

  def test_rn_l(self, key):
    kx, k1, k2, k3 = jax.random.split(key, 4)
    x = _normal(kx, (2, 6, 6, 4), scale=2.0)
    mk = _normal(k1, (3, 3, 2, 1))
    gk, bk = 0.3 * _normal(k2, (3, 3, 1, 1)), 0.3 * _normal(k3, (3, 3, 1, 1))
    gbias, bbias = jnp.array([0.1]), jnp.array([-0.2])
    rn_l = jax.jit(functools.partial(norms.region_norm_l, threshold=0.6))
    y = rn_l(x, mk, gk, gbias, bk, bbias)
    xn = np.asarray(x, np.float64)
    pooled = np.concatenate(
      [xn.mean(-1, keepdims=True), xn.max(-1, keepdims=True)], -1
    )

    def conv(h, w):  # Zero-padded "same" cross-correlation, float64.
      k = w.shape[0]
      hp = np.pad(h, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
      out = np.zeros(h.shape[:3] + (w.shape[-1],))
      for i in range(k):
        for j in range(k):
          out += (
            hp[:, i : i + h.shape[1], j : j + h.shape[2]]
            @ np.asarray(w, np.float64)[i, j]
          )
      return out

    a = 1 / (1 + np.exp(-conv(pooled, mk)))
    rn = ref.region_norm_fill(xn, (a >= 0.6).astype(np.float64))
    expected = rn * (1 + conv(a, gk) + 0.1) + conv(a, bk) - 0.2
    helpers.assert_close(y, expected, atol=5e-5, rtol=1e-4)
    # The mask is thresholded without gradient; a still gets gradient.
    g = jax.jit(
      jax.grad(lambda mk: jnp.sum(rn_l(x, mk, gk, gbias, bk, bbias) ** 2))
    )(mk)
    assert float(jnp.max(jnp.abs(g))) > 0

  def test_cross_device(self, key):
    kx, km = jax.random.split(key)
    x = _normal(kx, (8, 3, 3, 4), scale=2.0, shift=0.5)
    mask = _mask(km, (8, 3, 3, 1))
    sharded = jax.jit(
      jax.shard_map(
        lambda x, m: norms.region_norm(x, m, axis_name="data"),
        mesh=_mesh4(),
        in_specs=(P("data"), P("data")),
        out_specs=P("data"),
      )
    )
    helpers.assert_close(
      sharded(x, mask), norms.region_norm(x, mask), atol=2e-6
    )

  def test_errors(self):
    x, z = jnp.ones((2, 3, 3, 4)), jnp.zeros(4)
    with pytest.raises(
      ValueError,
      match=r"region_norm: mask must have shape "
      r"\(2, 3, 3, 1\) or \(2, 3, 3, 4\)",
    ):
      norms.region_norm(x, jnp.ones((2, 3, 3, 2)))
    with pytest.raises(ValueError, match=r"region_norm: x must have rank"):
      norms.region_norm(jnp.ones((2, 4)), jnp.ones((2, 1)))
    with pytest.raises(ValueError, match=r"scale_bg must have shape"):
      norms.region_norm_b(x, jnp.ones((2, 3, 3, 1)), z, z, jnp.ones(3), z)
    with pytest.raises(
      ValueError,
      match=r"kernels must be \(k, k, ...\) "
      r"with odd k",
    ):
      norms.region_norm_l(
        x,
        jnp.ones((2, 2, 2, 1)),
        jnp.ones((2, 2, 1, 1)),
        jnp.ones(1),
        jnp.ones((2, 2, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(
      ValueError,
      match=r"scale_kernel must have shape "
      r"\(3, 3, 1, 1\)",
    ):
      norms.region_norm_l(
        x,
        jnp.ones((3, 3, 2, 1)),
        jnp.ones((3, 3, 2, 1)),
        jnp.ones(1),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(ValueError, match=r"region_norm_l: x must have rank 4"):
      norms.region_norm_l(
        jnp.ones((2, 3, 4)),
        jnp.ones((3, 3, 2, 1)),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(
      ValueError,
      match=r"spatial_shape must have 2 "
      r"entries",
    ):
      norms.resize_mask_nearest(x, (3,))
    with pytest.raises(
      ValueError,
      match=r"spatial_shape entries must be a "
      r"positive integer",
    ):
      norms.resize_mask_nearest(x, (3, 0))


# ---------------------------------------------------------------------------
# UnMix-TNS (section 11).


class TestUnMixTNS:
  def _state(self, key, k=4, c=5):
    k1, k2, k3 = jax.random.split(key, 3)
    return norms.init_unmix_tns_state(
      0.5 * _normal(k1, (c,)), _vec(k2, c, 1.5, 0.3), k3, num_components=k
    )

  def test_numpy_over_steps(self, key):
    kx, ks, kg, kb = jax.random.split(key, 4)
    state = self._state(ks)
    gamma, beta = _vec(kg, 5), _vec(kb, 5, 0.0)
    mu_k, var_k = np.asarray(state.mean), np.asarray(state.var)
    step = jax.jit(functools.partial(norms.unmix_tns, momentum=0.3))
    for k in jax.random.split(kx, 3):
      x = _normal(k, (3, 4, 2, 5), scale=1.5, shift=0.4)
      y, state = step(x, gamma, beta, state)
      y_r, mu_k, var_k = ref.unmix_tns(
        x, gamma, beta, mu_k, var_k, momentum=0.3
      )
      helpers.assert_close(y, y_r, atol=2e-5, rtol=1e-5)
      helpers.assert_close(
        state, norms.UnMixTNSState(mu_k, var_k), atol=1e-5, rtol=1e-5
      )
      _assert_same_structure(state, self._state(ks))

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
    x = _normal(kx, (3, 4, 4, 5), scale=2.0, shift=0.5)
    gamma, beta = _vec(kg, 5), _vec(kb, 5, 0.0)
    state = self._state(ks, k=1)
    y, _ = norms.unmix_tns(x, gamma, beta, state, eps=1e-5)
    helpers.assert_close(
      y, norms.instance_norm(x, gamma, beta, eps=1e-5), atol=2e-5
    )

  def test_claim_equal_components(self, key):
    kx, km = jax.random.split(key)
    x = _normal(kx, (3, 4, 4, 5), scale=2.0, shift=0.5)
    mu_s, var_s = _normal(km, (5,)), jnp.full((5,), 2.0)
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
    x = _normal(kx, (2, 3, 3, 5))
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
    x = _normal(kx, (8, 3, 3, 5), scale=2.0)
    state = self._state(ks)
    _, same = norms.unmix_tns(x, None, None, state, update=False)
    assert same is state
    sharded = jax.jit(
      jax.shard_map(
        lambda x: norms.unmix_tns(x, None, None, state, axis_name="data"),
        mesh=_mesh4(),
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


# ---------------------------------------------------------------------------
# L1 normalization (section 13).


class TestL1Norm:
  def test_numpy(self, key):
    kx, kg, kb = jax.random.split(key, 3)
    x = _normal(kx, (4, 33), scale=3.0, shift=1.0)
    g, b = _vec(kg, 33), _vec(kb, 33, 0.0)
    helpers.assert_close(
      norms.l1_layer_norm(x, g, b),
      ref.l1_layer_norm(x, g, b),
      atol=2e-6,
      rtol=1e-5,
    )

  def test_claim_gaussian_unit_std(self, key):
    y = norms.l1_layer_norm(
      _normal(key, (4, 4096), scale=3.0, shift=2.0), eps=0.0
    )
    np.testing.assert_allclose(np.std(np.asarray(y), axis=-1), 1.0, atol=0.02)

  def test_claim_affine_invariance(self, key):
    x = _normal(key, (3, 16))
    for a, c in ((0.1, -3.0), (7.0, 5.0)):
      helpers.assert_close(
        norms.l1_layer_norm(x * a + c, eps=0.0),
        norms.l1_layer_norm(x, eps=0.0),
        atol=5e-5,
      )

  def test_eps_modes(self, key):
    x = _normal(key, (3, 16))
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
    x = _normal(key, (64, 6), scale=2.0, shift=1.0)
    state = norms.init_l1_batch_norm_state(6)
    step = jax.jit(
      functools.partial(norms.l1_batch_norm, training=True, momentum=0.5)
    )
    for _ in range(40):
      y_train, state = step(x, None, None, state)
      _assert_same_structure(state, norms.init_l1_batch_norm_state(6))
    xn = np.asarray(x, np.float64)
    mu = xn.mean(0)
    dev = np.sqrt(np.pi / 2) * np.abs(xn - mu).mean(0)
    helpers.assert_close(state, norms.L1BatchNormState(mu, dev), atol=1e-5)
    y_eval, same = norms.l1_batch_norm(x, None, None, state, training=False)
    assert same is state
    helpers.assert_close(y_eval, y_train, atol=1e-5)
    helpers.assert_close(y_train, (xn - mu) / (dev + 1e-5), atol=1e-5)

  def test_cross_device(self, key):
    x = _normal(key, (8, 3, 4), scale=2.0, shift=0.5)
    state = norms.init_l1_batch_norm_state(4)
    sharded = jax.jit(
      jax.shard_map(
        lambda x: norms.l1_batch_norm(
          x, None, None, state, training=True, axis_name="data"
        ),
        mesh=_mesh4(),
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


# ---------------------------------------------------------------------------
# Scale vectors (section 9).


class TestScaleVectors:
  def test_claim_init_is_baseline(self, key):
    kx, kw = jax.random.split(key)
    x = _normal(kx, (3, 8))
    ones = jnp.ones(8)
    for y in norms.branch_rms_norm(x, [ones, ones, ones]):
      np.testing.assert_array_equal(y, norms.rms_norm(x, ones))
    w = _normal(kw, (8, 5))
    helpers.assert_close(
      norms.dual_scaled_linear(x, w, ones, jnp.ones(5)), x @ w, atol=1e-6
    )
    helpers.assert_close(
      norms.magnitude_direction_scale(jnp.ones(()), ones), ones, atol=1e-6
    )

  def test_claim_branch_scale_folds_into_weight(self, key):
    kx, kg, kw = jax.random.split(key, 3)
    x = _normal(kx, (3, 8))
    g_q, g_k = _vec(kg, 8), jnp.ones(8)
    w_q = _normal(kw, (8, 4))
    q, _ = norms.branch_rms_norm(x, [g_q, g_k])
    folded = norms.rms_norm(x) @ (g_q[:, None] * w_q)
    helpers.assert_close(q @ w_q, folded, atol=1e-5)

  def test_branches_are_independent(self, key):
    kx, kg = jax.random.split(key)
    x = _normal(kx, (3, 8))
    g = _vec(kg, 8)
    q, k, v = norms.branch_rms_norm(x, [g, 2 * g, jnp.ones(8)])
    helpers.assert_close(k, 2 * q, atol=1e-6)
    helpers.assert_close(v, norms.rms_norm(x), atol=1e-6)
    grads = jax.grad(
      lambda s: jnp.sum(norms.branch_rms_norm(x, [s[0], s[1]])[0] ** 2)
    )(jnp.stack([g, g]))
    np.testing.assert_array_equal(grads[1], np.zeros(8))

  def test_dual_placement_and_dnp(self, key):
    kx, k1, k2, kw = jax.random.split(key, 4)
    x, w = _normal(kx, (3, 8)), _normal(kw, (8, 5))
    s_in, s_out = _vec(k1, 8), _vec(k2, 5)
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
    u = _vec(key, 8)
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


# ---------------------------------------------------------------------------
# [CLS]-specialized normalization (section 15b).


class TestSpecializedNorm:
  def _params(self, key, d=8):
    ks = jax.random.split(key, 4)
    return (
      _vec(ks[0], d),
      _vec(ks[1], d, 0.0),
      _vec(ks[2], d),
      _vec(ks[3], d, 0.0),
    )

  def test_claim_equal_params_is_layer_norm(self, key):
    kx, kp = jax.random.split(key)
    x = _normal(kx, (2, 5, 8), shift=1.0)
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
    x = _normal(kx, (2, 5, 8))
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
    x = _normal(kx, (2, 5, 8))
    sc, bc, sp, bp = self._params(kp)
    tt = norms.cls_token_type(5)
    gy = _normal(kg, (2, 5, 8))
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
    x = _normal(kx, (2, 4, 6))
    wc, wp = _normal(k1, (6, 3)), _normal(k2, (6, 3))
    bc, bp = _normal(k3, (3,)), _normal(k4, (3,))
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


# ---------------------------------------------------------------------------
# Gecko timestep-decay normalization (section 15c).


class TestTimestepDecayNorm:
  def test_numpy_with_pads_bos_and_state(self, key):
    kx, kw, kb, kp, ko, k1, k2 = jax.random.split(key, 7)
    x = _normal(kx, (2, 6, 8), scale=2.0, shift=0.5)
    w, b = _vec(kw, 8, 0.0), _vec(kb, 8, 0.0)
    pad = jax.random.bernoulli(kp, 0.3, (2, 6))
    bos = jax.random.bernoulli(ko, 0.3, (2, 6))
    state = norms.TimestepDecayNormState(
      jnp.array([0, 3], jnp.int32),
      0.3 * _normal(k1, (2, 2)),
      jnp.abs(_normal(k2, (2, 2))),
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
    x = _normal(kx, (3, 1, 8), scale=2.0, shift=0.5)
    w, b = _vec(kw, 8, 0.0), _vec(kb, 8, 0.0)
    y, _ = norms.timestep_decay_norm(x, w, b, num_groups=4)
    gn = norms.group_norm(x, 1 + w, b, num_groups=4, eps=1e-5)
    helpers.assert_close(y, gn, atol=2e-5, rtol=1e-4)

  def test_claim_identical_tokens(self, key):
    x = jnp.tile(_normal(key, (2, 1, 8), scale=2.0), (1, 7, 1))
    y, _ = norms.timestep_decay_norm(x, num_groups=2)
    helpers.assert_close(y, jnp.tile(y[:, :1], (1, 7, 1)), atol=1e-4)

  def test_claim_causal(self, key):
    kx, kn = jax.random.split(key)
    x = _normal(kx, (2, 6, 8))
    y1, _ = norms.timestep_decay_norm(x, num_groups=2)
    y2, _ = norms.timestep_decay_norm(
      x.at[:, 4:].set(_normal(kn, (2, 2, 8), scale=10.0)), num_groups=2
    )
    np.testing.assert_array_equal(y1[:, :4], y2[:, :4])

  def test_claim_streaming(self, key):
    x = _normal(key, (2, 9, 8), shift=0.3)
    step = jax.jit(
      functools.partial(
        norms.timestep_decay_norm, num_groups=2, beta1=0.9, beta2=0.95
      )
    )
    full, s_full = step(x, None, None, None)
    a, s_a = step(x[:, :4], None, None, None)
    b, s_b = step(x[:, 4:], None, None, s_a)
    _assert_same_structure(s_a, s_b)
    helpers.assert_close(jnp.concatenate([a, b], 1), full, atol=1e-5)
    helpers.assert_close(s_b, s_full, atol=1e-6)

  def test_gradients_reach_incoming_state(self, key):
    x = _normal(key, (2, 3, 8))
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


# ---------------------------------------------------------------------------
# Low precision and degenerate inputs, every norm of the family.

_FAMILY = {
  "evo_norm_b0": lambda x, s: norms.evo_norm_b0(
    x, s, s, s, norms.init_evo_norm_b0_state(x.shape[-1]), training=True
  )[0],
  "evo_norm_b0_eval": lambda x, s: norms.evo_norm_b0(
    x, s, s, s, norms.init_evo_norm_b0_state(x.shape[-1]), training=False
  )[0],
  "evo_norm_s0": lambda x, s: norms.evo_norm_s0(x, s, s, s, num_groups=2),
  "power_norm": lambda x, s: norms.power_norm(
    x,
    s,
    s,
    norms.init_power_norm_state(x.shape[-1]),
    training=True,
    num_groups=2,
  )[0],
  "power_norm_late": lambda x, s: norms.power_norm(
    x,
    s,
    s,
    norms.init_power_norm_state(x.shape[-1])._replace(
      count=jnp.asarray(5, jnp.int32)
    ),
    training=True,
    warmup_iters=2,
  )[0],
  "unified_norm": lambda x, s: norms.unified_norm(
    x,
    s,
    s,
    norms.init_unified_norm_state(x.shape[-1]),
    training=True,
    outlier_filtration=True,
    warmup_iters=0,
  )[0],
  "region_norm_b": lambda x, s: norms.region_norm_b(
    x, (x[..., :1] > 0).astype(jnp.float32), s, s, s, s
  ),
  "unmix_tns": lambda x, s: norms.unmix_tns(
    x,
    s,
    s,
    norms.init_unmix_tns_state(
      jnp.zeros(x.shape[-1]),
      jnp.ones(x.shape[-1]),
      jax.random.key(0),
      num_components=4,
    ),
  )[0],
  "l1_layer_norm": lambda x, s: norms.l1_layer_norm(x, s, s),
  "l1_batch_norm": lambda x, s: norms.l1_batch_norm(
    x, s, s, norms.init_l1_batch_norm_state(x.shape[-1]), training=True
  )[0],
  "l1_inside": lambda x, s: norms.l1_layer_norm(x, s, s, eps_mode="inside"),
  "branch_rms_norm": lambda x, s: norms.branch_rms_norm(x, [s, 2 * s])[1],
  "specialized_layer_norm": lambda x, s: norms.specialized_layer_norm(
    x, norms.cls_token_type(x.shape[-2]), s, s, 2 * s, s
  ),
  "timestep_decay_norm": lambda x, s: norms.timestep_decay_norm(
    x.reshape(x.shape[0], -1, x.shape[-1]), s, s, num_groups=2
  )[0],
  "region_norm_l": lambda x, s: norms.region_norm_l(
    x,
    jnp.full((3, 3, 2, 1), 0.1),
    0.1 * jnp.tile(s[:1], 9).reshape(3, 3, 1, 1),
    s[:1],
    -0.1 * jnp.tile(s[:1], 9).reshape(3, 3, 1, 1),
    s[:1],
    threshold=0.5,
  ),
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", sorted(_FAMILY))
@pytest.mark.parametrize("case", ["large", "zero_rows"])
def test_finite_outputs_and_gradients(key, dtype, name, case):
  fn = _FAMILY[name]
  x = _normal(key, (2, 3, 2, 8), scale=1e4 if case == "large" else 1.0)
  if case == "zero_rows":
    x = x.at[0].set(0.0).at[1, 1].set(0.0)
  x = x.astype(dtype)
  s = jnp.linspace(0.5, 1.5, 8)
  y = jax.jit(fn)(x, s)
  assert y.dtype == dtype
  assert helpers.all_finite(y)
  grads = jax.jit(
    jax.grad(lambda x, s: jnp.sum(fn(x, s).astype(jnp.float32)), (0, 1))
  )(x, s)
  assert grads[0].dtype == dtype and grads[1].dtype == jnp.float32
  assert helpers.all_finite(grads)
