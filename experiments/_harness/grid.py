"""A grid of runner variants x seeds: one JSON-lines table, spreads, plots.

The claims experiments are thin layers over the experiment engine
(`jaxnorm.training.trainer.train`, what ``jaxnorm-train`` runs): each
variant is a set of `TrainConfig` changes, run once per seed from the same
base config. Every finished run appends one line to ``<name>.jsonl``
(variant, seed, changes, final losses, accuracy, tokens/s, parameters,
steps, early stop, wall time, commit, config); a rerun skips the
(variant, seed) pairs already there, so an interrupted grid resumes where
it stopped (and refuses lines that trained another config).
Cells report the mean and the sample standard deviation (``ddof=1``) over
seeds, and keep the values by seed. Verdicts come from
`jaxnorm.training.claims`: `claim_record` pairs a claim's variant and
baseline seed by seed and writes its record (paired t interval, verdict,
provenance). The figure has the validation loss against steps per variant
(mean line, min-max band over seeds) and a bar chart of the final metric
with one-standard-deviation error bars.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments._harness import report as _report
from jaxnorm.nn import model_registry
from jaxnorm.training import build, claims, metrics, trainer
from jaxnorm.training import config as config_lib

# How many geometric steps a learning-rate sweep may add beyond an end of
# its grid (a factor of 3^4 = 81 with the scripts' x3 grids); a best rate
# still at an end after them is reported as "at the grid's end".
EXTEND = 4

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


def run_dir(out: pathlib.Path, variant: str, seed: int) -> pathlib.Path:
  """The run directory of one (variant, seed) of the grid tabled in ``out``."""
  return out / "runs" / variant / f"seed{seed}"


def run_name(line: Mapping[str, Any]) -> str:
  """A grid line's run: its ``run`` (`fixed_rate_grid`), else its variant."""
  return line.get("run", line["variant"])


def run_grid(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  seeds: Sequence[int],
  *,
  model: Callable[[str, int], Any] | None = None,
  train: Callable[[str, config_lib.TrainConfig], Mapping[str, Any]]
  | None = None,
) -> list[dict[str, Any]]:
  """Trains every (variant, seed) not yet in ``table``; returns all lines.

  Each line also holds ``seconds``, the run's wall time, and ``commit``,
  the code it trained with (`claims.commit`); the table's line also keeps
  ``config``, the run's config less `config_lib.RUN_CONTROL`. Lines
  written before these fields existed lack them. A table line of one of
  ``variants`` whose ``config`` differs from the config it would train now
  (another tier, base config or code default) is an error, not a finished
  run.

  Args:
    table: the JSON-lines file; its folder also holds the run directories.
    base: the shared config (its ``seed`` and ``out_dir`` are replaced).
    variants: name -> `TrainConfig` field changes.
    seeds: the seeds every variant runs with.
    model: ``(variant, seed) -> nnx.Module`` for a model built outside the
      runner's registries (trained as ``trainer.train(cfg, model=...)``);
      ``None`` lets the runner build each variant's config.
    train: ``(variant, cfg) -> fields`` for an objective the runner does
      not train (a loop of the script's own; ``cfg`` carries the seed,
      run directory and the variant's changes); every returned field goes
      into the line. ``None``: the runner trains, and the line holds its
      summary's fields.

  Raises:
    ValueError: a variant's config is invalid for the runner (names the
      variant and the valid choices), before anything trains; or both
      ``model`` and ``train``.
  """
  if model is not None and train is not None:
    raise ValueError("run_grid: pass model= or train=, not both")
  configs = {}
  for name, changes in variants.items():
    try:
      cfg = dataclasses.replace(base, **changes)
      if train is None:
        config_lib.validate(cfg, build.registries_for(cfg))
    except (TypeError, ValueError) as e:
      raise ValueError(f"variant {name!r}: {e}") from e
    configs[name] = cfg
  table.parent.mkdir(parents=True, exist_ok=True)
  lines = read_table(table)
  for ln in lines:
    _check_resumed(table, ln, configs)
  done = {(ln["variant"], ln["seed"]) for ln in lines}
  code = claims.commit()
  for name, cfg in configs.items():
    for seed in seeds:
      if (name, seed) in done:
        continue
      out_dir = run_dir(table.parent, name, seed)
      run = dataclasses.replace(
        cfg, seed=seed, out_dir=str(out_dir), progress=False, resume=False
      )
      start = time.time()
      if train is None:
        summary = trainer.train(
          run, model=None if model is None else model(name, seed)
        )
        fields = {k: summary.get(k) for k in _FIELDS}
      else:
        fields = dict(train(name, run))
      line = {
        "variant": name,
        "seed": seed,
        "changes": {k: _plain(v) for k, v in variants[name].items()},
        **fields,
        "seconds": round(time.time() - start, 1),
        "commit": code,
      }
      saved = {**line, "config": _run_config(run)}
      with table.open("a") as f:
        f.write(json.dumps(saved) + "\n")
      lines.append(line)
  return [{k: v for k, v in ln.items() if k != "config"} for ln in lines]


