"""Attention sinks, gated attention and outlier-driven rescaling in a byte LM.

Claims (each fixed before running; `jaxnorm.training.claims`, level 0.95:
one-sided 5% tests on the paired t interval over seeds):

* Regime 1, the attention sink (Xiao et al., "Efficient Streaming Language
  Models with Attention Sinks", arXiv:2309.17453): softmax attention puts
  a large share of every query's attention on the first token. Metric: the
  log first-token mass; the softmax LM is ``superior`` (higher) to uniform
  causal attention (``mean_t 1/(t+1)``, analytic) by more than the margin
  ``log 2``: the first token takes at least twice its uniform share.
* Regime 2, massive activations (Sun et al., "Massive Activations in Large
  Language Models", arXiv:2402.17762): a few residual-stream activations
  are orders of magnitude above the median. Metric: the log of the largest
  ``|h|`` over the median ``|h|``; ``superior`` (higher) to ``max =
  median`` (``log 1 = 0``) by more than ``log 100`` (the paper's massive
  activations are about 1000x the median; 100x is the lenient bar).
* Attention sinks (OpenAI, gpt-oss-120b & gpt-oss-20b model card,
  arXiv:2508.10925; Xiao et al.): a learned per-head sink logit takes the
  first-token mass (``superior``, log first-token mass lower; gated by
  regime 1) and lowers the largest activation (``superior``, log largest
  activation lower; gated by regime 2), at no cost in loss
  (``non_inferior`` on the validation loss, margin
  ``claims.MARGINS["nats_per_byte"]`` = 0.01 nats/byte; testable at any
  scale).
* Gated attention (Qiu et al., "Gated Attention for Large Language Models:
  Non-linearity, Sparsity, and Attention-Sink-Free", arXiv:2505.06708): an
  elementwise sigmoid gate on the SDPA output removes the attention sink
  (gated by regime 1) and the massive activations (gated by regime 2), and
  "consistently improves performance": ``superior`` validation loss
  (margin 0; testable at any scale).
* A Unified View of Attention and Residual Sinks (Qiu et al.,
  arXiv:2601.22966): outliers "can be ... mitigated via explicit gated
  rescaling, leading to improved training performance": gated attention
  (the attention side's explicit gated rescaling) ``superior`` to softmax
  on the validation loss, testable only where the softmax baseline has the
  outliers (regime 1 or 2). Its residual-side forms (GatedNorm, PreAffine,
  outlier clipping) are not implemented in jaxnorm and are not tested.

Measurements: one held-out batch goes through each trained model (restored
from its final checkpoint). The first-token mass is the weight each query
``t >= 1`` puts on token 0, averaged over batch, heads, queries and layers;
it is read by running each layer's core on its own queries and keys with
one-hot values on token 0, so it is the weight the core applies (sink:
after the sink's share); for gated attention it is the softmax weight
before the gate (the gated-attention paper's measurement). The largest
activation is the largest ``|h|`` of the residual stream after any block;
the median is over all of them. Reported on raw scales; the claims compare
logs (ratios).

Fair comparison: every arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended
until the best rate lies inside the grid (`grid.tuned_grid`); then every
seed at that rate, paired by seed. Parameters: the sink adds one scalar
per head and layer (+0.01%); the elementwise gate adds a ``width x width``
matrix per layer, so the gated arm runs at the multiple of the head count
whose parameter count is nearest the softmax arm's (width 60 against 64,
-4.9%, against the claim: the gated arm is the smaller).

Regime: the runner's decoder LM (learned positions, pre-RMSNorm), 4 layers
of width 64, 4 heads, 500 steps of 16 x 64 bytes of Shakespeare; 3 seeds.
Measured while choosing the setting (softmax, learning rate 3e-3, one
seed): no sink forms on 2 CPU cores: the first-token mass falls from 0.027
at step 400 to 0.021 at step 2400 (uniform 0.059), and with rotary
positions, 8 heads and 128-byte windows from 0.020 to 0.014 by step 1600
(uniform 0.035); the largest activation stays near 16x the median. The
``--full`` tier (`tiers.FULL_LM`: width 256, depth 8, 8 heads, 256-byte
windows, 5000 steps) is the setting that would test the gated claims on
one accelerator, if its baseline forms the outliers (the regime claims
say).

Deviations: byte-level Shakespeare windows start at random offsets, so
token 0 is an arbitrary byte, not a BOS token; the models are 10^3-10^4
times smaller than the papers'.

  python -m experiments.attention_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid, report, runs, tiers
from jaxnorm.nn import attention as nn_attention
from jaxnorm.training import build, claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "attention_claims"
MARGIN = claims.MARGINS["nats_per_byte"]
SOFTMAX, SINK, GATED = "softmax", "sink", "gated"
# The analytic references of the regime claims.
UNIFORM = "uniform attention"
MEDIAN = "max = median"
SINK_BAR = math.log(2.0)
MASSIVE_BAR = math.log(100.0)
# The arms' attention; `variants` adds the gated arm's matched width.
ATTENTIONS: dict[str, dict[str, Any]] = {
  SOFTMAX: {"attention": "softmax"},
  SINK: {"attention": "sink"},
  GATED: {"attention": "gated"},
}
MATCHED = (GATED,)
# Centred on softmax's best at this size (1e-2 of 1e-3..3e-2, seed 0).
LEARNING_RATES = {name: (3e-3, 1e-2, 3e-2) for name in ATTENTIONS}

_sinks_claim = functools.partial(
  claims.Claim, paper="Attention sinks (gpt-oss)", arxiv="2508.10925"
)
_gated_claim = functools.partial(
  claims.Claim, paper="Gated attention", arxiv="2505.06708"
)

SINK_REGIME = claims.Claim(
  paper="Attention sinks (StreamingLLM)",
  arxiv="2309.17453",
  claim="softmax attention allocates a large share of attention to the "
  "initial token (an attention sink): here, at least twice the uniform share",
  metric="log_first_token_mass",
  direction="higher",
  kind="superior",
  margin=SINK_BAR,
  a=SOFTMAX,
  b=UNIFORM,
)
MASSIVE_REGIME = claims.Claim(
  paper="Massive activations",
  arxiv="2402.17762",
  claim="a few activations are massive, orders of magnitude above the median "
  "(here: the largest absolute activation above 100x the median)",
  metric="log_max_over_median",
  direction="higher",
  kind="superior",
  margin=MASSIVE_BAR,
  a=SOFTMAX,
  b=MEDIAN,
)
# (claim, gate): the regime that must hold in the baseline, or None.
CLAIMS: tuple[tuple[claims.Claim, str | None], ...] = (
  (SINK_REGIME, None),
  (MASSIVE_REGIME, None),
  (
    _sinks_claim(
      claim="a learned per-head sink logit takes the attention mass the "
      "first token otherwise absorbs",
      metric="log_first_token_mass",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=SINK,
      b=SOFTMAX,
    ),
    "sink",
  ),
  (
    _sinks_claim(
      claim="a learned sink logit lowers the largest activation",
      metric="log_max_activation",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=SINK,
      b=SOFTMAX,
    ),
    "massive",
  ),
  (
    _sinks_claim(
      claim="the learned sink costs no loss",
      metric="val_loss",
      direction="lower",
      kind="non_inferior",
      margin=MARGIN,
      a=SINK,
      b=SOFTMAX,
    ),
    None,
  ),
  (
    _gated_claim(
      claim="a sigmoid gate after SDPA removes the attention sink",
      metric="log_first_token_mass",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=GATED,
      b=SOFTMAX,
    ),
    "sink",
  ),
  (
    _gated_claim(
      claim="a sigmoid gate after SDPA removes the massive activations",
      metric="log_max_activation",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=GATED,
      b=SOFTMAX,
    ),
    "massive",
  ),
  (
    _gated_claim(
      claim="a sigmoid gate after SDPA consistently improves performance",
      metric="val_loss",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=GATED,
      b=SOFTMAX,
    ),
    None,
  ),
  (
    claims.Claim(
      paper="A Unified View of Attention and Residual Sinks",
      arxiv="2601.22966",
      claim="outliers can be mitigated via explicit gated rescaling, leading "
      "to improved training performance (attention side: gated attention)",
      metric="val_loss",
      direction="lower",
      kind="superior",
      margin=0.0,
      a=GATED,
      b=SOFTMAX,
    ),
    "outliers",
  ),
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier (the final checkpoint is kept)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=500,
      eval_every=100,
      eval_batches=8,
      warmup_steps=50,
    ),
    keep_checkpoints=1,
  )


def param_count(cfg: config_lib.TrainConfig) -> int:
  """Parameters of the model ``cfg`` builds (abstractly: nothing runs)."""
  shape = {"vocab_size": data_lib.BYTE_VOCAB, "max_len": cfg.seq_len}
  model = nnx.eval_shape(
    lambda: build.build_model(cfg, shape, rngs=nnx.Rngs(0))
  )
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def matched_width(
  base: config_lib.TrainConfig, changes: Mapping[str, Any]
) -> int:
  """The width of a variant whose parameter count is nearest ``base``'s.

  The candidates are the multiples of ``base.num_heads`` from
  ``base.width`` down to three quarters of it.
  """
  target = param_count(base)
  step = base.num_heads
  widths = range(base.width, max(step, base.width * 3 // 4) - 1, -step)
  return min(
    widths,
    key=lambda w: abs(
      param_count(dataclasses.replace(base, **changes, width=w)) - target
    ),
  )


def variants(
  base: config_lib.TrainConfig,
  attentions: Mapping[str, Mapping[str, Any]] = ATTENTIONS,
  matched: Sequence[str] = MATCHED,
) -> dict[str, dict[str, Any]]:
  """Each arm's changes; the ``matched`` arms at `matched_width`."""
  out = {}
  for name, changes in attentions.items():
    out[name] = dict(changes)
    if name in matched:
      out[name]["width"] = matched_width(base, changes)
  return out


