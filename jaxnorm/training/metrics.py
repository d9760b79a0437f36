"""Metrics as JSON lines, a TensorBoard sink, progress, plots and tables.

Records are strict JSON: a non-finite number is written as ``null`` (the
NaN guard of the trainer decides what a non-finite step means). A
multi-process run has one log, ``metrics.jsonl``, written by process 0; the
other processes keep their records in memory unless asked to write their
own file.
"""

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
  uninterrupted run. Each record is also passed to every sink (e.g.
  `TensorBoardSink`). With ``path=None`` nothing is written: the records of
  this session are only kept in memory (`records`).
  """

  def __init__(
    self,
    path: pathlib.Path | None,
    *,
    truncate_after: int = 0,
    sinks: Sequence[Any] = (),
  ):
    self.path = None if path is None else pathlib.Path(path)
    self.sinks = list(sinks)
    self._kept: list[dict[str, Any]] = []
    if self.path is None:
      return
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
    """Appends ``record`` (must contain ``step``); NaN/inf become null."""
    record = finite_or_null(record)
    if self.path is None:
      self._kept.append(record)
    else:
      with self.path.open("a") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
    for sink in self.sinks:
      sink.write(record)

  def records(self) -> list[dict[str, Any]]:
    """Every record of the file (earlier sessions' too), or those kept."""
    return list(self._kept) if self.path is None else read_log(self.path)

  def close(self) -> None:
    """Closes the sinks."""
    for sink in self.sinks:
      sink.close()


def finite_or_null(record: dict[str, Any]) -> dict[str, Any]:
  """``record`` with non-finite floats replaced by None (JSON null)."""
  return {
    k: None if isinstance(v, float) and not math.isfinite(v) else v
    for k, v in record.items()
  }


class TensorBoardSink:
  """Writes every numeric field of each record as a TensorBoard scalar.

  Needs the ``tensorboardX`` package (checked by the config validation).
  """

  def __init__(self, log_dir: pathlib.Path):
    import tensorboardX

    self._writer = tensorboardX.SummaryWriter(str(log_dir))

  def write(self, record: dict[str, Any]) -> None:
    """Adds the record's numbers at its ``step``."""
    for k, v in record.items():
      if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
        self._writer.add_scalar(k, v, record["step"])

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._writer.close()


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

  def update(
    self, step: int, *, loss: float, tokens_per_sec: float | None
  ) -> None:
    """Moves the bar to ``step``."""
    self._bar.update(step - self._bar.n)
    speed = "-" if tokens_per_sec is None else f"{tokens_per_sec:,.0f}"
    self._bar.set_postfix(loss=f"{loss:.3f}", tok_s=speed)

  def close(self) -> None:
    """Finishes the bar."""
    self._bar.close()


def _median(values: Sequence[float]) -> float:
  return sorted(values)[len(values) // 2] if values else math.nan


def summarize(
  records: Sequence[dict[str, Any]],
  *,
  config: dict[str, Any],
  num_params: int,
  baseline: float | None,
  kind: str,
  steps: int,
  stop_reason: str | None,
) -> dict[str, Any]:
  """Final numbers of a run from its metrics file.

  Args:
    records: the run's metric records (`MetricsLog.records`).
    config: the run's config (stored as is).
    num_params: parameter count.
    baseline: the loss (nats) of the trivial predictor: unigram entropy for
      a language model, ``log(classes)`` for a classifier.
    kind: ``lm`` or ``classify``.
    steps: the last step the run completed.
    stop_reason: ``preempted`` or ``nonfinite`` for an early stop, else
      None.

  Returns:
    Losses in nats; for ``lm`` also ``val_bits_per_byte`` and
    ``baseline_bits_per_byte`` (nats / ln 2). ``tokens_per_sec`` is the
    median over records of training-step time only (no compilation,
    evaluation or checkpointing), counting the tokens of every process.
  """
  train = [r for r in records if r.get("loss") is not None]
  val = [r for r in records if r.get("val_loss") is not None]
  speeds = [r["tokens_per_sec"] for r in train if r.get("tokens_per_sec")]
  summary: dict[str, Any] = {
    "config": config,
    "steps": steps,
    "params": num_params,
    "train_loss": train[-1]["loss"] if train else math.nan,
    "val_loss": val[-1]["val_loss"] if val else math.nan,
    "val_accuracy": val[-1]["val_accuracy"] if val else math.nan,
    "tokens_per_sec": _median(speeds),
    "baseline": baseline,
    "kind": kind,
    "stopped_early": stop_reason is not None,
    "stop_reason": stop_reason,
  }
  if kind == "lm":
    summary["val_bits_per_byte"] = summary["val_loss"] / math.log(2)
    summary["baseline_bits_per_byte"] = (
      None if baseline is None else baseline / math.log(2)
    )
  return summary


def write_summary(path: pathlib.Path, summary: dict[str, Any]) -> None:
  """Writes the summary as strict JSON (NaN becomes null)."""
  clean = {
    k: finite_or_null(v) if isinstance(v, dict) else v
    for k, v in finite_or_null(summary).items()
  }
  pathlib.Path(path).write_text(
    json.dumps(clean, indent=2, allow_nan=False) + "\n"
  )


def summary_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
  """A Markdown table comparing run summaries (one row per variant).

  Losses are in nats; the baseline column gives the trivial predictor's
  loss in the same unit, and for language models the bits-per-byte column
  gives both the model's and the baseline's bits per byte.
  """
  head = (
    "| run | params | steps | train loss (nats) | val loss (nats) | "
    "baseline loss (nats) | val bits/byte (baseline) or accuracy | "
    "tokens/s |"
  )
  lines = [head, "|---|---|---|---|---|---|---|---|"]
  for name, s in rows:
    if s["kind"] == "lm":
      base = s.get("baseline_bits_per_byte")
      quality = f"{s['val_bits_per_byte']:.3f}" + (
        "" if base is None else f" ({base:.3f} unigram)"
      )
    else:
      quality = f"{100 * s['val_accuracy']:.1f}%"
    baseline = (
      ""
      if s["baseline"] is None
      else f"{s['baseline']:.3f}"
      + (" (unigram)" if s["kind"] == "lm" else " (uniform)")
    )
    lines.append(
      f"| {name} | {s['params']:,} | {s['steps']} | {s['train_loss']:.3f} "
      f"| {s['val_loss']:.3f} | {baseline} | {quality} | "
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
  """One train curve (solid) and validation curve (dots) per run.

  Draws on a bare `matplotlib.figure.Figure` (no pyplot, no backend
  switch), so a notebook's inline plots keep working after a run.
  """
  from matplotlib.figure import Figure

  fig = Figure(figsize=(7, 4.5), dpi=120)
  ax = fig.subplots()
  for i, (name, path) in enumerate(runs):
    records = read_log(path)
    color = f"C{i % 10}"
    train = [
      (r["step"], r["loss"]) for r in records if r.get("loss") is not None
    ]
    val = [
      (r["step"], r["val_loss"])
      for r in records
      if r.get("val_loss") is not None
    ]
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
