"""From a run config to a model: every registered model, the runner's names.

Driven by `model_registry.MODELS`: a new model is built here from the
runner's default part names (a complex model through its spec's
``counterparts``) with the fields its data decides.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm.nn import model_registry
from jaxnorm.training import build, config

DATA = {
  "text": {"vocab_size": 16, "max_len": 8},
  "images": {"num_classes": 3, "image_shape": (8, 8, 1)},
  "graphs": {"num_classes": 3, "vocab_size": 4, "pe_dim": 2},
}


def test_runner_tables_come_from_the_specs():
  assert config.MODELS == model_registry.MODEL_NAMES
  for name, spec in model_registry.MODELS.items():
    assert config.MODEL_DATA[name] == config.DATASETS[spec.data]
    assert config.MODEL_POSITIONAL.get(name, ()) == spec.positional


def test_model_config_carries_run_fields_and_counterparts():
  cfg = config.TrainConfig(model="clm", norm="layernorm", width=8, depth=3)
  got = build.model_config(cfg, DATA["text"])
  assert (got.norm, got.width, got.depth, got.vocab_size) == (
    "complexlayernorm",
    8,
    3,
    16,
  )
  cvcnn = config.TrainConfig(
    model="cvcnn", data="digits", activation="relu", width=32, depth=3
  )
  got = build.model_config(cvcnn, DATA["images"])
  assert (got.activation, got.widths) == ("crelu", (8, 16, 32))
  with pytest.raises(ValueError, match=r"--norm-kwargs is not supported by"):
    build.model_config(
      config.TrainConfig(model="mlp", data="digits", norm_kwargs=(("eps", 1),)),
      DATA["images"],
    )


@pytest.mark.parametrize("name", model_registry.MODEL_NAMES)
def test_each_model_builds_from_the_runner_defaults(name):
  """The runner's defaults build every model (complex: counterparts)."""
  spec = model_registry.MODELS[name]
  cfg = config.TrainConfig(
    model=name,
    data=config.MODEL_DATA[name][0],
    width=8,
    depth=2,
    num_heads=2,
  )
  config.validate(cfg, build.registries_for(cfg))
  model = build.build_model(cfg, DATA[spec.data], rngs=nnx.Rngs(0))
  assert isinstance(model, spec.module)
  if spec.data == "text":
    logits = model(jnp.zeros((2, 8), jnp.int32))
    assert logits.shape == (2, 8, 16)
    assert np.isfinite(np.asarray(logits)).all()
  elif spec.data == "images":
    logits = model(jnp.zeros((2, 8, 8, 1)))
    assert logits.shape == (2, 3)
    assert np.isfinite(np.asarray(logits)).all()
