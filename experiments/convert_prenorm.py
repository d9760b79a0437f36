"""Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm: the same function, and its speed.

Claims (Jiang, Gu, Zhu & Pan, "Pre-RMSNorm and Pre-CRMSNorm Transformers:
Equivalent and Efficient Pre-LN Transformers", NeurIPS 2023,
arXiv:2305.14858), fixed before running:

* Pre-LN, Pre-RMSNorm and Pre-CRMSNorm are equivalent: a trained Pre-LN LM
  converted to Pre-RMSNorm (LayerNorm's affine folded into its readers, the
  stream kept zero-mean by centring its writers) and to Pre-CRMSNorm (the
  zero-mean stream compressed to ``d - 1`` coordinates, `jaxnorm.nn.
  convert`) computes the same logits. Metric ``rel_logit_dev``: the largest
  absolute logit difference to the Pre-LN parent over the runner's
  validation batches, over the parent's largest absolute logit (0 for the
  parent itself); ``equivalent`` within 1e-4, per parent seed.
* Pre-RMSNorm and Pre-CRMSNorm are faster than Pre-LN (the paper: 1-10%
  less training and inference time): the log seconds of one forward pass
  (``log_forward_seconds``, inference) and of one runner train step
  (``log_step_seconds``: forward, backward, AdamW) are ``superior``
  (lower, margin 0) to the Pre-LN parent's. A CPU measurement: the three
  models of a parent are timed in one process, interleaved in rounds
  (median of 5 calls each, the order rotating between rounds), and paired
  by round (``<seed>/<round>``).

The parents are trained by the runner (`experiments._harness.grid.
run_grid`): a Pre-LN decoder (LayerNorm, untied head, biases: the form both
conversions take) of width 64 and depth 4, 400 AdamW steps of 16 x 64 bytes
of Shakespeare, 3 seeds. The conversions add no training, so no arm has a
learning rate of its own. Pre-CRMSNorm has width 63, one row fewer in
every stream matrix and no norm affine (2.0% fewer parameters than the
parent), Pre-RMSNorm the parent's width with LayerNorm's gains and offsets
folded into their readers (0.5% fewer). The speed claims compare these
converted models as they are (the paper's point: the same function at
less cost).

  python -m experiments.convert_prenorm [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import _lm
from experiments._harness import grid, report, runs, tiers
from jaxnorm import nn as jaxnorm_nn
from jaxnorm import sharding
from jaxnorm.nn import convert
from jaxnorm.training import claims, trainer
from jaxnorm.training import config as config_lib

NAME = "convert_prenorm"
PARENT = "pre-ln"
ARMS = (PARENT, "pre-rmsnorm", "pre-crmsnorm")
VARIANTS: dict[str, dict[str, Any]] = {PARENT: {}}
EQUIVALENCE_MARGIN = 1e-4
# Timing: rounds per parent, calls per measurement (the median is kept).
ROUNDS, CALLS = 5, 5

_claim = functools.partial(
  claims.Claim,
  paper="Pre-CRMSNorm",
  arxiv="2305.14858",
  direction="lower",
  b=PARENT,
)

EQUIVALENCE = tuple(
  _claim(
    claim=f"a trained Pre-LN Transformer converts exactly to {name}",
    metric="rel_logit_dev",
    kind="equivalent",
    margin=EQUIVALENCE_MARGIN,
    a=arm,
  )
  for arm, name in (
    ("pre-rmsnorm", "Pre-RMSNorm"),
    ("pre-crmsnorm", "Pre-CRMSNorm"),
  )
)
SPEED = tuple(
  _claim(
    claim=f"{name} {what} is faster than Pre-LN's (CPU time)",
    metric=metric,
    kind="superior",
    margin=0.0,
    a=arm,
  )
  for arm, name in (
    ("pre-rmsnorm", "Pre-RMSNorm"),
    ("pre-crmsnorm", "Pre-CRMSNorm"),
  )
  for metric, what in (
    ("log_forward_seconds", "inference (one forward pass)"),
    ("log_step_seconds", "training (one runner train step)"),
  )
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The Pre-LN parent's run of each tier."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=400,
      eval_every=100,
      eval_batches=8,
      warmup_steps=40,
    ),
    full_steps=5000,
    norm="layernorm",
  )


def conversions(parent: nnx.Module) -> dict[str, nnx.Module]:
  """The parent and its two conversions, as fresh modules."""
  cfg, params = parent.config, convert.lm_params(parent)
  pairs = {
    PARENT: (params, cfg),
    "pre-rmsnorm": convert.to_pre_rmsnorm(params, cfg),
    "pre-crmsnorm": convert.to_pre_crmsnorm(params, cfg),
  }
  return {name: convert.load_lm(c, p) for name, (p, c) in pairs.items()}


def _median_seconds(fn: Callable[[], Any], calls: int) -> float:
  times = []
  for _ in range(calls):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _forward(model: nnx.Module, batch: jax.Array) -> Callable[[], Any]:
  """One jitted eval-mode forward pass of ``batch``."""
  model.eval()
  graphdef, state = nnx.split(model)
  fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
  return lambda: fwd(state, batch[:, :-1])


def _train_step(
  cfg: config_lib.TrainConfig, model: nnx.Module, batch: jax.Array
) -> Callable[[], Any]:
  """The runner's jitted train step of ``model`` on ``batch``, repeatable.

  Built as `trainer.train` builds it (`trainer.make_optimizer`,
  `trainer.init_state`, `trainer.make_train_step`); every call runs one
  step from the state the previous call left.
  """
  model.train()
  mesh = sharding.make_mesh(cfg.mesh)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    graphdef, params, backward, rest = nnx.split(
      model, nnx.Param, jaxnorm_nn.BackwardStat, ...
    )
    tx = trainer.make_optimizer(cfg, model, params)
    state = {"s": trainer.init_state(cfg, params, backward, rest, tx, mesh)}
  layout = jax.tree.map(lambda x: x.sharding, state["s"])
  step = trainer.make_train_step(
    cfg,
    graphdef,
    tx,
    trainer.lr_schedule(cfg),
    jax.random.key(cfg.seed),
    "lm",
    layout,
  )
  placed = jax.device_put(batch, trainer.batch_sharding(mesh))
  scale = jnp.float32(1.0)

  def call():
    with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
      state["s"], metrics = step(state["s"], placed, scale)
    return metrics

  return call


def measure(
  cfg: config_lib.TrainConfig,
  parent: nnx.Module,
  batches: Sequence[jax.Array],
  seed: int,
  rounds: int,
  calls: int,
) -> tuple[list[dict], list[dict]]:
  """The conversions of one parent: equivalence lines and timing lines."""
  built = conversions(parent)
  losses, logits = {}, {}
  for name, model in built.items():
    losses[name], out = _lm.evaluate(model, batches)
    logits[name] = np.concatenate(out)
  ref = logits[PARENT]
  scale = float(np.max(np.abs(ref)))
  lines = [
    {
      "variant": name,
      "seed": seed,
      "val_loss": losses[name],
      "max_abs_logit_diff": float(np.max(np.abs(logits[name] - ref))),
      "rel_logit_dev": float(np.max(np.abs(logits[name] - ref))) / scale,
      "max_abs_logit": scale,
      "width": built[name].config.width,
      "norm": built[name].config.norm,
      "params": int(
        sum(np.size(x) for x in jax.tree.leaves(nnx.state(built[name])))
      ),
    }
    for name in ARMS
  ]
  # Separate copies: the train step donates its model's buffers.
  batch, stepped = batches[0], conversions(parent)
  fns = {}
  for name in ARMS:
    fns[name] = {
      "log_forward_seconds": _forward(built[name], batch),
      "log_step_seconds": _train_step(cfg, stepped[name], batch),
    }
    for fn in fns[name].values():  # Compile and warm up.
      jax.block_until_ready(fn())
  times = []
  for r in range(rounds):
    order = ARMS[r % 3 :] + ARMS[: r % 3]
    row = {name: {"variant": name, "seed": f"{seed}/{r}"} for name in ARMS}
    for metric in ("log_forward_seconds", "log_step_seconds"):
      for name in order:
        row[name][metric] = float(
          np.log(_median_seconds(fns[name][metric], calls))
        )
    times += list(row.values())
  return lines, times


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the parents (skipping finished runs), converts, times, reports."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  quick = tiers.tier(args) == "quick"
  rounds, calls = (1, 1) if quick else (ROUNDS, CALLS)

  def compute() -> dict:
    parents = grid.run_grid(
      table, base, VARIANTS, seeds, model=lambda _, s: _lm.pre_ln(base, s)
    )
    trained = grid.setting(parents, base, VARIANTS, PARENT)
    batches = _lm.val_batches(base)
    lines, times = [], []
    for seed in seeds:
      parent = runs.trained(
        table, base, {}, PARENT, seed, model=lambda s=seed: _lm.pre_ln(base, s)
      )
      more, timed = measure(base, parent, batches, seed, rounds, calls)
      lines += more
      times += timed
    params = {ln["variant"]: ln["params"] for ln in lines}
    settings = {
      name: {**trained, "params": params[name], "converted": name != PARENT}
      for name in ARMS
    }
    config = {
      "base": config_lib.to_json(config_lib.resolve(base)),
      "parent": "LayerNorm, untied head, biases",
      "rounds": rounds,
      "calls": calls,
    }

    def rec(claim, rows):
      return grid.claim_record(
        rows,
        claim,
        baseline_trained=True,
        config=config,
        setting={"a": settings[claim.a], "b": settings[claim.b]},
      )

    records = [rec(c, lines) for c in EQUIVALENCE]
    records += [rec(c, times) for c in SPEED]
    return {
      "claims": records,
      "runs": parents,
      "lines": lines,
      "timing": times,
      "cells": {
        k: grid.cells(lines, k)
        for k in ("val_loss", "rel_logit_dev", "max_abs_logit_diff")
      },
      "time_cells": {
        k: grid.cells(times, k)
        for k in ("log_forward_seconds", "log_step_seconds")
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    dev = result["cells"]["rel_logit_dev"]
    converted = ARMS[1:]
    for i, name in enumerate(converted):
      axes[0].scatter([i] * len(dev[name]["values"]), dev[name]["values"])
    axes[0].axhline(EQUIVALENCE_MARGIN, color="grey", ls="--", label="margin")
    axes[0].set_yscale("log")
    axes[0].set_xlim(-0.5, len(converted) - 0.5)
    axes[0].set_xticks(range(len(converted)), converted)
    axes[0].set_ylabel("max |logit − parent's| / max |logit|, per seed")
    axes[0].set_title("logit deviation from the Pre-LN parent (its own: 0)")
    axes[0].legend()
    tc = result["time_cells"]
    x = np.arange(len(ARMS))
    for i, (metric, label) in enumerate(
      (("log_forward_seconds", "forward"), ("log_step_seconds", "train step"))
    ):
      ms = [1e3 * np.exp(tc[metric][n]["mean"]) for n in ARMS]
      axes[1].bar(x + (i - 0.5) * 0.38, ms, 0.38, label=label)
    axes[1].set_xticks(x, ARMS)
    axes[1].set_ylabel("ms per call (geometric mean over rounds)")
    axes[1].set_ylim(bottom=0)
    axes[1].set_title("CPU time, interleaved in one process")
    axes[1].legend()
    report.claims_axes(axes[2], result["claims"])
    fig.suptitle(
      f"Pre-LN conversions: {base.width}x{base.depth} byte LM, "
      f"{base.steps} steps, {len(seeds)} parents"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    out = report.runner_lines(base, seeds)
    out += [
      "No learning-rate sweep: the conversions add no training (each arm "
      "is its parent's exact conversion).",
      "",
      "## The conversions",
      "",
      "| model | norm | width | params | val loss | max abs logit diff "
      "| relative |",
      "|---|---|---|---|---|---|---|",
    ]
    by = {(ln["variant"], ln["seed"]): ln for ln in result["lines"]}
    for seed in seeds:
      for name in ARMS:
        ln = by[(name, seed)]
        out.append(
          f"| {name} (seed {seed}) | {ln['norm']} | {ln['width']} | "
          f"{ln['params']:,} | {ln['val_loss']:.6f} | "
          f"{ln['max_abs_logit_diff']:.2e} | {ln['rel_logit_dev']:.2e} |"
        )
    out += ["", "## Time per call (CPU)", ""]
    tc = result["time_cells"]
    out += [
      f"{rounds} rounds of {calls} calls per parent (median per round), "
      "the arms' order rotating between rounds; geometric mean over rounds "
      "and parents, and the ratio to Pre-LN.",
      "",
      "| model | forward (ms) | vs Pre-LN | train step (ms) | vs Pre-LN |",
      "|---|---|---|---|---|",
    ]
    for name in ARMS:
      cells = []
      for metric in ("log_forward_seconds", "log_step_seconds"):
        m = tc[metric][name]["mean"]
        cells += [
          f"{1e3 * np.exp(m):.3f}",
          f"{np.exp(m - tc[metric][PARENT]['mean']):.3f}x",
        ]
      out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
