"""EvoNorm-B0/S0 vs BatchNorm and GroupNorm in the CNN at batch 2 and 128.

Paper: Liu, Brock, Simonyan & Le, "Evolving Normalization-Activation
Layers", arXiv:2004.02967 (2020): EvoNorm-B0 (batch statistics) beats
BN-ReLU; EvoNorm-S0 (no batch statistics) beats GN-ReLU and, at small
batches, BN-ReLU, because it does not depend on the batch.

Claims (fixed before running; metric: validation accuracy as a fraction,
higher is better, margin `claims.MARGINS["accuracy_fraction"]`, one
point; the accuracy drop from batch 128 to batch 2, lower is better, same
margin), paired by seed:

* Regime (Wu & He, "Group Normalization", arXiv:1803.08494): BatchNorm
  degrades at a small batch where GroupNorm does not: GroupNorm's
  accuracy drop from batch 128 to batch 2 is ``superior`` (smaller) to
  BatchNorm's. Where it is not, BatchNorm's small-batch failure is absent
  at this scale and the two S0-vs-BN claims below are ``not testable at
  this scale``.
* EvoNorm-B0 beats BatchNorm at batch 128 (``superior``).
* EvoNorm-S0 beats GroupNorm at batch 2 (``superior``).
* EvoNorm-S0 beats BatchNorm at batch 2 (``superior``; gated).
* EvoNorm-S0 is batch-independent: its accuracy drop from batch 128 to
  batch 2 is ``superior`` (smaller) to BatchNorm's (gated). Both arms see
  the same images at each batch size, so the drop's difference is a
  difference in differences: the smaller number of images seen at batch 2
  cancels.

Setting: the runner's ResNet-style CNN (`jaxnorm.nn.models.CNN`, pre-norm
residual blocks ``conv(relu(conv(norm(x))))``, a final norm and ReLU),
width 32, depth 2, on Fashion-MNIST, every norm slot taking the variant:
200 AdamW steps at batch 128 (25 600 images) and 1500 at batch 2 (3 000
images; EvoNorm-B0, whose claim is at batch 128, is not run there),
validation on the same 2048 test images in eval mode (running statistics
for BatchNorm and B0). The batch-128 runs took 300 steps until 8d70338,
and the 3 seeds' runs then needed about 27 minutes alone on 2 cores
(estimated from a run re-timed alone); 200 steps fit the default tier's
20. Every (norm, batch) trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss
(`experiments._harness.grid.tuned_grid`), then 3 seeds.
Parameter counts differ by the norms' vectors (< 1%).

Deviations: the papers' layers replace norm *and* activation; here the
block's ReLU between the convolutions stays for every variant (it is the
runner's block), so EvoNorm is compared in the norm slot. GroupNorm and
EvoNorm-S0 use 8 groups, not the papers' 32, so that a group holds 4
channels at width 32 (`GROUPS`; with 32 groups GroupNorm would be
InstanceNorm, and the head's global mean of a per-channel standardized map
carries almost no class signal). BatchNorm's running statistics use
EvoNorm-B0's momentum, 0.9 (flax's 0.99 lags the weights of a run this
short). The batch sizes are a small CNN's: the papers' small batches are
per-device batches of ResNets on ImageNet.

  python -m experiments.vision_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from experiments._harness import grid, report, runs, tiers
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

NAME = "vision_claims"
MARGIN = claims.MARGINS["accuracy_fraction"]
GROUPS = 8
VARIANTS: dict[str, dict[str, Any]] = {
  "batchnorm": {"norm": "batchnorm", "norm_kwargs": (("momentum", 0.9),)},
  "groupnorm": {"norm": "groupnorm", "norm_kwargs": (("num_groups", GROUPS),)},
  "evonormb0": {"norm": "evonormb0"},
  "evonorms0": {"norm": "evonorms0", "norm_kwargs": (("num_groups", GROUPS),)},
}
SMALL, LARGE = "small", "large"
# The norms of each batch size: EvoNorm-B0's claim is at the large batch.
NORMS = {SMALL: ("batchnorm", "groupnorm", "evonorms0"), LARGE: tuple(VARIANTS)}
# Learning-rate sweeps per batch size (AdamW; a smaller rate at batch 2),
# each extended until its best rate lies inside. They start next to the
# best rates the 300-step runs of 8d70338 found (batch 2: 3.3e-3 and
# 1.1e-2; batch 128: 1e-2 and 3.3e-2), one step above the lowest rates
# those sweeps started at, which no variant chose.
LEARNING_RATES = {
  SMALL: (3e-4, 1e-3),
  LARGE: (3e-3, 1e-2),
}
# Batch size, steps, evaluation interval and warm-up of each tier.
RUNS = {
  "quick": {SMALL: (2, 4, 2, 1), LARGE: (16, 4, 2, 1)},
  "default": {SMALL: (2, 1500, 750, 75), LARGE: (128, 200, 100, 20)},
  "full": {SMALL: (2, 20000, 5000, 500), LARGE: (128, 4000, 500, 200)},
}
EVAL_IMAGES = {"quick": 16, "default": 2048, "full": 9984}

_evonorm_claim = functools.partial(
  claims.Claim,
  paper="EvoNorm",
  arxiv="2004.02967",
  kind="superior",
  margin=MARGIN,
)


def batch_claims(small: int, large: int) -> dict[str, claims.Claim]:
  """The claims by role; ``regime`` gates ``s0_bn`` and ``s0_drop``."""
  drop = f"accuracy drop from batch {large} to {small}"
  return {
    "regime": claims.Claim(
      paper="GroupNorm",
      arxiv="1803.08494",
      claim=f"BatchNorm degrades at a small batch where GroupNorm does not "
      f"(GroupNorm's {drop} is smaller)",
      metric="drop",
      direction="lower",
      kind="superior",
      margin=MARGIN,
      a="groupnorm",
      b="batchnorm",
    ),
    "b0_bn": _evonorm_claim(
      claim=f"EvoNorm-B0 beats BatchNorm at a large batch ({large})",
      metric="val_accuracy",
      direction="higher",
      a="evonormb0",
      b="batchnorm",
    ),
    "s0_gn": _evonorm_claim(
      claim=f"EvoNorm-S0 beats GroupNorm at a small batch ({small})",
      metric="val_accuracy",
      direction="higher",
      a="evonorms0",
      b="groupnorm",
    ),
    "s0_bn": _evonorm_claim(
      claim=f"EvoNorm-S0 beats BatchNorm at a small batch ({small})",
      metric="val_accuracy",
      direction="higher",
      a="evonorms0",
      b="batchnorm",
    ),
    "s0_drop": _evonorm_claim(
      claim=f"EvoNorm-S0 is batch-independent: its {drop} is smaller than "
      "BatchNorm's",
      metric="drop",
      direction="lower",
      a="evonorms0",
      b="batchnorm",
    ),
  }


def base_configs(args: argparse.Namespace) -> dict[str, config_lib.TrainConfig]:
  """The shared run at each batch size (``small``, ``large``)."""
  tier = tiers.tier(args)
  size = {
    "quick": dict(data="digits", width=8, depth=1),
    "default": dict(data="fashion_mnist", width=32, depth=2),
    "full": dict(data="fashion_mnist", width=64, depth=4),
  }[tier]
  out = {}
  for which, (batch, steps, every, warmup) in RUNS[tier].items():
    out[which] = config_lib.TrainConfig(
      model="cnn",
      **size,
      batch_size=batch,
      steps=steps,
      eval_every=every,
      # The same test images at both batch sizes.
      eval_batches=max(1, EVAL_IMAGES[tier] // batch),
      warmup_steps=warmup,
      log_every=every,
      checkpoint_every=10**9,
      keep_checkpoints=1,
    )
  return out


def drops(
  small: Sequence[Mapping[str, Any]], large: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
  """Per (variant, seed) in both grids: accuracy at large minus at small."""
  at_large = {(ln["variant"], ln["seed"]): ln for ln in large}
  return [
    {
      "variant": ln["variant"],
      "seed": ln["seed"],
      "drop": at_large[key]["val_accuracy"] - ln["val_accuracy"],
    }
    for ln in small
    if (key := (ln["variant"], ln["seed"])) in at_large
  ]


def untrained(
  lines: Sequence[Mapping[str, Any]], variant: str, chance: float
) -> str | None:
  """Why ``variant`` did not train: a seed's loss not below ``chance``."""
  return runs.untrained(lines, variant, chance, what="the uniform guess's loss")


