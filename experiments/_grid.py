"""A grid of runner variants x seeds: one JSON-lines table, spreads, plots.

The claims experiments are thin layers over the experiment engine
(`jaxnorm.training.trainer.train`, what ``jaxnorm-train`` runs): each
variant is a set of `TrainConfig` changes, run once per seed from the same
base config. Every finished run appends one line to ``<name>.jsonl``
(variant, seed, changes, final losses, accuracy, tokens/s, parameters,
steps, early stop); a rerun skips the (variant, seed) pairs already there,
so an interrupted grid resumes where it stopped. Cells report the mean and
the sample standard deviation (``ddof=1``) over seeds. The figure has the
validation loss against steps per variant (mean line, min-max band over
seeds) and a bar chart of the final metric with one-standard-deviation
error bars.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments import _report
from jaxnorm.training import build, metrics, trainer
from jaxnorm.training import config as config_lib

# Summary fields copied into each table line.
_FIELDS = (
  "train_loss",
  "val_loss",
  "val_accuracy",
  "val_bits_per_byte",
  "tokens_per_sec",
  "params",
  "steps",
  "stopped_early",
  "stop_reason",
)


def parser(doc: str, name: str) -> argparse.ArgumentParser:
  """`_report.parser` plus the claims scripts' ``--full`` and ``--runs``."""
  p = _report.parser(doc)
  p.add_argument("--full", action="store_true", help="GPU-sized runs")
  p.add_argument(
    "--runs",
    default=f"runs/claims/{name}",
    help="folder of the run directories and the JSON-lines tables",
  )
  return p


def seeds(args: argparse.Namespace) -> tuple[int, ...]:
  """One seed with ``--quick``, three otherwise."""
  return (0,) if args.quick else (0, 1, 2)


# The claims scripts' byte LM at toy size (--quick) and GPU size (--full).
QUICK_LM = types.MappingProxyType(
  dict(
    width=16,
    depth=1,
    num_heads=2,
    seq_len=16,
    batch_size=4,
    steps=4,
    eval_every=2,
    eval_batches=1,
    warmup_steps=1,
  )
)
FULL_LM = types.MappingProxyType(
  dict(
    width=256,
    depth=8,
    num_heads=8,
    seq_len=256,
    batch_size=32,
    eval_batches=16,
    warmup_steps=200,
  )
)


def byte_lm_config(
  args: argparse.Namespace,
  default: Mapping[str, Any],
  *,
  full_steps: int = 5000,
  full_eval_every: int = 250,
  **fields: Any,
) -> config_lib.TrainConfig:
  """The byte LM of a claims script: `QUICK_LM`, ``default`` or `FULL_LM`.

  ``default`` holds the size and step fields of the default run; ``fields``
  are set in every mode. Logs at every evaluation; no periodic
  checkpoints (the final one is written).
  """
  if args.quick:
    run = dict(QUICK_LM)
  elif args.full:
    run = {**FULL_LM, "steps": full_steps, "eval_every": full_eval_every}
  else:
    run = dict(default)
  return config_lib.TrainConfig(
    **run, log_every=run["eval_every"], checkpoint_every=10**9, **fields
  )


def run_dir(out: pathlib.Path, variant: str, seed: int) -> pathlib.Path:
  """The run directory of one (variant, seed) of the grid tabled in ``out``."""
  return out / "runs" / variant / f"seed{seed}"


def run_grid(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  seeds: Sequence[int],
  *,
  model: Callable[[str, int], Any] | None = None,
) -> list[dict[str, Any]]:
  """Trains every (variant, seed) not yet in ``table``; returns all lines.

  Args:
    table: the JSON-lines file; its folder also holds the run directories.
    base: the shared config (its ``seed`` and ``out_dir`` are replaced).
    variants: name -> `TrainConfig` field changes.
    seeds: the seeds every variant runs with.
    model: ``(variant, seed) -> nnx.Module`` for a model built outside the
      runner's registries (trained as ``trainer.train(cfg, model=...)``);
      ``None`` lets the runner build each variant's config.

  Raises:
    ValueError: a variant's config is invalid (names the variant and the
      valid choices), before anything trains.
  """
  configs = {}
  for name, changes in variants.items():
    try:
      cfg = dataclasses.replace(base, **changes)
      config_lib.validate(cfg, build.registries_for(cfg))
    except (TypeError, ValueError) as e:
      raise ValueError(f"variant {name!r}: {e}") from e
    configs[name] = cfg
  table.parent.mkdir(parents=True, exist_ok=True)
  lines = read_table(table)
  done = {(ln["variant"], ln["seed"]) for ln in lines}
  for name, cfg in configs.items():
    for seed in seeds:
      if (name, seed) in done:
        continue
      out_dir = run_dir(table.parent, name, seed)
      summary = trainer.train(
        dataclasses.replace(
          cfg, seed=seed, out_dir=str(out_dir), progress=False, resume=False
        ),
        model=None if model is None else model(name, seed),
      )
      line = {
        "variant": name,
        "seed": seed,
        "changes": {k: _plain(v) for k, v in variants[name].items()},
        **{k: summary.get(k) for k in _FIELDS},
      }
      with table.open("a") as f:
        f.write(json.dumps(line) + "\n")
      lines.append(line)
  return lines


def _plain(v: Any) -> Any:
  return list(v) if isinstance(v, tuple) else v


