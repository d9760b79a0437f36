"""Checkpoint restore errors: damaged bytes are moved aside, nothing else.

A step that does not read back, or whose state misses its fingerprint, is
moved to ``corrupt/`` and the previous step is used; any other reason to
refuse a step (an unknown item, a newer layout, another model structure, a
state that does not read back under other versions) stops with
`CheckpointIncompatibleError` and leaves every file as it was. Layout 1
(grain's per-process iterator files) still restores, on any process count.
"""

import json
import pathlib

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxnorm.training import checkpoints


def _state(shape=(8, 4)):
  return {
    "params": {"w": jnp.arange(32.0).reshape(shape), "b": jnp.ones(4)},
    "step": jnp.int32(3),
  }


def _abstract(state):
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    state,
  )


def _manager(tmp_path):
  return checkpoints.Checkpoints(
    tmp_path / "ck", keep=3, corrupt_dir=tmp_path / "corrupt", primary=True
  )


def _saved(tmp_path, steps=(3,)):
  ckpts = _manager(tmp_path)
  for step in steps:
    ckpts.save(step, _state(), 8 * step, {"window": [], "config": {}})
  ckpts.close()
  return tmp_path / "ck"


def _snapshot(root: pathlib.Path) -> dict[str, bytes]:
  return {
    str(p.relative_to(root)): p.read_bytes()
    for p in sorted(root.rglob("*"))
    if p.is_file()
  }


def _edit_run(step_dir: pathlib.Path, change) -> None:
  path = step_dir / "run" / "metadata"
  run = json.loads(path.read_text())
  change(run)
  path.write_text(json.dumps(run))


def _restore(tmp_path, abstract=None):
  ckpts = _manager(tmp_path)
  try:
    return ckpts.restore(abstract or _abstract(_state()))
  finally:
    ckpts.close()


def test_position_and_writer_saved_with_each_step(tmp_path):
  root = _saved(tmp_path, steps=(3, 5))
  step, state, run, elements = _restore(tmp_path)
  assert (step, elements) == (5, 40)
  assert run["layout"] == checkpoints.LAYOUT == 2
  assert run["writer"]["processes"] == 1 and run["writer"]["jax"]
  assert sorted(p.name for p in (root / "5").iterdir() if p.is_dir()) == [
    "position",
    "run",
    "state",
  ]
  jax.tree.map(np.testing.assert_array_equal, state, _state())


def test_run_item_is_copied_when_save_is_called(tmp_path, monkeypatch):
  # The trainer goes on filling its log window while orbax writes the run
  # item in the background, so the save must hand orbax a copy.
  window = [{"loss": 1.0}]
  ckpts = _manager(tmp_path)
  handed = []
  monkeypatch.setattr(
    ckpts.manager, "save", lambda step, args: handed.append(args)
  )
  ckpts.save(4, _state(), 32, {"window": window, "config": {}})
  window.append({"loss": 2.0})
  assert handed[0]["run"].item["window"] == [{"loss": 1.0}]
  ckpts.close()


def _unknown_item(step_dir):
  (step_dir / "sampler").mkdir()


def _newer_layout(step_dir):
  _edit_run(step_dir, lambda run: run.update(layout=3))


def _other_software_and_bad_bytes(step_dir):
  _edit_run(step_dir, lambda run: run["writer"].update(jax="0.0.1"))
  for p in (step_dir / "state").rglob("*"):
    if p.is_file() and p.parent.name == "d":
      p.write_bytes(p.read_bytes()[:10])


# The failed restore leaves orbax reads behind (pyproject's filterwarnings).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
  "damage,match",
  [
    (
      _unknown_item,
      r"it holds items this jaxnorm \(0\.1\.0\) does not know \(sampler\)",
    ),
    (_newer_layout, r"its layout 3 \(written by jaxnorm 0\.1\.0\) is newer"),
    (
      _other_software_and_bad_bytes,
      r"its state does not read back .* written by other versions "
      r"\(jax 0\.0\.1 -> ",
    ),
  ],
)
def test_other_reasons_stop_and_change_nothing(tmp_path, damage, match):
  root = _saved(tmp_path, steps=(2, 3))
  damage(root / "3")
  before = _snapshot(root)
  with pytest.raises(
    checkpoints.CheckpointIncompatibleError,
    match=rf"checkpoint {root / '3'} cannot be resumed by this run: {match}"
    r".*; nothing on disk was changed \(start over with --no-resume",
  ):
    _restore(tmp_path)
  assert _snapshot(root) == before
  assert not (tmp_path / "corrupt").exists()


