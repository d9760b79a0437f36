"""``jaxnorm-train --model graph``: config, build, the graph task, CLI runs."""

import dataclasses
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm.nn import graph as nn_graph
from jaxnorm.training import build, cli, config, tasks
from tests.training import runs

GRAPH = config.TrainConfig(
  model="graph",
  data="pattern",
  norm="batchnorm",
  width=16,
  depth=2,
  num_heads=2,
  batch_size=8,
  graph_sizes=(64, 16, 16),
  graph_blocks=(3, 6),
  progress=False,
)
DATA = {"num_classes": 2, "vocab_size": 3, "pe_dim": 2}


def _validate(cfg):
  config.validate(cfg, build.registries_for(cfg))


def test_auto_positional_resolves_per_model():
  assert config.resolve(GRAPH).positional == "lap"
  assert config.resolve(config.TrainConfig()).positional == "learned"
  cnn = config.TrainConfig(model="cnn", data="digits")
  assert config.resolve(cnn).positional == "auto"
  # A saved run with the resolved value does not drift from "auto".
  saved = config.to_json(config.resolve(GRAPH))
  assert config.drift(saved, GRAPH) == []
  changed = dataclasses.replace(GRAPH, positional="none")
  assert config.drift(saved, changed) == ['--positional "lap" -> "none"']


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"positional": "learned"}, r"'learned' is not valid for --model graph"),
    ({"data": "shakespeare"}, r"--data 'shakespeare' is not valid"),
    ({"graph": "dense"}, r"--graph 'dense' is not valid; .*sparse, full"),
    ({"pe_dim": -1}, r"--pe-dim must be >= 0"),
    ({"logit_clip": 0.0}, r"--logit-clip must be > 0"),
    ({"logit_clip": -1.0}, r"--logit-clip must be a finite number"),
    ({"graph_sizes": (10, 2)}, r"--graph-sizes takes three"),
    ({"graph_blocks": (6, 3)}, r"--graph-blocks takes SIZE_MIN,SIZE_MAX"),
    ({"norm": "groupnorm"}, r"--norm 'groupnorm' is not valid"),
    ({"num_heads": 3}, r"--num-heads 3 must divide --width 16"),
  ],
)
def test_graph_config_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    _validate(dataclasses.replace(GRAPH, **changes))


def test_graph_norms_are_the_models():
  names = build.registries("graph")["norm"]
  assert names == nn_graph.graph_norms()
  assert "batchnorm" in names and "groupnorm" not in names
  _validate(GRAPH)  # The default config is valid.
  _validate(dataclasses.replace(GRAPH, positional="none", data="cluster"))


def test_build_maps_the_fields_onto_graph_transformer_config():
  cfg = dataclasses.replace(
    GRAPH, graph="full", edge_features=True, logit_clip=5.0
  )
  got = build.model_config(cfg, DATA)
  want = nn_graph.GraphTransformerConfig(
    num_classes=2,
    vocab_size=3,
    norm="batchnorm",
    graph="full",
    pe="lap",
    pe_dim=2,
    edge_features=True,
    width=16,
    depth=2,
    num_heads=2,
    logit_clip=5.0,
  )
  assert got == want
  none = build.model_config(dataclasses.replace(GRAPH, positional="none"), DATA)
  assert none.pe == "none"
  with pytest.raises(ValueError, match=r"--allow-batch-stats is not supported"):
    build.model_config(dataclasses.replace(GRAPH, allow_batch_stats=True), DATA)


def test_built_model_runs_the_task_inputs():
  model = build.build_model(GRAPH, DATA, rngs=nnx.Rngs(0))
  assert isinstance(model, nn_graph.GraphTransformer)
  rng = np.random.default_rng(0)
  n = 6
  upper = np.triu(rng.random((2, n, n)) < 0.5, 1)
  batch = {
    "features": rng.integers(0, 3, (2, n)).astype(np.int32),
    "adjacency": upper | np.swapaxes(upper, 1, 2),
    "node_mask": np.arange(n)[None] < np.array([[6], [4]]),
    "pe": rng.normal(size=(2, n, 2)).astype(np.float32),
    "labels": rng.integers(0, 2, (2, n)).astype(np.int32),
  }

  @nnx.jit
  def forward(model, batch):
    logits = model(*tasks.inputs("graph", batch))
    return logits, tasks.loss_and_metrics("graph", logits, batch)

  logits, (loss, metrics) = forward(model, batch)
  assert logits.shape == (2, n, 2)
  # NumPy oracle: torch's weighted mean CE, weights (V - n_c) / V.
  z = np.asarray(logits, np.float64)[batch["node_mask"]]
  y = batch["labels"][batch["node_mask"]]
  counts = np.bincount(y, minlength=2)
  w = ((counts.sum() - counts) / counts.sum())[y]
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  want = -(w * logp[np.arange(len(y)), y]).sum() / w.sum()
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  pred = z.argmax(-1)
  recall = [np.mean(pred[y == c] == c) for c in range(2) if (y == c).any()]
  present = {*y.tolist(), *pred.tolist()}
  want_acc = np.sum(recall) / len(present)
  np.testing.assert_allclose(float(metrics["accuracy"]), want_acc, rtol=1e-6)
  assert jnp.issubdtype(loss.dtype, jnp.floating)


@pytest.mark.slow
@pytest.mark.parametrize("data", ["pattern", "cluster"])
def test_cli_trains_graph_model_and_loss_falls(tmp_path, data, capsys):
  out = tmp_path / data
  argv = [
    "--model=graph",
    f"--data={data}",
    "--norm=batchnorm",
    "--graph-sizes=64,16,16",
    "--graph-blocks=3,6",
    "--width=16",
    "--depth=2",
    "--num-heads=2",
    "--batch-size=8",
    "--steps=40",
    "--eval-every=40",
    "--log-every=10",
    "--warmup-steps=4",
    "--learning-rate=5e-3",
    "--weight-decay=0",
    f"--out-dir={out}",
    "--no-progress",
  ]
  assert cli.train_main(argv) == 0
  assert "graph/batchnorm" in capsys.readouterr().out
  train, val = runs.losses(out)
  assert train[40] < train[10] - 0.01, train
  summary = json.loads((pathlib.Path(out) / "summary.json").read_text())
  assert summary["config"]["positional"] == "lap"
  assert 0.0 <= summary["val_accuracy"] <= 1.0
  # The generated graphs and encodings are cached in the run directory.
  assert sorted(p.suffix for p in (out / "data").iterdir()) == [".npy"] * 3 + [
    ".npz"
  ]
