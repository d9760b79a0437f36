"""Matrix Nuclear-Norm across byte LMs of growing width, and its cost.

Claims (Li et al., "Large Language Model Evaluation via Matrix
Nuclear-Norm", arXiv:2410.10672, abstract), fixed before running:

* the regime: the larger model reaches the lower validation loss (nats per
  byte, lower is better): the widest LM is ``superior`` (margin 0) to the
  narrowest. Where it is not, size does not change what the models learn
  here and the MNN claim is ``not testable at this scale``;
* MNN falls as models grow (and so tracks their loss): the per-token MNN
  of the widest LM is ``superior`` (lower, margin 0) to the narrowest's;
* MNN is far cheaper than matrix entropy (the paper: 8-24x faster on
  Cerebras-GPT 111M-6.7B): the log seconds of one jitted call on a
  ``N = 512`` by ``d = 1024`` hidden-state matrix are ``superior`` (lower)
  by the paper's own lower end, margin ``log 8``. A CPU measurement:
  rounds of interleaved calls (median of 3 each), paired by round.

MNN as the official code (``MLGroupJLU/MatrixNuclearNorm``, ``MNN.py``;
`jaxnorm.analysis.matrix_nuclear_norm`): per validation window ``R`` (``N``
tokens by ``d`` features) of the hidden states after the final norm, the
sum of the top ``D = min(N, d)`` column norms of the centred,
row-normalized ``R``, divided by ``N``; a model's value is the mean over
the runner's validation windows. Every width is at least the window length
(``N = 64`` by default), so ``D = N`` and the score's range (at most
``sqrt(D / N) = 1``) is the same for every model (the first version's
widths below ``N`` changed both with the width). Matrix entropy
(`jaxnorm.analysis.matrix_entropy`) is reported beside it.

The LMs are trained by the runner: pre-RMSNorm decoders of depth 2 and
widths 64, 96 and 128 (about 119k, 252k and 435k parameters: size is the
treatment, so the counts differ by design), 300 AdamW steps of 16 x 64
bytes of Shakespeare. Each width trains at its own learning rate, the best
of a geometric sweep on seed 0 by the final training loss, inside the grid
(`experiments._harness.grid.tuned_grid`); then 3 seeds, paired by seed.

  python -m experiments.nuclear_norm [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from experiments import _lm
from experiments._harness import grid, report, runs, tiers
from jaxnorm import analysis
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

NAME = "nuclear_norm"
# Widths per tier (each >= the tier's window length, so D = N).
WIDTHS = {"quick": (16, 32), "default": (64, 96, 128), "full": (256, 384, 512)}
RATES = (1e-3, 3e-3, 1e-2)
# The timing claim: N x d hidden states, rounds of interleaved calls.
TIME_N, TIME_WIDTHS, TIME_CALLS = 512, (256, 1024), 3
SPEED_MARGIN = math.log(8.0)

_mnn = jax.jit(analysis.matrix_nuclear_norm)
_entropy = jax.jit(analysis.matrix_entropy)

_PAPER = ("Matrix Nuclear-Norm", "2410.10672")


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
  """One runner variant per width of the tier."""
  return {f"width{w}": {"width": w} for w in WIDTHS[tiers.tier(args)]}


def claims_for(names: Sequence[str]) -> tuple[claims.Claim, ...]:
  """The regime, the MNN claim (widest vs narrowest) and the speed claim."""
  small, large = names[0], names[-1]
  return (
    claims.Claim(
      paper=_PAPER[0],
      arxiv=_PAPER[1],
      claim="larger models reach lower loss (the premise of MNN tracking "
      "loss as models grow)",
      metric="val_loss",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=large,
      b=small,
    ),
    claims.Claim(
      paper=_PAPER[0],
      arxiv=_PAPER[1],
      claim="MNN falls as models grow, tracking their loss",
      metric="mnn",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=large,
      b=small,
    ),
    claims.Claim(
      paper=_PAPER[0],
      arxiv=_PAPER[1],
      claim="MNN is far cheaper to compute than matrix entropy (8-24x "
      "faster in the paper; CPU time)",
      metric="log_seconds",
      direction="lower",
      kind="superior",
      margin=SPEED_MARGIN,
      a="mnn",
      b="matrix-entropy",
    ),
  )


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier (the width is each variant's)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=2,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=300,
      eval_every=100,
      eval_batches=8,
      warmup_steps=30,
    ),
    full_steps=5000,
  )


def probe(model, batches) -> dict[str, float]:
  """Mean per-token MNN and matrix entropy of the final-norm states."""
  model.final_norm = _lm.Sow(model.final_norm, name="hidden")
  _, sown = _lm.evaluate(model, batches, sown=True)
  hidden = [jax.tree.leaves(s)[0] for s in sown]  # (B, N, d) each
  mnn = np.concatenate([np.asarray(_mnn(h)) for h in hidden])
  ent = np.concatenate([np.asarray(_entropy(h)) for h in hidden])
  return {"mnn": float(mnn.mean()), "entropy": float(ent.mean())}


def _seconds(fn, h) -> float:
  times = []
  for _ in range(TIME_CALLS):
    t = time.perf_counter()
    jax.block_until_ready(fn(h))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def timing(widths: Sequence[int], rounds: int) -> list[dict[str, Any]]:
  """Per width and round, log seconds of MNN and matrix entropy.

  Both are jitted and warmed up; within a round the two alternate which
  goes first, so slow phases of a shared machine hit both alike.
  """
  out = []
  for d in widths:
    h = jax.random.normal(jax.random.key(d), (TIME_N, d))
    fns = {"mnn": _mnn, "matrix-entropy": _entropy}
    for fn in fns.values():
      jax.block_until_ready(fn(h))
    for r in range(rounds):
      order = list(fns) if r % 2 == 0 else list(fns)[::-1]
      for name in order:
        out.append(
          {
            "variant": name,
            "seed": r,
            "d": d,
            "log_seconds": math.log(_seconds(fns[name], h)),
          }
        )
  return out


def spearman(a, b) -> float:
  """Spearman rank correlation (no ties expected; NaN for constants)."""
  ra = np.argsort(np.argsort(np.asarray(a)))
  rb = np.argsort(np.argsort(np.asarray(b)))
  if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
    return float("nan")
  return float(np.corrcoef(ra, rb)[0, 1])


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the LMs (skipping finished runs), probes, times, reports."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  quick = tiers.tier(args) == "quick"
  widths = variants(args)
  names = list(widths)
  regime, mnn_claim, speed = claims_for(names)
  rates = {} if quick else {name: RATES for name in widths}
  time_widths = (32,) if quick else TIME_WIDTHS
  rounds = 1 if quick else max(5, len(seeds))

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, widths, seeds, rates)
    batches = _lm.val_batches(base)
    for ln in lines:
      model = runs.trained_line(table, base, tuned["variants"], ln)
      ln.update(probe(model, batches))
    gate = grid.runner_record(
      lines, regime, base, tuned["variants"], baseline_trained=True
    )
    present = gate["verdict"] == "reproduced"
    why = (
      None
      if present
      else "the larger model does not reach a lower loss here, so MNN has "
      f"no size effect to track ({gate['why']})"
    )
    times = timing(time_widths, rounds)
    d = max(time_widths)
    at_d = [t for t in times if t["d"] == d]
    spec = f"Gaussian hidden states, N={TIME_N} x d={d}, jitted, CPU"
    records = [
      gate,
      grid.runner_record(
        lines,
        mnn_claim,
        base,
        tuned["variants"],
        baseline_trained=True,
        testable=present,
        reason=why,
      ),
      grid.claim_record(
        at_d,
        speed,
        baseline_trained=True,
        config={"n": TIME_N, "d": d, "calls": TIME_CALLS, "rounds": rounds},
        setting={
          arm: {"data": spec, "measure": f"median of {TIME_CALLS} calls"}
          for arm in ("a", "b")
        },
        reason="rounds of interleaved calls on a shared CPU, paired by round",
      ),
    ]
    return {
      "claims": records,
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "timing": times,
      "cells": {
        k: grid.cells(lines, k) for k in ("val_loss", "mnn", "entropy")
      },
      "spearman": {
        "mnn_vs_loss": spearman(
          [ln["mnn"] for ln in lines], [ln["val_loss"] for ln in lines]
        ),
        "entropy_vs_loss": spearman(
          [ln["entropy"] for ln in lines], [ln["val_loss"] for ln in lines]
        ),
        "mnn_vs_entropy": spearman(
          [ln["mnn"] for ln in lines], [ln["entropy"] for ln in lines]
        ),
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    lines = result["lines"]
    for ax, key, title in zip(
      axes[:2],
      ("val_loss", "mnn"),
      ("validation loss (nats/byte)", "per-token MNN (D = N)"),
    ):
      c = result["cells"][key]
      w = [widths[n]["width"] for n in c]
      ax.errorbar(w, [c[n]["mean"] for n in c], [c[n]["std"] for n in c],
                  marker="o", capsize=3)  # fmt: skip
      ax.scatter(
        [widths[ln["variant"]]["width"] for ln in lines],
        [ln[key] for ln in lines],
        s=10,
        c="k",
      )
      ax.set_xlabel("width")
      ax.set_ylim(bottom=0)
      ax.set_title(f"{title}, mean ± std")
    t = result["timing"]
    for name in ("mnn", "matrix-entropy"):
      ds = sorted({r["d"] for r in t})
      ms = [
        1e3 * np.exp(np.mean([r["log_seconds"] for r in t
                              if r["variant"] == name and r["d"] == d]))
        for d in ds
      ]  # fmt: skip
      axes[2].plot(ds, ms, "o-", label=name)
    axes[2].set_yscale("log")
    axes[2].set_xlabel(f"d (N = {TIME_N})")
    axes[2].set_ylabel("ms per call (geometric mean over rounds)")
    axes[2].set_title("cost on CPU")
    axes[2].legend()
    report.claims_axes(axes[3], result["claims"])
    fig.suptitle(
      f"Matrix Nuclear-Norm: byte LMs of depth {base.depth}, "
      f"{base.steps} steps, {len(seeds)} seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    cells, rho = result["cells"], result["spearman"]
    out = report.runner_lines(base, seeds)
    out += report.sweep_lines(result["sweeps"]) if result["sweeps"] else []
    out += [
      "## Loss, MNN and matrix entropy per width",
      "",
      f"On the runner's validation windows ({base.eval_batches} batches of "
      f"{base.batch_size} windows of N = {base.seq_len} bytes), hidden "
      "states after the final norm.",
      "",
    ]
    for key, label in (
      ("val_loss", "val loss"),
      ("mnn", "per-token MNN"),
      ("entropy", "matrix entropy"),
    ):
      out += grid.markdown_table(cells[key], label, names[0]) + [""]
    out += [
      f"Spearman over all models: MNN vs loss {rho['mnn_vs_loss']:.2f}, "
      f"matrix entropy vs loss {rho['entropy_vs_loss']:.2f}, MNN vs "
      f"matrix entropy {rho['mnn_vs_entropy']:.2f}.",
      "",
      "## Cost (CPU)",
      "",
      f"Each round times {TIME_CALLS} calls of each (median), the two in "
      "alternating order; geometric mean over rounds. Matrix entropy is an "
      "O(d^3) eigendecomposition, MNN a column-norm reduction plus a "
      "top-D selection.",
      "",
      "| d | MNN (ms) | matrix entropy (ms) | ratio |",
      "|---|---|---|---|",
    ]
    t = result["timing"]
    for d in sorted({r["d"] for r in t}):
      ms = {
        name: 1e3
        * np.exp(
          np.mean(
            [
              r["log_seconds"]
              for r in t
              if r["variant"] == name and r["d"] == d
            ]
          )
        )
        for name in ("mnn", "matrix-entropy")
      }
      out.append(
        f"| {d} | {ms['mnn']:.3f} | {ms['matrix-entropy']:.3f} | "
        f"{ms['matrix-entropy'] / ms['mnn']:.1f}x |"
      )
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
