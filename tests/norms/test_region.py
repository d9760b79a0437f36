"""Tests of `jaxnorm.norms.region` (RN closed form, RN-B, RN-L, masks) and
of its modules `jaxnorm.nn.RegionNormB` / `RegionNormL`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxnorm import nn as jnn
from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import norms_family_numpy as ref


def _mask(key, shape, p=0.4):
  return jax.random.bernoulli(key, p, shape).astype(jnp.float32)


class TestRegionNorm:
  @pytest.mark.parametrize("channels_in_mask", [False, True])
  def test_claim_closed_form_equals_fill_construction(
    self, key, channels_in_mask
  ):
    kx, km = jax.random.split(key)
    x = common.normal(kx, (2, 5, 4, 3), scale=2.0, shift=0.5)
    mask = _mask(km, (2, 5, 4, 3 if channels_in_mask else 1))
    helpers.assert_close(
      norms.region_norm(x, mask),
      ref.region_norm_fill(x, mask),
      atol=2e-5,
      rtol=1e-5,
    )

  def test_claim_full_mask_is_batch_norm(self, key):
    x = common.normal(key, (3, 4, 4, 5), scale=2.0, shift=1.0)
    bn, _ = norms.batch_norm(
      x, None, None, norms.init_batch_norm_state(5), training=True
    )
    for mask in (jnp.ones((3, 4, 4, 1)), jnp.zeros((3, 4, 4, 1))):
      helpers.assert_close(norms.region_norm(x, mask), bn, atol=2e-6)

  def test_claim_zero_mean_regions_and_permutation(self, key):
    kx, km, kp = jax.random.split(key, 3)
    x = common.normal(kx, (2, 4, 4, 3), scale=2.0, shift=1.0)
    mask = _mask(km, (2, 4, 4, 1))
    y = np.asarray(norms.region_norm(x, mask))
    m = np.broadcast_to(np.asarray(mask), y.shape).astype(bool)
    for region in (m, ~m):
      sums = np.where(region, y, 0).sum((0, 1, 2))
      np.testing.assert_allclose(sums, np.zeros(3), atol=1e-4)
    # Permuting pixels inside the foreground permutes the output.
    flat_x, flat_m = np.asarray(x).reshape(-1, 3), np.asarray(mask).reshape(-1)
    fg = np.flatnonzero(flat_m)
    perm = np.arange(flat_m.size)
    perm[fg] = fg[np.asarray(jax.random.permutation(kp, fg.size))]
    y_perm = norms.region_norm(flat_x[perm].reshape(x.shape), mask)
    helpers.assert_close(
      np.asarray(y_perm).reshape(-1, 3), y.reshape(-1, 3)[perm], atol=1e-6
    )

  def test_empty_region_contributes_zero(self, key):
    x = common.normal(key, (1, 3, 3, 2))
    y = norms.region_norm(x, jnp.ones((1, 3, 3, 1)).at[0, 0, 0, 0].set(0.0))
    assert helpers.all_finite(y)

  @pytest.mark.parametrize("masked_bias", [False, True])
  def test_rn_b(self, key, masked_bias):
    kx, km, *kp = jax.random.split(key, 6)
    x = common.normal(kx, (2, 4, 4, 3))
    mask = _mask(km, (2, 4, 4, 1))
    gf, bf, gb, bb = (0.3 * common.normal(k, (3,)) for k in kp)
    y = norms.region_norm_b(x, mask, gf, bf, gb, bb, masked_bias=masked_bias)
    rn = ref.region_norm_fill(x, mask)
    m = np.asarray(mask)
    f = lambda a: np.asarray(a, np.float64)
    expected = rn * m * (1 + f(gf)) + rn * (1 - m) * (1 + f(gb))
    expected += (
      (m * f(bf) + (1 - m) * f(bb)) if masked_bias else (f(bf) + f(bb))
    )
    helpers.assert_close(y, expected, atol=2e-5, rtol=1e-5)
    zero = jnp.zeros(3)
    helpers.assert_close(
      norms.region_norm_b(x, mask, zero, zero, zero, zero),
      rn,
      atol=2e-5,
      rtol=1e-5,
    )

  def test_resize_mask_nearest_is_torch_style(self):
    mask = jnp.arange(16.0).reshape(1, 4, 4, 1)
    small = norms.resize_mask_nearest(mask, (2, 2))
    np.testing.assert_array_equal(small[0, :, :, 0], [[0, 2], [8, 10]])
    big = norms.resize_mask_nearest(jnp.arange(2.0).reshape(1, 2, 1, 1), (4, 3))
    np.testing.assert_array_equal(big[0, :, 0, 0], [0, 0, 1, 1])

  def test_rn_l(self, key):
    kx, k1, k2, k3 = jax.random.split(key, 4)
    x = common.normal(kx, (2, 6, 6, 4), scale=2.0)
    mk = common.normal(k1, (3, 3, 2, 1))
    gk, bk = (
      0.3 * common.normal(k2, (3, 3, 1, 1)),
      0.3 * common.normal(k3, (3, 3, 1, 1)),
    )
    gbias, bbias = jnp.array([0.1]), jnp.array([-0.2])
    rn_l = jax.jit(functools.partial(norms.region_norm_l, threshold=0.6))
    y = rn_l(x, mk, gk, gbias, bk, bbias)
    xn = np.asarray(x, np.float64)
    pooled = np.concatenate(
      [xn.mean(-1, keepdims=True), xn.max(-1, keepdims=True)], -1
    )

    def conv(h, w):  # Zero-padded "same" cross-correlation, float64.
      k = w.shape[0]
      hp = np.pad(h, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
      out = np.zeros(h.shape[:3] + (w.shape[-1],))
      for i in range(k):
        for j in range(k):
          out += (
            hp[:, i : i + h.shape[1], j : j + h.shape[2]]
            @ np.asarray(w, np.float64)[i, j]
          )
      return out

    a = 1 / (1 + np.exp(-conv(pooled, mk)))
    rn = ref.region_norm_fill(xn, (a >= 0.6).astype(np.float64))
    expected = rn * (1 + conv(a, gk) + 0.1) + conv(a, bk) - 0.2
    helpers.assert_close(y, expected, atol=5e-5, rtol=1e-4)
    # The mask is thresholded without gradient; a still gets gradient.
    g = jax.jit(
      jax.grad(lambda mk: jnp.sum(rn_l(x, mk, gk, gbias, bk, bbias) ** 2))
    )(mk)
    assert float(jnp.max(jnp.abs(g))) > 0

  def test_cross_device(self, key):
    kx, km = jax.random.split(key)
    x = common.normal(kx, (8, 3, 3, 4), scale=2.0, shift=0.5)
    mask = _mask(km, (8, 3, 3, 1))
    sharded = jax.jit(
      jax.shard_map(
        lambda x, m: norms.region_norm(x, m, axis_name="data"),
        mesh=common.mesh4(),
        in_specs=(P("data"), P("data")),
        out_specs=P("data"),
      )
    )
    helpers.assert_close(
      sharded(x, mask), norms.region_norm(x, mask), atol=2e-6
    )

  def test_errors(self):
    x, z = jnp.ones((2, 3, 3, 4)), jnp.zeros(4)
    with pytest.raises(
      ValueError,
      match=r"region_norm: mask must have shape "
      r"\(2, 3, 3, 1\) or \(2, 3, 3, 4\)",
    ):
      norms.region_norm(x, jnp.ones((2, 3, 3, 2)))
    with pytest.raises(ValueError, match=r"region_norm: x must have rank"):
      norms.region_norm(jnp.ones((2, 4)), jnp.ones((2, 1)))
    with pytest.raises(ValueError, match=r"scale_bg must have shape"):
      norms.region_norm_b(x, jnp.ones((2, 3, 3, 1)), z, z, jnp.ones(3), z)
    with pytest.raises(
      ValueError,
      match=r"kernels must be \(k, k, ...\) "
      r"with odd k",
    ):
      norms.region_norm_l(
        x,
        jnp.ones((2, 2, 2, 1)),
        jnp.ones((2, 2, 1, 1)),
        jnp.ones(1),
        jnp.ones((2, 2, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(
      ValueError,
      match=r"scale_kernel must have shape "
      r"\(3, 3, 1, 1\)",
    ):
      norms.region_norm_l(
        x,
        jnp.ones((3, 3, 2, 1)),
        jnp.ones((3, 3, 2, 1)),
        jnp.ones(1),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(ValueError, match=r"region_norm_l: x must have rank 4"):
      norms.region_norm_l(
        jnp.ones((2, 3, 4)),
        jnp.ones((3, 3, 2, 1)),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
        jnp.ones((3, 3, 1, 1)),
        jnp.ones(1),
      )
    with pytest.raises(
      ValueError,
      match=r"spatial_shape must have 2 "
      r"entries",
    ):
      norms.resize_mask_nearest(x, (3,))
    with pytest.raises(
      ValueError,
      match=r"spatial_shape entries must be a "
      r"positive integer",
    ):
      norms.resize_mask_nearest(x, (3, 0))


class TestRegionNormModules:
  def test_rn_b_mask_resized(self, key):
    kx, km = jax.random.split(key)
    module = jnn.RegionNormB(3, rngs=nnx.Rngs(0))
    x = common.normal(kx, (2, 4, 4, 3))
    mask = jax.random.bernoulli(km, 0.5, (2, 8, 8, 1)).astype(jnp.float32)
    small = norms.resize_mask_nearest(mask, (4, 4))
    helpers.assert_close(
      module(x, mask), norms.region_norm(x, small), atol=1e-6
    )
    bn, _ = norms.batch_norm(
      x, None, None, norms.init_batch_norm_state(3), training=True
    )
    helpers.assert_close(module(x), bn, atol=1e-5)

  def test_rn_l_torch_init_bounds(self):
    module = jnn.RegionNormL(4, kernel_size=3, rngs=nnx.Rngs(0))
    assert module.mask_kernel[...].shape == (3, 3, 2, 1)
    assert float(jnp.max(jnp.abs(module.mask_kernel[...]))) <= 1 / 18**0.5
    assert float(jnp.max(jnp.abs(module.scale_kernel[...]))) <= 1 / 3
    with pytest.raises(
      ValueError,
      match=r"RegionNormL: kernel_size must be "
      r"odd",
    ):
      jnn.RegionNormL(4, kernel_size=4, rngs=nnx.Rngs(0))
