"""Every registered norm draws the same number of keys from ``rngs``.

Swapping the norm of a model must not change the initialization of the
layers built after it (an A/B comparison of norms would otherwise compare
different initializations too).
"""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm.nn import _norm_keys

D = 8


def _linear_after(build):
  """Count drawn by ``build(rngs)`` and the kernel of a Linear built next."""
  rngs = nnx.Rngs(0)
  build(rngs)
  count = int(rngs.default.count[...])
  return count, np.asarray(nnx.Linear(D, 4, rngs=rngs).kernel[...])


@pytest.fixture(scope="module")
def after_flax_layernorm():
  return _linear_after(lambda rngs: nnx.LayerNorm(D, rngs=rngs))


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_same_draws_and_same_next_layer(name, after_flax_layernorm):
  count, kernel = _linear_after(lambda rngs: jnn.make_norm(name, D, rngs=rngs))
  assert count == _norm_keys.NUM_KEYS == after_flax_layernorm[0]
  np.testing.assert_array_equal(kernel, after_flax_layernorm[1])


@pytest.mark.parametrize(
  "kwargs",
  [
    {"use_scale": False},
    {"use_bias": False},
    {"use_scale": False, "use_bias": False},
  ],
)
def test_options_do_not_change_the_draws(kwargs, after_flax_layernorm):
  count, kernel = _linear_after(
    lambda rngs: jnn.LayerNorm(D, rngs=rngs, **kwargs)
  )
  assert count == _norm_keys.NUM_KEYS
  np.testing.assert_array_equal(kernel, after_flax_layernorm[1])


def test_params_stream_feeds_the_initializers():
  """The keys come from the ``params`` stream, scale first, then bias."""
  init = jax.nn.initializers.normal(1.0)
  rngs = nnx.Rngs(params=3, dropout=5)
  module = jnn.LayerNorm(D, scale_init=init, bias_init=init, rngs=rngs)
  assert int(rngs.params.count[...]) == 2
  assert int(rngs.dropout.count[...]) == 0
  flax = nnx.LayerNorm(
    D, scale_init=init, bias_init=init, rngs=nnx.Rngs(params=3)
  )
  np.testing.assert_array_equal(module.scale[...], flax.scale[...])
  np.testing.assert_array_equal(module.bias[...], flax.bias[...])
