"""The one weight-decay policy (`jaxnorm.nn.decay.decay_mask`) and the IWD
mask (`weight_decay_mask`) in models that mix flax and jaxnorm layers.
Parametrized from `NORMS`: a new norm is checked by its spec's ``decay``."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm.nn import decay

D = 8

# The papers' exceptions to "matrices yes, vectors no", written out here
# independently of the specs: SeeDNorm decays alpha and beta (its paper);
# RN-L's convolutions are weight tensors.
PAPER_DECAYED = {
  "seednorm": {"dyn_scale", "dyn_proj"},
  "regionnorml": {"mask_kernel", "scale_kernel", "bias_kernel"},
}
NORM_KWARGS = {"scalevectornorm": {"num_branches": 2, "reparam": True}}


class Mixed(nnx.Module):
  """flax layers and norms around one jaxnorm norm."""

  def __init__(self, name, rngs):
    self.embed = nnx.Embed(10, D, rngs=rngs)
    self.flax_ln = nnx.LayerNorm(D, rngs=rngs)
    self.flax_ln2d = nnx.LayerNorm(
      D, reduction_axes=(-2, -1), feature_axes=(-2, -1), rngs=rngs
    )
    self.flax_rms = nnx.RMSNorm(D, rngs=rngs)
    self.flax_bn = nnx.BatchNorm(D, rngs=rngs)
    self.flax_gn = nnx.GroupNorm(D, num_groups=2, rngs=rngs)
    self.dense = nnx.Linear(D, D, rngs=rngs)
    self.dual = jnn.DualScaledLinear(D, D, dual=True, rngs=rngs)
    self.blocks = nnx.List(
      [jnn.make_norm(name, D, rngs=rngs, **NORM_KWARGS.get(name, {}))]
    )


def _flat(tree):
  return {
    tuple(str(k) for k in path): bool(nnx.as_pure(value))
    for path, value in nnx.to_flat_state(tree)
  }


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_decay_sets_per_registered_norm(name):
  model = Mixed(name, nnx.Rngs(0))
  mask = _flat(decay.decay_mask(model))
  decayed = {path for path, on in mask.items() if on}
  norm_decayed = {path[-1] for path in decayed if path[:2] == ("blocks", "0")}
  assert norm_decayed == PAPER_DECAYED.get(name, set())
  others = {path for path in decayed if path[0] != "blocks"}
  assert others == {
    ("embed", "embedding"),
    ("dense", "kernel"),
    ("dual", "kernel"),
  }
  assert set(mask) == {
    tuple(str(k) for k in p)
    for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))
  }


def test_mask_drives_optax_adamw():
  """Zero gradients: AdamW's update is ``-lr * wd * p`` on decayed leaves
  and exactly zero elsewhere, through `nnx.Optimizer` (init sees
  variables, update sees arrays)."""
  model = Mixed("seednorm", nnx.Rngs(0))
  lr, wd = 0.1, 0.5
  tx = optax.adamw(lr, weight_decay=wd, mask=decay.decay_mask(model))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  before = jax.tree.map(
    np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param))
  )
  zero = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
  with jax.numpy_dtype_promotion("standard"):
    optimizer.update(model, zero)
  after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  seed = model.blocks[0]
  np.testing.assert_allclose(
    seed.dyn_scale[...],
    (1 - lr * wd) * before["blocks"][0]["dyn_scale"],
    rtol=1e-6,
  )
  np.testing.assert_array_equal(seed.scale[...], before["blocks"][0]["scale"])
  np.testing.assert_array_equal(
    after["flax_ln"]["bias"], before["flax_ln"]["bias"]
  )
  np.testing.assert_allclose(
    after["dense"]["kernel"],
    (1 - lr * wd) * before["dense"]["kernel"],
    rtol=1e-6,
  )


def test_iwd_mask_treats_flax_norms_as_norms():
  """weight_decay_mask: flax norm biases are never decayed (they were
  decayed as "other" parameters); their scales follow the IWD roles."""
  model = Mixed("rmsnorm", nnx.Rngs(0))
  model.q_norm = nnx.LayerNorm(D, rngs=nnx.Rngs(0))
  mask = _flat(jnn.weight_decay_mask(model)(nnx.state(model, nnx.Param)))
  assert mask[("flax_ln", "scale")] and not mask[("flax_ln", "bias")]
  assert not mask[("flax_bn", "bias")] and not mask[("flax_gn", "bias")]
  assert not mask[("q_norm", "scale")] and not mask[("q_norm", "bias")]
  assert mask[("dense", "kernel")] and mask[("dual", "kernel")]
  assert mask[("blocks", "0", "scale")]


def test_registered_attention_and_residual_classes():
  """Every attention core and every class a residual spec lists in
  ``modules`` feeds its spec's overrides."""
  found = dict(decay._registered_classes())
  for spec in jnn.ATTENTIONS.values():
    assert found[spec.core] == spec.decay
  for spec in jnn.RESIDUALS.values():
    for cls in spec.modules:
      assert found[cls] == spec.decay
  assert found[jnn.HyperConnection] == {"static_alpha": False}
  assert found[jnn.ManifoldHyperConnection] == {"b_res": False}


class StreamNet(nnx.Module):
  """Two dense sublayers wrapped by a multi-stream residual scheme."""

  def __init__(self, name, rngs):
    blocks = [nnx.Linear(D, D, rngs=rngs) for _ in range(2)]
    self.net = jnn.make_residual(
      name, blocks, num_features=D, sublayers_per_layer=1, rngs=rngs
    )


# The exceptions of DepthBench (static routing is a bias of the stream
# mixing), written out independently of the specs, and every other matrix.
STREAM_DECAYED = {
  "hc": {"kernel", "dynamic_alpha"},
  "mhc": {"kernel", "phi_pre", "phi_post", "phi_res"},
  "ohc": {"kernel", "phi_pre", "phi_post", "phi_res"},
  "ihc": {"kernel", "phi_pre", "phi_post"},
}
STREAM_NOT_DECAYED = {"hc": "static_alpha", "mhc": "b_res"}


@pytest.mark.parametrize("name", sorted(STREAM_DECAYED))
def test_stream_residual_decay(name):
  model = StreamNet(name, nnx.Rngs(0))
  mask = _flat(decay.decay_mask(model))
  decayed = {path[-1] for path, on in mask.items() if on}
  assert decayed == STREAM_DECAYED[name]
  # One entry per step and sublayer; the routing matrix is 2-D yet kept.
  if name in STREAM_NOT_DECAYED:
    routing = STREAM_NOT_DECAYED[name]
    kept = [p for p, on in mask.items() if p[-1] == routing and not on]
    assert len(kept) == 2
    step = model.net.steps[0]
    assert getattr(step, routing)[...].ndim == 2


def test_residual_classes_share_one_rule():
  """Specs listing the same class must agree on its overrides."""
  seen = {}
  for name, spec in jnn.RESIDUALS.items():
    for cls in spec.modules:
      assert seen.setdefault(cls, (name, spec.decay))[1] == spec.decay, (
        f"{name} and {seen[cls][0]} give {cls.__name__} different decay"
      )
  assert set(seen) == {jnn.HyperConnection, jnn.ManifoldHyperConnection}
