"""The trained LMs of the claims that measure a model after training.

The runner (`jaxnorm.training.trainer.train`, through
`experiments._harness.grid`) trains every LM of `experiments.llm_int8`,
`experiments.nuclear_norm`, `experiments.convert_prenorm` and
`experiments.remove_layernorm`; these scripts then quantize, probe, convert
or fine-tune the trained model (`experiments._harness.runs.trained`
restores it from the run's final checkpoint). This module holds what they
share besides:

* `val_batches` and `evaluate`: the runner's validation batches of a
  config and the mean loss on them (the runner's ``val_loss`` for an
  unchanged model), with each batch's logits or the intermediates a model
  sowed (`Sow`);
* `pre_ln`: the Pre-LN parent of the conversion and removal claims
  (LayerNorm, untied head, biases: the form both conversions take).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.nn import models
from jaxnorm.training import build, tasks
from jaxnorm.training import config as config_lib


def val_batches(cfg: config_lib.TrainConfig) -> list[jax.Array]:
  """The runner's validation batches of ``cfg`` (``eval_batches`` of them)."""
  return [jnp.asarray(b) for b in tasks.make_task(cfg).eval_batches]


class Sow(nnx.Module):
  """Calls ``inner`` and sows its input or output as `nnx.Intermediate`."""

  def __init__(self, inner: nnx.Module, *, name: str, what: str = "output"):
    self.inner, self.name, self.what = inner, name, what

  def __call__(self, x: jax.Array) -> jax.Array:
    """``inner(x)``, recording ``x`` or the result."""
    y = self.inner(x)
    self.sow(nnx.Intermediate, self.name, x if self.what == "input" else y)
    return y


def _loss(m: nnx.Module, batch: jax.Array) -> tuple[jax.Array, jax.Array]:
  logits = m(*tasks.inputs("lm", batch)).astype(jnp.float32)
  return tasks.loss_and_metrics("lm", logits, batch)[0], logits


@functools.partial(jax.jit, static_argnums=(0, 3))
def _forward(graphdef: Any, state: Any, batch: jax.Array, sown: bool):
  # One compilation per model structure (graphdef), shared by every seed.
  m = nnx.merge(graphdef, state)
  if sown:
    (value, _), inter = nnx.capture(_loss, nnx.Intermediate)(m, batch)
    return value, inter
  return _loss(m, batch)


def evaluate(
  model: nnx.Module, batches: Sequence[jax.Array], *, sown: bool = False
) -> tuple[float, list[Any]]:
  """Mean validation loss (the runner's) and, per batch, logits or sown.

  Args:
    model: a decoder LM; evaluated in eval mode.
    batches: `val_batches`.
    sown: return each batch's `nnx.Intermediate` values (`Sow`) instead of
      its logits.

  Returns:
    The mean over batches of the runner's loss, and per batch the float32
    logits (NumPy) or the intermediates' state.
  """
  model.eval()
  graphdef, state = nnx.split(model)
  losses, extra = [], []
  for b in batches:
    value, out = _forward(graphdef, state, b, sown)
    losses.append(float(value))
    extra.append(out if sown else np.asarray(out))
  return float(np.mean(losses)), extra


def pre_ln(cfg: config_lib.TrainConfig, seed: int) -> models.DecoderLM:
  """The Pre-LN parent: ``cfg``'s LM with LayerNorm, untied head, biases."""
  shape = {"vocab_size": 256, "max_len": cfg.seq_len}
  lm = dataclasses.replace(
    build.model_config(cfg, shape),
    norm="layernorm",
    tie_embeddings=False,
    use_bias=True,
  )
  return models.DecoderLM(lm, rngs=nnx.Rngs(seed))
