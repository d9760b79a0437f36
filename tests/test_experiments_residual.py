"""The residual claims scripts' rules on synthetic lines (no training).

`experiments.residual_depth`, `experiments.residual_streams` and
`experiments.depthbench`: every claim is reproduced on favourable numbers
and not on reversed ones, each regime gate turns its claims into "not
testable", and the records pass `claims.check_records`.
"""

import dataclasses
import math

import numpy as np
import pytest

from experiments import depthbench as db
from experiments import residual_depth as rd
from experiments import residual_streams as rs
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

SEEDS = (0, 1, 2)
JITTER = (0.0, 1.0, -1.0)
UNIGRAM = 3.19
BASE = config_lib.TrainConfig(width=32, num_heads=2, seq_len=64, steps=10)


def _lines(values, scale=1e-3):
  """Three seeds per variant: ``{variant: {metric: value}}`` + jitter."""
  return [
    {
      "variant": name,
      "run": name,
      "seed": seed,
      "params": 1000,
      "steps": 10,
      **{k: v + scale * j for k, v in metrics.items()},
    }
    for name, metrics in values.items()
    for seed, j in zip(SEEDS, JITTER)
  ]


def _verdicts(recs):
  claims.check_records(recs)
  return {(r["a"], r["b"], r["metric"]): r["verdict"] for r in recs}


# ---------------------------------------------------------------------------
# residual_depth


def _depth_records(loss, growth):
  the_claims = rd.make_claims(16, 4)
  names = {c.a for c in the_claims.values()} | {
    c.b for c in the_claims.values()
  }
  variants = {
    n: {"residual": n.split("-")[0], "depth": int(n.split("L")[1])}
    for n in names
  }
  lines = _lines(
    {
      n: {"val_loss": loss(n), "log_rms_growth": growth(n)}
      for n in sorted(names)
    }
  )
  return rd.records(lines, BASE, variants, the_claims, UNIGRAM)


def _good_loss(name):
  return 2.5 if name.startswith(("prenorm", "skipinit")) else 2.4


def _good_growth(name):
  return {
    "prenorm-L16": math.log(16),
    "prenorm-L4": math.log(4),
    "lns-L16": math.log(4),
    "scaled-L16": 0.3,
    "scaled-L4": 0.3,
  }.get(name, 1.0)


def test_residual_depth_claims_follow_the_numbers():
  good = _depth_records(_good_loss, _good_growth)
  assert len(good) == 7
  assert all(r["verdict"] == "reproduced" for r in good), [
    r["why"] for r in good if r["verdict"] != "reproduced"
  ]
  bad = _depth_records(
    lambda n: 2.4 if n.startswith("prenorm") else 2.5,
    lambda n: {"prenorm-L4": math.log(16), "scaled-L16": 2.0}.get(n, 1.0),
  )
  assert not any(r["verdict"] == "reproduced" for r in bad)
  assert all("setting" in r and r["setting"]["a"]["params"] for r in good)


def test_residual_depth_gates_on_the_curse_of_depth():
  flat = _depth_records(
    _good_loss,
    lambda n: math.log(4) if n.startswith("prenorm") else _good_growth(n),
  )
  verdicts = {r["claim"]: r["verdict"] for r in flat}
  gated = [r for r in flat if not r["testable"]]
  assert {r["a"] for r in gated} == {"lns-L16", "scaled-L16"}
  assert len(gated) == 3
  assert all(r["verdict"] == claims.NOT_TESTABLE for r in gated)
  assert list(verdicts.values()).count("reproduced") == 3


def test_residual_depth_untrained_baseline_cannot_reproduce():
  recs = _depth_records(
    lambda n: 3.5 if n == "prenorm-L16" else 2.4, _good_growth
  )
  loss = [
    r for r in recs if r["b"] == "prenorm-L16" and r["metric"] == "val_loss"
  ]
  assert loss and all(not r["baseline_trained"] for r in loss)
  assert all(r["verdict"] != "reproduced" for r in loss)


