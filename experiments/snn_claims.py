"""Self-normalizing MLPs at depth 8/16/32: SELU vs ReLU + BatchNorm vs ReLU.

Claims checked (Klambauer et al., "Self-Normalizing Neural Networks",
arXiv:1706.02515, 2017):

* SELU with LeCun-normal weights keeps every layer's activations near mean
  0 and variance 1, whatever the depth (the fixed point of the paper's
  Theorem 1), at initialization and after training;
* so deep SELU MLPs train where plain ReLU MLPs degrade with depth, and
  they beat ReLU MLPs with BatchNorm (the paper's comparison on 121 UCI
  tasks and Tox21).

Setting: MLPs of constant width on flattened Fashion-MNIST (pixels
standardized with the training set's mean and std, as the theory needs
normalized inputs), trained by the runner (`jaxnorm.training.trainer.train`
with the model given; SGD as the paper, with the runner's Nesterov
momentum), 3 seeds per (variant, depth):

* ``selu``: SELU, LeCun-normal (plain normal, variance 1/fan-in), zero
  biases, alpha-dropout 0.05 after every hidden layer (the paper's);
* ``relu-bn``: linear, BatchNorm, ReLU, He-normal;
* ``relu``: linear, ReLU, He-normal (the variance-preserving init for
  ReLU, so the baseline is not starved by a LeCun init).

Per-layer statistics: mean and variance over all units and 1000 test
images of each hidden layer's output (after the activation), at
initialization (BatchNorm with the probe batch's statistics) and after
training (running statistics), without dropout. Their drift is
``max_l |mean_l| + |var_l - 1|``. Verdicts compare means with the
standard error of their difference (`experiments._grid.verdict`); the
drift claim is one-sided against a tolerance.

  python -m experiments.snn_claims [--quick] [--full]
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm import activations
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import layers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib
from jaxnorm.training import metrics, trainer

NAME = "snn_claims"
VARIANTS = ("selu", "relu-bn", "relu")
DEPTHS = (8, 16, 32)
# Largest drift max_l |mean_l| + |var_l - 1| counted as "near (0, 1)".
DRIFT_TOLERANCE = 0.3
STAT_IMAGES = 1000


class DeepMLP(nnx.Module):
  """``depth`` hidden layers of constant width and a linear head.

  ``kind`` is ``selu`` (LeCun-normal, alpha-dropout), ``relu-bn`` or
  ``relu`` (He-normal). Inputs are flattened and standardized with the
  fixed ``shift`` and ``scale``.
  """

  def __init__(
    self,
    kind: str,
    *,
    depth: int,
    width: int,
    in_features: int,
    num_classes: int,
    shift: float,
    scale: float,
    dropout: float = 0.05,
    rngs: nnx.Rngs,
  ):
    if kind not in VARIANTS:
      raise ValueError(
        f"DeepMLP: kind must be one of {', '.join(VARIANTS)}, got {kind!r}"
      )
    self.kind, self.shift, self.scale = kind, shift, scale
    init = (
      activations.lecun_normal("normal")
      if kind == "selu"
      else nnx.initializers.he_normal()
    )
    sizes = [in_features] + [width] * depth
    self.layers = nnx.List(
      [
        layers.Dense(a, b, names=(None, "mlp"), kernel_init=init, rngs=rngs)
        for a, b in zip(sizes[:-1], sizes[1:])
      ]
    )
    self.norms = nnx.List(
      [
        nn_norms.make_norm("batchnorm", width, rngs=rngs, momentum=0.9)
        for _ in range(depth if kind == "relu-bn" else 0)
      ]
    )
    self.act = nn_activations.ACTIVATIONS[
      "selu" if kind == "selu" else "relu"
    ].fn
    self.dropout = nn_activations.AlphaDropout(
      dropout if kind == "selu" else 0.0
    )
    self.head = layers.Dense(
      width, num_classes, names=("mlp", None), kernel_init=init, rngs=rngs
    )

  def hidden(
    self, images: jax.Array, rngs: jax.Array | None
  ) -> tuple[list[jax.Array], jax.Array]:
    """Hidden outputs (after the activation, before dropout), last input."""
    x = (images.reshape(images.shape[0], -1) - self.shift) / self.scale
    out = []
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if self.norms:
        x = self.norms[i](x)
      x = self.act(x)
      out.append(x)
      if rngs is not None:
        x = self.dropout(
          x, deterministic=False, key=jax.random.fold_in(rngs, i)
        )
    return out, x

  def __call__(
    self, images: jax.Array, *, rngs: jax.Array | None = None
  ) -> jax.Array:
    """Class logits; alpha-dropout is active when ``rngs`` is a key."""
    return self.head(self.hidden(images, rngs)[1])


@nnx.jit
def _layer_stats(model: DeepMLP, images: jax.Array) -> jax.Array:
  """``(depth, 2)``: each hidden layer's mean and variance (all entries)."""
  hidden, _ = model.hidden(images, None)
  return jnp.stack([jnp.stack([jnp.mean(h), jnp.var(h)]) for h in hidden])


