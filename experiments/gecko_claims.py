"""Gecko's timestep-decay normalization against the same norm per token.

Claim (Ma et al., "Gecko: An Efficient Neural Architecture Inherently
Processing Sequences with Arbitrary Lengths", arXiv:2601.06463), fixed
before running; metric: validation loss in nats per byte, lower is better:

* Gecko "introduces multiple technical components to improve its
  capability to capture long range dependencies, including timestep decay
  normalization": normalizing each token with causal, exponentially
  decayed group statistics accumulated over the preceding tokens
  (`jaxnorm.nn.norms.TimestepDecayNorm`, the official
  ``XuezheMax/gecko-llm`` kernel's maths: beta1 0.999, beta2 0.9999, bias
  correction, gain ``1 + w``) lowers the loss against the same group norm
  computed per token (GroupNorm on each token, the same 32 groups and the
  same affine): ``superior``, margin 0. The arms differ only in where the
  statistics come from, which isolates the component.

Fair comparison: each arm trains at its own learning rate, the best of a
geometric sweep on seed 0 chosen by the final training loss, extended until
the best rate lies inside the grid (`experiments._harness.grid.
tuned_grid`); then 3 seeds at that rate, paired by seed. Parameter counts
are equal (415,872: one gain and one offset vector per norm in both arms).

Setting: `experiments.norms_bytelm`'s byte LM (8 layers of width 64, 600
steps of 16 x 64 bytes of Shakespeare), where that script's regime claim
checks that normalization matters; every norm of the stack (before
attention, before the MLP, final) is the arm's norm. Regime and
deviations: Gecko uses the norm as the input norm of its moving-average
gated attention and as the final norm of a 7B model trained on 2T tokens,
here it replaces every norm of a softmax transformer. With 64-byte windows
the decay is nearly inactive (``0.999^63 = 0.94``: the statistics are
close to cumulative means over the window, Megalodon's timestep norm with
bias correction); the decay acts on windows longer than ``1 / (1 -
beta1) = 1000`` tokens, which the ``--full`` tier trains (2,048-byte
windows on one accelerator).

  python -m experiments.gecko_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from experiments import norms_bytelm
from experiments._harness import grid, study, tiers
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

NAME = "gecko_claims"
ARMS = ("groupnorm", "timestepdecaynorm")
LEARNING_RATES = {name: (1e-3, 3e-3, 1e-2) for name in ARMS}


def variants(width: int) -> dict[str, dict[str, Any]]:
  """Both norms with the same groups: the timestep-decay norm's count.

  The registry's for the timestep-decay norm is ``gcd(width, 64)`` groups,
  halved when a group would be one channel (one channel has variance 0 on
  a token): 32 groups of 2 at width 64.
  """
  groups = math.gcd(width, 64)
  groups = width // 2 if groups == width else groups
  kwargs = (("num_groups", groups),)
  return {arm: {"norm": arm, "norm_kwargs": kwargs} for arm in ARMS}


CLAIMS = (
  claims.Claim(
    paper="Gecko",
    arxiv="2601.06463",
    claim="timestep decay normalization improves the model's capability "
    "to capture long range dependencies: lower loss than the same group "
    "norm computed per token",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="timestepdecaynorm",
    b="groupnorm",
  ),
)


def base_config(args) -> config_lib.TrainConfig:
  """`norms_bytelm`'s LM; ``--full`` with windows past the decay's scale."""
  base = norms_bytelm.base_config(args)
  if tiers.tier(args) == "full":
    base = dataclasses.replace(base, seq_len=2048, batch_size=8)
  return base


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  return study.tuned(
    NAME,
    __doc__,
    args,
    base,
    variants(base.width),
    LEARNING_RATES,
    lambda lines, tuned: [
      grid.runner_record(lines, claim, base, tuned, baseline_trained=True)
      for claim in CLAIMS
    ],
    title=f"byte LM, {base.depth} layers of width {base.width}, "
    f"{base.seq_len}-byte windows, {base.steps} steps: timestep-decay "
    "norm vs per-token GroupNorm",
    baseline="groupnorm",
  )


if __name__ == "__main__":
  main()
