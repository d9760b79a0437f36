"""Shared pieces of the LM experiments: parent training and evaluation."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxnorm.nn import models
from jaxnorm.training import config as config_lib
from jaxnorm.training import data, trainer


def add_model_flags(parser: argparse.ArgumentParser) -> None:
  """Flags of the parent Pre-LN model and its training run."""
  parser.add_argument(
    "--out",
    default="runs/experiments",
    help="results folder (default runs/experiments)",
  )
  parser.add_argument("--width", type=int, default=64)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--num-heads", type=int, default=4)
  parser.add_argument("--seq-len", type=int, default=64)
  parser.add_argument("--batch-size", type=int, default=16)
  parser.add_argument(
    "--steps", type=int, default=400, help="parent training steps"
  )
  parser.add_argument("--learning-rate", type=float, default=3e-3)
  parser.add_argument("--eval-batches", type=int, default=16)
  parser.add_argument(
    "--no-bias",
    action="store_true",
    help="bias-free linear maps (LayerNorms keep theirs)",
  )
  parser.add_argument("--seed", type=int, default=0)


def parent_config(args: argparse.Namespace) -> models.LMConfig:
  """The Pre-LN LM named by the flags (untied, learned positions)."""
  return models.LMConfig(
    vocab_size=256,
    width=args.width,
    depth=args.depth,
    num_heads=args.num_heads,
    max_len=args.seq_len,
    norm="layernorm",
    tie_embeddings=False,
    use_bias=not args.no_bias,
  )


def run_config(
  args: argparse.Namespace, name: str, steps: int, **changes: Any
) -> config_lib.TrainConfig:
  """A `TrainConfig` for the experiment engine, writing to ``out/name``."""
  base = config_lib.TrainConfig(
    seq_len=args.seq_len,
    batch_size=args.batch_size,
    steps=steps,
    eval_every=max(steps // 10, 1),
    eval_batches=args.eval_batches,
    checkpoint_every=steps,
    log_every=max(steps // 50, 1),
    learning_rate=args.learning_rate,
    warmup_steps=min(50, steps // 10),
    seed=args.seed,
    out_dir=str(pathlib.Path(args.out) / name),
    resume=False,
    progress=False,
  )
  return dataclasses.replace(base, **changes)


def train_parent(args: argparse.Namespace) -> models.DecoderLM:
  """Trains the Pre-LN parent with the experiment engine."""
  model = models.DecoderLM(parent_config(args), rngs=nnx.Rngs(args.seed))
  trainer.train(run_config(args, "parent", args.steps), model=model)
  return model


def val_batches(args: argparse.Namespace) -> list[jax.Array]:
  """The validation batches the engine evaluates on."""
  text = data.load_text("shakespeare")
  return [
    jnp.asarray(b)
    for b in data.eval_windows(
      text.val,
      args.seq_len,
      batch_size=args.batch_size,
      max_batches=args.eval_batches,
    )
  ]


def evaluate(
  model: nnx.Module, batches: list[jax.Array]
) -> tuple[float, list[np.ndarray]]:
  """Mean validation loss and the logits of every batch (eval mode)."""
  model.eval()
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, batch):
    m = nnx.merge(graphdef, state)
    logits = m(batch[:, :-1]).astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
    return jnp.mean(loss), logits

  losses, logits = [], []
  for b in batches:
    loss, out = forward(state, b)
    losses.append(float(loss))
    logits.append(np.asarray(out))
  return float(np.mean(losses)), logits
