"""The optimizer claims scripts' own measurements (not the whole pipelines)."""

import argparse
import dataclasses
import math

import pytest

from experiments import adamp_claims as ac
from experiments import optimizers_claims as oc


def test_steps_to_interpolates_the_crossing():
  curve = [(10, 3.0), (20, 2.0), (30, 1.0)]
  assert oc.steps_to(curve, 1.5, 40) == (25.0, True)
  assert oc.steps_to(curve, 2.0, 40) == (20.0, True)


def test_steps_to_the_first_evaluation_and_the_censored_run():
  curve = [(10, 3.0), (20, 2.0)]
  assert oc.steps_to(curve, 5.0, 30) == (10.0, True)
  assert oc.steps_to(curve, 1.0, 30) == (30.0, False)
  # A non-finite evaluation ends the curve: what follows does not count.
  assert oc.steps_to([(10, 3.0), (20, math.nan), (30, 0.5)], 1.0, 40) == (
    40.0,
    False,
  )


def test_a_diverged_run_has_no_validation_result():
  lines = [
    {"variant": "a", "seed": 0, "val_loss": 2.0, "stopped_early": True},
    {"variant": "a", "seed": 1, "val_loss": 2.5, "stopped_early": False},
  ]
  out = oc.diverged(lines)
  assert math.isnan(out[0]["val_loss"]) and out[1]["val_loss"] == 2.5
  assert lines[0]["val_loss"] == 2.0  # The input is not changed.


def test_trained_needs_every_seed_below_the_bar():
  lines = [
    {"variant": "a", "seed": 0, "val_loss": 2.0},
    {"variant": "a", "seed": 1, "val_loss": 3.5},
    {"variant": "b", "seed": 0, "val_loss": 2.0},
  ]
  assert not oc.trained(lines, "a", 3.0)
  assert oc.trained(lines, "b", 3.0)
  assert not oc.trained(lines, "c", 3.0)


def test_cnn_trained_needs_loss_and_accuracy_above_chance():
  chance = math.log(10)
  good = {"variant": "a", "seed": 0, "val_loss": 1.0, "val_accuracy": 0.6}
  bad = {"variant": "a", "seed": 1, "val_loss": 2.0, "val_accuracy": 0.09}
  assert ac.trained([good], "a", chance)
  assert not ac.trained([good, bad], "a", chance)


def test_the_claims_are_fixed_with_the_family_margins():
  assert {c.metric for c in oc.CLAIMS} == {
    "val_loss",
    "log_steps_to_target",
    "log_update_ms",
  }
  for c in oc.CLAIMS:
    assert c.margin == (
      oc.MARGIN if c.metric == "val_loss" else math.log(1.1)
    ), c
  for c in ac.NORM.values():
    assert (c.kind, c.direction, c.margin) == (
      "superior",
      "lower",
      math.log(1.1),
    )
  assert {(c.a, c.b) for c in ac.QUALITY} == {
    ("adamp", "adamw"),
    ("sgdp", "sgd"),
  }


@pytest.mark.slow
def test_initial_norm_is_the_norm_the_run_starts_from(tmp_path):
  # One step at the warm-up's first rate (0) leaves the weights unchanged,
  # so the final checkpoint holds the initialization `initial_norm` rebuilds.
  args = argparse.Namespace(quick=True, full=False, seeds=None)
  cfg = dataclasses.replace(
    ac.cnn_config(args),
    steps=1,
    eval_every=1,
    log_every=1,
    seed=3,
    out_dir=str(tmp_path / "run"),
    progress=False,
    resume=False,
  )
  from jaxnorm.training import trainer

  trainer.train(cfg)
  final = ac.weight_norm(
    ac.conv_feeding_bn(ac.final_state(tmp_path / "run")["params"])
  )
  assert final == pytest.approx(ac.initial_norm(cfg), rel=1e-6)
  other = ac.initial_norm(dataclasses.replace(cfg, seed=4))
  assert other != pytest.approx(final, rel=1e-3)


@pytest.mark.slow
def test_update_times_times_every_config():
  args = argparse.Namespace(quick=True, full=False, seeds=None)
  base = oc.base_config(args)
  times = oc.update_times(
    {n: dataclasses.replace(base, optimizer=n) for n in ("adamw", "rmnp")},
    warmup=2,
    rounds=2,
    calls=1,
  )
  assert set(times) == {"adamw", "rmnp"}
  assert all(t > 0 and math.isfinite(t) for t in times.values())
