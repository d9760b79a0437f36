"""Affine-Scaled Attention against softmax and sink attention in a byte LM.

Claims (each fixed before running; metric: validation loss in nats per
byte, lower is better; `jaxnorm.training.claims`, level 0.95):

* Affine-Scaled Attention (Bae et al., "Affine-Scaled Attention: Towards
  Flexible and Stable Transformer Attention", arXiv:2602.23057): the
  attention weights ``alpha P + beta`` (``alpha = phi(x W_a)`` per query
  and head, ``phi`` the paper's linear clipping, ``beta = (alpha_ma -
  alpha) / N`` with the running mean ``alpha_ma``, ``rho = 0.9``) give
  "consistent improvements ... compared to standard softmax attention and
  attention sink baselines": ``superior`` to softmax, and ``superior`` to
  the learned-sink attention (the gpt-oss form, arXiv:2508.10925), margin
  0 (the paired interval excludes no gain).

Fair comparison: every arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended
until the best rate lies inside the grid (`grid.tuned_grid`); then every
seed at that rate, paired by seed. Parameters: ``W_a`` adds ``width x
heads`` per layer (+0.5%), the sink one scalar per head and layer
(+0.01%): matched within 2% at the same width.

Regime: the runner's decoder LM (learned positions, pre-RMSNorm), 4 layers
of width 64, 4 heads, 500 steps of 16 x 64 bytes of Shakespeare; 3 seeds
(the setting of `experiments.attention_claims`, which trains its own
softmax and sink arms). The loss claims need no phenomenon in the
baseline; the baseline must train (below the unigram entropy).

Deviations: the paper pretrains 0.5-3B models by distillation for 20B
tokens (learning rate swept 5e-4 to 5e-3, warmup-stable-decay); here
cosine decay, 512K bytes, ``W_a`` with the default dense init and no bias
(the paper gives none), ``alpha_ma`` one value per layer and head.

  python -m experiments.affine_scaled_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from experiments import attention_claims
from experiments._harness import runs, study, tiers
from jaxnorm.training import claims

NAME = "affine_scaled_claims"
SOFTMAX, SINK, AFFINE = "softmax", "sink", "affine_scaled"
VARIANTS: dict[str, dict[str, Any]] = {
  SOFTMAX: {"attention": "softmax"},
  SINK: {"attention": "sink"},
  AFFINE: {"attention": "affine_scaled"},
}
# Centred on softmax's best at this size (1e-2 of 1e-3..3e-2, seed 0).
LEARNING_RATES = {name: (3e-3, 1e-2, 3e-2) for name in VARIANTS}

PAPER = ("Affine-Scaled Attention", "2602.23057")
CLAIMS = tuple(
  claims.Claim(
    paper=PAPER[0],
    arxiv=PAPER[1],
    claim=f"consistent improvements compared to {what}",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a=AFFINE,
    b=baseline,
  )
  for baseline, what in (
    (SOFTMAX, "standard softmax attention"),
    (SINK, "attention sink baselines"),
  )
)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = attention_claims.base_config(args)
  return study.tuned(
    NAME,
    __doc__,
    args,
    base,
    VARIANTS,
    LEARNING_RATES,
    lambda lines, tuned: runs.runner_records(
      lines,
      CLAIMS,
      base,
      tuned,
      runs.chance_loss(base),
      what="the unigram entropy",
    ),
    title=f"byte LM, {base.depth} layers of width {base.width}, "
    f"{base.steps} steps: Affine-Scaled Attention",
    baseline=SOFTMAX,
  )


if __name__ == "__main__":
  main()
