"""Conda and RMNP on the runner's byte LM: each optimizer at its own tuned lr.

Claims (each fixed before running; the seeds pair the arms: same
initialization and data order):

* Conda (Wang et al., "Conda: Column-Normalized Adam for Training Large
  Language Models Faster", arXiv:2509.24218): "Conda consistently
  outperforms AdamW ... in pre-training": Conda's final validation loss is
  ``superior`` to AdamW's by the byte-LM margin
  (`claims.MARGINS["nats_per_byte"]`, 0.01 nats/byte).
* Conda: "Conda achieves 2-2.5x the convergence speed of AdamW, measured
  in training steps": the steps Conda takes to reach AdamW's final
  validation loss (the same seed's), against the steps AdamW takes, on the
  log scale (``log_steps_to_target``): ``superior`` by the ratio margin
  (`claims.MARGINS["log_ratio"]`, log 1.1: at least 10% fewer steps; the
  paper's 2x would be log 2, the report gives the measured factor).
* RMNP (Deng et al., "RMNP: Row-Momentum Normalized Preconditioning for
  Scalable Matrix-Based Optimization", arXiv:2603.20527): "RMNP delivers
  competitive optimization performance compared with Muon": RMNP's final
  validation loss is ``non_inferior`` to ``optax.contrib.muon``'s by 0.01
  nats/byte.
* RMNP: "... while substantially reducing preconditioning wall-clock
  time": the optimizer update (``tx.update`` and ``apply_updates``, jitted
  with donated state, the runner's optimizer of the run: clipping,
  schedule, decay) on the run's parameters takes less time than Muon's:
  ``superior`` on the log of its median milliseconds by log 1.1 (10%
  faster). Step time is noisy on a shared machine, so the optimizers are
  timed in one process, interleaved round-robin (the order reversed every
  round) after warm-up, as `benchmarks/optim.py` does, and compared as a
  ratio per seed (a seed: a fresh model and compilation, medians of its
  rounds).

Baselines: AdamW and Muon "trained" when every seed's final validation loss
is below the unigram entropy of the held-out bytes (the best context-free
model); a claim on a baseline that did not train cannot be reproduced. The
timing claim does not depend on training.

Fair comparison: every optimizer trains at its own learning rate, the best
of a geometric sweep on seed 0 chosen by the final training loss (not the
reported validation loss), extended until the best rate lies inside the
grid (`experiments._harness.grid.tuned_grid`); then every seed at that
rate. All arms share the model (same parameter count), schedule (warm-up,
cosine to 10%), weight decay 0.1 on matrices and embeddings, clipping 1.0
and the runner's moment coefficients.

Steps to the target are read from each run's validation curve
(``metrics.jsonl``, every ``eval_every`` steps), linearly interpolated
between the two evaluations around the crossing; a run that never reaches
the target counts as one evaluation interval past its last step (a
censored value, marked in the report).

Regime: the runner's decoder LM, 4 layers of width 64 (217,664
parameters), 64-byte windows, batch 16, 600 steps of byte-level
Shakespeare (614,400 tokens), validation every 50 steps; ``--full``: 8
layers of width 256, 5000 steps of 32 x 256 bytes.

Deviations from the papers: the runner gives every matrix leaf (the
embedding and tied head included) to the matrix optimizers, where the
authors train embeddings and head with AdamW; Conda keeps the runner's
``b2`` 0.95 (recipe 0.99), ``scale`` 1 (recipe 0.25: the matrices at a
quarter of the others' rate; the tuned rate absorbs it for the matrices,
not the ratio); its ``update_proj_gap`` is a fifth of the run (120 steps
here, recipe 2000 of 10000 steps), so the basis is recomputed 5 times a
run, as in the recipe (`CONDA_REFRESHES`). The models are far smaller
and the runs far shorter than the papers' LLaMA / GPT-2 pre-training.

  python -m experiments.optimizers_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from experiments._harness import grid, report, runs, tiers
from jaxnorm import sharding
from jaxnorm.training import build, claims, metrics, tasks, trainer
from jaxnorm.training import config as config_lib

NAME = "optimizers_claims"
MARGIN = claims.MARGINS["nats_per_byte"]
RATIO = claims.MARGINS["log_ratio"]

OPTIMIZERS = ("adamw", "conda", "muon", "rmnp")
# Conda recomputes its basis every ``update_proj_gap`` steps: 2000 of the
# 10000 in the authors' LLaMA-60M recipe (jie040109/Conda, examples/llama/
# scripts/llama_60m_conda.sh), 5 times a run. Runs here keep that count.
CONDA_REFRESHES = 5


def conda_gap(base: config_lib.TrainConfig) -> int:
  """Conda's ``update_proj_gap``: `CONDA_REFRESHES` refreshes a run."""
  return max(base.steps // CONDA_REFRESHES, 1)


def variants(base: config_lib.TrainConfig) -> dict[str, dict[str, Any]]:
  """Each arm's config changes: its optimizer (and Conda's refresh gap)."""
  out: dict[str, dict[str, Any]] = {n: {"optimizer": n} for n in OPTIMIZERS}
  out["conda"]["optimizer_kwargs"] = (("update_proj_gap", conda_gap(base)),)
  return out


# Geometric grids (factor ~3) around the papers' recipes scaled to this
# model; `grid.tuned_grid` extends a grid whose best rate is at an end.
LEARNING_RATES: Mapping[str, tuple[float, ...]] = {
  "adamw": (3e-3, 1e-2, 3e-2),
  "conda": (3e-3, 1e-2, 3e-2),
  "muon": (1e-2, 3e-2, 1e-1),
  "rmnp": (3e-3, 1e-2, 3e-2),
}
# Timing: warm-up calls, then interleaved rounds of `CALLS` updates each.
WARMUP, ROUNDS, CALLS = 3, 30, 3

CONDA = ("Conda", "2509.24218")
RMNP = ("RMNP", "2603.20527")
CLAIMS = (
  claims.Claim(
    paper=CONDA[0],
    arxiv=CONDA[1],
    claim="Conda consistently outperforms AdamW in pre-training (final "
    "validation loss)",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=MARGIN,
    a="conda",
    b="adamw",
  ),
  claims.Claim(
    paper=CONDA[0],
    arxiv=CONDA[1],
    claim="Conda achieves 2-2.5x the convergence speed of AdamW measured "
    "in training steps (steps to AdamW's final validation loss, log)",
    metric="log_steps_to_target",
    direction="lower",
    kind="superior",
    margin=RATIO,
    a="conda",
    b="adamw",
  ),
  claims.Claim(
    paper=RMNP[0],
    arxiv=RMNP[1],
    claim="RMNP delivers competitive optimization performance compared "
    "with Muon (final validation loss)",
    metric="val_loss",
    direction="lower",
    kind="non_inferior",
    margin=MARGIN,
    a="rmnp",
    b="muon",
  ),
  claims.Claim(
    paper=RMNP[0],
    arxiv=RMNP[1],
    claim="RMNP substantially reduces preconditioning wall-clock time "
    "compared with Muon (optimizer update, log of median ms)",
    metric="log_update_ms",
    direction="lower",
    kind="superior",
    margin=RATIO,
    a="rmnp",
    b="muon",
  ),
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=600,
      eval_every=50,
      eval_batches=8,
      warmup_steps=60,
    ),
    full_steps=5000,
    full_eval_every=250,
  )


