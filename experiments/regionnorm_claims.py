"""Region Normalization vs BatchNorm and InstanceNorm for image inpainting.

Paper: Yu et al., "Region Normalization for Image Inpainting",
arXiv:1911.10375 (AAAI 2020): normalizing the corrupted (hole) and the
uncorrupted regions of a feature map separately (RN) beats normalizing the
whole map (BatchNorm, InstanceNorm) for inpainting, because the holes
shift the mean and variance of the whole-map statistics.

Claims (fixed before running; metric: the PSNR of the inpainted image in
dB, the paper's headline metric, higher is better; ``superior``, paired by
seed; margin `claims.MARGINS["log_ratio"]` on the ratio of mean squared
errors, log(1.1), which is ``10 log10(1.1)`` = 0.41 dB of PSNR, `MARGIN`):

* RN beats BatchNorm (a = ``rn``, b = ``batchnorm``);
* RN beats InstanceNorm (a = ``rn``, b = ``instancenorm``).

Task: Fashion-MNIST images (``--quick``: the 8x8 scikit-learn digits) with
one random rectangular hole each (10-40% of the image, aspect ratio 0.5-2,
a new hole per training image; fixed holes on the held-out images, the same
for every variant and seed). The hole is filled with white (1) and the net
sees ``[masked image, hole mask]``, as the official code (which inherits
EdgeConnect's inputs). Model, built here from `jaxnorm.nn.layers.Conv` and
the registry's norms: the official generator's layout at toy size: three
encoder convs (stride 1, 2, 2; widths w, 2w, 4w), residual blocks
``x + norm(conv(relu(norm(conv(x)))))`` at 4w, two decoder stages (nearest
upsampling x2, conv, norm, ReLU), a 3x3 output conv and a sigmoid. The norm
slot takes the variant:

* ``batchnorm``: BatchNorm everywhere (running statistics at momentum 0.9
  in evaluation);
* ``instancenorm``: InstanceNorm everywhere;
* ``rn``: the paper's placement: RN-B (`RegionNormB`, the hole mask resized
  to the feature map by nearest interpolation) after the three encoder
  convs, RN-L (`RegionNormL`, learned mask, threshold 0.8, 7x7 kernels)
  after both convs of every residual block and after the decoder convs.
  Region statistics always come from the current batch, as the paper.

Training: w = 16, 2 residual blocks, 500 AdamW steps at batch 32 (the
runner's optimizer, `jaxnorm.training.optimizers.build_optimizer`: cosine
schedule, clipping 1.0, weight decay 1e-4 on matrices) in this script's
jitted loop (`experiments.complex_common.fit`; the runner's engine has no
inpainting loss), through `experiments._harness.grid.tuned_grid` (its
``train=`` hook runs this loop; a `TrainConfig` carries data, width
``w``, depth = residual blocks, batch, steps, schedule and learning
rate, its ``norm`` names the variant; one JSON line per run, resumable):
every variant trains at its own learning rate, the best of a geometric
sweep on seed 0 chosen by the final training loss, extended until the
best rate is inside the grid, then 3 seeds
(initialization, batch order, training holes). Parameter counts differ by
the norms' own parameters (RN-L's 7x7 mask convolutions: RN has 0.4%
more).

Loss: the official code's reconstruction term, L1 between the raw output
and the target over the whole image divided by the batch's hole fraction.
Deviation: the paper adds adversarial, perceptual and style losses (with a
discriminator and a VGG); only the L1 term is kept here.

Metrics on the first 2048 test images, on the composite output (the
prediction in the hole, the input elsewhere), evaluated in batches of the
training size: L1 per pixel over the holes and over the whole image, and
the PSNR (data range 1) of each image over its hole and over the whole
image, averaged over images. The valid pixels are copied, so the image
PSNR is the hole PSNR plus a per-image constant (equal differences).

  python -m experiments.regionnorm_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import math
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import complex_common
from experiments._harness import grid, report, tiers
from jaxnorm.nn import layers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "regionnorm_claims"
VARIANTS: dict[str, dict[str, Any]] = {
  "batchnorm": {"norm": "batchnorm"},
  "instancenorm": {"norm": "instancenorm"},
  # RN-B in the encoder, RN-L elsewhere (`InpaintNet`).
  "rn": {"norm": "regionnormb"},
}
LEARNING_RATES = (1e-3, 3e-3, 1e-2)
METRICS = ("l1_hole", "l1_image", "psnr_hole", "psnr_image")
LABELS = {
  "l1_hole": "L1 in the holes",
  "l1_image": "L1 on the image",
  "psnr_hole": "PSNR in the holes (dB)",
  "psnr_image": "PSNR on the image (dB)",
}
HOLE_FRACTION = (0.1, 0.4)
EVAL_MASK_SEED = 12_345
EXAMPLES = 4
CURVE_POINTS = 50
# A 10% ratio of mean squared errors, in dB of PSNR.
MARGIN = 10 * math.log10(math.exp(claims.MARGINS["log_ratio"]))
PAPER = ("Region Normalization", "1911.10375")
CLAIMS = tuple(
  claims.Claim(
    paper=PAPER[0],
    arxiv=PAPER[1],
    claim=f"normalizing the hole and valid regions separately (RN) beats "
    f"{label} for inpainting (PSNR)",
    metric="psnr_image",
    direction="higher",
    kind="superior",
    margin=MARGIN,
    a="rn",
    b=b,
  )
  for b, label in (("batchnorm", "BatchNorm"), ("instancenorm", "InstanceNorm"))
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """Data, size and training length of each tier (read by `make_train`).

  ``width`` is the first encoder width w, ``depth`` the residual blocks.
  """
  run = {
    "quick": dict(data="digits", width=4, depth=1, batch_size=16, steps=4),
    "default": dict(
      data="fashion_mnist", width=16, depth=2, batch_size=32, steps=500
    ),
    "full": dict(
      data="fashion_mnist", width=32, depth=4, batch_size=64, steps=6000
    ),
  }[tiers.tier(args)]
  images = {"quick": 32, "default": 2048, "full": 9984}[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="cnn",
    norm="batchnorm",
    **run,
    eval_batches=images // run["batch_size"],
    eval_every=run["steps"],
    log_every=run["steps"],
    warmup_steps=max(1, run["steps"] // 10),
    learning_rate=2e-3,
    weight_decay=1e-4,
    checkpoint_every=10**9,
  )


def hole_masks(rng: np.random.Generator, n: int, side: int) -> np.ndarray:
  """``(n, side, side, 1)`` float32 masks, 1 in one random rectangle each.

  The rectangle's area is a uniform fraction `HOLE_FRACTION` of the image
  (before rounding), its aspect ratio uniform in [0.5, 2], its position
  uniform.
  """
  area = rng.uniform(*HOLE_FRACTION, n) * side * side
  aspect = rng.uniform(0.5, 2.0, n)
  h = np.clip(np.round(np.sqrt(area * aspect)), 1, side).astype(np.int64)
  w = np.clip(np.round(area / h), 1, side).astype(np.int64)
  top = rng.integers(0, side - h + 1)
  left = rng.integers(0, side - w + 1)
  r = np.arange(side)
  rows = (r >= top[:, None]) & (r < (top + h)[:, None])
  cols = (r >= left[:, None]) & (r < (left + w)[:, None])
  return (rows[:, :, None] & cols[:, None, :]).astype(np.float32)[..., None]


def batches(
  images: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Random ``(images, holes)`` training batches with fresh holes, forever."""
  rng = np.random.default_rng(seed)
  while True:
    x = images[rng.integers(0, len(images), batch_size)]
    yield x, hole_masks(rng, batch_size, x.shape[1])


