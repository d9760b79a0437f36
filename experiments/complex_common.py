"""Shared pieces of the complex-valued claims (E1-E5) on the runner.

Every complex experiment trains with the runner's loop
(`experiments._harness.grid`, i.e. `jaxnorm.training.trainer.train`), often
on a module built here (``model=``: the official presets of
`jaxnorm.nn.cplx.ComplexLMConfig`, a real baseline, a fake-quantized
copy). This module holds what those scripts share:

* `in_mesh`: builds a module under the runner's mesh and logical axis
  rules. A module built outside them holds uncommitted arrays, and the
  runner then compiles its train step twice (once for the first step's
  uncommitted state, once for the committed state after it);
* `real_params` and `in_reals`: parameter counts in reals (a complex entry
  counts twice; the runner's ``params`` counts entries), so that the
  records' settings compare real and complex arms in the same unit;
* `recorder` and `gated`: claim records of a grid whose arms are modules
  built here (config and setting of both arms), a regime claim deciding
  whether the others are testable;
* `setting_lines`: the Markdown table of the arms (parameters in reals,
  steps, learning rate);
* `real_lm`, `attention_modules`, `replace_cores`: the real ``DecoderLM``
  baselines and their attention cores;
* `fit` and `shared_optimizer`: a jitted loop over an nnx model and the
  runner's optimizer for it (for the loops of
  `experiments.regionnorm_claims` and `experiments.psa_pixelwise_claims`,
  run through the grid's ``train=`` hook; the complex scripts no longer
  use them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import optax
from flax import nnx

from experiments._harness import grid
from jaxnorm import sharding
from jaxnorm.nn import cplx as ncplx
from jaxnorm.nn import decay
from jaxnorm.training import claims, optimizers
from jaxnorm.training import config as config_lib

# The learning rates every arm's sweep starts from (`grid.tuned_grid`
# extends a grid whose best rate is at an end).
LEARNING_RATES = (1e-3, 3e-3, 1e-2)


def in_mesh(
  base: config_lib.TrainConfig, build: Callable[[], nnx.Module]
) -> nnx.Module:
  """``build()`` under ``base``'s mesh and the default logical axis rules."""
  with (
    jax.set_mesh(sharding.make_mesh(base.mesh)),
    nnx.logical_axis_rules(sharding.DEFAULT_RULES),
  ):
    return build()


def real_params(model: nnx.Module) -> int:
  """Trainable parameters in reals (a complex entry counts twice)."""
  return ncplx.count_real_parameters(model)


def in_reals(
  lines: Sequence[Mapping[str, Any]], counts: Mapping[str, int]
) -> list[dict[str, Any]]:
  """``lines`` with ``params`` replaced by ``counts[variant]`` (in reals)."""
  return [
    {**ln, "params": counts.get(ln["variant"], ln.get("params"))}
    for ln in lines
  ]


def gated(
  regime: claims.Claim,
  others: Sequence[claims.Claim],
  record: Callable[..., dict[str, Any]],
  *,
  baselines: Mapping[str, bool],
  absent: str,
) -> list[dict[str, Any]]:
  """The regime's record, then the others', testable when it reproduced.

  Args:
    regime: the claim whose phenomenon the others need (e.g. "the complex
      input costs a real CNN accuracy").
    others: the claims it gates.
    record: ``record(claim, baseline_trained=..., testable=...,
      reason=...)`` -> a record (`recorder`).
    baselines: variant -> whether it trained (`runs.untrained` is None).
    absent: what "not reproduced" means for the regime (the reason the
      others give when it did not reproduce).
  """
  first = record(regime, baseline_trained=baselines.get(regime.b, True))
  present = first["verdict"] == "reproduced"
  why = None if present else f"{absent} ({first['why']})"
  out = [first]
  for claim in others:
    out.append(
      record(
        claim,
        baseline_trained=baselines.get(claim.b, True),
        testable=present,
        reason=why,
      )
    )
  return out


