"""The trained LMs of the claims that measure a model after training.

The runner (`jaxnorm.training.trainer.train`, through
`experiments._harness.grid`) trains every LM of `experiments.llm_int8`,
`experiments.nuclear_norm`, `experiments.convert_prenorm` and
`experiments.remove_layernorm`; these scripts then quantize, probe, convert
or fine-tune the trained model. This module holds what they share:

* `trained`: the trained model of one grid run, restored from the run's
  final checkpoint by the runner's own resume (no step left to run), so a
  resumed grid gives the same model as the run that trained it;
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
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid
from jaxnorm.nn import models
from jaxnorm.training import build, tasks, trainer
from jaxnorm.training import config as config_lib


def run_config(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  changes: Mapping[str, Any],
  run: str,
  seed: int,
) -> config_lib.TrainConfig:
  """The config grid run ``run`` (seed ``seed``) of ``table`` trained."""
  return dataclasses.replace(
    base,
    **changes,
    seed=seed,
    out_dir=str(grid.run_dir(table.parent, run, seed)),
    progress=False,
  )


def trained(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  changes: Mapping[str, Any],
  run: str,
  seed: int,
  *,
  model: Callable[[], nnx.Module] | None = None,
) -> nnx.Module:
  """The trained model of a finished grid run, in eval mode.

  The run directory's final checkpoint is restored by the runner's resume
  (``trainer.train(cfg, model=...)`` with ``resume=True`` and no step
  left), into ``model()`` or, without ``model``, the model the runner
  builds from the config.

  Args:
    table: the grid's JSON-lines table (`grid.run_grid`).
    base: the grid's base config.
    changes: the run's `TrainConfig` changes (with its learning rate for a
      `grid.tuned_grid` run).
    run: the run's name (a line's ``run``, else its ``variant``).
    seed: the run's seed.
    model: builds the untrained module the run trained (a grid's ``model``
      factory), or ``None``.

  Raises:
    ValueError: the run has not finished (its checkpoint is older than
      ``steps``).
  """
  cfg = dataclasses.replace(
    run_config(table, base, changes, run, seed), resume=True
  )
  module = model() if model is not None else None
  if module is None:
    task = tasks.make_task(cfg)
    module = build.build_model(cfg, task.model_kwargs, rngs=nnx.Rngs(seed))
  summary = trainer.train(cfg, model=module)
  if summary["steps"] != cfg.steps:
    raise ValueError(
      f"trained: run {run!r} seed {seed} in {cfg.out_dir} stopped at step "
      f"{summary['steps']} of {cfg.steps}; rerun the grid to finish it"
    )
  return module


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
