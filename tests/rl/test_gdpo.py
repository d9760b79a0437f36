"""GDPO: the official code's two implementations, verl NumPy oracle, invariants.

`tests.oracles.gdpo_official` transcribes NVlabs/GDPO (b080e63d0126): the
verl-GDPO advantages (token-weighted batch whitening) and the TRL-GDPO ones
(one observation per response, the paper's equation).
"""

import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import gdpo_official, rl_numpy
from tests.rl import _common


@pytest.mark.parametrize("mode", ["std", "trl"])
def test_permutation_and_shift(mode):
  _common.check_permutation_shift_and_group_independence(
    lambda r: rl.gdpo_advantages(r, batch_normalization=mode),
    independent=False,
  )


@pytest.mark.parametrize("mode", ["std", "correlation"])
def test_gdpo_matches_oracle(mode):
  rng = np.random.default_rng(3)
  r = rng.normal(size=(3, 4, 2)).astype(np.float32)
  lengths = rng.integers(0, 5, size=(3, 4)).astype(np.float32)
  lengths[0, 0] = 0.0
  w = np.array([1.0, 0.3], np.float32)
  got = rl.gdpo_advantages(r, w, lengths=lengths, batch_normalization=mode)
  want = rl_numpy.gdpo(r, w, lengths, mode=mode)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert float(got[0, 0]) == 0.0


def _flat_batch(rng, b, g, k, horizon, binary):
  """Rewards ``(b, g, k)``, lengths ``(b, g)`` and verl's flat layout."""
  if binary:  # GDPO's rewards are mostly 0/1 checks
    r = rng.integers(0, 2, size=(b, g, k)).astype(np.float32)
  else:
    r = rng.normal(size=(b, g, k)).astype(np.float32)
  lengths = rng.integers(0, horizon + 1, size=(b, g))
  lengths[0, 0] = 0  # an empty response
  lengths[-1, -1] = horizon  # a full one
  mask = np.arange(horizon)[None, :] < lengths.reshape(-1, 1)
  index = np.repeat(np.arange(b), g)  # verl's uid of each response
  return r, lengths.astype(np.float32), mask, index


@pytest.mark.parametrize(
  "b,g,k,weighted,binary",
  [(3, 4, 2, False, True), (4, 5, 3, True, False), (5, 1, 2, False, False)],
)
def test_std_matches_official_verl_gdpo(b, g, k, weighted, binary):
  """ "std" with lengths = verl-GDPO's token-weighted whitening, per token."""
  rng = np.random.default_rng(20 + b)
  r, lengths, mask, index = _flat_batch(rng, b, g, k, 6, binary)
  w = rng.uniform(0.2, 2.0, k).astype(np.float32) if weighted else None
  got = np.asarray(rl.gdpo_advantages(r, w, lengths=lengths))
  want = gdpo_official.verl_gdpo(r.reshape(-1, k), mask, index, w)
  per_token = got.reshape(-1, 1) * mask  # verl's broadcast and mask
  np.testing.assert_allclose(per_token, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("b,g,k", [(3, 4, 2), (2, 8, 3), (6, 3, 1)])
def test_trl_matches_official_trl_gdpo(b, g, k):
  """ "trl" = TRL-GDPO: one observation per response, eps 1e-4 outside."""
  rng = np.random.default_rng(30 + g)
  r = rng.integers(0, 2, size=(b, g, k)).astype(np.float32)
  r[..., 0] += rng.normal(size=(b, g)).astype(np.float32)
  r[0, :, -1] = 1.0  # a constant component in one group
  w = rng.uniform(0.2, 2.0, k).astype(np.float32)
  got = rl.gdpo_advantages(r, w, batch_normalization="trl")
  want = gdpo_official.trl_gdpo(r.reshape(-1, k), w, g).reshape(b, g)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_token_weighting_is_what_separates_the_two():
  """Unequal lengths move verl-GDPO's statistics, not TRL's."""
  rng = np.random.default_rng(40)
  r, lengths, mask, index = _flat_batch(rng, 4, 4, 2, 8, False)
  lengths = np.maximum(lengths, 1.0)  # no empty response: same rows
  mask = np.arange(8)[None, :] < lengths.reshape(-1, 1)
  token = np.asarray(rl.gdpo_advantages(r, lengths=lengths))
  response = np.asarray(rl.gdpo_advantages(r))
  assert np.max(np.abs(token - response)) > 1e-2
  want = gdpo_official.verl_gdpo(r.reshape(-1, 2), mask, index)
  np.testing.assert_allclose(
    token.reshape(-1, 1) * mask, want, rtol=1e-4, atol=1e-5
  )
  # Each response once: eps placement is the only difference from TRL.
  trl = rl.gdpo_advantages(r, batch_normalization="trl", eps=1e-6)
  np.testing.assert_allclose(response, trl, rtol=1e-4, atol=1e-5)


def test_trl_singletons_and_single_response_are_zero():
  r = np.array([[[1.0, 0.0]], [[0.0, 2.0]]], np.float32)  # B = 2, G = 1
  assert np.all(
    np.asarray(rl.gdpo_advantages(r, batch_normalization="trl")) == 0
  )
  one = rl.gdpo_advantages(r[:1], batch_normalization="trl")
  assert np.all(np.asarray(one) == 0)


def test_errors():
  r2 = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="batch_normalization must be one of"):
    rl.gdpo_advantages(r2, batch_normalization="mad")
  with pytest.raises(ValueError, match="lengths must have shape"):
    rl.gdpo_advantages(r2, lengths=np.ones(3, np.float32))
  with pytest.raises(ValueError, match="lengths must be None with"):
    rl.gdpo_advantages(
      r2, lengths=np.ones(2, np.float32), batch_normalization="trl"
    )
  with pytest.raises(ValueError, match="eps must be >= 0"):
    rl.gdpo_advantages(r2, eps=-1.0)
