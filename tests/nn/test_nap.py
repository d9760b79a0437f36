"""NaP's placement (`jaxnorm.nn.nap`) with `optim.nap_project` (spec 12)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import optim
from jaxnorm.nn import nap


def _model():
  return nap.NaPMLP((6, 16, 16, 3), rngs=nnx.Rngs(0))


def test_hidden_layers_are_dense_norm_activation():
  model = _model()
  x = jax.random.normal(jax.random.key(0), (4, 6))
  h = x
  for dense, norm in zip(model.hidden, model.norms):
    assert dense.bias is None  # Redundant before a mean-subtracting norm.
    h = jax.nn.relu(norm(h @ dense.kernel[...]))
  expected = h @ model.readout.kernel[...] + model.readout.bias[...][None]
  np.testing.assert_allclose(model(x), expected, rtol=1e-6, atol=1e-6)


def test_projection_keeps_the_function_and_skips_the_readout():
  model = _model()
  params = nnx.as_pure(nnx.state(model, nnx.Param))
  mask = nap.nap_mask(model)
  assert not mask["readout"]["kernel"] and mask["hidden"][1]["kernel"]
  tx = optim.nap_project(mask)
  state = tx.init(params)
  grown = jax.tree.map(lambda p: 3.0 * p, params)
  updates = jax.tree.map(lambda g, p: g - p, grown, params)
  with jax.numpy_dtype_promotion("standard"):
    updates, _ = tx.update(updates, state, params)
  projected = optax.apply_updates(params, updates)
  for i in range(2):
    np.testing.assert_allclose(
      jnp.linalg.norm(projected["hidden"][i]["kernel"]),
      jnp.linalg.norm(params["hidden"][i]["kernel"]),
      rtol=1e-6,
    )
  np.testing.assert_array_equal(
    projected["readout"]["kernel"], grown["readout"]["kernel"]
  )
  x = jax.random.normal(jax.random.key(1), (5, 6))
  hidden_only = jax.tree.map(lambda p: p, params)
  for i in range(2):
    hidden_only["hidden"][i]["kernel"] = projected["hidden"][i]["kernel"]
  nnx.update(model, params)
  before = model(x)
  nnx.update(model, hidden_only)
  np.testing.assert_allclose(model(x), before, atol=1e-5)


def test_errors():
  with pytest.raises(ValueError, match=r"NaPMLP: sizes needs"):
    nap.NaPMLP((4,), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"NaPMLP: activation must be"):
    nap.NaPMLP((4, 4, 2), activation="swiglu", rngs=nnx.Rngs(0))
