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


@pytest.mark.parametrize("quick", [True, False])
def test_conda_refreshes_its_basis_as_often_as_the_recipe(quick):
  # The LLaMA-60M recipe: update_proj_gap 2000 of 10000 steps.
  base = oc.base_config(argparse.Namespace(quick=quick, full=False, seeds=None))
  arms = oc.variants(base)
  assert {n: a["optimizer"] for n, a in arms.items()} == {
    n: n for n in oc.OPTIMIZERS
  }
  gap = dict(arms["conda"]["optimizer_kwargs"])["update_proj_gap"]
  assert base.steps / gap == pytest.approx(10000 / 2000, rel=0.2)
  assert all("optimizer_kwargs" not in arms[n] for n in ("adamw", "rmnp"))


def test_a_diverged_run_has_no_validation_result():
  lines = [
    {"variant": "a", "seed": 0, "val_loss": 2.0, "stopped_early": True},
    {"variant": "a", "seed": 1, "val_loss": 2.5, "stopped_early": False},
  ]
  out = oc.diverged(lines)
  assert math.isnan(out[0]["val_loss"]) and out[1]["val_loss"] == 2.5
  assert lines[0]["val_loss"] == 2.0  # The input is not changed.


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


def test_adamp_baseline_at_chance_accuracy_did_not_train():
  base = ac.cnn_config(argparse.Namespace(quick=True, full=False, seeds=None))
  tuned = dict(ac.VARIANTS)
  acc = {"adamw": 0.6, "adamp": 0.6, "sgd": 0.09, "sgdp": 0.6}
  lines = [
    {
      "variant": v,
      "seed": s,
      "val_loss": 1.0 + 0.01 * s,
      "val_accuracy": acc[v] + 0.001 * s,
      "log_weight_norm": 1.0 + 0.01 * s,
      "log_norm_growth": 0.5 + 0.01 * s,
      "params": 100,
      "steps": 4,
    }
    for v in tuned
    for s in range(3)
  ] + [
    {"variant": ac.INIT, "seed": s, "log_weight_norm": 0.0} for s in range(3)
  ]
  recs = ac.records(lines, base, tuned, math.log(10))
  sgd = [r for r in recs if r["b"] == "sgd"]
  adamw = [r for r in recs if r["b"] == "adamw"]
  assert len(sgd) == 3 and len(adamw) == 3
  # SGD's loss beats chance but its accuracy does not.
  assert all(
    not r["baseline_trained"] and "val_accuracy" in r["why"] for r in sgd
  )
  assert all(r["baseline_trained"] for r in adamw)
