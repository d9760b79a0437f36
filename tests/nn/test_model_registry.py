"""The model registry: every `ModelSpec` agrees with its config and module.

Driven by `model_registry.MODELS`: a model added there is checked here
(its parts exist in its config, its facts are its module's, what it derives
from the data are config fields, its part names have its dtype kind)
without a new line; `tests/training/test_build.py` builds each one from the
runner's defaults.
"""

import dataclasses
import typing

import jax
import pytest
from flax import nnx

from jaxnorm.nn import layers, model_registry, registry
from jaxnorm.nn import norms as nn_norms

SHARED = {"width": 8, "depth": 2, "num_heads": 2, "positional": "none"}
DATA = {
  "text": {"vocab_size": 16, "max_len": 8},
  "images": {"num_classes": 3, "image_shape": (8, 8, 1)},
  "graphs": {"num_classes": 3, "vocab_size": 4, "pe_dim": 2},
}


def _fields(spec):
  return {f.name for f in dataclasses.fields(spec.config)}


def test_literal_equals_registry():
  assert typing.get_args(model_registry.ModelName) == tuple(
    model_registry.MODELS
  )
  modules = [s.module for s in model_registry.MODELS.values()]
  assert len(set(modules)) == len(modules)


@pytest.mark.parametrize("name", model_registry.MODEL_NAMES)
def test_spec_agrees_with_config_and_module(name):
  spec = model_registry.MODELS[name]
  fields = _fields(spec)
  assert spec.parts <= fields, sorted(spec.parts - fields)
  assert spec.heads == ("num_heads" in fields)
  assert bool(spec.positional) == bool({"positional", "pe"} & fields)
  for attr in ("layout", "causal", "dtype_kind"):
    if hasattr(spec.module, attr):
      assert getattr(spec, attr) == getattr(spec.module, attr), attr
  derived = spec.derive(SHARED, DATA[spec.data])
  assert set(derived) <= fields, sorted(set(derived) - fields)
  assert "remat" in fields  # The runner's --remat reaches every model.
  for field, aliases in spec.counterparts.items():
    assert field in spec.parts, field
    valid = model_registry.registries(name)[field]
    assert set(aliases.values()) <= set(valid), (field, aliases)


@pytest.mark.parametrize("name", model_registry.MODEL_NAMES)
def test_remat_keeps_the_state_layout(name):
  # A checkpoint restores across --remat: the same paths, shapes, dtypes.
  spec = model_registry.MODELS[name]
  fields = _fields(spec)
  shared = {k: v for k, v in SHARED.items() if k in fields}

  def layout(remat):
    config = spec.config(
      **shared, **spec.derive(SHARED, DATA[spec.data]), remat=remat
    )
    model = nnx.eval_shape(lambda: spec.module(config, rngs=nnx.Rngs(0)))
    return jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(model))

  want = layout("none")
  for remat in layers.REMAT_CHOICES[1:]:
    got = layout(remat)
    assert jax.tree.structure(got) == jax.tree.structure(want), remat
    assert jax.tree.leaves(got) == jax.tree.leaves(want), remat


@pytest.mark.parametrize("name", model_registry.MODEL_NAMES)
def test_part_names_follow_the_dtype_kind(name):
  spec = model_registry.MODELS[name]
  names = model_registry.registries(name)
  assert all(v == tuple(sorted(v)) for v in names.values())
  if "norm" in spec.parts:
    kinds = {nn_norms.NORMS[n].dtype_kind for n in names["norm"]}
    assert kinds == {spec.dtype_kind}, kinds


def test_spec_errors():
  lm = model_registry.MODELS["lm"]
  with pytest.raises(ValueError, match=r"data must be one of text, images"):
    registry.ModelSpec(lm.config, lm.module, "x", "audio")
  with pytest.raises(ValueError, match=r"parts \['mixer'\] are not part"):
    registry.ModelSpec(lm.config, lm.module, "x", "text", parts={"mixer"})
  with pytest.raises(ValueError, match=r"needs a layout of tokens"):
    registry.ModelSpec(
      lm.config, jax.nn, "x", "text", parts=frozenset({"norm"})
    )
  with pytest.raises(ValueError, match=r"unknown model 'gpt'; valid names"):
    model_registry.spec("gpt")
