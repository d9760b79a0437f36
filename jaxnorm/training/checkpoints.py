"""Run directories: the lock, a clean start, checkpoints that are verified.

* `RunLock`: one runner per ``out_dir``. A second one is refused with the
  holder's pid; a lock left by a dead process on this host is taken over.
* `move_aside`: ``--no-resume`` moves an earlier run's files to
  ``out_dir/previous-N`` so old and new checkpoints never mix.
* `Checkpoints`: an orbax `CheckpointManager` whose every step holds the
  train state, the data position and a JSON ``run`` item (the config, the
  partial log window, a fingerprint of the state, the versions and process
  count that wrote it). The data position (``{"elements": N}``: training
  examples consumed) is the same on every process and for any process
  count, so a run resumes on any number of processes and any mesh.

Restoring sorts every failure into one of two kinds:

* damaged bytes: an item that does not read back (flipped or truncated
  bytes, a missing item, an empty step directory) or a state that does not
  match its fingerprint. The step is reported with a
  `CorruptCheckpointWarning`, moved to ``out_dir/corrupt/``, and the
  previous step is used instead.
* anything else: an item this version does not know, a newer checkpoint
  layout, a state of another structure than the model's, or a state that
  does not read back under other versions of jaxnorm, jax or orbax than
  the writer's (the process count and the mesh may change freely). The
  run stops with `CheckpointIncompatibleError`, naming the reason and what
  to do; nothing on disk is moved, deleted or skipped.

Layout 1 (jaxnorm before the elastic data position) kept grain's
per-process iterator files in a ``data`` item instead of ``position``; such
a step still resumes, on any process count: every process held the same
iterator state, whose ``next_index`` batches of the saved ``batch_size``
give the position.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import socket
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

import jaxnorm

# Run files that belong to one run (moved together by `move_aside`).
RUN_FILES: tuple[str, ...] = (
  "checkpoints",
  "metrics.jsonl",
  "summary.json",
  "loss.png",
  "tensorboard",
  "profile",
)
LOCK_NAME = ".jaxnorm-train.lock"
# The checkpoint layout this version writes, and the items of each layout
# it reads (1: grain's per-process iterator files in ``data``).
LAYOUT = 2
ITEMS: dict[int, frozenset[str]] = {
  1: frozenset({"state", "data", "run"}),
  2: frozenset({"state", "position", "run"}),
}


class RunDirBusyError(RuntimeError):
  """Another live runner holds the lock of the run directory."""


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint did not read back; an older one is used instead."""


class CheckpointIncompatibleError(ValueError):
  """A checkpoint this run cannot continue from; nothing on disk changed."""


class _Damaged(Exception):
  """A step's bytes do not read back (internal: the step is moved aside)."""

  def __init__(self, cause: Exception):
    super().__init__(str(cause))
    self.cause = cause


# The fields of `writer` that decide whether a checkpoint reads back.
_VERSIONS = ("jaxnorm", "jax", "orbax")


def writer() -> dict[str, Any]:
  """What a checkpoint records about the software and processes writing it."""
  return {
    "jaxnorm": jaxnorm.__version__,
    "jax": jax.__version__,
    "orbax": importlib.metadata.version("orbax-checkpoint"),
    "processes": jax.process_count(),
    "devices": jax.device_count(),
  }


def _first_line(error: Exception) -> str:
  return (str(error).strip().splitlines() or [""])[0][:200]


