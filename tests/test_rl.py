"""RL advantage normalization: spec goldens, verl NumPy oracle, invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import rl_numpy

R = np.array([[1, 0, 0.2], [1, 1, 0.9], [0, 0, 0.1], [0, 1, 0.5]], np.float32)
GOLD_GRPO = [-0.195161, 1.279387, -1.149280, 0.065054]
GOLD_CORR = [-0.095333, 0.624961, -0.561405, 0.031778]


def test_spec_goldens():
  """Section 2.2 goldens: GRPO on the total and CorrGRPO, G=4, K=3."""
  np.testing.assert_allclose(
    rl.grpo_advantages(R.sum(-1)), GOLD_GRPO, atol=2e-6
  )
  np.testing.assert_allclose(rl.corrgrpo_advantages(R), GOLD_CORR, atol=2e-6)
  r1 = np.array([[1], [0], [0], [1]], np.float32)
  np.testing.assert_allclose(np.abs(rl.corrgrpo_advantages(r1)), 0.5, atol=1e-6)
  np.testing.assert_allclose(
    np.abs(rl.grpo_advantages(r1[:, 0])), 0.866024, atol=1e-6
  )
  # A constant component contributes nothing.
  with_const = np.concatenate([R, np.full((4, 1), 3.0, np.float32)], -1)
  np.testing.assert_allclose(
    rl.corrgrpo_advantages(with_const), GOLD_CORR, atol=2e-6
  )


@pytest.mark.parametrize("ddof,scale", [(1, True), (0, True), (1, False)])
def test_grpo_matches_oracle(ddof, scale):
  r = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
  got = rl.grpo_advantages(r, ddof=ddof, scale_by_std=scale)
  for i in range(3):
    s = r[i].astype(np.float64)
    want = (s - s.mean()) / (s.std(ddof=ddof) + 1e-6) if scale else s - s.mean()
    np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    rl.grpo_advantages(r), [rl_numpy.grpo(x) for x in r], rtol=1e-5
  )


def test_grpo_singleton_and_constant_group():
  r = np.array([[2.5], [-1.0]], np.float32)
  assert np.all(np.asarray(rl.grpo_advantages(r)) == 0)
  np.testing.assert_allclose(
    rl.grpo_advantages(r, singleton="verl")[:, 0],
    [rl_numpy.grpo([2.5])[0], rl_numpy.grpo([-1.0])[0]],
    rtol=1e-6,
  )
  np.testing.assert_array_equal(
    rl.grpo_advantages(r, singleton="verl", scale_by_std=False), r
  )
  # All-equal rewards: zero advantages, no NaN (eps outside the std).
  assert np.all(
    np.asarray(rl.grpo_advantages(np.ones((2, 4), np.float32))) == 0
  )


@pytest.mark.parametrize("fn", ["grpo", "corr", "gdpo"])
def test_permutation_shift_and_group_independence(fn):
  rng = np.random.default_rng(1)
  r = rng.normal(size=(3, 6, 2)).astype(np.float32)
  f = {
    "grpo": lambda x: rl.grpo_advantages(x.sum(-1)),
    "corr": rl.corrgrpo_advantages,
    "gdpo": rl.gdpo_advantages,
  }[fn]
  base = np.asarray(f(r))
  perm = rng.permutation(6)
  np.testing.assert_allclose(f(r[:, perm]), base[:, perm], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(f(r + 7.0), base, rtol=1e-4, atol=1e-5)
  if fn != "gdpo":  # GDPO whitens over the batch: groups interact there.
    r2 = r.copy()
    r2[0] = rng.normal(size=(6, 2))
    np.testing.assert_allclose(np.asarray(f(r2))[1:], base[1:], rtol=1e-6)


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


def test_process_advantages_match_oracle():
  rng = np.random.default_rng(4)
  r = rng.normal(size=(2, 3, 4)).astype(np.float32)
  m = rng.random((2, 3, 4)) > 0.3
  idx = np.sort(rng.integers(0, 6, size=(2, 3, 4)), -1).astype(np.int32)
  got = rl.grpo_process_advantages(r, m, idx, num_tokens=6)
  assert got.shape == (2, 3, 6)
  for b in range(2):
    np.testing.assert_allclose(
      got[b], rl_numpy.process(r[b], m[b], idx[b], 6), rtol=1e-4, atol=1e-5
    )


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


LOSS_SHAPE = (3, 5)


@pytest.fixture(scope="module")
def loss_inputs():
  rng = np.random.default_rng(6)
  logp = rng.normal(-1.0, 0.3, LOSS_SHAPE).astype(np.float32)
  old = logp + rng.normal(0, 0.3, LOSS_SHAPE).astype(np.float32)
  ref = logp + rng.normal(0, 0.2, LOSS_SHAPE).astype(np.float32)
  adv = rng.normal(size=(3,)).astype(np.float32)
  mask = np.ones(LOSS_SHAPE, bool)
  mask[0, 3:] = False
  mask[2, 1:] = False
  return logp, old, ref, adv, mask


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_matches_oracle(loss_inputs, agg):
  logp, old, ref, adv, mask = loss_inputs
  got = rl.grpo_policy_loss(logp, old, ref, adv, mask, agg=agg)
  want = rl_numpy.policy_loss(
    logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.04, agg=agg
  )
  np.testing.assert_allclose(got, want, rtol=1e-5)
  per_token = np.repeat(adv[:, None], 5, 1)
  np.testing.assert_allclose(
    rl.grpo_policy_loss(logp, old, ref, per_token, mask, agg=agg), got
  )


def test_policy_loss_gradient_and_no_clip(loss_inputs):
  logp, old, ref, adv, mask = loss_inputs
  f = jax.jit(lambda lp: rl.grpo_policy_loss(lp, old, ref, adv, mask))
  g = np.asarray(jax.grad(f)(jnp.asarray(logp)))
  h = 1e-2
  for i, j in [(0, 0), (1, 4), (2, 0), (0, 4)]:
    e = np.zeros(LOSS_SHAPE, np.float32)
    e[i, j] = h
    fd = (float(f(logp + e)) - float(f(logp - e))) / (2 * h)
    np.testing.assert_allclose(g[i, j], fd, rtol=2e-2, atol=2e-4)
  assert g[0, 4] == 0.0  # masked token
  # rho = 1 (on-policy, no KL): clipping inactive, gradient -A/|o_i|/B.
  g1 = jax.grad(lambda lp: rl.grpo_policy_loss(lp, logp, None, adv, mask))(
    jnp.asarray(logp)
  )
  want = -adv[:, None] * mask / mask.sum(-1, keepdims=True) / 3
  np.testing.assert_allclose(g1, want, rtol=1e-6)


def test_errors():
  r2 = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="grpo_advantages: ddof must be"):
    rl.grpo_advantages(r2, ddof=3)
  with pytest.raises(ValueError, match="singleton must be one of"):
    rl.grpo_advantages(r2, singleton="drop")
  with pytest.raises(TypeError, match="rewards must have a floating"):
    rl.grpo_advantages(np.ones((2, 3), np.int32))
  with pytest.raises(ValueError, match="rewards must have rank >= 2"):
    rl.corrgrpo_advantages(np.ones(3, np.float32))
  with pytest.raises(ValueError, match="weights must have shape"):
    rl.corrgrpo_advantages(r2, np.ones(2, np.float32))
  with pytest.raises(ValueError, match="batch_normalization must be one of"):
    rl.gdpo_advantages(r2, batch_normalization="mad")
  with pytest.raises(ValueError, match="lengths must have shape"):
    rl.gdpo_advantages(r2, lengths=np.ones(3, np.float32))
  with pytest.raises(TypeError, match="step_token_index must have an integer"):
    rl.grpo_process_advantages(r2, r2 > 0, r2, num_tokens=4)
  with pytest.raises(ValueError, match="num_tokens must be a positive"):
    rl.grpo_process_advantages(r2, r2 > 0, r2.astype(int), num_tokens=0)
  with pytest.raises(ValueError, match="token_entropy: mask must have shape"):
    rl.token_entropy(r2, np.ones(3, bool))
  with pytest.raises(ValueError, match="kl_k3: ref_logp must have shape"):
    rl.kl_k3(r2, r2[0])
  with pytest.raises(ValueError, match="agg must be one of"):
    rl.grpo_policy_loss(r2, r2, None, r2[:, 0], r2 > 0, agg="sum")
  with pytest.raises(ValueError, match="advantages must have shape"):
    rl.grpo_policy_loss(r2, r2, None, r2[0], r2 > 0)
  with pytest.raises(ValueError, match="norm_length must be a positive"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, norm_length=0)
  with pytest.raises(ValueError, match="clip_eps must be >= 0"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, clip_eps=-1.0)
