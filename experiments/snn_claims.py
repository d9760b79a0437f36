"""Self-normalizing MLPs at depth 8 and 32: SELU vs ReLU and ReLU + BatchNorm.

Paper: Klambauer, Unterthiner, Mayr & Hochreiter, "Self-Normalizing
Neural Networks", arXiv:1706.02515 (2017): with SELU and LeCun-normal
weights, activations close to mean 0 and variance 1 converge to that fixed
point from layer to layer (Theorem 1), whatever the depth; so deep SELU
networks (SNNs) train where plain feed-forward networks degrade with depth,
and they beat feed-forward networks with BatchNorm (its Figure 1: the
training of deep BatchNorm networks is perturbed where SNNs' is not).

Claims (fixed before running; paired by seed):

* SELU self-normalizes at any depth: at initialization, the variance of
  the last hidden layer of the depth-32 SELU MLP is ``equivalent`` to the
  depth-8 one's within a 10% ratio (metric: its log, margin
  `claims.MARGINS["log_ratio"]`, log(1.1)).
* Regime: plain ReLU MLPs degrade with depth: the depth-8 ReLU MLP is
  ``superior`` to the depth-32 one (validation accuracy as a fraction,
  higher is better, margin `claims.MARGINS["accuracy_fraction"]`, one
  point). Where it is not, the next claim is ``not testable at this
  scale``.
* The depth-32 SELU MLP beats the depth-32 ReLU MLP (``superior``, same
  metric and margin).
* The depth-32 SELU MLP beats the depth-32 ReLU + BatchNorm MLP
  (``superior``, same metric and margin). A baseline whose validation loss
  stays above the uniform guess's (ln 10) on a seed did not train
  (``baseline_trained=False``: the claim cannot be reproduced).

Setting: MLPs of constant width 128 on flattened Fashion-MNIST (pixels
standardized with the training set's mean and std, as the theory needs
normalized inputs), 800 steps at batch 128 of SGD with Nesterov momentum
0.9 (the paper's optimizer family; the runner's ``sgd``, cosine schedule,
clipping 1.0), trained by the runner (`jaxnorm.training.trainer.train`
with the model given), validation on 5120 test images:

* ``selu``: SELU, LeCun-normal (plain normal, variance 1/fan-in), zero
  biases, alpha-dropout 0.05 after every hidden layer (the paper's);
* ``relu-bn``: linear, BatchNorm (momentum 0.9), ReLU, He-normal;
* ``relu``: linear, ReLU, He-normal (the variance-preserving init for
  ReLU, so the baseline is not starved by a LeCun init).

Every (kind, depth) trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss
(`experiments._harness.grid.tuned_grid`, extended until the best rate is
inside the grid), then 3 seeds. Parameter counts: equal for SELU and
ReLU; BatchNorm adds its scale and bias (1.5% at depth 32).

Layer statistics: mean and variance over all units and 1000 test images of
each hidden layer's output (after the activation), at initialization
(BatchNorm with the probe batch's statistics) and after training (running
statistics), without dropout. They are reported, with the drift
``max_l |mean_l| + |var_l - 1|``; after training no claim is made on them
(the paper's Theorems 2 and 3 bound the variance when the weights move
away from normalization; they do not fix it at 1).

  python -m experiments.snn_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid, report, runs, tiers
from jaxnorm import activations
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import layers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import claims, metrics
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "snn_claims"
KINDS = ("selu", "relu-bn", "relu")
STAT_IMAGES = 1000
ACCURACY = claims.MARGINS["accuracy_fraction"]
PAPER = ("Self-normalizing networks", "1706.02515")
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
STATS = ("init", "trained")
FIELDS = tuple(
  f"{when}_{key}"
  for when in STATS
  for key in ("stats", "log_var", "mean", "drift")
)


def depths(args: argparse.Namespace) -> tuple[int, int]:
  """The shallow and the deep depth of the tier."""
  return (2, 4) if tiers.tier(args) == "quick" else (8, 32)


def variant(kind: str, depth: int) -> str:
  """The grid's name of a (kind, depth), e.g. ``relu-bn-d32``."""
  return f"{kind}-d{depth}"