def test_another_model_structure_stops(tmp_path):
  root = _saved(tmp_path)
  before = _snapshot(root)
  with pytest.raises(
    checkpoints.CheckpointIncompatibleError,
    match=r"its train state differs from this run's model at params/w "
    r"\(saved \(\(8, 4\), 'float32'\), the model has \(\(4, 8\), "
    r"'float32'\)\): the model code changed",
  ):
    _restore(tmp_path, _abstract(_state((4, 8))))
  assert _snapshot(root) == before


def test_newest_info_stops_on_an_unknown_item(tmp_path):
  root = _saved(tmp_path)
  _unknown_item(root / "3")
  ckpts = _manager(tmp_path)
  with pytest.raises(checkpoints.CheckpointIncompatibleError, match="sampler"):
    ckpts.newest_info()
  ckpts.close()


def _truncate_state(step_dir):
  for p in (step_dir / "state").rglob("*"):
    if p.is_file() and p.parent.name == "d":
      p.write_bytes(p.read_bytes()[:10])


def _wrong_fingerprint(step_dir):
  _edit_run(step_dir, lambda run: run["fingerprint"].reverse())


def _bad_position(step_dir):
  (step_dir / "position" / "metadata").write_text("{")


# The failed restore leaves orbax reads behind (pyproject's filterwarnings).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
  "damage", [_truncate_state, _wrong_fingerprint, _bad_position]
)
def test_damaged_bytes_are_moved_aside(tmp_path, damage):
  root = _saved(tmp_path, steps=(2, 3))
  damage(root / "3")
  with pytest.warns(
    checkpoints.CorruptCheckpointWarning,
    match=rf"checkpoint {root / '3'} is corrupt or incomplete",
  ):
    step, _, _, elements = _restore(tmp_path)
  assert (step, elements) == (2, 16)
  assert (tmp_path / "corrupt" / "3-1").is_dir()


def _layout_1(tmp_path, states, batch_size=8):
  """A step as jaxnorm wrote it before the elastic position (layout 1)."""
  manager = ocp.CheckpointManager(tmp_path / "ck")
  state = _state()
  iterator = iter(grain.MapDataset.range(64).batch(8).to_iter_dataset())
  manager.save(
    3,
    args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(iterator),
      run=ocp.args.JsonSave(
        {
          "config": {"batch_size": batch_size},
          "window": [],
          "fingerprint": checkpoints.fingerprint(state),
        }
      ),
    ),
  )
  manager.wait_until_finished()
  manager.close()
  data = tmp_path / "ck" / "3" / "data"
  for p in data.iterdir():
    p.unlink()
  for i, st in enumerate(states):  # As written by len(states) processes.
    (data / f"process_{i}-of-{len(states)}.json").write_text(json.dumps(st))
  return tmp_path / "ck"


def test_layout_1_written_by_two_processes_restores_on_one(tmp_path):
  _layout_1(tmp_path, [{"next_index": 3}, {"next_index": 3}], batch_size=8)
  step, state, run, elements = _restore(tmp_path)
  assert (step, elements) == (3, 24)
  jax.tree.map(np.testing.assert_array_equal, state, _state())


def test_layout_1_with_disagreeing_processes_stops(tmp_path):
  root = _layout_1(tmp_path, [{"next_index": 3}, {"next_index": 4}])
  before = _snapshot(root)
  with pytest.raises(
    checkpoints.CheckpointIncompatibleError,
    match=r"its grain iterator state \(layout 1: process_0-of-2.json, "
    r"\.\.\.\) is not one this version converts",
  ):
    _restore(tmp_path)
  assert _snapshot(root) == before


def test_layout_1_without_iterator_files_is_damaged(tmp_path):
  root = _layout_1(tmp_path, [])
  with pytest.warns(
    checkpoints.CorruptCheckpointWarning, match="iterator files are missing"
  ):
    assert _restore(tmp_path) is None
  assert not (root / "3").exists()
