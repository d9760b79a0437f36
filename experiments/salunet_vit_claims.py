"""SaluNet-T: SALU in place of LayerNorm in the ViT.

Claims (Zaied, "SaluNet: Enabling Total Plasticity in Normalization-Free
Deep Networks", arXiv:2606.02927), fixed before running; metric:
validation accuracy (higher is better):

* Regime (gates the claim): normalization matters in this ViT: LayerNorm
  is ``superior`` to the same network with its norms removed (margin 0).
  Where it is not, any replacement of LayerNorm "matches" it and the claim
  is ``not testable at this scale``.
* SaluNet-T against LayerNorm-GELU (CIFAR-10 90.92% -> 91.01%, CIFAR-100
  66.54% -> 68.10%: matches or exceeds): the ViT with SALU in place of
  every LayerNorm is ``non_inferior`` to the LayerNorm ViT, margin one
  point (`claims.MARGINS["accuracy_fraction"]`).

Setting: `experiments.cls_norm_claims`'s ViT (width 32, depth 4, 4 heads,
4x4 patches of Fashion-MNIST, AdamW, batch 64) for 300 steps; validation
accuracy on the first 2,048 test images. The SALU and norm-free arms are
the LayerNorm ViT with every norm (before attention, before the MLP, final)
replaced after construction (`experiments.salunet_claims.swap_norms`): by
`jaxnorm.nn.activations.SALU` (per-channel ``S = W = 1`` at init) or by the
identity; their config still names ``layernorm``, the slot replaced.
Parameters: SALU's two vectors per norm are as many as LayerNorm's scale
and bias; the norm-free arm has 576 fewer (1.1%).

Fair comparison: each arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended until
the best rate lies inside the grid (`experiments._harness.grid.
tuned_grid`); then 3 seeds, paired by seed. Deviations: GELU stays in the
MLPs (the paper's SWALU/GALU gates are unverified, abstract only); a 4-layer
ViT on Fashion-MNIST instead of SaluNet-T on CIFAR.

  python -m experiments.salunet_vit_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from experiments import cls_norm_claims, salunet_claims
from experiments._harness import grid, study, tiers
from jaxnorm.training import claims

NAME = "salunet_vit_claims"
VARIANTS: dict[str, dict[str, Any]] = {
  "layernorm": {"norm": "layernorm"},
  "none": {"norm": "layernorm"},
  "salu": {"norm": "layernorm"},
}
SWAPPED = {"none": "identity", "salu": "salu"}
LEARNING_RATES = {name: (1e-3, 3e-3, 1e-2) for name in VARIANTS}

_PAPER = ("SaluNet", "2606.02927")
CLAIMS = (
  claims.Claim(
    paper=_PAPER[0],
    arxiv=_PAPER[1],
    claim="normalization matters in this ViT: LayerNorm beats the same "
    "network without norms",
    metric="val_accuracy",
    direction="higher",
    kind="superior",
    margin=0.0,
    a="layernorm",
    b="none",
  ),
  claims.Claim(
    paper=_PAPER[0],
    arxiv=_PAPER[1],
    claim="SaluNet-T (SALU in place of LayerNorm) matches or exceeds the "
    "LayerNorm-GELU ViT",
    metric="val_accuracy",
    direction="higher",
    kind="non_inferior",
    margin=claims.MARGINS["accuracy_fraction"],
    a="salu",
    b="layernorm",
  ),
)


def base_config(args):
  """`cls_norm_claims.vit_config`, 300 steps in the default tier."""
  base = cls_norm_claims.vit_config(args)
  if tiers.tier(args) == "default":
    base = dataclasses.replace(
      base, steps=300, eval_every=100, log_every=100, warmup_steps=30
    )
  return base


def records(lines, base, variants) -> list[dict[str, Any]]:
  """The gate's record, then the claim it gates."""
  regime = grid.runner_record(
    lines, CLAIMS[0], base, variants, baseline_trained=True
  )
  present = regime["verdict"] == "reproduced"
  failed = salunet_claims.untrained(lines, "layernorm")
  trained = failed is None
  if not present:
    why = f"absent here: {CLAIMS[0].claim} is not shown ({regime['why']})"
  else:
    why = failed
  claim = grid.runner_record(
    lines,
    CLAIMS[1],
    base,
    variants,
    baseline_trained=trained,
    testable=present,
    reason=why,
  )
  return [regime, claim]


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  return study.tuned(
    NAME,
    __doc__,
    args,
    base,
    VARIANTS,
    LEARNING_RATES,
    lambda lines, tuned: records(lines, base, tuned),
    title=f"ViT width {base.width}, depth {base.depth} on {base.data}, "
    f"{base.steps} steps: SALU vs LayerNorm",
    baseline="layernorm",
    tables=(study.VAL_ACCURACY,),
    notes=[
      "`none` and `salu` are the LayerNorm ViT with its norms replaced "
      "(`experiments.salunet_claims.swap_norms`).",
      "",
    ],
    model=salunet_claims.model_factory(base, VARIANTS, SWAPPED),
  )


if __name__ == "__main__":
  main()
