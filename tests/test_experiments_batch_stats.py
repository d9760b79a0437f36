"""PowerNorm's and Unified Norm's claims scripts: causality, gate, fold.

No training: causality on a toy LM built as the runner builds each arm,
the regime gate on hand-made grid lines, the fold on a small layer.
"""

import argparse
import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from experiments import powernorm_claims as pc
from experiments import unifiednorm_claims as uc
from jaxnorm.nn import models
from jaxnorm.training import build, claims


def _args(**kw):
  return argparse.Namespace(
    **{"quick": False, "full": False, "seeds": None, **kw}
  )


def _early_logits_move(base, changes):
  """Largest change of positions < 10 when tokens 10.. change (train mode)."""
  cfg = dataclasses.replace(base, **changes)
  lm = build.model_config(cfg, {"vocab_size": 64, "max_len": cfg.seq_len})
  model = models.DecoderLM(lm, rngs=nnx.Rngs(0))
  x = jax.random.randint(jax.random.key(1), (4, cfg.seq_len), 0, 64)
  y = x.at[:, 10:].set((x[:, 10:] + 7) % 64)
  a, b = nnx.clone(model)(x), nnx.clone(model)(y)
  return float(jnp.max(jnp.abs(a[:, :10] - b[:, :10])))


@pytest.mark.slow  # Builds and runs models: with the experiments.
def test_powernorm_arm_is_causal_in_training_and_batchnorm_is_not():
  base = pc.base_config(_args(quick=True))
  arms = pc.variants(base)
  assert dict(arms["powernorm"]["norm_kwargs"]) == {
    "warmup_iters": 0,
    "num_groups": base.num_heads,
  }
  assert _early_logits_move(base, arms["powernorm"]) == 0.0
  assert _early_logits_move(base, arms["layernorm"]) == 0.0
  # The stated deviations: BatchNorm and UN see later tokens in training.
  assert _early_logits_move(base, arms["batchnorm"]) > 1e-3
  un = uc.variants(base)["unifiednorm"]
  assert _early_logits_move(base, un) > 1e-3


def _lines(values):
  return [
    {"variant": v, "seed": s, "val_loss": x, "params": 1, "steps": 600}
    for v, xs in values.items()
    for s, x in enumerate(xs)
  ]


@pytest.mark.parametrize("hurts", [True, False])
def test_batchnorm_regime_gates_powernorm_vs_batchnorm(hurts):
  base = pc.base_config(_args())
  arms = pc.variants(base)
  bn = [2.30, 2.31, 2.32] if hurts else [2.10, 2.11, 2.09]
  lines = _lines(
    {
      "layernorm": [2.12, 2.13, 2.11],
      "batchnorm": bn,
      "powernorm": [2.11, 2.115, 2.105],
    }
  )
  recs = pc.records(lines, base, arms)
  verdict = {(r["a"], r["b"]): r["verdict"] for r in recs}
  assert verdict["layernorm", "batchnorm"] == (
    "reproduced" if hurts else "contradicted"
  )
  gated = verdict["powernorm", "batchnorm"]
  assert (gated == claims.NOT_TESTABLE) is not hurts
  assert verdict["powernorm", "layernorm"] == "reproduced"
  assert all(r["baseline_trained"] for r in recs)


def test_a_baseline_above_the_unigram_entropy_did_not_train():
  base = pc.base_config(_args())
  lines = _lines(
    {
      "layernorm": [2.1, 2.1, 2.1],
      "batchnorm": [9.0, 9.1, 9.2],
      "powernorm": [2.0, 2.0, 2.0],
    }
  )
  recs = pc.records(lines, base, pc.variants(base))
  by_b = {}
  for r in recs:
    by_b.setdefault(r["b"], []).append(r)
  assert all(
    not r["baseline_trained"] and "unigram entropy" in r["why"]
    for r in by_b["batchnorm"]
  )
  assert all(r["baseline_trained"] for r in by_b["layernorm"])


def test_fold_reproduces_un_and_times_every_form():
  out = uc.folding((2, 3, 8), rounds=2, reps=1)
  assert out["max_abs_error"] <= 1e-5 * max(1.0, out["output_scale"])
  assert set(out["ms"]) == set(uc.FORMS)
  lines = uc.timing_lines([out])
  assert {(ln["variant"], ln["seed"]) for ln in lines} == {
    (f, r) for f in uc.FORMS for r in range(2)
  }
  assert all(math.isfinite(ln["log_ms_w8"]) for ln in lines)
  assert uc.fold_claim(8).metric == "log_ms_w8"
