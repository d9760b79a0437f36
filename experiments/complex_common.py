"""Shared pieces of the complex-valued experiments (E1-E5 of the spec).

Flags (``--quick``, ``--seeds``, ``--out``), a jitted training loop over an
nnx model with any loss and optax transform (`fit`), byte batches from the
bundled Shakespeare text, mean ± spread over seeds and the result file
(markdown + JSON + plot) each experiment writes to ``experiments/results``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxnorm.training import data

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
VERDICTS = ("reproduced", "not reproduced at this scale", "inconclusive")


def parser(description: str) -> argparse.ArgumentParser:
  """The common flags of the complex experiments."""
  p = argparse.ArgumentParser(description=description)
  p.add_argument(
    "--quick", action="store_true", help="seconds-long smoke run (tests)"
  )
  p.add_argument("--seeds", type=int, default=3, help="seeds (default 3)")
  p.add_argument(
    "--out", default=str(RESULTS), help=f"results folder (default {RESULTS})"
  )
  return p


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
  """Mean and spread (population standard deviation) over seeds."""
  a = np.asarray(values, np.float64)
  return float(a.mean()), float(a.std())


def fmt(values: Sequence[float], digits: int = 3) -> str:
  """``mean ± spread`` of the per-seed values."""
  m, s = mean_spread(values)
  return f"{m:.{digits}f} ± {s:.{digits}f}"


def text_splits() -> data.TextSplits:
  """Bundled Shakespeare bytes (train/validation)."""
  return data.load_text("shakespeare")


def text_batches(
  tokens: np.ndarray, seq_len: int, batch_size: int, seed: int
) -> Iterator[np.ndarray]:
  """Random ``(batch, seq_len + 1)`` windows of ``tokens``, forever."""
  rng = np.random.default_rng(seed)
  n = len(tokens) - seq_len - 1
  while True:
    starts = rng.integers(0, n, batch_size)
    yield np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(
      np.int32
    )


def eval_batches(
  tokens: np.ndarray, seq_len: int, batch_size: int, count: int
) -> list[np.ndarray]:
  """A fixed list of validation batches (`data.eval_windows`)."""
  return data.eval_windows(
    tokens, seq_len, batch_size=batch_size, max_batches=count
  )


@nnx.jit(static_argnames="loss_fn")
def _train_step(model, optimizer, batch, loss_fn):
  loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
  optimizer.update(model, grads)
  return loss


def fit(
  model: nnx.Module,
  loss_fn: Callable[[nnx.Module, Any], jax.Array],
  tx: optax.GradientTransformation,
  batches: Iterator[Any],
  steps: int,
  *,
  evaluate: Callable[[nnx.Module], float] | None = None,
  eval_every: int = 0,
) -> dict[str, list[float]]:
  """Trains ``model`` in place on ``loss_fn(model, batch)``.

  The jitted step is shared: runs with the same architecture, the same
  (module-level) ``loss_fn`` and the same ``tx`` object compile once.

  Returns ``{"loss": per-step losses, "eval_step": [...], "eval": [...]}``
  (evaluation at step 0, every ``eval_every`` steps and at the end).
  """
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  hist: dict[str, list[float]] = {"loss": [], "eval_step": [], "eval": []}

  def record(i):
    if evaluate is not None:
      hist["eval_step"].append(i)
      hist["eval"].append(float(evaluate(model)))

  record(0)
  for i in range(1, steps + 1):
    loss = _train_step(model, optimizer, next(batches), loss_fn=loss_fn)
    hist["loss"].append(float(loss))
    if evaluate is not None and eval_every and i % eval_every == 0:
      record(i)
  if evaluate is not None and hist["eval_step"][-1] != steps:
    record(steps)
  return hist


def lm_evaluator(
  batches: list[np.ndarray],
  logits_fn: Callable[[nnx.Module, jax.Array], jax.Array] | None = None,
) -> Callable[[nnx.Module], float]:
  """Mean validation cross-entropy (nats/byte) of an LM on ``batches``."""

  @nnx.jit
  def loss(model, batch):
    logits = (
      model(batch[:, :-1])
      if logits_fn is None
      else logits_fn(model, batch[:, :-1])
    ).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
    return jnp.mean(ce)

  def evaluate(model):
    return float(np.mean([float(loss(model, jnp.asarray(b))) for b in batches]))

  return evaluate


def softmax_lm_loss(model: nnx.Module, batch: jax.Array) -> jax.Array:
  """Next-byte softmax cross-entropy of a real-logit LM."""
  logits = model(batch[:, :-1]).astype(jnp.float32)
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
  )


def cnet_schedule(lr: float, steps: int, warmup: int, final: float):
  """CNet's schedule: linear warmup, then cosine to ``final``."""
  return optax.warmup_cosine_decay_schedule(
    0.0,
    lr,
    warmup_steps=max(warmup, 1),
    decay_steps=max(steps, warmup + 1),
    end_value=final,
  )


def count_params(model: nnx.Module) -> int:
  """Trainable parameters in reals (complex entries count twice)."""
  return sum(
    p.size * (2 if jnp.iscomplexobj(p) else 1)
    for p in jax.tree.leaves(nnx.state(model, nnx.Param))
  )


class Timer:
  """Wall-clock seconds since construction."""

  def __init__(self):
    """Starts the clock."""
    self.start = time.perf_counter()

  def __call__(self) -> float:
    """Seconds elapsed."""
    return time.perf_counter() - self.start


def write_result(
  out: str | pathlib.Path,
  name: str,
  markdown: str,
  record: dict[str, Any],
  figure: Any = None,
) -> pathlib.Path:
  """Writes ``complex_<name>.md`` / ``.json`` (and ``.png``) into ``out``."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  md = out / f"complex_{name}.md"
  if figure is not None:
    figure.savefig(out / f"complex_{name}.png", dpi=110, bbox_inches="tight")
    markdown += f"\n![plot](complex_{name}.png)\n"
  md.write_text(markdown)
  (out / f"complex_{name}.json").write_text(
    json.dumps(record, indent=1, default=float)
  )
  return md


def figure(ncols: int = 1):
  """A matplotlib figure on the Agg backend (no display)."""
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4))
  return fig, np.atleast_1d(axes)


def real_lm(width: int, depth: int, heads: int, seq_len: int, seed: int, **kw):
  """The real baseline ``DecoderLM``, with an untied head.

  Untied, so Fairy2i can quantize the head as a linear layer while the
  embedding stays full precision.
  """
  from jaxnorm.nn import models

  cfg = models.LMConfig(
    vocab_size=256,
    width=width,
    depth=depth,
    num_heads=heads,
    max_len=seq_len,
    tie_embeddings=False,
    **kw,
  )
  return models.DecoderLM(cfg, rngs=nnx.Rngs(seed))


def attention_modules(model: nnx.Module) -> list[Any]:
  """Every `MultiHeadAttention` of ``model``."""
  from jaxnorm.nn import attention

  return [
    m
    for _, m in nnx.iter_graph(model)
    if isinstance(m, attention.MultiHeadAttention)
  ]


def replace_cores(
  model: nnx.Module, build: Callable[[Any], nnx.Module], *, rope: bool
) -> None:
  """Sets ``core = build(mha)`` (and ``use_rope``) on every attention.

  The attention registry is not edited: an experiment swaps the core of a
  built `DecoderLM` (its projections, norms and MLPs stay as initialized).
  """
  for mha in attention_modules(model):
    mha.core = build(mha)
    mha.use_rope = rope
