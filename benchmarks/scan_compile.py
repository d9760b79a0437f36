"""Compile time and step time of the scanned LM against the unrolled one.

Run from the repository root:

  python benchmarks/scan_compile.py [--width 64 --depths 2,48 --step-depth 4]

Compile time: the train step (loss, gradient and an optax AdamW update) of
the byte LM (pre-norm RMSNorm, softmax attention, GELU MLP x4) is traced,
lowered and compiled on abstract arguments for a shallow and a deep stack,
with ``scan_layers=False`` (one copy of the layer per depth in the program)
and ``scan_layers=True`` (one layer under ``nnx.scan``). Each program is
built from a fresh function and compiled once. The table reports seconds and
the ratio deep / shallow of each layout (goal for the scanned stack: <= 2).

Step time: both layouts at ``--step-depth`` layers, the scanned one holding
the unrolled one's parameters (`jaxnorm.nn.models.stack_layers`), train the
same batch under `jax.jit` with donated state, interleaved round-robin after
warm-up; the table reports median step time and the ratio scanned /
unrolled (goal: <= 1.05).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from jaxnorm.nn import models  # noqa: E402


def train_step(graphdef, rest, tx):
  """The jitted train step of a split model: loss, grad, AdamW update."""

  def step(params, opt_state, batch):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params, rest, copy=True)(batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch[:, 1:]
      ).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(step, donate_argnums=(0, 1))


def compile_seconds(config, tx, batch_shape):
  """Seconds to trace + lower and to compile the train step, abstractly."""
  model = nnx.eval_shape(lambda: models.DecoderLM(config, rngs=nnx.Rngs(0)))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = jax.eval_shape(tx.init, params)
  batch = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
  start = time.perf_counter()
  lowered = train_step(graphdef, rest, tx).lower(params, opt_state, batch)
  traced = time.perf_counter()
  lowered.compile()
  return traced - start, time.perf_counter() - traced


def step_seconds(configs, tx, batch, rounds, steps_per_round):
  """Median step seconds of each model, the scanned one stacked."""
  base = models.DecoderLM(configs["unrolled"], rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(base, nnx.Param, ...)
  scanned = nnx.eval_shape(
    lambda: models.DecoderLM(configs["scanned"], rngs=nnx.Rngs(0))
  )
  runs = {
    "unrolled": [train_step(graphdef, rest, tx), params],
    "scanned": [
      train_step(
        nnx.graphdef(scanned),
        models.stack_layers(rest, configs["unrolled"], constants=True),
        tx,
      ),
      # Copies: the unrolled step donates the arrays both states hold.
      jax.tree.map(jnp.copy, models.stack_layers(params, configs["unrolled"])),
    ],
  }
  for run in runs.values():
    run.append(tx.init(run[1]))
    run.append([])
    for _ in range(2):  # Warm-up (compile) twice.
      run[1], run[2], loss = run[0](run[1], run[2], batch)
      jax.block_until_ready(loss)
  for _ in range(rounds):
    for run in runs.values():
      start = time.perf_counter()
      for _ in range(steps_per_round):
        run[1], run[2], loss = run[0](run[1], run[2], batch)
      jax.block_until_ready(loss)
      run[3].append((time.perf_counter() - start) / steps_per_round)
  return {name: statistics.median(run[3]) for name, run in runs.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=64)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--depths", default="2,48", help="shallow,deep")
  parser.add_argument("--step-depth", type=int, default=4)
  parser.add_argument("--seq-len", type=int, default=64)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps-per-round", type=int, default=3)
  args = parser.parse_args()
  shallow, deep = (int(d) for d in args.depths.split(","))

  tx = optax.adamw(1e-3, weight_decay=0.1)
  config = models.LMConfig(
    width=args.width,
    num_heads=args.heads,
    max_len=args.seq_len,
    norm="rmsnorm",
    attention="softmax",
    residual="prenorm",
    activation="gelu",
  )
  batch_shape = (args.batch, args.seq_len + 1)
  compile_rows = {}
  for layout, scan in (("unrolled", False), ("scanned", True)):
    for depth in (shallow, deep):
      c = dataclasses.replace(config, depth=depth, scan_layers=scan)
      compile_rows[layout, depth] = compile_seconds(c, tx, batch_shape)

  configs = {
    layout: dataclasses.replace(
      config, depth=args.step_depth, scan_layers=layout == "scanned"
    )
    for layout in ("unrolled", "scanned")
  }
  batch = jax.random.randint(jax.random.key(1), batch_shape, 0, 256)
  steps = step_seconds(configs, tx, batch, args.rounds, args.steps_per_round)

  print(
    f"jax {jax.__version__} on {jax.default_backend()}, "
    f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; "
    f"d={args.width} H={args.heads} T={args.seq_len} B={args.batch}; "
    "train step = loss + grad + adamw"
  )
  print()
  print(
    f"| layout | trace+lower s (L={shallow}) | compile s (L={shallow}) | "
    f"trace+lower s (L={deep}) | compile s (L={deep}) | "
    f"total L={deep} / L={shallow} |"
  )
  print("|---|---|---|---|---|---|")
  for layout in ("unrolled", "scanned"):
    (lo_s, co_s), (lo_d, co_d) = (
      compile_rows[layout, shallow],
      compile_rows[layout, deep],
    )
    print(
      f"| {layout} | {lo_s:.2f} | {co_s:.2f} | {lo_d:.2f} | {co_d:.2f} | "
      f"{(lo_d + co_d) / (lo_s + co_s):.2f} |"
    )
  print()
  print(
    f"Step time at L={args.step_depth}, median of {args.rounds} rounds x "
    f"{args.steps_per_round} steps:"
  )
  print()
  print("| layout | step ms | / unrolled |")
  print("|---|---|---|")
  for layout in ("unrolled", "scanned"):
    print(
      f"| {layout} | {steps[layout] * 1e3:.1f} | "
      f"{steps[layout] / steps['unrolled']:.3f} |"
    )


if __name__ == "__main__":
  main()
