"""MXAttention's parts, ablated: the MXFP4 attention error by component.

Claims (each fixed before running; metric: the relative error
``||O_q - O|| / ||O||`` of MXFP4 attention against float32 softmax
attention, lower is better; ``superior``, margin 0: the paired interval
excludes no gain; `jaxnorm.training.claims`, level 0.95):

* MXAttention (Yu et al., "MXAttention: Data-Free Optimal Scaling and
  Pre-Normalization Quantization for MXFP4 Attention", arXiv:2607.24377):
  the full method, Hadamard rotation of Q and K + the unit-optimal scale
  (UOS, ``Q_max = 7.25``) + pre-normalization quantization of P (PNQ),
  lowers the error of OCP MXFP4 attention (no rotation, the OCP floor
  scale, P quantized after normalization);
* each component alone lowers the OCP error: the rotation ("spreads
  outliers across a block"), UOS (the clipping-underflow trade-off of a
  power-of-two scale) and PNQ (the row-normalization mismatch);
* each component helps inside the full method: the full method against
  the full method without it (leave-one-out).

All 8 combinations (rotation x scale rule x P quantization) are measured
and tabled; the claims take the 7 contrasts above, on two sources of q, k,
v (14 claims): Gaussian q, k, v with two outlier channels (x20) in q and
k (256 tokens, 4 heads, head dim 64; one draw per seed), and the real q,
k, v of every layer of a trained softmax byte LM on one held-out batch
(one LM per seed). The LM has head dim 32, one MX block of 32; it is only
the source of q, k, v (no arm trains, so no learning-rate sweep: it runs
at 1e-2, softmax's best of 1e-3..3e-2 at `experiments.attention_claims`'
size; 4 layers of width 64, 2 heads, 128-byte windows, batch 8, 600
steps). Every setting quantizes Q, K and V (blocks of 32: Q
and K along the head dim; V per token along its head dim, the causal
layout) and P along the keys, causal, `jaxnorm.attention.mxfp4_attention`
(the one-tile reference). The report also gives each source's q/k outlier
ratio (the largest channel RMS over the median channel RMS).

Deviations: the paper measures video quality (Imaging Quality, SSIM, PSNR)
of Wan2.2 and HunyuanVideo under its fused NPU kernel; here the output
error of the attention itself, on an LM's and on synthetic q, k, v.

  python -m experiments.mxattention_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import attention_claims
from experiments._harness import grid, report, runs, tiers
from jaxnorm import attention as attn
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "mxattention_claims"
PARTS = ("rotation", "UOS", "PNQ")
OCP = "OCP MXFP4"
FULL = "rotation+UOS+PNQ"
SOURCES = {
  "error_random": "Gaussian q, k, v with outlier channels",
  "error_lm": "trained softmax LM q, k, v",
}
OUTLIER_CHANNELS = (3, 17)
OUTLIER_SCALE = 20.0


def setting_name(parts: Sequence[str]) -> str:
  """``"rotation+UOS"``, ..., `OCP` for none."""
  return "+".join(p for p in PARTS if p in parts) or OCP


def options(parts: Sequence[str]) -> dict[str, Any]:
  """`attention.mxfp4_attention`'s keywords of a set of components."""
  return {
    "hadamard": "random_sign" if "rotation" in parts else None,
    "scale_rule": "qmax" if "UOS" in parts else "ocp_floor",
    "p_quant": "pnq" if "PNQ" in parts else "direct",
  }


SETTINGS: dict[str, dict[str, Any]] = {
  setting_name(parts): options(parts)
  for n in range(len(PARTS) + 1)
  for parts in itertools.combinations(PARTS, n)
}

STATEMENTS = {
  "rotation": "the Hadamard rotation of Q and K spreads outliers across a "
  "block and lowers the MXFP4 attention error",
  "UOS": "the unit-optimal scale (Q_max = 7.25) lowers the MXFP4 error of "
  "the OCP scale",
  "PNQ": "pre-normalization quantization of P removes the row-normalization "
  "mismatch and lowers the MXFP4 attention error",
}


_claim = functools.partial(
  claims.Claim,
  paper="MXAttention",
  arxiv="2607.24377",
  direction="lower",
  kind="superior",
  margin=0.0,
)

