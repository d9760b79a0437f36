"""Attention: softmax, sinks, gated, affine-scaled; the MXFP4 attention error.

Claims checked:

* Attention sinks (OpenAI, gpt-oss model card, arXiv:2508.10925; Xiao et al.,
  arXiv:2309.17453): a learned per-head sink logit takes the attention mass
  the first token otherwise absorbs, lowering the first-token mass and the
  largest activation, at no cost in loss.
* Gated attention (Qiu et al., "Gated Attention for Large Language Models",
  arXiv:2505.06708): a sigmoid gate on the attention output removes the
  attention sink and the massive activations (lower first-token mass and
  largest activation) with a loss no worse than softmax.
* Affine-Scaled Attention (Bae et al., arXiv:2602.23057): lowers the loss
  of softmax attention.
* MXAttention (Yu et al., arXiv:2607.24377): the Hadamard rotation and the
  unit-optimal scale (UOS, ``qmax = 7.25``) lower the error of MXFP4
  attention against the full-precision output.

Setting: the runner's decoder LM on byte-level Shakespeare, each attention
variant in every block, 3 seeds. After training, one held-out batch goes
through the trained model (restored from its final checkpoint): the
largest activation is the largest ``|h|`` of the residual stream after any
block (`DecoderLM` ``return_hidden``); the first-token mass is the weight
each query ``t >= 1`` puts on token 0, averaged over batch, heads, queries
and layers. It is read by running each layer's core on its own queries and
keys with one-hot values on token 0, so it is the weight the core really
applies (sink: after the sink's share; affine-scaled: ``alpha P + beta``);
for gated attention it is the softmax weight before the output gate (the
gated-attention paper's measurement), the one-hot output divided by the
all-ones one. A uniform causal attention would give ``mean_t 1/(t+1)``
(printed as the reference). The MXFP4 error is ``||O_q - O|| / ||O||`` of
`jaxnorm.attention.mxfp4_attention` (causal, pre-normalization P
quantization) against `jaxnorm.attention.dot_product_attention` in float32,
on Gaussian q, k, v with two outlier channels (x20) in q and k (head dim 64,
256 tokens; one draw per seed), and on the real q, k, v of every layer of
the trained softmax models (head dim ``width / heads``: one MX block of
that size). Verdicts compare means with the standard error of their
difference (`experiments._grid.verdict`); "not worse" is lower or equal
within 0.02 nats.

  python -m experiments.attention_claims [--quick] [--full]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import optimizers_claims as opt_claims
from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attention
from jaxnorm.training import build
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "attention_claims"
VARIANTS = {
  name: {"attention": name}
  for name in ("softmax", "sink", "gated", "affine_scaled")
}
# Nats within which a loss counts as "not worse".
TOLERANCE = 0.02
# MXFP4 settings: rotation x scale rule, P quantized before normalization.
MXFP4 = {
  "OCP scale": {"hadamard": None, "scale_rule": "ocp_floor"},
  "rotation": {"hadamard": "random_sign", "scale_rule": "ocp_floor"},
  "UOS": {"hadamard": None, "scale_rule": "qmax"},
  "rotation + UOS": {"hadamard": "random_sign", "scale_rule": "qmax"},
}
OUTLIER_CHANNELS = (3, 17)
OUTLIER_SCALE = 20.0


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run: width 64, depth 4, 64-byte windows (quick: toy)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=600,
      eval_every=100,
      eval_batches=8,
      warmup_steps=60,
    ),
    keep_checkpoints=1,
    learning_rate=3e-3,
  )


def trained_model(
  cfg: config_lib.TrainConfig, run_dir: pathlib.Path, vocab_size: int
) -> nnx.Module:
  """The LM of ``cfg`` with the state of its run's final checkpoint."""
  model = build.build_model(
    cfg,
    {"vocab_size": vocab_size, "max_len": cfg.seq_len},
    rngs=nnx.Rngs(cfg.seed),
  )
  saved = opt_claims.final_state(run_dir)
  merged: dict[str, Any] = {}
  for group in ("params", "backward", "rest"):
    _merge(merged, saved.get(group) or {})
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, _fill(nnx.to_pure_dict(state), merged))
  nnx.update(model, state)
  model.eval()
  return model


def _merge(into: dict, tree: Mapping) -> None:
  for key, value in tree.items():
    if isinstance(value, Mapping) and "value" not in value:
      _merge(into.setdefault(key, {}), value)
    else:
      into[key] = value


def _fill(template: Any, saved: Any) -> Any:
  """``template``'s structure with the saved leaves (keys read as text)."""
  if isinstance(template, Mapping):
    return {k: _fill(v, saved[str(k)]) for k, v in template.items()}
  return jnp.asarray(saved["value"] if isinstance(saved, Mapping) else saved)


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
  """Largest activation, first-token mass and the q, k, v of each layer."""
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
  return {
    "max_activation": float(jnp.max(h)),
    "max_over_median": float(jnp.max(h) / jnp.median(h)),
    "first_token_mass": float(jnp.mean(mass)),
    "first_token_mass_per_layer": np.asarray(
      jnp.mean(mass, axis=(1, 2, 3))
    ).tolist(),
    "qkv": [p.qkv[0] for p in probes],
  }


def mxfp4_errors(q: jax.Array, k: jax.Array, v: jax.Array) -> dict[str, float]:
  """Relative error of each `MXFP4` setting against full precision."""
  ref = attn.dot_product_attention(q, k, v, is_causal=True)
  norm = jnp.linalg.norm(ref)
  return {
    name: float(
      jnp.linalg.norm(
        attn.mxfp4_attention(q, k, v, is_causal=True, **options) - ref
      )
      / norm
    )
    for name, options in MXFP4.items()
  }


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


