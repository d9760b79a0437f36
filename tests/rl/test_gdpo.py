"""GDPO: verl NumPy oracle, invariants."""

import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import rl_numpy
from tests.rl import _common


def test_permutation_and_shift():
  _common.check_permutation_shift_and_group_independence(
    rl.gdpo_advantages, independent=False
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


def test_errors():
  r2 = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="batch_normalization must be one of"):
    rl.gdpo_advantages(r2, batch_normalization="mad")
  with pytest.raises(ValueError, match="lengths must have shape"):
    rl.gdpo_advantages(r2, lengths=np.ones(3, np.float32))
