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
    y_fn, state = norms.evo_norm_b0(x, jnp.ones(4), jnp.zeros(4), jnp.ones(4),
                                    norms.init_evo_norm_b0_state(4),
                                    training=True)
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
    with pytest.raises(ValueError, match=r"EvoNormS0: num_features=6 must be "
                       r"divisible by num_groups=4"):
      jnn.EvoNormS0(6, num_groups=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"EvoNormS0: variant must be one of"):
      jnn.EvoNormS0(4, num_groups=2, variant="b0", rngs=nnx.Rngs(0))
    module = jnn.EvoNormS0(4, num_groups=None, group_size=2, rngs=nnx.Rngs(0))
    assert module.num_groups == 2
    np.testing.assert_array_equal(module.v[...], np.ones(4))


class TestBackwardStatNorms:

  @pytest.mark.parametrize("name", ["powernorm", "unifiednorm"])
  def test_train_step_matches_function(self, key, name):
    kwargs = ({"num_groups": 2, "warmup_iters": 2} if name == "powernorm"
              else {"window_size": 2, "warmup_iters": 1})
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
      fields = (("grad_ema",) if name == "powernorm"
                else ("grad_ema", "buf_gz"))

      fn_kwargs = {k: v for k, v in kwargs.items() if k != "window_size"}

      def f(x, *stats):
        return fn(x, jnp.ones(4), jnp.zeros(4),
                  state._replace(**dict(zip(fields, stats))), training=True,
                  **fn_kwargs)

      _, vjp, new = jax.vjp(f, x, *(getattr(state, n) for n in fields),
                            has_aux=True)
      increments = vjp(gy)[1:]
      state = new._replace(**{n: getattr(new, n) + d
                              for n, d in zip(fields, increments)})
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
    with pytest.raises(ValueError, match=r"PowerNorm: backward_stat must be "
                       r"one of"):
      jnn.PowerNorm(4, backward_stat="paper", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"PowerNorm: num_features=4 must be "
                       r"divisible by num_groups=3"):
      jnn.PowerNorm(4, num_groups=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"window_size must be an int or a "
                       r"pair"):
      jnn.UnifiedNorm(4, window_size=(1, 2, 3), rngs=nnx.Rngs(0))