def _error_lines(
  errors: Mapping[str, float], seed: int
) -> list[dict[str, Any]]:
  return [
    {"variant": name, "seed": seed, "error": e} for name, e in errors.items()
  ]


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), probes and writes the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "attention.jsonl"
  random_shape = (32, 2, 32) if args.quick else (256, 4, 64)

  def compute() -> dict:
    lines = _grid.run_grid(table, base, VARIANTS, seeds)
    text = data_lib.load_text(base.data)
    batch = data_lib.eval_windows(
      text.val, base.seq_len, batch_size=base.batch_size, max_batches=1
    )[0]
    tokens = jnp.asarray(batch[:, :-1])
    probed, real = [], []
    for ln in lines:
      cfg = dataclasses.replace(
        base, seed=ln["seed"], **VARIANTS[ln["variant"]]
      )
      model = trained_model(
        cfg,
        _grid.run_dir(table.parent, ln["variant"], ln["seed"]),
        text.vocab_size,
      )
      found = probe(model, tokens, gated=ln["variant"] == "gated")
      qkv = found.pop("qkv")
      probed.append({**ln, **found})
      if ln["variant"] == "softmax":
        q, k, v = (jnp.concatenate(xs, axis=0) for xs in zip(*qkv))
        real += _error_lines(mxfp4_errors(q, k, v), ln["seed"])
    synthetic = [
      line
      for seed in seeds
      for line in _error_lines(
        mxfp4_errors(*random_qkv(seed, *random_shape)), seed
      )
    ]
    cells = {
      metric: _grid.cells(probed, metric)
      for metric in ("val_loss", "max_activation", "first_token_mass")
    }
    cells["max_over_median"] = _grid.cells(probed, "max_over_median")
    errors = {
      "random q, k, v with outliers": _grid.cells(synthetic, "error"),
      "trained softmax LM q, k, v": _grid.cells(real, "error"),
    }
    verdicts = []
    for variant, paper in (("sink", "sinks"), ("gated", "gated attention")):
      for metric, label in (
        ("first_token_mass", "lowers the first-token attention mass"),
        ("max_activation", "lowers the largest activation"),
      ):
        v, why = _grid.verdict(cells[metric], variant, "softmax", "lower")
        verdicts.append(
          {"claim": f"{paper}: {variant} {label}", "verdict": v, "why": why}
        )
      v, why = opt_claims.not_worse(
        cells["val_loss"], variant, "softmax", TOLERANCE
      )
      verdicts.append(
        {
          "claim": f"{paper}: {variant}'s loss is not worse than softmax",
          "verdict": v,
          "why": why,
        }
      )
    v, why = _grid.verdict(
      cells["val_loss"], "affine_scaled", "softmax", "lower"
    )
    verdicts.append(
      {
        "claim": "Affine-Scaled Attention lowers the loss of softmax",
        "verdict": v,
        "why": why,
      }
    )
    for setting, grid in errors.items():
      v, why = _grid.verdict(grid, "rotation + UOS", "OCP scale", "lower")
      verdicts.append(
        {
          "claim": "MXAttention: rotation + UOS lower the MXFP4 error "
          f"({setting})",
          "verdict": v,
          "why": why,
        }
      )
    t = np.arange(1, base.seq_len)
    return {
      "lines": probed,
      "cells": cells,
      "mxfp4_lines": {"random": synthetic, "real": real},
      "mxfp4_error": errors,
      "uniform_first_token_mass": float(np.mean(1.0 / (t + 1))),
      "verdicts": verdicts,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    _grid.figure(
      table,
      result["lines"],
      "first_token_mass",
      path,
      f"byte LM: validation loss and first-token attention mass by "
      f"attention ({len(seeds)} seeds)",
    )

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner config: width {base.width}, depth {base.depth}, "
      f"{base.num_heads} heads, {base.seq_len}-byte windows, batch "
      f"{base.batch_size}, {base.steps} AdamW steps (lr "
      f"{base.learning_rate}, cosine, warm-up {base.warmup_steps}, weight "
      f"decay {base.weight_decay}), seeds {list(seeds)}. Probes on one "
      f"held-out batch of {base.batch_size} windows; mean ± sample std "
      "(ddof=1) over seeds. A uniform causal attention gives a first-token "
      f"mass of {result['uniform_first_token_mass']:.3f}.",
      "",
    ]
    for metric, label in (
      ("val_loss", "validation loss (nats)"),
      ("first_token_mass", "first-token attention mass"),
      ("max_activation", "largest |activation| of the residual stream"),
      ("max_over_median", "largest / median |activation|"),
    ):
      lines += [f"## {label}", ""]
      lines += _grid.markdown_table(result["cells"][metric], label, "softmax")
      lines.append("")
    lines += ["## First-token mass per layer (mean over seeds)", ""]
    lines += [
      "| variant | "
      + " | ".join(f"layer {i}" for i in range(base.depth))
      + " |",
      "|---|" + "---|" * base.depth,
    ]
    for name in VARIANTS:
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
    for setting, grid in result["mxfp4_error"].items():
      lines += ["", f"## MXFP4 attention relative error: {setting}", ""]
      lines += _grid.markdown_table(grid, "relative error", "OCP scale")
    lines += ["", "## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"])
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
