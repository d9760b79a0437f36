"""ELA and PSA added to the CNN on Fashion-MNIST: accuracy per extra parameter.

Claims checked:

* ELA (Xu & Wan, "ELA: Efficient Local Attention for Deep Convolutional
  Neural Networks", arXiv:2403.01123, 2024) improves a CNN's accuracy at a
  small parameter cost; ELA-T and ELA-B are the presets the paper
  recommends for light networks;
* PSA (Liu et al., "Polarized Self-Attention: Towards High-quality
  Pixel-wise Regression", arXiv:2107.00782, 2021) improves it too, in its
  parallel and sequential layouts;
* ELA, having far fewer parameters, buys more accuracy per extra parameter
  than PSA.

Setting: the runner's ResNet-style CNN (`jaxnorm.nn.models.CNN`, pre-norm
residual blocks ``x + conv(relu(conv(bn(x))))``) on Fashion-MNIST, trained
by the runner (`jaxnorm.training.trainer.train` with the model given). Each
variant wraps every residual branch as ``attention(branch(h))``, the slot
before the residual addition where SE-style gates go in a ResNet block
(`jaxnorm.nn.ELA`, `jaxnorm.nn.PolarizedSelfAttention` with
the official ``PSA_p`` / ``PSA_s``). The CNN is built first from the seed's
key stream and the gates after it, so every variant starts from the
baseline's convolution weights and sees the same batches: per seed, the
variants differ only by the gates. 3 seeds per variant. The default grid
is the baseline, ELA-T and PSA-p (it fits 12 minutes on 2 cores);
``--full`` adds ELA-B and PSA-s.
Deviation: neither paper's text states a slot for this CNN (the ELA paper's
full text and PSA's insertion point were not reachable, see the spec); the
same slot is used for both, so the comparison stays fair.

Metrics: validation error (1 - accuracy, in percent) on the same test
images for every run; the extra parameters over the baseline; and the
error change per 1000 extra parameters, paired by seed
``(err_v - err_base) / (extra / 1000)`` (negative: the gate helps).
Verdicts compare means with the standard error of their difference
(`experiments._grid.verdict`, claim "lower").

  python -m experiments.cnn_attention_claims [--quick] [--full]
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from experiments import vision_claims
from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import models, quant
from jaxnorm.training import build
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "cnn_attention_claims"
BASELINE = "baseline"
# Variant -> (gate module, its preset) or None for the plain CNN.
VARIANTS: dict[str, tuple[str, str] | None] = {
  BASELINE: None,
  "ela-t": ("ela", "T"),
  "ela-b": ("ela", "B"),
  "psa-p": ("psa", "parallel"),
  "psa-s": ("psa", "sequential"),
}
# The default and --quick grids; --full runs every variant.
DEFAULT_VARIANTS = (BASELINE, "ela-t", "psa-p")
# (variant, claim) judged "lower error than the baseline".
BEATS_BASELINE = (
  ("ela-t", "ELA-T (light-net preset) beats the baseline CNN"),
  ("ela-b", "ELA-B (light-net preset) beats the baseline CNN"),
  ("psa-p", "PSA (parallel) beats the baseline CNN"),
  ("psa-s", "PSA (sequential) beats the baseline CNN"),
)
# (variant, reference, claim) judged on the error change per 1k parameters.
PER_PARAMETER = (
  (
    "ela-t",
    "psa-p",
    "ELA-T lowers the error more per extra parameter than PSA-p",
  ),
  (
    "ela-b",
    "psa-s",
    "ELA-B lowers the error more per extra parameter than PSA-s",
  ),
)


class GatedBranch(nnx.Module):
  """A residual branch followed by an attention gate: ``gate(branch(x))``."""

  def __init__(self, branch: nnx.Module, gate: nnx.Module):
    self.branch, self.gate = branch, gate

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the branch, then the gate, to NHWC ``x``."""
    return self.gate(self.branch(x))


def make_gate(variant: str, width: int, rngs: nnx.Rngs) -> nnx.Module:
  """The attention gate of ``variant`` (a key of `VARIANTS`) at ``width``."""
  kind, preset = VARIANTS[variant]
  if kind == "ela":
    return nn_attention.ELA(width, variant=preset, rngs=rngs)
  return nn_attention.PolarizedSelfAttention(width, variant=preset, rngs=rngs)


