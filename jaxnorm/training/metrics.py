"""Metrics as JSON lines, a progress bar, plots and summary tables."""

from __future__ import annotations

import json
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import tqdm


class MetricsLog:
  """Appends one JSON object per line; resuming drops records past a step.

  A run killed after its last checkpoint has logged steps that the resumed
  run will redo; ``truncate_after`` removes them so the file reads as one
  uninterrupted run.
  """

  def __init__(self, path: pathlib.Path, *, truncate_after: int = 0):
    self.path = pathlib.Path(path)
    if truncate_after == 0:
      self.path.write_text("")
    elif self.path.exists():
      kept = [
        line
        for line in self.path.read_text().splitlines()
        if line and json.loads(line)["step"] <= truncate_after
      ]
      self.path.write_text("".join(line + "\n" for line in kept))

  def write(self, record: dict[str, Any]) -> None:
    """Appends ``record`` (must contain ``step``)."""
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")


def read_log(path: pathlib.Path) -> list[dict[str, Any]]:
  """All records of a metrics file."""
  return [
    json.loads(line)
    for line in pathlib.Path(path).read_text().splitlines()
    if line
  ]


class Progress:
  """A tqdm bar showing loss and tokens/s; silent when disabled."""

  def __init__(self, total: int, *, initial: int = 0, enabled: bool = True):
    self._bar = tqdm.tqdm(
      total=total,
      initial=initial,
      disable=not enabled,
      unit="step",
      dynamic_ncols=True,
      file=sys.stderr,
    )

  def update(self, step: int, *, loss: float, tokens_per_sec: float) -> None:
    """Moves the bar to ``step``."""
    self._bar.update(step - self._bar.n)
    self._bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_sec:,.0f}")

  def close(self) -> None:
    """Finishes the bar."""
    self._bar.close()


def summarize(
  path: pathlib.Path,
  *,
  config: dict[str, Any],
  num_params: int,
  baseline: float | None,
  kind: str,
  stopped_early: bool,
) -> dict[str, Any]:
  """Final numbers of a run from its metrics file."""
  records = read_log(path)
  train = [r for r in records if "loss" in r]
  val = [r for r in records if "val_loss" in r]
  speeds = [r["tokens_per_sec"] for r in train[1:]] or [
    r["tokens_per_sec"] for r in train
  ]
  summary: dict[str, Any] = {
    "config": config,
    "steps": train[-1]["step"] if train else 0,
    "params": num_params,
    "train_loss": train[-1]["loss"] if train else math.nan,
    "val_loss": val[-1]["val_loss"] if val else math.nan,
    "val_accuracy": val[-1]["val_accuracy"] if val else math.nan,
    "tokens_per_sec": sorted(speeds)[len(speeds) // 2] if speeds else math.nan,
    "baseline": baseline,
    "kind": kind,
    "stopped_early": stopped_early,
  }
  if kind == "lm":
    summary["val_bits_per_byte"] = summary["val_loss"] / math.log(2)
  return summary


def write_summary(path: pathlib.Path, summary: dict[str, Any]) -> None:
  """Writes the summary as JSON."""
  pathlib.Path(path).write_text(json.dumps(summary, indent=2) + "\n")


def summary_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
  """A Markdown table comparing run summaries (one row per variant)."""
  head = (
    "| run | params | steps | train loss | val loss | val bits/byte "
    "or acc | baseline | tokens/s |"
  )
  lines = [head, "|---|---|---|---|---|---|---|---|"]
  for name, s in rows:
    quality = (
      f"{s['val_bits_per_byte']:.3f} b/B"
      if s["kind"] == "lm"
      else f"{100 * s['val_accuracy']:.1f}%"
    )
    baseline = (
      ""
      if s["baseline"] is None
      else f"{s['baseline']:.3f}"
      + (" (unigram)" if s["kind"] == "lm" else " (uniform)")
    )
    lines.append(
      f"| {name} | {s['params']:,} | {s['steps']} | {s['train_loss']:.3f} "
      f"| {s['val_loss']:.3f} | {quality} | {baseline} | "
      f"{s['tokens_per_sec']:,.0f} |"
    )
  return "\n".join(lines)


def plot_run(
  path: pathlib.Path,
  out: pathlib.Path,
  *,
  title: str,
  baseline: float | None,
  baseline_label: str = "baseline",
) -> None:
  """Train and validation loss against step."""
  plot_runs(
    [(None, path)],
    out,
    title=title,
    baseline=baseline,
    baseline_label=baseline_label,
  )


def plot_runs(
  runs: Sequence[tuple[str | None, pathlib.Path]],
  out: pathlib.Path,
  *,
  title: str,
  baseline: float | None,
  baseline_label: str = "baseline",
) -> None:
  """One train curve (solid) and validation curve (dots) per run."""
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
  for i, (name, path) in enumerate(runs):
    records = read_log(path)
    color = f"C{i % 10}"
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    label = f"{name} " if name else ""
    if train:
      ax.plot(*zip(*train), color=color, lw=1.2, label=f"{label}train")
    if val:
      ax.plot(*zip(*val), "o--", color=color, ms=4, label=f"{label}val")
  if baseline is not None:
    ax.axhline(baseline, color="gray", ls=":", label=baseline_label)
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out)
  plt.close(fig)
