"""Test-time normalization: UnMix-TNS vs BatchNorm on label-correlated streams.

Claim checked (Tomar, Vray, Thiran & Bozorgtabar, "Un-Mixing Test-Time
Normalization Statistics: Combatting Label Temporal Correlation", ICLR
2024): normalizing with the statistics of the current test batch (test-time
BatchNorm, TBN) collapses when the labels of the test stream are
temporally correlated (each batch holds few classes), while UnMix-TNS, ``K``
statistic components initialized from the source BatchNorm and updated
online, keeps the accuracy it has on an i.i.d. stream and beats TBN there.

Setting: the runner's CNN with BatchNorm (`jaxnorm.nn.models.CNN`), trained
briefly on Fashion-MNIST by the runner (one model per seed), then run on
the 10 000 test images in batches of 64, three ways: ``source`` (the
trained running statistics), ``tbn`` (statistics of each test batch) and
``unmix`` (every BatchNorm replaced by `jaxnorm.nn.norms.UnMixTNS`
`from_batch_norm`, K = 16, its components updated along the stream). Two
streams: ``iid`` (shuffled) and ``sorted`` (grouped by label, shuffled
within a label: the extreme label-temporal correlation); two conditions:
``clean`` and ``shifted`` (a covariate shift: contrast scaled by 0.6
around 0.5 plus Gaussian noise of std 0.1, clipped to [0, 1]; the paper's
setting is corrupted test data). Error rates, 3 seeds (training, stream
order and the UnMix-TNS component noise); verdicts compare means with the
standard error of their difference (`experiments._grid.verdict`).

  python -m experiments.ttn_claims [--quick] [--full]
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import quant
from jaxnorm.training import build, trainer
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "ttn_claims"
METHODS = ("source", "tbn", "unmix")
STREAMS = ("iid", "sorted")
CONDITIONS = ("clean", "shifted")
NUM_COMPONENTS = 16

# (variant, reference, claim, tolerance in error rate for "equal", label)
CLAIMS = (
  (
    "tbn/iid",
    "tbn/sorted",
    "lower",
    0.0,
    "test-batch BN collapses on the label-sorted stream",
  ),
  ("unmix/sorted", "tbn/sorted", "lower", 0.0, "UnMix-TNS beats TBN, sorted"),
  (
    "unmix/sorted",
    "unmix/iid",
    "equal",
    0.03,
    "UnMix-TNS keeps its i.i.d. error on the sorted stream",
  ),
)


def base_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """The training run: CNN width 32, depth 2, batch 64 (quick: toy)."""
  if quick:
    size = dict(data="digits", width=8, depth=1, batch_size=16)
    steps = dict(steps=4, eval_every=4, eval_batches=1, warmup_steps=1)
  elif full:
    size = dict(data="fashion_mnist", width=64, depth=4, batch_size=64)
    steps = dict(steps=3000, eval_every=500, eval_batches=40, warmup_steps=100)
  else:
    size = dict(data="fashion_mnist", width=32, depth=2, batch_size=64)
    steps = dict(steps=400, eval_every=100, eval_batches=16, warmup_steps=40)
  return config_lib.TrainConfig(
    model="cnn",
    norm="batchnorm",
    # Flax's momentum 0.99 leaves the running statistics short of the
    # trained weights' after a few hundred steps.
    norm_kwargs=(("momentum", 0.9),),
    **size,
    **steps,
    log_every=steps["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    learning_rate=3e-3,
  )


def shift(x: np.ndarray, seed: int) -> np.ndarray:
  """Contrast scaled by 0.6 around 0.5, Gaussian noise of std 0.1, clip."""
  rng = np.random.default_rng(10_000 + seed)
  noisy = 0.5 + 0.6 * (x - 0.5) + rng.normal(0.0, 0.1, x.shape)
  return np.clip(noisy, 0.0, 1.0).astype(np.float32)


def stream_order(y: np.ndarray, stream: str, seed: int) -> np.ndarray:
  """Indices of the test stream: shuffled, or grouped by label."""
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(y))
  if stream == "sorted":
    order = order[np.argsort(y[order], kind="stable")]
  return order


@nnx.jit
def _predict(model: nnx.Module, images: jax.Array) -> jax.Array:
  return jnp.argmax(model(images), axis=-1)


def run_stream(
  model: nnx.Module, x: np.ndarray, y: np.ndarray, batch: int
) -> np.ndarray:
  """Per-batch accuracies of ``model`` along the stream (in order)."""
  hits = []
  for i in range(0, len(x) - batch + 1, batch):
    pred = np.asarray(_predict(model, jnp.asarray(x[i : i + batch])))
    hits.append(float(np.mean(pred == y[i : i + batch])))
  return np.asarray(hits)


def adapted(model: nnx.Module, method: str, seed: int) -> nnx.Module:
  """A copy of the trained ``model`` set up for ``method``."""
  m = nnx.clone(model)
  if method == "source":
    m.eval()
  elif method == "tbn":
    m.train()  # Batch statistics; the copy's running ones are discarded.
  else:
    rngs = nnx.Rngs(seed)
    quant.swap_modules(
      m,
      nn_norms.BatchNorm,
      lambda bn: nn_norms.UnMixTNS.from_batch_norm(
        bn, rngs=rngs, num_components=NUM_COMPONENTS
      ),
    )
  return m


def evaluate_seed(
  base: config_lib.TrainConfig,
  images: data_lib.ImageSplits,
  runs: pathlib.Path,
  seed: int,
) -> list[dict[str, Any]]:
  """Trains one CNN and runs every (method, stream, condition)."""
  cfg = dataclasses.replace(
    base,
    seed=seed,
    out_dir=str(runs / "runs" / f"seed{seed}"),
    progress=False,
    resume=False,
  )
  model = build.build_model(
    cfg,
    {"num_classes": images.num_classes, "image_shape": images.val_x.shape[1:]},
    rngs=nnx.Rngs(seed),
  )
  summary = trainer.train(cfg, model=model)
  lines = []
  for condition in CONDITIONS:
    x = images.val_x if condition == "clean" else shift(images.val_x, seed)
    for stream in STREAMS:
      order = stream_order(images.val_y, stream, seed)
      xs, ys = x[order], images.val_y[order]
      for method in METHODS:
        acc = run_stream(adapted(model, method, seed), xs, ys, base.batch_size)
        lines.append(
          {
            "variant": f"{method}/{stream}",
            "condition": condition,
            "seed": seed,
            "error": 1.0 - float(acc.mean()),
            "batch_accuracy": acc.tolist(),
            "train_val_accuracy": summary["val_accuracy"],
          }
        )
  return lines


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains and evaluates each seed (skipping finished ones); the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  runs = pathlib.Path(args.runs)
  table = runs / "ttn.jsonl"

  def compute() -> dict:
    images = data_lib.load_images(base.data)
    table.parent.mkdir(parents=True, exist_ok=True)
    lines = _grid.read_table(table)
    done = {ln["seed"] for ln in lines}
    for seed in seeds:
      if seed in done:
        continue
      new = evaluate_seed(base, images, runs, seed)
      with table.open("a") as f:
        f.writelines(json.dumps(ln) + "\n" for ln in new)
      lines += new
    cells = {
      c: _grid.cells([ln for ln in lines if ln["condition"] == c], "error")
      for c in CONDITIONS
    }
    verdicts = []
    for condition, grid in cells.items():
      for variant, ref, claim, tol, label in CLAIMS:
        v, why = _grid.verdict(grid, variant, ref, claim, tol)
        verdicts.append(
          {"claim": label, "condition": condition, "verdict": v, "why": why}
        )
    return {"lines": lines, "cells": cells, "verdicts": verdicts}

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = _report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, condition in zip(axes[:2], CONDITIONS):
      grid = result["cells"][condition]
      names = list(grid)
      ax.bar(
        range(len(names)),
        [1 - grid[n]["mean"] for n in names],
        yerr=[grid[n]["std"] for n in names],
        capsize=3,
        color=[f"C{METHODS.index(n.split('/')[0])}" for n in names],
      )
      ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
      ax.set(ylabel="test accuracy", title=f"{condition} test images")
      ax.set_ylim(0, 1)
    first = seeds[0]
    for ln in result["lines"]:
      if (
        ln["seed"] == first
        and ln["condition"] == "shifted"
        and ln["variant"].endswith("/sorted")
      ):
        acc = np.asarray(ln["batch_accuracy"])
        axes[2].plot(acc, label=ln["variant"].split("/")[0], lw=1)
    axes[2].set(
      xlabel="test batch (label-sorted stream)",
      ylabel="batch accuracy",
      title=f"shifted, sorted stream, seed {first}",
    )
    axes[2].legend(fontsize=7)
    fig.suptitle(
      f"Test-time normalization on {base.data}: source BN vs test-batch BN "
      f"vs UnMix-TNS ({len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner: CNN (width {base.width}, depth {base.depth}, BatchNorm "
      f"momentum 0.9) on {base.data}, batch {base.batch_size}, "
      f"{base.steps} AdamW steps (lr {base.learning_rate}), seeds "
      f"{list(seeds)}. Test stream: the {base.data} test split in batches "
      f"of {base.batch_size}; UnMix-TNS with K = {NUM_COMPONENTS}, "
      "temperature 0.07, its default update rate. Error rate (1 - "
      "accuracy); mean ± sample std (ddof=1) over seeds.",
      "",
    ]
    for condition, grid in result["cells"].items():
      lines += [f"## {condition} test images", ""]
      lines += _grid.markdown_table(grid, "error", "source/iid")
      lines.append("")
    lines += ["## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"], ("condition",))
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