def build_cnn(variant: str, config: models.CNNConfig, seed: int) -> models.CNN:
  """The CNN of ``config`` with ``variant``'s gate after every branch.

  The CNN draws its weights first, so they equal the baseline's at the
  same seed; the gates draw theirs afterwards from the same stream.

  Raises:
    ValueError: ``variant`` is not a key of `VARIANTS` (lists them).
  """
  if variant not in VARIANTS:
    raise ValueError(
      f"build_cnn: variant must be one of {', '.join(VARIANTS)}, got "
      f"{variant!r}"
    )
  rngs = nnx.Rngs(seed)
  cnn = models.CNN(config, rngs=rngs)
  if VARIANTS[variant] is not None:
    quant.swap_modules(
      cnn,
      models.ConvBlock,
      lambda block: GatedBranch(block, make_gate(variant, config.width, rngs)),
    )
  return cnn


def base_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """`vision_claims`' CNN run at batch 128, evaluated on more images.

  Width at least 32 (ELA-T's GroupNorm has 32 groups); evaluation on 4096
  test images (``--full``: 9984; ``--quick``: one batch of 16). Its model
  fields build the CNN (`build_cnn`); the runner trains it.
  """
  cfg = vision_claims.base_config(quick, full)
  batch = 16 if quick else 128
  images = 16 if quick else 9984 if full else 4096
  return dataclasses.replace(
    cfg,
    width=max(cfg.width, 32),
    batch_size=batch,
    eval_batches=images // batch,
  )


def run_cells(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Sequence[str],
  seeds: Sequence[int],
) -> list[dict[str, Any]]:
  """`_grid.run_grid` over `build_cnn`'s models; adds ``val_error`` (%)."""
  images = data_lib.load_images(base.data)
  config = build.model_config(
    base,
    {
      "num_classes": images.num_classes,
      "image_shape": images.train_x.shape[1:],
    },
  )
  lines = _grid.run_grid(
    table,
    base,
    {v: {} for v in variants},
    seeds,
    model=lambda variant, seed: build_cnn(variant, config, seed),
  )
  return [
    {**ln, "val_error": 100.0 * (1.0 - ln["val_accuracy"])} for ln in lines
  ]


