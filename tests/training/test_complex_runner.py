"""``jaxnorm-train --model clm|cvcnn``: parts, config errors, CLI runs."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxnorm.nn import cplx as nn_cplx
from jaxnorm.training import build, cli, config
from tests.training import runs


def _validate(cfg):
  config.validate(cfg, build.registries_for(cfg))


def test_complex_models_take_their_own_parts():
  names = build.registries("clm")
  # The complex causal cores of the registry, CNet's Fourier mixing, and
  # the real name that stands for the complex softmax.
  assert names["attention"] == (
    "born",
    "complex_softmax",
    "fourier",
    "pct",
    "softmax",
  )
  assert "complexrmsnorm" in names["norm"] and "batchnorm" not in names["norm"]
  # The runner's defaults build both models.
  for model, data in (("clm", "shakespeare"), ("cvcnn", "digits")):
    cfg = config.TrainConfig(model=model, data=data, attention="softmax")
    _validate(cfg)


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"model": "clm", "norm": "batchnorm"}, r"--norm 'batchnorm' is not valid"),
    (
      {"model": "clm", "attention": "sink"},
      r"--attention 'sink' is not valid; choose one of born, "
      r"complex_softmax, fourier, pct, softmax",
    ),
    ({"model": "cvcnn", "data": "shakespeare"}, r"--data 'shakespeare'"),
  ],
)
def test_complex_config_errors(changes, message):
  base = config.TrainConfig(model="clm", attention="born")
  with pytest.raises(ValueError, match=message):
    _validate(dataclasses.replace(base, **changes))


def test_build_maps_runner_names_onto_the_complex_configs():
  cfg = config.TrainConfig(
    model="clm", attention="pct", norm="layernorm", width=16, depth=2
  )
  mc = build.model_config(cfg, {"vocab_size": 256, "max_len": 32})
  assert isinstance(mc, nn_cplx.ComplexLMConfig)
  assert (mc.attention, mc.norm, mc.activation) == (
    "pct",
    "complexlayernorm",
    "split_gelu",
  )
  cfg = config.TrainConfig(model="cvcnn", data="digits", width=16, depth=2)
  data = {"num_classes": 10, "image_shape": (8, 8, 1)}
  mc = build.model_config(cfg, data)
  assert isinstance(mc, nn_cplx.CVCNNConfig) and mc.widths == (8, 16)


def test_complex_gradients_are_conjugated():
  # jax's gradient of a real loss is the conjugate of the steepest-ascent
  # direction (PyTorch's convention); the runner conjugates first.
  from jaxnorm.optim import complex as complex_opt

  w = jnp.array([1.0 + 2.0j])
  g = jax.grad(lambda w: jnp.sum(jnp.abs(w) ** 2))(w)
  step, _ = optax.chain(complex_opt.conjugate_complex(), optax.sgd(0.1)).update(
    g, optax.chain(complex_opt.conjugate_complex(), optax.sgd(0.1)).init(w)
  )
  # |w|^2 falls along -w: the update is -0.1 * 2w.
  assert jnp.allclose(step, -0.2 * w)


@pytest.mark.slow
@pytest.mark.parametrize(
  "argv",
  [
    ["--model=clm", "--attention=born", "--seq-len=32"],
    ["--model=cvcnn", "--data=digits"],
  ],
  ids=["clm", "cvcnn"],
)
def test_cli_trains_complex_models(tmp_path, argv):
  out = tmp_path / "run"
  argv = [
    *argv,
    "--width=16",
    "--depth=2",
    "--num-heads=2",
    "--batch-size=16",
    "--steps=30",
    "--eval-every=30",
    "--log-every=10",
    "--warmup-steps=3",
    "--learning-rate=1e-2",
    f"--out-dir={out}",
    "--no-progress",
  ]
  assert cli.train_main(argv) == 0
  train, _ = runs.losses(out)
  assert train[30] < train[10], train
  summary = json.loads((pathlib.Path(out) / "summary.json").read_text())
  assert summary["steps"] == 30 and not summary["stopped_early"]