# ---------------------------------------------------------------------------
# residual_streams


def test_gains_of_known_mixings():
  rotation = np.array([[0.0, -1.0], [1.0, 0.0]])
  g = rs.gains(rotation[None])
  assert g["amax"] == 1.0 and abs(g["log_distortion"]) < 1e-12
  doubly = np.full((1, 4, 4), 0.25)
  g = rs.gains(doubly)
  np.testing.assert_allclose([g["forward"], g["backward"]], [1.0, 1.0])
  assert g["sigma_min"] < 1e-12 and g["log_distortion"] > 10
  g = rs.gains(2 * np.eye(3)[None])
  np.testing.assert_allclose(
    [g["amax"], g["log_amax"], g["log_distortion"]],
    [2.0, math.log(2), math.log(2)],
  )
  curve = rs.composite_gains([2 * np.eye(2)[None]] * 4)
  assert [c["amax"] for c in curve["per_layer"]] == [4.0, 16.0]


def _stream_records(loss, log_amax, distortion):
  the_claims = rs.make_claims(8, 2)
  names = [rs.variant(s, 8) for s in rs.SCHEMES] + ["hc-L2"]
  variants = {
    n: {"residual": n.split("-")[0], "depth": int(n.split("L")[1])}
    for n in names
  }
  values = {}
  for n in names:
    v = {"val_loss": loss(n)}
    if not n.startswith("prenorm"):
      v.update(
        log_amax=log_amax(n),
        log_distortion=distortion(n),
        log_distortion_init=0.0,
      )
    values[n] = v
  lines = _lines(values)
  mlp = {n: 100 + i for i, n in enumerate(names)}
  recs = rs.records(lines, BASE, variants, mlp, the_claims, UNIGRAM)
  assert all("mlp_hidden" in r["setting"]["a"] for r in recs)
  return recs


def test_residual_streams_claims_follow_the_numbers():
  good = _stream_records(
    lambda n: {"ohc-L8": 2.4, "prenorm-L8": 2.6}.get(n, 2.5),
    lambda n: {"hc-L8": 2.0, "hc-L2": 0.5}.get(n, 0.01),
    lambda n: {"ohc-L8": 0.0, "mhc-L8": 0.3}.get(n, 0.5),
  )
  assert len(good) == 9
  assert all(r["verdict"] == "reproduced" for r in good), [
    r["why"] for r in good if r["verdict"] != "reproduced"
  ]
  iso = next(r for r in good if r["b"] == "ohc-L8 at init")
  assert iso["setting"]["b"]["steps"] == 0
  bad = _stream_records(
    lambda n: 2.6 if n.startswith("ohc") else 2.5,
    lambda n: {"hc-L8": 0.5, "hc-L2": 2.0, "mhc-L8": 2.0}.get(n, 0.01),
    lambda n: 0.5,
  )
  assert not any(r["verdict"] == "reproduced" for r in bad)


def test_residual_streams_gate_mhc_on_hc_growth():
  recs = _stream_records(
    lambda n: 2.5,
    lambda n: {"hc-L8": 0.5, "hc-L2": 0.5}.get(n, 0.01),
    lambda n: 0.0,
  )
  (gated,) = [r for r in recs if not r["testable"]]
  assert (gated["a"], gated["b"]) == ("mhc-L8", "hc-L8")


def test_mlp_widths_match_the_reference_count():
  base = config_lib.TrainConfig(width=16, num_heads=2, seq_len=16)
  widths = rs.mlp_widths(base, 2)
  assert widths["ohc"] == 64 and widths["mhc"] < 64 < widths["prenorm"]
  counts = {
    s: rs.count(dataclasses.replace(base, residual=s, depth=2), h)
    for s, h in widths.items()
  }
  assert all(
    abs(c / counts["ohc"] - 1) <= rs.PARAM_TOLERANCE for c in counts.values()
  )