def _run_config(cfg: config_lib.TrainConfig) -> dict[str, Any]:
  """What a table line keeps of its run's config: all but run control."""
  return {
    k: v
    for k, v in config_lib.to_json(config_lib.resolve(cfg)).items()
    if k not in config_lib.RUN_CONTROL
  }


def _check_resumed(
  table: pathlib.Path,
  line: Mapping[str, Any],
  configs: Mapping[str, config_lib.TrainConfig],
) -> None:
  """Raises if a table's line trained another config than its variant's."""
  saved, cfg = line.get("config"), configs.get(line["variant"])
  if saved is None or cfg is None:
    return
  changed = config_lib.drift(saved, dataclasses.replace(cfg, seed=line["seed"]))
  if changed:
    raise ValueError(
      f"run_grid: {table} holds variant {line['variant']!r} seed "
      f"{line['seed']} trained with another config ({'; '.join(changed)}); "
      "train into another table (--runs) or remove that line"
    )


def tuned_grid(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  seeds: Sequence[int],
  learning_rates: Mapping[str, Sequence[float]],
  *,
  select: str = "train_loss",
  extend: int = EXTEND,
  model: Callable[[str, int], Any] | None = None,
  train: Callable[[str, config_lib.TrainConfig], Mapping[str, Any]]
  | None = None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
  """Each variant at the learning rate that trains it best, then every seed.

  The first seed runs every learning rate of a variant's grid (runs named
  ``<variant>@lr=<lr>``); the rate with the lowest final ``select`` is
  chosen. ``select`` is the training loss by default: a split other than
  the validation data the claims report. A best rate at an end of the grid
  extends the grid by its next geometric step on that side (at most
  ``extend`` times), so the chosen rate lies inside the grid whenever the
  extensions find a minimum. The other seeds then run at the chosen rate.

  Args:
    table: the JSON-lines file (`run_grid`).
    base: the shared config.
    variants: name -> `TrainConfig` changes (no ``learning_rate``).
    seeds: the seeds; the first one sweeps.
    learning_rates: name -> increasing learning rates (two or more, a
      geometric grid); a variant not in it keeps ``base``'s rate.
    select: the summary key that picks the rate (lower is better).
    extend: at most this many extensions of a grid.
    model: as in `run_grid`, called with the variant's name.
    train: as in `run_grid`, called with the variant's name (its
      ``select`` field picks the rate).

  Returns:
    The lines of every variant at its chosen rate, named by the variant
    (``run``: the run's name, ``<variant>@lr=<rate>``), and
    ``{"variants": ..., "sweeps": ...}``: the changes each variant ran with
    (its chosen ``learning_rate`` added; what `runner_record` takes)
    and per swept variant ``learning_rate``, ``grid`` (``{rate:
    select}``), ``select`` and ``inside`` (the chosen rate is not an end
    of the final grid).

  Raises:
    ValueError: a grid with fewer than two rates or not increasing, a
      variant that sets ``learning_rate``, or `run_grid`'s errors.
  """
  chosen: dict[str, dict[str, Any]] = {}
  tuned = {}
  for name, changes in variants.items():
    if "learning_rate" in changes:
      raise ValueError(
        f"tuned_grid: variant {name!r} sets learning_rate; the sweep sets it"
      )
    rates = learning_rates.get(name, ())
    if not rates:
      tuned[name] = dict(changes)
      continue

    def score(lr: float, name: str = name, changes=changes) -> float:
      arm = {name: {**changes, "learning_rate": lr}}
      lines = fixed_rate_grid(
        table, base, arm, seeds[:1], model=model, train=train
      )
      return _score(lines, name, seeds[0], select)

    chosen[name] = {
      **sweep(score, rates, extend=extend, who=f"tuned_grid: {name!r}"),
      "select": select,
    }
    best = chosen[name]["learning_rate"]
    tuned[name] = {**changes, "learning_rate": best}
  out = fixed_rate_grid(table, base, tuned, seeds, model=model, train=train)
  return out, {"variants": tuned, "sweeps": chosen}


def fixed_rate_grid(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  arms: Mapping[str, Mapping[str, Any]],
  seeds: Sequence[int],
  *,
  model: Callable[[str, int], Any] | None = None,
  train: Callable[[str, config_lib.TrainConfig], Mapping[str, Any]]
  | None = None,
) -> list[dict[str, Any]]:
  """`run_grid` of arms at fixed rates, run and named as `tuned_grid`'s.

  An arm whose changes set ``learning_rate`` runs as ``<arm>@lr=<rate>``
  (so another rate is another run, and a `tuned_grid` run at that rate is
  reused); an arm without one runs under its own name. The lines of
  ``seeds`` come back named by the arm, ``run`` the run's name; ``model``
  and ``train`` are called with the arm's name.
  """
  runs, names = {}, {}
  for name, changes in arms.items():
    rate = changes.get("learning_rate")
    run = name if rate is None else f"{name}@lr={rate:g}"
    runs[run], names[run] = dict(changes), name
  lines = run_grid(
    table,
    base,
    runs,
    seeds,
    model=None if model is None else lambda r, s: model(names[r], s),
    train=None if train is None else lambda r, cfg: train(names[r], cfg),
  )
  return [
    {**ln, "variant": names[ln["variant"]], "run": ln["variant"]}
    for ln in lines
    if ln["variant"] in names and ln["seed"] in seeds
  ]


def sweep(
  score: Callable[[float], float],
  rates: Sequence[float],
  *,
  extend: int = EXTEND,
  higher: bool = False,
  who: str = "sweep",
) -> dict[str, Any]:
  """The learning rate with the best ``score``, inside its geometric grid.

  Every rate of ``rates`` is scored once; a best rate at an end of the
  grid extends it by its next geometric step on that side (``r0^2 / r1``
  below, ``r[-1]^2 / r[-2]`` above), at most ``extend`` times, so the
  choice lies inside the grid whenever the extensions find a minimum.
  `tuned_grid` sweeps runner grids with it; an experiment with its own
  training loop passes its own ``score``.

  Args:
    score: ``score(rate)``, the selection value of a rate (computed on a
      split other than the reported one); non-finite values lose.
    rates: two or more increasing rates.
    extend: at most this many extensions.
    higher: a higher score is better (default: lower).
    who: the caller, for the error message.

  Returns:
    ``learning_rate`` (the best), ``grid`` (``{"<rate>": score}``, sorted)
    and ``inside`` (the best is not an end of the final grid).

  Raises:
    ValueError: ``rates`` has fewer than two rates or is not increasing.
  """
  grid = list(rates)
  if len(grid) < 2 or any(b <= a for a, b in zip(grid, grid[1:])):
    raise ValueError(
      f"{who}: the learning rates must be two or more, increasing, got {grid}"
    )
  sign = -1.0 if higher else 1.0
  scores: dict[float, float] = {}

  def key(lr: float) -> float:
    v = scores[lr]
    return sign * v if np.isfinite(v) else float("inf")

  for _ in range(extend + 1):
    for lr in grid:
      if lr not in scores:
        scores[lr] = float(score(lr))
    best = min(grid, key=key)
    if best == grid[0]:
      grid.insert(0, grid[0] ** 2 / grid[1])
    elif best == grid[-1]:
      grid.append(grid[-1] ** 2 / grid[-2])
    else:
      break
  best = min(scores, key=key)
  return {
    "learning_rate": best,
    "grid": {f"{lr:g}": scores[lr] for lr in sorted(scores)},
    "inside": min(scores) < best < max(scores),
  }


def _score(
  lines: Sequence[Mapping[str, Any]], variant: str, seed: int, key: str
) -> float:
  line = next(
    ln for ln in lines if ln["variant"] == variant and ln["seed"] == seed
  )
  value = line.get(key)
  if line.get("stop_reason") == "nonfinite" or value is None:
    return float("inf")  # A run that diverged loses, whatever it logged.
  return value


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
  """Per variant, in first-seen order: mean, std (ddof=1), n, the values.

  When every line of a variant has a ``seed`` (as `run_grid`'s do), its
  values are in seed order and ``seeds`` lists them, so that `paired` can
  match two variants seed by seed.
  """
  by_variant: dict[str, list[Mapping[str, Any]]] = {}
  for ln in lines:
    by_variant.setdefault(ln["variant"], []).append(ln)
  out = {}
  for name, lns in by_variant.items():
    seeded = all("seed" in ln for ln in lns)
    if seeded:
      lns = sorted(lns, key=lambda ln: ln["seed"])
    vs = [float(ln[metric]) for ln in lns]
    mean, std = _report.mean_spread(vs)
    out[name] = {"mean": mean, "std": std, "n": len(vs), "values": vs}
    if seeded:
      out[name]["seeds"] = [ln["seed"] for ln in lns]
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


def val_curves(
  table: pathlib.Path, lines: Sequence[Mapping[str, Any]]
) -> dict[str, list[list[tuple[int, float]]]]:
  """Each variant's ``(step, val_loss)`` logs (`report.curves_axes`)."""
  out: dict[str, list[list[tuple[int, float]]]] = {}
  for ln in lines:
    log = metrics.read_log(
      run_dir(table.parent, run_name(ln), ln["seed"]) / "metrics.jsonl"
    )
    curve = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    out.setdefault(ln["variant"], []).append(curve)
  return out


def figure(
  table: pathlib.Path,
  lines: Sequence[Mapping[str, Any]],
  metric: str,
  path: pathlib.Path,
  title: str,
  records: Sequence[Mapping[str, Any]] = (),
) -> None:
  """Validation curves, ``metric`` per variant, and the claims' differences.

  Left: validation loss against steps (mean over seeds, min-max band).
  Middle: the final ``metric`` per variant (mean, one-std error bars) on
  an axis from 0. Right, with ``records``: `report.claims_axes`.
  """
  plt = _report.pyplot()
  panels = 3 if records else 2
  fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
  ax_curve, ax_bar = axes[0], axes[1]
  _report.curves_axes(ax_curve, val_curves(table, lines))
  _report.cells_bars(ax_bar, cells(lines, metric))
  ax_bar.set_ylabel(f"final {metric}")
  ax_bar.set_ylim(bottom=0)
  ax_bar.set_title(f"final {metric} (mean ± std)")
  if records:
    _report.claims_axes(axes[2], records)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def paired(
  a: Mapping[str, Any], b: Mapping[str, Any]
) -> tuple[list[Any], list[float], list[float]]:
  """Two `cells` entries matched seed by seed: seeds, a's and b's values.

  With ``seeds`` in both cells, the seeds they share, in increasing order
  (a seed that one variant lacks, e.g. a run filtered out, is left out).
  Cells without seeds (values measured in the same rounds, or built by
  hand) are matched by position, labelled ``"#0"``, ``"#1"``, ...

  Raises:
    ValueError: no shared seed, or cells without seeds of different
      lengths.
  """
  if "seeds" in a and "seeds" in b:
    va, vb = (
      dict(zip(a["seeds"], a["values"])),
      dict(zip(b["seeds"], b["values"])),
    )
    seeds = sorted(set(va) & set(vb))
    if not seeds:
      raise ValueError(
        f"paired: no shared seed, got seeds {a['seeds']} and {b['seeds']}"
      )
    return seeds, [va[s] for s in seeds], [vb[s] for s in seeds]
  if len(a["values"]) != len(b["values"]):
    raise ValueError(
      f"paired: cells without seeds are matched by position and need the "
      f"same number of values, got {len(a['values'])} and "
      f"{len(b['values'])}; give the lines a 'seed'"
    )
  seeds = [f"#{i}" for i in range(len(a["values"]))]
  return seeds, list(a["values"]), list(b["values"])


def setting(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  variant: str,
) -> dict[str, Any]:
  """What one variant of a runner grid trained: the row's "setting".

  Returns:
    ``params``, ``steps``, ``examples`` (``steps x batch``, in tokens for
    the text models), ``unit`` (``tokens``, ``images`` or ``graphs``),
    ``optimizer``, ``learning_rate``, ``data``, from the variant's config
    (``base`` with its changes) and its first line's summary.

  Raises:
    ValueError: ``variant`` has no change set or no line.
  """
  if variant not in variants:
    raise ValueError(
      f"setting: variant {variant!r} is not in the grid's variants "
      f"{sorted(variants)}"
    )
  cfg = dataclasses.replace(base, **variants[variant])
  line = next((ln for ln in lines if ln["variant"] == variant), None)
  if line is None:
    raise ValueError(f"setting: no line of variant {variant!r}")
  kind = model_registry.spec(cfg.model).data
  unit = {"text": "tokens", "images": "images", "graphs": "graphs"}[kind]
  per_step = cfg.batch_size * (cfg.seq_len if kind == "text" else 1)
  return {
    "params": line.get("params"),
    "steps": line.get("steps"),
    "examples": None if line.get("steps") is None else line["steps"] * per_step,
    "unit": unit,
    "optimizer": cfg.optimizer,
    "learning_rate": cfg.learning_rate,
    "data": cfg.data,
  }


def claim_record(
  lines: Sequence[Mapping[str, Any]],
  claim: claims.Claim,
  *,
  baseline_trained: bool,
  config: Any,
  setting: Mapping[str, Any] | None = None,
  commit: Any = None,
  testable: bool = True,
  reason: str | None = None,
) -> dict[str, Any]:
  """`claims.record` of ``claim`` from a grid's lines, paired by seed.

  ``claim.metric`` is the lines' key, ``claim.a`` and ``claim.b`` their
  variants; the values are matched by `paired` over `cells`. The record
  also holds ``setting``: what each arm trained (`setting` for runner
  grids: parameters, steps, tokens or images, learning rate), which
  RESULTS.md states on the claim's row.

  Args:
    lines: the grid's lines (`run_grid`, or lines with derived metrics).
    claim: the claim.
    baseline_trained: False when ``claim.b`` did not train (see
      `claims.record`).
    config: the full resolved config of the runs, JSON-able (e.g.
      `runner_config`).
    setting: ``{"a": ..., "b": ...}``, each arm's `setting` (or the same
      keys for an experiment outside the runner), or ``None``.
    commit: the code's commit; ``None``: `claims.commit` of this tree.
    testable: False when the phenomenon is absent in the baseline.
    reason: why not testable or not trained, or a note.

  Returns:
    The record (`claims.RECORD_KEYS`, plus ``setting``).

  Raises:
    ValueError: a variant has no line with ``claim.metric``, or `paired`'s
      and `claims.record`'s errors.
  """
  grid = cells([ln for ln in lines if claim.metric in ln], claim.metric)
  missing = [v for v in (claim.a, claim.b) if v not in grid]
  if missing:
    raise ValueError(
      f"claim_record: no line of variant(s) {missing} has metric "
      f"{claim.metric!r}; variants with it: {sorted(grid)}"
    )
  seeds, a_values, b_values = paired(grid[claim.a], grid[claim.b])
  rec = claims.record(
    claim,
    seeds,
    a_values,
    b_values,
    baseline_trained=baseline_trained,
    commit=claims.commit() if commit is None else commit,
    config=config,
    testable=testable,
    reason=reason,
  )
  rec["setting"] = None if setting is None else dict(setting)
  return rec


def runner_record(
  lines: Sequence[Mapping[str, Any]],
  claim: claims.Claim,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  *,
  baseline_trained: bool,
  testable: bool = True,
  reason: str | None = None,
) -> dict[str, Any]:
  """`claim_record` of a runner grid: config and setting from the grid.

  The record's ``config`` is the base `TrainConfig` (resolved, as JSON)
  and each arm's changes; its ``setting`` each arm's `setting`.
  """
  return claim_record(
    lines,
    claim,
    baseline_trained=baseline_trained,
    config={
      "base": config_lib.to_json(config_lib.resolve(base)),
      "a": {k: _plain(v) for k, v in variants[claim.a].items()},
      "b": {k: _plain(v) for k, v in variants[claim.b].items()},
    },
    setting={
      arm: setting(lines, base, variants, variant)
      for arm, variant in (("a", claim.a), ("b", claim.b))
    },
    testable=testable,
    reason=reason,
  )