def recorder(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  models: Mapping[str, Any] | None = None,
) -> Callable[..., dict[str, Any]]:
  """``record(claim, *, baseline_trained, testable=True, reason=None)``.

  `grid.claim_record` of a runner grid whose arms may be modules built
  outside the runner: the record's ``config`` holds the resolved base
  config and, per arm, its config changes and ``models[variant]`` (the
  module's own config, JSON-able; None for a module the runner built);
  its ``setting`` is `grid.setting` of each arm (``params`` as the lines
  hold them: `in_reals`).
  """
  models = models or {}

  def record(
    claim: claims.Claim,
    *,
    baseline_trained: bool,
    testable: bool = True,
    reason: str | None = None,
  ) -> dict[str, Any]:
    arms = (("a", claim.a), ("b", claim.b))
    config = {"base": config_lib.to_json(config_lib.resolve(base))}
    for arm, variant in arms:
      config[arm] = _json(
        {"changes": dict(variants[variant]), "model": models.get(variant)}
      )
    return grid.claim_record(
      lines,
      claim,
      baseline_trained=baseline_trained,
      config=config,
      setting={
        arm: grid.setting(lines, base, variants, variant)
        for arm, variant in arms
      },
      testable=testable,
      reason=reason,
    )

  return record


def _json(x: Any) -> Any:
  """``x`` as plain JSON values (tuples become lists, others text)."""
  return json.loads(json.dumps(x, default=str))


def real_lm(
  width: int,
  depth: int,
  heads: int,
  seq_len: int,
  seed: int,
  vocab_size: int = 256,
  **kw: Any,
) -> nnx.Module:
  """A real ``DecoderLM`` with an untied head (Fairy2i quantizes the head)."""
  from jaxnorm.nn import models

  cfg = models.LMConfig(
    vocab_size=vocab_size,
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


def setting_lines(result: Mapping[str, Any], names: Sequence[str]) -> list[str]:
  """A Markdown table of the arms: parameters (reals), steps, rate."""
  out = [
    "| arm | parameters (reals) | steps | learning rate |",
    "|---|---|---|---|",
  ]
  lines = result["lines"]
  for name in names:
    ln = next((x for x in lines if x["variant"] == name), None)
    if ln is None:
      continue
    lr = result["variants"].get(name, {}).get("learning_rate", "base")
    lr = f"{lr:g}" if isinstance(lr, float) else lr
    out.append(f"| {name} | {ln['params']:,} | {ln['steps']} | {lr} |")
  return out + [""]


# --- The jitted loop of the scripts not yet on the runner ------------------


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

  Used by `experiments.regionnorm_claims` (not on the runner yet). The
  jitted step is shared: runs with the same architecture, the same
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


# The `TrainConfig` fields `optimizers.from_config` reads.
OPTIMIZER_FIELDS = (
  "optimizer",
  "learning_rate",
  "weight_decay",
  "warmup_steps",
  "steps",
  "schedule",
  "clip_norm",
  "b1",
  "b2",
  "grad_accum",
  "residual",
  "depth",
)


def shared_optimizer() -> Callable[
  [nnx.Module, config_lib.TrainConfig], optax.GradientTransformation
]:
  """``tx(model, cfg)``: ``cfg``'s optimizer for `fit`, shared per setting.

  The runner's optimizer (`jaxnorm.training.optimizers.from_config`, with
  ``model``'s weight-decay mask). Each call of `shared_optimizer` keeps
  one object per (architecture, `OPTIMIZER_FIELDS`), so the seeds of a
  variant share `fit`'s jitted step.
  """
  txs: dict[Any, optax.GradientTransformation] = {}

  def tx(
    model: nnx.Module, cfg: config_lib.TrainConfig
  ) -> optax.GradientTransformation:
    key = (nnx.graphdef(model), *(getattr(cfg, f) for f in OPTIMIZER_FIELDS))
    if key not in txs:
      txs[key] = optimizers.from_config(
        cfg, mask=decay.decay_mask(model), model=model
      )
    return txs[key]

  return tx
