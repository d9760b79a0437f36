"""Tests of the shared helpers (`jaxnorm._numerics`, `jaxnorm._checks`) and
of the `jaxnorm.norms` package surface.

The helpers are exercised through every norm; these tests pin the contracts
the families rely on: the compute dtype, the affine tail, the EMA, two-pass
moments against NumPy float64, group resolution and the axis checks.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import _checks, _numerics, norms
from tests import helpers
from tests.norms import common

# Every public name `jaxnorm.norms` had as a single module.
_PUBLIC_BEFORE_SPLIT = (
  "Axis EPS_MODES EpsMode BackwardStat BatchNormState EvoNormB0State "
  "EvoNormS0Variant L1BatchNormState L1_KAPPA PowerNormState RegistersWith "
  "TimestepDecayNormState UnMixTNSState UnifiedNormState batch_norm "
  "branch_rms_norm cls_token_type crms_norm dual_scaled_linear dyt "
  "evo_norm_b0 evo_norm_s0 fold_unified_norm group_norm "
  "init_batch_norm_state init_evo_norm_b0_state init_l1_batch_norm_state "
  "init_power_norm_state init_timestep_decay_norm_state "
  "init_unified_norm_state init_unmix_tns_state instance_norm l1_batch_norm "
  "l1_layer_norm layer_norm layer_norm_scaling magnitude_direction_scale "
  "power_norm region_norm region_norm_b region_norm_l resize_mask_nearest "
  "rms_norm seed_norm specialized_layer_norm specialized_linear "
  "timestep_decay_norm unified_norm unmix_tns unmix_tns_momentum"
).split()


# Left the public surface (issue 29) but still importable from the package.
_INTERNAL = {"Axis", "EPS_MODES", "L1_KAPPA", "resize_mask_nearest"}

# Renamed (issue 29, one name per concept): old name -> new name.
_RENAMED = {"BackwardStat": "BackwardStatSource"}


def test_package_keeps_every_public_name():
  # The split kept every name; papers added since only extend the list.
  before = {_RENAMED.get(n, n) for n in _PUBLIC_BEFORE_SPLIT}
  assert before - _INTERNAL <= set(norms.__all__)
  assert not _INTERNAL & set(norms.__all__)
  for name in (*norms.__all__, *before):
    assert hasattr(norms, name), name
  # The old name is gone: jaxnorm.nn.BackwardStat is the only BackwardStat.
  for old in _RENAMED:
    assert not hasattr(norms, old), old
  # The function, not the submodule of the same name.
  assert inspect.isfunction(norms.dyt)


@pytest.mark.parametrize(
  "dtype,expected",
  [
    (jnp.bfloat16, jnp.float32),
    (jnp.float16, jnp.float32),
    (jnp.float32, jnp.float32),
  ],
)
def test_compute_dtype(dtype, expected):
  assert _numerics.compute_dtype(jnp.ones(2, dtype)) == expected
  both = _numerics.compute_dtype(jnp.ones(2, dtype), jnp.ones(2, jnp.float16))
  assert both == jnp.float32


def test_compute_dtype_keeps_float64():
  with jax.enable_x64(True):
    x = jnp.ones(2, jnp.float64)
    assert _numerics.compute_dtype(x, jnp.ones(2, jnp.bfloat16)) == jnp.float64


def test_affine_tail():
  y = jnp.arange(6.0).reshape(2, 3)
  s, b = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 0.0, -1.0])
  np.testing.assert_array_equal(
    _numerics.affine(y, s, b, scale_offset=1.0), y * (s + 1.0)[None] + b[None]
  )
  np.testing.assert_array_equal(
    _numerics.affine(y, None, None, scale_offset=1.0), 2.0 * y
  )
  np.testing.assert_array_equal(_numerics.affine(y, None, None), y)
  rows = jnp.array([2.0, 3.0])
  np.testing.assert_array_equal(
    _numerics.affine(y, rows, None, (0,)), y * rows.reshape(2, 1)
  )


def test_ema_keeps_state_dtype():
  old = jnp.full(3, 2.0, jnp.bfloat16)
  new = _numerics.ema(old, jnp.ones((1, 3)), 0.75)
  assert new.dtype == jnp.bfloat16 and new.shape == (3,)
  np.testing.assert_array_equal(new, np.full(3, 1.75))


def test_two_pass_moments_at_large_offset(key):
  x = common.normal(key, (4, 64), shift=1e4)
  mean, var = _numerics.moments(x, (1,))
  x64 = np.asarray(x, np.float64)
  helpers.assert_close(var[:, 0], x64.var(1), atol=0, rtol=1e-3)
  helpers.assert_close(mean[:, 0], x64.mean(1), atol=0, rtol=1e-6)


def test_group_moments_broadcast_per_group():
  x = jnp.arange(12.0).reshape(1, 1, 12)
  mean, var = _numerics.group_moments(x, 3, (2,))
  groups = np.arange(12.0).reshape(3, 4)
  np.testing.assert_allclose(mean[0, 0], np.repeat(groups.mean(1), 4))
  np.testing.assert_allclose(var[0, 0], np.repeat(groups.var(1), 4))


def test_resolve_groups():
  assert _numerics.resolve_groups("f", "c", 12, None, 3) == 4
  assert _numerics.resolve_groups("f", "c", 12, 6, None) == 6
  with pytest.raises(ValueError, match=r"f: give exactly one of num_groups"):
    _numerics.resolve_groups("f", "c", 12, None, None)
  with pytest.raises(ValueError, match=r"f: c=12 must be divisible by"):
    _numerics.resolve_groups("f", "c", 12, 5, None)


def test_vector_or():
  np.testing.assert_array_equal(
    _numerics.vector_or(None, 1.0, 3, jnp.float32), np.ones(3)
  )
  got = _numerics.vector_or(jnp.ones(3, jnp.bfloat16), 0.0, 3, jnp.float32)
  assert got.dtype == jnp.float32


def test_checks_messages():
  with pytest.raises(ValueError, match=r"f: axis=-1 needs an input of rank"):
    _checks.normalize_axes("f", -1, 0)
  with pytest.raises(ValueError, match=r"f: reduction_axes must be integers"):
    _checks.normalize_axes("f", 3, 2, name="reduction_axes")
  with pytest.raises(
    ValueError, match=r"f: alpha must be a scalar of shape \(\) or \(1,\)"
  ):
    _checks.check_scalar("f", "alpha", jnp.ones((1, 1)))
  with pytest.raises(TypeError, match=r"f: state must be a BatchNormState"):
    _numerics.check_state("f", (1, 2), norms.BatchNormState, {})