class InpaintNet(nnx.Module):
  """Encoder, residual blocks, decoder; every norm slot takes ``variant``.

  ``rn`` puts RN-B after the encoder convs and RN-L after the others.
  """

  def __init__(self, variant: str, *, width: int, blocks: int, rngs: nnx.Rngs):
    if variant not in VARIANTS:
      raise ValueError(
        f"InpaintNet: variant must be one of {', '.join(VARIANTS)}, got "
        f"{variant!r}"
      )
    w1, w2, w3 = width, 2 * width, 4 * width

    def norm(c: int, early: bool) -> nnx.Module:
      if variant == "rn":
        name = "regionnormb" if early else "regionnorml"
        return nn_norms.make_norm(name, c, rngs=rngs, layout="images")
      kwargs = {"momentum": 0.9} if variant == "batchnorm" else {}
      return nn_norms.make_norm(
        variant, c, rngs=rngs, layout="images", **kwargs
      )

    self.encoder = nnx.List(
      [
        layers.Conv(2, w1, kernel_size=5, rngs=rngs),
        layers.Conv(w1, w2, kernel_size=4, stride=2, rngs=rngs),
        layers.Conv(w2, w3, kernel_size=4, stride=2, rngs=rngs),
      ]
    )
    self.encoder_norms = nnx.List([norm(c, True) for c in (w1, w2, w3)])
    self.middle = nnx.List(
      [layers.Conv(w3, w3, rngs=rngs) for _ in range(2 * blocks)]
    )
    self.middle_norms = nnx.List([norm(w3, False) for _ in range(2 * blocks)])
    self.decoder = nnx.List(
      [layers.Conv(w3, w2, rngs=rngs), layers.Conv(w2, w1, rngs=rngs)]
    )
    self.decoder_norms = nnx.List([norm(c, False) for c in (w2, w1)])
    self.output = layers.Conv(w1, 1, kernel_size=3, rngs=rngs)

  def __call__(self, image: jax.Array, hole: jax.Array) -> jax.Array:
    """The reconstruction in [0, 1] of ``image`` (NHWC, 1 channel)."""
    x = jnp.concatenate([image * (1 - hole) + hole, hole], axis=-1)
    for conv, norm in zip(self.encoder, self.encoder_norms):
      x = conv(x)
      x = norm(x, hole) if isinstance(norm, nn_norms.RegionNormB) else norm(x)
      x = jax.nn.relu(x)
    for i in range(0, len(self.middle), 2):
      h = jax.nn.relu(self.middle_norms[i](self.middle[i](x)))
      x = x + self.middle_norms[i + 1](self.middle[i + 1](h))
    for conv, norm in zip(self.decoder, self.decoder_norms):
      x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
      x = jax.nn.relu(norm(conv(x)))
    return jax.nn.sigmoid(self.output(x))


