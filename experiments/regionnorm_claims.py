"""Region Normalization vs BatchNorm and InstanceNorm for image inpainting.

Claim checked (Yu et al., "Region Normalization for Image Inpainting",
arXiv:1911.10375, AAAI 2020): normalizing the corrupted (hole) and the
uncorrupted regions of a feature map separately (RN) beats normalizing the
whole map (BatchNorm, InstanceNorm) for inpainting, because the holes
shift the mean and variance of the whole-map statistics.

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

Loss: the official code's reconstruction term, L1 between the raw output
and the target over the whole image divided by the batch's hole fraction.
Deviation: the paper adds adversarial, perceptual and style losses (with a
discriminator and a VGG); only the L1 term is kept here. AdamW (the
runner's `build_optimizer`: cosine schedule, clipping 1.0, no decay on norm
parameters), a jitted loop (`experiments.complex_common.fit`): the runner's
engine has no custom loss.

Metrics on held-out test images, on the composite output (the prediction
in the hole, the input elsewhere), evaluated in batches of the training
size: L1 per pixel over the holes and over the whole image, and the PSNR
(data range 1) of each image over its hole and over the whole image,
averaged over images. The valid pixels are copied, so with the same holes
the image L1 is the hole L1 times the hole fraction, and the image PSNR is
the hole PSNR plus a per-image constant: image and hole metrics rank the
variants alike (the PSNR differences are equal); verdicts are read on the
hole L1 and on the image PSNR (the paper's). 3 seeds (initialization,
batch order, training holes); mean ± sample std (ddof=1). Verdicts compare
means with the standard error of their difference
(`experiments._grid.verdict`).

  python -m experiments.regionnorm_claims [--quick] [--full]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import complex_common
from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.nn import decay, layers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import data as data_lib
from jaxnorm.training import optimizers

NAME = "regionnorm_claims"
VARIANTS = ("batchnorm", "instancenorm", "rn")
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

# (variant, reference, metric, label). PSNR is higher-is-better: its claim
# is that the reference's PSNR is lower than RN's.
CLAIMS = (
  ("rn", "batchnorm", "l1_hole", "RN beats BatchNorm: lower L1 in the holes"),
  (
    "rn",
    "instancenorm",
    "l1_hole",
    "RN beats InstanceNorm: lower L1 in the holes",
  ),
  (
    "batchnorm",
    "rn",
    "psnr_image",
    "RN beats BatchNorm: BatchNorm's image PSNR is lower",
  ),
  (
    "instancenorm",
    "rn",
    "psnr_image",
    "RN beats InstanceNorm: InstanceNorm's image PSNR is lower",
  ),
)


@dataclasses.dataclass(frozen=True)
class Setting:
  """Data, model size and training length of one mode."""

  data: str
  width: int
  blocks: int
  batch_size: int
  steps: int
  warmup_steps: int
  eval_images: int
  learning_rate: float = 2e-3
  weight_decay: float = 1e-4


def setting(args: argparse.Namespace) -> Setting:
  """Toy (``--quick``), default (CPU, minutes) or GPU-sized (``--full``)."""
  if args.quick:
    return Setting("digits", 4, 1, 16, 4, 1, 32)
  if args.full:
    return Setting("fashion_mnist", 32, 4, 64, 6000, 300, 10_000)
  return Setting("fashion_mnist", 16, 2, 32, 500, 50, 2048)


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


@functools.cache
def optimizer(s: Setting, variant: str) -> optax.GradientTransformation:
  """AdamW with the decay mask of ``variant``'s model.

  One object per (setting, variant): the seeds of a variant share the
  jitted step (`complex_common.fit` compiles once per ``tx``).
  """
  model = InpaintNet(variant, width=s.width, blocks=s.blocks, rngs=nnx.Rngs(0))
  return optimizers.build_optimizer(
    "adamw",
    learning_rate=s.learning_rate,
    weight_decay=s.weight_decay,
    warmup_steps=s.warmup_steps,
    total_steps=s.steps,
    mask=decay.decay_mask(model),
  )


def run_cell(
  s: Setting,
  variant: str,
  seed: int,
  images: data_lib.ImageSplits,
  eval_set: tuple[np.ndarray, np.ndarray],
  keep_examples: bool,
) -> dict[str, Any]:
  """Trains one (variant, seed) and scores it on the held-out images."""
  start = time.time()
  model = InpaintNet(
    variant, width=s.width, blocks=s.blocks, rngs=nnx.Rngs(seed)
  )
  data = (
    (jnp.asarray(x), jnp.asarray(m))
    for x, m in batches(images.train_x, s.batch_size, seed)
  )
  loss = np.asarray(
    complex_common.fit(
      model, inpaint_loss, optimizer(s, variant), data, s.steps
    )["loss"]
  )
  target, holes = eval_set
  filled = composite(model, target, holes, s.batch_size)
  n = len(filled)
  stride = max(1, s.steps // CURVE_POINTS)
  line = {
    "variant": variant,
    "seed": seed,
    **scores(filled, target[:n], holes[:n]),
    "train_loss": float(loss[-stride:].mean()),
    "curve": [
      [i + stride, float(loss[i : i + stride].mean())]
      for i in range(0, len(loss) - stride + 1, stride)
    ],
    "params": sum(
      math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param))
    ),
    "steps": s.steps,
    "eval_images": n,
    "seconds": time.time() - start,
  }
  if keep_examples:
    line["examples"] = np.round(filled[:EXAMPLES, ..., 0], 3).tolist()
  return line


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains every (variant, seed) not yet in the table; the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  s = setting(args)
  seeds = tiers.seeds(args)
  mode = "quick" if args.quick else "full" if args.full else "default"
  table = pathlib.Path(args.runs) / f"regionnorm_{mode}.jsonl"

  def compute() -> dict:
    images = data_lib.load_images(s.data)
    n = min(s.eval_images, len(images.val_x))
    target = images.val_x[:n]
    holes = hole_masks(
      np.random.default_rng(EVAL_MASK_SEED), n, target.shape[1]
    )
    table.parent.mkdir(parents=True, exist_ok=True)
    lines = _grid.read_table(table)
    done = {(ln["variant"], ln["seed"]) for ln in lines}
    for variant in VARIANTS:
      for seed in seeds:
        if (variant, seed) in done:
          continue
        line = run_cell(
          s, variant, seed, images, (target, holes), seed == seeds[0]
        )
        with table.open("a") as f:
          f.write(json.dumps(line) + "\n")
        lines.append(line)
    cells = {m: _grid.cells(lines, m) for m in METRICS}
    verdicts = []
    for variant, ref, metric, label in CLAIMS:
      v, why = _grid.verdict(cells[metric], variant, ref, "lower")
      verdicts.append(
        {"claim": label, "metric": metric, "verdict": v, "why": why}
      )
    masked = target[:EXAMPLES] * (1 - holes[:EXAMPLES]) + holes[:EXAMPLES]
    return {
      "lines": lines,
      "cells": cells,
      "verdicts": verdicts,
      "hole_fraction": float(holes.mean()),
      "eval_images": n,
      "inputs": masked[..., 0],
      "targets": target[:EXAMPLES, ..., 0],
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = _report.pyplot()
    fig = plt.figure(figsize=(15, 6.5), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.0, 1.3])
    examples = {
      ln["variant"]: ln["examples"]
      for ln in result["lines"]
      if "examples" in ln
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
    bars = right.subplots(2, 2)
    for ax, metric in zip(bars.flat, ("l1_hole", "psnr_hole", "psnr_image")):
      grid = result["cells"][metric]
      names = list(grid)
      ax.bar(
        range(len(names)),
        [grid[n]["mean"] for n in names],
        yerr=[grid[n]["std"] for n in names],
        capsize=3,
        color=[f"C{i}" for i in range(len(names))],
      )
      for i, n in enumerate(names):
        ax.plot([i] * grid[n]["n"], grid[n]["values"], "k.", ms=3)
      lo = min(min(grid[n]["values"]) for n in names)
      hi = max(max(grid[n]["values"]) for n in names)
      pad = 0.3 * (hi - lo) + 1e-6
      ax.set_ylim(lo - pad, hi + pad)
      ax.set_xticks(range(len(names)), names, fontsize=8)
      ax.set_title(LABELS[metric], fontsize=9)
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
    fig.suptitle(
      f"Inpainting {s.data} rectangles ({len(seeds)} seeds): RN vs "
      f"BatchNorm vs InstanceNorm. Left: held-out composites (seed "
      f"{seeds[0]}); bars: mean ± std, dots: seeds"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    first = next(ln for ln in result["lines"] if ln["variant"] == "rn")
    lines += [
      f"Setting: {s.data}, one rectangular hole per image (area "
      f"{HOLE_FRACTION[0]:.0%}-{HOLE_FRACTION[1]:.0%}; "
      f"{result['hole_fraction']:.1%} of the held-out pixels), encoder "
      f"widths {s.width}/{2 * s.width}/{4 * s.width}, {s.blocks} residual "
      f"blocks; {s.steps} AdamW steps at batch {s.batch_size} (lr "
      f"{s.learning_rate}, cosine, warm-up {s.warmup_steps}, weight decay "
      f"{s.weight_decay}), loss L1 / hole fraction; RN model "
      f"{first['params']} parameters. Scores on the composite output of "
      f"the first {result['eval_images']} test images (fixed holes), seeds "
      f"{list(seeds)}; mean ± sample std (ddof=1) over seeds. The valid "
      "pixels are copied, so the image metrics rank the variants as the "
      "hole metrics do (equal PSNR differences).",
      "",
    ]
    for metric in METRICS:
      lines += [f"## {LABELS[metric]}", ""]
      lines += _grid.markdown_table(result["cells"][metric], metric, "rn")
      lines.append("")
    lines += ["## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"], ("metric",))
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
