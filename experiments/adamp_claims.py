"""AdamP and SGDP on a BatchNorm CNN: weight-norm growth and accuracy.

Heo et al., "AdamP: Slowing Down the Slowdown for Momentum Optimizers on
Scale-invariant Weights", arXiv:2006.08217. Claims (each fixed before
running; the seeds pair the arms: same initialization and data order):

* The regime, once per baseline: "the widely-adopted combination of the
  two ingredients [momentum GD, scale-invariant weights] lead[s] to the
  premature decay of effective step sizes": under AdamW (and under SGD with
  momentum) the norm of the scale-invariant weights grows, i.e. the log of
  their final norm is ``superior`` to the log of their initial norm (the
  same run at step 0, arm ``init``) by the ratio margin
  (`claims.MARGINS["log_ratio"]`, log 1.1: at least 10% growth). Where it
  is not, there is no growth to slow down and the norm claim below is
  ``not testable at this scale``.
* "SGDP and AdamP: get rid of the radial component, or the norm-increasing
  direction": the norm growth ``log(||W_T|| / ||W_0||)`` under AdamP is
  ``superior`` (lower) to AdamW's by log 1.1, and SGDP's to SGD's; the
  effective step size ``lr / ||W||^2`` is then kept (the report gives
  ``(||W_0|| / ||W_T||)^2``).
* "Our solution brings about uniform gains": the paper's gains are about
  0.5-1 point (ImageNet); three seeds of a small CNN cannot resolve that,
  so the claims are that the projection costs nothing: AdamP's validation
  accuracy is ``non_inferior`` to AdamW's by one point
  (`claims.MARGINS["accuracy_fraction"]`), its validation loss by 0.01
  nats (our margin: `claims.MARGINS` has no family for a 10-class
  cross-entropy; the byte LMs' value), and SGDP's to SGD's alike.

Scale-invariant weights: the runner's CNN with BatchNorm wired
``sandwich`` (``x + BN(conv2(relu(conv1(BN(x)))))``), so every block's
``conv2`` kernel feeds a BatchNorm directly and is scale-invariant per
output channel; its norm over all blocks is read from the final checkpoint
and compared with the same seed's initialization. A baseline "trained"
when every seed's validation loss is below ln(10) (chance) and its
accuracy above 1/10.

Fair comparison: every optimizer trains at its own learning rate, the best
of a geometric sweep on seed 0 chosen by the final training loss (not the
reported validation metrics), extended until the best rate lies inside the
grid (`experiments._harness.grid.tuned_grid`); SGD and SGDP sweep their own
(larger) rates, so that SGD trains (the first version of this experiment
ran SGD at 0.1 for 200 steps, which did not). Every arm: the runner's
optimizer (Nesterov momentum 0.9 for SGD/SGDP; Adam's b2 0.95), cosine
schedule with warm-up, clipping 1.0, the same model (same parameters).

Deviation: weight decay is off (the paper trains with it), so the norm
growth is the optimizer's alone (AdamW's decoupled decay would shrink the
norm and AdamP scales the decay of projected weights by ``wd_ratio``).

Regime: width 16, two residual blocks (9,690 parameters), batch 64, 1000
steps of Fashion-MNIST (64,000 images, 1.07 epochs), validation on 4,096
held-out images; ``--full``: width 64, four blocks, batch 128, 4,000 steps.

  python -m experiments.adamp_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from experiments import optimizers_claims
from experiments._harness import grid, report, runs, tiers
from jaxnorm import sharding
from jaxnorm.training import build, claims, tasks
from jaxnorm.training import config as config_lib

NAME = "adamp_claims"
RATIO = claims.MARGINS["log_ratio"]
ACCURACY = claims.MARGINS["accuracy_fraction"]
# Non-inferiority margin of the validation cross-entropy (nats): ours.
LOSS_MARGIN = 0.01
INIT = "init"  # The runs at step 0: the weights' initial norm.

VARIANTS: dict[str, dict[str, Any]] = {
  name: {"optimizer": name} for name in ("adamw", "adamp", "sgd", "sgdp")
}
LEARNING_RATES: Mapping[str, tuple[float, ...]] = {
  "adamw": (3e-3, 1e-2, 3e-2),
  "adamp": (3e-3, 1e-2, 3e-2),
  "sgd": (1e-1, 3e-1, 1.0),
  "sgdp": (1e-1, 3e-1, 1.0),
}
PAIRS = (("adamp", "adamw"), ("sgdp", "sgd"))

_claim = functools.partial(claims.Claim, paper="AdamP", arxiv="2006.08217")

LABEL = {"adamw": "AdamW", "adamp": "AdamP", "sgd": "SGD", "sgdp": "SGDP"}
REGIME = {
  base: _claim(
    claim=f"momentum GD ({LABEL[base]}) on scale-invariant weights grows "
    "their norm, decaying the effective step size (what the projection "
    "removes)",
    metric="log_weight_norm",
    direction="higher",
    kind="superior",
    margin=RATIO,
    a=base,
    b=INIT,
  )
  for _, base in PAIRS
}
NORM = {
  base: _claim(
    claim=f"{LABEL[proj]} gets rid of the radial, norm-increasing "
    f"component: the scale-invariant weights' norm grows less than under "
    f"{LABEL[base]} (log ‖W_T‖/‖W_0‖)",
    metric="log_norm_growth",
    direction="lower",
    kind="superior",
    margin=RATIO,
    a=proj,
    b=base,
  )
  for proj, base in PAIRS
}
QUALITY = tuple(
  _claim(
    claim=f"{LABEL[proj]} brings gains over {LABEL[base]} (tested: {what} "
    "not worse by the margin)",
    metric=metric,
    direction=direction,
    kind="non_inferior",
    margin=margin,
    a=proj,
    b=base,
  )
  for proj, base in PAIRS
  for metric, direction, margin, what in (
    ("val_accuracy", "higher", ACCURACY, "validation accuracy"),
    ("val_loss", "lower", LOSS_MARGIN, "validation loss"),
  )
)


def cnn_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The CNN with BatchNorm, sandwich residuals, no weight decay."""
  run = {
    "quick": dict(
      data="digits",
      width=8,
      depth=1,
      batch_size=8,
      steps=4,
      eval_every=2,
      log_every=2,
      eval_batches=1,
      warmup_steps=1,
    ),
    "default": dict(
      data="fashion_mnist",
      width=16,
      depth=2,
      batch_size=64,
      steps=1000,
      eval_every=200,
      log_every=50,
      eval_batches=64,
      warmup_steps=100,
    ),
    "full": dict(
      data="fashion_mnist",
      width=64,
      depth=4,
      batch_size=128,
      steps=4000,
      eval_every=500,
      log_every=100,
      eval_batches=40,
      warmup_steps=200,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="cnn",
    norm="batchnorm",
    residual="sandwich",
    activation="relu",
    **run,
    checkpoint_every=10**9,
    keep_checkpoints=1,
    weight_decay=0.0,
  )


def final_state(run_dir: pathlib.Path) -> dict[str, Any]:
  """The train state of a run's newest checkpoint as nested dicts.

  Leaves are NumPy arrays under their `nnx.Variable` key ``value``; the top
  level holds ``params``, ``rest`` (e.g. running statistics), ``backward``,
  ``opt_state`` and the counters, as `jaxnorm.training.trainer` saves them.
  """
  manager = ocp.CheckpointManager(
    pathlib.Path(run_dir).absolute() / "checkpoints"
  )
  try:
    restored = manager.restore(
      manager.latest_step(),
      args=ocp.args.Composite(state=ocp.args.StandardRestore()),
    )
  finally:
    manager.close()
  return restored["state"]


def conv_feeding_bn(params: Mapping[str, Any]) -> list[np.ndarray]:
  """The sandwich CNN's ``conv2`` kernels, each followed by a BatchNorm."""
  blocks = params["net"]["blocks"]
  return [
    np.asarray(_value(blocks[key]["conv2"]["kernel"]))
    for key in sorted(blocks, key=int)
  ]


def _value(leaf: Any) -> Any:
  return leaf["value"] if isinstance(leaf, Mapping) else leaf


def weight_norm(kernels: Sequence[np.ndarray]) -> float:
  """The Frobenius norm of all ``kernels`` together (float64)."""
  return math.sqrt(
    sum(float(np.sum(np.square(k, dtype=np.float64))) for k in kernels)
  )


def initial_norm(cfg: config_lib.TrainConfig) -> float:
  """The scale-invariant kernels' norm at initialization (``cfg.seed``).

  The model is built as the runner builds it (same registry, seed and
  mesh), so it holds the weights the run started from.
  """
  task = tasks.make_task(cfg)
  mesh = sharding.make_mesh(cfg.mesh)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    model = build.build_model(cfg, task.model_kwargs, rngs=nnx.Rngs(cfg.seed))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return weight_norm(conv_feeding_bn(params))


def with_norms(
  lines: Sequence[Mapping[str, Any]],
  table: pathlib.Path,
  base: config_lib.TrainConfig,
) -> list[dict[str, Any]]:
  """The lines with the weights' norms, and one `INIT` line per seed.

  Each line gains ``weight_norm`` (final), ``log_weight_norm``,
  ``norm_growth`` (final / initial), ``log_norm_growth`` and
  ``effective_step`` (``(||W_0|| / ||W_T||)^2``: the factor on the
  effective step size ``lr / ||W||^2``); the `INIT` lines hold the
  initial norm as ``weight_norm`` and ``log_weight_norm``.
  """
  init = {
    seed: initial_norm(dataclasses.replace(base, seed=seed))
    for seed in sorted({ln["seed"] for ln in lines})
  }
  out = []
  for ln in lines:
    run_dir = grid.run_dir(table.parent, ln["run"], ln["seed"])
    # A diverged run's last weights are not its result (`diverged`).
    final = (
      math.nan
      if ln.get("stopped_early")
      else weight_norm(conv_feeding_bn(final_state(run_dir)["params"]))
    )
    growth = final / init[ln["seed"]]
    out.append(
      {
        **ln,
        "weight_norm": final,
        "log_weight_norm": math.log(final),
        "norm_growth": growth,
        "log_norm_growth": math.log(growth),
        "effective_step": growth**-2,
      }
    )
  for seed, norm in init.items():
    out.append(
      {
        "variant": INIT,
        "seed": seed,
        "weight_norm": norm,
        "log_weight_norm": math.log(norm),
      }
    )
  return out


def _init_setting(arm: Mapping[str, Any]) -> dict[str, Any]:
  """The `INIT` arm's setting: the same run at step 0."""
  return {**arm, "steps": 0, "examples": 0}


def _no_growth(regime: Mapping[str, Any]) -> str:
  """Why a norm claim is not testable: its baseline's norm did not grow."""
  mean, ci = regime["mean_diff"], regime["ci"]
  growth = "not finite" if mean is None else f"{mean:+.3g}"
  if ci and None not in ci:
    growth += f" [{ci[0]:+.3g}, {ci[1]:+.3g}]"
  return (
    f"the scale-invariant weights' norm does not grow by the margin under "
    f"{LABEL[regime['a']]}: log growth {growth} (regime claim "
    f"{regime['verdict']})"
  )


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
  chance_loss: float,
) -> list[dict[str, Any]]:
  """The claims' records: per baseline its regime, norm and quality claims."""
  trained_lines = [ln for ln in lines if ln["variant"] != INIT]
  config = config_lib.to_json(config_lib.resolve(base))
  out = []
  for proj, base_opt in PAIRS:
    untrained = runs.untrained(
      trained_lines,
      base_opt,
      chance_loss,
      accuracy=math.exp(-chance_loss),  # 1 / classes.
      what=f"chance (ln {round(math.exp(chance_loss))})",
    )
    ok = untrained is None
    regime_claim = REGIME[base_opt]
    arm = grid.setting(trained_lines, base, tuned, base_opt)
    regime = grid.claim_record(
      lines,
      regime_claim,
      baseline_trained=True,
      config={"base": config, "a": dict(tuned[base_opt]), "b": "step 0"},
      setting={"a": arm, "b": _init_setting(arm)},
      reason="the baseline is the same run at initialization",
    )
    present = regime["verdict"] == "reproduced"
    out.append(regime)
    out.append(
      grid.runner_record(
        trained_lines,
        NORM[base_opt],
        base,
        tuned,
        baseline_trained=ok,
        testable=present,
        reason=untrained if present else _no_growth(regime),
      )
    )
    for claim in QUALITY:
      if claim.b == base_opt:
        out.append(
          grid.runner_record(
            trained_lines,
            claim,
            base,
            tuned,
            baseline_trained=ok,
            reason=untrained,
          )
        )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = cnn_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  # --quick checks the pipeline at the base rate (the sweep's own test is
  # tests/test_harness.py).
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, VARIANTS, seeds, rates)
    lines = with_norms(optimizers_claims.diverged(lines), table, base)
    chance = runs.chance_loss(base)
    trained_lines = [ln for ln in lines if ln["variant"] != INIT]
    return {
      "claims": records(lines, base, tuned["variants"], chance),
      "sweeps": tuned["sweeps"],
      "variants": tuned["variants"],
      "lines": lines,
      "val_loss": grid.cells(trained_lines, "val_loss"),
      "val_accuracy": grid.cells(trained_lines, "val_accuracy"),
      "norm_growth": grid.cells(trained_lines, "norm_growth"),
      "effective_step": grid.cells(trained_lines, "effective_step"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      [ln for ln in result["lines"] if ln["variant"] != INIT],
      "norm_growth",
      path,
      f"CNN + BatchNorm on {base.data}, width {base.width}, {base.depth} "
      f"blocks, {base.steps} steps: each optimizer at its tuned learning "
      f"rate ({len(seeds)} seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = [
      f"Runner config: CNN width {base.width}, {base.depth} sandwich "
      f"blocks with BatchNorm, batch {base.batch_size}, {base.steps} steps "
      f"of {base.data} (cosine, warm-up {base.warmup_steps}, no weight "
      f"decay, clip {base.clip_norm}), validation on "
      f"{base.eval_batches * base.batch_size} held-out images, seeds "
      f"{list(seeds)}; mean ± sample std (ddof=1) over seeds. Norms: the "
      "`conv2` kernels that feed a BatchNorm (scale-invariant), all blocks "
      "together.",
      "",
    ]
    lines += (
      report.sweep_lines(result["sweeps"])
      if result["sweeps"]
      else ["(No learning-rate sweep at this tier: every arm at the base "
            "rate.)", ""]
    )  # fmt: skip
    lines += [
      "## Each optimizer at its tuned learning rate",
      "",
      "| optimizer | lr | norm growth ‖W_T‖/‖W_0‖ | effective step "
      "(‖W_0‖/‖W_T‖)² | val loss | val accuracy |",
      "|---|---|---|---|---|---|",
    ]
    for name, cell in result["norm_growth"].items():
      lr = result["variants"][name].get("learning_rate", base.learning_rate)
      lines.append(
        f"| {name} | {lr:g} | {grid.fmt(cell)} | "
        f"{grid.fmt(result['effective_step'][name])} | "
        f"{grid.fmt(result['val_loss'][name])} | "
        f"{grid.fmt(result['val_accuracy'][name])} |"
      )
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