def _leaves(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """``path -> (shape, dtype)`` of every array leaf, paths as ``a/b/0``."""

  def name(key: Any) -> str:
    for attr in ("key", "idx", "name"):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)

  return {
    "/".join(name(k) for k in path): (tuple(leaf.shape), str(leaf.dtype))
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class RunLock:
  """An exclusive lock file on a run directory, held for one run.

  Args:
    out_dir: the run directory (created if missing).
    enabled: take the lock (process 0 of a multi-process run does; the
      others share its directory).

  Raises:
    RunDirBusyError: on entry, if a live process holds the lock.
  """

  def __init__(self, out_dir: pathlib.Path, *, enabled: bool = True):
    self.path = pathlib.Path(out_dir) / LOCK_NAME
    self.enabled = enabled
    self._me = {"pid": os.getpid(), "host": socket.gethostname()}

  def _holder(self) -> dict[str, Any]:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):
      return {}

  def __enter__(self) -> RunLock:
    if not self.enabled:
      return self
    self.path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(self._me)
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      holder = self._holder()
      pid, host = holder.get("pid"), holder.get("host")
      if isinstance(pid, int) and (
        host != self._me["host"] or pid == self._me["pid"] or _alive(pid)
      ):
        raise RunDirBusyError(
          f"{self.path.parent} is in use by another jaxnorm-train (pid "
          f"{pid} on {host}); wait for it to finish or choose another "
          f"--out-dir (if that process is gone, delete {self.path})"
        ) from None
      # A stale lock (its process is dead, or the file is unreadable).
      tmp = self.path.with_suffix(f".{os.getpid()}")
      tmp.write_text(text)
      os.replace(tmp, self.path)
      return self
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return self

  def __exit__(self, *exc: Any) -> None:
    if self.enabled and self._holder() == self._me:
      self.path.unlink()


def move_aside(out_dir: pathlib.Path) -> pathlib.Path | None:
  """Moves an earlier run's files to ``out_dir/previous-N``.

  Returns:
    The folder they went to, or None if there was nothing to move.
  """
  out_dir = pathlib.Path(out_dir)
  present = [out_dir / n for n in RUN_FILES if (out_dir / n).exists()]
  if not present:
    return None
  n = 1
  while (out_dir / f"previous-{n}").exists():
    n += 1
  target = out_dir / f"previous-{n}"
  target.mkdir()
  for path in present:
    shutil.move(str(path), str(target / path.name))
  return target


