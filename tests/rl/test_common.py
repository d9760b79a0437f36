"""The shared RL pieces: token entropy and the k3 KL estimator."""

import numpy as np
import pytest

from jaxnorm import rl


def test_token_entropy_and_kl():
  z = np.array([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]], np.float32)
  h = rl.token_entropy(z)
  np.testing.assert_allclose(h, [np.log(4.0), 0.0], atol=1e-6)
  zneg = np.array([[0.0, -np.inf, 0.0]], np.float32)
  np.testing.assert_allclose(rl.token_entropy(zneg), [np.log(2.0)], atol=1e-6)
  np.testing.assert_array_equal(
    rl.token_entropy(z, np.array([True, False])), [h[0], 0.0]
  )
  rng = np.random.default_rng(5)
  big = rng.normal(size=(5, 7)).astype(np.float32) * 3
  p = np.exp(big - big.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(
    rl.token_entropy(big), -(p * np.log(p)).sum(-1), rtol=1e-5
  )
  a = rng.normal(size=(6,)).astype(np.float32)
  b = rng.normal(size=(6,)).astype(np.float32)
  k = np.asarray(rl.kl_k3(a, b))
  d = b.astype(np.float64) - a
  np.testing.assert_allclose(k, np.exp(d) - d - 1, rtol=1e-5)
  assert np.all(k >= 0) and float(rl.kl_k3(a, a).max()) == 0.0


def test_errors():
  r2 = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="token_entropy: mask must have shape"):
    rl.token_entropy(r2, np.ones(3, bool))
  with pytest.raises(ValueError, match="kl_k3: ref_logp must have shape"):
    rl.kl_k3(r2, r2[0])
