"""PSA on a pixel-wise task: per-pixel segmentation of Fashion-MNIST items.

Paper: Liu et al., "Polarized Self-Attention: Towards High-quality
Pixel-wise Regression", arXiv:2107.00782 (2021): PSA keeps a high
internal resolution in both its channel-only and spatial-only branches, so
adding it to a network raises the quality of pixel-wise predictions
(keypoint heatmaps, semantic segmentation masks).

Claim (fixed before running; metric: validation mean intersection over
union as a fraction, higher is better; margin
`claims.MARGINS["accuracy_fraction"]`, one point; ``superior``, paired by
seed): PSA-p (the official ``PSA_p``) raises the mIoU of a segmentation
network against the same network without it, widened so that the
parameter counts match within 2% (`experiments.cnn_attention_claims.
matched`: width 34 against PSA-p's 32).

Task: semantic segmentation of Fashion-MNIST (``--quick``: the 8x8
scikit-learn digits): every pixel brighter than `FOREGROUND` takes its
image's class (1-10), the others the background (0); 11 classes. Each
pixel needs the whole item to be classified, the global context PSA's
branches provide. The network: the runner's CNN trunk
(`jaxnorm.nn.models.CNN`: stride-2 stem, pre-norm residual blocks with
BatchNorm, final norm and ReLU; width 32, depth 2), the classification
head applied at every position as a 1x1 convolution and the logits
upsampled to the image (nearest, x2); PSA after every residual branch as
in `experiments.cnn_attention_claims`. Loss: the per-pixel cross-entropy.
300 AdamW steps at batch 128 (the runner's optimizer: `jaxnorm.training.
optimizers.build_optimizer`, cosine schedule, clipping 1.0, weight decay
0.1 on matrices) in a jitted loop of this script (the runner's engine has
no per-pixel loss), through `experiments._harness.grid.tuned_grid` (its
``train=`` hook runs this loop): each variant at its own learning rate,
the best of a geometric sweep on seed 0 by the final training loss
(`experiments._harness.grid.sweep`), then 3 seeds. Metrics on the first 4096
test images: mIoU over the 11 classes (confusion summed over the images),
pixel accuracy, per-pixel cross-entropy.

Deviation: the paper's tasks are keypoints (COCO) and Cityscapes
segmentation with HRNet-scale networks; this is a synthetic segmentation
at a small CNN's scale.

  python -m experiments.psa_pixelwise_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import cnn_attention_claims as cac
from experiments import complex_common
from experiments._harness import grid, report, tiers
from jaxnorm.training import build, claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "psa_pixelwise_claims"
MARGIN = claims.MARGINS["accuracy_fraction"]
# Pixels brighter than this take the image's class; the rest background.
FOREGROUND = 0.1
NUM_CLASSES = 11
DEFAULT_GATES = ("psa-p",)
FULL_GATES = ("psa-p", "psa-s")
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
DEFAULT_STEPS = 300


def pixel_labels(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """``(N, H, W)`` int32: the image's class + 1 on its foreground, else 0."""
  fg = images[..., 0] > FOREGROUND
  return np.where(fg, labels[:, None, None] + 1, 0).astype(np.int32)


class SegCNN(nnx.Module):
  """A `jaxnorm.nn.models.CNN` whose head classifies every position.

  The CNN's stem, blocks, final norm and activation, then its head (a
  dense map of the channel axis, a 1x1 convolution) at every position,
  upsampled by repetition to the input's height and width.
  """

  def __init__(self, cnn: nnx.Module):
    self.cnn = cnn

  def __call__(self, images: jax.Array) -> jax.Array:
    """``(B, H, W, num_classes)`` logits for NHWC ``images``."""
    c = self.cnn
    logits = c.head(c.final_act(c.final_norm(c.net(c.stem(images)))))
    f = images.shape[1] // logits.shape[1]
    if f > 1:
      logits = jnp.repeat(jnp.repeat(logits, f, axis=1), f, axis=2)
    return logits