def inpaint_loss(model: InpaintNet, batch: tuple[jax.Array, ...]) -> jax.Array:
  """L1 over the whole image divided by the hole fraction (official code)."""
  image, hole = batch
  err = jnp.mean(jnp.abs(model(image, hole) - image))
  return err / jnp.maximum(jnp.mean(hole), 1e-6)


@nnx.jit
def _predict(model: InpaintNet, image: jax.Array, hole: jax.Array):
  return model(image, hole)


def composite(
  model: InpaintNet, images: np.ndarray, holes: np.ndarray, batch_size: int
) -> np.ndarray:
  """The prediction inside the holes, the input elsewhere (eval mode)."""
  model.eval()
  out = []
  for i in range(0, len(images) - batch_size + 1, batch_size):
    x, m = images[i : i + batch_size], holes[i : i + batch_size]
    pred = np.asarray(_predict(model, jnp.asarray(x), jnp.asarray(m)))
    out.append(pred * m + x * (1 - m))
  return np.concatenate(out)


def scores(
  filled: np.ndarray, target: np.ndarray, holes: np.ndarray
) -> dict[str, float]:
  """L1 per pixel and mean per-image PSNR, in the holes and on the image."""
  err = (filled.astype(np.float64) - target) ** 2
  hole_px = holes.sum(axis=(1, 2, 3))
  mse_hole = (err * holes).sum(axis=(1, 2, 3)) / hole_px
  mse_image = err.mean(axis=(1, 2, 3))
  abs_err = np.abs(filled.astype(np.float64) - target)

  def psnr(mse: np.ndarray) -> float:
    return float(np.mean(-10 * np.log10(np.maximum(mse, 1e-10))))

  return {
    "l1_hole": float((abs_err * holes).sum() / hole_px.sum()),
    "l1_image": float(abs_err.mean()),
    "psnr_hole": psnr(mse_hole),
    "psnr_image": psnr(mse_image),
  }


