"""Run directories: the lock, a clean start, checkpoints that are verified.

* `RunLock`: one runner per ``out_dir``. A second one is refused with the
  holder's pid; a lock left by a dead process on this host is taken over.
* `move_aside`: ``--no-resume`` moves an earlier run's files to
  ``out_dir/previous-N`` so old and new checkpoints never mix.
* `Checkpoints`: an orbax `CheckpointManager` whose every step holds the
  train state, the grain iterator and a JSON ``run`` item (the config, the
  partial log window, and a fingerprint of the state). A step that does not
  read back, or whose state does not match its fingerprint (flipped bytes,
  a truncated array file, a missing item, an empty directory), is reported
  with a `CorruptCheckpointWarning`, moved to ``out_dir/corrupt/``, and the
  previous step is used instead.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import warnings
from typing import Any

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

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


class RunDirBusyError(RuntimeError):
  """Another live runner holds the lock of the run directory."""


class CorruptCheckpointWarning(UserWarning):
  """A checkpoint did not read back; an older one is used instead."""


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
    )
    self.corrupt_dir = corrupt_dir
    self.primary = primary

  def _discard(self, step: int, error: Exception) -> None:
    path = self.manager.directory / str(step)
    first = (str(error).strip().splitlines() or [""])[0][:200]
    warnings.warn(
      f"checkpoint {path} is corrupt or incomplete ({type(error).__name__}: "
      f"{first}); moved to {self.corrupt_dir} and restoring the previous "
      f"one",
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

  def newest_info(self) -> tuple[int, dict[str, Any]] | None:
    """The newest step whose ``run`` item reads back, with that item."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(
          step, args=ocp.args.Composite(run=ocp.args.JsonRestore())
        )
        return step, dict(restored["run"])
      except Exception as e:  # noqa: BLE001 - any failure means unreadable.
        self._discard(step, e)
    return None

  def restore(
    self, abstract_state: Any, iterator: Any
  ) -> tuple[int, Any, dict[str, Any]] | None:
    """Restores the newest good step into ``abstract_state``'s shardings.

    Args:
      abstract_state: `jax.ShapeDtypeStruct` leaves carrying the shardings
        the current mesh's rules give; every array comes back so.
      iterator: the grain iterator, set to the step's data position.

    Returns:
      ``(step, state, run_item)``, or None if no step reads back.
    """
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(
          step,
          args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=grain.checkpoint.CheckpointRestore(iterator),
            run=ocp.args.JsonRestore(),
          ),
        )
        run = dict(restored["run"])
        got = fingerprint(restored["state"])
        if got != run.get("fingerprint"):
          raise ValueError(
            "the state read back does not match the fingerprint saved with it"
          )
        return step, restored["state"], run
      except Exception as e:  # noqa: BLE001 - any failure means unreadable.
        self._discard(step, e)
    return None

  def save(
    self, step: int, state: Any, iterator: Any, run: dict[str, Any]
  ) -> None:
    """Starts an asynchronous save of ``step`` (skipped if it exists)."""
    if self.manager.latest_step() == step:
      return
    self.manager.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(iterator),
        run=ocp.args.JsonSave({**run, "fingerprint": fingerprint(state)}),
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
