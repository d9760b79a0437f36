"""RMSNorm's variants in the 8-layer byte LM: SeeDNorm and scale vectors.

Claims (fixed before running; metric: validation loss in nats per byte,
lower is better):

* SeeDNorm (Cai, Zhu, Liu & Min, "SeeDNorm: Self-Rescaled Dynamic
  Normalization", arXiv:2510.22777): SeeDNorm lowers the loss of RMSNorm
  (``superior``, margin 0).
* Scale vectors (Wang et al., "Negligible in Size, Significant in Effect:
  On Scale Vectors in Large Language Models", arXiv:2605.26895): removing
  the norms' scale vectors raises the loss (RMSNorm ``superior`` to
  RMSNorm without scales, margin 0), and the paper's magnitude-direction
  reparameterization of the scales (`scalevectornorm`, ``reparam=True``)
  lowers it (``superior`` to RMSNorm, margin 0).

Every arm trains at its own learning rate (`experiments._harness.grid.
tuned_grid`: sweep on seed 0, chosen by the final training loss, inside
the grid), then 3 seeds paired by seed. The setting is
`experiments.norms_bytelm`'s model (8 layers of width 64, 16 x 64 bytes of
Shakespeare per step), where the norm-free stack is the regime check of
that script, trained `DEFAULT_STEPS` steps at the default tier where
`experiments.norms_bytelm` trains 600: at 600, with the sweeps starting
at 1e-3 then, the 3-seed runs took about 23 minutes alone on 2 cores
(estimated from a run re-timed alone), over the tier's 20; every arm
chose 1e-2, so the sweeps now start at 3e-3. Parameter counts differ by
the scale vectors only (RMSNorm without scales: 1,088 fewer of about
415k, 0.3%).

  python -m experiments.rmsnorm_variants [--quick | --full] [--seeds N]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from experiments import norms_bytelm
from experiments._harness import grid, study, tiers
from jaxnorm.training import claims

NAME = "rmsnorm_variants"

VARIANTS: dict[str, dict[str, Any]] = {
  "rmsnorm": {"norm": "rmsnorm"},
  "seednorm": {"norm": "seednorm"},
  "rmsnorm-no-scale": {
    "norm": "rmsnorm",
    "norm_kwargs": (("use_scale", False),),
  },
  # scalevectornorm's defaults are plain RMSNorm; the magnitude-direction
  # reparameterization is the switch under test.
  "scalevector-reparam": {
    "norm": "scalevectornorm",
    "norm_kwargs": (("reparam", True),),
  },
}
LEARNING_RATES = {name: (3e-3, 1e-2) for name in VARIANTS}
DEFAULT_STEPS = 400

_SCALE = (
  "Scale vectors",
  "2605.26895",
)
CLAIMS = (
  claims.Claim(
    paper="SeeDNorm",
    arxiv="2510.22777",
    claim="SeeDNorm lowers the loss of RMSNorm",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="seednorm",
    b="rmsnorm",
  ),
  claims.Claim(
    paper=_SCALE[0],
    arxiv=_SCALE[1],
    claim="removing the norms' scale vectors raises the loss",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="rmsnorm",
    b="rmsnorm-no-scale",
  ),
  claims.Claim(
    paper=_SCALE[0],
    arxiv=_SCALE[1],
    claim="the magnitude-direction reparameterization of the scale "
    "vectors lowers the loss",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="scalevector-reparam",
    b="rmsnorm",
  ),
)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = norms_bytelm.base_config(args, steps=DEFAULT_STEPS)
  return study.tuned(
    NAME,
    __doc__,
    args,
    base,
    VARIANTS,
    LEARNING_RATES,
    lambda lines, tuned: [
      grid.runner_record(lines, claim, base, tuned, baseline_trained=True)
      for claim in CLAIMS
    ],
    title=f"byte LM, {base.depth} layers of width {base.width}, "
    f"{base.steps} steps: RMSNorm's variants",
    baseline="rmsnorm",
  )


if __name__ == "__main__":
  main()
