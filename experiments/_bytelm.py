"""A tiny byte LM trained in-process, for the LLM.int8 and MNN experiments.

`train_lm` builds `jaxnorm.nn.models.DecoderLM` and trains it with AdamW on
byte-level Shakespeare windows (`jaxnorm.training.data`) in a plain jitted
loop (no checkpoints or logs: these experiments need only the weights).
`evaluate` returns the mean validation loss and anything the model sowed as
`nnx.Intermediate` (e.g. through `Sow`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxnorm.nn import models
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


def build(run: LMRun) -> models.DecoderLM:
  """The pre-RMSNorm decoder of ``run`` (learned positions, tied head)."""
  cfg = models.LMConfig(
    width=run.width,
    depth=run.depth,
    num_heads=run.num_heads,
    max_len=run.seq_len,
  )
  return models.DecoderLM(cfg, rngs=nnx.Rngs(run.seed))


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


def train_lm(run: LMRun, splits: data.TextSplits) -> tuple[Any, float]:
  """Trains ``run``; returns the model (eval mode) and the seconds taken."""
  model = build(run)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt = _optimizer(run).init(params)
  step = _step_fn(graphdef, dataclasses.replace(run, seed=0))

  it = iter(
    data.text_windows(
      splits.train, run.seq_len, batch_size=run.batch_size, seed=run.seed
    )
  )
  start = time.time()
  for _ in range(run.steps):
    params, opt, _ = step(params, rest, opt, jnp.asarray(next(it)))
  jax.block_until_ready(params)
  model = nnx.merge(graphdef, params, rest)
  model.eval()
  return model, time.time() - start


def val_batches(
  splits: data.TextSplits, seq_len: int, *, batch_size: int, num: int
) -> list[np.ndarray]:
  """Fixed held-out windows of ``seq_len + 1`` bytes."""
  return data.eval_windows(
    splits.val, seq_len, batch_size=batch_size, max_batches=num
  )


class Sow(nnx.Module):
  """Calls ``inner`` and sows its input or output as `nnx.Intermediate`."""

  def __init__(self, inner: nnx.Module, *, name: str, what: str = "output"):
    self.inner, self.name, self.what = inner, name, what

  def __call__(self, x: jax.Array) -> jax.Array:
    """``inner(x)``, recording ``x`` or the result."""
    y = self.inner(x)
    self.sow(nnx.Intermediate, self.name, x if self.what == "input" else y)
    return y


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef: Any, state: Any, batch: jax.Array):
  m = nnx.merge(graphdef, state)
  return nnx.capture(_loss, nnx.Intermediate)(m, batch)


def evaluate(
  model: nnx.Module, batches: list[np.ndarray]
) -> tuple[float, list[Any]]:
  """Mean validation loss and the intermediates sowed on every batch."""
  graphdef, state = nnx.split(model)
  losses, sown = [], []
  for b in batches:
    loss, inter = _forward(graphdef, state, jnp.asarray(b))
    losses.append(float(loss))
    sown.append(inter)
  return float(np.mean(losses)), sown
