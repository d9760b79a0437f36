"""The vision claims scripts' own parts: labels, metrics, pairings, names."""

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import cnn_attention_claims as cac
from experiments import psa_pixelwise_claims as pp
from experiments import snn_claims, ttn_claims, vision_claims
from jaxnorm.nn import models

# Builds real models: CI runs these with the experiments (-m slow).
pytestmark = pytest.mark.slow


def test_pixel_labels_give_the_foreground_its_class():
  x = np.zeros((2, 3, 3, 1), np.float32)
  x[0, 1, 1, 0] = 0.5
  x[1, 0, :, 0] = pp.FOREGROUND + 0.01
  labels = pp.pixel_labels(x, np.array([4, 9]))
  assert labels.dtype == np.int32
  np.testing.assert_array_equal(labels[0], [[0, 0, 0], [0, 5, 0], [0, 0, 0]])
  np.testing.assert_array_equal(labels[1], [[10, 10, 10], [0, 0, 0], [0, 0, 0]])


def test_miou_of_a_known_confusion():
  confusion = np.zeros((pp.NUM_CLASSES, pp.NUM_CLASSES), np.int64)
  confusion[0, 0], confusion[0, 1] = 6, 2  # Background: 6 right, 2 as 1.
  confusion[1, 1] = 2  # Class 1: 2 right; the other classes absent.
  # IoU_0 = 6 / 8, IoU_1 = 2 / 4.
  assert pp.miou(confusion) == pytest.approx((6 / 8 + 2 / 4) / 2)
  labels = np.array([[0, 0, 0, 3]])
  assert pp.trivial_miou(labels) == pytest.approx((3 / 4 + 0) / 2)


@pytest.mark.parametrize("side", [28, 8])
def test_segcnn_predicts_every_pixel(side):
  config = models.CNNConfig(
    num_classes=pp.NUM_CLASSES, width=32, depth=1, image_shape=(side, side, 1)
  )
  model = pp.SegCNN(cac.build_cnn("psa-p", config, 0))
  x = jax.random.uniform(jax.random.key(0), (2, side, side, 1))
  assert model(x).shape == (2, side, side, pp.NUM_CLASSES)
  images = np.asarray(x)
  labels = pp.pixel_labels(images, np.array([1, 2]))
  s = pp.scores(model, images, labels, batch=2)
  assert 0 <= s["val_miou"] <= 1 and 0 <= s["val_accuracy"] <= 1


def test_drops_pair_the_batch_sizes_by_variant_and_seed():
  small = [
    {"variant": "bn", "seed": 0, "val_accuracy": 0.5},
    {"variant": "bn", "seed": 1, "val_accuracy": 0.6},
    {"variant": "gn", "seed": 0, "val_accuracy": 0.7},
  ]
  large = [
    {"variant": "bn", "seed": 1, "val_accuracy": 0.9},
    {"variant": "gn", "seed": 0, "val_accuracy": 0.8},
  ]
  drops = vision_claims.drops(small, large)
  assert [(d["variant"], d["seed"]) for d in drops] == [("bn", 1), ("gn", 0)]
  assert [d["drop"] for d in drops] == pytest.approx([0.3, 0.1])


def test_snn_variant_names_round_trip():
  variants = snn_claims.variants_for(8, 32)
  assert set(variants) == {
    f"{k}-d{d}" for k in snn_claims.KINDS for d in (8, 32)
  }
  assert all(snn_claims.kind_of(n) in snn_claims.KINDS for n in variants)
  assert variants["relu-bn-d32"] == {
    "depth": 32,
    "activation": "relu",
    "norm": "batchnorm",
  }
  stats = np.array([[0.1, 1.2], [-0.3, 0.9]])
  assert snn_claims.drift(stats) == pytest.approx(0.4)


def test_deep_mlp_keeps_selu_near_its_fixed_point():
  mlp = snn_claims.DeepMLP(
    "selu",
    depth=16,
    width=256,
    in_features=64,
    num_classes=10,
    shift=0.0,
    scale=1.0,
    rngs=nnx.Rngs(0),
  )
  x = jax.random.normal(jax.random.key(1), (512, 8, 8, 1))
  stats = np.asarray(snn_claims._layer_stats(mlp, x))
  assert np.all(np.abs(stats[:, 0]) < 0.1)
  assert np.all(np.abs(np.log(stats[:, 1])) < np.log(1.5))


def test_sorted_stream_is_a_permutation_grouped_by_label():
  y = np.random.default_rng(0).integers(0, 5, 100)
  order = ttn_claims.stream_order(y, "sorted", 3)
  assert sorted(order) == list(range(100))
  assert np.all(np.diff(y[order]) >= 0)
  iid = ttn_claims.stream_order(y, "iid", 3)
  assert sorted(iid) == list(range(100)) and np.any(np.diff(y[iid]) < 0)
