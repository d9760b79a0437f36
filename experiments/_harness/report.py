"""Shared plumbing of the experiment scripts: flags, timing, result files."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from experiments._harness import tiers
from jaxnorm.nn import model_registry
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


def claims_axes(ax: Any, records: Sequence[Mapping[str, Any]]) -> None:
  """The claims' paired differences on one axis, as improvements.

  One row per record: the mean improvement of ``a`` over ``b`` (``b - a``
  for a ``lower`` metric, ``a - b`` for a ``higher`` one) in units of the
  claim's margin (or of the metric when the margin is 0), with its paired
  interval; dashed lines at 0 and at +-1 margin. A verdict labels each
  row.
  """
  ys = range(len(records))
  for y, rec in zip(ys, records):
    sign = -1.0 if rec["direction"] == "lower" else 1.0
    unit = rec["margin"] or 1.0
    mean = rec["mean_diff"]
    if mean is None:
      continue
    x = sign * mean / unit
    if rec["ci"] is not None and None not in rec["ci"]:
      lo, hi = sorted(sign * v / unit for v in rec["ci"])
      ax.errorbar(x, y, xerr=[[x - lo], [hi - x]], fmt="o", capsize=3)
    else:
      ax.plot(x, y, "o")
    ax.annotate(
      rec["verdict"], (x, y), textcoords="offset points", xytext=(0, 6),
      ha="center", fontsize=7,
    )  # fmt: skip
  ax.axvline(0.0, color="k", lw=0.8)
  for m in (-1.0, 1.0):
    ax.axvline(m, color="grey", lw=0.8, ls="--")
  ax.set_yticks(
    list(ys), [f"{r['a']} vs {r['b']}\n({r['metric']})" for r in records],
    fontsize=7,
  )  # fmt: skip
  ax.invert_yaxis()
  ax.set_xlabel("improvement of a over b, in margins (0-margin claims: units)")
  ax.set_title("paired difference, one-sided bounds at each claim's level")


def curves_axes(
  ax: Any,
  curves: Mapping[str, Sequence[Sequence[tuple[int, float]]]],
  ylabel: str = "validation loss (nats)",
) -> None:
  """Per variant, the mean curve over seeds and its min-max band.

  ``curves`` maps a variant to one ``[(step, value), ...]`` per seed (e.g.
  `grid.val_curves`); the seeds are cut to the shortest curve.
  """
  for name, runs in curves.items():
    n = min(len(c) for c in runs)
    if n == 0:
      continue
    steps = [s for s, _ in runs[0][:n]]
    vals = np.array([[v for _, v in c[:n]] for c in runs])
    (line,) = ax.plot(steps, vals.mean(0), label=name)
    ax.fill_between(
      steps, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2
    )
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.set_title("validation loss (mean, min-max over seeds)")
  ax.legend(fontsize=7)


def cells_bars(
  ax: Any,
  cells: Mapping[str, Mapping[str, Any]],
  names: Sequence[str] | None = None,
  *,
  rotation: float = 45,
) -> None:
  """One bar per cell (`grid.cells`): its mean, one-std error bars.

  ``names``: the cells shown, in order (default: all); each labels its
  bar, turned by ``rotation`` degrees.
  """
  names = list(cells) if names is None else list(names)
  ax.bar(
    range(len(names)),
    [cells[n]["mean"] for n in names],
    yerr=[cells[n]["std"] for n in names],
    capsize=3,
  )
  ax.set_xticks(
    range(len(names)),
    names,
    rotation=rotation,
    ha="right" if rotation else "center",
  )


def cite(paper: Mapping[str, Any]) -> str:
  """``"DyT (arXiv:2503.10622)"``, or the source of a paper without one."""
  where = (
    f"arXiv:{paper['arxiv']}"
    if paper.get("arxiv")
    else paper.get("source", "no arXiv id")
  )
  return f"{paper['name']} ({where})"


def _difference(rec: Mapping[str, Any]) -> str:
  """A record's mean ``a - b`` with its two-sided interval and level."""
  if rec["ci"] is None:
    return "—" if rec["mean_diff"] is None else f"{rec['mean_diff']:+.4g}"
  lo, hi = rec["ci"]
  pct = f"{100 * (2 * rec['level'] - 1):g}%"
  return f"{rec['mean_diff']:+.4g} [{lo:+.4g}, {hi:+.4g}] ({pct})"


# After a script's own verdicts: where the table-wide correction lives.
HOLM_NOTE = (
  "These are this script's verdicts. [RESULTS.md](../RESULTS.md) applies "
  "Holm-Bonferroni across every script's superiority claims, which can "
  "turn a `reproduced` here into `inconclusive` there."
)


