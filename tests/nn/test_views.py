"""flax's train/eval protocol on jaxnorm's norms: ``nnx.view``, ``set_view``,
``model.eval()`` / ``model.train()``, inside models that mix flax and
jaxnorm layers. Parametrized from `NORMS`: every registered norm with a
``use_running_average`` switch is covered."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from tests import helpers

D = 8
SWITCHED = sorted(
  name
  for name, spec in jnn.NORMS.items()
  if spec.dtype_kind == "real"  # Beside flax's BatchNorm on real inputs.
  and hasattr(jnn.make_norm(name, D, rngs=nnx.Rngs(0)), "use_running_average")
)
SHAPES = {"tokens": (4, 3, D), "images": (4, 3, 3, D)}


class Mixed(nnx.Module):
  """flax BatchNorm and a jaxnorm norm, in either order."""

  def __init__(self, name, *, jaxnorm_first, rngs):
    self.first_is_jaxnorm = jaxnorm_first
    self.flax_bn = nnx.BatchNorm(D, momentum=0.5, rngs=rngs)
    self.ours = jnn.make_norm(name, D, rngs=rngs)

  def __call__(self, x):
    if self.first_is_jaxnorm:
      return self.flax_bn(self.ours(x))
    return self.ours(self.flax_bn(x))


def _x(name, key):
  layout = min(jnn.NORMS[name].layouts)
  return jax.random.normal(key, SHAPES[layout]) * 2.0 + 1.0


def _stats(module):
  return [
    np.asarray(a) for a in jax.tree.leaves(nnx.state(module, nnx.BatchStat))
  ]


def test_every_switched_norm_is_found():
  assert {"batchnorm", "evonormb0", "l1batchnorm", "powernorm"} <= set(SWITCHED)
  assert "unifiednorm" in SWITCHED


@pytest.mark.parametrize("jaxnorm_first", [True, False])
@pytest.mark.parametrize("name", SWITCHED)
def test_view_switches_flax_and_jaxnorm(key, name, jaxnorm_first):
  model = Mixed(name, jaxnorm_first=jaxnorm_first, rngs=nnx.Rngs(0))
  x = _x(name, key)
  model(x)  # One training step moves both modules' statistics.
  ours_before, flax_before = _stats(model.ours), _stats(model.flax_bn)

  evaluated = nnx.view(model, use_running_average=True)
  assert evaluated.ours.use_running_average
  assert evaluated.flax_bn.use_running_average
  assert not model.ours.use_running_average  # The view is a new node.
  y = evaluated(x)
  # Eval mode: neither module's statistics move ...
  for a, b in zip(_stats(model.ours), ours_before):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_stats(model.flax_bn), flax_before):
    np.testing.assert_array_equal(a, b)
  # ... and the output is the explicit inference call of each module.
  if jaxnorm_first:
    expected = model.flax_bn(
      model.ours(x, use_running_average=True), use_running_average=True
    )
  else:
    expected = model.ours(
      model.flax_bn(x, use_running_average=True), use_running_average=True
    )
  helpers.assert_close(y, expected, atol=0)

  trained = nnx.view(evaluated, use_running_average=False)
  assert not trained.ours.use_running_average
  trained(x)
  moved = [
    not np.array_equal(a, b) for a, b in zip(_stats(model.ours), ours_before)
  ]
  assert any(moved)


@pytest.mark.parametrize("name", SWITCHED)
def test_eval_and_train_methods(name):
  model = Mixed(name, jaxnorm_first=True, rngs=nnx.Rngs(0))
  model.eval()
  assert model.ours.use_running_average and model.flax_bn.use_running_average
  model.train()
  assert not model.ours.use_running_average
  assert not model.flax_bn.use_running_average


def test_view_without_flax_modules():
  """Only jaxnorm modules consume the flag: nnx.view must not raise."""
  model = nnx.Sequential(
    jnn.BatchNorm(D, rngs=nnx.Rngs(0)), jnn.LayerNorm(D, rngs=nnx.Rngs(0))
  )
  view = nnx.view(model, use_running_average=True)
  assert view.layers[0].use_running_average
  with pytest.raises(ValueError, match=r"Unused keys found in nnx.view"):
    nnx.view(model, deterministic=True)


def test_view_only_filter():
  model = Mixed("batchnorm", jaxnorm_first=True, rngs=nnx.Rngs(0))
  view = nnx.view(model, only=jnn.BatchNorm, use_running_average=True)
  assert view.ours.use_running_average
  assert not view.flax_bn.use_running_average


def test_set_view_keeps_mode_when_not_given():
  module = jnn.BatchNorm(D, use_running_average=True, rngs=nnx.Rngs(0))
  module.set_view()
  assert module.use_running_average
  module.set_view(use_running_average=False)
  assert not module.use_running_average


def test_call_argument_overrides_view(key):
  module = jnn.BatchNorm(D, rngs=nnx.Rngs(0))
  view = nnx.view(module, use_running_average=True)
  x = jax.random.normal(key, (4, D)) + 3.0
  view(x, use_running_average=False)  # Explicit training call.
  assert float(jnp.abs(module.mean[...]).max()) > 0
