"""ELU against ReLU: a deep plain MLP, and a CNN with and without BatchNorm.

Claims (Clevert, Unterthiner & Hochreiter, "Fast and Accurate Deep Network
Learning by Exponential Linear Units (ELUs)", arXiv:1511.07289), fixed
before running; accuracies as fractions, margin one point
(`claims.MARGINS["accuracy_fraction"]`) where a margin is needed:

* "ELUs lead not only to faster learning, but also to significantly better
  generalization performance than ReLUs ... on networks with more than 5
  layers": in an MLP of 8 hidden layers without normalization, ELU is
  ``superior`` to ReLU in the final training loss (faster learning, lower
  is better, margin 0) and in validation accuracy (margin 0).
* "ELU networks significantly outperform ReLU networks with batch
  normalization": the CNN with ELU and no norm is ``superior`` to the CNN
  with BatchNorm and ReLU in validation accuracy (margin 0).
* "Batch normalization does not improve ELU networks": the CNN with ELU
  and no norm is ``non_inferior`` to the CNN with BatchNorm and ELU.

Setting. MLP: the runner's ``mlp`` (`jaxnorm.nn.models.SNN`: dense layers,
no norms) with 8 hidden layers of 128 units on flattened Fashion-MNIST,
without its alpha dropout (SELU's), every hidden kernel He-normal
(variance 2 / fan-in, the ReLU-preserving init, for both arms; the readout
LeCun-normal), 1,000 AdamW steps of 64 images. CNN:
`experiments.salunet_claims.cnn_config` (the runner's ResNet-style CNN of
width 32 and 2 blocks, i.e. 6 weight layers, BatchNorm momentum 0.9) for
300 steps of 64 images; the norm-free ELU CNN is the BatchNorm CNN with
every norm removed after construction (`experiments.salunet_claims.
swap_norms`; its config still names ``batchnorm``, the slot emptied; 192
fewer parameters, 0.5%). Validation metrics on the first 2,048 test images.
Both activations use the CNN's head activation too (norm, act, pooling).

Regime: every claim is about networks deeper than 5 layers, which both
settings are; no claim is gated. A baseline that ends at or below 20%
validation accuracy (chance 10%) did not train and cannot support a
``reproduced``.

Fair comparison: each arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended until
the best rate lies inside the grid (`experiments._harness.grid.
tuned_grid`); then 3 seeds, paired by seed. The faster-learning claim is
read on the same final training loss, each arm at its best rate.
Deviations: Fashion-MNIST instead of MNIST/CIFAR; AdamW with a cosine
schedule instead of the paper's SGD; a 6-layer residual CNN instead of
the paper's 11- and 18-layer plain CNNs; no dropout.

  python -m experiments.elu_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx

from experiments import salunet_claims
from experiments._harness import grid, report, tiers
from jaxnorm.nn import models
from jaxnorm.training import build, claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "elu_claims"
MARGIN = claims.MARGINS["accuracy_fraction"]
MLP_VARIANTS: dict[str, dict[str, Any]] = {
  "relu-mlp": {"activation": "relu"},
  "elu-mlp": {"activation": "elu"},
}
BN = salunet_claims.BN
CNN_VARIANTS: dict[str, dict[str, Any]] = {
  "relu-bn": {**BN, "activation": "relu"},
  "elu-bn": {**BN, "activation": "elu"},
  "elu": {**BN, "activation": "elu"},
}
CNN_SWAPPED = {"elu": "identity"}
RATES = (1e-3, 3e-3, 1e-2)
LEARNING_RATES = {n: RATES for n in (*MLP_VARIANTS, *CNN_VARIANTS)}

_claim = functools.partial(claims.Claim, paper="ELU", arxiv="1511.07289")

MLP_CLAIMS = (
  _claim(
    claim="ELUs lead to faster learning than ReLUs in networks with more "
    "than 5 layers",
    metric="train_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="elu-mlp",
    b="relu-mlp",
  ),
  _claim(
    claim="ELUs generalize significantly better than ReLUs in networks with "
    "more than 5 layers",
    metric="val_accuracy",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="elu-mlp",
    b="relu-mlp",
  ),
)
CNN_CLAIMS = (
  _claim(
    claim="ELU networks significantly outperform ReLU networks with batch "
    "normalization",
    metric="val_accuracy",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="elu",
    b="relu-bn",
  ),
  _claim(
    claim="batch normalization does not improve ELU networks",
    metric="val_accuracy",
    direction="higher",
    kind="non_inferior",
    margin=MARGIN,
    a="elu",
    b="elu-bn",
  ),
)


def mlp_config(args) -> config_lib.TrainConfig:
  """The 8-layer MLP of each tier."""
  run = {
    "quick": dict(
      data="digits",
      width=16,
      depth=6,
      batch_size=8,
      steps=4,
      eval_every=2,
      eval_batches=2,
      warmup_steps=1,
    ),
    "default": dict(
      data="fashion_mnist",
      width=128,
      depth=8,
      batch_size=64,
      steps=1000,
      eval_every=250,
      eval_batches=32,
      warmup_steps=100,
    ),
    "full": dict(
      data="fashion_mnist",
      width=512,
      depth=16,
      batch_size=128,
      steps=9400,
      eval_every=1000,
      eval_batches=78,
      warmup_steps=500,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="mlp",
    **run,
    log_every=run["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
  )


def mlp_factory(base: config_lib.TrainConfig):
  """``(variant, seed) -> SNN``: no dropout, He-normal hidden kernels."""
  images = data_lib.load_images(base.data)
  shape = {"num_classes": images.num_classes}
  shape["image_shape"] = images.train_x.shape[1:]

  def make(variant: str, seed: int) -> nnx.Module:
    cfg = dataclasses.replace(base, **MLP_VARIANTS[variant])
    snn = dataclasses.replace(build.model_config(cfg, shape), dropout=0.0)
    model = models.SNN(snn, rngs=nnx.Rngs(seed))
    # LeCun-normal (variance 1/fan-in) times sqrt(2): He-normal.
    for layer in model.layers:
      layer.kernel[...] = layer.kernel[...] * jnp.float32(math.sqrt(2.0))
    return model

  return make


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs both tuned grids (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  mlp = mlp_config(args)
  cnn = salunet_claims.cnn_config(args, steps=300)
  seeds = tiers.seeds(args)
  runs = pathlib.Path(args.runs)
  tables = {
    "mlp": runs / "mlp" / "grid.jsonl",
    "cnn": runs / "cnn" / "grid.jsonl",
  }
  # --quick checks the pipeline at the base rate.
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    mlp_lines, mlp_tuned = grid.tuned_grid(
      tables["mlp"], mlp, MLP_VARIANTS, seeds, rates, model=mlp_factory(mlp)
    )
    cnn_lines, cnn_tuned = grid.tuned_grid(
      tables["cnn"],
      cnn,
      CNN_VARIANTS,
      seeds,
      rates,
      model=salunet_claims.model_factory(cnn, CNN_VARIANTS, CNN_SWAPPED),
    )
    recs = []
    for lines, cfg, tuned, the_claims in (
      (mlp_lines, mlp, mlp_tuned, MLP_CLAIMS),
      (cnn_lines, cnn, cnn_tuned, CNN_CLAIMS),
    ):
      for claim in the_claims:
        why = salunet_claims.untrained(lines, claim.b)
        recs.append(
          grid.runner_record(
            lines,
            claim,
            cfg,
            tuned["variants"],
            baseline_trained=why is None,
            reason=why,
          )
        )
    return {
      "claims": recs,
      "sweeps": {**mlp_tuned["sweeps"], **cnn_tuned["sweeps"]},
      "mlp_lines": mlp_lines,
      "cnn_lines": cnn_lines,
      "cells": {
        f"{part} {m}": grid.cells(lines, m)
        for part, lines in (("mlp", mlp_lines), ("cnn", cnn_lines))
        for m in ("train_loss", "val_accuracy")
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      tables["cnn"],
      result["cnn_lines"],
      "val_accuracy",
      path,
      f"ELU vs ReLU: CNN width {cnn.width}, {cnn.depth} blocks, "
      f"{cnn.steps} steps on {cnn.data} ({len(seeds)} seeds); the claims "
      "panel has all claims",
      result["claims"],
    )
    grid.figure(
      tables["mlp"],
      result["mlp_lines"],
      "val_accuracy",
      path.with_name(f"{NAME}_mlp.png"),
      f"ELU vs ReLU: MLP {mlp.depth} x {mlp.width}, {mlp.steps} steps on "
      f"{mlp.data} ({len(seeds)} seeds)",
      result["claims"][: len(MLP_CLAIMS)],
    )

  def markdown(result: dict) -> list[str]:
    out = ["MLP. " + report.runner_lines(mlp, seeds)[0], ""]
    out += ["CNN. " + report.runner_lines(cnn, seeds)[0], ""]
    out += [
      f"`elu` (CNN) is the BatchNorm CNN with its norms removed "
      f"(`experiments.salunet_claims.swap_norms`); MLP figure: "
      f"`{NAME}_mlp.png`.",
      "",
    ]
    out += report.sweep_lines(result["sweeps"])
    for key, cells in result["cells"].items():
      part, metric = key.split(" ")
      ref = "relu-mlp" if part == "mlp" else "relu-bn"
      out += [f"## {part.upper()}: {metric}", ""]
      out += grid.markdown_table(cells, metric, ref)
      out += [""]
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
