"""Resume: exact after a stop at any step, on any mesh, guarded and verified.

Stops are injected with ``JAXNORM_FAULT`` (`jaxnorm.training.faults`), so no
test depends on timing. Reference runs are shared per module.
"""

import dataclasses
import gc
import math
import os
import pathlib
import shutil
import signal
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import sharding
from jaxnorm.training import checkpoints, cli, trainer
from tests.training import runs

# End-to-end runs, stopped and resumed: CI runs them (-m slow).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """Uninterrupted runs of `runs.TINY`, one per mesh, made on first use."""
  made = {}

  def get(mesh):
    if mesh not in made:
      out = tmp_path_factory.mktemp("reference") / "run"
      trainer.train(runs.tiny(out, mesh=mesh))
      made[mesh] = out
    return made[mesh]

  return get


def stopped(tmp_path, monkeypatch, mesh, step, name="part"):
  """A run of `runs.TINY` on ``mesh`` stopped by SIGTERM after ``step``."""
  cfg = runs.tiny(tmp_path / name, mesh=mesh)
  monkeypatch.setenv("JAXNORM_FAULT", f"sigterm@{step}")
  summary = trainer.train(cfg)
  monkeypatch.delenv("JAXNORM_FAULT")
  assert summary["stop_reason"] == "preempted" and summary["steps"] == step
  return cfg


@pytest.mark.parametrize(
  "mesh,step",
  [((1, 1, 1), 2), ((1, 1, 1), 5), ((2, 2, 2), 4), ((2, 2, 2), 6)],
)
def test_sigterm_at_any_step_resumes_exactly(
  tmp_path, monkeypatch, reference, mesh, step
):
  # 2: before any checkpoint or log; 4: a checkpoint step mid log window;
  # 5: mid window after a checkpoint; 6: a log step.
  cfg = stopped(tmp_path, monkeypatch, mesh, step)
  assert max((r["step"] for r in runs.records(cfg.out_dir)), default=0) <= step
  summary = trainer.train(cfg)
  assert summary["stop_reason"] is None and summary["steps"] == 8
  assert runs.logged(cfg.out_dir) == runs.logged(reference(mesh))


@pytest.mark.parametrize("target", [(8, 1, 1), (1, 1, 1)])
def test_resume_on_another_mesh(tmp_path, monkeypatch, reference, target):
  cfg = stopped(tmp_path, monkeypatch, (2, 2, 2), 5)
  trainer.train(dataclasses.replace(cfg, mesh=target))
  _assert_logs_close(cfg.out_dir, reference((2, 2, 2)), rtol=2e-5)


def _assert_logs_close(run_dir, reference_dir, *, rtol):
  """The same records (keys, steps) with numbers equal to ``rtol``."""
  got, want = runs.logged(run_dir), runs.logged(reference_dir)
  assert [sorted(r) for r in got] == [sorted(r) for r in want]
  for g, w in zip(got, want):
    np.testing.assert_allclose(
      [float(g[k]) for k in sorted(g)],
      [float(w[k]) for k in sorted(w)],
      rtol=rtol,
      err_msg=str(g["step"]),
    )


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_resume_converts_the_layer_layout(tmp_path, monkeypatch, saved_scanned):
  # Saved unrolled and resumed scanned with remat, and back: the metrics are
  # the uninterrupted run's to float32 rounding (scan and remat reorder
  # the arithmetic; three steps later the gradient norm differs by 5e-5
  # relative, the loss by 1e-6).
  layout = dict(depth=2, scan_layers=saved_scanned)
  want = tmp_path / "reference"
  trainer.train(runs.tiny(want, **layout))
  cfg = runs.tiny(tmp_path / "part", **layout)
  monkeypatch.setenv("JAXNORM_FAULT", "sigterm@5")
  assert trainer.train(cfg)["stop_reason"] == "preempted"
  monkeypatch.delenv("JAXNORM_FAULT")
  resumed = dataclasses.replace(
    cfg, scan_layers=not saved_scanned, remat="full"
  )
  assert trainer.train(resumed)["steps"] == 8
  _assert_logs_close(cfg.out_dir, want, rtol=1e-4)
  assert not (pathlib.Path(cfg.out_dir) / "corrupt").exists()


def test_layout_change_refused_for_optimizer_state_of_another_shape(
  tmp_path, monkeypatch
):
  # Conda's projection bases are not laid out as the parameters: the run
  # stops with the reason and the checkpoint stays as it was.
  cfg = runs.tiny(tmp_path / "run", depth=2, optimizer="conda")
  monkeypatch.setenv("JAXNORM_FAULT", "sigterm@4")
  trainer.train(cfg)
  monkeypatch.delenv("JAXNORM_FAULT")
  ckpt = pathlib.Path(cfg.out_dir) / "checkpoints"
  before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
  with pytest.raises(
    checkpoints.CheckpointIncompatibleError,
    match=r"saved with scan_layers=False and relayout: the optimizer state "
    r"holds a tree that is not laid out as the parameters",
  ):
    trainer.train(dataclasses.replace(cfg, scan_layers=True))
  assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before