def seg_loss(model: SegCNN, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
  """Mean per-pixel cross-entropy."""
  images, labels = batch
  logits = model(images).astype(jnp.float32)
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  )


@nnx.jit
def _logits(model: SegCNN, images: jax.Array) -> jax.Array:
  return model(images)


def scores(
  model: SegCNN, images: np.ndarray, labels: np.ndarray, batch: int
) -> dict[str, float]:
  """The mIoU (confusion summed over the images), pixel accuracy, loss."""
  model.eval()
  confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
  ce = []
  for i in range(0, len(images) - batch + 1, batch):
    logits = np.asarray(_logits(model, jnp.asarray(images[i : i + batch])))
    y = labels[i : i + batch]
    pred = logits.argmax(-1)
    confusion += np.bincount(
      (y * NUM_CLASSES + pred).ravel(), minlength=NUM_CLASSES**2
    ).reshape(NUM_CLASSES, NUM_CLASSES)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce.append(-np.take_along_axis(logp, y[..., None], -1).mean())
  model.train()
  return {"val_miou": miou(confusion), **_accuracy(confusion, ce)}


def _accuracy(confusion: np.ndarray, ce: list[float]) -> dict[str, float]:
  return {
    "val_accuracy": float(np.trace(confusion) / confusion.sum()),
    "val_loss": float(np.mean(ce)),
  }


def miou(confusion: np.ndarray) -> float:
  """Mean IoU over the classes present (label or prediction)."""
  tp = np.diag(confusion).astype(np.float64)
  union = confusion.sum(0) + confusion.sum(1) - tp
  present = union > 0
  return float(np.mean(tp[present] / union[present]))


def batches(
  images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[jax.Array, jax.Array]]:
  """Random training batches ``(images, pixel labels)``, forever."""
  rng = np.random.default_rng(seed)
  while True:
    idx = rng.integers(0, len(images), batch_size)
    yield jnp.asarray(images[idx]), jnp.asarray(labels[idx])


def make_train(images: data_lib.ImageSplits):
  """``train(model, cfg) -> summary``: one run of this script's loop.

  Trains the given `SegCNN` on ``images`` (``cfg.data``) with ``cfg``'s
  seed, batch size, steps, optimizer and schedule; evaluates every
  ``eval_every`` steps on the first ``eval_batches * batch_size`` test
  images (logged to ``out_dir/metrics.jsonl`` as the runner does). One
  optimizer object per (architecture, optimizer settings), so the seeds of
  a variant share the jitted step.
  """
  train_labels = pixel_labels(images.train_x, images.train_y)
  val_labels = pixel_labels(images.val_x, images.val_y)
  tx = complex_common.shared_optimizer()

  def train(model: SegCNN, cfg: config_lib.TrainConfig) -> dict[str, Any]:
    n = min(len(images.val_x), cfg.eval_batches * cfg.batch_size)
    hist = complex_common.fit(
      model,
      seg_loss,
      tx(model, cfg),
      batches(images.train_x, train_labels, cfg.batch_size, cfg.seed),
      cfg.steps,
      evaluate=lambda m: scores(
        m, images.val_x[:n], val_labels[:n], cfg.batch_size
      )["val_loss"],
      eval_every=cfg.eval_every,
    )
    final = scores(model, images.val_x[:n], val_labels[:n], cfg.batch_size)
    out = pathlib.Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text(
      "".join(
        json.dumps({"step": s, "val_loss": v}) + "\n"
        for s, v in zip(hist["eval_step"], hist["eval"])
      )
    )
    loss = np.asarray(hist["loss"])
    tail = max(1, len(loss) // 10)
    return {
      **final,
      "train_loss": float(loss[-tail:].mean()),
      "params": sum(
        math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))
      ),
      "steps": cfg.steps,
      "stopped_early": False,
    }

  return train


def base_config(args) -> config_lib.TrainConfig:
  """`cnn_attention_claims`' CNN run, read by this script's loop.

  `DEFAULT_STEPS` steps (warm-up a tenth) at the default tier, where that
  script now trains 200: this script's runs fit the tier's 20 minutes at
  300.
  """
  base = cac.base_config(args)
  if tiers.tier(args) != "default":
    return base
  return dataclasses.replace(
    base, steps=DEFAULT_STEPS, warmup_steps=DEFAULT_STEPS // 10
  )


