"""What the RL tests share: the spec's reward table and the group invariants."""

import numpy as np

# Section 2.2 of the spec: G = 4 responses, K = 3 reward components.
R = np.array([[1, 0, 0.2], [1, 1, 0.9], [0, 0, 0.1], [0, 1, 0.5]], np.float32)


def check_permutation_shift_and_group_independence(f, *, independent=True):
  """Permuting a group permutes ``f``; a shift is invisible; groups apart.

  ``independent=False`` skips the last check (GDPO whitens over the batch:
  groups interact there).
  """
  rng = np.random.default_rng(1)
  r = rng.normal(size=(3, 6, 2)).astype(np.float32)
  base = np.asarray(f(r))
  perm = rng.permutation(6)
  np.testing.assert_allclose(f(r[:, perm]), base[:, perm], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(f(r + 7.0), base, rtol=1e-4, atol=1e-5)
  if independent:
    r2 = r.copy()
    r2[0] = rng.normal(size=(6, 2))
    np.testing.assert_allclose(np.asarray(f(r2))[1:], base[1:], rtol=1e-6)