def drop_record(
  claim: claims.Claim,
  lines: Mapping[str, Sequence[Mapping[str, Any]]],
  bases: Mapping[str, config_lib.TrainConfig],
  tuned: Mapping[str, Mapping[str, Any]],
  *,
  chance: float,
  testable: bool = True,
  reason: str | None = None,
) -> dict[str, Any]:
  """The record of a claim on the drop from the large to the small batch.

  ``chance``: the uniform guess's loss (`runs.chance_loss`), which the
  baseline must beat at both batch sizes.
  """

  def arm(variant: str) -> dict[str, Any]:
    each = {
      w: grid.setting(lines[w], bases[w], tuned[w], variant) for w in bases
    }
    rates = "; ".join(
      f"batch {bases[w].batch_size}: {each[w]['steps']} steps, lr "
      f"{each[w]['learning_rate']:g}"
      for w in (SMALL, LARGE)
    )
    return {
      **each[SMALL],
      "steps": f"{each[SMALL]['steps']} + {each[LARGE]['steps']}",
      "examples": each[SMALL]["examples"] + each[LARGE]["examples"],
      "learning_rate": None,
      "data": f"{bases[SMALL].data} ({rates})",
    }

  misses = [untrained(lines[w], claim.b, chance) for w in bases]
  failed = "; ".join(m for m in misses if m) or None
  return grid.claim_record(
    drops(lines[SMALL], lines[LARGE]),
    claim,
    baseline_trained=failed is None,
    config={
      w: {
        "base": config_lib.to_json(config_lib.resolve(bases[w])),
        "a": dict(tuned[w][claim.a]),
        "b": dict(tuned[w][claim.b]),
      }
      for w in bases
    },
    setting={"a": arm(claim.a), "b": arm(claim.b)},
    testable=testable,
    reason=failed or reason,
  )


