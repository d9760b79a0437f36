"""Forward and train-step time: Pre-LN vs Pre-RMSNorm vs Pre-CRMSNorm.

Run from the repository root:

  python benchmarks/convert.py [--width 128 --depth 4 --seq-len 128 --batch 32]

One Pre-LN byte-level `DecoderLM` (LayerNorm with scale and bias, biases on
every linear map, untied head) is converted with `jaxnorm.nn.convert` into the
same function as Pre-RMSNorm (affine-free RMSNorm, centered weights) and
Pre-CRMSNorm (affine-free CRMSNorm, width ``d-1``); "Pre-RMSNorm (train)"
is the training form (``zero_mean_writers``: the writers' centering runs in
the forward pass). Each variant's jitted forward and AdamW train step run
round-robin after warm-up on the same batch; the table reports median times
and the ratio to Pre-LN (the paper reports 1-10% savings).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxnorm.nn import convert, models


def _steps(model: nnx.Module):
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adamw(1e-3)
  opt = tx.init(params)

  def loss_fn(p, batch):
    m = nnx.merge(graphdef, p, rest, copy=True)
    logits = m(batch[:, :-1])
    return jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
    )

  @jax.jit
  def forward(p, batch):
    return nnx.merge(graphdef, p, rest, copy=True)(batch[:, :-1])

  @jax.jit
  def train_step(p, o, batch):
    loss, g = jax.value_and_grad(loss_fn)(p, batch)
    updates, o = tx.update(g, o, p)
    return optax.apply_updates(p, updates), o, loss

  state = {"p": params, "o": opt}

  def run_forward(batch):
    return forward(state["p"], batch)

  def run_train(batch):
    state["p"], state["o"], loss = train_step(state["p"], state["o"], batch)
    return loss

  return run_forward, run_train


def _time(fn, batch) -> float:
  t = time.perf_counter()
  jax.block_until_ready(fn(batch))
  return time.perf_counter() - t


def main() -> None:
  """Prints the timing table."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=128)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--num-heads", type=int, default=4)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--iters", type=int, default=30)
  args = parser.parse_args()
  cfg = models.LMConfig(
    vocab_size=256,
    width=args.width,
    depth=args.depth,
    num_heads=args.num_heads,
    max_len=args.seq_len,
    norm="layernorm",
    tie_embeddings=False,
    use_bias=True,
  )
  params = convert.lm_params(models.DecoderLM(cfg, rngs=nnx.Rngs(0)))
  ln_nobias = models.LMConfig(
    **{**cfg.__dict__, "norm_kwargs": (("use_bias", False),)}
  )
  variants = {
    "Pre-LN": (params, cfg),
    "Pre-RMSNorm": convert.to_pre_rmsnorm(params, cfg),
    "Pre-CRMSNorm": convert.to_pre_crmsnorm(params, cfg),
    "Pre-RMSNorm (train)": convert.to_pre_rmsnorm(
      convert.lm_params(models.DecoderLM(ln_nobias, rngs=nnx.Rngs(0))),
      ln_nobias,
      reparameterize=True,
    ),
  }
  batch = jax.random.randint(
    jax.random.key(0), (args.batch, args.seq_len + 1), 0, 256
  )
  fns = {k: _steps(convert.load_lm(c, p)) for k, (p, c) in variants.items()}
  times = {k: ([], []) for k in fns}
  for fwd, step in fns.values():  # Warm-up (compile).
    _time(fwd, batch), _time(step, batch), _time(step, batch)
  for _ in range(args.iters):
    for k, (fwd, step) in fns.items():
      times[k][0].append(_time(fwd, batch))
      times[k][1].append(_time(step, batch))
  base_f = statistics.median(times["Pre-LN"][0])
  base_t = statistics.median(times["Pre-LN"][1])
  print(
    f"{jax.devices()[0].device_kind} ({platform.machine()}), d="
    f"{args.width}, depth {args.depth}, batch {args.batch} x "
    f"{args.seq_len}, median of {args.iters}"
  )
  print("| variant | forward ms | ratio | train step ms | ratio |")
  print("|---|---|---|---|---|")
  for k, (f, t) in times.items():
    mf, mt = statistics.median(f), statistics.median(t)
    print(
      f"| {k} | {1e3 * mf:.2f} | {mf / base_f:.3f} | {1e3 * mt:.2f} | "
      f"{mt / base_t:.3f} |"
    )


if __name__ == "__main__":
  main()