CLAIMS = tuple(
  claim
  for metric, source in SOURCES.items()
  for claim in (
    _claim(
      claim="MXAttention (rotation + UOS + PNQ) lowers the error of OCP "
      f"MXFP4 attention ({source})",
      metric=metric,
      a=FULL,
      b=OCP,
    ),
    *(
      _claim(
        claim=f"{STATEMENTS[part]}: alone ({source})",
        metric=metric,
        a=part,
        b=OCP,
      )
      for part in PARTS
    ),
    *(
      _claim(
        claim=f"{STATEMENTS[part]}: within the full method ({source})",
        metric=metric,
        a=FULL,
        b=setting_name([p for p in PARTS if p != part]),
      )
      for part in PARTS
    ),
  )
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The LM whose q, k, v are quantized (head dim 32; ``--full``: 64).

  Learning rate 1e-2 (``--full``: the runner's 3e-3 at width 256).
  """
  cfg = tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=2,
      seq_len=128,
      batch_size=8,
      steps=600,
      eval_every=100,
      eval_batches=8,
      warmup_steps=60,
    ),
    keep_checkpoints=1,
    learning_rate=1e-2,
  )
  if tiers.tier(args) == "full":
    cfg = dataclasses.replace(cfg, num_heads=4, learning_rate=3e-3)
  return cfg


def errors(q: jax.Array, k: jax.Array, v: jax.Array) -> dict[str, float]:
  """Relative error of each of `SETTINGS` against float32 attention."""
  ref = attn.dot_product_attention(q, k, v, is_causal=True)
  norm = jnp.linalg.norm(ref)
  return {
    name: float(
      jnp.linalg.norm(
        attn.mxfp4_attention(q, k, v, is_causal=True, **opts) - ref
      )
      / norm
    )
    for name, opts in SETTINGS.items()
  }


def outlier_ratio(x: jax.Array) -> float:
  """Largest over median channel RMS of ``(..., H)``."""
  rms = jnp.sqrt(jnp.mean(jnp.square(x.reshape(-1, x.shape[-1])), axis=0))
  return float(jnp.max(rms) / jnp.median(rms))


def random_qkv(
  seed: int, tokens: int, heads: int, head_dim: int
) -> tuple[jax.Array, ...]:
  """Gaussian q, k, v; q and k with `OUTLIER_CHANNELS` scaled up."""
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  shape = (1, tokens, heads, head_dim)
  boost = jnp.ones(head_dim).at[jnp.array(OUTLIER_CHANNELS)].set(OUTLIER_SCALE)
  boost = boost.reshape(1, 1, 1, head_dim)
  q = jax.random.normal(kq, shape) * boost
  k = jax.random.normal(kk, shape) * boost
  return q, k, jax.random.normal(kv, shape)


def lm_qkv(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  line: Mapping[str, Any],
  tokens: jax.Array,
) -> tuple[jax.Array, ...]:
  """The q, k, v of every layer of one trained LM, stacked on the batch."""
  model = runs.trained(table, base, {}, line["variant"], line["seed"])
  qkv = attention_claims.probe(model, tokens, gated=False)["qkv"]
  return tuple(jnp.concatenate(xs, axis=0) for xs in zip(*qkv))


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the LMs (skipping finished runs), quantizes, writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  random_shape = (32, 2, 32) if tiers.tier(args) == "quick" else (256, 4, 64)

  def compute() -> dict:
    lm_lines = grid.run_grid(table, base, {"softmax": {}}, seeds)
    text = data_lib.load_text(base.data)
    batch = data_lib.eval_windows(
      text.val, base.seq_len, batch_size=base.batch_size, max_batches=1
    )[0]
    tokens = jnp.asarray(batch[:, :-1])
    lines, outliers = [], {m: [] for m in SOURCES}
    for run in sorted(lm_lines, key=lambda ln: ln["seed"]):
      seed = run["seed"]
      sources = {
        "error_random": random_qkv(seed, *random_shape),
        "error_lm": lm_qkv(table, base, run, tokens),
      }
      found = {m: errors(*qkv) for m, qkv in sources.items()}
      for m, (q, k, _) in sources.items():
        outliers[m].append([outlier_ratio(q), outlier_ratio(k)])
      for name in SETTINGS:
        lines.append(
          {
            "variant": name,
            "seed": seed,
            **{m: found[m][name] for m in SOURCES},
          }
        )
    lm_setting = grid.setting(lm_lines, base, {"softmax": {}}, "softmax")
    records = [
      grid.claim_record(
        lines,
        claim,
        baseline_trained=True,
        config={
          "base": config_lib.to_json(config_lib.resolve(base)),
          "a": SETTINGS[claim.a],
          "b": SETTINGS[claim.b],
          "random_qkv": {
            "tokens_heads_head_dim": list(random_shape),
            "outlier_channels": list(OUTLIER_CHANNELS),
            "outlier_scale": OUTLIER_SCALE,
          },
        },
        setting={
          arm: {**lm_setting, "mxfp4": SETTINGS[name]}
          for arm, name in (("a", claim.a), ("b", claim.b))
        },
      )
      for claim in CLAIMS
    ]
    return {
      "claims": records,
      "lines": lines,
      "lm_lines": lm_lines,
      "cells": {m: grid.cells(lines, m) for m in SOURCES},
      "qk_outlier_ratio": {
        m: np.mean(np.asarray(v), axis=0).tolist() for m, v in outliers.items()
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(20, 7))
    names = list(SETTINGS)
    for ax, (metric, label) in zip(axes, SOURCES.items()):
      report.cells_bars(ax, result["cells"][metric], names)
      ax.set_ylim(bottom=0)
      ax.set_ylabel("relative error of the attention output")
      ax.set_title(f"{label} (mean ± std over {len(seeds)} seeds)")
    report.claims_axes(axes[2], result["claims"])
    fig.suptitle("MXFP4 attention error by MXAttention component")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    head_dim = base.width // base.num_heads
    lines += [
      f"The LM (learning rate {base.learning_rate:g}, head dim {head_dim}) "
      f"is the source of real q, k, v: one held-out batch of "
      f"{base.batch_size} windows through every layer. Random q, k, v: "
      f"{random_shape[0]} tokens, {random_shape[1]} heads, head dim "
      f"{random_shape[2]}, channels {list(OUTLIER_CHANNELS)} of q and k "
      f"x{OUTLIER_SCALE:g}. Settings: rotation = random-sign Hadamard of "
      "Q and K; UOS = Q_max 7.25 (else the OCP floor rule); PNQ = P "
      "quantized before normalization with its own row sum (else the "
      "normalized P quantized).",
      "",
    ]
    for metric, label in SOURCES.items():
      q_ratio, k_ratio = result["qk_outlier_ratio"][metric]
      lines += [
        f"## Relative error: {label}",
        "",
        f"Outlier ratio (largest / median channel RMS): q {q_ratio:.2f}, "
        f"k {k_ratio:.2f}.",
        "",
      ]
      lines += grid.markdown_table(result["cells"][metric], "error", OCP)
      lines.append("")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
