"""A complex-valued CNN against real CNNs on complex (phase-carrying) images.

Claims (Chatterjee et al., "Complex Network for Complex Problems: A
comparative study of CNN and Complex-valued CNN", arXiv:2302.04584,
abstract: "the CV-CNN models outperformed the CNN and CNNx2 models" on
brain-MRI tumour classification; the body was not retrievable; fixed
before running; metric: validation accuracy as a fraction, higher is
better):

* the CV-CNN beats a real CNN with twice the trainable parameters
  (CNNx2), so its gain is not the parameter count: ``cvcnn`` is
  ``superior`` to ``cnnx2`` (margin 0; the image margin
  `claims.MARGINS["accuracy_fraction"]`, one point, is the unit of the
  figure);
* the CV-CNN beats the real CNN of the same widths: ``cvcnn`` is
  ``superior`` to ``cnn`` (margin 0).

Data: Fashion-MNIST made complex MRI-style: each image ``x`` becomes ``z =
x exp(i(phi0 + a u + b v))`` with ``phi0 ~ U(-pi, pi)`` and ``a, b ~
U(-pi/8, pi/8)`` per image over pixel coordinates ``u, v in [-1, 1]``;
labels depend on the magnitude only. The phases are drawn by the model's
input layer (`PhaseCNN`): from the runner's per-step key in training (a
fresh phase each time an image is seen) and from a fixed key folded with
the batch's pixels in evaluation (the same phases at every evaluation).
How the study formed complex MRI inputs is unknown; this construction is
the project's, not the paper's.

Models (built here, trained by the runner's loop, `model=`): CNN, 3 x
(conv 3x3 stride 2, BatchNorm, ReLU) at widths 16/32/64, mean pool, dense,
on the (Re, Im) channels; CNNx2, the same with the widths scaled until its
parameter count matches the CV-CNN's within 2%; CV-CNN
(`jaxnorm.nn.cplx.CVCNN`): complex widths 16/32/64 with complex batch
norm, CReLU, ``|.|`` after pooling and a real dense. Parameters in reals
(a complex entry counts twice; the records state them).

Fair comparison: every arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended
until it lies inside the grid (`experiments._harness.grid.tuned_grid`);
then 3 seeds paired by seed. AdamW without weight decay (the complex
arm's decay is not defined by the study), cosine schedule.

Regime: 400 steps of batch 128 (51,200 images, under one epoch of the
60,000), accuracy on the 9,984 first validation images; ``--full``: 2,400
steps (about 5 epochs).

  python -m experiments.complex_e1_cvcnn [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import complex_common as cc
from experiments._harness import grid, report, runs, tiers
from jaxnorm import cplx
from jaxnorm.nn import cplx as ncplx
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "complex_e1_cvcnn"
PAPER = dict(paper="CNN vs CV-CNN", arxiv="2302.04584")
WIDTHS = (16, 32, 64)
EVAL_PHASE_SEED = 10_000
VARIANTS: dict[str, dict[str, Any]] = {"cvcnn": {}, "cnnx2": {}, "cnn": {}}
LEARNING_RATES = dict.fromkeys(VARIANTS, cc.LEARNING_RATES)

CLAIMS = (
  claims.Claim(
    **PAPER,
    claim="a complex-valued CNN beats a real CNN with twice the trainable "
    "parameters on complex inputs (the gain is not the parameter count)",
    metric="val_accuracy",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="cvcnn",
    b="cnnx2",
  ),
  claims.Claim(
    **PAPER,
    claim="a complex-valued CNN beats a real CNN of the same widths on "
    "complex inputs",
    metric="val_accuracy",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="cvcnn",
    b="cnn",
  ),
)


class RealCNN(nnx.Module):
  """3 x (conv 3x3 stride 2, BatchNorm, ReLU), mean pool, dense."""

  def __init__(self, widths, in_ch: int, classes: int, *, rngs: nnx.Rngs):
    """Builds the stages."""
    convs, norms = [], []
    for w in widths:
      convs.append(nnx.Conv(in_ch, w, (3, 3), strides=2, rngs=rngs))
      # Momentum 0.9, as the CV-CNN's complex batch norm.
      norms.append(nnx.BatchNorm(w, momentum=0.9, rngs=rngs))
      in_ch = w
    self.convs, self.norms = nnx.List(convs), nnx.List(norms)
    self.head = nnx.Linear(in_ch, classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Logits for real ``(N, H, W, C)`` images."""
    for conv, norm in zip(self.convs, self.norms):
      x = jax.nn.relu(norm(conv(x)))
    return self.head(jnp.mean(x, axis=(1, 2)))


