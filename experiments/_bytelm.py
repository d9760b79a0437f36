"""The seed-vmapped AdamW step of `experiments.depthbench`'s byte LMs.

Only `experiments.depthbench` uses this module (its private training loop,
three seeds trained together with ``jax.vmap``): `LMRun`, `text`, `_loss`,
`_optimizer`, `_step_fn` and `val_batches`. The other LM claims train with
the runner (`experiments._harness.grid`) and evaluate with
`experiments._lm`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxnorm.training import data


@dataclasses.dataclass(frozen=True)
class LMRun:
  """Size and schedule of one tiny byte LM."""

  width: int = 64
  depth: int = 2
  num_heads: int = 4
  seq_len: int = 64
  batch_size: int = 16
  steps: int = 300
  learning_rate: float = 3e-3
  seed: int = 0


def text() -> data.TextSplits:
  """Byte-level Shakespeare (train and held-out plays)."""
  return data.load_text("shakespeare")


def _loss(model: nnx.Module, batch: jax.Array) -> jax.Array:
  logits = model(batch[:, :-1]).astype(jnp.float32)
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
  )


def _optimizer(run: LMRun) -> optax.GradientTransformation:
  sched = optax.warmup_cosine_decay_schedule(
    0.0, run.learning_rate, max(run.steps // 10, 1), run.steps
  )
  return optax.adamw(sched, weight_decay=0.01)


@functools.cache
def _step_fn(graphdef: Any, run: LMRun):
  """One jitted AdamW step; cached so seeds of one size compile once."""
  tx = _optimizer(run)

  @jax.jit
  def step(params, rest, opt, batch):
    def f(p):
      return _loss(nnx.merge(graphdef, p, rest), batch)

    loss, g = jax.value_and_grad(f)(params)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), opt, loss

  return step


def val_batches(
  splits: data.TextSplits, seq_len: int, *, batch_size: int, num: int
) -> list[np.ndarray]:
  """Fixed held-out windows of ``seq_len + 1`` bytes."""
  return data.eval_windows(
    splits.val, seq_len, batch_size=batch_size, max_batches=num
  )