@jax.jit
def _fingerprint(state: Any) -> Any:
  def words(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
      x = x.astype(jnp.uint8)
    if jnp.iscomplexobj(x):  # Complex parameters: both parts' bits.
      x = jnp.stack([jnp.real(x), jnp.imag(x)])
    bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
    w = jax.lax.bitcast_convert_type(x, bits[x.dtype.itemsize])
    return jnp.sum(w.astype(jnp.uint32), dtype=jnp.uint32)

  return jax.tree.map(words, state)


def fingerprint(state: Any) -> list[int]:
  """Wrapping uint32 sums of every leaf's bit pattern, in leaf order.

  Integer sums are exact in any order, so the fingerprint does not depend
  on the mesh the state is sharded over, and a restore on another mesh
  checks against the one saved.
  """
  return [int(v) for v in jax.tree.leaves(jax.device_get(_fingerprint(state)))]


class Checkpoints:
  """Saves and restores verified checkpoints of one run directory.

  Args:
    directory: the checkpoint folder (``out_dir/checkpoints``).
    keep: checkpoints kept on disk.
    corrupt_dir: where unreadable steps are moved.
    primary: this process moves files (process 0).
  """

  def __init__(
    self,
    directory: pathlib.Path,
    *,
    keep: int,
    corrupt_dir: pathlib.Path,
    primary: bool,
  ):
    self.manager = ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
      item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "position": ocp.JsonCheckpointHandler(),
        "run": ocp.JsonCheckpointHandler(),
      },
    )
    self.corrupt_dir = corrupt_dir
    self.primary = primary

  def _path(self, step: int) -> pathlib.Path:
    return pathlib.Path(self.manager.directory) / str(step)

  def _discard(self, step: int, error: Exception) -> None:
    path = self._path(step)
    warnings.warn(
      f"checkpoint {path} is corrupt or incomplete ({type(error).__name__}: "
      f"{_first_line(error)}); moved to {self.corrupt_dir} and restoring "
      f"the previous one",
      CorruptCheckpointWarning,
      stacklevel=3,
    )
    if self.primary and path.exists():
      self.corrupt_dir.mkdir(parents=True, exist_ok=True)
      n = 1
      while (self.corrupt_dir / f"{step}-{n}").exists():
        n += 1
      shutil.move(str(path), str(self.corrupt_dir / f"{step}-{n}"))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"jaxnorm-discard-{step}")
    self.manager.reload()

  def _incompatible(
    self, step: int, reason: str
  ) -> CheckpointIncompatibleError:
    return CheckpointIncompatibleError(
      f"checkpoint {self._path(step)} cannot be resumed by this run: "
      f"{reason}; nothing on disk was changed (start over with --no-resume, "
      f"which moves the old run aside)"
    )

  def _run_item(self, step: int) -> tuple[dict[str, Any], int]:
    """The step's ``run`` item and layout, after checking its item names."""
    path = self._path(step)
    items = {p.name for p in path.iterdir() if p.is_dir()}
    unknown = sorted(items - ITEMS[1] - ITEMS[LAYOUT])
    if unknown:
      raise self._incompatible(
        step,
        f"it holds items this jaxnorm ({jaxnorm.__version__}) does not know "
        f"({', '.join(unknown)}); resume with the jaxnorm that wrote it",
      )
    try:
      restored = self.manager.restore(
        step, args=ocp.args.Composite(run=ocp.args.JsonRestore())
      )
      run = dict(restored["run"])
    except Exception as e:  # noqa: BLE001 - any read failure: damaged.
      raise _Damaged(e) from e
    layout = run.get("layout", 1)
    saved_by = run.get("writer", {}).get("jaxnorm", "(unknown)")
    if layout not in ITEMS:
      raise self._incompatible(
        step,
        f"its layout {layout} (written by jaxnorm {saved_by}) is newer "
        f"than this jaxnorm's ({jaxnorm.__version__}, layout {LAYOUT}); "
        f"resume with the jaxnorm that wrote it",
      )
    return run, layout

  def _position(self, step: int, run: dict[str, Any], layout: int) -> int:
    """Training elements consumed before ``step``'s checkpoint."""
    if layout == LAYOUT:
      try:
        restored = self.manager.restore(
          step, args=ocp.args.Composite(position=ocp.args.JsonRestore())
        )
        elements = dict(restored["position"])["elements"]
        if not isinstance(elements, int) or elements < 0:
          raise ValueError(f"the data position is {elements!r}")
      except Exception as e:  # noqa: BLE001 - any read failure: damaged.
        raise _Damaged(e) from e
      return elements
    files = sorted((self._path(step) / "data").glob("process_*-of-*.json"))
    try:
      if not files:
        raise FileNotFoundError("the grain iterator files are missing")
      states = [json.loads(f.read_text()) for f in files]
    except (OSError, ValueError) as e:
      raise _Damaged(e) from e
    indices = {
      st.get("next_index") if isinstance(st, dict) else None for st in states
    }
    index = indices.pop() if len(indices) == 1 else None
    batch_size = run.get("config", {}).get("batch_size")
    if not isinstance(index, int) or not isinstance(batch_size, int):
      raise self._incompatible(
        step,
        f"its grain iterator state (layout 1: {files[0].name}, ...) is "
        f"not one this version converts to a data position; resume with "
        f"the jaxnorm that wrote it",
      )
    return index * batch_size

  def _read_failure(
    self, step: int, run: dict[str, Any], error: Exception
  ) -> Exception:
    """Damaged bytes, unless other versions of the software wrote the step."""
    saved, now = run.get("writer", {}), writer()
    changed = [
      f"{k} {saved[k]} -> {now[k]}"
      for k in _VERSIONS
      if k in saved and saved[k] != now[k]
    ]
    if not changed:
      return _Damaged(error)
    return self._incompatible(
      step,
      f"its state does not read back ({type(error).__name__}: "
      f"{_first_line(error)}) and it was written by other versions "
      f"({'; '.join(changed)}); resume with those (if its bytes are "
      f"damaged instead, move it into {self.corrupt_dir})",
    )

  def _check_structure(
    self, step: int, abstract_state: Any, run: dict[str, Any]
  ) -> None:
    try:
      saved = _leaves(self.manager.item_metadata(step)["state"])
    except Exception as e:  # noqa: BLE001 - classified by `_read_failure`.
      raise self._read_failure(step, run, e) from e
    want = _leaves(abstract_state)
    if saved == want:
      return
    diff = sorted(set(saved.items()) ^ set(want.items()))[0][0]
    raise self._incompatible(
      step,
      f"its train state differs from this run's model at {diff} (saved "
      f"{saved.get(diff, 'nothing')}, the model has "
      f"{want.get(diff, 'nothing')}): the model code changed since "
      f"jaxnorm {run.get('writer', {}).get('jaxnorm', '(older)')} wrote it; "
      f"resume with the code that wrote it",
    )

  def _state(self, step: int, abstract_state: Any, run: dict[str, Any]) -> Any:
    try:
      restored = self.manager.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)),
      )
    except Exception as e:  # noqa: BLE001 - classified by `_read_failure`.
      raise self._read_failure(step, run, e) from e
    state = restored["state"]
    if fingerprint(state) != run.get("fingerprint"):
      raise _Damaged(
        ValueError(
          "the state read back does not match the fingerprint saved with it"
        )
      )
    return state

  def newest_info(self) -> tuple[int, dict[str, Any]] | None:
    """The newest step whose ``run`` item reads back, with that item.

    Raises:
      CheckpointIncompatibleError: if that step cannot be resumed for a
        reason other than damaged bytes (nothing on disk is changed).
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        return step, self._run_item(step)[0]
      except _Damaged as e:
        self._discard(step, e.cause)
    return None

  def restore(self, abstract_state: Any) -> tuple[int, Any, dict, int] | None:
    """Restores the newest good step into ``abstract_state``'s shardings.

    Args:
      abstract_state: `jax.ShapeDtypeStruct` leaves carrying the shardings
        the current mesh's rules give; every array comes back so.

    Returns:
      ``(step, state, run_item, elements)`` (``elements``: training
      examples consumed, the data position), or None if no step reads back.

    Raises:
      CheckpointIncompatibleError: for a newest readable step that cannot
        be resumed for a reason other than damaged bytes (see the module
        docstring); nothing on disk is changed.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        run, layout = self._run_item(step)
        elements = self._position(step, run, layout)
        self._check_structure(step, abstract_state, run)
        state = self._state(step, abstract_state, run)
        return step, state, run, elements
      except _Damaged as e:
        self._discard(step, e.cause)
    return None

  def save(
    self, step: int, state: Any, elements: int, run: dict[str, Any]
  ) -> None:
    """Starts an asynchronous save of ``step`` (skipped if it exists).

    Args:
      step: the step just completed.
      state: the train state.
      elements: training examples consumed (the data position).
      run: the JSON ``run`` item (the fingerprint, layout and writer are
        added). It is copied now: the caller may change its lists while
        the save is written in the background.
    """
    if self.manager.latest_step() == step:
      return
    run = json.loads(
      json.dumps(
        {
          **run,
          "layout": LAYOUT,
          "writer": writer(),
          "fingerprint": fingerprint(state),
        }
      )
    )
    self.manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        position=ocp.args.JsonSave({"elements": elements}),
        run=ocp.args.JsonSave(run),
      ),
    )

  def latest_step(self) -> int | None:
    """The newest step on disk (possibly still being written)."""
    return self.manager.latest_step()

  def reached_preemption(self, step: int) -> bool:
    """True on every process at the same step after a preemption notice."""
    return self.manager.reached_preemption(step)

  def close(self) -> None:
    """Waits for pending saves and closes the manager."""
    self.manager.wait_until_finished()
    self.manager.close()
