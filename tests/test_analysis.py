"""MNN, matrix entropy (official-code definitions) and dual-encoder gauge."""

import jax
import numpy as np
import pytest

from jaxnorm import analysis

R = np.array([[1, 2, 0], [0, 1, 3], [2, 0, 1], [1, 1, 1.5]], np.float32)
X_GOLD = [
  [0, 0.588172, -0.808736],
  [-0.524097, 0, 0.851658],
  [0.683486, -0.683486, -0.256307],
  [0, 0, 1],
]


def _np_mnn(r):
  """NumPy float64 transcription of the official ``MNN.py``."""
  r = np.asarray(r, np.float64)
  x = r - r.mean(0)
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  cols = np.sort(np.linalg.norm(x, axis=0))[::-1]
  return cols[: min(r.shape)].sum(), x


def test_spec_golden():
  np.testing.assert_allclose(
    analysis.centered_row_normalize(R), X_GOLD, atol=1e-6
  )
  np.testing.assert_allclose(analysis.matrix_nuclear_norm(R), 0.831672, 1e-6)
  np.testing.assert_allclose(
    analysis.matrix_nuclear_norm(R, per_token=False), 3.326688, 1e-6
  )
  x = np.asarray(analysis.centered_row_normalize(R), np.float64)
  np.testing.assert_allclose(
    np.linalg.svd(x, compute_uv=False).sum(), 3.080670, 1e-6
  )
  np.testing.assert_allclose(analysis.matrix_entropy(R), 0.671774, 1e-5)


def test_matches_numpy_and_invariances():
  rng = np.random.default_rng(0)
  h = rng.normal(size=(3, 20, 12)).astype(np.float32)
  got = np.asarray(analysis.matrix_nuclear_norm(h, per_token=False))
  for i in range(3):
    np.testing.assert_allclose(got[i], _np_mnn(h[i])[0], rtol=1e-5)
  shift = rng.normal(size=(1, 1, 12)).astype(np.float32) * 5
  np.testing.assert_allclose(
    analysis.matrix_nuclear_norm(h + shift, per_token=False), got, rtol=1e-4
  )
  np.testing.assert_allclose(
    analysis.matrix_nuclear_norm(h * 3.5, per_token=False), got, rtol=1e-5
  )
  np.testing.assert_allclose(
    analysis.matrix_entropy(h + shift), analysis.matrix_entropy(h), rtol=1e-4
  )
  # Sum of squared column norms is N; MNN * N <= sqrt(D N).
  x = np.asarray(analysis.centered_row_normalize(h))
  np.testing.assert_allclose((x**2).sum((1, 2)), 20.0, rtol=1e-5)
  assert np.all(got <= np.sqrt(12 * 20) + 1e-4)
  # All columns (top_d = d) bound the nuclear norm from above.
  full = np.asarray(analysis.matrix_nuclear_norm(h, top_d=12, per_token=False))
  nuc = np.linalg.svd(x.astype(np.float64), compute_uv=False).sum(-1)
  assert np.all(full >= nuc - 1e-4)
  ent = np.asarray(analysis.matrix_entropy(h))
  assert np.all((ent > 0) & (ent <= 1))


def test_top_d_truncation_is_not_a_bound_when_n_lt_d():
  h = np.random.default_rng(1).normal(size=(16, 64)).astype(np.float32)
  mnn = float(analysis.matrix_nuclear_norm(h, per_token=False))
  x = np.asarray(analysis.centered_row_normalize(h), np.float64)
  nuc = np.linalg.svd(x, compute_uv=False).sum()
  assert mnn < nuc  # the documented caveat (spec: 9.96 < 15.16)


def test_mean_row_nan_and_eps():
  h = np.array([[1.0, 2.0], [3.0, 4.0], [2.0, 3.0]], np.float32)  # row 3 = mean
  assert np.isnan(float(analysis.matrix_nuclear_norm(h)))
  v = float(analysis.matrix_nuclear_norm(h, eps=1e-6))
  # Rows 1, 2 are -/+ (1,1)/sqrt2; row 3 becomes 0: columns norm 1 each.
  np.testing.assert_allclose(v, 2.0 / 3.0, rtol=1e-6)


def test_entropy_limits():
  # Isotropic rows (centred +/- basis vectors): lambda = 1/d, H = 1.
  e = np.eye(4, dtype=np.float32)
  np.testing.assert_allclose(
    analysis.matrix_entropy(np.concatenate([e, -e])), 1.0, rtol=1e-5
  )
  # Rank-one rows: H = 0.
  line = np.outer([1, -1, 2, -2], [1, 2, 3]).astype(np.float32)
  np.testing.assert_allclose(analysis.matrix_entropy(line), 0.0, atol=1e-5)


@pytest.fixture(scope="module")
def encoders():
  rng = np.random.default_rng(2)
  f = rng.normal(size=(200, 4)) @ rng.normal(size=(4, 4))
  g = rng.normal(size=(150, 4)) * np.array([3.0, 2.0, 1.0, 0.5])
  return f.astype(np.float32), g.astype(np.float32)


def test_gauge_fix_oracle(encoders):
  f, g = encoders
  fix = jax.jit(analysis.dual_encoder_gauge_fix, static_argnames="balance")
  ft, gt, lam = (np.asarray(a, np.float64) for a in fix(f, g))
  np.testing.assert_allclose(ft @ gt.T, f @ g.T, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(ft.T @ ft / 200, np.eye(4), atol=1e-4)
  np.testing.assert_allclose(gt.T @ gt / 150, np.diag(lam), atol=1e-3 * lam[0])
  assert np.all(np.diff(lam) <= 0)
  # Gauge invariance: f A, g A^{-T} give the same canonical form.
  a = np.random.default_rng(3).normal(size=(4, 4)).astype(
    np.float32
  ) + 2 * np.eye(4, dtype=np.float32)
  ft2, gt2, lam2 = fix(f @ a, g @ np.linalg.inv(a).T.astype(np.float32))
  np.testing.assert_allclose(lam2, lam, rtol=1e-3)
  np.testing.assert_allclose(ft2, ft, atol=2e-3)
  np.testing.assert_allclose(gt2, gt, atol=2e-3)
  fb, gb, _ = fix(f, g, balance=True)
  np.testing.assert_allclose(
    np.asarray(fb).T @ np.asarray(fb) / 200, np.diag(np.sqrt(lam)), atol=1e-3
  )
  np.testing.assert_allclose(
    np.asarray(fb) @ np.asarray(gb).T, f @ g.T, rtol=1e-3, atol=1e-3
  )


def test_errors():
  with pytest.raises(ValueError, match="hidden must have rank >= 2"):
    analysis.matrix_nuclear_norm(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="top_d must be <= d=3"):
    analysis.matrix_nuclear_norm(R, top_d=4)
  with pytest.raises(ValueError, match="top_d must be a positive integer"):
    analysis.matrix_nuclear_norm(R, top_d=0)
  with pytest.raises(TypeError, match="hidden must have a floating dtype"):
    analysis.matrix_entropy(np.ones((3, 3), np.int32))
  with pytest.raises(ValueError, match="hidden must have d >= 2"):
    analysis.matrix_entropy(np.ones((3, 1), np.float32))
  with pytest.raises(ValueError, match="eps must be >= 0"):
    analysis.centered_row_normalize(R, eps=-1.0)
  with pytest.raises(ValueError, match="g must have k=3 columns"):
    analysis.dual_encoder_gauge_fix(R, R[:, :2])
  with pytest.raises(ValueError, match="f must have rank 2"):
    analysis.dual_encoder_gauge_fix(R[0], R)
