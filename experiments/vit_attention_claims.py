"""SOFT, NaLaFormer and LINA vs softmax attention in the ViT: accuracy, cost.

Claims checked (the papers' headlines as in
`shared/specs/attention_activations.md` sections 5-7, cut to what a ViT
classifier shows):

* SOFT (Lu et al., "SOFT: Softmax-free Transformer with Linear
  Complexity", arXiv:2110.11945): a softmax-free Gaussian-kernel attention
  with a Newton-inverted landmark kernel costs time linear in the token
  count, at an accuracy not below softmax ViTs of its size.
* NaLaFormer (Meng et al., "NaLaFormer: Norm-Aware Linear Attention for
  Transformer Models", arXiv:2506.21137): making the query norm, which
  normalized linear attention cancels, the power of the feature map closes
  the gap to softmax and beats comparable linear attentions (up to +7.5
  points on ImageNet-1K), at linear cost. Here the comparable linear
  attention is LINA's kernel (ReLU features, division normalization).
* LINA (Wang et al., "LINA: Linear Autoregressive Image Generative Models
  with Continuous Tokens", arXiv:2601.22630): division-normalized linear
  attention with token-wise KV gates keeps softmax-level quality at linear
  cost. Deviation: the paper's model is an image generator with a 5x5
  depthwise conv in its decoder blocks; here it is the attention core
  alone (no conv) in a classifier.

Setting, accuracy: the runner's ViT (`jaxnorm.nn.models.ViT`, pre-norm,
the runner's patch size: 4 on Fashion-MNIST, 49 patches + [CLS]) with each
attention in every block, the paper's map layer for SOFT and NaLaFormer
(landmark conv + local conv; LePE conv, gate and 2-D RoPE) on the patch
grid, LINA with static KV gates over every token; 3 seeds. "Not worse than
softmax" is judged on the validation accuracy (`optimizers_claims.not_worse`
on the error rate ``1 - accuracy``: lower, or equal within one point) with
`experiments._grid.verdict`'s standard error of the difference.

Setting, cost: the jitted training step (forward, backward, AdamW update)
of the same ViT (width, depth, heads and attention layers of the grid) on a
batch of 8 random images (``--full``: 16) at several token counts, the
patch size and the image side varied: 28x28 at patch 4 and 2 and 56x56 at
patch 2, i.e. 49, 196 and 784 patches + [CLS] (``--full`` adds 112x112 at
patch 2: 3136); pixels do not change the cost. SOFT keeps about
`LANDMARK_SIDE` x `LANDMARK_SIDE` landmarks at every length (landmark
window ``ratio = side // 3``), as the paper keeps 7x7 landmarks per stage
(``sr_ratio`` 8/4/2 on 56/28/14 maps); at the runner's patch 4 this is the
runner's own ratio 2. Every round times each (length, attention) as the
median of repeated calls, the attentions interleaved so that load drifts
hit all; the growth is the step time at the longest length over that at
the shortest, per round, and the verdict compares a linear attention's
growth with softmax's over the rounds (`_grid.verdict`, ``lower``), and
so does the step time at the longest length. The machine is shared:
timings are only as steady as its load; they are reported as ratios to
softmax within one round and never tested.

  python -m experiments.vit_attention_claims [--quick] [--full]
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
import optax
from flax import nnx

from experiments import optimizers_claims as opt_claims
from experiments import powernorm_claims
from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.nn import decay as nn_decay
from jaxnorm.nn import models
from jaxnorm.training import build, optimizers
from jaxnorm.training import config as config_lib

NAME = "vit_attention_claims"
ATTENTIONS = ("softmax", "soft", "nala", "lina")
LINEAR = ATTENTIONS[1:]
PAPERS = {"soft": "SOFT", "nala": "NaLaFormer", "lina": "LINA"}
# Error-rate points (fractions) within which accuracy counts as "not worse".
TOLERANCE = 0.01
# SOFT's landmark map side kept at every token count.
LANDMARK_SIDE = 3
# The image side of each dataset (the runner's ViT picks its patch size).
IMAGE_SIDE = {"fashion_mnist": 28, "digits": 8}


def base_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """`powernorm_claims`' ViT run; by default depth 2 and 300 steps."""
  base = powernorm_claims.base_config(quick, full)
  if quick or full:
    return base
  return dataclasses.replace(
    base, depth=2, steps=300, eval_every=50, log_every=50, warmup_steps=30
  )


