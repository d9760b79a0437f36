"""The ViT attention claims script's parts: matched arms, timing records.

No training: parameter counts on abstract models, the step-time claims on
hand-made timing lines.
"""

import argparse
import dataclasses
import math

import pytest

from experiments import vit_attention_claims as vc


def _args(**kw):
  return argparse.Namespace(
    **{"quick": False, "full": False, "seeds": None, **kw}
  )


def _params(base, change):
  return vc.count_params(dataclasses.replace(vc.runner_vit(base), **change))


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_nalaformer_is_judged_against_arms_of_its_parameter_count():
  base = vc.base_config(_args())
  arms = vc.variants(base)
  nala = _params(base, arms["nala"])
  for name in vc.WIDE:
    assert arms[name]["width"] == 68
    assert abs(_params(base, arms[name]) - nala) / nala < 0.02
  # The unwidened softmax is 10% smaller than NaLaFormer.
  assert _params(base, arms["softmax"]) < 0.92 * nala
  judged = {(c.a, c.b) for c in vc.CLAIMS}
  assert ("nala", "softmax-wide") in judged
  assert ("nala", "lina-wide") in judged
  assert ("soft", "softmax") in judged and ("lina", "softmax") in judged


def test_step_time_claims_pair_rounds_at_the_longest_length():
  lines = [
    {"variant": name, "round": r, "tokens": n, "ms": ms}
    for r in range(4)
    for n, scale in ((50, 1.0), (785, 20.0))
    for name, ms in (
      ("softmax", scale * (10 + r)),
      ("soft", scale * (4 + r) / 2),
      ("nala", scale * (5 + r) / 2),
      ("lina", scale * (3 + r) / 2),
    )
  ]
  pairs = vc.time_lines(lines)
  assert {ln["seed"] for ln in pairs} == {0, 1, 2, 3}
  assert len(pairs) == 16
  soft = {
    ln["seed"]: ln["log_step_ms"] for ln in pairs if ln["variant"] == "soft"
  }
  assert math.isclose(soft[1], math.log(20.0 * 5 / 2))
  cells = vc.timing_cells(lines)
  assert cells["tokens"] == [50, 785]
  assert math.isclose(cells["ratio_to_softmax"][785]["soft"]["values"][0], 0.2)
