"""[CLS]-specialized LayerNorm in the ViT: dense patch features, accuracy.

Claims (Marouani, Simeoni, Jegou, Bojanowski & Vo, "Revisiting [CLS] and
Patch Token Interaction in Vision Transformers", arXiv:2602.08626), fixed
before running:

* Regime (the paper's observation, which gates the dense claim): the
  shared pre-attention LayerNorm "implicitly separates" the [CLS] token
  from the patch tokens: after it, [CLS] is far less similar to the patches
  (cosine about 0) than the patches are to each other. Metric: mean cosine
  similarity after the pre-attention norms of the trained LayerNorm ViT
  (higher is better), patch-patch ``superior`` to [CLS]-patch, margin 0.
  Where [CLS] is not separated, there is nothing for separate [CLS]
  parameters to take over and the dense claim is ``not testable at this
  scale``.
* Dense features: giving [CLS] and patch tokens separate normalization
  parameters improves dense prediction ("more than +2 mIoU in
  segmentation"): `CLSNorm` in every norm of the ViT is ``superior`` to
  LayerNorm on the mIoU of a linear probe on the frozen patch tokens,
  margin 0.
* Classification: "the same classification accuracy": `CLSNorm` is
  ``equivalent`` to LayerNorm in validation accuracy within one point
  (`claims.MARGINS["accuracy_fraction"]`).

Setting: the runner's ViT (pre-norm, [CLS] first, learned positions, 4x4
patches: 49 + 1 tokens) of width 32, depth 4, 4 heads on Fashion-MNIST,
400 AdamW steps of 64 images, every norm of the stack and the final norm
the arm's (`CLSNorm`: one copy of ``scale`` and ``bias`` for [CLS] and one
for the patches, both initialized as LayerNorm's, so the two arms are
equal at step 0). Validation accuracy on the first 2,048 test images.
Dense task (a toy stand-in for the paper's linear segmentation on
ADE20k/VOC): each 4x4 patch is labelled with the image's class when its
mean intensity is above `FOREGROUND` and "background" otherwise (11
classes); a linear softmax probe on the final-norm patch tokens of the
frozen network is fitted on 2,000 training images and scored by the mean
IoU over the 11 classes on 1,000 test images. The cosines are measured on
256 test images at every block's pre-attention norm. Parameter counts:
CLSNorm adds one scale and one bias per norm (+576 of 52,874, +1.1%).

Fair comparison: each arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended until
the best rate lies inside the grid (`experiments._harness.grid.
tuned_grid`); then 3 seeds, paired by seed. Deviations: a 53k-parameter
ViT trained from scratch on Fashion-MNIST instead of DINOv2/DeiT-III
ViT-S..L; norm specialization only (the paper also specializes the early
blocks' QKV projections; norms give most of the gain per the paper's
digests); registers none.

  python -m experiments.cls_norm_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import salunet_claims
from experiments._harness import grid, report, runs, tiers
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "cls_norm_claims"
VARIANTS: dict[str, dict[str, Any]] = {
  "layernorm": {"norm": "layernorm"},
  "clsnorm": {"norm": "clsnorm"},
}
LEARNING_RATES = {name: (1e-3, 3e-3, 1e-2) for name in VARIANTS}
# A patch is foreground when its mean pixel (in [0, 1]) is above this.
FOREGROUND = 0.1
PATCH_PATCH, CLS_PATCH = "patch-patch", "[CLS]-patch"
MARGIN = claims.MARGINS["accuracy_fraction"]

_PAPER = ("[CLS] specialization", "2602.08626")
CLAIMS = (
  claims.Claim(
    paper=_PAPER[0],
    arxiv=_PAPER[1],
    claim="the pre-attention LayerNorm implicitly separates [CLS] from the "
    "patch tokens: patches are more similar to each other than to [CLS]",
    metric="cosine",
    direction="higher",
    kind="superior",
    margin=0.0,
    a=PATCH_PATCH,
    b=CLS_PATCH,
  ),
  claims.Claim(
    paper=_PAPER[0],
    arxiv=_PAPER[1],
    claim="separate [CLS] and patch normalization parameters improve dense "
    "prediction (segmentation mIoU)",
    metric="probe_miou",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="clsnorm",
    b="layernorm",
  ),
  claims.Claim(
    paper=_PAPER[0],
    arxiv=_PAPER[1],
    claim="separate [CLS] and patch normalization parameters keep the same "
    "classification accuracy",
    metric="val_accuracy",
    direction="higher",
    kind="equivalent",
    margin=MARGIN,
    a="clsnorm",
    b="layernorm",
  ),
)
REGIME = CLAIMS[0]

# (probe-fit images, probe-test images, cosine images) per tier.
PROBE = {"quick": (32, 32, 16), "default": (2000, 1000, 256)}
PROBE["full"] = (10000, 5000, 1024)


def vit_config(args, **fields: Any) -> config_lib.TrainConfig:
  """The ViT of each tier (shared with `experiments.salunet_claims`)."""
  run = {
    "quick": dict(
      data="digits",
      width=16,
      depth=1,
      num_heads=2,
      batch_size=8,
      steps=4,
      eval_every=2,
      eval_batches=2,
      warmup_steps=1,
    ),
    "default": dict(
      data="fashion_mnist",
      width=32,
      depth=4,
      num_heads=4,
      batch_size=64,
      steps=400,
      eval_every=100,
      eval_batches=32,
      warmup_steps=40,
    ),
    # One accelerator: a ViT-Ti-sized model, 20 epochs of Fashion-MNIST.
    "full": dict(
      data="fashion_mnist",
      width=192,
      depth=12,
      num_heads=3,
      batch_size=128,
      steps=9400,
      eval_every=1000,
      eval_batches=78,
      warmup_steps=500,
    ),
  }[tiers.tier(args)]
  return config_lib.TrainConfig(
    model="vit",
    **run,
    log_every=run["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    **fields,
  )


def tokens(model: nnx.Module, images: jax.Array) -> tuple[jax.Array, list]:
  """The final-norm tokens and every pre-attention norm's output.

  The ViT's forward pass (`jaxnorm.nn.models.ViT`) written out so that the
  norms' outputs can be read; the caller checks it against the model.
  """
  n, h, w, ch = images.shape
  p = model.config.patch_size
  patches = (
    images.reshape(n, h // p, p, w // p, p, ch)
    .transpose(0, 1, 3, 2, 4, 5)
    .reshape(n, (h // p) * (w // p), p * p * ch)
  )
  x = model.patch(patches)
  cls = jnp.broadcast_to(model.cls[...], (n, 1, x.shape[-1]))
  x = jnp.concatenate([cls, x], axis=1) + model.pos[...][None]
  normed = []
  for k, (block, step) in enumerate(zip(model.net.blocks, model.net.steps)):
    hidden = step.norm(x)
    if k % 2 == 0:  # attention, then MLP, per layer
      normed.append(hidden)
    x = x + block(hidden)
  return model.final_norm(x), normed


def _cosines(normed: list) -> tuple[float, float]:
  """Mean patch-patch and [CLS]-patch cosines over norms and images."""
  pp, cp = [], []
  for h in normed:
    u = h / jnp.linalg.norm(h, axis=-1, keepdims=True)
    gram = jnp.einsum("nid,njd->nij", u, u)
    t = gram.shape[-1] - 1
    patch = gram[:, 1:, 1:]
    off = jnp.sum(patch, axis=(1, 2)) - jnp.trace(patch, axis1=1, axis2=2)
    pp.append(jnp.mean(off / (t * (t - 1))))
    cp.append(jnp.mean(gram[:, 0, 1:]))
  return float(jnp.mean(jnp.stack(pp))), float(jnp.mean(jnp.stack(cp)))


def patch_labels(images: np.ndarray, labels: np.ndarray, p: int) -> np.ndarray:
  """Per-patch class: the image's on foreground patches, else background."""
  n, h, w, ch = images.shape
  means = images.reshape(n, h // p, p, w // p, p, ch).mean(axis=(2, 4, 5))
  fg = means.reshape(n, -1) > FOREGROUND
  background = int(labels.max()) + 1
  return np.where(fg, labels[:, None], background).astype(np.int32)


def miou(pred: np.ndarray, truth: np.ndarray, classes: int) -> float:
  """Mean intersection over union over the classes present in either."""
  ious = []
  for c in range(classes):
    inter = np.sum((pred == c) & (truth == c))
    union = np.sum((pred == c) | (truth == c))
    if union:
      ious.append(inter / union)
  return float(np.mean(ious))


def probe_metrics(model: nnx.Module, data: str, sizes) -> dict[str, float]:
  """Linear-probe mIoU on frozen patch tokens, and the two cosines."""
  fit_n, test_n, cos_n = sizes
  images = data_lib.load_images(data)
  p = model.config.patch_size
  # Check the written-out forward pass against the model's.
  x0 = jnp.asarray(images.val_x[:8])
  final, _ = tokens(model, x0)
  if not np.allclose(model.head(final[:, 0]), model(x0), atol=1e-4):
    raise RuntimeError("cls_norm_claims: tokens() differs from the ViT")

  def features(x):
    chunks = [jnp.asarray(x[i : i + 250]) for i in range(0, len(x), 250)]
    out = [tokens(model, chunk)[0] for chunk in chunks]
    f = jnp.concatenate(out)[:, 1:]
    return f.reshape(-1, f.shape[-1])

  fx = features(images.train_x[:fit_n])
  fy = patch_labels(images.train_x[:fit_n], images.train_y[:fit_n], p)
  tx_ = features(images.val_x[:test_n])
  ty = patch_labels(images.val_x[:test_n], images.val_y[:test_n], p)
  classes = images.num_classes + 1
  mean = fx.mean(0, keepdims=True)
  std = fx.std(0, keepdims=True) + 1e-6
  fx, tx_ = (fx - mean) / std, (tx_ - mean) / std
  fy_ = jnp.asarray(fy.reshape(-1))
  params = {"w": jnp.zeros((fx.shape[1], classes)), "b": jnp.zeros(classes)}
  opt = optax.adam(1e-2)

  def loss(q):
    logits = fx @ q["w"] + q["b"][None, :]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, fy_)
    return ce.mean() + 1e-4 * jnp.sum(q["w"] ** 2)

  @jax.jit
  def fit(q):
    def step(carry, _):
      q, s = carry
      g = jax.grad(loss)(q)
      u, s = opt.update(g, s, q)
      return (optax.apply_updates(q, u), s), None

    (q, _), _ = jax.lax.scan(step, (q, opt.init(q)), None, length=500)
    return q

  params = fit(params)
  logits = tx_ @ params["w"] + params["b"][None, :]
  pred = np.asarray(jnp.argmax(logits, -1))
  _, normed = tokens(model, jnp.asarray(images.val_x[:cos_n]))
  pp, cp = _cosines(normed)
  return {
    "probe_miou": miou(pred, ty.reshape(-1), classes),
    "cosine_patch_patch": pp,
    "cosine_cls_patch": cp,
    "foreground_fraction": float(np.mean(ty != classes - 1)),
  }


