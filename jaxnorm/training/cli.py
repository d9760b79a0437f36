"""Console entry points: ``jaxnorm-train`` and ``jaxnorm-sweep``.

  jaxnorm-train --model lm --norm seednorm --residual mhc --optimizer conda
  jaxnorm-sweep --vary norm=rmsnorm,layernorm,dyt --vary optimizer=adamw,rmnp

Both read an optional ``--config`` file (TOML or JSON) that flags override,
list every registry with ``--list``, validate every name, number, size and
the mesh before building anything, print a summary table and write a loss
plot. Multi-host runs call
`jax.distributed.initialize` when the launcher sets
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (or
runs on a cluster JAX detects itself); the mesh then spans every process's
devices and process 0 writes the metrics, plot and summary.

``jaxnorm-train --compile-only --topology v5e:4x4 --mesh 1,16,1 ...`` runs
nothing: it compiles the run's training step for the named chips here and
prints its memory per device and predicted speed (`plan`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import pathlib
import sys
from collections.abc import Callable, Sequence

import jax

from jaxnorm import aot
from jaxnorm.training import (
  build,
  checkpoints,
  claims,
  data,
  flags,
  metrics,
  trainer,
)
from jaxnorm.training import config as config_lib
from jaxnorm.training import plan as plan_lib


def _maybe_initialize_distributed() -> None:
  """Joins a multi-process run when the launcher's environment says so.

  ``JAX_COORDINATOR_ADDRESS`` with ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` (any launcher), or a cluster JAX detects by itself
  (SLURM, Cloud TPU pods).
  """
  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    count, index = env.get("JAX_NUM_PROCESSES"), env.get("JAX_PROCESS_ID")
    jax.distributed.initialize(
      num_processes=None if count is None else int(count),
      process_id=None if index is None else int(index),
    )
  elif env.get("SLURM_NTASKS", "1") != "1" or env.get("TPU_WORKER_HOSTNAMES"):
    jax.distributed.initialize()


def _report(rows, plot: pathlib.Path) -> None:
  print()
  print(metrics.summary_table(rows))
  print(f"\nplot: {plot}")


def _list_registries() -> str:
  """Every valid name, per model, for the ``--list`` flag."""
  lines = []
  for model in config_lib.MODELS:
    lines.append(f"{model} (data: {', '.join(config_lib.MODEL_DATA[model])})")
    for field, names in build.registries(model).items():
      lines.append(f"  {field}: {', '.join(names)}")
    extra = sorted(
      set(build.registries(model, allow_batch_stats=True)["norm"])
      - set(build.registries(model)["norm"])
    )
    if extra:
      lines.append(f"  norm with --allow-batch-stats: {', '.join(extra)}")
  lines.append(f"schedule: {', '.join(config_lib.SCHEDULES)}")
  lines.append(f"positional: {', '.join(config_lib.POSITIONAL)}")
  lines.append(f"dtype, param_dtype: {', '.join(config_lib.DTYPES)}")
  return "\n".join(lines)


def _parser(
  prog: str, description: str, defaults: config_lib.TrainConfig
) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog=prog,
    description=description,
    epilog="Part names in --help are those of --model lm; --list prints "
    "every model's.",
  )
  parser.add_argument(
    "--config",
    metavar="FILE",
    help="a TOML or JSON file of fields (flat or in sections model, data, "
    "optim, run); flags override it",
  )
  parser.add_argument(
    "--list",
    action="store_true",
    help="print the valid names of every registry and exit",
  )
  flags.add_arguments(parser, defaults, build.registries("lm"))
  return parser


def _parse(
  prog: str,
  description: str,
  argv: Sequence[str] | None,
  defaults: config_lib.TrainConfig,
  extra: Callable[[argparse.ArgumentParser], None] = lambda p: None,
) -> tuple[argparse.Namespace, config_lib.TrainConfig | None]:
  """Flags over the ``--config`` file over ``defaults``."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--config")
  known, _ = pre.parse_known_args(argv)
  parser = _parser(prog, description, defaults)
  extra(parser)
  if known.config:
    try:
      parser.set_defaults(**flags.load_file(known.config))
    except ValueError as e:
      parser.error(str(e))
  args = parser.parse_args(argv)
  if args.list:
    print(_list_registries())
    return args, None
  return args, flags.from_args(args)


def _planning_flags(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("planning (compile only)")
  group.add_argument(
    "--compile-only",
    action="store_true",
    help="build the training step for --topology and compile it here with "
    "that chip's compiler (deviceless; nothing runs, no data is read); "
    "print memory per device against HBM, flops, the predicted step time "
    "and tokens/s; exit 0 if it fits, 1 if not (needs the aot extra)",
  )
  group.add_argument(
    "--topology",
    metavar="NAME",
    help="the chips --compile-only plans for: TPUs as jax spells them "
    "(v5e:4x4, v5p:2x2x2, v6e:8x8) or the GPUs of one host (h100:8, "
    "h200:8); --mesh must use all of its devices",
  )


def _compile_only(cfg: config_lib.TrainConfig, topology: str | None) -> int:
  """``--compile-only``: print the plan; 0 fits, 1 does not, 2 errors."""
  try:
    if topology is None:
      raise ValueError(
        "--compile-only needs --topology NAME, e.g. v5e:4x4 or h100:8"
      )
    chip, _ = aot.parse(topology)
    if not aot.available(chip.platform):
      raise ValueError(
        f"--compile-only --topology {topology} needs the deviceless "
        f"{chip.platform.upper()} compiler of the aot extra, which is not "
        f"installed; install it with {aot.INSTALL}"
      )
    aot.setup_environment()
    plan = plan_lib.compile_plan(cfg, topology)
  except ValueError as e:
    print(f"jaxnorm-train: error: {e}", file=sys.stderr)
    return 2
  print(plan_lib.format_plan(plan))
  refusal = plan_lib.verdict(plan)
  if refusal is not None:
    print(f"jaxnorm-train: {refusal}", file=sys.stderr)
    return 1
  return 0


def train_main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``jaxnorm-train``.

  Exit status: 0 when the run finished or stopped at a preemption notice
  (rerun to resume), 1 when it stopped at a non-finite loss or gradient,
  2 for a config error, missing data or a busy run directory. With
  ``--compile-only``: 0 when the plan fits the topology's HBM, 1 when it
  does not, 2 for a config error or a missing aot extra.
  """
  args, cfg = _parse(
    "jaxnorm-train",
    "Train one jaxnorm model on bundled real data.",
    argv,
    config_lib.TrainConfig(),
    _planning_flags,
  )
  if cfg is None:
    return 0
  if args.compile_only:
    return _compile_only(cfg, args.topology)
  if args.topology is not None:
    print(
      f"jaxnorm-train: error: --topology {args.topology} is only read with "
      f"--compile-only (a run uses the devices it has); add --compile-only "
      f"to plan for it",
      file=sys.stderr,
    )
    return 2
  _maybe_initialize_distributed()
  try:
    summary = trainer.train(cfg)
  except (
    ValueError,
    data.DataUnavailableError,
    checkpoints.RunDirBusyError,
  ) as e:
    print(f"jaxnorm-train: error: {e}", file=sys.stderr)
    return 2
  out = pathlib.Path(cfg.out_dir)
  if jax.process_index() != 0:
    return 1 if summary["stop_reason"] == "nonfinite" else 0
  _report(
    [(f"{cfg.model}/{cfg.norm}/{cfg.residual}/{cfg.optimizer}", summary)],
    out / "loss.png",
  )
  if summary["stop_reason"] == "preempted":
    print(
      f"stopped at step {summary['steps']} (preemption notice); its "
      f"checkpoint is saved; rerun the same command to resume from "
      f"{out / 'checkpoints'}"
    )
  if summary["stop_reason"] == "nonfinite":
    print(
      f"jaxnorm-train: stopped: non-finite loss or gradient at step "
      f"{summary['steps'] + 1}; no checkpoint was written after step "
      f"{summary['steps']}; lower --learning-rate or --clip-norm, or pass "
      f"--nonfinite skip",
      file=sys.stderr,
    )
    return 1
  return 0


def _parse_vary(items: Sequence[str]) -> dict[str, list[str]]:
  grid: dict[str, list[str]] = {}
  for item in items:
    name, _, values = item.partition("=")
    name = name.replace("-", "_")
    if name not in config_lib.FIELDS or not values:
      raise ValueError(
        f"--vary takes FIELD=V1,V2,... with FIELD one of "
        f"{', '.join(sorted(config_lib.FIELDS))}; got {item!r}"
      )
    grid[name] = values.split(",")
  return grid


# The metrics `jaxnorm-sweep --seeds` compares, and which values are better.
_SWEEP_METRICS = (("val_loss", "lower"), ("val_accuracy", "higher"))


def _sweep_comparison(
  runs: Sequence[tuple[str, Sequence[tuple[int, dict]]]], level: float = 0.95
) -> list[str]:
  """Markdown rows: each variant minus the first one, paired by seed.

  Per metric of `_SWEEP_METRICS`, the mean of ``variant - first`` over the
  seeds both ran, its two-sided paired t interval at ``level``
  (`claims.paired_interval`) and the one-sided p-value that the variant
  is better; "better" / "worse" when the interval excludes 0 on that side
  (a two-sided test at ``1 - level``), else "no difference at ``level``"
  (or a non-finite value: a run diverged).
  """
  (first, base), *others = runs
  by_seed = dict(base)
  pct = f"{100 * level:g}%"
  rows = [
    f"Paired by seed against {first} ({pct} paired t interval of the mean "
    f"difference; p: one-sided, that the variant is better):",
    "",
    f"| metric | variant | n | mean (variant − {first}) | {pct} interval "
    f"| p | reading |",
    "|---|---|---|---|---|---|---|",
  ]
  for metric, direction in _SWEEP_METRICS:
    for name, summaries in others:
      pairs = [(s[metric], by_seed[seed][metric]) for seed, s in summaries]
      iv = claims.paired_interval(
        [a for a, _ in pairs], [b for _, b in pairs], level, direction=direction
      )
      gain = sorted(
        -x if direction == "lower" else x for x in (iv.low, iv.high)
      )
      if not math.isfinite(iv.mean):
        reading = "non-finite value (a run diverged)"
      elif gain[0] > 0:
        reading = "better"
      elif gain[1] < 0:
        reading = "worse"
      else:
        reading = f"no difference at {pct}"
      rows.append(
        f"| {metric} ({direction} is better) | {name} | {iv.n} | "
        f"{iv.mean:+.4f} | [{iv.low:+.4f}, {iv.high:+.4f}] | "
        f"{iv.p_value:.3g} | {reading} |"
      )
  return rows


def sweep_main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``jaxnorm-sweep``: a grid of variants, same data/seed.

  With ``--seeds N`` (N >= 2) every variant runs with seeds ``seed`` to
  ``seed + N - 1`` (run directories ``<out-dir>/<variant>/seed<s>``) and
  the table adds each variant against the first, paired by seed
  (`_sweep_comparison`). Exit status 2 for a config error.
  """

  def extra(parser):
    parser.add_argument(
      "--vary",
      action="append",
      default=[],
      metavar="FIELD=V1,V2",
      help="a config field and its values (repeatable)",
    )
    parser.add_argument(
      "--seeds",
      type=int,
      default=1,
      metavar="N",
      help="run every variant with seeds SEED..SEED+N-1 and compare each "
      "variant with the first, paired by seed (mean difference, 95%% t "
      "interval, p-value); default 1",
    )

  args, base = _parse(
    "jaxnorm-sweep",
    "Train a grid of variants on the same data and seed; write one "
    "comparison table and one plot.",
    argv,
    config_lib.TrainConfig(out_dir="runs/sweep"),
    extra,
  )
  if base is None:
    return 0
  try:
    if args.seeds < 1:
      raise ValueError(
        f"--seeds must be a number of seeds >= 1, got --seeds {args.seeds}"
      )
    seeds = range(base.seed, base.seed + args.seeds)
    grid = _parse_vary(args.vary)
    variants = []
    for values in itertools.product(*grid.values()):
      changes = {
        field: flags.parse_value(field, value)
        for field, value in zip(grid, values)
      }
      name = "-".join(f"{v}" for v in values) or "base"
      cfg = dataclasses.replace(
        base, out_dir=str(pathlib.Path(base.out_dir) / name), **changes
      )
      config_lib.validate(cfg, build.registries_for(cfg))
      variants.append((name, cfg))
  except ValueError as e:
    print(f"jaxnorm-sweep: error: {e}", file=sys.stderr)
    return 2
  _maybe_initialize_distributed()
  rows, runs, logs = [], [], []
  for name, cfg in variants:
    per_seed = []
    for seed in seeds:
      label, run = name, cfg
      if len(seeds) > 1:
        label = f"{name}/seed{seed}"
        run = dataclasses.replace(
          cfg, seed=seed, out_dir=str(pathlib.Path(cfg.out_dir) / f"seed{seed}")
        )
      print(f"== {label}", file=sys.stderr)
      summary = trainer.train(run)
      rows.append((label, summary))
      per_seed.append((seed, summary))
      logs.append((label, pathlib.Path(run.out_dir) / "metrics.jsonl"))
    runs.append((name, per_seed))
  out = pathlib.Path(base.out_dir)
  table = metrics.summary_table(rows)
  if len(seeds) > 1 and len(runs) > 1:
    table += "\n\n" + "\n".join(_sweep_comparison(runs))
  (out / "sweep.md").write_text(table + "\n")
  first = rows[0][1]
  metrics.plot_runs(
    logs,
    out / "sweep.png",
    title=f"{base.model} on {base.data}: {', '.join(grid) or 'base'}",
    baseline=first["baseline"],
    baseline_label="unigram entropy"
    if first["kind"] == "lm"
    else "uniform guess",
  )
  print()
  print(table)
  print(f"\nplot: {out / 'sweep.png'}")
  return 0


if __name__ == "__main__":
  sys.exit(train_main())