def verdict_table(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """Markdown rows of claim records (`jaxnorm.training.claims.record`).

  Columns: paper, arms and claim, kind, margin, mean ``a - b`` with its
  interval, n and the bold verdict.
  """
  head = ["paper", "claim", "kind", "margin", "a − b", "n", "verdict"]
  rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in records:
    cells = [
      cite(r["paper"]),
      f"{r['a']} vs {r['b']}: {r['claim']}",
      r["kind"],
      f"{r['margin']:g}",
      _difference(r),
      str(r["n"]),
      f"**Verdict: {r['verdict']}**",
    ]
    rows.append("| " + " | ".join(cells) + " |")
  return rows


def why_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """Markdown after a verdict table: each record's arms, metric and why."""
  return [
    "",
    "Why each verdict:",
    "",
    *(f"- {r['a']} vs {r['b']} ({r['metric']}): {r['why']}" for r in records),
  ]


def runner_lines(base: Any, seeds: Sequence[int]) -> list[str]:
  """A Markdown paragraph: the runner config every arm starts from."""
  spec = model_registry.spec(base.model)
  window = f"{base.seq_len}-token windows, " if spec.data == "text" else ""
  heads = f"{base.num_heads} heads, " if spec.heads else ""
  return [
    f"Runner config: `{base.model}` of width {base.width}, depth "
    f"{base.depth}, {heads}{window}batch {base.batch_size}, "
    f"{base.steps} {base.optimizer} steps ({base.schedule} schedule, "
    f"warm-up {base.warmup_steps}, weight decay {base.weight_decay}, "
    f"clip {base.clip_norm}) on `{base.data}`, seeds {list(seeds)}; the "
    f"validation metrics over {base.eval_batches} held-out batches; cells "
    "are mean ± sample std (ddof=1) over seeds.",
    "",
  ]


def sweep_rows(sweeps: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """A Markdown table of `grid.tuned_grid`'s learning-rate sweeps."""
  out = [
    "| variant | chosen | grid: final training loss |",
    "|---|---|---|",
  ]
  for name, sweep in sweeps.items():
    scores = ", ".join(f"{lr}: {v:.3f}" for lr, v in sweep["grid"].items())
    inside = "" if sweep["inside"] else " (at the grid's end)"
    out.append(f"| {name} | {sweep['learning_rate']:g}{inside} | {scores} |")
  return out


def sweep_lines(sweeps: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """`sweep_rows` under its heading, then a blank line."""
  return [
    "## Learning rates (seed 0, chosen by the final training loss)",
    "",
    *sweep_rows(sweeps),
    "",
  ]


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


def trained_text(trained: Mapping[str, Any]) -> str:
  """`trained_runs` in words: runs, training time, their commits."""
  untimed = f", {trained['untimed']} untimed" if trained["untimed"] else ""
  commits = ", ".join(c[:12] for c in trained["commits"])
  default = trained.get("default_seconds", trained["seconds"])
  share = (
    f" ({default / 60:.0f} of them the default tier's)"
    if default != trained["seconds"]
    else ""
  )
  return (
    f"{trained['runs']} runs, {trained['seconds'] / 60:.0f} min of "
    f"training{share}{untimed}, at {commits}"
  )


def machine_text(run: Mapping[str, Any]) -> str:
  """A provenance's machine in words: architecture, CPU, CPU count.

  The CPU where recorded: records made before `host_cpu` do not name it.
  """
  cpu = f" ({run['cpu']})" if run.get("cpu") else ""
  return f"{run.get('machine', '?')}{cpu} with {run.get('cpus', '?')} CPUs"


def command_line(run: Mapping[str, Any]) -> str:
  """The Markdown line of a `provenance`: command, seconds, host, commit.

  With the runs behind it (``run["trained"]``, `trained_runs`) when the
  result has grid lines.
  """
  code = run["commit"]
  dirty = ", uncommitted changes" if code["dirty"] else ""
  trained = run.get("trained") or {}
  runs = f" Runs: {trained_text(trained)}." if trained.get("runs") else ""
  return (
    f"Command: `{run['command']}` ({run['seconds']:.0f} s on "
    f"{machine_text(run)}, load {run['load_average']}, "
    f"jax {run['jax']}, {run['date']}, commit {code['sha'][:12]}{dirty})."
    f"{runs}"
  )


# The x86 vector extensions XLA's CPU compiler chooses its kernels by: two
# hosts that differ in them round float32 differently (RESULTS.md's limits).
VECTOR_FLAGS = (
  "sse4_2",
  "avx",
  "avx2",
  "fma",
  "avx512f",
  "avx512_bf16",
  "avx512_vnni",
  "amx_tile",
)


def host_cpu(cpuinfo: str | None = None) -> str:
  """The CPU a result ran on: model, vector extensions and cache size.

  Read from ``/proc/cpuinfo`` (or the text given); where there is none
  (not Linux), `platform.processor`.
  """
  if cpuinfo is None:
    path = pathlib.Path("/proc/cpuinfo")
    cpuinfo = path.read_text() if path.exists() else ""
  fields: dict[str, str] = {}
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip(), value.strip())
  if "model name" not in fields:
    return platform.processor() or "unknown"
  flags = set(fields.get("flags", "").split())
  vector = " ".join(f for f in VECTOR_FLAGS if f in flags) or "no SSE4.2 or AVX"
  cache = fields.get("cache size")
  return "; ".join(
    [fields["model name"], vector] + ([f"cache {cache}"] if cache else [])
  )


def provenance(name: str, args: argparse.Namespace) -> dict[str, Any]:
  """Where and how a result was made: the ``run`` entry of its JSON.

  The command, tier, seconds, machine (architecture, CPU (`host_cpu`),
  CPUs, load), jax version, date and commit (`claims.commit`).
  """
  tier = tiers.tier(args)
  flags = {"quick": " --quick", "full": " --full"}.get(tier, "")
  if getattr(args, "seeds", None) is not None:
    flags += f" --seeds {args.seeds}"
  return {
    "command": f"python -m experiments.{name}{flags}",
    "tier": tier,
    "seconds": round(args.elapsed, 1),
    "machine": platform.machine(),
    "cpu": host_cpu(),
    "cpus": os.cpu_count(),
    "load_average": round(os.getloadavg()[0], 2),
    "jax": jax.__version__,
    "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "commit": claims.commit(),
  }


def trained_runs(runs: str | pathlib.Path) -> dict[str, Any]:
  """The training behind a result: the grid tables under its ``--runs``.

  A grid skips finished runs, so a result can be written at a later commit
  than its runs trained at; this is what the runs themselves recorded, for
  every line of every JSON-lines table under ``runs`` (learning-rate
  sweeps, parents and probes' runs included).

  Returns:
    ``runs`` (table lines), ``seconds`` (their summed wall time),
    ``default_seconds`` (that of the lines the default tier trains: seeds
    below `tiers.DEFAULT_SEEDS`, sweeps included; a ``--seeds 5`` second
    look adds the rest), ``untimed`` (lines written before they recorded a
    time) and ``commits`` (the commits they trained at, ``"unrecorded"``
    for lines written before they recorded one).
  """
  root = pathlib.Path(runs)
  # A grid's run directories (`grid.run_dir`) hold the runs' own logs.
  tables = [
    t
    for t in sorted(root.rglob("*.jsonl"))
    if "runs" not in t.relative_to(root).parts[:-1]
  ]
  lines = [
    json.loads(text)
    for table in tables
    for text in table.read_text().splitlines()
    if text.strip()
  ]
  lines = [ln for ln in lines if {"variant", "seed", "changes"} <= ln.keys()]
  timed = [ln for ln in lines if ln.get("seconds") is not None]
  commits = {(ln.get("commit") or {}).get("sha", "unrecorded") for ln in lines}
  return {
    "runs": len(lines),
    "seconds": round(sum(ln["seconds"] for ln in timed), 1),
    "default_seconds": round(
      sum(ln["seconds"] for ln in timed if ln["seed"] < tiers.DEFAULT_SEEDS),
      1,
    ),
    "untimed": len(lines) - len(timed),
    "commits": sorted(commits),
  }


def run(
  name: str,
  doc: str,
  args: argparse.Namespace,
  compute: Callable[[], dict],
  figure: Callable[[dict, pathlib.Path], None],
  markdown: Callable[[dict], list[str]],
) -> dict:
  """Runs ``compute`` and writes ``<out>/<name>.{json,png,md}``.

  ``compute`` returns the result (NumPy values are written as lists). The
  Markdown file is: the first line of ``doc`` as its title, the command
  line, the lines ``markdown`` returns (the script's own settings and
  tables; it may read ``args.elapsed``), then, for a result with claims,
  the claims' verdict table, why each verdict and `HOLM_NOTE`. The
  result's ``run`` is its `provenance`, with the runs behind it
  (`trained_runs` of ``args.runs``) under ``trained``. The result's ``claims``
  (`jaxnorm.training.claims.record` dicts), if any, must pass
  `claims.check_records` before anything is written.

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
  records = result.get("claims", ())
  claims.check_records(records)
  result["run"] = provenance(name, args)
  if getattr(args, "runs", None) is not None:
    result["run"]["trained"] = trained_runs(args.runs)
  (out / f"{name}.json").write_text(
    json.dumps(result, indent=2, default=_jsonable)
  )
  figure(result, out / f"{name}.png")
  lines = [f"# {doc.splitlines()[0]}", "", command_line(result["run"]), ""]
  lines += markdown(result)
  while lines[-1] == "":
    lines.pop()
  if records:
    lines += ["", "## Claims", "", *verdict_table(records)]
    lines += why_lines(records) + ["", HOLM_NOTE]
  (out / f"{name}.md").write_text("\n".join(lines) + "\n")
  return result


def _jsonable(x: Any) -> Any:
  return np.asarray(x).tolist()
