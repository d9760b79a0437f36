"""What the claims scripts read back from a finished grid's runs.

A grid (`grid.run_grid`, `grid.tuned_grid`) leaves one run directory per
(run, seed) and one table line per run. The scripts that measure a model
after training, or that judge whether a baseline learned at all, share:

* `trained`: the trained model of one run, restored from its final
  checkpoint by the runner's own resume (no step left to run), so a
  resumed grid gives the same model as the run that trained it;
  `trained_line` is the same for one table line;
* `probed`: each line with a measurement of its run, cached by (run,
  seed) in a JSON-lines file, so a rerun measures only the new runs;
* `chance_loss` and `untrained`: the validation loss of the trivial
  predictor of a config's data, and why a variant's runs did not beat a
  bar (the records' ``baseline_trained`` and reason); `runner_records`,
  the records of claims whose baselines are judged so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flax import nnx

from experiments._harness import grid
from jaxnorm.nn import model_registry
from jaxnorm.training import build, claims, graph_data, tasks, trainer
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib


def run_config(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  changes: Mapping[str, Any],
  run: str,
  seed: int,
) -> config_lib.TrainConfig:
  """The config grid run ``run`` (seed ``seed``) of ``table`` trained."""
  return dataclasses.replace(
    base,
    **changes,
    seed=seed,
    out_dir=str(grid.run_dir(table.parent, run, seed)),
    progress=False,
  )


def _last_checkpoint(out_dir: pathlib.Path) -> int | None:
  """The newest checkpoint step on disk under ``out_dir``, or None."""
  folder = out_dir / "checkpoints"
  steps = (
    [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
    if folder.is_dir()
    else []
  )
  return max(steps, default=None)


def trained(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  changes: Mapping[str, Any],
  run: str,
  seed: int,
  *,
  model: Callable[[], nnx.Module] | None = None,
) -> nnx.Module:
  """The trained model of a finished grid run, in eval mode.

  The run directory's final checkpoint is restored by the runner's resume
  (``trainer.train(cfg, model=...)`` with ``resume=True`` and no step
  left), into ``model()`` or, without ``model``, the model the runner
  builds from the config (with the run's seed).

  Args:
    table: the grid's JSON-lines table (`grid.run_grid`).
    base: the grid's base config.
    changes: the run's `TrainConfig` changes (with its learning rate for a
      `grid.tuned_grid` run).
    run: the run's name (`grid.run_name` of its line).
    seed: the run's seed.
    model: builds the untrained module the run trained (a grid's ``model``
      factory, for this run), or ``None``.

  Raises:
    ValueError: the run has not finished: its newest checkpoint is older
      than ``steps`` (checked before anything runs, so the resume never
      trains), or the resume stopped elsewhere.
  """
  cfg = dataclasses.replace(
    run_config(table, base, changes, run, seed), resume=True
  )
  last = _last_checkpoint(pathlib.Path(cfg.out_dir))
  if last != cfg.steps:
    raise ValueError(
      f"trained: run {run!r} seed {seed} in {cfg.out_dir} has its newest "
      f"checkpoint at step {last} of {cfg.steps}; rerun the grid to finish "
      f"it (a run that stopped early, e.g. at a non-finite loss, has no "
      f"trained model)"
    )
  module = model() if model is not None else None
  if module is None:
    task = tasks.make_task(cfg)
    module = build.build_model(cfg, task.model_kwargs, rngs=nnx.Rngs(seed))
  summary = trainer.train(cfg, model=module)
  if summary["steps"] != cfg.steps:
    raise ValueError(
      f"trained: run {run!r} seed {seed} in {cfg.out_dir} stopped at step "
      f"{summary['steps']} of {cfg.steps}; rerun the grid to finish it"
    )
  return module


def trained_line(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  line: Mapping[str, Any],
  *,
  model: Callable[[str, int], nnx.Module] | None = None,
) -> nnx.Module:
  """`trained` of the run of one grid line.

  Args:
    table: the grid's table.
    base: the grid's base config.
    variants: variant -> changes (``tuned_grid``'s ``variants``, with each
      chosen learning rate).
    line: a line of the grid (its ``variant``, ``seed`` and `grid.run_name`).
    model: the grid's ``(variant, seed) -> module`` factory, or ``None``.
  """
  variant, seed = line["variant"], line["seed"]
  return trained(
    table,
    base,
    variants[variant],
    grid.run_name(line),
    seed,
    model=None if model is None else lambda: model(variant, seed),
  )


def probed(
  lines: Sequence[Mapping[str, Any]],
  path: pathlib.Path,
  probe: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> list[dict[str, Any]]:
  """Each line with ``probe(line)`` added, cached by (run, seed) in ``path``.

  A rerun reads the probes of runs already probed (a JSON-lines file, one
  ``{"run", "seed", **probe}`` object per run, like the grid's table) and
  probes only the new ones.
  """
  cache = {(p["run"], p["seed"]): p for p in grid.read_table(path)}
  out = []
  for ln in lines:
    key = (grid.run_name(ln), ln["seed"])
    if key not in cache:
      found = {"run": key[0], "seed": key[1], **probe(ln)}
      path.parent.mkdir(parents=True, exist_ok=True)
      with path.open("a") as f:
        f.write(json.dumps(found) + "\n")
      cache[key] = found
    extra = {k: v for k, v in cache[key].items() if k not in ("run", "seed")}
    out.append({**ln, **extra})
  return out


def chance_loss(cfg: config_lib.TrainConfig) -> float:
  """The validation loss of the trivial predictor of ``cfg``'s data, nats.

  The unigram entropy of the validation tokens for a text model (the best
  context-free model), ``ln(classes)`` (the uniform guess) for image and
  graph models: the runner's `tasks.Task.baseline`, without building the
  training stream (or generating a graph dataset).
  """
  kind = model_registry.spec(cfg.model).data
  if kind == "graphs":
    return math.log(graph_data.NUM_CLASSES[cfg.data])
  if kind == "images":
    return math.log(data_lib.load_images(cfg.data).num_classes)
  if cfg.data in data_lib.TEXT_CORPORA:
    return float(data_lib.load_text(cfg.data).unigram_entropy())
  return float(tasks.make_task(cfg).baseline)  # A --data PATH corpus.


def _shown(values: Sequence[Any]) -> str:
  return ", ".join("missing" if v is None else f"{v:.3f}" for v in values)


def untrained(
  lines: Sequence[Mapping[str, Any]],
  variant: str,
  bar: float,
  *,
  metric: str = "val_loss",
  higher: bool = False,
  accuracy: float | None = None,
  what: str = "chance",
) -> str | None:
  """Why ``variant`` did not train, or None when every seed beat ``bar``.

  A variant trained when it has lines and every line's ``metric`` is
  below ``bar`` (above it with ``higher``; a missing or non-finite value
  fails) and, with ``accuracy``, its ``val_accuracy`` is above
  ``accuracy`` too (e.g. ``1 / classes``: a loss below chance with an
  accuracy at chance is not training).

  Args:
    lines: grid lines (several variants).
    variant: the variant judged.
    bar: the value every seed must beat, e.g. `chance_loss`.
    metric: the lines' key compared with ``bar``.
    higher: a higher ``metric`` is better.
    accuracy: also require ``val_accuracy`` above this, or None.
    what: what ``bar`` is, for the reason (``"the unigram entropy"``).

  Returns:
    None, or the reason: the variant, what it missed and every seed's
    values.
  """
  lns = [ln for ln in lines if ln["variant"] == variant]
  if not lns:
    return f"{variant} did not train: it has no line"

  def fails(values: Sequence[Any], limit: float, above: bool) -> bool:
    return not all(
      v is not None and math.isfinite(v) and (v > limit if above else v < limit)
      for v in values
    )

  misses = []
  values = [ln.get(metric) for ln in lns]
  if fails(values, bar, higher):
    side = "above" if higher else "below"
    misses.append(
      f"{metric} {_shown(values)} not {side} {what} ({bar:.3f}) in every seed"
    )
  if accuracy is not None:
    accs = [ln.get("val_accuracy") for ln in lns]
    if fails(accs, accuracy, True):
      misses.append(
        f"val_accuracy {_shown(accs)} not above chance ({accuracy:.3f}) in "
        "every seed"
      )
  return f"{variant} did not train: {'; '.join(misses)}" if misses else None


def runner_records(
  lines: Sequence[Mapping[str, Any]],
  the_claims: Sequence[claims.Claim],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  bar: float,
  **criterion: Any,
) -> list[dict[str, Any]]:
  """`grid.runner_record` of each claim, its baseline judged by `untrained`.

  Each record's ``baseline_trained`` is whether ``claim.b`` beat ``bar``
  (``criterion``: `untrained`'s keywords), and its reason why not.
  """
  out = []
  for claim in the_claims:
    why = untrained(lines, claim.b, bar, **criterion)
    out.append(
      grid.runner_record(
        lines,
        claim,
        base,
        variants,
        baseline_trained=why is None,
        reason=why,
      )
    )
  return out
