"""Shared plumbing of the experiment scripts: flags, timing, result files."""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxnorm.training import claims


def parser(doc: str) -> argparse.ArgumentParser:
  """Flags every script takes: ``--out`` and ``--quick``."""
  p = argparse.ArgumentParser(description=doc.splitlines()[0])
  p.add_argument(
    "--out", default="experiments/results", help="folder of the result files"
  )
  p.add_argument(
    "--quick", action="store_true", help="toy scale, seconds (the tests)"
  )
  return p


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def mean_spread(values: Any) -> tuple[float, float]:
  """Mean and sample standard deviation (0 for one value)."""
  v = np.asarray(values, np.float64)
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def median_ms(fn: Callable[[Any], Any], x: Any, reps: int) -> float:
  """Median wall time of ``fn(x)`` over ``reps`` calls, in milliseconds.

  One untimed call first (compilation); each timed call waits for the
  result. For benchmark tables only, never for a test.
  """
  jax.block_until_ready(fn(x))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def command_line(name: str, args: argparse.Namespace) -> str:
  """The Markdown line naming the command, duration, host and commit."""
  quick = " --quick" if args.quick else ""
  code = claims.commit()
  dirty = ", uncommitted changes" if code["dirty"] else ""
  return (
    f"Command: `python -m experiments.{name}{quick}` ({args.elapsed:.0f} s "
    f"on {platform.machine()}, commit {code['sha'][:12]}{dirty})."
  )


def run(
  name: str,
  args: argparse.Namespace,
  compute: Callable[[], dict],
  figure: Callable[[dict, pathlib.Path], None],
  markdown: Callable[[dict], list[str]],
) -> dict:
  """Runs ``compute`` and writes ``<out>/<name>.{json,png,md}``.

  ``compute`` returns the result (NumPy values are written as lists);
  ``markdown`` returns the file's lines, a title and a blank line first
  (the command line goes after them), and may read ``args.elapsed``. The
  result's ``claims`` (`jaxnorm.training.claims.record` dicts), if any,
  must pass `claims.check_records` before anything is written.

  Raises:
    ValueError: a claim record's verdict or numbers do not follow from its
      per-seed values.
  """
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  start = time.time()
  # optax mixes Python floats and int32 step counts: standard promotion,
  # also when the caller (the test suite) sets strict promotion.
  with jax.numpy_dtype_promotion("standard"):
    result = compute()
  args.elapsed = time.time() - start
  claims.check_records(result.get("claims", ()))
  (out / f"{name}.json").write_text(
    json.dumps(result, indent=2, default=_jsonable)
  )
  figure(result, out / f"{name}.png")
  lines = markdown(result)
  lines.insert(2, command_line(name, args))
  lines.insert(3, "")
  (out / f"{name}.md").write_text("\n".join(lines) + "\n")
  return result


def _jsonable(x: Any) -> Any:
  return np.asarray(x).tolist()
