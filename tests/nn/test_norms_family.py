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
