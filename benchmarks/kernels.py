"""Throughput of the Pallas norm kernels against XLA, tokamax and the peak.

Run from the repository root:

  python benchmarks/kernels.py [--rounds 20] [--json out.json]

On a GPU or TPU, for each (shape, dtype) it times, in one process:

* RMSNorm and LayerNorm forward and forward+backward, and the fused
  residual-add + RMSNorm forward and forward+backward, for the compiled
  ``pallas_kernels`` row kernels (on GPU: ``mosaic_gpu``, the default
  lowering, and ``triton`` while the installed JAX has it; on TPU:
  ``mosaic_tpu``), the jitted jnp reference (``implementation="xla"``) and
  ``tokamax.layer_norm`` (every implementation of ``xla``, ``triton``,
  ``mosaic`` that runs on the device; skipped with a note when tokamax is not
  importable);
* achieved GB/s under the minimal byte model (forward: read x, write y = 2
  arrays; forward+backward: also read dy, write dx = 4 arrays; fused add
  forward: read x, r, write h, y = 4; fused add forward+backward: 8), divided
  by the device-to-device copy bandwidth measured in the same process
  (``x + 1`` into a fresh array, 2 arrays), which is the practical peak,
  and the speed-up over XLA and over the fastest tokamax implementation;
* attention TFLOP/s, forward and forward+backward, of the Pallas flash
  kernel (`pallas_kernels.attention`; on GPU its ``mosaic_gpu`` lowering, the
  default, and ``triton`` while the installed JAX has it, as
  ``pallas-<lowering>`` rows) against ``jax.nn.dot_product_attention``
  (``xla`` and, on GPU, ``cudnn``; causal counted as half the FLOPs, the
  backward as 2.5x the forward), with the speed ratio to cuDNN (GPU) or XLA;
  and the chunked causal linear attention kernel per lowering against the
  jnp reference.

Inputs are random (never zeros) and rotated through 4 sets so the working set
is well beyond L2; every case is checked against the float32 reference
before timing; cases are interleaved round-robin and reported as medians.

On CPU it says that no accelerator is present, and only times the
interpreted kernels (each lowering in its interpreter) against the jnp
reference on a small array as a smoke check: interpreter time is not kernel
speed (PERFORMANCE.md 3.5). ``--dry-run`` runs the accelerator table on CPU
with interpreted kernels and tiny shapes, to check the script end to end.

JAX deprecates its Pallas Triton backend; the ``triton`` rows are an
explicit comparison, so its deprecation warning is silenced here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import attention, fused_norms, norms
from pallas_kernels import _rows, dyt_seed
from pallas_kernels import attention as pa
from pallas_kernels import linear_attention as pla
from pallas_kernels import norms as pk

GPU_SHAPES = ((16384, 4096), (8192, 8192), (65536, 1024))
TPU_SHAPES = ((16384, 4096), (8192, 8192), (65536, 1024))
CPU_SHAPE = (64, 256)
_ROTATE = 4
_TOKAMAX_IMPLS = ("xla", "triton", "mosaic")
_DYT_ALPHA = 0.5


def _kernel_backends(backend: str) -> tuple[str, ...]:
  """The row-kernel lowerings to time: both GPU ones, or Mosaic TPU."""
  if backend != "gpu":
    return ("mosaic_tpu",)
  if _rows.triton_available():
    return ("mosaic_gpu", "triton")
  return ("mosaic_gpu",)


def _try_tokamax() -> Any:
  try:
    import tokamax
  except ImportError:
    return None
  return tokamax


def _tokamax_impls(tokamax: Any) -> tuple[str, ...]:
  """The tokamax.layer_norm implementations that run on this device."""
  x = jnp.ones((8, 256), jnp.bfloat16)
  ok = []
  for impl in _TOKAMAX_IMPLS:
    try:
      jax.block_until_ready(
        tokamax.layer_norm(x, None, None, implementation=impl)
      )
    except Exception:  # noqa: BLE001 - unknown or unsupported here: skip it
      continue
    ok.append(impl)
  return tuple(ok)


def _timed(fn: Callable[[Any], Any], arg_sets: list[Any], calls: int) -> float:
  """Seconds per call: ``calls`` calls rotating through ``arg_sets``."""
  start = time.perf_counter()
  out = None
  for i in range(calls):
    out = fn(*arg_sets[i % len(arg_sets)])
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def _measure(
  cases: dict[str, tuple[Callable, list[Any]]], rounds: int, calls: int
) -> dict[str, list[float]]:
  for fn, args in cases.values():  # compile and warm up
    jax.block_until_ready(fn(*args[0]))
    _timed(fn, args, calls)
  times: dict[str, list[float]] = {k: [] for k in cases}
  for _ in range(rounds):  # round-robin
    for name, (fn, args) in cases.items():
      times[name].append(_timed(fn, args, calls))
  return times


def _fwd_bwd(f: Callable[..., Any]) -> Callable[..., Any]:
  """One jitted call returning outputs and all gradients for cotangents."""

  def run(*args):
    inputs, cts = args[:-1], args[-1]
    out, vjp = jax.vjp(f, *inputs)
    return out, vjp(cts)

  return jax.jit(run)


def _norm_cases(
  rows: int,
  cols: int,
  dtype: Any,
  tokamax: Any,
  backend: str,
  interpret: Any = False,
) -> tuple[dict, dict]:
  """The timed callables and their byte counts for one shape and dtype."""
  keys = jax.random.split(jax.random.key(0), 3 * _ROTATE)
  itemsize = jnp.dtype(dtype).itemsize
  arr = rows * cols * itemsize

  def rand(k):
    return jax.random.normal(k, (rows, cols), jnp.float32).astype(dtype)

  xs = [rand(keys[i]) for i in range(_ROTATE)]
  rs = [rand(keys[_ROTATE + i]) for i in range(_ROTATE)]
  dys = [rand(keys[2 * _ROTATE + i]) for i in range(_ROTATE)]
  scale = jnp.ones((cols,), jnp.float32) * 1.5
  bias = jnp.full((cols,), 0.25, jnp.float32)
  impls: dict[str, dict[str, Callable]] = {
    lowering: _pallas_fns(
      None if lowering.startswith("mosaic") else lowering, interpret
    )
    for lowering in _kernel_backends(backend)
  }
  impls.update(
    {
      "xla": {
        "rms": lambda x, s: norms.rms_norm(x, s),
        "ln": lambda x, s, b: norms.layer_norm(x, s, b),
        "add_rms": lambda x, r, s: fused_norms.add_rms_norm(
          x, r, s, implementation="xla"
        ),
        "dyt": lambda x, s: norms.dyt(x, _DYT_ALPHA, s, None),
      },
    }
  )
  if tokamax is not None:
    for impl in _tokamax_impls(tokamax):
      impls[f"tokamax-{impl}"] = {
        "rms": lambda x, s, impl=impl: tokamax.layer_norm(
          x, s, None, subtract_mean=False, implementation=impl
        ),
        "ln": lambda x, s, b, impl=impl: tokamax.layer_norm(
          x, s, b, implementation=impl
        ),
      }
  cases, nbytes = {}, {}
  for impl, fns in impls.items():
    for op, f in fns.items():
      if op in ("rms", "dyt"):
        fwd_args = [(x, scale) for x in xs]
        bwd_args = [(x, scale, dy) for x, dy in zip(xs, dys)]
        n_fwd, n_bwd = 2, 4
      elif op == "ln":
        fwd_args = [(x, scale, bias) for x in xs]
        bwd_args = [(x, scale, bias, dy) for x, dy in zip(xs, dys)]
        n_fwd, n_bwd = 2, 4
      else:
        fwd_args = [(x, r, scale) for x, r in zip(xs, rs)]
        bwd_args = [(x, r, scale, (dy, dy)) for x, r, dy in zip(xs, rs, dys)]
        n_fwd, n_bwd = 4, 8
      cases[f"{op} fwd {impl}"] = (jax.jit(f), fwd_args)
      cases[f"{op} fwd+bwd {impl}"] = (_fwd_bwd(f), bwd_args)
      nbytes[f"{op} fwd {impl}"] = n_fwd * arr
      nbytes[f"{op} fwd+bwd {impl}"] = n_bwd * arr
  return cases, nbytes


def _pallas_fns(backend: str | None, interpret: Any) -> dict[str, Callable]:
  """The row kernels of one lowering (``backend=None``: the default)."""
  kw = {"backend": backend, "interpret": interpret}
  return {
    "rms": lambda x, s: pk.rms_norm_pallas(x, s, **kw),
    "ln": lambda x, s, b: pk.layer_norm_pallas(x, s, b, **kw),
    "add_rms": lambda x, r, s: pk.add_rms_norm_pallas(x, r, s, **kw),
    "dyt": lambda x, s: dyt_seed.dyt_pallas(x, _DYT_ALPHA, s, None, **kw),
  }


def _check(
  cases: dict[str, tuple[Callable, list[Any]]], ref: Callable[[str], str]
) -> dict[str, float]:
  """Max abs error of every case against its baseline ``ref(name)``.

  A case that fails to compile or run is printed and dropped from
  ``cases``, so one broken kernel leaves the rest of the table standing.
  """
  errs = {}
  for name, (fn, args) in list(cases.items()):
    base = ref(name)
    if base == name:
      continue
    try:
      got = fn(*args[0])
      want = cases[base][0](*args[0])
    except Exception as e:  # noqa: BLE001 - report, drop, go on
      print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}")
      del cases[name]
      continue
    diffs = [
      float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    ]
    errs[name] = max(diffs) if diffs else 0.0
  return errs


def _copy_bandwidth(rounds: int, calls: int, size: int = 1 << 28) -> float:
  x = [
    jax.random.normal(jax.random.key(i), (size,), jnp.float32) for i in range(2)
  ]  # 2 x 1 GiB by default
  f = jax.jit(lambda a: a + 1.0)
  t = _measure({"copy": (f, [(a,) for a in x])}, rounds, calls)["copy"]
  return 2 * x[0].nbytes / statistics.median(t)


def _attention(
  backend: str,
  rounds: int,
  calls: int,
  dims: tuple[int, int, int, int] = (4, 4096, 16, 128),
  interpret: Any = False,
) -> list[dict]:
  """Flash kernels vs jax.nn.dot_product_attention, fwd and fwd+bwd.

  ``backend`` is ``"gpu"`` or ``"tpu"`` (the kernel lowerings timed, see
  `_kernel_backends`); with ``interpret`` the kernels run in their
  interpreters and only XLA is the baseline. FLOPs: 4 B N T^2 H forward
  (halved when causal), backward counted as 2.5x the forward (the
  convention of tokamax and FlashAttention papers).
  """
  b, t, h, d = dims
  ks = jax.random.split(jax.random.key(1), 4)
  q, k, v, do = (jax.random.normal(kk, (b, t, h, d), jnp.bfloat16) for kk in ks)
  impls = ("xla", "cudnn") if backend == "gpu" and not interpret else ("xla",)
  fns: dict[str, Callable] = {}
  for causal in (False, True):
    for impl in impls:
      fns[f"{impl} causal={causal}"] = (
        lambda q, k, v, impl=impl, causal=causal: jax.nn.dot_product_attention(
          q, k, v, is_causal=causal, implementation=impl
        )
      )
    for lowering in _kernel_backends(backend):
      fns[f"pallas-{lowering} causal={causal}"] = (
        lambda q, k, v, causal=causal, lowering=lowering: (
          pa.dot_product_attention_pallas(
            q, k, v, is_causal=causal, backend=lowering, interpret=interpret
          )
        )
      )
  cases = {}
  for name, f in fns.items():
    cases[f"{name} fwd"] = (jax.jit(f), [(q, k, v)])
    cases[f"{name} fwd+bwd"] = (_fwd_bwd(f), [(q, k, v, do)])
  errs = _check(cases, lambda n: n.replace(n.split(" ")[0], "xla", 1))
  times = _measure(cases, rounds, calls)
  best = (
    "cudnn" if backend == "gpu" and any("cudnn" in n for n in times) else "xla"
  )
  rows = []
  for name, ts in times.items():
    flops = 4 * b * h * t * t * d * (0.5 if "True" in name else 1.0)
    flops *= 3.5 if name.endswith("fwd+bwd") else 1.0
    med = statistics.median(ts)
    base = statistics.median(times[name.replace(name.split(" ")[0], best, 1)])
    rows.append(
      {
        "case": name,
        "ms": med * 1e3,
        "tflops": flops / med / 1e12,
        f"vs_{best}": base / med,
        "max_err": errs.get(name, 0.0),
      }
    )
  return rows


def _linear_attention(
  backend: str,
  rounds: int,
  calls: int,
  dims: tuple[int, int, int, int] = (4, 8192, 16, 128),
  interpret: Any = False,
) -> list[dict]:
  """Chunked causal linear attention: Pallas kernels vs the jnp reference."""
  b, t, h, d = dims
  ks = jax.random.split(jax.random.key(2), 4)
  q, k, v, do = (jax.random.normal(kk, (b, t, h, d), jnp.bfloat16) for kk in ks)
  fns = {
    "xla": lambda q, k, v: attention.causal_linear_attention(
      q, k, v, implementation="xla"
    ),
  }
  for lowering in _kernel_backends(backend):
    fns[f"pallas-{lowering}"] = lambda q, k, v, lowering=lowering: (
      pla.causal_linear_attention_pallas(
        q, k, v, backend=lowering, interpret=interpret
      )
    )
  cases = {}
  for name, f in fns.items():
    cases[f"{name} fwd"] = (jax.jit(f), [(q, k, v)])
    cases[f"{name} fwd+bwd"] = (_fwd_bwd(f), [(q, k, v, do)])
  errs = _check(cases, lambda n: "xla " + n.split(" ", 1)[1])
  times = _measure(cases, rounds, calls)
  rows = []
  for name, ts in times.items():
    med = statistics.median(ts)
    base = statistics.median(times["xla " + name.split(" ", 1)[1]])
    rows.append(
      {
        "case": f"linear {name}",
        "ms": med * 1e3,
        "vs_xla": base / med,
        "max_err": errs.get(name, 0.0),
      }
    )
  return rows


def run_accelerator(
  backend: str,
  rounds: int,
  calls: int,
  shapes: tuple[tuple[int, int], ...] | None = None,
  dry_run: bool = False,
) -> dict:
  """The accelerator table; ``dry_run`` exercises it on CPU (interpreter)."""
  tokamax = _try_tokamax()
  peak = _copy_bandwidth(rounds, calls, 1 << 16 if dry_run else 1 << 28)
  print(f"measured copy bandwidth: {peak / 1e9:.0f} GB/s (the peak used)")
  if tokamax is None:
    print("tokamax: not importable, its rows are skipped")
  results = {"copy_gbps": peak / 1e9, "norms": [], "attention": []}
  if shapes is None:
    shapes = GPU_SHAPES if backend == "gpu" else TPU_SHAPES
  for rows, cols in shapes:
    for dtype in (jnp.bfloat16, jnp.float32):
      cases, nbytes = _norm_cases(
        rows, cols, dtype, tokamax, backend, interpret=dry_run
      )
      errs = _check(cases, lambda n: n.rsplit(" ", 1)[0] + " xla")
      times = _measure(cases, rounds, calls)
      for name, ts in times.items():
        op, kind, impl = name.split(" ")
        med = statistics.median(ts)
        xla = statistics.median(times[f"{op} {kind} xla"])
        toka = [
          statistics.median(t)
          for n, t in times.items()
          if n.startswith(f"{op} {kind} tokamax-")
        ]
        gbps = nbytes[name] / med / 1e9
        row = {
          "shape": [rows, cols],
          "dtype": jnp.dtype(dtype).name,
          "op": op,
          "pass": kind,
          "impl": impl,
          "us": med * 1e6,
          "min_us": min(ts) * 1e6,
          "gbps": gbps,
          "pct_peak": 100 * gbps * 1e9 / peak,
          "speedup_vs_xla": xla / med,
          "speedup_vs_tokamax": min(toka) / med if toka else None,
          "max_err": errs.get(name, 0.0),
        }
        results["norms"].append(row)
        vs_toka = (
          f"x{row['speedup_vs_tokamax']:.2f} vs tokamax"
          if toka
          else "tokamax n/a"
        )
        print(
          f"{rows}x{cols} {row['dtype']:8s} {op:7s} {kind:7s} "
          f"{impl:14s} {med * 1e6:9.1f} us {gbps:7.0f} GB/s "
          f"{row['pct_peak']:5.1f}% peak  x{row['speedup_vs_xla']:.2f} "
          f"vs xla  {vs_toka}  err {row['max_err']:.1e}"
        )
  # Head dims of 64 in the dry run: the smallest the Mosaic GPU kernels take.
  results["attention"] = _attention(
    backend,
    rounds,
    calls,
    (1, 128, 2, 64) if dry_run else (4, 4096, 16, 128),
    interpret=dry_run,
  )
  results["linear_attention"] = _linear_attention(
    backend,
    rounds,
    calls,
    (1, 256, 2, 64) if dry_run else (4, 8192, 16, 128),
    interpret=dry_run,
  )
  for row in results["attention"] + results["linear_attention"]:
    ratio = {k: v for k, v in row.items() if k.startswith("vs_")}
    flops = f"{row['tflops']:6.1f} TFLOP/s  " if "tflops" in row else ""
    print(
      f"attention {row['case']:30s} {row['ms']:8.2f} ms {flops}"
      + " ".join(f"x{v:.2f} {k}" for k, v in ratio.items())
      + f"  err {row['max_err']:.1e}"
    )
  return results


def run_cpu_smoke(rounds: int) -> dict:
  print(
    "No accelerator present (backend=cpu): GB/s, peak and tokamax "
    "comparisons need a GPU or TPU. Timing the interpreted kernels only "
    "as a smoke check; interpreter time is not kernel speed.\n"
  )
  rows, cols = CPU_SHAPE
  x = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
  dy = jax.random.normal(jax.random.key(1), (rows, cols), jnp.float32)
  s = jnp.full((cols,), 1.5, jnp.float32)
  cases = {
    "rms fwd+bwd xla": (
      _fwd_bwd(lambda x, s: norms.rms_norm(x, s)),
      [(x, s, dy)],
    ),
  }
  lowerings = {
    "mosaic_gpu": (None, True),
    "mosaic_tpu": (None, pltpu.InterpretParams()),
  }
  if _rows.triton_available():
    lowerings["triton"] = ("triton", True)
  for name, (backend, interpret) in lowerings.items():
    cases[f"rms fwd+bwd interpret-{name}"] = (
      _fwd_bwd(_pallas_fns(backend, interpret)["rms"]),
      [(x, s, dy)],
    )
  errs = _check(cases, lambda n: "rms fwd+bwd xla")
  times = _measure(cases, rounds, 1)
  ref = statistics.median(times["rms fwd+bwd xla"])
  out = []
  for name, ts in times.items():
    med = statistics.median(ts)
    out.append(
      {
        "case": name,
        "shape": [rows, cols],
        "ms": med * 1e3,
        "vs_xla": med / ref,
        "max_err": errs.get(name, 0.0),
      }
    )
    print(
      f"{name:34s} {rows}x{cols} f32 {med * 1e3:9.2f} ms  "
      f"{med / ref:7.1f}x the jnp time  max err "
      f"{errs.get(name, 0.0):.1e}"
    )
  return {"cpu_smoke": out}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument(
    "--calls",
    type=int,
    default=10,
    help="calls per timed sample on an accelerator",
  )
  parser.add_argument("--json", default=None, help="write results here")
  parser.add_argument(
    "--shapes", default=None, help="comma-separated ROWSxCOLS, e.g. 16384x4096"
  )
  parser.add_argument(
    "--dry-run",
    action="store_true",
    help="run the accelerator table on CPU with interpreted "
    "kernels and tiny shapes (checks the script, not speed)",
  )
  args = parser.parse_args()
  backend = jax.default_backend()
  backend = "gpu" if backend in ("cuda", "rocm") else backend
  devices = jax.devices()
  header = {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "jax": jax.__version__,
    "backend": backend,
    "device": devices[0].device_kind,
    "host": platform.machine(),
  }
  print(" ".join(f"{k}={v}" for k, v in header.items()))
  shapes = (
    None
    if args.shapes is None
    else tuple(
      tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")
    )
  )
  with warnings.catch_warnings():
    # The triton rows are an explicit comparison with a deprecated backend.
    warnings.filterwarnings(
      "ignore", "The Pallas Triton backend is deprecated", DeprecationWarning
    )
    if args.dry_run:
      print("dry run: interpreted kernels on CPU; the numbers are not speeds")
      results = run_accelerator("gpu", 2, 1, shapes or ((64, 96),), True)
    elif backend in ("gpu", "tpu"):
      results = run_accelerator(backend, args.rounds or 20, args.calls, shapes)
    else:
      results = run_cpu_smoke(args.rounds or 5)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({**header, **results}, f, indent=1)


if __name__ == "__main__":
  main()
