"""Test-time normalization: UnMix-TNS vs test-batch BN on label-sorted streams.

Paper: Tomar, Vray, Thiran & Bozorgtabar, "Un-Mixing Test-Time
Normalization Statistics: Combatting Label Temporal Correlation", ICLR
2024, arXiv:2401.08328. Normalizing with the statistics of the current
test batch (test-time BatchNorm, TBN) corrects a covariate shift when the
test batches are i.i.d., but collapses when the labels of the stream are
temporally correlated (each batch holds few classes); UnMix-TNS, ``K``
statistic components initialized from the source BatchNorm and un-mixed
online, keeps its accuracy on such streams and beats TBN there.

Claims (fixed before running; metric: accuracy on the test stream as a
fraction, higher is better; margin `claims.MARGINS["accuracy_fraction"]`,
one point), judged on each condition (``clean`` and ``shifted`` test
images), paired by seed:

* TBN collapses on the label-sorted stream: TBN on the i.i.d. stream is
  ``superior`` to TBN on the sorted stream. This is also the regime of the
  next two claims: where TBN does not collapse they are ``not testable at
  this scale``.
* UnMix-TNS beats TBN on the sorted stream (``superior``).
* UnMix-TNS keeps its i.i.d. accuracy on the sorted stream: UnMix-TNS on
  the sorted stream is ``non_inferior`` to UnMix-TNS on the i.i.d. stream.
* Shifted images only: test-batch statistics correct the shift on i.i.d.
  batches (TBN ``superior`` to the source statistics, both i.i.d.); this
  is the regime of the last claim (with the collapse): UnMix-TNS beats the
  source statistics on the sorted shifted stream (``superior``).

Setting: the runner's CNN with BatchNorm (`jaxnorm.nn.models.CNN`, width
32, depth 2, momentum 0.9), 400 AdamW steps at batch 64 on Fashion-MNIST
(one model per seed, trained by `jaxnorm.training.trainer.train`), then run
over the 10 000 test images in batches of 64, three ways: ``source`` (the
trained running statistics), ``tbn`` (each test batch's statistics) and
``unmix`` (every BatchNorm replaced by `jaxnorm.nn.norms.UnMixTNS`
``from_batch_norm``, K = 16, its components updated along the stream).
Streams: ``iid`` (shuffled) and ``sorted`` (grouped by label, shuffled
within a label: the extreme label-temporal correlation). Conditions:
``clean`` and ``shifted`` (contrast scaled by 0.6 around 0.5 plus Gaussian
noise of std 0.1, clipped to [0, 1]). The arms differ only at test time
(one trained network per seed), so no learning-rate sweep: the network
trains at the runner's AdamW rate. 3 seeds (training, stream order and the
components' noise). Deviations: the paper's corruptions are CIFAR10-C's
and its networks pretrained ResNets; a synthetic shift and a small CNN
here.

  python -m experiments.ttn_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid, report, tiers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import quant
from jaxnorm.training import build, claims, trainer
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "ttn_claims"
METHODS = ("source", "tbn", "unmix")
STREAMS = ("iid", "sorted")
CONDITIONS = ("clean", "shifted")
NUM_COMPONENTS = 16
MARGIN = claims.MARGINS["accuracy_fraction"]
TRAINING = "training"  # The table's line of each seed's trained network.


def arm(condition: str, method: str, stream: str) -> str:
  """The variant name of one test-time arm, e.g. ``clean:tbn/sorted``."""
  return f"{condition}:{method}/{stream}"


_claim = functools.partial(
  claims.Claim,
  paper="UnMix-TNS",
  arxiv="2401.08328",
  metric="accuracy",
  direction="higher",
  margin=MARGIN,
)


def condition_claims(condition: str) -> dict[str, claims.Claim]:
  """The claims of one condition, by role (``collapse`` gates the others)."""
  out = {
    "collapse": _claim(
      claim=f"{condition}: test-batch BN (TBN) collapses on a label-sorted "
      "stream",
      kind="superior",
      a=arm(condition, "tbn", "iid"),
      b=arm(condition, "tbn", "sorted"),
    ),
    "beats_tbn": _claim(
      claim=f"{condition}: UnMix-TNS beats TBN on the label-sorted stream",
      kind="superior",
      a=arm(condition, "unmix", "sorted"),
      b=arm(condition, "tbn", "sorted"),
    ),
    "keeps": _claim(
      claim=f"{condition}: UnMix-TNS keeps its i.i.d. accuracy on the "
      "label-sorted stream",
      kind="non_inferior",
      a=arm(condition, "unmix", "sorted"),
      b=arm(condition, "unmix", "iid"),
    ),
  }
  if condition == "shifted":
    out["adapts"] = _claim(
      claim="shifted: test-batch statistics correct the covariate shift on "
      "i.i.d. batches (TBN beats the source statistics)",
      kind="superior",
      a=arm(condition, "tbn", "iid"),
      b=arm(condition, "source", "iid"),
    )
    out["beats_source"] = _claim(
      claim="shifted: UnMix-TNS beats the source statistics on the "
      "label-sorted stream",
      kind="superior",
      a=arm(condition, "unmix", "sorted"),
      b=arm(condition, "source", "sorted"),
    )
  return out


def base_config(args) -> config_lib.TrainConfig:
  """The training run of each tier: CNN width 32, depth 2, batch 64."""
  run = {
    "quick": dict(
      data="digits",
      width=8,
      depth=1,
      batch_size=16,
      steps=4,
      eval_every=4,
      eval_batches=1,
      warmup_steps=1,
    ),
    "default": dict(
      data="fashion_mnist",
      width=32,
      depth=2,
      batch_size=64,
      steps=400,
      eval_every=100,
      eval_batches=16,
      warmup_steps=40,
    ),
    "full": dict(
      data="fashion_mnist",
      width=64,
      depth=4,
      batch_size=64,
      steps=3000,
      eval_every=500,
      eval_batches=40,
      warmup_steps=100,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="cnn",
    norm="batchnorm",
    # Flax's momentum 0.99 leaves the running statistics short of the
    # trained weights' after a few hundred steps.
    norm_kwargs=(("momentum", 0.9),),
    **run,
    log_every=run["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    learning_rate=3e-3,
  )


def shift(x: np.ndarray, seed: int) -> np.ndarray:
  """Contrast scaled by 0.6 around 0.5, Gaussian noise of std 0.1, clip."""
  rng = np.random.default_rng(10_000 + seed)
  noisy = 0.5 + 0.6 * (x - 0.5) + rng.normal(0.0, 0.1, x.shape)
  return np.clip(noisy, 0.0, 1.0).astype(np.float32)


def stream_order(y: np.ndarray, stream: str, seed: int) -> np.ndarray:
  """Indices of the test stream: shuffled, or grouped by label."""
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(y))
  if stream == "sorted":
    order = order[np.argsort(y[order], kind="stable")]
  return order


@nnx.jit
def _predict(model: nnx.Module, images: jax.Array) -> jax.Array:
  return jnp.argmax(model(images), axis=-1)


def run_stream(
  model: nnx.Module, x: np.ndarray, y: np.ndarray, batch: int
) -> np.ndarray:
  """Per-batch accuracies of ``model`` along the stream (in order)."""
  hits = []
  for i in range(0, len(x) - batch + 1, batch):
    pred = np.asarray(_predict(model, jnp.asarray(x[i : i + batch])))
    hits.append(float(np.mean(pred == y[i : i + batch])))
  return np.asarray(hits)


def adapted(model: nnx.Module, method: str, seed: int) -> nnx.Module:
  """A copy of the trained ``model`` set up for ``method``."""
  m = nnx.clone(model)
  if method == "source":
    m.eval()
  elif method == "tbn":
    m.train()  # Batch statistics; the copy's running ones are discarded.
  else:
    rngs = nnx.Rngs(seed)
    quant.swap_modules(
      m,
      nn_norms.BatchNorm,
      lambda bn: nn_norms.UnMixTNS.from_batch_norm(
        bn, rngs=rngs, num_components=NUM_COMPONENTS
      ),
    )
  return m


def evaluate_seed(
  base: config_lib.TrainConfig,
  images: data_lib.ImageSplits,
  runs: pathlib.Path,
  seed: int,
) -> list[dict[str, Any]]:
  """Trains one CNN and runs every (condition, method, stream).

  Returns the seed's lines: its training summary (variant `TRAINING`) and
  one line per test-time arm with its stream ``accuracy``.
  """
  cfg = dataclasses.replace(
    base,
    seed=seed,
    out_dir=str(grid.run_dir(runs, TRAINING, seed)),
    progress=False,
    resume=False,
  )
  model = build.build_model(
    cfg,
    {"num_classes": images.num_classes, "image_shape": images.val_x.shape[1:]},
    rngs=nnx.Rngs(seed),
  )
  summary = trainer.train(cfg, model=model)
  lines = [
    {
      "variant": TRAINING,
      "seed": seed,
      **{k: summary.get(k) for k in ("train_loss", "val_loss", "val_accuracy")},
      "params": summary.get("params"),
      "steps": summary.get("steps"),
    }
  ]
  for condition in CONDITIONS:
    x = images.val_x if condition == "clean" else shift(images.val_x, seed)
    for stream in STREAMS:
      order = stream_order(images.val_y, stream, seed)
      xs, ys = x[order], images.val_y[order]
      for method in METHODS:
        acc = run_stream(adapted(model, method, seed), xs, ys, base.batch_size)
        lines.append(
          {
            "variant": arm(condition, method, stream),
            "seed": seed,
            "accuracy": float(acc.mean()),
            "batch_accuracy": acc.tolist(),
          }
        )
  return lines


def records(
  lines: Sequence[dict[str, Any]],
  base: config_lib.TrainConfig,
  num_classes: int,
) -> list[dict[str, Any]]:
  """Every claim's record; the regimes gate the claims that need them."""
  training = [ln for ln in lines if ln["variant"] == TRAINING]
  # The network trained when its validation loss is below the uniform
  # guess's (ln of the class count) on every seed.
  trained = all(
    ln["val_loss"] is not None and ln["val_loss"] < math.log(num_classes)
    for ln in training
  )
  one = grid.setting(training, base, {TRAINING: {}}, TRAINING)
  config = {
    "base": config_lib.to_json(config_lib.resolve(base)),
    "test": {
      "batch_size": base.batch_size,
      "num_components": NUM_COMPONENTS,
      "shift": "0.5 + 0.6 (x - 0.5) + N(0, 0.1^2), clipped to [0, 1]",
      "streams": list(STREAMS),
    },
  }

  def record(claim, *, testable=True, reason=None):
    return grid.claim_record(
      lines,
      claim,
      baseline_trained=trained,
      config=config,
      setting={"a": one, "b": one},
      testable=testable,
      reason=reason
      if trained
      else "the network did not train (validation "
      f"loss above ln {num_classes} on some seed)",
    )

  out = []
  for condition in CONDITIONS:
    cs = condition_claims(condition)
    collapse = record(cs["collapse"])
    present = collapse["verdict"] == "reproduced"
    why = (
      None
      if present
      else f"TBN does not collapse on the sorted stream ({collapse['why']})"
    )
    out.append(collapse)
    for role in ("beats_tbn", "keeps"):
      out.append(record(cs[role], testable=present, reason=why))
    if condition == "shifted":
      adapts = record(cs["adapts"])
      out.append(adapts)
      fixed = adapts["verdict"] == "reproduced"
      reason = why or (
        None
        if fixed
        else "test-batch statistics do not correct this shift on i.i.d. "
        f"batches ({adapts['why']})"
      )
      out.append(
        record(cs["beats_source"], testable=present and fixed, reason=reason)
      )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains and evaluates each seed (skipping finished ones); the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  runs = pathlib.Path(args.runs) / tiers.tier(args)
  table = runs / "ttn.jsonl"

  def compute() -> dict:
    images = data_lib.load_images(base.data)
    table.parent.mkdir(parents=True, exist_ok=True)
    lines = grid.read_table(table)
    done = {ln["seed"] for ln in lines}
    for seed in seeds:
      if seed in done:
        continue
      new = evaluate_seed(base, images, runs, seed)
      with table.open("a") as f:
        f.writelines(json.dumps(ln) + "\n" for ln in new)
      lines += new
    lines = [ln for ln in lines if ln["seed"] in seeds]
    streams = [ln for ln in lines if ln["variant"] != TRAINING]
    return {
      "claims": records(lines, base, images.num_classes),
      "lines": lines,
      "accuracy": grid.cells(streams, "accuracy"),
      "training": grid.cells(
        [ln for ln in lines if ln["variant"] == TRAINING], "val_accuracy"
      ),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(22, 5))
    cells = result["accuracy"]
    for ax, condition in zip(axes[:2], CONDITIONS):
      names = [n for n in cells if n.startswith(f"{condition}:")]
      ax.bar(
        range(len(names)),
        [cells[n]["mean"] for n in names],
        yerr=[cells[n]["std"] for n in names],
        capsize=3,
        color=[
          f"C{METHODS.index(n.split(':')[1].split('/')[0])}" for n in names
        ],
      )
      ax.set_xticks(
        range(len(names)),
        [n.split(":")[1] for n in names],
        rotation=45,
        ha="right",
      )
      ax.set(ylabel="stream accuracy", title=f"{condition} test images")
      ax.set_ylim(0, 1)
    first = seeds[0]
    for ln in result["lines"]:
      if ln["seed"] == first and ln["variant"].startswith("shifted:"):
        if ln["variant"].endswith("/sorted"):
          acc = np.asarray(ln["batch_accuracy"])
          axes[2].plot(acc, label=ln["variant"].split(":")[1], lw=1)
    axes[2].set(
      xlabel="test batch (label-sorted stream)",
      ylabel="batch accuracy",
      title=f"shifted, sorted stream, seed {first}",
      ylim=(0, 1),
    )
    axes[2].legend(fontsize=7)
    report.claims_axes(axes[3], result["claims"])
    fig.suptitle(
      f"Test-time normalization on {base.data}: source BN vs test-batch BN "
      f"vs UnMix-TNS ({len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(base, seeds)
    lines += [
      f"Test stream: the {base.data} test split in batches of "
      f"{base.batch_size}; UnMix-TNS with K = {NUM_COMPONENTS}, "
      "temperature 0.07, its default update rate. The networks' own "
      "validation accuracy (running statistics, i.i.d. batches): "
      f"{grid.fmt(result['training'][TRAINING])}.",
      "",
    ]
    for condition in CONDITIONS:
      cells = {
        n: c for n, c in result["accuracy"].items() if n.startswith(condition)
      }
      lines += [f"## {condition} test images: stream accuracy", ""]
      lines += grid.markdown_table(
        cells, "accuracy", arm(condition, "source", "iid")
      )
      lines.append("")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