def read_table(table: pathlib.Path) -> list[dict[str, Any]]:
  """The lines of a grid table (empty when it does not exist)."""
  if not table.exists():
    return []
  return [json.loads(ln) for ln in table.read_text().splitlines() if ln]


def cells(
  lines: Sequence[Mapping[str, Any]], metric: str
) -> dict[str, dict[str, Any]]:
  """Per variant, in first-seen order: mean, std (ddof=1), n, the values."""
  values: dict[str, list[float]] = {}
  for ln in lines:
    values.setdefault(ln["variant"], []).append(float(ln[metric]))
  out = {}
  for name, vs in values.items():
    mean, std = _report.mean_spread(vs)
    out[name] = {"mean": mean, "std": std, "n": len(vs), "values": vs}
  return out


def fmt(cell: Mapping[str, Any], digits: int = 3) -> str:
  """``mean ± std (n=k)``."""
  return f"{cell['mean']:.{digits}f} ± {cell['std']:.{digits}f} (n={cell['n']})"


def markdown_table(
  grid: Mapping[str, Mapping[str, Any]],
  metric_label: str,
  baseline: str | None = None,
) -> list[str]:
  """A Markdown table of the cells, with the difference to ``baseline``."""
  head = f"| variant | {metric_label} (mean ± std over seeds) |"
  rule = "|---|---|"
  if baseline is not None:
    head += f" vs {baseline} |"
    rule += "---|"
  rows = [head, rule]
  for name, cell in grid.items():
    row = f"| {name} | {fmt(cell)} |"
    if baseline is not None:
      row += f" {cell['mean'] - grid[baseline]['mean']:+.3f} |"
    rows.append(row)
  return rows


def figure(
  table: pathlib.Path,
  lines: Sequence[Mapping[str, Any]],
  metric: str,
  path: pathlib.Path,
  title: str,
) -> None:
  """Validation curves with seed bands, and a bar chart of ``metric``."""
  plt = _report.pyplot()
  fig, (ax_curve, ax_bar) = plt.subplots(1, 2, figsize=(12, 4.5))
  by_variant: dict[str, list[list[tuple[int, float]]]] = {}
  for ln in lines:
    log = metrics.read_log(
      run_dir(table.parent, ln["variant"], ln["seed"]) / "metrics.jsonl"
    )
    curve = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    by_variant.setdefault(ln["variant"], []).append(curve)
  for name, curves in by_variant.items():
    n = min(len(c) for c in curves)
    if n == 0:
      continue
    steps = [s for s, _ in curves[0][:n]]
    vals = np.array([[v for _, v in c[:n]] for c in curves])
    (line,) = ax_curve.plot(steps, vals.mean(0), label=name)
    ax_curve.fill_between(
      steps, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2
    )
  ax_curve.set_xlabel("step")
  ax_curve.set_ylabel("validation loss (nats)")
  ax_curve.legend(fontsize=7)
  grid = cells(lines, metric)
  names = list(grid)
  ax_bar.bar(
    range(len(names)),
    [grid[n]["mean"] for n in names],
    yerr=[grid[n]["std"] for n in names],
    capsize=3,
  )
  ax_bar.set_xticks(range(len(names)), names, rotation=45, ha="right")
  ax_bar.set_ylabel(f"final {metric}")
  lo = min(grid[n]["mean"] - grid[n]["std"] for n in names)
  hi = max(grid[n]["mean"] + grid[n]["std"] for n in names)
  ax_bar.set_ylim(lo - 0.1 * (hi - lo + 1e-9), hi + 0.1 * (hi - lo + 1e-9))
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def verdict(
  grid: Mapping[str, Mapping[str, Any]],
  variant: str,
  reference: str,
  claim: str,
  tolerance: float = 0.0,
) -> tuple[str, str]:
  """The verdict on "``variant`` is lower than / equal to ``reference``".

  The difference of means ``d`` is judged against its standard error
  ``se = sqrt(s_a^2 / n_a + s_b^2 / n_b)``. ``claim="lower"``: reproduced
  when ``d < -2 se``, not reproduced when ``d > 2 se``, else inconclusive.
  ``claim="equal"``: reproduced when ``|d| <= max(2 se, tolerance)``, else
  not reproduced at this scale.

  Returns:
    The verdict and a one-line account (``d`` and ``se``).
  """
  a, b = grid[variant], grid[reference]
  d = a["mean"] - b["mean"]
  se = float(np.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"]))
  why = f"{variant} - {reference} = {d:+.4f} (se {se:.4f})"
  if claim == "lower":
    if d < -2 * se:
      return "reproduced", why
    if d > 2 * se:
      return "not reproduced at this scale", why
    return "inconclusive", why
  if claim == "equal":
    if abs(d) <= max(2 * se, tolerance):
      return "reproduced", why
    return "not reproduced at this scale", why
  raise ValueError(f"verdict: claim must be 'lower' or 'equal', got {claim!r}")


def verdict_table(
  verdicts: Sequence[Mapping[str, Any]], columns: Sequence[str] = ()
) -> list[str]:
  """Markdown rows: claim, the extra ``columns``, bold verdict, evidence."""
  head = ["claim", *columns, "verdict", "evidence"]
  rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for v in verdicts:
    cells = [
      v["claim"],
      *(str(v[c]) for c in columns),
      f"**Verdict: {v['verdict']}**",
      v["why"],
    ]
    rows.append("| " + " | ".join(cells) + " |")
  return rows