def records(lines, bases, tuned) -> list[dict[str, Any]]:
  """Every claim's record; the regime gates the S0-vs-BN claims."""
  cs = batch_claims(bases[SMALL].batch_size, bases[LARGE].batch_size)
  chance = runs.chance_loss(bases[SMALL])
  regime = drop_record(cs["regime"], lines, bases, tuned, chance=chance)
  present = regime["verdict"] == "reproduced"
  why = (
    None
    if present
    else "BatchNorm's small-batch failure is absent here: GroupNorm's drop "
    f"is not smaller than BatchNorm's ({regime['why']})"
  )

  def at(which: str, claim: claims.Claim, **kw) -> dict[str, Any]:
    reason = kw.pop("reason", None)
    failed = untrained(lines[which], claim.b, chance)
    return grid.runner_record(
      lines[which],
      claim,
      bases[which],
      tuned[which],
      baseline_trained=failed is None,
      reason=failed or reason,
      **kw,
    )

  return [
    regime,
    at(LARGE, cs["b0_bn"]),
    at(SMALL, cs["s0_gn"]),
    at(SMALL, cs["s0_bn"], testable=present, reason=why),
    drop_record(
      cs["s0_drop"],
      lines,
      bases,
      tuned,
      chance=chance,
      testable=present,
      reason=why,
    ),
  ]


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grids (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  bases = base_configs(args)
  seeds = tiers.seeds(args)
  quick = tiers.tier(args) == "quick"
  folder = pathlib.Path(args.runs) / tiers.tier(args)
  # One folder per batch size: the run directories of a table live beside it.
  tables = {
    w: folder / f"batch{bases[w].batch_size}" / "grid.jsonl" for w in bases
  }
  variants = {w: {n: VARIANTS[n] for n in NORMS[w]} for w in bases}
  # --quick checks the pipeline at the base rate.
  rates = {
    w: {} if quick else {n: LEARNING_RATES[w] for n in NORMS[w]} for w in bases
  }

  def compute() -> dict:
    lines, tuned, sweeps = {}, {}, {}
    for w in (LARGE, SMALL):
      lines[w], t = grid.tuned_grid(
        tables[w], bases[w], variants[w], seeds, rates[w]
      )
      tuned[w], sweeps[w] = t["variants"], t["sweeps"]
    return {
      "claims": records(lines, bases, tuned),
      "sweeps": sweeps,
      "lines": lines,
      "val_accuracy": {w: grid.cells(lines[w], "val_accuracy") for w in bases},
      "drop": grid.cells(drops(lines[SMALL], lines[LARGE]), "drop"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    for w, suffix in ((SMALL, ""), (LARGE, f"_batch{bases[LARGE].batch_size}")):
      grid.figure(
        tables[w],
        result["lines"][w],
        "val_accuracy",
        path.with_name(f"{path.stem}{suffix}.png"),
        f"CNN on {bases[w].data} at batch {bases[w].batch_size}: "
        f"validation loss and accuracy by norm ({len(seeds)} seeds)",
        result["claims"],
      )

  def markdown(result: dict) -> list[str]:
    small, large = bases[SMALL].batch_size, bases[LARGE].batch_size
    lines = []
    for w in (LARGE, SMALL):
      lines += [f"## Batch {bases[w].batch_size}", ""]
      lines += report.runner_lines(bases[w], seeds)
      if result["sweeps"][w]:
        lines += report.sweep_lines(result["sweeps"][w])
      lines += grid.markdown_table(
        result["val_accuracy"][w], "val accuracy", "batchnorm"
      )
      lines.append("")
    lines += [
      f"## Accuracy drop from batch {large} to {small} (paired by seed)",
      "",
      *grid.markdown_table(result["drop"], "drop", "batchnorm"),
      "",
      f"Figures: `{NAME}.png` (batch {small}), `{NAME}_batch{large}.png`; "
      "validation on the same test images at both batch sizes.",
    ]
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
