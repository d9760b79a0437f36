"""The plain claims script: one tuned grid, its claims, the standard report.

Most claims scripts train one grid of variants (`grid.tuned_grid`: each
variant at its tuned learning rate, then every seed), judge their claims
on its lines and report the same way. `tuned` is that script's ``main``
once the script has named its config, variants, rates and claims; the
scripts with several grids, probes or parents join the same pieces
themselves.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments._harness import grid, report, tiers
from jaxnorm.training import config as config_lib


@dataclasses.dataclass(frozen=True)
class Table:
  """One Markdown table of the report: a grid-line metric over seeds.

  Attributes:
    metric: the grid lines' key, e.g. ``"val_loss"``.
    heading: the section heading, e.g. ``"Validation loss"``.
    label: the column label, e.g. ``"val loss"``.
  """

  metric: str
  heading: str
  label: str


VAL_LOSS = Table("val_loss", "Validation loss", "val loss")
VAL_ACCURACY = Table("val_accuracy", "Validation accuracy", "val accuracy")


def tuned(
  name: str,
  doc: str,
  args: argparse.Namespace,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  learning_rates: Mapping[str, Sequence[float]],
  records: Callable[
    [list[dict[str, Any]], Mapping[str, Mapping[str, Any]]], list[dict]
  ],
  *,
  title: str,
  baseline: str,
  tables: Sequence[Table] = (VAL_LOSS,),
  notes: Sequence[str] = (),
  model: Callable[[str, int], Any] | None = None,
) -> dict:
  """Trains the tuned grid (skipping finished runs) and writes the report.

  Args:
    name: the script's name: ``<args.out>/<name>.{json,png,md}``.
    doc: the script's docstring (its first line titles the report).
    args: the parsed `tiers.parser` flags; the grid's table is
      ``<args.runs>/grid.jsonl``.
    base: the config every variant changes.
    variants: variant name -> `TrainConfig` field changes.
    learning_rates: variant -> the rates its sweep tries (`grid.sweep`);
      none at the quick tier, which checks the pipeline at the base rate.
    records: ``(lines, tuned_variants) -> claim records``, the tuned
      variants being ``variants`` with each one's chosen learning rate.
    title: the figure's title; the number of seeds is appended.
    baseline: the variant the tables compare against.
    tables: the report's tables; the first one's metric is the figure's.
    notes: Markdown lines after the runner config (what the config does
      not say about the arms).
    model: ``(variant, seed) -> nnx.Module`` for arms built outside the
      runner's registry (`grid.run_grid`).

  Returns:
    The result written to ``<name>.json``: ``claims``, ``sweeps``, the tuned
    ``variants``, the grid ``lines`` and one cell table per ``tables``
    metric.
  """
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  rates = {} if tiers.tier(args) == "quick" else learning_rates

  def compute() -> dict:
    lines, tuned_grid = grid.tuned_grid(
      table, base, variants, seeds, rates, model=model
    )
    return {
      "claims": records(lines, tuned_grid["variants"]),
      "sweeps": tuned_grid["sweeps"],
      "variants": tuned_grid["variants"],
      "lines": lines,
      **{t.metric: grid.cells(lines, t.metric) for t in tables},
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      tables[0].metric,
      path,
      f"{title} ({len(seeds)} seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds) + list(notes)
    lines += report.sweep_lines(result["sweeps"])
    for t in tables:
      lines += [f"## {t.heading}", ""]
      lines += grid.markdown_table(result[t.metric], t.label, baseline)
      lines.append("")
    return lines

  return report.run(name, doc, args, compute, figure, markdown)