def _placed(mesh, specs):
  return {
    k: jax.device_put(
      jnp.arange(64, dtype=jnp.float32).reshape(8, 8) + i,
      NamedSharding(mesh, spec),
    )
    for i, (k, spec) in enumerate(specs.items())
  }


def test_restore_takes_the_new_meshs_shardings(tmp_path):
  old = sharding.make_mesh((2, 2, 2))
  new = sharding.make_mesh((8, 1, 1))
  state = _placed(old, {"a": P("data", "tensor"), "b": P(None, "fsdp")})
  state["step"] = jax.device_put(jnp.int32(3), NamedSharding(old, P()))
  ckpts = checkpoints.Checkpoints(
    tmp_path / "ck", keep=2, corrupt_dir=tmp_path / "bad", primary=True
  )
  ckpts.save(3, state, 24, {"window": []})
  ckpts.close()
  target = _placed(new, {"a": P("data"), "b": P(None, "data")})
  target["step"] = jax.device_put(jnp.int32(0), NamedSharding(new, P()))
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    target,
  )
  ckpts = checkpoints.Checkpoints(
    tmp_path / "ck", keep=2, corrupt_dir=tmp_path / "bad", primary=True
  )
  step, restored, run, elements = ckpts.restore(abstract)
  ckpts.close()
  assert step == 3 and run["window"] == [] and elements == 24
  for k in state:
    assert restored[k].sharding == target[k].sharding, k
    np.testing.assert_array_equal(restored[k], state[k])


def test_sigkill_during_async_checkpoint_write(
  tmp_path, reference, compilation_cache_dir
):
  # Killed right after step 4's asynchronous save started: the resume
  # restores step 4 if its write finished, else starts over; either way
  # the metrics equal the uninterrupted run's.
  cfg = runs.tiny(tmp_path / "part", mesh=(1, 1, 1))
  env = runs.cli_env(8, compilation_cache_dir, JAXNORM_FAULT="sigkill@4")
  proc = subprocess.run(
    runs.cli_args(cfg), env=env, cwd=runs.REPO, capture_output=True
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
  assert (pathlib.Path(cfg.out_dir) / checkpoints.LOCK_NAME).exists()
  trainer.train(cfg)  # Takes over the dead process's lock.
  assert runs.logged(cfg.out_dir) == runs.logged(reference((1, 1, 1)))


class TestDrift:
  def test_changed_fields_are_refused_before_building(
    self, tmp_path, reference
  ):
    run = runs.copy_run(reference((1, 1, 1)), tmp_path / "run")
    before = (run / "metrics.jsonl").read_text()
    cfg = runs.tiny(run, residual="postnorm", seed=3, steps=12)
    with pytest.raises(
      ValueError,
      match=r"saved with another config: --residual \"prenorm\" -> "
      r"\"postnorm\"; --seed 0 -> 3; --steps 8 -> 12; .*--allow-change "
      r"residual,seed,steps",
    ):
      trainer.train(cfg)
    assert (run / "metrics.jsonl").read_text() == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
      "4",
      "8",
    ]

  def test_allowed_change_extends_the_run(self, tmp_path, reference):
    run = runs.copy_run(reference((1, 1, 1)), tmp_path / "run")
    summary = trainer.train(
      runs.tiny(run, steps=9, allow_change=("steps",), mesh=(2, 1, 1))
    )
    assert summary["steps"] == 9
    assert runs.logged(run)[:-2] == runs.logged(reference((1, 1, 1)))

  def test_cli_one_line_error(self, tmp_path, reference, capsys):
    run = runs.copy_run(reference((1, 1, 1)), tmp_path / "run")
    args = runs.cli_args(runs.tiny(run, learning_rate=0.5))[3:]
    assert cli.train_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--learning-rate 0.01 -> 0.5" in err


def test_no_resume_moves_the_old_run_aside(tmp_path, reference):
  run = runs.copy_run(reference((1, 1, 1)), tmp_path / "run")
  for name in ("4", "8"):  # Marks the old run's checkpoints.
    (run / "checkpoints" / name / "old-run").write_text("")
  summary = trainer.train(runs.tiny(run, resume=False))
  assert summary["steps"] == 8
  old = run / "previous-1" / "checkpoints"
  assert sorted(p.name for p in old.glob("*/old-run")) == ["old-run"] * 2
  assert not list((run / "checkpoints").glob("*/old-run"))
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["4", "8"]
  assert runs.logged(run) == runs.logged(run / "previous-1")