def val_curve(run_dir: pathlib.Path) -> list[tuple[int, float]]:
  """``(step, val_loss)`` of a run, from its ``metrics.jsonl``."""
  log = metrics.read_log(run_dir / "metrics.jsonl")
  return [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]


def steps_to(
  curve: Sequence[tuple[int, float]], target: float, censor: float
) -> tuple[float, bool]:
  """The step at which a validation curve first reaches ``target``.

  Linear interpolation between the last evaluation above ``target`` and
  the first at or below it (the first evaluation's step when that one is
  already at or below). A curve that never reaches it (or holds a
  non-finite value first) gives ``censor`` and False.

  Returns:
    The step (a float) and whether the curve reached the target.
  """
  prev = None
  for step, loss in curve:
    if loss is None or not math.isfinite(loss):
      break
    if loss <= target:
      if prev is None:
        return float(step), True
      s0, l0 = prev
      return s0 + (l0 - target) / (l0 - loss) * (step - s0), True
    prev = (step, loss)
  return float(censor), False


def diverged(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The lines, a run that stopped early with NaN validation metrics.

  The runner stops a run at a non-finite loss (``stopped_early``); its
  last evaluation predates the divergence, so its metrics are not the
  run's result: a claim on them is inconclusive (`claims.judge`).
  """
  out = []
  for ln in lines:
    if ln.get("stopped_early"):
      ln = {**ln, **{k: math.nan for k in ln if k.startswith("val_")}}
    out.append(dict(ln))
  return out


def with_steps_to_target(
  lines: Sequence[Mapping[str, Any]],
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  reference: str = "adamw",
) -> list[dict[str, Any]]:
  """The lines with ``steps_to_target`` (and its log) and ``reached``.

  The target of a seed is ``reference``'s final validation loss at that
  seed; each run's curve is read from its run directory (``run`` names it,
  as `grid.tuned_grid` gives).
  """
  target = {
    ln["seed"]: ln["val_loss"] for ln in lines if ln["variant"] == reference
  }
  censor = base.steps + base.eval_every
  out = []
  for ln in lines:
    curve = val_curve(grid.run_dir(table.parent, ln["run"], ln["seed"]))
    goal = target[ln["seed"]]
    if goal is None or not math.isfinite(goal):
      step, reached = float(censor), False
    else:
      step, reached = steps_to(curve, goal, censor)
    out.append(
      {
        **ln,
        "target": target[ln["seed"]],
        "steps_to_target": step,
        "log_steps_to_target": math.log(step),
        "reached": reached,
      }
    )
  return out


def _model_and_params(cfg: config_lib.TrainConfig, task: tasks.Task):
  """The runner's model of ``cfg`` and its `nnx.Param` state, on its mesh."""
  mesh = sharding.make_mesh(cfg.mesh)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    model = build.build_model(cfg, task.model_kwargs, rngs=nnx.Rngs(cfg.seed))
    params = nnx.state(model, nnx.Param)
  return model, params


