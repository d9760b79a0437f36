"""Tests of `jaxnorm.norms.unified`: UN over steps against NumPy float64, its
claims and `fold_unified_norm`; and of its module `jaxnorm.nn.UnifiedNorm`.
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
    gamma, beta = common.vec(kg, c), common.vec(kb, c, 0.0)
    state = norms.init_unified_norm_state(c, (3, 2))._replace(
      count=jnp.asarray(start, jnp.int32)
    )
    st = _un_ref_state(state)
    kw = {"warmup_iters": start + 2, "outlier_filtration": filtration}
    step = jax.jit(functools.partial(_un_step, **kw))
    scales = [1.0, 1.2, 0.9, 1.1, 8.0, 1.0, 1.05]
    for k, sc in zip(ks, scales):
      kx, ky, km = jax.random.split(k, 3)
      x = common.normal(kx, (3, 4, c), scale=sc, shift=0.2)
      gy = common.normal(ky, x.shape)
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
      common.assert_same_structure(
        state, norms.init_unified_norm_state(c, (3, 2))
      )
    if filtration:
      assert st["skips"] > 0  # The x8 batch is filtered as an outlier.

  def test_claim_forward_inside_window(self, key):
    kx, kg, kb = jax.random.split(key, 3)
    gamma, beta = common.vec(kg, 5), common.vec(kb, 5, 0.0)
    state = norms.init_unified_norm_state(5)
    for k in jax.random.split(kx, 4):  # t = 1 .. W_f
      x = common.normal(k, (3, 4, 5), scale=2.0)
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
    x = common.normal(key, (4, 3), scale=2.0)
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
    x = common.normal(kx, (3, 4, 5), scale=2.0)
    gamma, gy = common.vec(kg, 5), common.normal(ky, (3, 4, 5))
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
        common.normal(k, (4, 6), scale=3.0), None, None, state, training=True
      )
    buf = np.asarray(state.buf_x2, np.float64)
    assert np.all(np.exp(np.log(buf).mean(0)) <= buf.mean(0) + 1e-9)

  @pytest.mark.parametrize("position", ["next", "previous"])
  def test_claim_folded_linear_equals_unfused(self, key, position):
    kx, kg, kb, kv, kw, kc = jax.random.split(key, 6)
    c = 6
    gamma, beta = common.vec(kg, c), common.vec(kb, c, 0.0)
    state = norms.init_unified_norm_state(c)._replace(
      running_var=common.vec(kv, c, 2.0, 0.5)
    )
    x = common.normal(kx, (4, 5, c))
    un = lambda h: norms.unified_norm(h, gamma, beta, state, training=False)[0]
    if position == "next":
      w, b = common.normal(kw, (c, 3)), common.normal(kc, (3,))
      unfused = un(x) @ w + b[None, None]
    else:
      w, b = common.normal(kw, (c, c)), common.normal(kc, (c,))
      unfused = un(x @ w + b[None, None])
    fw, fb = norms.fold_unified_norm(
      gamma, beta, state.running_var, w, b, position=position
    )
    helpers.assert_close(x @ fw + fb[None, None], unfused, atol=1e-5)

  def test_cross_device(self, key):
    kx, ky = jax.random.split(key)
    x = common.normal(kx, (8, 3, 6), scale=2.0, shift=0.5)
    gy = common.normal(ky, x.shape)
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
        mesh=common.mesh4(),
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


class TestUnifiedNormModule:
  def test_train_step_matches_function(self, key):
    backward_stat.check_train_steps(
      key,
      "unifiednorm",
      norms.unified_norm,
      ("grad_ema", "buf_gz"),
      window_size=2,
      warmup_iters=1,
    )

  def test_unified_norm_fold(self, key):
    kx, kw = jax.random.split(key)
    module = jnn.UnifiedNorm(4, rngs=nnx.Rngs(0))
    module(common.normal(kx, (3, 5, 4), scale=3.0))  # One training step.
    module.eval()
    x, w = common.normal(kx, (2, 4)), common.normal(kw, (4, 3))
    fw, fb = module.fold(w)
    helpers.assert_close(x @ fw + fb[None], module(x) @ w, atol=1e-5)

  def test_errors(self):
    with pytest.raises(
      ValueError,
      match=r"window_size must be an int or a "
      r"pair",
    ):
      jnn.UnifiedNorm(4, window_size=(1, 2, 3), rngs=nnx.Rngs(0))
