"""Throughput of jaxnorm's rms_norm / layer_norm against flax and a stream.

Run from the repository root:

  python benchmarks/norms.py [--rows 8192 --cols 4096 --rounds 9]

For jitted ``rms_norm`` and ``layer_norm`` on a (rows, cols) float32 array it
times the forward pass and the forward+backward pass (one jitted call that
returns ``y``, ``dx`` and the parameter gradients for a given cotangent), and
reports:

* achieved GB/s under the minimal byte model: forward reads ``x`` and writes
  ``y`` (2 arrays); forward+backward reads ``x`` and ``dy`` and writes ``y``
  and ``dx`` (4 arrays); parameter vectors are negligible;
* the ratio of that bandwidth to a streaming elementwise pass (``x + 1`` into
  a fresh output, 2 arrays) timed the same way in the same process;
* the speed ratio to `flax.nnx.RMSNorm` / `flax.nnx.LayerNorm` (called
  through ``nnx.split`` + `jax.jit`, autodiff for the backward pass).

All cases are interleaved round-robin after warm-up and summarized by their
median; minor page faults per call are printed because on a VM a fresh output
page costs microseconds on first touch. The script re-executes itself with
the glibc allocator settings of ``shared/PERFORMANCE.md`` so that freed
buffers are reused instead of returned to the kernel.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time

_TUNABLES = (
  "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
  "glibc.malloc.trim_threshold=68719476736"
)

if os.environ.get("GLIBC_TUNABLES") != _TUNABLES:
  os.environ["GLIBC_TUNABLES"] = _TUNABLES
  os.execv(sys.executable, [sys.executable, *sys.argv])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from jaxnorm import norms  # noqa: E402


def _flax_fn(module):
  graphdef, state = nnx.split(module)

  def apply(x, params):
    return nnx.merge(graphdef, params)(x)

  return apply, state


def _fwd_bwd(apply):
  def run(x, params, dy):
    y, vjp = jax.vjp(apply, x, params)
    dx, dparams = vjp(dy)
    return y, dx, dparams

  return run


def build_cases(rows, cols):
  """Returns {name: (jitted fn, args, arrays moved)}."""
  key = jax.random.key(0)
  kx, kd = jax.random.split(key)
  x = jax.random.normal(kx, (rows, cols), jnp.float32)
  dy = jax.random.normal(kd, (rows, cols), jnp.float32)
  scale = jnp.linspace(0.5, 1.5, cols, dtype=jnp.float32)
  bias = jnp.linspace(-0.5, 0.5, cols, dtype=jnp.float32)

  def rms(x, p):
    return norms.rms_norm(x, p["scale"])

  def ln(x, p):
    return norms.layer_norm(x, p["scale"], p["bias"])

  rms_p = {"scale": scale}
  ln_p = {"scale": scale, "bias": bias}
  flax_rms, flax_rms_p = _flax_fn(
    nnx.RMSNorm(cols, epsilon=1e-6, rngs=nnx.Rngs(0))
  )
  flax_ln, flax_ln_p = _flax_fn(
    nnx.LayerNorm(cols, epsilon=1e-6, rngs=nnx.Rngs(0))
  )
  return {
    "stream x+1": (jax.jit(lambda x: x + 1.0), (x,), 2),
    "rms_norm fwd": (jax.jit(rms), (x, rms_p), 2),
    "flax RMSNorm fwd": (jax.jit(flax_rms), (x, flax_rms_p), 2),
    "layer_norm fwd": (jax.jit(ln), (x, ln_p), 2),
    "flax LayerNorm fwd": (jax.jit(flax_ln), (x, flax_ln_p), 2),
    "rms_norm fwd+bwd": (jax.jit(_fwd_bwd(rms)), (x, rms_p, dy), 4),
    "flax RMSNorm fwd+bwd": (
      jax.jit(_fwd_bwd(flax_rms)),
      (x, flax_rms_p, dy),
      4,
    ),
    "layer_norm fwd+bwd": (jax.jit(_fwd_bwd(ln)), (x, ln_p, dy), 4),
    "flax LayerNorm fwd+bwd": (
      jax.jit(_fwd_bwd(flax_ln)),
      (x, flax_ln_p, dy),
      4,
    ),
  }


def _time_call(fn, args):
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  elapsed = time.perf_counter() - start
  return elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def measure(cases, rounds, warmup):
  """Round-robin timing; returns {name: (median s, min s, faults/call)}."""
  for fn, args, _ in cases.values():
    for _ in range(warmup):
      jax.block_until_ready(fn(*args))
  times = {name: [] for name in cases}
  faults = {name: [] for name in cases}
  for _ in range(rounds):
    for name, (fn, args, _) in cases.items():
      t, f = _time_call(fn, args)
      times[name].append(t)
      faults[name].append(f)
  return {
    name: (
      statistics.median(times[name]),
      min(times[name]),
      statistics.median(faults[name]),
    )
    for name in cases
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=8192)
  parser.add_argument("--cols", type=int, default=4096)
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--warmup", type=int, default=2)
  args = parser.parse_args()

  cases = build_cases(args.rows, args.cols)
  results = measure(cases, args.rounds, args.warmup)
  array_bytes = args.rows * args.cols * 4
  gbs = {
    name: cases[name][2] * array_bytes / results[name][0] / 1e9
    for name in cases
  }
  stream = gbs["stream x+1"]

  print(
    f"jax {jax.__version__} on {jax.default_backend()} "
    f"({platform.processor() or platform.machine()}, "
    f"{os.cpu_count()} cpus), load {os.getloadavg()[0]:.2f}, "
    f"f32[{args.rows},{args.cols}], {args.rounds} rounds, median"
  )
  print(
    "| case | median ms | min ms | GB/s | / stream | vs flax "
    "(speedup) | faults/call |"
  )
  print("|---|---|---|---|---|---|---|")
  for name, (median, best, fault) in results.items():
    flax_name = None
    if not name.startswith(("flax", "stream")):
      kind = "RMSNorm" if name.startswith("rms") else "LayerNorm"
      flax_name = f"flax {kind} {name.split(' ', 1)[1]}"
    speedup = f"{results[flax_name][0] / median:.2f}x" if flax_name else ""
    print(
      f"| {name} | {median * 1e3:.1f} | {best * 1e3:.1f} | "
      f"{gbs[name]:.1f} | {gbs[name] / stream:.2f} | {speedup} | "
      f"{fault:.0f} |"
    )


if __name__ == "__main__":
  main()
