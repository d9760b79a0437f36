"""The trained-LM helpers of the claims scripts (`experiments._lm`).

The trained models come back through `experiments._harness.runs.trained`.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import _lm, convert_prenorm, grpo, llm_int8, remove_layernorm
from experiments._harness import grid, runs
from jaxnorm.nn import convert, fakeln
from jaxnorm.training import config as config_lib

# Trains tiny runner LMs: CI runs these with the experiments (-m slow).
pytestmark = pytest.mark.slow

BASE = config_lib.TrainConfig(
  width=16,
  depth=1,
  num_heads=2,
  seq_len=16,
  batch_size=4,
  steps=4,
  eval_every=2,
  eval_batches=2,
  log_every=2,
  warmup_steps=1,
  checkpoint_every=10**9,
  norm="layernorm",
)


@pytest.fixture(scope="module")
def parents(tmp_path_factory):
  """A Pre-LN grid of two seeds and the modules the runner trained."""
  table = tmp_path_factory.mktemp("grid") / "grid.jsonl"
  built = {}

  def make(_, seed):
    built[seed] = _lm.pre_ln(BASE, seed)
    return built[seed]

  lines = grid.run_grid(table, BASE, {"pre-ln": {}}, (0, 1), model=make)
  return table, lines, built


def _leaves(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_trained_restores_the_model_the_run_trained(parents):
  table, lines, built = parents
  for line in lines:
    seed = line["seed"]
    model = runs.trained(
      table, BASE, {}, "pre-ln", seed, model=lambda s=seed: _lm.pre_ln(BASE, s)
    )
    for got, want in zip(_leaves(model), _leaves(built[seed]), strict=True):
      np.testing.assert_array_equal(got, want)
    # The evaluation is the runner's: same batches, same loss.
    loss, logits = _lm.evaluate(model, _lm.val_batches(BASE))
    np.testing.assert_allclose(loss, line["val_loss"], rtol=1e-6)
    assert len(logits) == BASE.eval_batches


def test_conversions_compute_the_parents_logits(parents):
  table, _, built = parents
  batches = _lm.val_batches(BASE)
  models = convert_prenorm.conversions(built[0])
  _, ref = _lm.evaluate(models["pre-ln"], batches)
  for name in ("pre-rmsnorm", "pre-crmsnorm"):
    _, got = _lm.evaluate(models[name], batches)
    np.testing.assert_allclose(
      np.concatenate(got), np.concatenate(ref), atol=1e-4
    )
  assert models["pre-crmsnorm"].config.width == BASE.width - 1


def test_outlier_injection_preserves_the_float32_loss(parents):
  _, _, built = parents
  batches = _lm.val_batches(BASE)
  lines = llm_int8.measure(built[1], batches, seed=1, width=BASE.width)
  by = {ln["variant"]: ln["val_loss"] for ln in lines}
  clean = by[llm_int8.arm("clean", "none")]
  outliers = by[llm_int8.arm("outliers", "none")]
  np.testing.assert_allclose(outliers, clean, rtol=1e-4)
  assert len(by) == 2 * len(llm_int8.MODES)


def test_calibration_runs_the_removal_schedule_without_updates(parents):
  _, _, built = parents
  model = convert.load_lm(built[0].config, convert.lm_params(built[0]))
  before = [np.asarray(x) for x in _leaves(model)]
  events = fakeln.install_fake_ln(model, start=1, gap=1)
  steps = events[("bos_off", None)] + 1
  remove_layernorm.calibrate(model, BASE, steps)
  for got, want in zip(_leaves(model), before, strict=True):
    np.testing.assert_array_equal(got, want)
  # Every norm is fake now: the LN-free export exists and matches.
  params, config = convert.remove_fake_ln(
    convert.lm_params(model), model.config
  )
  batches = _lm.val_batches(BASE)
  _, fake = _lm.evaluate(model, batches)
  _, free = _lm.evaluate(convert.load_lm(config, params), batches)
  np.testing.assert_allclose(
    np.concatenate(free), np.concatenate(fake), atol=1e-4
  )


def test_grpo_tune_extends_to_an_inside_best(monkeypatch):
  # A score peaked at 0.3: the grid (0.01, 0.03, 0.1) extends upward by
  # its last step (x 10/3) until the best rate is inside.
  monkeypatch.setattr(grpo, "_curves", lambda arm, seeds, lr, steps: (
    np.full((1, 2, 2), -abs(np.log(lr / 0.3)))
  ))  # fmt: skip
  sweep = grpo.tune("grpo", steps=1)
  assert sweep["learning_rate"] == pytest.approx(0.1**2 / 0.03)
  assert sweep["inside"]
  assert len(sweep["grid"]) == 5
