"""Time per optimizer update step on a 12-layer d=512 decoder LM's parameters.

Run from the repository root:

  python -m benchmarks.optim [--rounds 7] [--warmup 2] [--vocab 32000]
                             [--layers 12] [--d-model 512]
                             [--refresh-rounds 2] [--json out.json]

Cases, all measured in one process and interleaved round-robin (the CPU
method of the project's performance notes: allocator tunables set, medians
after warm-up, minor page faults per call reported): ``optax.adamw``,
``optax.contrib.muon``, jaxnorm ``adamp``, ``sgdp``, ``conda`` (steady step
and basis-refresh step, amortised over its default ``update_proj_gap``) and
``rmnp``. Each step is ``jit(update + apply_updates)`` with parameters and
state donated. Muon, Conda and RMNP send the embedding and the norm scales to
their AdamW branch (the authors' recipes); AdamP/SGDP project every matrix,
as the official code does.

The script re-executes itself once with ``GLIBC_TUNABLES`` set when it is
missing (without it, first-touch page faults dominate on the development VM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

TUNABLES = (
  "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
  "glibc.malloc.trim_threshold=68719476736"
)

if __name__ == "__main__" and os.environ.get("GLIBC_TUNABLES") != TUNABLES:
  os.environ["GLIBC_TUNABLES"] = TUNABLES
  os.execv(
    sys.executable, [sys.executable, "-m", "benchmarks.optim", *sys.argv[1:]]
  )

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from jaxnorm import optim  # noqa: E402


def lm_params(layers: int, d: int, vocab: int, key: jax.Array) -> dict:
  """Parameter tree of a pre-norm decoder LM (Flax ``(in, out)`` kernels)."""
  keys = iter(jax.random.split(key, 6 * layers + 1))

  def dense(din, dout):
    return jax.random.normal(next(keys), (din, dout), jnp.float32) * (din**-0.5)

  tree = {
    "embed": jax.random.normal(next(keys), (vocab, d), jnp.float32) * 0.02,
    "final_norm": jnp.ones((d,), jnp.float32),
  }
  for i in range(layers):
    tree[f"layer_{i:02d}"] = {
      "attn": {n: dense(d, d) for n in ("q", "k", "v", "o")},
      "mlp": {"up": dense(d, 4 * d), "down": dense(4 * d, d)},
      "norm1": jnp.ones((d,), jnp.float32),
      "norm2": jnp.ones((d,), jnp.float32),
    }
  return tree


def hidden_axes(params):
  """MatrixAxes for hidden kernels, None for the embedding and vectors."""

  def rule(path, p):
    name = jax.tree_util.keystr(path)
    return optim.MatrixAxes() if p.ndim == 2 and "embed" not in name else None

  return jax.tree_util.tree_map_with_path(rule, params)


def muon_dims(params):
  def rule(path, p):
    name = jax.tree_util.keystr(path)
    return (
      optax.contrib.MuonDimensionNumbers()
      if p.ndim == 2 and "embed" not in name
      else None
    )

  return jax.tree_util.tree_map_with_path(rule, params)


def minflt() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Case:
  """One optimizer: a donated jitted step and its timings."""

  def __init__(self, name, tx, params, grads, state=None):
    self.name = name
    self.grads = grads

    def step(p, s, g):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    self.fn = jax.jit(step, donate_argnums=(0, 1))
    self.params = jax.tree.map(lambda x: x.copy(), params)
    self.state = (
      tx.init(self.params) if state is None else state(tx.init(self.params))
    )
    self.reset_state = state
    self.times, self.faults, self.first = [], 0, None

  def call(self, timed: bool) -> None:
    """One step; records time and faults when ``timed``."""
    f0, t0 = minflt(), time.perf_counter()
    self.params, self.state = jax.block_until_ready(
      self.fn(self.params, self.state, self.grads)
    )
    dt = time.perf_counter() - t0
    if self.reset_state is not None:
      self.state = self.reset_state(self.state)
    if timed:
      self.times.append(dt)
      self.faults += minflt() - f0
    elif self.first is None:
      self.first = dt

  @property
  def median(self) -> float:
    """Median of the timed calls, seconds."""
    return statistics.median(self.times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--layers", type=int, default=12)
  ap.add_argument("--d-model", type=int, default=512)
  ap.add_argument("--vocab", type=int, default=32000)
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--refresh-rounds", type=int, default=2)
  ap.add_argument("--json", default=None)
  args = ap.parse_args()

  params = lm_params(args.layers, args.d_model, args.vocab, jax.random.key(0))
  grads = jax.tree.map(
    lambda p: 1e-2 * jax.random.normal(jax.random.key(1), p.shape, p.dtype),
    params,
  )
  n_params = sum(p.size for p in jax.tree.leaves(params))
  lr = 1e-3
  gap = 2000  # Conda's default update_proj_gap

  def at_refresh(state):
    # Conda state with count = 0 mod gap: every timed call refreshes.
    return jax.tree.map(
      lambda x: (
        jnp.zeros_like(x) if (x.ndim == 0 and x.dtype == jnp.int32) else x
      ),
      state,
    )

  cases = [
    Case("optax.adamw", optax.adamw(lr, weight_decay=0.01), params, grads),
    Case(
      "optax.contrib.muon",
      optax.contrib.muon(lr, muon_weight_dimension_numbers=muon_dims),
      params,
      grads,
    ),
    Case("jaxnorm adamp", optim.adamp(lr, weight_decay=0.01), params, grads),
    Case(
      "jaxnorm sgdp",
      optim.sgdp(lr, momentum=0.9, weight_decay=0.01),
      params,
      grads,
    ),
    Case(
      "jaxnorm conda (steady step)",
      optim.conda(lr, weight_decay=0.01, update_proj_gap=gap, axes=hidden_axes),
      params,
      grads,
    ),
    Case(
      "jaxnorm rmnp",
      optim.rmnp(lr, weight_decay=0.01, axes=hidden_axes),
      params,
      grads,
    ),
  ]
  # The SVD refresh (72 matrices, XLA:CPU LAPACK) costs seconds per call, so
  # it is timed after the interleaved rounds, --refresh-rounds times.
  refresh_case = Case(
    "jaxnorm conda (refresh step)",
    optim.conda(lr, weight_decay=0.01, update_proj_gap=gap, axes=hidden_axes),
    params,
    grads,
    state=at_refresh,
  )
  # The steady Conda case refreshes on its first (warm-up) call only.
  print(
    f"jax {jax.__version__} {jax.default_backend()} "
    f"{jax.devices()[0].device_kind}; python {platform.python_version()}; "
    f"load {os.getloadavg()}; params {n_params / 1e6:.1f}M; "
    f"GLIBC_TUNABLES={'set' if os.environ.get('GLIBC_TUNABLES') else '-'}",
    flush=True,
  )
  for c in cases:
    for _ in range(args.warmup):
      c.call(False)
    print(f"warm: {c.name} first call {c.first:.1f} s", flush=True)
  for _ in range(args.rounds):
    for c in cases:
      c.call(True)
  refresh_case.call(False)
  for _ in range(args.refresh_rounds):
    refresh_case.call(True)
  cases.insert(5, refresh_case)

  by = {c.name: c for c in cases}
  adamw, muon = by["optax.adamw"].median, by["optax.contrib.muon"].median
  steady = by["jaxnorm conda (steady step)"].median
  refresh = by["jaxnorm conda (refresh step)"].median
  amortised = steady + (refresh - steady) / gap
  rows = []
  for c in cases:
    rows.append(
      dict(
        name=c.name,
        median_ms=c.median * 1e3,
        min_ms=min(c.times) * 1e3,
        first_ms=c.first * 1e3,
        faults_per_call=c.faults / len(c.times),
        vs_adamw=c.median / adamw,
        vs_muon=c.median / muon,
      )
    )
  rows.append(
    dict(
      name=f"jaxnorm conda (amortised, gap {gap})",
      median_ms=amortised * 1e3,
      min_ms=float("nan"),
      first_ms=float("nan"),
      faults_per_call=float("nan"),
      vs_adamw=amortised / adamw,
      vs_muon=amortised / muon,
    )
  )
  print(
    f"\n{args.rounds} interleaved rounds after {args.warmup} warm-up "
    f"calls; {args.layers} layers, d={args.d_model}, vocab={args.vocab}\n"
  )
  print(
    "| optimizer | median ms | min ms | first call ms | faults/call "
    "| / adamw | / muon |"
  )
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['name']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | "
      f"{r['first_ms']:.0f} | {r['faults_per_call']:.0f} | "
      f"{r['vs_adamw']:.2f} | {r['vs_muon']:.3f} |"
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        dict(
          jax=jax.__version__,
          backend=jax.default_backend(),
          args=vars(args),
          rows=rows,
        ),
        f,
        indent=1,
      )


if __name__ == "__main__":
  main()
