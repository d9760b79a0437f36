"""The attention claims scripts' parts: arms, ablation grid, regime gates.

No training: the gates are checked on hand-made probe lines, the matched
width on abstract models.
"""

import argparse
import math

import pytest

from experiments import attention_claims as ac
from experiments import geometric_attention_claims as gac
from experiments import mxattention_claims as mxc
from jaxnorm.training import claims


def _args(**kw):
  return argparse.Namespace(
    **{"quick": False, "full": False, "seeds": None, **kw}
  )


def test_gated_arm_is_the_nearest_parameter_count():
  base = ac.base_config(_args())
  arms = ac.variants(base)
  assert arms[ac.GATED]["width"] == 60  # 64 is +7.5%, 60 is -4.9%.
  assert "width" not in arms[ac.SINK]
  softmax = ac.param_count(base)
  gated = ac.param_count(base.__class__(**{**base.__dict__, **arms[ac.GATED]}))
  assert abs(gated - softmax) / softmax < 0.05


def test_mxattention_ablates_every_combination():
  assert len(mxc.SETTINGS) == 8
  assert mxc.SETTINGS[mxc.OCP] == {
    "hadamard": None,
    "scale_rule": "ocp_floor",
    "p_quant": "direct",
  }
  assert mxc.SETTINGS[mxc.FULL] == {
    "hadamard": "random_sign",
    "scale_rule": "qmax",
    "p_quant": "pnq",
  }
  # Per source: full vs OCP, each part alone, each part left out.
  pairs = {(c.a, c.b) for c in mxc.CLAIMS}
  assert len(mxc.CLAIMS) == 14 and len(pairs) == 7
  for part in mxc.PARTS:
    assert (part, mxc.OCP) in pairs
    rest = mxc.setting_name([p for p in mxc.PARTS if p != part])
    assert (mxc.FULL, rest) in pairs


def test_geometric_sinkhorn_arm_per_tier():
  assert gac.variants(_args())[gac.SINKHORN]["attention_kwargs"] == (
    ("num_iters", 10),
  )
  assert gac.base_config(_args(full=True)).seq_len == 64


def _lines(mass: float, ratio: float, uniform: float):
  """Probe lines of three seeds; softmax at ``mass`` and ``ratio``."""
  out = []
  for seed in range(3):
    for variant, scale in ((ac.SOFTMAX, 1.0), (ac.SINK, 0.5), (ac.GATED, 0.6)):
      m = mass * scale * (1 + 0.01 * seed)
      top = 20.0 * scale * ratio / 16
      out.append(
        {
          "variant": variant,
          "run": variant,
          "seed": seed,
          "val_loss": 2.2 - 0.01 * seed - (0.05 if variant == ac.GATED else 0),
          "params": 1000,
          "steps": 10,
          "first_token_mass": m,
          "log_first_token_mass": math.log(m),
          "max_activation": top,
          "log_max_activation": math.log(top) + 0.01 * seed,
          "max_over_median": ratio * (1 + 0.01 * seed),
          "log_max_over_median": math.log(ratio * (1 + 0.01 * seed)),
        }
      )
  del uniform
  return out


@pytest.mark.parametrize(
  "mass_factor,ratio,sink,massive",
  [
    (0.5, 16.0, False, False),
    (5.0, 16.0, True, False),
    (0.5, 500.0, False, True),
  ],
)
def test_regimes_gate_the_outlier_claims(mass_factor, ratio, sink, massive):
  base = ac.base_config(_args())
  uniform = ac.uniform_mass(base.seq_len)
  tuned = {name: dict(v) for name, v in ac.ATTENTIONS.items()}
  recs = ac.records(_lines(mass_factor * uniform, ratio, uniform), base, tuned)
  claims.check_records(recs)
  assert len(recs) == len(ac.CLAIMS)
  by = {(r["paper"]["arxiv"], r["a"], r["metric"]): r for r in recs}
  assert (
    by["2309.17453", "softmax", "log_first_token_mass"]["verdict"]
    == "reproduced"
  ) is sink
  assert (
    by["2402.17762", "softmax", "log_max_over_median"]["verdict"]
    == "reproduced"
  ) is massive
  for arxiv, a in (("2508.10925", ac.SINK), ("2505.06708", ac.GATED)):
    assert by[arxiv, a, "log_first_token_mass"]["testable"] is sink
    assert by[arxiv, a, "log_max_activation"]["testable"] is massive
  # The loss claims need no outlier; the unified view's needs one.
  assert by["2508.10925", ac.SINK, "val_loss"]["testable"]
  assert by["2505.06708", ac.GATED, "val_loss"]["testable"]
  assert by["2601.22966", ac.GATED, "val_loss"]["testable"] is (sink or massive)
  if not sink:
    why = by["2505.06708", ac.GATED, "log_first_token_mass"]["why"]
    assert "no attention sink" in why and f"{uniform:.4f}" in why
