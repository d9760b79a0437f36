"""GRPO and Dr.GRPO: spec golden, verl NumPy oracle, the policy loss.

The policy loss is checked against `tests.oracles.verl_agg`, a NumPy
transcription of verl's ``agg_loss`` (verl-project/verl 1dda039b9c63):
every aggregation mode, per-token and per-response advantages, responses
without valid tokens, batches without any, odd shapes and the global counts.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import rl
from tests.oracles import rl_numpy, verl_agg
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
  """Every response has a valid token (empty ones: the verl tests below)."""
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


def _loss_case(rng, shape, empty, per_token):
  """Random loss inputs; ``empty``: "none", "some" (rows 0 and -1) or "all"."""
  logp = rng.normal(-1.0, 0.3, shape).astype(np.float32)
  old = logp + rng.normal(0, 0.3, shape).astype(np.float32)
  ref = logp + rng.normal(0, 0.2, shape).astype(np.float32)
  adv = rng.normal(size=shape if per_token else shape[:1]).astype(np.float32)
  mask = rng.random(shape) < 0.6
  mask[:, 0] = True  # every row has a token, then empty the chosen ones
  if empty == "some":
    mask[0] = False
    mask[-1] = False
  elif empty == "all":
    mask[:] = False
  return logp, old, ref, adv, mask


def _jitted_loss(agg):
  """The loss under jit; the global counts, if given, are traced."""
  return jax.jit(functools.partial(rl.grpo_policy_loss, agg=agg))


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_matches_verl_agg_loss(agg):
  """Every mode equals verl's agg_loss, empty responses included."""
  rng = np.random.default_rng(11)
  loss_fn = _jitted_loss(agg)
  for shape in ((1, 1), (4, 7), (6, 3)):
    for per_token in (False, True):
      for empty in ("none", "some"):
        if empty == "some" and shape[0] < 3:
          continue
        logp, old, ref, adv, mask = _loss_case(rng, shape, empty, per_token)
        got = loss_fn(logp, old, ref, adv, mask)
        want = rl_numpy.policy_loss(
          logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.04, agg=agg
        )
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_global_counts_match_verl(agg):
  """Given counts (verl's trainer: the mini-batch's) are used as verl does."""
  rng = np.random.default_rng(12)
  logp, old, ref, adv, mask = _loss_case(rng, (5, 4), "some", True)
  counts = {"batch_num_tokens": 17, "global_batch_size": 5}
  got = _jitted_loss(agg)(logp, old, ref, adv, mask, **counts)
  want = rl_numpy.policy_loss(
    logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.04, agg=agg, **counts
  )
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  if agg == "seq_mean_token_sum_norm":
    got = rl.grpo_policy_loss(logp, old, ref, adv, mask, agg=agg, norm_length=9)
    want = rl_numpy.policy_loss(
      logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.04, agg=agg,
      loss_scale_factor=9,
    )  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=2e-6)


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_micro_batches_sum_to_the_batch(agg):
  """With the batch's counts, micro-batch losses add up to the batch loss."""
  rng = np.random.default_rng(13)
  logp, old, ref, adv, mask = _loss_case(rng, (6, 5), "some", False)
  whole = rl.grpo_policy_loss(logp, old, ref, adv, mask, agg=agg)
  counts = {
    "batch_num_tokens": int(mask.sum()),
    "global_batch_size": int(mask.any(-1).sum()),
  }
  parts = sum(
    float(
      rl.grpo_policy_loss(
        logp[s], old[s], ref[s], adv[s], mask[s], agg=agg, **counts
      )
    )
    for s in (slice(0, 2), slice(2, 6))
  )
  np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_all_empty_is_zero_not_nan(agg):
  """No valid token: verl gives 0/0 = NaN (documented deviation), we 0."""
  rng = np.random.default_rng(14)
  logp, old, ref, adv, mask = _loss_case(rng, (3, 4), "all", False)
  want = rl_numpy.policy_loss(
    logp, old, ref, adv, mask, clip_eps=0.2, kl_coef=0.04, agg=agg
  )
  assert np.isnan(want) == (agg != "token_sum")
  f = functools.partial(rl.grpo_policy_loss, agg=agg)
  assert float(f(logp, old, ref, adv, mask)) == 0.0
  g = jax.grad(lambda lp: f(lp, old, ref, adv, mask))(jnp.asarray(logp))
  assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("agg", rl.AGGREGATIONS)
def test_policy_loss_matches_verl_in_float64(agg):
  """At float64 the match is to round-off (verl's ``n_i + 1e-8`` included)."""
  rng = np.random.default_rng(16)
  case = _loss_case(rng, (5, 3), "some", True)
  with jax.enable_x64(True):
    args = [np.asarray(x, np.float64) for x in case[:4]] + [case[4]]
    got = rl.grpo_policy_loss(*args, agg=agg)
    assert got.dtype == jnp.float64
  want = rl_numpy.policy_loss(*args, clip_eps=0.2, kl_coef=0.04, agg=agg)
  np.testing.assert_allclose(float(got), want, rtol=1e-13, atol=1e-15)


def test_empty_responses_leave_the_sequence_means():
  """verl's agg_loss: an empty response does not enlarge the denominator.

  The old jaxnorm (before issue 27) averaged over all B rows; verl's
  ``agg_loss`` averages over the rows with a valid token, and verl's PPO
  trainer counts them only through ``global_batch_size``.
  """
  logp = np.zeros((3, 2), np.float32)
  adv = np.array([1.0, 2.0, 4.0], np.float32)
  mask = np.array([[1, 1], [1, 0], [0, 0]], bool)
  for agg, want in (
    ("seq_mean_token_mean", -1.5),  # (-1 - 2) / 2 rows
    ("seq_mean_token_sum", -2.0),  # (-2 - 2) / 2 rows
    ("seq_mean_token_sum_norm", -1.0),  # (-2 - 2) / 2 rows / T = 2
    ("token_mean", -4.0 / 3.0),
    ("token_sum", -4.0),
  ):
    got = rl.grpo_policy_loss(logp, logp, None, adv, mask, agg=agg)
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=agg)
  got = rl.grpo_policy_loss(
    logp, logp, None, adv, mask, agg="seq_mean_token_sum", global_batch_size=3
  )
  np.testing.assert_allclose(got, -4.0 / 3.0, rtol=1e-6)


def test_token_sum_norm_divides_by_the_rows_since_verl_5417():
  """verl before PR #5417 (v0.7.0) did not divide by the row count."""
  rng = np.random.default_rng(15)
  adv = rng.normal(size=(4, 6)).astype(np.float32)
  mask = rng.random((4, 6)) < 0.7
  mask[:, 0] = True
  logp = np.zeros((4, 6), np.float32)  # ratio 1, no KL: the loss is -A
  got = rl.grpo_policy_loss(
    logp, logp, None, adv, mask, agg="seq_mean_token_sum_norm"
  )
  np.testing.assert_allclose(
    got, verl_agg.agg_loss(-adv, mask, "seq-mean-token-sum-norm"), rtol=1e-5
  )
  np.testing.assert_allclose(
    got, verl_agg.token_sum_norm_v070(-adv, mask) / 4, rtol=1e-5
  )


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
  with pytest.raises(ValueError, match="batch_num_tokens must be a scalar"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, batch_num_tokens=r2[0])
  with pytest.raises(ValueError, match="global_batch_size must be a positive"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, global_batch_size=0)
  with pytest.raises(ValueError, match="batch_num_tokens must be a positive"):
    rl.grpo_policy_loss(r2, r2, None, r2, r2 > 0, batch_num_tokens=True)
