"""``mask=`` on the nnx norms, against flax's modules with the same mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from tests import helpers

D = 8


def _params(module, key):
  """Random scale and bias (so the affine tail is exercised)."""
  ks, kb = jax.random.split(key)
  if getattr(module, "scale", None) is not None:
    module.scale[...] = 1 + 0.3 * jax.random.normal(ks, (D,))
  if getattr(module, "bias", None) is not None:
    module.bias[...] = 0.3 * jax.random.normal(kb, (D,))
  return module


def _pair(ours, theirs, key):
  _params(theirs, key)
  nnx.update(ours, nnx.state(theirs, nnx.Param))
  return ours, theirs


@pytest.fixture(scope="module")
def data():
  kx, km, kp = jax.random.split(jax.random.key(0), 3)
  x = 2 + 3 * jax.random.normal(kx, (2, 4, 6, D))
  mask = jax.random.bernoulli(km, 0.6, x.shape)
  return x, mask, kp


def _cases():
  return {
    "layernorm": (
      lambda: jnn.LayerNorm(D, rngs=nnx.Rngs(0)),
      lambda: nnx.LayerNorm(D, use_fast_variance=False, rngs=nnx.Rngs(0)),
    ),
    "rmsnorm": (
      lambda: jnn.RMSNorm(D, rngs=nnx.Rngs(0)),
      lambda: nnx.RMSNorm(D, use_fast_variance=False, rngs=nnx.Rngs(0)),
    ),
    "groupnorm": (
      lambda: jnn.GroupNorm(D, num_groups=4, rngs=nnx.Rngs(0)),
      lambda: nnx.GroupNorm(
        D, num_groups=4, use_fast_variance=False, rngs=nnx.Rngs(0)
      ),
    ),
  }


@pytest.mark.parametrize("name", sorted(_cases()))
@pytest.mark.parametrize("form", ["elements", "positions"])
def test_matches_flax_with_a_mask(name, form, data):
  x, mask, key = data
  if form == "positions":
    # flax's GroupNorm splits the mask's last axis into groups: give it all.
    ours_mask = mask[..., 0]
    flax_mask = jnp.broadcast_to(mask[..., :1], x.shape)
  else:
    ours_mask = flax_mask = mask
  make_ours, make_flax = _cases()[name]
  ours, theirs = _pair(make_ours(), make_flax(), key)
  # GroupNorm takes a mask but is not a graph norm (`nn.graph` reads the
  # flag as one), so its spec leaves takes_mask off.
  assert jnn.NORMS[name].takes_mask == (name != "groupnorm")
  y = jax.jit(lambda x, m: ours(x, mask=m))(x, ours_mask)
  ref = np.asarray(theirs(x, mask=flax_mask))
  # flax gives NaN where a statistic has no valid element; jaxnorm is finite.
  assert np.isfinite(np.asarray(y)).all()
  seen = np.isfinite(ref)
  assert seen.mean() > 0.5
  helpers.assert_close(y[seen], ref[seen], atol=2e-5, rtol=2e-5)
  # The mask matters: the unmasked output differs.
  assert not np.allclose(y, ours(x), atol=1e-3)


def test_masked_layer_norm_oracle(data):
  """NumPy float64 transcription over the valid elements of each row."""
  x, mask, _ = data
  module = jnn.LayerNorm(D, use_scale=False, use_bias=False, rngs=nnx.Rngs(0))
  xn, mn = np.asarray(x, np.float64), np.asarray(mask)
  count = np.maximum(mn.sum(-1, keepdims=True), 1)
  mean = (xn * mn).sum(-1, keepdims=True) / count
  var = (np.square(xn - mean) * mn).sum(-1, keepdims=True) / count
  helpers.assert_close(
    module(x, mask=mask), (xn - mean) / np.sqrt(var + 1e-6), atol=1e-4
  )


def test_rmsnorm_mask_is_positional_as_in_flax(data):
  x, mask, _ = data
  module = jnn.RMSNorm(D, rngs=nnx.Rngs(0))
  helpers.assert_close(module(x, mask), module(x, mask=mask), atol=0)


def test_row_without_valid_elements_is_finite():
  """Deviation from flax (NaN): the count is clamped at 1."""
  x = jnp.arange(2 * D, dtype=jnp.float32).reshape(2, D)
  mask = jnp.array([True, False])
  for module in (
    jnn.LayerNorm(D, rngs=nnx.Rngs(0)),
    jnn.RMSNorm(D, rngs=nnx.Rngs(0)),
  ):
    y = module(x, mask=mask)
    assert np.isfinite(np.asarray(y)).all()
    helpers.assert_close(y[0], module(x[:1])[0], atol=1e-6)


class TestBatchNorm:
  def test_matches_flax_and_updates_from_valid_elements(self, data):
    x, mask, key = data
    nodes = mask[..., 0]  # (2, 4, 6) valid positions
    ours, theirs = _pair(
      jnn.BatchNorm(D, rngs=nnx.Rngs(0)),
      nnx.BatchNorm(D, use_fast_variance=False, rngs=nnx.Rngs(0)),
      key,
    )
    y = ours(x, mask=nodes)
    helpers.assert_close(
      y, theirs(x, mask=nodes[..., None]), atol=2e-5, rtol=2e-5
    )
    for stat in ("mean", "var"):
      helpers.assert_close(
        getattr(ours, stat)[...], getattr(theirs, stat)[...], atol=1e-6
      )
    valid = np.asarray(x, np.float64)[np.asarray(nodes)]
    helpers.assert_close(
      ours.mean[...], 0.01 * valid.mean(0), atol=1e-6, rtol=1e-5
    )
    helpers.assert_close(
      ours.var[...], 0.99 + 0.01 * valid.var(0), atol=1e-6, rtol=1e-5
    )
    # Same result with flax's mask shape (last dimension 1).
    again = _pair(jnn.BatchNorm(D, rngs=nnx.Rngs(0)), theirs, key)[0]
    helpers.assert_close(again(x, mask=nodes[..., None]), y, atol=0)

  def test_padding_does_not_move_the_statistics(self, data):
    x, mask, _ = data
    nodes = mask[..., 0]
    padded = jnp.where(nodes[..., None], x, 1e3)
    a, b = (
      jnn.BatchNorm(D, rngs=nnx.Rngs(0)),
      jnn.BatchNorm(D, rngs=nnx.Rngs(0)),
    )
    a(x, mask=nodes)
    b(padded, mask=nodes)
    helpers.assert_close(a.mean[...], b.mean[...], atol=1e-6)
    helpers.assert_close(a.var[...], b.var[...], atol=1e-6)
    # No valid element: the running statistics stay; inference ignores it.
    before = a.mean[...]
    a(x, mask=jnp.zeros_like(nodes))
    np.testing.assert_array_equal(a.mean[...], before)
    a.eval()
    helpers.assert_close(a(x, mask=nodes), a(x), atol=0)

  def test_per_feature_mask_is_refused(self, data):
    x, mask, _ = data
    with pytest.raises(
      ValueError, match=r"BatchNorm: mask must be the same for every feature"
    ):
      jnn.BatchNorm(D, rngs=nnx.Rngs(0))(x, mask=mask)


def test_mask_errors(data):
  x, mask, _ = data
  module = jnn.LayerNorm(D, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=r"LayerNorm: mask must be boolean"):
    module(x, mask=mask.astype(jnp.float32))
  with pytest.raises(
    ValueError,
    match=r"LayerNorm: mask must have shape x.shape\[:-1\]=\(2, 4, 6\) "
    r"\(positions\) or broadcast to x.shape=\(2, 4, 6, 8\) \(flax\), got "
    r"mask.shape=\(3, 8\)",
  ):
    module(x, mask=jnp.ones((3, D), bool))
