"""Elastic resume: another process count, and the previous checkpoint layout.

A run stopped on 2 processes (jax.distributed on localhost) resumes on 1,
and one stopped on 1 resumes on 2, from its checkpoint (never moved aside,
never restarted from step 0): the losses equal the uninterrupted run's, no
step is logged twice, and only process 0 writes a metrics file. A
checkpoint of the previous layout (grain's per-process iterator files)
resumes bit-exactly.
"""

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest

from jaxnorm.training import cli, trainer
from tests.training import runs

# Multi-process runs: CI runs them (-m slow).
pytestmark = pytest.mark.slow

MESH = (4, 1, 1)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted one-process run on `MESH`."""
  out = tmp_path_factory.mktemp("reference") / "run"
  trainer.train(runs.tiny(out, mesh=MESH))
  return out


def _assert_close(got, want):
  assert [sorted(r) for r in got] == [sorted(r) for r in want]
  for g, w in zip(got, want):
    np.testing.assert_allclose(
      [float(g[k]) for k in sorted(g)],
      [float(w[k]) for k in sorted(w)],
      rtol=2e-5,
      err_msg=str(g["step"]),
    )


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)])
def test_resume_on_another_process_count(
  tmp_path, reference, compilation_cache_dir, before, after
):
  # 4 kept checkpoints: the stop step's survives the resumed run's saves.
  cfg = runs.tiny(tmp_path / "run", mesh=MESH, keep_checkpoints=4)
  # Two processes stop together at the preemption sync point after process
  # 1's SIGTERM; one process stops at once.
  fault = "sigterm@3:1" if before == 2 else "sigterm@5"
  runs.launch(cfg, before, compilation_cache_dir, fault=fault)
  out = pathlib.Path(cfg.out_dir)
  stop = max(int(p.name) for p in (out / "checkpoints").iterdir())
  assert 3 <= stop < 8
  stopped = (out / "checkpoints" / str(stop)).stat().st_ino

  # The one-process resume reads through a grain worker process.
  resumed = dataclasses.replace(cfg, data_workers=1 if after == 1 else 0)
  outputs = runs.launch(resumed, after, compilation_cache_dir)
  assert "corrupt" not in "".join(outputs), outputs
  assert not (out / "corrupt").exists()
  # Resumed from that checkpoint, which is neither moved nor rewritten.
  assert (out / "checkpoints" / str(stop)).stat().st_ino == stopped
  logged = runs.logged(out)
  train_steps = [r["step"] for r in logged if "loss" in r]
  assert train_steps == sorted(set(train_steps)) == [3, 6, 8]
  _assert_close(logged, runs.logged(reference))
  assert not list(out.glob("metrics.process*"))
  assert "| lm/rmsnorm/prenorm/adamw |" in outputs[0]


def _as_layout_1(step_dir: pathlib.Path, processes: int) -> None:
  """Rewrites a step as the previous jaxnorm wrote it (layout 1).

  grain's iterator state of the old pipeline was ``{"next_index": B}``, B
  batches consumed, in one file per process, identical on every process.
  """
  elements = json.loads((step_dir / "position" / "metadata").read_text())
  shutil.rmtree(step_dir / "position")
  (step_dir / "data").mkdir()
  state = {"next_index": elements["elements"] // runs.TINY.batch_size}
  for i in range(processes):
    (step_dir / "data" / f"process_{i}-of-{processes}.json").write_text(
      json.dumps(state, indent=4)
    )
  run_path = step_dir / "run" / "metadata"
  run = json.loads(run_path.read_text())
  run = {k: run[k] for k in ("config", "window", "fingerprint")}
  run_path.write_text(json.dumps(run))
  meta_path = step_dir / "_CHECKPOINT_METADATA"
  meta = json.loads(meta_path.read_text())
  handlers = meta["item_handlers"]
  del handlers["position"]
  handlers["data"] = "grain._src.python.checkpoint.handler.CheckpointHandler"
  meta_path.write_text(json.dumps(meta))


def test_checkpoint_of_the_previous_layout_resumes(tmp_path, reference):
  run = runs.copy_run(reference, tmp_path / "run")
  shutil.rmtree(run / "checkpoints" / "8")
  _as_layout_1(run / "checkpoints" / "4", processes=2)
  summary = trainer.train(runs.tiny(run, mesh=MESH))
  assert summary["steps"] == 8
  assert runs.logged(run) == runs.logged(reference)
  assert not (run / "corrupt").exists()


def test_unknown_item_stops_the_cli_and_changes_nothing(
  tmp_path, reference, capsys
):
  run = runs.copy_run(reference, tmp_path / "run")
  (run / "checkpoints" / "8" / "sampler").mkdir()
  before = sorted(str(p) for p in run.rglob("*"))
  code = cli.train_main(runs.cli_args(runs.tiny(run, mesh=MESH))[3:])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert f"checkpoint {run / 'checkpoints' / '8'} cannot be resumed" in err
  assert "does not know (sampler)" in err
  assert sorted(str(p) for p in run.rglob("*")) == before