# ---------------------------------------------------------------------------
# depthbench


def _bench_records(losses, schemes=db.DEFAULT_SCHEMES):
  shapes = db.SHAPES["default"]
  the_claims = db.make_claims(schemes, "shallow", "deep")
  variants = {
    db.cell(s, shape): {"residual": s, "depth": shape[0], "width": shape[1]}
    for s in schemes
    for shape in shapes
  }
  lines = _lines(
    {
      db.cell(s, shape): {"val_loss": losses[s][i]}
      for s in schemes
      for i, shape in enumerate(shapes)
    },
    scale=2e-3,
  )
  return db.records(lines, BASE, variants, the_claims, schemes, shapes, UNIGRAM)


def test_depthbench_benefit_is_per_seed():
  shapes = ((2, 96), (8, 48))
  lines = [
    {"variant": "hc-L2d96", "seed": 0, "val_loss": 2.5},
    {"variant": "hc-L2d96", "seed": 1, "val_loss": 2.6},
    {"variant": "hc-L8d48", "seed": 1, "val_loss": 2.4},
    {"variant": "hc-L8d48", "seed": 0, "val_loss": 2.45},
  ]
  derived = db.benefit_lines(lines, ["hc"], shapes)
  benefit = {
    ln["seed"]: ln["depth_benefit"] for ln in derived if ln["variant"] == "hc"
  }
  np.testing.assert_allclose([benefit[0], benefit[1]], [0.05, 0.2])
  assert {ln["variant"] for ln in derived} == {"hc", "hc@shallow", "hc@deep"}


def test_depthbench_relative_claims_follow_the_numbers():
  good = _bench_records(
    {"prenorm": (2.40, 2.44), "hc": (2.40, 2.35), "attnres": (2.40, 2.36)}
  )
  assert [r["metric"] for r in good] == [
    "val_loss",
    "depth_benefit",
    "depth_benefit",
    "val_loss",
  ]
  assert all(r["verdict"] == "reproduced" for r in good), [
    r["why"] for r in good
  ]
  rel = good[1]
  assert rel["a"] == "hc" and rel["b"] == "prenorm"
  np.testing.assert_allclose(rel["mean_diff"], 0.09, atol=1e-9)
  assert len(rel["setting"]["a"]["cells"]) == 2
  # Every scheme loses the same with depth: no relative benefit.
  bad = _bench_records(
    {"prenorm": (2.40, 2.44), "hc": (2.40, 2.44), "attnres": (2.40, 2.45)}
  )
  assert not any(r["verdict"] == "reproduced" for r in bad[1:])


def test_depthbench_gates_on_pre_ln_using_depth():
  recs = _bench_records(
    {"prenorm": (2.50, 2.40), "hc": (2.50, 2.30), "attnres": (2.50, 2.30)}
  )
  assert recs[0]["verdict"] == "contradicted"
  assert [r["verdict"] for r in recs[1:3]] == [claims.NOT_TESTABLE] * 2
  assert recs[3]["testable"]  # AttnRes against Pre-LN at equal shapes.


def test_depthbench_full_claims_note_the_depth_multiplier():
  the_claims = db.make_claims(db.FULL_SCHEMES, "s", "d")
  assert {"depth_mup_flat", "completep_flat", "keel_flat"} <= set(the_claims)
  note = db._m_note("depth_mup", db.SHAPES["full"])
  assert "m = L/24 = 16/24, 32/24" in note
  assert db._m_note("prenorm", db.SHAPES["full"]) is None


@pytest.mark.parametrize("tier", ["quick", "default", "full"])
def test_depthbench_shapes_have_equal_backbones(tier):
  (ls, ds), (ld, dd) = db.SHAPES[tier]
  assert abs(ls * ds**2 / (ld * dd**2) - 1) < 0.02 and ls < ld