def base_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """The shared run (its model fields are unused: the model is given)."""
  if quick:
    size = dict(data="digits", width=16, batch_size=16)
    steps = dict(steps=4, eval_every=2, eval_batches=1, warmup_steps=1)
  elif full:
    size = dict(data="fashion_mnist", width=512, batch_size=128)
    steps = dict(steps=6000, eval_every=500, eval_batches=40, warmup_steps=300)
  else:
    size = dict(data="fashion_mnist", width=128, batch_size=128)
    steps = dict(steps=800, eval_every=200, eval_batches=16, warmup_steps=50)
  return config_lib.TrainConfig(
    model="mlp",
    **size,
    **steps,
    log_every=steps["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    optimizer="sgd",
    learning_rate=1e-2,
    weight_decay=0.0,
  )


def _run_dir(runs: pathlib.Path, cell: str, seed: int) -> pathlib.Path:
  return runs / "runs" / cell / f"seed{seed}"


def run_cells(
  runs: pathlib.Path,
  base: config_lib.TrainConfig,
  depths: Sequence[int],
  seeds: Sequence[int],
  images: data_lib.ImageSplits,
) -> list[dict[str, Any]]:
  """Trains every (variant, depth, seed) not yet in ``runs/snn.jsonl``.

  Each line is `_grid.run_grid`'s (variant ``<kind>-d<depth>``) plus the
  per-layer statistics at initialization and after training.
  """
  table = runs / "snn.jsonl"
  table.parent.mkdir(parents=True, exist_ok=True)
  lines = _grid.read_table(table)
  done = {(ln["variant"], ln["seed"]) for ln in lines}
  pixels = images.train_x
  shift, scale = float(pixels.mean()), float(pixels.std())
  probe = jnp.asarray(images.val_x[:STAT_IMAGES])
  for depth in depths:
    for kind in VARIANTS:
      cell = f"{kind}-d{depth}"
      for seed in seeds:
        if (cell, seed) in done:
          continue
        model = DeepMLP(
          kind,
          depth=depth,
          width=base.width,
          in_features=math.prod(images.train_x.shape[1:]),
          num_classes=images.num_classes,
          shift=shift,
          scale=scale,
          rngs=nnx.Rngs(seed),
        )
        # At initialization in training mode: BatchNorm normalizes with the
        # probe batch's statistics (its running ones are still 0 and 1); a
        # clone, so the running statistics stay untouched.
        init_stats = np.asarray(_layer_stats(nnx.clone(model), probe))
        summary = trainer.train(
          dataclasses.replace(
            base,
            seed=seed,
            out_dir=str(_run_dir(runs, cell, seed)),
            progress=False,
            resume=False,
          ),
          model=model,
        )
        trained_stats = np.asarray(_layer_stats(model, probe))
        line = {
          "variant": cell,
          "kind": kind,
          "depth": depth,
          "seed": seed,
          "val_loss": summary["val_loss"],
          "val_accuracy": summary["val_accuracy"],
          "train_loss": summary["train_loss"],
          "steps": summary["steps"],
          "stopped_early": summary["stopped_early"],
          "init_stats": init_stats.tolist(),
          "trained_stats": trained_stats.tolist(),
          "init_drift": drift(init_stats),
          "trained_drift": drift(trained_stats),
        }
        with table.open("a") as f:
          f.write(json.dumps(line) + "\n")
        lines.append(line)
  return lines


def drift(stats: np.ndarray) -> float:
  """``max_l |mean_l| + |var_l - 1|`` of ``(depth, 2)`` statistics."""
  stats = np.asarray(stats, np.float64)
  return float(np.max(np.abs(stats[:, 0]) + np.abs(stats[:, 1] - 1.0)))


def below(cell: dict, tolerance: float) -> tuple[str, str]:
  """One-sided verdict on "the cell's mean is below ``tolerance``"."""
  se = cell["std"] / math.sqrt(cell["n"])
  why = f"{cell['mean']:.3f} (se {se:.3f}) vs tolerance {tolerance}"
  if cell["mean"] + 2 * se < tolerance:
    return "reproduced", why
  if cell["mean"] - 2 * se > tolerance:
    return "not reproduced at this scale", why
  return "inconclusive", why


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the grid (skipping finished runs) and writes the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  depths = (2, 4) if args.quick else DEPTHS
  deep, shallow = max(depths), min(depths)
  runs = pathlib.Path(args.runs)

  def compute() -> dict:
    images = data_lib.load_images(base.data)
    lines = run_cells(runs, base, depths, seeds, images)
    loss = _grid.cells(lines, "val_loss")
    accuracy = _grid.cells(lines, "val_accuracy")
    drifts = {
      when: _grid.cells(lines, f"{when}_drift") for when in ("init", "trained")
    }
    verdicts = []
    for when, grid in drifts.items():
      v, why = below(grid[f"selu-d{deep}"], DRIFT_TOLERANCE)
      verdicts.append(
        {
          "claim": f"SELU keeps mean≈0, var≈1 to depth {deep} ({when})",
          "verdict": v,
          "why": f"drift {why}",
        }
      )
    for variant, ref, label in (
      (f"selu-d{deep}", f"relu-d{deep}", f"SELU beats ReLU at depth {deep}"),
      (
        f"selu-d{deep}",
        f"relu-bn-d{deep}",
        f"SELU beats ReLU + BN at depth {deep}",
      ),
      (
        f"relu-d{shallow}",
        f"relu-d{deep}",
        f"plain ReLU degrades from depth {shallow} to {deep}",
      ),
    ):
      v, why = _grid.verdict(loss, variant, ref, "lower")
      verdicts.append({"claim": label, "verdict": v, "why": why})
    return {
      "lines": lines,
      "val_loss": loss,
      "val_accuracy": accuracy,
      "drift": drifts,
      "verdicts": verdicts,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = _report.pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    colors = dict(zip(VARIANTS, ("C0", "C1", "C2")))
    styles = dict(zip(depths, (":", "--", "-")))
    for ln in result["lines"]:
      for row, when in enumerate(("init", "trained")):
        s = np.asarray(ln[f"{when}_stats"])
        layers = np.arange(1, len(s) + 1)
        label = (
          f"{ln['kind']} d{ln['depth']}"
          if ln["seed"] == seeds[0] and row == 0
          else None
        )
        kw = dict(
          color=colors[ln["kind"]], ls=styles[ln["depth"]], lw=1, alpha=0.8
        )
        axes[row, 0].plot(layers, s[:, 0], label=label, **kw)
        axes[row, 1].plot(layers, s[:, 1], **kw)
    for row, when in enumerate(("at initialization", "after training")):
      axes[row, 0].set_ylabel(f"layer mean ({when})")
      axes[row, 1].set_ylabel(f"layer variance ({when})")
      axes[row, 1].set_yscale("log")
      for col in (0, 1):
        axes[row, col].axhline(col, color="k", lw=0.5)
        axes[row, col].set_xlabel("hidden layer")
    axes[0, 0].legend(fontsize=6, ncol=3)
    for variant in VARIANTS:
      for ln in result["lines"]:
        if ln["kind"] == variant and ln["depth"] == deep:
          log = metrics.read_log(
            _run_dir(runs, ln["variant"], ln["seed"]) / "metrics.jsonl"
          )
          curve = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
          axes[0, 2].plot(
            *zip(*curve),
            color=colors[variant],
            label=variant if ln["seed"] == seeds[0] else None,
          )
    axes[0, 2].set(
      xlabel="step", ylabel="validation loss", title=f"depth {deep}"
    )
    axes[0, 2].legend(fontsize=7)
    grid = result["val_accuracy"]
    for i, variant in enumerate(VARIANTS):
      cells = [grid[f"{variant}-d{d}"] for d in depths]
      axes[1, 2].errorbar(
        np.arange(len(depths)) + 0.08 * (i - 1),
        [c["mean"] for c in cells],
        yerr=[c["std"] for c in cells],
        color=colors[variant],
        marker="o",
        capsize=3,
        label=variant,
      )
    axes[1, 2].set_xticks(range(len(depths)), [str(d) for d in depths])
    axes[1, 2].set(xlabel="depth", ylabel="validation accuracy")
    axes[1, 2].legend(fontsize=7)
    fig.suptitle(
      f"Self-normalizing MLPs on {base.data} (width {base.width}, "
      f"{len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner: {base.data}, width {base.width}, depths {list(depths)}, "
      f"batch {base.batch_size}, {base.steps} steps of SGD with Nesterov "
      f"momentum 0.9 (lr {base.learning_rate}, cosine, warm-up "
      f"{base.warmup_steps}, no weight decay, gradient clip "
      f"{base.clip_norm}), seeds {list(seeds)}. "
      f"Validation over {base.eval_batches} batches of {base.batch_size} "
      "test images; mean ± sample std (ddof=1) over seeds. Layer "
      f"statistics on {STAT_IMAGES} test images.",
      "",
      "## Validation loss (nats)",
      "",
    ]
    lines += _grid.markdown_table(result["val_loss"], "val loss")
    lines += ["", "## Validation accuracy", ""]
    lines += _grid.markdown_table(result["val_accuracy"], "val accuracy")
    for when, grid in result["drift"].items():
      lines += [
        "",
        f"## Drift max_l |mean_l| + |var_l - 1| ({when})",
        "",
      ]
      lines += _grid.markdown_table(grid, "drift")
    lines += ["", "## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"])
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
