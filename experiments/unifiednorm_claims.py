"""Unified Norm vs LayerNorm in a byte LM, and UN folded into a linear layer.

Unified Normalization (Yang et al., "Unified Normalization for
Accelerating and Stabilizing Transformers", arXiv:2208.01313) claims, on
language (machine translation) and vision tasks, that UN "achieves
comparable performance on par with LN" and, being a fixed affine map at
inference, "can speed up the inference by being fused with other linear
operations" (about 31% faster Transformers on a GPU). Claims (fixed before
running):

* UN matches LayerNorm: ``equivalent`` on the validation loss in nats per
  byte within `claims.MARGINS["nats_per_byte"]` (0.01), in the language
  side of the paper (here `experiments.norms_bytelm`'s byte LM: 8 layers
  of width 64, 600 steps of 16 x 64 bytes of Shakespeare, where
  `experiments.powernorm_claims` checks, at 450 steps, that naive
  BatchNorm hurts, UN's starting point). UN runs as the official code's
  NLP setting: no outlier filtration, window 4, momentum 0.9.
* Folded UN is faster than LayerNorm: a norm followed by the next linear
  layer (the MLP's up-projection, ``width -> 4 width``) at inference, UN
  folded into the linear layer (`jaxnorm.nn.UnifiedNorm.fold`, the layer
  alone) against LayerNorm + linear: ``superior`` on ``log_ms`` (the log
  of the time of one call) by more than `claims.MARGINS["log_ratio"]`
  (log 1.1: more than 10% faster), at the LM's token tensor (16 x 64
  tokens of width 64) and at width 512. This is a measurement of these
  layers on this CPU (2 shared cores), not of the paper's GPU models: each
  round times every form (median of repeated calls, compilation untimed)
  in turn in one process, and the rounds are the pairs. The fold's error
  (largest absolute difference between the folded layer and UN + linear
  on the same input, with trained-looking statistics) is reported with it.

Deviations: UN's warm-up (batch statistics before the window's smoothed
ones) is a tenth of the run (60 steps), not the code's 4000 iterations,
which would leave UN on plain batch statistics for the whole run; its
gradient compensation starts after ``max(1000, warmup)`` steps, so it
never acts in 600 steps. Causality: UN takes statistics over the batch and
the sequence in training mode (the window's geometric mean includes the
current batch), so in this causal LM position t sees later tokens of the
batch through them in training (`TrainConfig.allow_batch_stats`);
evaluation runs in inference mode (running statistics, per token), which
is causal, so the validation loss cannot use the leak; the training loss,
which picks UN's learning rate, may.

Fair comparison: each arm trains at its own learning rate, the best of a
geometric sweep (3e-3, 1e-2, 3e-2) on seed 0 chosen by the final training
loss, extended until inside the grid
(`experiments._harness.grid.tuned_grid`); then 3 seeds, paired by seed. UN
and LayerNorm have the same parameters (a scale and a bias per norm).

  python -m experiments.unifiednorm_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import norms_bytelm
from experiments._harness import grid, report, runs, tiers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

NAME = "unifiednorm_claims"
PAPER = ("Unified Norm", "2208.01313")
# The inference forms timed: LayerNorm + linear, UN (inference) + linear,
# UN folded into the linear layer.
FORMS = ("layernorm+linear", "un+linear", "un-folded")
LEARNING_RATES = {
  name: (3e-3, 1e-2, 3e-2) for name in ("layernorm", "unifiednorm")
}


def variants(base: config_lib.TrainConfig) -> dict[str, dict[str, Any]]:
  """LayerNorm and UN; UN warms up over a tenth of the run."""
  warm = max(1, base.steps // 10)
  return {
    "layernorm": {"norm": "layernorm"},
    "unifiednorm": {
      "norm": "unifiednorm",
      "norm_kwargs": (("warmup_iters", warm),),
    },
  }


MATCHES = claims.Claim(
  paper=PAPER[0],
  arxiv=PAPER[1],
  claim="UN achieves comparable performance on par with LN",
  metric="val_loss",
  direction="lower",
  kind="equivalent",
  margin=claims.MARGINS["nats_per_byte"],
  a="unifiednorm",
  b="layernorm",
)


def fold_claim(width: int) -> claims.Claim:
  """The speed claim at one width (metric ``log_ms_w<width>``)."""
  return claims.Claim(
    paper=PAPER[0],
    arxiv=PAPER[1],
    claim="UN speeds up inference by being fused with the following "
    f"linear layer: folded UN is more than 10% faster than LN + linear "
    f"(width {width}, this CPU)",
    metric=f"log_ms_w{width}",
    direction="lower",
    kind="superior",
    margin=claims.MARGINS["log_ratio"],
    a="un-folded",
    b="layernorm+linear",
  )


def shapes(
  args: argparse.Namespace, base: config_lib.TrainConfig
) -> list[tuple[int, int, int]]:
  """``(batch, tokens, width)`` of each timed layer: the LM's, and 512."""
  own = (base.batch_size, base.seq_len, base.width)
  if tiers.tier(args) == "quick":
    return [own]
  return [own, (base.batch_size, base.seq_len, 512)]


