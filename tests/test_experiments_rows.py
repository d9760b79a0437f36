"""The helpers of the claims scripts for issue 27's missing rows.

NaP, [CLS] norm, Gecko, ELU, SaluNet, the gauge fix and the quantized side
of sub-8-bit L1: the pieces each script computes its metrics with, checked
on tiny inputs (the scripts end to end: tests/test_experiments_quick.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import (
  cls_norm_claims,
  elu_claims,
  gauge_claims,
  gecko_claims,
  nap_claims,
  salunet_claims,
  shiftquant_claims,
)
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import models


def test_patch_labels_and_miou():
  images = np.zeros((2, 4, 4, 1), np.float32)
  images[0, :2, :2] = 1.0  # image 0: top-left 2x2 patch is foreground
  labels = np.array([3, 5])
  got = cls_norm_claims.patch_labels(images, labels, 2)
  background = 6
  np.testing.assert_array_equal(
    got, [[3, background, background, background], [background] * 4]
  )
  assert cls_norm_claims.miou(got.reshape(-1), got.reshape(-1), 7) == 1.0
  pred = got.reshape(-1).copy()
  pred[0] = background  # the one class-3 patch missed
  # class 3: IoU 0; background: 7 of 8 predicted, all 7 true -> 7/8.
  assert cls_norm_claims.miou(pred, got.reshape(-1), 7) == pytest.approx(
    (0 + 7 / 8) / 2
  )


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["layernorm", "clsnorm"])
def test_vit_tokens_match_the_model(norm):
  config = models.ViTConfig(
    image_shape=(8, 8, 1),
    patch_size=2,
    width=8,
    depth=2,
    num_heads=2,
    norm=norm,
  )
  model = models.ViT(config, rngs=nnx.Rngs(0))
  x = jax.random.uniform(jax.random.key(0), (3, 8, 8, 1))
  final, normed = cls_norm_claims.tokens(model, x)
  np.testing.assert_allclose(model.head(final[:, 0]), model(x), atol=1e-5)
  assert len(normed) == config.depth and normed[0].shape == (3, 17, 8)


def test_cosines_of_identical_patches():
  h = jnp.concatenate(
    [jnp.array([[[1.0, 0.0]]]), jnp.tile(jnp.array([[[0.0, 2.0]]]), (1, 3, 1))],
    axis=1,
  )
  patch_patch, cls_patch = cls_norm_claims._cosines([h])
  assert patch_patch == pytest.approx(1.0)
  assert cls_patch == pytest.approx(0.0)


@pytest.mark.parametrize("kind", ["salu", "identity"])
def test_swap_norms_replaces_every_norm(kind):
  model = models.CNN(
    models.CNNConfig(norm="batchnorm", width=4, depth=2), rngs=nnx.Rngs(0)
  )
  salunet_claims.swap_norms(model, salunet_claims.replacement(kind))
  norms = [step.norm for step in model.net.steps] + [model.final_norm]
  want = nn_activations.SALU if kind == "salu" else salunet_claims.Identity
  assert all(isinstance(n, want) for n in norms)
  assert not nnx.state(model, nnx.BatchStat)
  assert model(jnp.ones((2, 28, 28, 1))).shape == (2, 10)


def test_gecko_groups_match():
  v = gecko_claims.variants(64)
  assert v["groupnorm"]["norm_kwargs"] == v["timestepdecaynorm"]["norm_kwargs"]
  assert dict(v["groupnorm"]["norm_kwargs"])["num_groups"] == 32


def test_elu_mlp_is_he_normal_without_dropout():
  class Args:
    quick, full, seeds = True, False, None

  base = elu_claims.mlp_config(Args())
  model = elu_claims.mlp_factory(base)("relu-mlp", 0)
  assert model.config.dropout == 0.0
  k = model.layers[1].kernel[...]
  # variance 2 / fan-in, up to sampling.
  assert float(jnp.var(k) * k.shape[0]) == pytest.approx(2.0, rel=0.5)


@pytest.mark.slow
def test_nap_keeps_the_hidden_kernels_norm():
  s = nap_claims.SETTINGS["quick"]
  # optax mixes Python floats and int32 counts (report.run does the same).
  with jax.numpy_dtype_promotion("standard"):
    nap = nap_claims.plasticity_run(s, "nap", 1e-2, 0)
    ln = nap_claims.plasticity_run(s, "layernorm", 1e-2, 0)
  norms = np.asarray(nap["kernel_norms"])
  np.testing.assert_allclose(norms, norms[0], rtol=1e-5)
  assert ln["kernel_norms"][-1] != pytest.approx(ln["kernel_norms"][0])
  assert len(nap["task_accuracies"]) == s.tasks


def test_gauge_agreement_is_gauge_invariant_after_the_fix():
  rng = np.random.default_rng(0)
  f = rng.normal(size=(256, 3)).astype(np.float32)
  g = rng.normal(size=(256, 3)).astype(np.float32) * np.array(
    [3.0, 2.0, 1.0], np.float32
  )
  a = rng.normal(size=(3, 3)).astype(np.float32)  # another gauge
  f2, g2 = f @ a.T, g @ np.linalg.inv(a)
  ft, _, _ = gauge_claims.analysis.dual_encoder_gauge_fix(f, g)
  ft2, _, _ = gauge_claims.analysis.dual_encoder_gauge_fix(f2, g2)
  assert gauge_claims._agreement(np.asarray(ft), np.asarray(ft2)) > 0.99
  assert gauge_claims._agreement(f, f2) < 0.99


def test_shiftquant_lines_pair_rounds():
  lines = shiftquant_claims.measure((8, 4), reps=1, rounds=2)
  assert [(ln["variant"], ln["seed"]) for ln in lines] == [
    (arm, r) for r in range(2) for arm in shiftquant_claims.ARMS
  ]
  assert all(ln["rows_per_sec"] > 0 for ln in lines)