def kind_of(name: str) -> str:
  """The kind of a variant name (`variant`'s inverse)."""
  return name.rsplit("-d", 1)[0]


def variants_for(shallow: int, deep: int) -> dict[str, dict[str, Any]]:
  """Every (kind, depth) as `TrainConfig` changes (labels of the model)."""
  out = {}
  for depth in (shallow, deep):
    for kind in KINDS:
      changes: dict[str, Any] = {
        "depth": depth,
        "activation": "selu" if kind == "selu" else "relu",
      }
      if kind == "relu-bn":
        changes["norm"] = "batchnorm"
      out[variant(kind, depth)] = changes
  return out


def make_claims(shallow: int, deep: int) -> dict[str, claims.Claim]:
  """The claims by role; ``regime`` gates ``selu_relu``."""

  def claim(text, metric, direction, kind, margin, a, b):
    return claims.Claim(
      paper=PAPER[0],
      arxiv=PAPER[1],
      claim=text,
      metric=metric,
      direction=direction,
      kind=kind,
      margin=margin,
      a=a,
      b=b,
    )

  return {
    "fixed_point": claim(
      f"SELU self-normalizes at any depth: at initialization the variance "
      f"of the last hidden layer at depth {deep} matches depth {shallow}'s",
      "init_log_var",
      "lower",
      "equivalent",
      claims.MARGINS["log_ratio"],
      variant("selu", deep),
      variant("selu", shallow),
    ),
    "regime": claim(
      f"plain ReLU MLPs degrade with depth ({shallow} beats {deep})",
      "val_accuracy",
      "higher",
      "superior",
      ACCURACY,
      variant("relu", shallow),
      variant("relu", deep),
    ),
    "selu_relu": claim(
      f"SELU MLPs train where ReLU MLPs degrade: SELU beats ReLU at depth "
      f"{deep}",
      "val_accuracy",
      "higher",
      "superior",
      ACCURACY,
      variant("selu", deep),
      variant("relu", deep),
    ),
    "selu_bn": claim(
      f"SELU MLPs beat ReLU MLPs with BatchNorm at depth {deep}",
      "val_accuracy",
      "higher",
      "superior",
      ACCURACY,
      variant("selu", deep),
      variant("relu-bn", deep),
    ),
  }


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
    if kind not in KINDS:
      raise ValueError(
        f"DeepMLP: kind must be one of {', '.join(KINDS)}, got {kind!r}"
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


def drift(stats: np.ndarray) -> float:
  """``max_l |mean_l| + |var_l - 1|`` of ``(depth, 2)`` statistics."""
  stats = np.asarray(stats, np.float64)
  return float(np.max(np.abs(stats[:, 0]) + np.abs(stats[:, 1] - 1.0)))


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run (its model fields label the runs: the model is given)."""
  run = {
    "quick": dict(
      data="digits",
      width=16,
      batch_size=16,
      steps=4,
      eval_every=2,
      eval_batches=1,
      warmup_steps=1,
    ),
    "default": dict(
      data="fashion_mnist",
      width=128,
      batch_size=128,
      steps=800,
      eval_every=200,
      eval_batches=40,
      warmup_steps=50,
    ),
    "full": dict(
      data="fashion_mnist",
      width=512,
      batch_size=128,
      steps=6000,
      eval_every=500,
      eval_batches=78,
      warmup_steps=300,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="mlp",
    **run,
    log_every=run["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    optimizer="sgd",
    learning_rate=1e-2,
    weight_decay=0.0,
  )


def model_factory(
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  images: data_lib.ImageSplits,
):
  """``(variant, seed) -> DeepMLP`` of the variant's kind and depth."""
  pixels = images.train_x
  shift, scale = float(pixels.mean()), float(pixels.std())

  def make(name: str, seed: int) -> DeepMLP:
    return DeepMLP(
      kind_of(name),
      depth=variants[name]["depth"],
      width=base.width,
      in_features=math.prod(images.train_x.shape[1:]),
      num_classes=images.num_classes,
      shift=shift,
      scale=scale,
      rngs=nnx.Rngs(seed),
    )

  return make


def with_stats(
  lines: Sequence[Mapping[str, Any]],
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  make,
  probe: jax.Array,
) -> list[dict[str, Any]]:
  """The lines with their runs' layer statistics (`FIELDS`) added.

  At initialization: the model built as the run's (the same seed draws the
  same weights) in training mode, so BatchNorm normalizes with the probe
  batch's statistics (its running ones are still 0 and 1). After training:
  the same model with the run's final checkpoint restored
  (`experiments._harness.runs.trained_line`; eval mode, running
  statistics). ``variants``: the grid's changes (with the tuned rates).
  Each time: the per-layer statistics, the last hidden layer's log
  variance and mean, and the drift.
  """
  out = []
  for ln in lines:
    model = make(ln["variant"], ln["seed"])
    init = np.asarray(_layer_stats(model, probe))
    model = runs.trained_line(table, base, variants, ln, model=make)
    trained_ = np.asarray(_layer_stats(model, probe))
    extra = {}
    for when, stats in zip(STATS, (init, trained_)):
      extra[f"{when}_stats"] = stats.tolist()
      extra[f"{when}_log_var"] = float(np.log(stats[-1, 1]))
      extra[f"{when}_mean"] = float(stats[-1, 0])
      extra[f"{when}_drift"] = drift(stats)
    out.append({**ln, **extra})
  return out


def records(lines, base, tuned, shallow: int, deep: int) -> list[dict]:
  """Every claim's record; the ReLU regime gates SELU-vs-ReLU."""
  cs = make_claims(shallow, deep)
  chance = runs.chance_loss(base)

  def record(role: str, **kw) -> dict[str, Any]:
    claim = cs[role]
    reason = kw.pop("reason", None)
    # The fixed point is measured before training.
    failed = None
    if role != "fixed_point":
      failed = runs.untrained(
        lines, claim.b, chance, what="the uniform guess's loss"
      )
    return grid.runner_record(
      lines,
      claim,
      base,
      tuned,
      baseline_trained=failed is None,
      reason=failed or reason,
      **kw,
    )

  regime = record("regime")
  present = regime["verdict"] == "reproduced"
  why = (
    None
    if present
    else f"plain ReLU does not degrade from depth {shallow} to {deep} here "
    f"({regime['why']})"
  )
  return [
    record("fixed_point"),
    regime,
    record("selu_relu", testable=present, reason=why),
    record("selu_bn"),
  ]


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  shallow, deep = depths(args)
  variants = variants_for(shallow, deep)
  table = pathlib.Path(args.runs) / tiers.tier(args) / "grid.jsonl"
  # --quick checks the pipeline at the base rate.
  quick = tiers.tier(args) == "quick"
  rates = {} if quick else {v: LEARNING_RATES for v in variants}

  def compute() -> dict:
    images = data_lib.load_images(base.data)
    make = model_factory(base, variants, images)
    lines, tuned = grid.tuned_grid(
      table, base, variants, seeds, rates, model=make
    )
    probe = jnp.asarray(images.val_x[:STAT_IMAGES])
    lines = with_stats(lines, table, base, tuned["variants"], make, probe)
    return {
      "claims": records(lines, base, tuned["variants"], shallow, deep),
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "val_accuracy": grid.cells(lines, "val_accuracy"),
      "val_loss": grid.cells(lines, "val_loss"),
      "stats": {
        key: grid.cells(lines, key)
        for key in FIELDS
        if not key.endswith("_stats")
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(22, 8))
    colors = dict(zip(KINDS, ("C0", "C1", "C2")))
    styles = {shallow: "--", deep: "-"}
    for ln in result["lines"]:
      kind = kind_of(ln["variant"])
      depth = len(ln["init_stats"])
      for row, when in enumerate(STATS):
        s = np.asarray(ln[f"{when}_stats"])
        label = (
          ln["variant"] if ln["seed"] == seeds[0] and row == 0 else None
        )  # fmt: skip
        kw = dict(color=colors[kind], ls=styles[depth], lw=1, alpha=0.8)
        axes[row, 0].plot(np.arange(1, depth + 1), s[:, 0], label=label, **kw)
        axes[row, 1].plot(np.arange(1, depth + 1), s[:, 1], **kw)
    for row, when in enumerate(("at initialization", "after training")):
      axes[row, 0].set_ylabel(f"layer mean ({when})")
      axes[row, 1].set_ylabel(f"layer variance ({when}, log scale)")
      axes[row, 1].set_yscale("log")
      for col in (0, 1):
        axes[row, col].axhline(col, color="k", lw=0.5)
        axes[row, col].set_xlabel("hidden layer")
    axes[0, 0].legend(fontsize=6, ncol=2)
    for ln in result["lines"]:
      if len(ln["init_stats"]) != deep:
        continue
      log = metrics.read_log(
        grid.run_dir(table.parent, ln["run"], ln["seed"]) / "metrics.jsonl"
      )
      curve = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
      kind = kind_of(ln["variant"])
      axes[0, 2].plot(
        *zip(*curve),
        color=colors[kind],
        label=ln["variant"] if ln["seed"] == seeds[0] else None,
      )
    axes[0, 2].axhline(math.log(10), color="grey", ls=":", label="ln 10")
    axes[0, 2].set(
      xlabel="step", ylabel="validation loss", title=f"depth {deep}"
    )
    axes[0, 2].set_ylim(bottom=0)
    axes[0, 2].legend(fontsize=7)
    cells = result["val_accuracy"]
    for i, kind in enumerate(KINDS):
      row = [cells[variant(kind, d)] for d in (shallow, deep)]
      axes[1, 2].errorbar(
        np.arange(2) + 0.06 * (i - 1),
        [c["mean"] for c in row],
        yerr=[c["std"] for c in row],
        color=colors[kind],
        marker="o",
        capsize=3,
        label=kind,
      )
    axes[1, 2].set_xticks(range(2), [str(shallow), str(deep)])
    axes[1, 2].set(xlabel="depth", ylabel="validation accuracy", ylim=(0, 1))
    axes[1, 2].legend(fontsize=7)
    report.claims_axes(axes[0, 3], result["claims"])
    axes[1, 3].axis("off")
    fig.suptitle(
      f"Self-normalizing MLPs on {base.data} (width {base.width}, "
      f"{len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    lines += [
      f"Depths {shallow} and {deep}; the runner trains the model this "
      f"script builds (config fields `activation`, `depth` and `norm` "
      f"label it). Layer statistics on {STAT_IMAGES} test images.",
      "",
    ]
    if result["sweeps"]:
      lines += report.sweep_lines(result["sweeps"])
    lines += ["## Validation accuracy", ""]
    lines += grid.markdown_table(result["val_accuracy"], "val accuracy")
    lines += ["", "## Validation loss (nats)", ""]
    lines += grid.markdown_table(result["val_loss"], "val loss")
    lines += [
      "",
      "## The last hidden layer and the drift",
      "",
      "Log variance and mean of the last hidden layer's output, and the "
      "drift max_l |mean_l| + |var_l - 1| over the layers, at "
      "initialization and after training.",
      "",
      "| variant | "
      + " | ".join(k.replace("_", " ") for k in result["stats"])
      + " |",
      "|---|" + "---|" * len(result["stats"]),
    ]
    for name in result["val_accuracy"]:
      lines.append(
        f"| {name} | "
        + " | ".join(grid.fmt(c[name]) for c in result["stats"].values())
        + " |"
      )
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
