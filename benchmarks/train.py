"""Training throughput of the jaxnorm LM against a plain flax.nnx transformer.

Run from the repository root:

  python benchmarks/train.py [--width 128 --depth 4 --seq-len 128 --batch 32]

Both models have the same size and wiring (pre-norm RMSNorm blocks, causal
softmax attention, GELU MLP of ratio 4, learned positions, tied byte
embeddings) and train with the same optax AdamW step under `jax.jit` on the
same batch. The steps are interleaved round-robin after warm-up; the table
reports median step time, tokens/s and the jaxnorm / plain ratio (goal:
>= 0.95).
"""

from __future__ import annotations

import argparse
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


class PlainBlock(nnx.Module):
  """Pre-norm transformer block written directly with flax.nnx."""

  def __init__(self, d: int, heads: int, rngs: nnx.Rngs):
    self.heads = heads
    self.norm1 = nnx.RMSNorm(d, epsilon=1e-6, rngs=rngs)
    self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)
    self.out = nnx.Linear(d, d, use_bias=False, rngs=rngs)
    self.norm2 = nnx.RMSNorm(d, epsilon=1e-6, rngs=rngs)
    self.up = nnx.Linear(d, 4 * d, use_bias=False, rngs=rngs)
    self.down = nnx.Linear(4 * d, d, use_bias=False, rngs=rngs)

  def __call__(self, x):
    b, t, d = x.shape
    q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
    shape = (b, t, self.heads, d // self.heads)
    a = jax.nn.dot_product_attention(
      q.reshape(shape), k.reshape(shape), v.reshape(shape), is_causal=True
    )
    x = x + self.out(a.reshape(b, t, d))
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x)), approximate=False))


class PlainLM(nnx.Module):
  """Embedding, blocks, final RMSNorm, tied head."""

  def __init__(self, vocab, d, depth, heads, max_len, rngs):
    self.embed = nnx.Embed(vocab, d, rngs=rngs)
    self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (max_len, d)))
    self.blocks = nnx.List([PlainBlock(d, heads, rngs) for _ in range(depth)])
    self.norm = nnx.RMSNorm(d, epsilon=1e-6, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.pos[...][None, : tokens.shape[1]]
    for block in self.blocks:
      x = block(x)
    return self.embed.attend(self.norm(x))


def make_step(model, tx):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def step(params, opt_state, batch):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params, rest, copy=True)(batch[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch[:, 1:]
      ).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(step, donate_argnums=(0, 1)), params, tx.init(params)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=128)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps-per-round", type=int, default=3)
  args = parser.parse_args()

  tx = optax.adamw(1e-3, weight_decay=0.1)
  ours = models.DecoderLM(
    models.LMConfig(
      width=args.width,
      depth=args.depth,
      num_heads=args.heads,
      max_len=args.seq_len,
      norm="rmsnorm",
      attention="softmax",
      residual="prenorm",
      activation="gelu",
    ),
    rngs=nnx.Rngs(0),
  )
  plain = PlainLM(
    256, args.width, args.depth, args.heads, args.seq_len, nnx.Rngs(0)
  )
  batch = jax.random.randint(
    jax.random.key(1), (args.batch, args.seq_len + 1), 0, 256
  )
  runs = {}
  for name, model in (("jaxnorm LM", ours), ("plain flax.nnx", plain)):
    step, params, opt_state = make_step(model, tx)
    count = sum(p.size for p in jax.tree.leaves(params))
    runs[name] = [step, params, opt_state, count, []]
  for run in runs.values():  # Warm-up (compile) twice.
    for _ in range(2):
      run[1], run[2], loss = run[0](run[1], run[2], batch)
      jax.block_until_ready(loss)
  for _ in range(args.rounds):
    for run in runs.values():
      start = time.perf_counter()
      for _ in range(args.steps_per_round):
        run[1], run[2], loss = run[0](run[1], run[2], batch)
      jax.block_until_ready(loss)
      run[4].append((time.perf_counter() - start) / args.steps_per_round)

  tokens = args.batch * args.seq_len
  print(
    f"jax {jax.__version__} on {jax.default_backend()}, "
    f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; "
    f"d={args.width} L={args.depth} H={args.heads} T={args.seq_len} "
    f"B={args.batch}; median of {args.rounds} rounds x "
    f"{args.steps_per_round} steps"
  )
  print("| model | params | step ms | tokens/s | / plain |")
  print("|---|---|---|---|---|")
  plain_t = statistics.median(runs["plain flax.nnx"][4])
  for name, run in runs.items():
    t = statistics.median(run[4])
    print(
      f"| {name} | {run[3]:,} | {t * 1e3:.1f} | {tokens / t:,.0f} | "
      f"{plain_t / t:.2f} |"
    )


if __name__ == "__main__":
  main()