def per_parameter(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per gated run: extra parameters and error change per 1k of them.

  Paired with the baseline run of the same seed; runs whose seed has no
  baseline are left out.
  """
  base = {ln["seed"]: ln for ln in lines if ln["variant"] == BASELINE}
  out = []
  for ln in lines:
    ref = base.get(ln["seed"])
    if ln["variant"] == BASELINE or ref is None:
      continue
    extra = ln["params"] - ref["params"]
    change = ln["val_error"] - ref["val_error"]
    out.append(
      {
        "variant": ln["variant"],
        "seed": ln["seed"],
        "extra_params": extra,
        "error_change": change,
        "error_per_kparam": change / (extra / 1000.0),
      }
    )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the grid (skipping finished runs) and writes the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  variants = tuple(VARIANTS) if args.full else DEFAULT_VARIANTS
  table = pathlib.Path(args.runs) / "cnn_attention.jsonl"

  def compute() -> dict:
    lines = [
      ln
      for ln in run_cells(table, base, variants, seeds)
      if ln["variant"] in variants
    ]
    error = _grid.cells(lines, "val_error")
    pairs = per_parameter(lines)
    change = _grid.cells(pairs, "error_change")
    per_k = _grid.cells(pairs, "error_per_kparam")
    params = {ln["variant"]: ln["params"] for ln in lines}
    verdicts = []
    for variant, label in BEATS_BASELINE:
      if variant in error:
        v, why = _grid.verdict(error, variant, BASELINE, "lower")
        verdicts.append({"claim": label, "verdict": v, "why": f"error % {why}"})
    for variant, ref, label in PER_PARAMETER:
      if variant in per_k and ref in per_k:
        v, why = _grid.verdict(per_k, variant, ref, "lower")
        verdicts.append(
          {"claim": label, "verdict": v, "why": f"error % per 1k params {why}"}
        )
    return {
      "lines": lines,
      "pairs": pairs,
      "params": params,
      "extra_params": {n: params[n] - params[BASELINE] for n in params},
      "val_error": error,
      "val_accuracy": _grid.cells(lines, "val_accuracy"),
      "val_loss": _grid.cells(lines, "val_loss"),
      "images_per_sec": _grid.cells(lines, "tokens_per_sec"),
      "error_change": change,
      "error_per_kparam": per_k,
      "verdicts": verdicts,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = _report.pyplot()
    fig, (ax_acc, ax_par, ax_k) = plt.subplots(1, 3, figsize=(15, 4.8))
    names = list(result["val_accuracy"])
    for i, n in enumerate(names):
      pct = 100 * np.asarray(result["val_accuracy"][n]["values"])
      mean, std = _report.mean_spread(pct)
      ax_acc.bar(i, mean, color=f"C{i}", alpha=0.5)
      ax_acc.errorbar(i, mean, yerr=std, color="k", capsize=4)
      ax_acc.plot(np.full(pct.size, i), pct, "k.", ms=5)
      ax_par.errorbar(
        max(result["extra_params"][n], 1),
        mean,
        yerr=std,
        fmt="o",
        color=f"C{i}",
        capsize=4,
        label=n,
      )
      if n in result["error_per_kparam"]:
        gain = -np.asarray(result["error_per_kparam"][n]["values"])
        ax_k.bar(i, gain.mean(), color=f"C{i}", alpha=0.5)
        ax_k.plot(np.full(gain.size, i), gain, "k.", ms=5)
    pcts = [100 * v for n in names for v in result["val_accuracy"][n]["values"]]
    pad = 0.2 * (max(pcts) - min(pcts) + 0.1)
    ax_acc.set_ylim(min(pcts) - pad, max(pcts) + pad)
    ax_acc.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax_acc.set(
      ylabel="validation accuracy (%)",
      title="mean ± std over seeds (dots: seeds)",
    )
    ax_par.set_xscale("log")
    ax_par.set(
      xlabel="extra parameters (baseline drawn at 1)",
      ylabel="validation accuracy (%)",
      title="accuracy vs extra parameters",
    )
    ax_par.legend(fontsize=7)
    ax_k.axhline(0, color="k", lw=0.5)
    ax_k.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax_k.set(
      ylabel="accuracy gain (pp) per 1k extra parameters",
      title="gain per 1k parameters, paired by seed",
    )
    fig.suptitle(
      f"ELA / PSA gates in the CNN (width {base.width}, depth {base.depth}) "
      f"on {base.data}, {len(seeds)} seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    _grid.figure(
      table,
      result["lines"],
      "val_accuracy",
      path.with_name(f"{path.stem}_curves.png"),
      f"CNN + attention gates on {base.data}: validation loss and accuracy "
      f"({len(seeds)} seeds)",
    )

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner: CNN (width {base.width}, depth {base.depth}, BatchNorm, "
      f"pre-norm residual) on {base.data}, batch {base.batch_size}, "
      f"{base.steps} AdamW steps (lr {base.learning_rate}, cosine, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}), seeds "
      f"{list(seeds)}. Gates after every residual branch (before the "
      "addition); every variant starts from the baseline's CNN weights at "
      f"the same seed. Validation on the same "
      f"{base.eval_batches * base.batch_size} test images (eval mode); "
      "mean ± sample std (ddof=1) over seeds. Figures: "
      f"`{NAME}.png` (accuracy, accuracy vs extra parameters, gain per 1k "
      f"parameters), `{NAME}_curves.png` (validation loss curves).",
      "",
      "## Per variant",
      "",
      "| variant | params | extra | val error % | val loss | error change "
      "% (paired) | error % per 1k extra params | train images/s |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for n, cell in result["val_error"].items():
      gated = n in result["error_change"]
      lines.append(
        f"| {n} | {result['params'][n]:,} | {result['extra_params'][n]:,} | "
        f"{_grid.fmt(cell)} | {_grid.fmt(result['val_loss'][n])} | "
        + (_grid.fmt(result["error_change"][n]) if gated else "—")
        + " | "
        + (_grid.fmt(result["error_per_kparam"][n]) if gated else "—")
        + f" | {result['images_per_sec'][n]['mean']:,.0f} |"
      )
    lines += [
      "",
      "Error change and error per 1k extra parameters are paired by seed "
      "with the baseline run (negative: the gate lowers the error). "
      "Images/s is the median training-step throughput on this shared "
      "machine (indicative only).",
      "",
      "## Verdicts",
      "",
      'Rule (`_grid.verdict`, claim "lower"): with d the difference of '
      "means and se the standard error of that difference, reproduced when "
      "d < -2 se, not reproduced at this scale when d > 2 se, else "
      "inconclusive. Error % for the accuracy claims; error change per 1k "
      "extra parameters (paired by seed) for the per-parameter claims.",
      "",
    ]
    lines += _grid.verdict_table(result["verdicts"])
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
