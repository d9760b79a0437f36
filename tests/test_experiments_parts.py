"""The experiment scripts' own model builders (not the whole pipelines)."""

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import cnn_attention_claims as cac
from experiments import regionnorm_claims as rc
from jaxnorm.nn import models

# Builds real models: CI runs these with the experiments (-m slow).
pytestmark = pytest.mark.slow


def _params(module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@pytest.fixture(scope="module")
def cnn_config():
  return models.CNNConfig(width=32, depth=2, image_shape=(8, 8, 1))


# Extra parameters at width 32: ELA-T/B are two 1-D depthwise convolutions
# and a GroupNorm each side; PSA-p/s are its 1x1 convolutions and LayerNorm.
@pytest.mark.parametrize(
  "variant,extra",
  [("ela-t", 448), ("ela-b", 576), ("psa-p", 4160), ("psa-s", 3608)],
)
def test_gated_cnn_keeps_the_baseline_weights(cnn_config, variant, extra):
  base = cac.build_cnn(cac.BASELINE, cnn_config, 0)
  gated = cac.build_cnn(variant, cnn_config, 0)
  for i in range(cnn_config.depth):
    np.testing.assert_array_equal(
      gated.net.blocks[i].branch.conv2.kernel[...],
      base.net.blocks[i].conv2.kernel[...],
    )
  assert _params(gated) - _params(base) == extra
  x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
  assert gated(x).shape == (2, 10)


def test_build_cnn_rejects_an_unknown_variant(cnn_config):
  with pytest.raises(ValueError, match="build_cnn: variant must be one of"):
    cac.build_cnn("se", cnn_config, 0)


def test_each_gate_gets_a_baseline_matched_within_two_percent():
  config = models.CNNConfig(width=32, depth=2, image_shape=(28, 28, 1))
  baselines = cac.matched(("ela-t", "psa-p"), config)
  # ELA-T adds 1.2%: the plain CNN; PSA-p adds 11%: the CNN widened to 34.
  assert baselines == {"ela-t": ("baseline", 32), "psa-p": ("baseline-w34", 34)}
  for gate, (name, width) in baselines.items():
    wide = models.CNNConfig(width=width, depth=2, image_shape=(28, 28, 1))
    plain = cac.param_count(name, wide)
    assert abs(cac.param_count(gate, config) - plain) <= 0.02 * plain
    assert plain == _params(cac.build_cnn(name, wide, 0))


def test_inpaintnet_rejects_an_unknown_variant():
  with pytest.raises(ValueError, match="InpaintNet: variant must be one of"):
    rc.InpaintNet("layernorm", width=4, blocks=0, rngs=nnx.Rngs(0))


def test_hole_masks_are_one_rectangle_in_the_range():
  m = rc.hole_masks(np.random.default_rng(0), 500, 28)[..., 0]
  fraction = m.mean((1, 2))
  assert fraction.min() > 0.08 and fraction.max() < 0.43
  for mi in m:  # One filled rectangle: its bounding box is all hole.
    r, c = np.nonzero(mi)
    assert (np.ptp(r) + 1) * (np.ptp(c) + 1) == mi.sum()


def test_scores_against_a_known_error():
  x = np.random.default_rng(1).random((3, 8, 8, 1))
  m = rc.hole_masks(np.random.default_rng(2), 3, 8)
  s = rc.scores(x + 0.1 * m, x, m)  # Error 0.1 in the holes only.
  np.testing.assert_allclose(s["l1_hole"], 0.1, rtol=1e-6)
  np.testing.assert_allclose(s["psnr_hole"], 20.0, rtol=1e-6)
  np.testing.assert_allclose(s["l1_image"], 0.1 * m.mean(), rtol=1e-6)