class _Probe:
  """Stands in for a core: records q, k, v and the first-token weights."""

  def __init__(self, core: Any, gated: bool):
    self.core, self.gated = core, gated
    self.qkv: list[tuple[jax.Array, ...]] = []
    self.mass: list[jax.Array] = []

  def __call__(self, x, q, k, v, *, mask=None, bias=None, cached=False):
    first = jnp.zeros_like(v).at[:, 0].set(1.0)
    w0 = self.core(x, q, k, first, mask=mask, bias=bias)[..., 0]
    if self.gated:
      w0 = (
        w0 / self.core(x, q, k, jnp.ones_like(v), mask=mask, bias=bias)[..., 0]
      )
    self.qkv.append((q, k, v))
    self.mass.append(w0)
    return self.core(x, q, k, v, mask=mask, bias=bias, cached=cached)


def probe(model: nnx.Module, tokens: jax.Array, gated: bool) -> dict[str, Any]:
  """Largest activation, first-token mass and the q, k, v of each layer.

  Returns the raw values and their logs (``log_first_token_mass``,
  ``log_max_activation``, ``log_max_over_median``: the claims' metrics).
  """
  layers = [
    b
    for b in model.net.blocks
    if isinstance(b, nn_attention.MultiHeadAttention)
  ]
  probes = [_Probe(layer.core, gated) for layer in layers]
  for layer, p in zip(layers, probes):
    layer.core = p
  try:
    _, hidden = model(tokens, return_hidden=True)
  finally:
    for layer, p in zip(layers, probes):
      layer.core = p.core
  h = jnp.abs(hidden[1:].astype(jnp.float32))
  # (B, T, N) per layer; queries t >= 1 (token 0 sees only itself).
  mass = jnp.stack([p.mass[0][:, 1:] for p in probes])
  top, median, first = (
    float(jnp.max(h)),
    float(jnp.median(h)),
    float(jnp.mean(mass)),
  )
  return {
    "max_activation": top,
    "max_over_median": top / median,
    "first_token_mass": first,
    "log_max_activation": math.log(top),
    "log_max_over_median": math.log(top / median),
    "log_first_token_mass": math.log(first),
    "first_token_mass_per_layer": np.asarray(
      jnp.mean(mass, axis=(1, 2, 3))
    ).tolist(),
    "qkv": [p.qkv[0] for p in probes],
  }