class TestLock:
  def test_live_runner_refused(self, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(["sleep", "60"])
    try:
      (out / checkpoints.LOCK_NAME).write_text(
        f'{{"pid": {holder.pid}, "host": "{os.uname().nodename}"}}'
      )
      with pytest.raises(
        checkpoints.RunDirBusyError,
        match=rf"in use by another jaxnorm-train \(pid {holder.pid}",
      ):
        trainer.train(runs.tiny(out))
    finally:
      holder.kill()
      holder.wait()
    assert not (out / "checkpoints").exists()

  def test_lock_released_and_reentrant_use_refused(self, tmp_path):
    lock = checkpoints.RunLock(tmp_path)
    with lock:
      with pytest.raises(checkpoints.RunDirBusyError, match="in use"):
        with checkpoints.RunLock(tmp_path):
          pass
    assert not (tmp_path / checkpoints.LOCK_NAME).exists()
    with checkpoints.RunLock(tmp_path):
      assert (tmp_path / checkpoints.LOCK_NAME).exists()

  def test_stale_lock_taken_over(self, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / checkpoints.LOCK_NAME).write_text(
      f'{{"pid": {dead.pid}, "host": "{os.uname().nodename}"}}'
    )
    with checkpoints.RunLock(tmp_path) as lock:
      assert lock._holder()["pid"] == os.getpid()
    assert not (tmp_path / checkpoints.LOCK_NAME).exists()


def _flip(step_dir: pathlib.Path) -> None:
  data = max(
    (p for p in (step_dir / "state").rglob("*") if p.is_file()),
    key=lambda p: p.stat().st_size,
  )
  raw = bytearray(data.read_bytes())
  for i in range(len(raw) // 3, len(raw) // 3 + 64):
    raw[i] ^= 0xFF
  data.write_bytes(bytes(raw))


def _truncate(step_dir: pathlib.Path) -> None:
  data = max(
    (p for p in (step_dir / "state").rglob("*") if p.is_file()),
    key=lambda p: p.stat().st_size,
  )
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def _no_metadata(step_dir: pathlib.Path) -> None:
  for p in sorted(step_dir.rglob("*"), reverse=True):
    if p.is_file() and p.parent.name == "run":
      p.unlink()


def _empty(step_dir: pathlib.Path) -> None:
  shutil.rmtree(step_dir)
  step_dir.mkdir()


# The failed restore leaves orbax reads behind (pyproject's filterwarnings).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", [_flip, _truncate, _no_metadata, _empty])
def test_corrupt_newest_checkpoint_falls_back(tmp_path, reference, damage):
  run = runs.copy_run(reference((1, 1, 1)), tmp_path / "run")
  full = runs.logged(reference((1, 1, 1)))
  damage(run / "checkpoints" / "8")
  with pytest.warns(
    checkpoints.CorruptCheckpointWarning,
    match=rf"checkpoint {run / 'checkpoints' / '8'} is corrupt",
  ):
    summary = trainer.train(runs.tiny(run))
  assert summary["steps"] == 8
  assert runs.logged(run) == full
  assert (run / "corrupt" / "8-1").is_dir()
  gc.collect()  # Report any unraisable leftovers here, not in a later test.


def test_nonfinite_loss_stops_before_the_next_checkpoint(
  tmp_path, monkeypatch, reference, capsys
):
  cfg = runs.tiny(tmp_path / "run")
  monkeypatch.setenv("JAXNORM_FAULT", "nan@5")
  assert cli.train_main(runs.cli_args(cfg)[3:]) == 1
  err = capsys.readouterr().err
  assert (
    "non-finite loss or gradient at step 5; no checkpoint was written " in (err)
  )
  recs = runs.records(cfg.out_dir)  # Strict JSON: no bare NaN.
  assert recs[-1]["step"] == 5 and recs[-1]["nonfinite"] is True
  assert recs[-1]["loss"] is None and recs[-1]["grad_norm"] is None
  assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["4"]
  monkeypatch.delenv("JAXNORM_FAULT")
  trainer.train(cfg)  # The good checkpoint resumes to the reference run.
  assert runs.logged(cfg.out_dir) == runs.logged(reference((1, 1, 1)))


def test_nonfinite_step_is_skipped_by_flag(tmp_path, monkeypatch, reference):
  cfg = runs.tiny(tmp_path / "run", nonfinite="skip", checkpoint_every=1)
  monkeypatch.setenv("JAXNORM_FAULT", "nan@5")
  summary = trainer.train(dataclasses.replace(cfg, keep_checkpoints=8))
  assert summary["stop_reason"] is None and math.isfinite(summary["val_loss"])
  s4, s5 = runs.saved_state(cfg.out_dir, 4), runs.saved_state(cfg.out_dir, 5)
  assert (int(s4["skipped"]), int(s5["skipped"])) == (0, 1)
  assert int(s5["step"]) == 5
  for key in ("params", "opt_state", "rest"):  # Step 5 changed nothing.
    jax.tree.map(np.testing.assert_array_equal, s5[key], s4[key])
  recs = {r["step"]: r for r in runs.records(cfg.out_dir) if "loss" in r}
  ref = {
    r["step"]: r for r in runs.records(reference((1, 1, 1))) if "loss" in r
  }
  assert recs[3] == {**ref[3], "tokens_per_sec": recs[3]["tokens_per_sec"]}
  assert recs[6]["skipped"] == recs[8]["skipped"] == 1
  assert math.isfinite(recs[6]["loss"]) and recs[6]["loss"] != ref[6]["loss"]