def make_train(
  images: data_lib.ImageSplits,
  eval_set: tuple[np.ndarray, np.ndarray],
  example_seed: int,
):
  """``train(model, cfg) -> summary``: one run of this script's loop.

  Trains the given `InpaintNet` on ``images`` with ``cfg``'s seed, batch
  size, steps, optimizer and schedule, then scores it on ``eval_set``
  (targets, holes). The summary has `METRICS`, ``train_loss`` (the mean of
  the last 1/`CURVE_POINTS` of the steps), ``curve`` (the training loss in
  `CURVE_POINTS` windows), ``params``, ``steps`` and, for
  ``example_seed``, the first `EXAMPLES` composites. One optimizer object
  per (architecture, optimizer settings), so the seeds of a variant share
  the jitted step.
  """
  tx = complex_common.shared_optimizer()

  def train(model: InpaintNet, cfg: config_lib.TrainConfig) -> dict[str, Any]:
    data = (
      (jnp.asarray(x), jnp.asarray(m))
      for x, m in batches(images.train_x, cfg.batch_size, cfg.seed)
    )
    hist = complex_common.fit(
      model, inpaint_loss, tx(model, cfg), data, cfg.steps
    )
    loss = np.asarray(hist["loss"])
    target, holes = eval_set
    filled = composite(model, target, holes, cfg.batch_size)
    n = len(filled)
    stride = max(1, cfg.steps // CURVE_POINTS)
    summary = {
      **scores(filled, target[:n], holes[:n]),
      "train_loss": float(loss[-stride:].mean()),
      "curve": [
        [i + stride, float(loss[i : i + stride].mean())]
        for i in range(0, len(loss) - stride + 1, stride)
      ],
      "params": sum(
        math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))
      ),
      "steps": cfg.steps,
      "stopped_early": False,
    }
    if cfg.seed == example_seed:
      summary["examples"] = np.round(filled[:EXAMPLES, ..., 0], 3).tolist()
    return summary

  return train


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / tiers.tier(args) / "grid.jsonl"
  # --quick checks the pipeline at the base rate.
  quick = tiers.tier(args) == "quick"
  rates = {} if quick else {v: LEARNING_RATES for v in VARIANTS}

  def compute() -> dict:
    images = data_lib.load_images(base.data)
    n = min(base.eval_batches * base.batch_size, len(images.val_x))
    target = images.val_x[:n]
    holes = hole_masks(
      np.random.default_rng(EVAL_MASK_SEED), n, target.shape[1]
    )
    train = make_train(images, (target, holes), seeds[0])

    def train_one(variant: str, cfg: config_lib.TrainConfig) -> dict:
      model = InpaintNet(
        variant, width=cfg.width, blocks=cfg.depth, rngs=nnx.Rngs(cfg.seed)
      )
      return train(model, cfg)

    lines, tuned = grid.tuned_grid(
      table, base, VARIANTS, seeds, rates, train=train_one
    )
    records = [
      grid.runner_record(
        lines, claim, base, tuned["variants"], baseline_trained=True
      )
      for claim in CLAIMS
    ]
    masked = target[:EXAMPLES] * (1 - holes[:EXAMPLES]) + holes[:EXAMPLES]
    return {
      "claims": records,
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "cells": {m: grid.cells(lines, m) for m in METRICS},
      "hole_fraction": float(holes.mean()),
      "eval_images": n,
      "inputs": masked[..., 0],
      "targets": target[:EXAMPLES, ..., 0],
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig = plt.figure(figsize=(20, 6.5), layout="constrained")
    left, middle, right = fig.subfigures(1, 3, width_ratios=[1.0, 1.3, 1.0])
    examples = {
      ln["variant"]: ln["examples"]
      for ln in result["lines"]
      if ln.get("examples") is not None
    }
    columns = [
      ("input", result["inputs"]),
      *examples.items(),
      ("target", result["targets"]),
    ]
    rows = len(result["targets"])
    axes = left.subplots(rows, len(columns), squeeze=False)
    for j, (title, imgs) in enumerate(columns):
      for i in range(rows):
        axes[i, j].imshow(np.asarray(imgs[i]), cmap="gray", vmin=0, vmax=1)
        axes[i, j].set_xticks([])
        axes[i, j].set_yticks([])
      axes[0, j].set_title(title, fontsize=8)
    bars = middle.subplots(2, 2)
    for ax, metric in zip(bars.flat, ("l1_hole", "psnr_hole", "psnr_image")):
      cells = result["cells"][metric]
      names = list(cells)
      ax.bar(
        range(len(names)),
        [cells[n]["mean"] for n in names],
        yerr=[cells[n]["std"] for n in names],
        capsize=3,
        color=[f"C{i}" for i in range(len(names))],
      )
      for i, n in enumerate(names):
        ax.plot([i] * cells[n]["n"], cells[n]["values"], "k.", ms=3)
      ax.set_ylim(bottom=0)
      ax.set_xticks(range(len(names)), names, fontsize=8)
      ax.set_title(f"{LABELS[metric]} (mean ± std, dots: seeds)", fontsize=9)
    curves = bars.flat[3]
    for i, variant in enumerate(VARIANTS):
      runs = [ln["curve"] for ln in result["lines"] if ln["variant"] == variant]
      if not runs:
        continue
      steps = [c[0] for c in runs[0]]
      vals = np.array([[c[1] for c in r] for r in runs])
      curves.plot(steps, vals.mean(0), color=f"C{i}", label=variant)
      curves.fill_between(
        steps, vals.min(0), vals.max(0), color=f"C{i}", alpha=0.2
      )
    curves.set_xlabel("step")
    curves.set_title(
      "training loss, L1 / hole fraction (seed min-max band)", fontsize=9
    )
    curves.legend(fontsize=7)
    report.claims_axes(right.subplots(1, 1), result["claims"])
    fig.suptitle(
      f"Inpainting {base.data} rectangles ({len(seeds)} seeds): RN vs "
      f"BatchNorm vs InstanceNorm. Left: held-out composites (seed "
      f"{seeds[0]}); right: the claims' paired differences"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = []
    params = {ln["variant"]: ln["params"] for ln in result["lines"]}
    lines += [
      f"Setting: {base.data}, one rectangular hole per image (area "
      f"{HOLE_FRACTION[0]:.0%}-{HOLE_FRACTION[1]:.0%}; "
      f"{result['hole_fraction']:.1%} of the held-out pixels), encoder "
      f"widths {base.width}/{2 * base.width}/{4 * base.width}, "
      f"{base.depth} residual blocks; {base.steps} {base.optimizer} steps "
      f"at batch {base.batch_size} ({base.schedule} schedule, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}, clip "
      f"{base.clip_norm}), loss L1 / hole fraction; parameters "
      + ", ".join(f"{v} {p:,}" for v, p in params.items())
      + f". Scores on the composite output of the first "
      f"{result['eval_images']} test images (fixed holes), seeds "
      f"{list(seeds)}; mean ± sample std (ddof=1) over seeds. The claims' "
      f"margin is {MARGIN:.3f} dB of PSNR (a 10% ratio of mean squared "
      "errors).",
      "",
    ]
    if result["sweeps"]:
      lines += report.sweep_lines(result["sweeps"])
    for metric in METRICS:
      lines += [f"## {LABELS[metric]}", ""]
      lines += grid.markdown_table(result["cells"][metric], metric, "rn")
      lines.append("")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
