"""GRPO and Dr.GRPO: spec golden, verl NumPy oracle, the policy loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import rl_numpy
from tests.rl import _common

GOLD_GRPO = [-0.195161, 1.279387, -1.149280, 0.065054]


def test_spec_golden():
  """Section 2.2 golden: GRPO on the total reward, G=4, K=3."""
  np.testing.assert_allclose(
    rl.grpo_advantages(_common.R.sum(-1)), GOLD_GRPO, atol=2e-6
  )
  r1 = np.array([1, 0, 0, 1], np.float32)
  np.testing.assert_allclose(
    np.abs(rl.grpo_advantages(r1)), 0.866024, atol=1e-6
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


def test_permutation_shift_and_group_independence():
  _common.check_permutation_shift_and_group_independence(
    lambda x: rl.grpo_advantages(x.sum(-1))
  )


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
  with pytest.raises(TypeError, match="step_token_index must have an integer"):
    rl.grpo_process_advantages(r2, r2 > 0, r2, num_tokens=4)
  with pytest.raises(ValueError, match="num_tokens must be a positive"):
    rl.grpo_process_advantages(r2, r2 > 0, r2.astype(int), num_tokens=0)
  with pytest.raises(ValueError, match="agg must be one of"):
    rl.grpo_policy_loss(r2, r2, None, r2[:, 0], r2 > 0, agg="sum")
  with pytest.raises(ValueError, match="advantages must have shape"):
    rl.grpo_policy_loss(r2, r2, None, r2[0], r2 > 0)
  with pytest.raises(ValueError, match="norm_length must be a positive"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, norm_length=0)
  with pytest.raises(ValueError, match="clip_eps must be >= 0"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, clip_eps=-1.0)