def trivial_miou(labels: np.ndarray) -> float:
  """The mIoU of predicting the background everywhere."""
  confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
  counts = np.bincount(labels.ravel(), minlength=NUM_CLASSES)
  confusion[:, 0] = counts
  return miou(confusion)


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  tier = tiers.tier(args)
  gates = FULL_GATES if tier == "full" else DEFAULT_GATES
  table = pathlib.Path(args.runs) / tier / "grid.jsonl"
  images = data_lib.load_images(base.data)
  val_labels = pixel_labels(images.val_x, images.val_y)
  data = {"num_classes": NUM_CLASSES, "image_shape": images.train_x.shape[1:]}
  variants, baseline_of = cac.variants_for(
    gates, build.model_config(base, data)
  )
  # The plain CNN at the base width is only needed when a gate is matched
  # to it.
  if cac.BASELINE not in baseline_of.values():
    variants.pop(cac.BASELINE)
  rates = {} if tier == "quick" else {v: LEARNING_RATES for v in variants}
  factory = cac.model_factory(base, variants, data)
  n = min(len(images.val_x), base.eval_batches * base.batch_size)
  floor = trivial_miou(val_labels[:n])

  def compute() -> dict:
    train = make_train(images)
    lines, tuned = grid.tuned_grid(
      table,
      base,
      variants,
      seeds,
      rates,
      train=lambda v, cfg: train(SegCNN(factory(v, cfg.seed)), cfg),
    )
    records = []
    for gate in gates:
      b = baseline_of[gate]
      ok = all(ln["val_miou"] > floor for ln in lines if ln["variant"] == b)
      records.append(
        grid.runner_record(
          lines,
          claims.Claim(
            paper="PSA",
            arxiv="2107.00782",
            claim=f"{cac.LABELS[gate]} raises the mIoU of a per-pixel "
            "segmentation network",
            metric="val_miou",
            direction="higher",
            kind="superior",
            margin=MARGIN,
            a=gate,
            b=b,
          ),
          base,
          tuned["variants"],
          baseline_trained=ok,
          reason=None
          if ok
          else f"{b} did not train: its mIoU is not above the all-background "
          f"prediction's ({floor:.3f}) on some seed",
        )
      )
    return {
      "claims": records,
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "baseline_of": baseline_of,
      "trivial_miou": floor,
      "params": {ln["variant"]: ln["params"] for ln in lines},
      "val_miou": grid.cells(lines, "val_miou"),
      "val_accuracy": grid.cells(lines, "val_accuracy"),
      "val_loss": grid.cells(lines, "val_loss"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "val_miou",
      path,
      f"Per-pixel segmentation of {base.data} (CNN width {base.width}, "
      f"depth {base.depth}), {len(seeds)} seeds",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    lines += [
      "This script's loop trains the runner config's CNN trunk with a "
      f"per-pixel head on {NUM_CLASSES} classes (background and the 10 "
      f"items; foreground: pixels above {FOREGROUND}). Each gate's "
      "baseline: "
      + ", ".join(f"{g} vs {b}" for g, b in result["baseline_of"].items())
      + f". Predicting the background everywhere scores mIoU "
      f"{result['trivial_miou']:.3f} (a baseline that does not beat it on "
      "every seed did not train).",
      "",
    ]
    if result["sweeps"]:
      lines += report.sweep_lines(result["sweeps"])
    lines += [
      "## Per variant",
      "",
      "| variant | params | val mIoU | pixel accuracy | pixel loss |",
      "|---|---|---|---|---|",
    ]
    for v, cell in result["val_miou"].items():
      lines.append(
        f"| {v} | {result['params'][v]:,} | {grid.fmt(cell)} | "
        f"{grid.fmt(result['val_accuracy'][v])} | "
        f"{grid.fmt(result['val_loss'][v])} |"
      )
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