def update_times(
  configs: Mapping[str, config_lib.TrainConfig],
  *,
  warmup: int = WARMUP,
  rounds: int = ROUNDS,
  calls: int = CALLS,
) -> dict[str, float]:
  """Median milliseconds of one optimizer update per config, interleaved.

  Each config's model is built as the runner builds it (its ``seed``),
  with the runner's optimizer (`trainer.make_optimizer`: clipping,
  schedule, weight-decay mask); its update ``(params, state, grads) ->
  (apply_updates(params, u), state')`` is jitted with params and state
  donated and fed fixed gradients (normal, scale 1e-2, keyed by the
  seed). After ``warmup`` untimed calls each (compilation, Conda's first
  basis), ``rounds`` rounds time ``calls`` consecutive updates of every
  config, in the configs' order on even rounds and reversed on odd ones,
  so that load drifts reach all alike. For comparisons within one call
  only.

  Returns:
    config name -> median over rounds of the milliseconds per update.
  """
  # optax mixes integer counts with floats, as under the runner.
  with jax.numpy_dtype_promotion("standard"):
    return _update_times(configs, warmup=warmup, rounds=rounds, calls=calls)


def _update_times(
  configs: Mapping[str, config_lib.TrainConfig],
  *,
  warmup: int,
  rounds: int,
  calls: int,
) -> dict[str, float]:
  cases = {}
  for name, cfg in configs.items():
    task = tasks.make_task(cfg)
    model, params = _model_and_params(cfg, task)
    tx = trainer.make_optimizer(cfg, model, params)
    keys = iter(jax.random.split(jax.random.key(cfg.seed), 10**4))
    grads = jax.tree.map(
      lambda p: 1e-2 * jax.random.normal(next(keys), p.shape, p.dtype), params
    )

    def step(p, s, g, tx=tx):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    fn = jax.jit(step, donate_argnums=(0, 1))
    state = tx.init(params)
    cases[name] = {"fn": fn, "params": params, "state": state, "g": grads}

  def call(case: dict[str, Any]) -> None:
    case["params"], case["state"] = jax.block_until_ready(
      case["fn"](case["params"], case["state"], case["g"])
    )

  for case in cases.values():
    for _ in range(warmup):
      call(case)
  times: dict[str, list[float]] = {name: [] for name in cases}
  order = list(cases)
  for r in range(rounds):
    for name in order if r % 2 == 0 else order[::-1]:
      t0 = time.perf_counter()
      for _ in range(calls):
        call(cases[name])
      times[name].append((time.perf_counter() - t0) / calls)
  return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def with_update_times(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
  *,
  rounds: int,
  warmup: int,
  calls: int = CALLS,
) -> list[dict[str, Any]]:
  """The lines with ``update_ms`` and ``log_update_ms``, timed per seed.

  Every arm of one seed is timed in one `update_times` call (each arm with
  its run's config, learning rate included).
  """
  by_seed: dict[int, dict[str, float]] = {}
  for seed in sorted({ln["seed"] for ln in lines}):
    by_seed[seed] = update_times(
      {
        name: dataclasses.replace(base, **changes, seed=seed)
        for name, changes in tuned.items()
      },
      warmup=warmup,
      rounds=rounds,
      calls=calls,
    )
  return [
    {
      **ln,
      "update_ms": by_seed[ln["seed"]][ln["variant"]],
      "log_update_ms": math.log(by_seed[ln["seed"]][ln["variant"]]),
    }
    for ln in lines
  ]


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
  baseline_loss: float,
) -> list[dict[str, Any]]:
  """The claims' records (`grid.runner_record`)."""
  out = []
  for claim in CLAIMS:
    if claim.metric == "log_update_ms":
      ok, why = True, "step time does not depend on training"
    else:
      why = runs.untrained(
        lines, claim.b, baseline_loss, what="the unigram entropy"
      )
      ok = why is None
    out.append(
      grid.runner_record(
        lines,
        claim,
        base,
        tuned,
        baseline_trained=ok,
        reason=why,
      )
    )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs), times, writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  quick = tiers.tier(args) == "quick"
  table = pathlib.Path(args.runs) / "grid.jsonl"
  # --quick checks the pipeline at the base rate (the sweep's own test is
  # tests/test_harness.py).
  rates = {} if quick else LEARNING_RATES
  timing = dict(rounds=2, warmup=2, calls=1) if quick else dict(
    rounds=ROUNDS, warmup=WARMUP
  )  # fmt: skip

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, variants(base), seeds, rates)
    lines = with_steps_to_target(diverged(lines), table, base)
    lines = with_update_times(lines, base, tuned["variants"], **timing)
    baseline_loss = runs.chance_loss(base)
    return {
      "claims": records(lines, base, tuned["variants"], baseline_loss),
      "sweeps": tuned["sweeps"],
      "variants": tuned["variants"],
      "lines": lines,
      "unigram_entropy": baseline_loss,
      "val_loss": grid.cells(lines, "val_loss"),
      "steps_to_target": grid.cells(lines, "steps_to_target"),
      "update_ms": grid.cells(lines, "update_ms"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "val_loss",
      path,
      f"byte LM, {base.depth} layers of width {base.width}, {base.steps} "
      f"steps: each optimizer at its tuned learning rate ({len(seeds)} "
      "seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = [
      f"Runner config: width {base.width}, depth {base.depth}, "
      f"{base.num_heads} heads, {base.seq_len}-byte windows, batch "
      f"{base.batch_size}, {base.steps} steps (cosine, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}, clip "
      f"{base.clip_norm}), validation every {base.eval_every} steps over "
      f"{base.eval_batches} held-out batches, seeds {list(seeds)}; Conda "
      f"recomputes its basis every {conda_gap(base)} steps. Validation "
      f"loss in nats per byte (unigram entropy "
      f"{result['unigram_entropy']:.3f}); mean ± sample std (ddof=1) over "
      "seeds.",
      "",
    ]
    lines += (
      report.sweep_lines(result["sweeps"])
      if result["sweeps"]
      else ["(No learning-rate sweep at this tier: every arm at the base "
            "rate.)", ""]
    )  # fmt: skip
    lines += ["## Validation loss", ""]
    lines += grid.markdown_table(result["val_loss"], "val loss", "adamw")
    reached = {
      name: sum(
        1 for ln in result["lines"] if ln["variant"] == name and ln["reached"]
      )
      for name in result["steps_to_target"]
    }
    lines += [
      "",
      "## Steps to AdamW's final validation loss (same seed)",
      "",
      f"A run that never reaches it counts as {base.steps + base.eval_every}"
      " steps (censored). Speed-up: AdamW's steps / the optimizer's, "
      "geometric mean over seeds.",
      "",
      "| optimizer | steps (mean ± std) | runs reaching it | speed-up vs "
      "AdamW |",
      "|---|---|---|---|",
    ]
    steps = result["steps_to_target"]
    for name, cell in steps.items():
      ratio = np.exp(
        np.mean(np.log(steps["adamw"]["values"]) - np.log(cell["values"]))
      )
      lines.append(
        f"| {name} | {grid.fmt(cell, 0)} | {reached[name]}/{cell['n']} | "
        f"{ratio:.2f}x |"
      )
    ms = result["update_ms"]
    lines += [
      "",
      "## Optimizer update time (interleaved, same process)",
      "",
      "Median milliseconds of one jitted, donated `tx.update` + "
      "`apply_updates` on the run's parameters; per seed a fresh model and "
      "compilation. Ratio vs Muon: geometric mean over seeds.",
      "",
      "| optimizer | ms per update | / muon |",
      "|---|---|---|",
    ]
    for name, cell in ms.items():
      ratio = np.exp(
        np.mean(np.log(cell["values"]) - np.log(ms["muon"]["values"]))
      )
      lines.append(f"| {name} | {grid.fmt(cell, 2)} | {ratio:.3f} |")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
