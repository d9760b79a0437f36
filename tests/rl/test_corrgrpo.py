"""CorrGRPO: spec golden, verl NumPy oracle, invariants."""

import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import rl_numpy
from tests.rl import _common

GOLD_CORR = [-0.095333, 0.624961, -0.561405, 0.031778]


def test_spec_golden():
  """Section 2.2 golden: CorrGRPO, G=4, K=3."""
  np.testing.assert_allclose(
    rl.corrgrpo_advantages(_common.R), GOLD_CORR, atol=2e-6
  )
  r1 = np.array([[1], [0], [0], [1]], np.float32)
  np.testing.assert_allclose(np.abs(rl.corrgrpo_advantages(r1)), 0.5, atol=1e-6)
  # A constant component contributes nothing.
  with_const = np.concatenate([_common.R, np.full((4, 1), 3.0, np.float32)], -1)
  np.testing.assert_allclose(
    rl.corrgrpo_advantages(with_const), GOLD_CORR, atol=2e-6
  )


def test_permutation_shift_and_group_independence():
  _common.check_permutation_shift_and_group_independence(rl.corrgrpo_advantages)


def test_corrgrpo_matches_oracle_and_properties():
  rng = np.random.default_rng(2)
  r = rng.normal(size=(4, 8, 3)).astype(np.float32)
  w = np.array([1.0, 0.5, 2.0], np.float32)
  got = rl.corrgrpo_advantages(r, w)
  for i in range(4):
    np.testing.assert_allclose(
      got[i], rl_numpy.corrgrpo(r[i], w), rtol=1e-4, atol=1e-6
    )
  np.testing.assert_allclose(
    rl.corrgrpo_advantages(r, w, normalize=False),
    (r * w - (r * w).mean(1, keepdims=True)).sum(-1),
    rtol=1e-5,
    atol=1e-6,
  )
  # Denominator invariant to positive per-component scaling.
  c = r - r.mean(1, keepdims=True)
  den = c.sum(-1) / np.asarray(rl.corrgrpo_advantages(r))
  scaled = r * np.array([3.0, 0.1, 7.0], np.float32)
  cs = scaled - scaled.mean(1, keepdims=True)
  den_s = cs.sum(-1) / np.asarray(rl.corrgrpo_advantages(scaled))
  np.testing.assert_allclose(den_s, den, rtol=1e-3)
  # K = 1 with unit std: CorrGRPO equals GRPO up to sqrt(1+eps) vs 1+eps.
  one = rng.normal(size=(2, 8)).astype(np.float32)
  one = (one - one.mean(-1, keepdims=True)) / one.std(-1, ddof=1, keepdims=True)
  np.testing.assert_allclose(
    rl.corrgrpo_advantages(one[..., None]),
    rl.grpo_advantages(one),
    rtol=1e-5,
  )
  # G = 1: zero centred reward, no NaN.
  assert np.all(np.asarray(rl.corrgrpo_advantages(r[:, :1])) == 0)


def test_corrgrpo_independent_components_give_sqrt_k():
  """Exactly uncorrelated components (orthogonal centred columns)."""
  c = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], np.float32)
  got = rl.corrgrpo_advantages(c, eps=0.0)
  np.testing.assert_allclose(got, c.sum(-1) / np.sqrt(3.0), rtol=1e-6)


def test_errors():
  r2 = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="rewards must have rank >= 2"):
    rl.corrgrpo_advantages(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="weights must have shape"):
    rl.corrgrpo_advantages(r2, np.ones(2, np.float32))
