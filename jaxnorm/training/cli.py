"""Console entry points: ``jaxnorm-train`` and ``jaxnorm-sweep``.

  jaxnorm-train --model lm --norm seednorm --residual mhc --optimizer conda
  jaxnorm-sweep --vary norm=rmsnorm,layernorm,dyt --vary optimizer=adamw,rmnp

Both validate every name, size and the mesh before building anything, print
a summary table and write a loss plot. Multi-host runs call
`jax.distributed.initialize` when the launcher sets
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (or
runs on a cluster JAX detects itself); the mesh then spans every process's
devices and process 0 writes the metrics, plot and summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import pathlib
import sys
from collections.abc import Sequence

import jax

from jaxnorm.training import config as config_lib
from jaxnorm.training import metrics, trainer


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


def train_main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``jaxnorm-train``."""
  parser = argparse.ArgumentParser(
    prog="jaxnorm-train",
    description="Train one jaxnorm model on bundled real data.",
  )
  config_lib.add_arguments(parser)
  args = parser.parse_args(argv)
  cfg = config_lib.from_args(args)
  _maybe_initialize_distributed()
  try:
    summary = trainer.train(cfg)
  except ValueError as e:
    print(f"jaxnorm-train: error: {e}", file=sys.stderr)
    return 2
  out = pathlib.Path(cfg.out_dir)
  if jax.process_index() != 0:
    return 0
  _report(
    [(f"{cfg.model}/{cfg.norm}/{cfg.residual}/{cfg.optimizer}", summary)],
    out / "loss.png",
  )
  if summary["stopped_early"]:
    print(
      f"stopped at step {summary['steps']} (SIGTERM); rerun the same "
      f"command to resume from {out / 'checkpoints'}"
    )
  return 0


def _parse_vary(items: Sequence[str]) -> dict[str, list[str]]:
  fields = {f.name: f for f in dataclasses.fields(config_lib.TrainConfig)}
  grid: dict[str, list[str]] = {}
  for item in items:
    name, _, values = item.partition("=")
    name = name.replace("-", "_")
    if name not in fields or not values:
      raise ValueError(
        f"--vary takes FIELD=V1,V2,... with FIELD one of "
        f"{', '.join(sorted(fields))}; got {item!r}"
      )
    grid[name] = values.split(",")
  return grid


def _convert(field: str, text: str, default: object) -> object:
  if isinstance(default, bool):
    if text.lower() not in ("true", "false"):
      raise ValueError(f"--vary {field}: use true or false, got {text!r}")
    return text.lower() == "true"
  if isinstance(default, tuple):
    return tuple(int(p) for p in text.split("x"))
  return type(default)(text)


def sweep_main(argv: Sequence[str] | None = None) -> int:
  """Entry point of ``jaxnorm-sweep``: a grid of variants, same data/seed."""
  parser = argparse.ArgumentParser(
    prog="jaxnorm-sweep",
    description="Train a grid of variants on the same data and seed; "
    "write one comparison table and one plot.",
  )
  parser.add_argument(
    "--vary",
    action="append",
    default=[],
    metavar="FIELD=V1,V2",
    help="a config field and its values (repeatable)",
  )
  config_lib.add_arguments(parser, config_lib.TrainConfig(out_dir="runs/sweep"))
  args = parser.parse_args(argv)
  base = config_lib.from_args(args)
  try:
    grid = _parse_vary(args.vary)
    variants = []
    for values in itertools.product(*grid.values()):
      changes = {}
      for field, value in zip(grid, values):
        changes[field] = _convert(field, value, getattr(base, field))
      name = "-".join(f"{v}" for v in values) or "base"
      cfg = dataclasses.replace(
        base, out_dir=str(pathlib.Path(base.out_dir) / name), **changes
      )
      config_lib.validate(cfg, trainer.registries(cfg.model))
      variants.append((name, cfg))
  except ValueError as e:
    print(f"jaxnorm-sweep: error: {e}", file=sys.stderr)
    return 2
  _maybe_initialize_distributed()
  rows = []
  for name, cfg in variants:
    print(f"== {name}", file=sys.stderr)
    rows.append((name, trainer.train(cfg)))
  out = pathlib.Path(base.out_dir)
  table = metrics.summary_table(rows)
  (out / "sweep.md").write_text(table + "\n")
  first = rows[0][1]
  metrics.plot_runs(
    [
      (name, pathlib.Path(cfg.out_dir) / "metrics.jsonl")
      for name, cfg in variants
    ],
    out / "sweep.png",
    title=f"{base.model} on {base.data}: {', '.join(grid) or 'base'}",
    baseline=first["baseline"],
    baseline_label="unigram entropy"
    if first["kind"] == "lm"
    else "uniform guess",
  )
  _report(rows, out / "sweep.png")
  return 0


if __name__ == "__main__":
  sys.exit(train_main())