def folding(
  shape: tuple[int, int, int], rounds: int, reps: int, seed: int = 0
) -> dict[str, Any]:
  """Times norm + linear (``d -> 4 d``) on ``(batch, tokens, d)`` 3 ways.

  The UN layer has random positive running statistics and affine
  parameters, as after training; the folded layer must reproduce UN +
  linear (``max_abs_error``, and ``output_scale``: the largest absolute
  output). Each of ``rounds`` rounds times every form (median of ``reps``
  calls), in turn in one process, so that load drifts hit all.
  """
  d = shape[-1]
  rngs = nnx.Rngs(seed)
  k = jax.random.split(jax.random.key(seed), 6)
  x = jax.random.normal(k[0], shape, jnp.float32)
  kernel = jax.random.normal(k[1], (d, 4 * d), jnp.float32) / np.sqrt(d)
  kbias = 0.1 * jax.random.normal(k[2], (4 * d,), jnp.float32)
  row = (1,) * (len(shape) - 1) + (4 * d,)
  ln = nn_norms.make_norm("layernorm", d, rngs=rngs, layout="tokens")
  un = nn_norms.make_norm("unifiednorm", d, rngs=rngs, layout="tokens")
  un.running_var[...] = jnp.exp(jax.random.normal(k[3], (d,)))
  un.scale[...] = 1 + 0.1 * jax.random.normal(k[4], (d,))
  un.bias[...] = 0.1 * jax.random.normal(k[5], (d,))
  un.eval()
  folded_w, folded_b = un.fold(kernel, kbias, position="next")

  norm_linear = nnx.jit(lambda m, t: m(t) @ kernel + kbias.reshape(row))
  folded = jax.jit(lambda t: t @ folded_w + folded_b.reshape(row))
  calls = {
    "layernorm+linear": lambda t: norm_linear(ln, t),
    "un+linear": lambda t: norm_linear(un, t),
    "un-folded": folded,
  }
  reference = calls["un+linear"](x)
  error = float(jnp.max(jnp.abs(folded(x) - reference)))
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, fn in calls.items():
      times[name].append(report.median_ms(fn, x, reps))
  return {
    "shape": list(shape),
    "max_abs_error": error,
    "output_scale": float(jnp.max(jnp.abs(reference))),
    "ms": times,
  }


def timing_lines(timing: Sequence[Mapping[str, Any]]) -> list[dict]:
  """Claim lines: per form and round (``seed``), ``log_ms_w<width>``."""
  out = []
  for name in FORMS:
    for r in range(len(timing[0]["ms"][name])):
      line: dict[str, Any] = {"variant": name, "seed": r}
      for t in timing:
        line[f"log_ms_w{t['shape'][-1]}"] = math.log(t["ms"][name][r])
      out.append(line)
  return out


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
  timing: Sequence[Mapping[str, Any]],
  timed: tuple[int, int],
) -> list[dict[str, Any]]:
  """UN vs LayerNorm in the LM, then folded UN's speed per width."""
  out = runs.runner_records(
    lines,
    [MATCHES],
    base,
    tuned,
    runs.chance_loss(base),
    what="the unigram entropy",
  )
  rounds, reps = timed
  flat = timing_lines(timing)
  for t in timing:
    batch, n, d = t["shape"]
    setting = {
      "params": d * 4 * d + 4 * d,
      "steps": None,
      "examples": None,
      "unit": "rounds",
      "learning_rate": None,
      "data": f"inference, {batch} x {n} tokens of width {d} -> {4 * d}; "
      f"median of {reps} calls per round, {rounds} interleaved rounds "
      "(CPU)",
    }
    out.append(
      grid.claim_record(
        flat,
        fold_claim(d),
        baseline_trained=True,
        config={"shape": t["shape"], "rounds": rounds, "reps": reps},
        setting={"a": setting, "b": setting},
        reason=f"fold's max |error| {t['max_abs_error']:.2g} at outputs up "
        f"to {t['output_scale']:.3g}",
      )
    )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs), the timing, the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = dataclasses.replace(
    norms_bytelm.base_config(args), allow_batch_stats=True
  )
  seeds = tiers.seeds(args)
  arms = variants(base)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  rounds, reps = (2, 3) if tiers.tier(args) == "quick" else (5, 50)
  # --quick checks the pipeline at the base rate.
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, arms, seeds, rates)
    timing = [folding(s, rounds, reps) for s in shapes(args, base)]
    for t in timing:
      t["cells"] = grid.cells(
        [
          {"variant": name, "ms": ms}
          for name, values in t["ms"].items()
          for ms in values
        ],
        "ms",
      )
    return {
      "claims": records(lines, base, tuned["variants"], timing, (rounds, reps)),
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "val_loss": grid.cells(lines, "val_loss"),
      "train_loss": grid.cells(lines, "train_loss"),
      "timing": timing,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "val_loss",
      path,
      f"byte LM, {base.depth} layers of width {base.width}, {base.steps} "
      f"steps: Unified Norm vs LayerNorm ({len(seeds)} seeds); folded "
      "UN's inference time",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    warm = dict(arms["unifiednorm"]["norm_kwargs"])["warmup_iters"]
    lines += [
      f"UN's `warmup_iters` = {warm}; batch statistics admitted "
      "(`allow_batch_stats`): UN sees later tokens of the batch in "
      "training mode; validation runs in inference mode (module "
      "docstring).",
      "",
    ]
    lines += report.sweep_lines(result["sweeps"])
    lines += ["## Validation loss (inference mode)", ""]
    lines += grid.markdown_table(result["val_loss"], "val loss", "layernorm")
    lines += ["", "## Final training loss (training mode)", ""]
    lines += grid.markdown_table(
      result["train_loss"], "train loss", "layernorm"
    )
    lines += ["", "## Inference: norm + linear layer (ms per call, CPU)", ""]
    for t in result["timing"]:
      batch, n, d = t["shape"]
      lines += [
        f"Tokens {batch} x {n} of width {d}, linear {d} -> {4 * d} (median "
        f"of {reps} calls per round, mean ± std over {rounds} rounds); "
        f"folded vs unfolded UN: max |difference| "
        f"{t['max_abs_error']:.2e} at outputs up to "
        f"{t['output_scale']:.3g}.",
        "",
      ]
      lines += grid.markdown_table(t["cells"], "ms", "layernorm+linear")
      lines.append("")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