def probe_lines(
  table: pathlib.Path,
  base: config_lib.TrainConfig,
  variants: dict,
  lines: list[dict],
  sizes,
) -> list[dict]:
  """Each line with its probe metrics (cached in ``probes.jsonl``)."""
  return runs.probed(
    lines,
    table.parent / "probes.jsonl",
    lambda ln: probe_metrics(
      runs.trained_line(table, base, variants, ln), base.data, sizes
    ),
  )


def records(lines, base, variants) -> list[dict[str, Any]]:
  """The claims' records; the regime gates the dense claim."""
  cos_lines = [
    {"variant": name, "seed": ln["seed"], "cosine": ln[key]}
    for ln in lines
    if ln["variant"] == "layernorm"
    for name, key in (
      (PATCH_PATCH, "cosine_patch_patch"),
      (CLS_PATCH, "cosine_cls_patch"),
    )
  ]
  arm = grid.setting(lines, base, variants, "layernorm")
  regime = grid.claim_record(
    cos_lines,
    REGIME,
    baseline_trained=True,
    config={
      "base": config_lib.to_json(config_lib.resolve(base)),
      "a": variants["layernorm"],
      "b": variants["layernorm"],
    },
    setting={"a": arm, "b": arm},
  )
  present = regime["verdict"] == "reproduced"
  why = (
    None
    if present
    else "the LayerNorm ViT does not separate [CLS] from the patches here "
    f"({regime['why']})"
  )
  failed = salunet_claims.untrained(lines, "layernorm")
  trained = failed is None
  out = [regime]
  out.append(
    grid.runner_record(
      lines,
      CLAIMS[1],
      base,
      variants,
      baseline_trained=trained,
      testable=present,
      reason=why or failed,
    )
  )
  out.append(
    grid.runner_record(
      lines,
      CLAIMS[2],
      base,
      variants,
      baseline_trained=trained,
      reason=failed,
    )
  )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid and the probes (skipping finished ones); reports."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  tier = tiers.tier(args)
  base = vit_config(args)
  seeds = tiers.seeds(args)
  table = pathlib.Path(args.runs) / "grid.jsonl"
  # --quick checks the pipeline at the base rate.
  rates = {} if tier == "quick" else LEARNING_RATES

  def compute() -> dict:
    lines, tuned = grid.tuned_grid(table, base, VARIANTS, seeds, rates)
    variants = tuned["variants"]
    lines = probe_lines(table, base, variants, lines, PROBE[tier])
    return {
      "claims": records(lines, base, variants),
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "cells": {
        m: grid.cells(lines, m)
        for m in (
          "val_accuracy",
          "probe_miou",
          "cosine_patch_patch",
          "cosine_cls_patch",
        )
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "probe_miou",
      path,
      f"ViT width {base.width}, depth {base.depth} on {base.data}, "
      f"{base.steps} steps: [CLS]-specialized norms vs LayerNorm "
      f"({len(seeds)} seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    out = report.runner_lines(base, seeds)
    out += report.sweep_lines(result["sweeps"])
    labels = {
      "val_accuracy": "validation accuracy",
      "probe_miou": "patch-probe mIoU",
      "cosine_patch_patch": "patch-patch cosine (pre-attention norms)",
      "cosine_cls_patch": "[CLS]-patch cosine (pre-attention norms)",
    }
    for metric, label in labels.items():
      out += [f"## {label[0].upper()}{label[1:]}", ""]
      out += grid.markdown_table(result["cells"][metric], label, "layernorm")
      out += [""]
    fg = np.mean([ln["foreground_fraction"] for ln in result["lines"]])
    out += [f"Foreground patches in the probe's test set: {fg:.1%}.", ""]
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