def runner_vit(base: config_lib.TrainConfig) -> models.ViTConfig:
  """The ViT the runner builds for ``base`` (its patch-size rule)."""
  side = IMAGE_SIDE[base.data]
  return build.model_config(
    base, {"num_classes": 10, "image_shape": (side, side, 1)}
  )


def soft_ratio(grid_side: int) -> int:
  """SOFT's landmark window: about `LANDMARK_SIDE` landmarks per side."""
  return max(1, grid_side // LANDMARK_SIDE)


def attention_change(name: str, grid_side: int) -> dict[str, Any]:
  """`TrainConfig` / `ViTConfig` changes of one attention on a map side."""
  change: dict[str, Any] = {"attention": name}
  if name == "soft":
    change["attention_kwargs"] = (("ratio", soft_ratio(grid_side)),)
  return change


def variants(base: config_lib.TrainConfig) -> dict[str, dict[str, Any]]:
  """One grid variant per attention on the runner's patch grid."""
  vit = runner_vit(base)
  side = vit.image_shape[0] // vit.patch_size
  return {name: attention_change(name, side) for name in ATTENTIONS}


def lengths(quick: bool, full: bool) -> tuple[tuple[int, int], ...]:
  """``(image side, patch size)`` of each timed length, shortest first."""
  if quick:
    return ((28, 14), (28, 7))
  sweep = ((28, 4), (28, 2), (56, 2))
  return (*sweep, (112, 2)) if full else sweep


def tokens(side: int, patch: int) -> int:
  """Patches plus the [CLS] token."""
  return (side // patch) ** 2 + 1


def train_step(
  vit: models.ViTConfig, base: config_lib.TrainConfig, batch: int
) -> tuple[Any, tuple[Any, ...]]:
  """A jitted ViT training step and its arguments (random images, labels).

  The step is the runner's: mean cross-entropy, gradients, the optimizer of
  ``base`` (AdamW, clipping, decay mask), parameters updated.
  """
  model = models.ViT(vit, rngs=nnx.Rngs(0))
  tx = optimizers.from_config(base, mask=nn_decay.decay_mask(model))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = jax.jit(tx.init)(params)
  side = vit.image_shape[0]
  ki, kl = jax.random.split(jax.random.key(0))
  images = jax.random.uniform(ki, (batch, side, side, 1), jnp.float32)
  labels = jax.random.randint(kl, (batch,), 0, vit.num_classes)

  def loss_fn(params, images, labels):
    logits = nnx.merge(graphdef, params, rest)(images).astype(jnp.float32)
    return jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    )

  @jax.jit
  def step(params, opt_state, images, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, (params, opt_state, images, labels)


def step_times(
  base: config_lib.TrainConfig,
  sweep: Sequence[tuple[int, int]],
  batch: int,
  rounds: int,
  reps: int,
) -> list[dict[str, Any]]:
  """Per round, length and attention: the median step time in ms.

  Each round times all (length, attention) pairs in turn; a step's first
  call (compilation) is not timed.
  """
  vit = runner_vit(base)
  calls = {}
  for side, patch in sweep:
    for name in ATTENTIONS:
      cfg = dataclasses.replace(
        vit,
        image_shape=(side, side, 1),
        patch_size=patch,
        **attention_change(name, side // patch),
      )
      step, args = train_step(cfg, base, batch)
      calls[tokens(side, patch), name] = (
        (lambda x, step=step, args=args: step(*args[:2], x, args[3])[2]),
        args[2],
      )
  lines = []
  for r in range(rounds):
    for (n, name), (fn, x) in calls.items():
      ms = _report.median_ms(fn, x, reps)
      lines.append({"variant": name, "round": r, "tokens": n, "ms": ms})
  return lines


def timing_cells(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """Cells over rounds: ms and ratio to softmax per length, growth, slope.

  ``growth``: step time at the longest length over the shortest (per
  round); ``slope``: the log-log slope between the two longest lengths.
  """
  ms = {(ln["round"], ln["tokens"], ln["variant"]): ln["ms"] for ln in lines}
  rounds = sorted({r for r, _, _ in ms})
  lengths_ = sorted({n for _, n, _ in ms})
  per_length, ratio, growth = {}, {}, []
  for n in lengths_:
    at = [ln for ln in lines if ln["tokens"] == n]
    per_length[n] = _grid.cells(at, "ms")
    ratio[n] = _grid.cells(
      [
        {**ln, "ratio": ln["ms"] / ms[ln["round"], n, "softmax"]}
        for ln in at
        if ln["variant"] != "softmax"
      ],
      "ratio",
    )
  lo, hi = lengths_[0], lengths_[-1]
  prev = lengths_[-2]
  for r in rounds:
    for name in ATTENTIONS:
      growth.append(
        {
          "variant": name,
          "round": r,
          "growth": ms[r, hi, name] / ms[r, lo, name],
          "slope": float(
            np.log(ms[r, hi, name] / ms[r, prev, name]) / np.log(hi / prev)
          ),
        }
      )
  return {
    "tokens": lengths_,
    "ms": per_length,
    "ratio_to_softmax": ratio,
    "growth": _grid.cells(growth, "growth"),
    "slope": _grid.cells(growth, "slope"),
  }


def with_error(lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The grid lines with the validation error rate ``1 - accuracy``."""
  return [{**ln, "val_error": 1.0 - ln["val_accuracy"]} for ln in lines]


def verdicts(
  error: Mapping[str, Any], timing: Mapping[str, Any]
) -> list[dict[str, str]]:
  """Accuracy not worse than softmax; step time growing less, and faster."""
  lo, hi = timing["tokens"][0], timing["tokens"][-1]
  out = []
  for name in LINEAR:
    paper = PAPERS[name]
    v, why = opt_claims.not_worse(error, name, "softmax", TOLERANCE)
    out.append(
      {
        "claim": f"{paper}: accuracy not worse than softmax (within "
        f"{100 * TOLERANCE:.0f} point)",
        "verdict": v,
        "why": "error rate " + why,
      }
    )
    v, why = _grid.verdict(timing["growth"], name, "softmax", "lower")
    out.append(
      {
        "claim": f"{paper}: step time grows less than softmax's from {lo} "
        f"to {hi} tokens",
        "verdict": v,
        "why": "growth " + why,
      }
    )
    v, why = _grid.verdict(timing["ms"][hi], name, "softmax", "lower")
    out.append(
      {
        "claim": f"{paper}: step faster than softmax's at {hi} tokens",
        "verdict": v,
        "why": why + " ms",
      }
    )
  v, why = _grid.verdict(error, "nala", "lina", "lower")
  out.append(
    {
      "claim": "NaLaFormer: higher accuracy than a comparable linear "
      "attention (LINA's kernel)",
      "verdict": v,
      "why": "error rate " + why,
    }
  )
  return out


def plot_timing(result: Mapping[str, Any], path: pathlib.Path) -> None:
  """Accuracy bars with seeds; step time and ratio to softmax vs tokens."""
  plt = _report.pyplot()
  fig, (ax_acc, ax_ms, ax_ratio) = plt.subplots(1, 3, figsize=(15, 4.5))
  acc = result["val_accuracy"]
  names = list(acc)
  ax_acc.bar(
    range(len(names)),
    [acc[n]["mean"] for n in names],
    yerr=[acc[n]["std"] for n in names],
    capsize=3,
    alpha=0.6,
  )
  for i, n in enumerate(names):
    ax_acc.plot([i] * len(acc[n]["values"]), acc[n]["values"], "k.", ms=4)
  ax_acc.set_xticks(range(len(names)), names)
  lo = min(min(acc[n]["values"]) for n in names)
  hi = max(max(acc[n]["values"]) for n in names)
  ax_acc.set_ylim(lo - 0.2 * (hi - lo + 1e-3), hi + 0.2 * (hi - lo + 1e-3))
  ax_acc.set_ylabel("validation accuracy (bars: mean ± std; dots: seeds)")
  timing = result["timing"]
  n = np.asarray(timing["tokens"], np.float64)
  for i, name in enumerate(ATTENTIONS):
    mean = [timing["ms"][k][name]["mean"] for k in timing["tokens"]]
    std = [timing["ms"][k][name]["std"] for k in timing["tokens"]]
    style = dict(marker="o", color=f"C{i}", label=name)
    ax_ms.errorbar(n, mean, yerr=std, capsize=3, **style)
    if name != "softmax":
      ratio = [
        timing["ratio_to_softmax"][k][name]["mean"] for k in timing["tokens"]
      ]
      ax_ratio.plot(n, ratio, **style)
  soft0 = timing["ms"][timing["tokens"][0]]["softmax"]["mean"]
  for power, style in ((1, ":"), (2, "--")):
    ax_ms.plot(n, soft0 * (n / n[0]) ** power, "k" + style, lw=0.8)
    ax_ms.plot([], [], "k" + style, lw=0.8, label=f"~ tokens^{power}")
  ax_ms.set_yscale("log")
  ax_ms.set_ylabel("training step (ms, median per round)")
  ax_ms.legend(fontsize=7)
  ax_ratio.axhline(1.0, color="k", lw=0.8)
  for ax in (ax_ms, ax_ratio):
    ax.set_xscale("log")
    ax.set_xticks(n, [str(k) for k in timing["tokens"]])
    ax.minorticks_off()
    ax.set_xlabel("tokens (patches + CLS)")
  ax_ratio.set_ylabel("step time / softmax's (same round)")
  ax_ratio.legend(fontsize=7)
  fig.suptitle(result["title"])
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), the timing, and the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  grid_variants = variants(base)
  vit = runner_vit(base)
  table = pathlib.Path(args.runs) / "vit.jsonl"
  sweep = lengths(args.quick, args.full)
  batch, rounds, reps = (
    (2, 2, 2) if args.quick else (16, 5, 20) if args.full else (8, 3, 3)
  )

  def compute() -> dict:
    lines = _grid.run_grid(table, base, grid_variants, seeds)
    error = _grid.cells(with_error(lines), "val_error")
    timing_lines = step_times(base, sweep, batch, rounds, reps)
    timing = timing_cells(timing_lines)
    return {
      "title": f"ViT on {base.data}: attention accuracy ({len(seeds)} seeds) "
      "and training-step time vs tokens",
      "lines": lines,
      "val_loss": _grid.cells(lines, "val_loss"),
      "val_accuracy": _grid.cells(lines, "val_accuracy"),
      "params": {k: v["mean"] for k, v in _grid.cells(lines, "params").items()},
      "timing_lines": timing_lines,
      "timing": timing,
      "verdicts": verdicts(error, timing),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plot_timing(result, path)
    _grid.figure(
      table,
      result["lines"],
      "val_accuracy",
      path.with_name(f"{path.stem}_curves.png"),
      f"ViT on {base.data}: validation loss and accuracy by attention "
      f"({len(seeds)} seeds)",
    )

  def markdown(result: dict) -> list[str]:
    return report_lines(
      result, args, base, vit, seeds, sweep, (batch, rounds, reps)
    )

  return _report.run(NAME, args, compute, figure, markdown)


def report_lines(
  result: Mapping[str, Any],
  args: argparse.Namespace,
  base: config_lib.TrainConfig,
  vit: models.ViTConfig,
  seeds: Sequence[int],
  sweep: Sequence[tuple[int, int]],
  timed: tuple[int, int, int],
) -> list[str]:
  """The Markdown report; ``timed`` is (batch, rounds, calls per round)."""
  batch, rounds, reps = timed
  timing = result["timing"]
  grid_side = vit.image_shape[0] // vit.patch_size
  lines = [f"# {__doc__.splitlines()[0]}", ""]
  lines += [
    f"Runner config: ViT on {base.data}, patch {vit.patch_size} "
    f"({grid_side}x{grid_side} patches + [CLS] = "
    f"{tokens(vit.image_shape[0], vit.patch_size)} tokens), width "
    f"{base.width}, depth {base.depth}, {base.num_heads} heads, batch "
    f"{base.batch_size}, {base.steps} AdamW steps (lr {base.learning_rate}, "
    f"cosine, warm-up {base.warmup_steps}, weight decay "
    f"{base.weight_decay}), seeds {list(seeds)}; SOFT landmark window "
    f"{soft_ratio(grid_side)} ({grid_side // soft_ratio(grid_side)}^2 "
    f"landmarks). Validation over {base.eval_batches} batches of "
    f"{base.batch_size} test images; mean ± sample std (ddof=1) over seeds. "
    f"Figures: `{NAME}.png` (accuracy, step time), `{NAME}_curves.png` "
    "(validation loss curves).",
    "",
    "Parameters: "
    + ", ".join(f"{k} {int(v)}" for k, v in result["params"].items())
    + ".",
    "",
    "## Validation accuracy",
    "",
  ]
  lines += _grid.markdown_table(
    result["val_accuracy"], "val accuracy", "softmax"
  )
  lines += ["", "## Validation loss (nats)", ""]
  lines += _grid.markdown_table(result["val_loss"], "val loss", "softmax")
  lines += [
    "",
    "## Training-step time vs tokens",
    "",
    f"Jitted step (forward, backward, AdamW) of the same ViT on batch "
    f"{batch} of random images; per round the median of {reps} calls; mean "
    f"± std over {rounds} rounds. SOFT landmark windows: "
    + ", ".join(
      f"{tokens(side, patch)} tokens: {soft_ratio(side // patch)}"
      for side, patch in sweep
    )
    + ".",
    "",
    "| attention | "
    + " | ".join(f"{n} tokens: ms (× softmax)" for n in timing["tokens"])
    + " |",
    "|---|" + "---|" * len(timing["tokens"]),
  ]
  for name in ATTENTIONS:
    row = []
    for n in timing["tokens"]:
      cell = _grid.fmt(timing["ms"][n][name], 1)
      if name != "softmax":
        cell += f" (×{timing['ratio_to_softmax'][n][name]['mean']:.2f})"
      row.append(cell)
    lines.append(f"| {name} | " + " | ".join(row) + " |")
  lo, hi = timing["tokens"][0], timing["tokens"][-1]
  prev = timing["tokens"][-2]
  lines += [
    "",
    f"Growth = step time at {hi} tokens / at {lo} tokens (per round); "
    f"slope = log-log slope from {prev} to {hi} tokens (1: linear, 2: "
    "quadratic).",
    "",
    "| attention | growth | slope |",
    "|---|---|---|",
  ]
  for name in ATTENTIONS:
    lines.append(
      f"| {name} | {_grid.fmt(timing['growth'][name], 2)} | "
      f"{_grid.fmt(timing['slope'][name], 2)} |"
    )
  lines += ["", "## Verdicts", ""]
  lines += _grid.verdict_table(result["verdicts"])
  if args.quick:
    lines += ["", "(--quick: toy sizes; the verdicts mean nothing.)"]
  return lines


if __name__ == "__main__":
  main()
