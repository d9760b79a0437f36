"""Tiny run configs and readers shared by the runner's tests."""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxnorm.training import config as config_lib
from jaxnorm.training import metrics

REPO = pathlib.Path(__file__).absolute().parents[2]

# Logs at 3 and 6 and checkpoints at 4 and 8: checkpoints fall mid window.
TINY = config_lib.TrainConfig(
  width=16,
  depth=1,
  num_heads=2,
  seq_len=16,
  batch_size=8,
  steps=8,
  eval_every=4,
  eval_batches=1,
  checkpoint_every=4,
  log_every=3,
  warmup_steps=1,
  learning_rate=1e-2,
  progress=False,
)


def tiny(out_dir, **changes) -> config_lib.TrainConfig:
  return dataclasses.replace(TINY, out_dir=str(out_dir), **changes)


def records(run_dir) -> list[dict]:
  """The metrics file, parsed as strict JSON (a bare NaN fails)."""

  def refuse(token):
    raise ValueError(f"non-JSON number {token}")

  text = (pathlib.Path(run_dir) / "metrics.jsonl").read_text()
  return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def logged(run_dir) -> list[dict]:
  """Every logged number except timings."""
  return [
    {k: v for k, v in r.items() if k != "tokens_per_sec"}
    for r in records(run_dir)
  ]


def copy_run(src, dst) -> pathlib.Path:
  shutil.copytree(src, dst)
  return pathlib.Path(dst)


def cli_args(cfg: config_lib.TrainConfig) -> list[str]:
  args = [sys.executable, "-m", "jaxnorm.training.cli"]
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    flag = "--" + field.name.replace("_", "-")
    if isinstance(value, bool):
      args.append(flag if value else "--no-" + flag[2:])
    elif field.name.endswith("_kwargs"):
      args += [flag, json.dumps(dict(value))]
    elif isinstance(value, tuple):
      if value:
        args += [flag, ",".join(map(str, value))]
    elif value is not None:
      args += [flag, str(value)]
  return args


def cli_env(devices: int, cache_dir, **extra) -> dict[str, str]:
  return dict(
    os.environ,
    XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    JAX_COMPILATION_CACHE_DIR=str(cache_dir),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    PYTHONPATH=str(REPO),
    **extra,
  )


def launch(
  cfg: config_lib.TrainConfig,
  processes: int,
  cache_dir,
  *,
  devices: int = 4,
  fault: str = "",
) -> list[str]:
  """Runs ``cfg`` through the CLI as ``processes`` jax.distributed processes.

  The processes (on localhost, ``devices`` CPU devices in all) start
  together; more than one join through ``JAX_COORDINATOR_ADDRESS``. Returns
  each process's output once all exited 0.
  """
  import portpicker  # A dependency of orbax.

  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  procs = []
  for i in range(processes):
    extra = {"JAXNORM_FAULT": fault}
    if processes > 1:
      extra.update(
        JAX_COORDINATOR_ADDRESS=address,
        JAX_NUM_PROCESSES=str(processes),
        JAX_PROCESS_ID=str(i),
      )
    procs.append(
      subprocess.Popen(
        cli_args(cfg),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=cli_env(devices // processes, cache_dir, **extra),
      )
    )
  outputs = [p.communicate(timeout=600)[0].decode() for p in procs]
  assert [p.returncode for p in procs] == [0] * processes, outputs
  return outputs


def losses(run_dir) -> tuple[dict[int, float], dict[int, float]]:
  recs = metrics.read_log(pathlib.Path(run_dir) / "metrics.jsonl")
  return (
    {r["step"]: r["loss"] for r in recs if "loss" in r},
    {r["step"]: r["val_loss"] for r in recs if "val_loss" in r},
  )


def saved_state(run_dir, step: int) -> dict:
  """The train state saved at ``step``, as NumPy arrays."""
  manager = ocp.CheckpointManager(pathlib.Path(run_dir) / "checkpoints")
  restored = manager.restore(
    step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
  )
  manager.close()
  return jax.tree.map(np.asarray, restored["state"])
