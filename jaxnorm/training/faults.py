"""Deterministic fault injection for the runner's tests: ``JAXNORM_FAULT``.

``JAXNORM_FAULT`` holds comma-separated faults ``KIND@STEP`` or
``KIND@STEP:PROCESS`` (only that process index):

* ``sigterm@15``: after step 15 (and its checkpoint save, if any, has
  started) the process sends itself SIGTERM, as a scheduler's preemption
  notice would;
* ``sigkill@15``: the same moment, SIGKILL: the process dies mid-run, with
  an asynchronous checkpoint write in flight if step 15 saved one;
* ``nan@15``: step 15's loss (and so its gradient) is multiplied by NaN.

Tests use it so that no result depends on timing; nothing else reads it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
from collections.abc import Mapping, Sequence

import jax

ENV = "JAXNORM_FAULT"
KINDS: tuple[str, ...] = ("sigterm", "sigkill", "nan")
_SIGNALS = {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


@dataclasses.dataclass(frozen=True)
class Fault:
  """One injected fault: ``kind`` at ``step`` on ``process`` (None: all)."""

  kind: str
  step: int
  process: int | None = None


def from_env(environ: Mapping[str, str] = os.environ) -> tuple[Fault, ...]:
  """Parses ``JAXNORM_FAULT``; empty when unset.

  Raises:
    ValueError: for a malformed entry; the message shows the format.
  """
  faults = []
  for item in filter(None, environ.get(ENV, "").split(",")):
    match = re.fullmatch(r"(\w+)@(\d+)(?::(\d+))?", item.strip())
    if not match or match.group(1) not in KINDS:
      raise ValueError(
        f"{ENV}: entries are KIND@STEP or KIND@STEP:PROCESS with KIND one "
        f"of {', '.join(KINDS)}, got {item!r}"
      )
    process = None if match.group(3) is None else int(match.group(3))
    faults.append(Fault(match.group(1), int(match.group(2)), process))
  return tuple(faults)


def _due(faults: Sequence[Fault], kind: str, step: int) -> bool:
  me = jax.process_index()
  return any(
    f.kind == kind and f.step == step and f.process in (None, me)
    for f in faults
  )


def loss_scale(faults: Sequence[Fault], step: int) -> float:
  """NaN at a ``nan`` fault's step, else 1.0."""
  return math.nan if _due(faults, "nan", step) else 1.0


def after_step(faults: Sequence[Fault], step: int) -> None:
  """Sends this process the signal of a ``sigterm``/``sigkill`` fault."""
  for kind, sig in _SIGNALS.items():
    if _due(faults, kind, step):
      os.kill(os.getpid(), sig)