def phase_images(x: jax.Array, key: jax.Array) -> jax.Array:
  """Complex images ``x exp(i(phi0 + a u + b v))``, one phase per image."""
  n, h, w, _ = x.shape
  k0, ka, kb = jax.random.split(key, 3)
  phi0 = jax.random.uniform(k0, (n, 1, 1), minval=-math.pi, maxval=math.pi)
  a = jax.random.uniform(ka, (n, 1, 1), minval=-math.pi / 8, maxval=math.pi / 8)
  b = jax.random.uniform(kb, (n, 1, 1), minval=-math.pi / 8, maxval=math.pi / 8)
  u = jnp.linspace(-1.0, 1.0, w)[None, None, :]
  v = jnp.linspace(-1.0, 1.0, h)[None, :, None]
  phase = phi0 + a * u + b * v
  r = x[..., 0].astype(jnp.float32)
  z = jax.lax.complex(r * jnp.cos(phase), r * jnp.sin(phase))
  return z[..., None]


def _eval_key(x: jax.Array) -> jax.Array:
  """A fixed key folded with the batch's pixel sum (deterministic)."""
  bits = jax.lax.bitcast_convert_type(jnp.sum(x, dtype=jnp.float32), jnp.uint32)
  return jax.random.fold_in(jax.random.key(EVAL_PHASE_SEED), bits)


class PhaseCNN(nnx.Module):
  """Real images -> complex MRI-style images -> a CV-CNN or a real CNN.

  The phases come from ``rngs`` (the runner's per-step key) in training
  and from `_eval_key` without it; a real CNN reads ``[Re z | Im z]``.
  """

  def __init__(self, inner: nnx.Module, *, complex_input: bool):
    """Wraps ``inner``."""
    self.inner = inner
    self.complex_input = complex_input

  def __call__(self, x: jax.Array, *, rngs: Any = None) -> jax.Array:
    """Real logits for real images ``(N, H, W, 1)``."""
    key = _eval_key(x) if rngs is None else rngs
    z = phase_images(x, key)
    if self.complex_input:
      return self.inner(z)
    return self.inner(cplx.to_real(z))


def real_count(widths: Sequence[int], in_ch: int, classes: int) -> int:
  """Parameters of `RealCNN`: kernels, biases, BN scale and bias, dense."""
  total = 0
  for w in widths:
    total += 9 * in_ch * w + w + 2 * w
    in_ch = w
  return total + in_ch * classes + classes