def uniform_mass(seq_len: int) -> float:
  """First-token mass of uniform causal attention: ``mean_{t>=1} 1/(t+1)``."""
  t = np.arange(1, seq_len)
  return float(np.mean(1.0 / (t + 1)))


def probe_grid(
  table: pathlib.Path,
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
  gated: Sequence[str] = (GATED,),
) -> list[dict[str, Any]]:
  """Each line with `probe`'s measurements of its trained model (no q, k, v)."""
  text = data_lib.load_text(base.data)
  batch = data_lib.eval_windows(
    text.val, base.seq_len, batch_size=base.batch_size, max_batches=1
  )[0]
  tokens = jnp.asarray(batch[:, :-1])
  out = []
  for ln in lines:
    model = runs.trained_line(table, base, tuned, ln)
    found = probe(model, tokens, gated=ln["variant"] in gated)
    found.pop("qkv")
    out.append({**ln, **found})
  return out


def reference_record(
  lines: Sequence[Mapping[str, Any]],
  claim: claims.Claim,
  value: float,
  description: str,
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
  """A claim of ``claim.a`` against an analytic reference ``value``.

  The reference ``claim.b`` gets ``value`` at every seed of ``claim.a``
  (so the interval is ``claim.a``'s own over seeds); its setting is
  ``claim.a``'s with no parameters and the ``description``.
  """
  refs = [
    {"variant": claim.b, "seed": ln["seed"], claim.metric: value}
    for ln in lines
    if ln["variant"] == claim.a
  ]
  a_setting = grid.setting(lines, base, tuned, claim.a)
  return grid.claim_record(
    [*lines, *refs],
    claim,
    baseline_trained=True,
    config={
      "base": config_lib.to_json(config_lib.resolve(base)),
      "a": {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in tuned[claim.a].items()
      },
      "b": {"reference": description},
    },
    setting={
      "a": a_setting,
      "b": {**a_setting, "params": None, "reference": description},
    },
  )


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  tuned: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
  """The claims' records; the regimes decide which others test."""
  uniform = uniform_mass(base.seq_len)
  sink = reference_record(
    lines,
    SINK_REGIME,
    math.log(uniform),
    f"uniform causal attention, first-token mass mean_t 1/(t+1) = "
    f"{uniform:.4f}",
    base,
    tuned,
  )
  massive = reference_record(
    lines,
    MASSIVE_REGIME,
    0.0,
    "largest absolute activation equal to the median (log ratio 0)",
    base,
    tuned,
  )
  cells = {
    m: grid.cells(lines, m)[SOFTMAX]["mean"]
    for m in ("first_token_mass", "max_over_median")
  }
  why = {
    "sink": (
      f"no attention sink in the softmax baseline: first-token mass "
      f"{cells['first_token_mass']:.4f} against uniform {uniform:.4f} "
      f"(needs > {math.exp(SINK_BAR):g}x; {sink['why']})"
    ),
    "massive": (
      f"no massive activations in the softmax baseline: largest abs(h) "
      f"{cells['max_over_median']:.1f}x the median (needs > "
      f"{math.exp(MASSIVE_BAR):g}x; {massive['why']})"
    ),
  }
  present = {
    "sink": sink["verdict"] == "reproduced",
    "massive": massive["verdict"] == "reproduced",
  }
  present["outliers"] = present["sink"] or present["massive"]
  why["outliers"] = f"{why['sink']}; {why['massive']}"
  failed = runs.untrained(
    lines, SOFTMAX, runs.chance_loss(base), what="the unigram entropy"
  )
  out = [sink, massive]
  for claim, gate in CLAIMS[2:]:
    ok = gate is None or present[gate]
    reasons = [r for r in (None if ok else why[gate], failed) if r]
    out.append(
      grid.runner_record(
        lines,
        claim,
        base,
        tuned,
        baseline_trained=failed is None,
        testable=ok,
        reason="; ".join(reasons) or None,
      )
    )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs), probes, writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  arms = variants(base)
  # --quick checks the pipeline at the base rate.
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, arms, seeds, rates)
    probed = probe_grid(table, lines, base, tuned["variants"])
    return {
      "claims": records(probed, base, tuned["variants"]),
      "sweeps": tuned["sweeps"],
      "variants": tuned["variants"],
      "lines": probed,
      "cells": {
        m: grid.cells(probed, m)
        for m in (
          "val_loss",
          "first_token_mass",
          "max_activation",
          "max_over_median",
        )
      },
      "uniform_first_token_mass": uniform_mass(base.seq_len),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "first_token_mass",
      path,
      f"byte LM, {base.depth} layers of width {base.width}, {base.steps} "
      f"steps: softmax, sink, gated ({len(seeds)} seeds; uniform "
      f"first-token mass {result['uniform_first_token_mass']:.3f})",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    lines += [
      "Arms: "
      + "; ".join(
        f"{name}: width {changes.get('width', base.width)}, learning rate "
        f"{changes.get('learning_rate', base.learning_rate):g}"
        for name, changes in result["variants"].items()
      )
      + ". Probes on one held-out batch of "
      f"{base.batch_size} windows. Uniform causal attention gives a "
      f"first-token mass of {result['uniform_first_token_mass']:.4f}.",
      "",
    ]
    lines += report.sweep_lines(result["sweeps"])
    for metric, label in (
      ("val_loss", "validation loss (nats/byte)"),
      ("first_token_mass", "first-token attention mass"),
      ("max_activation", "largest absolute activation of the residual stream"),
      ("max_over_median", "largest / median absolute activation"),
    ):
      lines += [f"## {label}", ""]
      lines += grid.markdown_table(result["cells"][metric], label, SOFTMAX)
      lines.append("")
    lines += ["## First-token mass per layer (mean over seeds)", ""]
    lines += [
      "| variant | "
      + " | ".join(f"layer {i}" for i in range(base.depth))
      + " |",
      "|---|" + "---|" * base.depth,
    ]
    for name in result["variants"]:
      rows = [
        ln["first_token_mass_per_layer"]
        for ln in result["lines"]
        if ln["variant"] == name
      ]
      if rows:
        means = np.mean(np.asarray(rows), axis=0)
        lines.append(
          f"| {name} | " + " | ".join(f"{m:.3f}" for m in means) + " |"
        )
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