def matched_widths(target: int, classes: int) -> tuple[int, ...]:
  """CNNx2 widths (``WIDTHS`` scaled) whose count is closest to ``target``."""
  candidates = [
    tuple(int(round(w * m)) for w in WIDTHS) for m in np.linspace(1, 2, 201)
  ]
  return min(
    candidates, key=lambda ws: abs(real_count(ws, 2, classes) - target)
  )


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier (the module is built by `Models`)."""
  run = {
    "quick": dict(
      data="digits", batch_size=32, steps=4, eval_every=2, eval_batches=2
    ),
    "default": dict(
      data="fashion_mnist",
      batch_size=128,
      steps=400,
      eval_every=200,
      eval_batches=78,
    ),
    "full": dict(
      data="fashion_mnist",
      batch_size=128,
      steps=2400,
      eval_every=400,
      eval_batches=78,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="cvcnn",
    width=WIDTHS[-1],
    depth=len(WIDTHS),
    warmup_steps=max(run["steps"] // 10, 1),
    weight_decay=0.0,
    log_every=run["eval_every"],
    checkpoint_every=10**9,
    **run,
  )


class Models:
  """Each arm's module for a seed (built under the runner's mesh)."""

  def __init__(self, base: config_lib.TrainConfig):
    """Sizes from the data; CNNx2's widths matched to the CV-CNN's count."""
    self.base = base
    images = data_lib.load_images(base.data)
    self.classes = images.num_classes
    self.shape = tuple(images.train_x.shape[1:])
    target = cc.real_params(self._inner("cvcnn", 0))
    self.widths = {
      "cvcnn": WIDTHS,
      "cnn": WIDTHS,
      "cnnx2": matched_widths(target, self.classes),
    }

  def _inner(self, variant: str, seed: int) -> nnx.Module:
    rngs = nnx.Rngs(seed)
    if variant == "cvcnn":
      config = ncplx.CVCNNConfig(
        num_classes=self.classes,
        image_shape=self.shape,
        widths=WIDTHS,
        input="complex",
      )
      return ncplx.CVCNN(config, rngs=rngs)
    return RealCNN(self.widths[variant], 2, self.classes, rngs=rngs)

  def build(self, variant: str, seed: int) -> nnx.Module:
    """``PhaseCNN`` around the arm's network."""
    return cc.in_mesh(
      self.base,
      lambda: PhaseCNN(
        self._inner(variant, seed), complex_input=variant == "cvcnn"
      ),
    )

  def describe(self, variant: str) -> dict[str, Any]:
    """The module's description (the records' ``config``)."""
    kind = "CVCNN (input complex)" if variant == "cvcnn" else "RealCNN"
    return {
      "module": f"PhaseCNN({kind})",
      "widths": list(self.widths[variant]),
      "phase": "phi0 ~ U(-pi, pi), a, b ~ U(-pi/8, pi/8) per image",
    }


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  models = Models(base)
  # --quick checks the pipeline at the base rate.
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(
      table, base, VARIANTS, seeds, rates, model=models.build
    )
    counts = {v: cc.real_params(models.build(v, 0)) for v in VARIANTS}
    lines = cc.in_reals(lines, counts)
    record = cc.recorder(
      lines,
      base,
      tuned["variants"],
      {v: models.describe(v) for v in VARIANTS},
    )
    chance = runs.chance_loss(base)  # ln(classes): the uniform guess.
    records = []
    for claim in CLAIMS:
      why = runs.untrained(
        lines, claim.b, chance, what="the uniform guess's loss"
      )
      records.append(record(claim, baseline_trained=why is None, reason=why))
    return {
      "claims": records,
      "sweeps": tuned["sweeps"],
      "variants": tuned["variants"],
      "lines": lines,
      "widths": {v: list(w) for v, w in models.widths.items()},
      "val_accuracy": grid.cells(lines, "val_accuracy"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "val_accuracy",
      path,
      f"{base.data} with MRI-style phases, {base.steps} steps of "
      f"{base.batch_size}: CV-CNN vs real CNNs ({len(seeds)} seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    w = result["widths"]
    lines += [
      f"Widths: CV-CNN {w['cvcnn']} (complex), CNN {w['cnn']}, CNNx2 "
      f"{w['cnnx2']} (matched to the CV-CNN's count in reals). Every arm "
      "reads the same complex images (phases drawn by its input layer).",
      "",
    ]
    lines += cc.setting_lines(result, list(VARIANTS))
    lines += report.sweep_lines(result["sweeps"])
    lines += ["## Validation accuracy", ""]
    lines += grid.markdown_table(
      result["val_accuracy"], "val accuracy", "cnnx2"
    )
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
