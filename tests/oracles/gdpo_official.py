"""NumPy float64 restatements of the official GDPO code (tests only).

GDPO (Liu et al., arXiv:2601.05242) ships two implementations in
``NVlabs/GDPO`` (read at commit b080e63d0126870ad08acc8ebc3f04b728175a9e,
2026-01-09); they weigh the batch statistics differently:

* ``verl_gdpo``: ``verl-GDPO/verl/trainer/ppo/ray_trainer.py``,
  ``compute_advantage``, branch ``adv_estimator == 'gdpo'`` (added in commit
  7ab53aff153b, 2025-12-23; the tool-calling runs). Each component goes
  through verl's ``compute_grpo_outcome_advantage`` (groups by ``uid``;
  ``torch.std`` with ddof 1; ``eps = 1e-6`` outside the std; a group of one
  gets mean 0 and std 1; the scalar is broadcast to every token and
  multiplied by the response mask), the components are summed, then
  ``masked_whiten(sum, response_mask) * response_mask``: mean and unbiased
  variance over every valid **token** of the batch (so a response counts
  once per token), ``(x - mean) * rsqrt(var + 1e-8)``. The fork's verl
  helpers are those of ``volcengine/verl`` between PR #124 and #878
  (``eos_mask`` signature), read at commit 769b8d042ee1 (2025-02-10):
  ``verl/trainer/ppo/core_algos.py`` and ``verl/utils/torch_functional.py``
  (``masked_mean`` gained ``+ 1e-8`` in its denominator on 2025-03-27,
  invisible at float32). The fork sums the two components unweighted; the
  CorrGRPO copy (``compute_gdpo_outcome_advantage``) multiplies component k
  by ``w_k`` first, which ``weights`` reproduces.
* ``trl_gdpo``: ``trl-GDPO/trl-0.18.0-gdpo/trl/trainer/grpo_trainer.py``,
  ``_generate_and_score_completions``, branch ``apply_gdpo`` (commit
  fc15e1642b57, 2025-12-23; the GSM8K runs). Rewards are ``nan_to_num``-ed,
  each component is normalized in consecutive groups of ``num_generations``
  (``std`` ddof 1, ``1e-4`` outside), the weighted components are
  ``nansum``-ed, then normalized over every **response** of the batch:
  ``(x - mean) / (std(ddof=1) + 1e-4)``. This is the equation of the
  project page (``static/images/GDPO_FORMULA.png``).

Both aggregate the policy loss with a token mean (verl's ``masked_mean``
over the micro-batch; TRL 0.18's default ``loss_type="bnpo"``).

Written as loops over groups, rows and tokens, independent of
``jaxnorm.rl``.
"""

from __future__ import annotations

import numpy as np


def _grpo_outcome_verl(scores, index, eps):
  """verl's per-group normalization of one scalar score per response."""
  groups: dict = {}
  for i, g in enumerate(index):
    groups.setdefault(g, []).append(scores[i])
  stats = {}
  for g, vals in groups.items():
    if len(vals) == 1:
      stats[g] = (0.0, 1.0)
    else:
      vals = np.asarray(vals, np.float64)
      stats[g] = (vals.mean(), vals.std(ddof=1))
  out = np.zeros(len(scores))
  for i, g in enumerate(index):
    mean, std = stats[g]
    out[i] = (scores[i] - mean) / (std + eps)
  return out


def _masked_whiten(values, mask):
  """Token-masked whitening: mean and unbiased variance over mask == 1."""
  total = mask.sum()
  if total <= 1:
    raise ValueError("verl's masked_var needs at least two valid tokens")
  mean = (values * mask).sum() / total
  var = (((values - mean) ** 2) * mask).sum() / total
  var = var * total / (total - 1)
  return (values - mean) / np.sqrt(var + 1e-8)


def verl_gdpo(component_scores, response_mask, index, weights=None, eps=1e-6):
  """verl-GDPO advantages, per token ``(N, T)``.

  Args:
    component_scores: ``(N, K)``, one score per response and component.
    response_mask: ``(N, T)`` valid response tokens.
    index: ``(N,)`` group id (verl's ``uid``) of every response.
    weights: ``(K,)`` component weights (CorrGRPO's copy), default ones.
    eps: the GRPO epsilon.
  """
  scores = np.asarray(component_scores, np.float64)
  mask = np.asarray(response_mask).astype(np.float64)
  n, k = scores.shape
  w = np.ones(k) if weights is None else np.asarray(weights, np.float64)
  summed = np.zeros(mask.shape)
  for j in range(k):
    adv = _grpo_outcome_verl(scores[:, j], index, eps)
    summed += w[j] * adv[:, None] * mask  # broadcast to tokens, masked
  return _masked_whiten(summed, mask) * mask


def trl_gdpo(rewards_per_func, weights, num_generations):
  """TRL-GDPO advantages, one per response ``(N,)``.

  Args:
    rewards_per_func: ``(N, K)`` rewards, groups of ``num_generations``
      consecutive rows (TRL's layout).
    weights: ``(K,)`` reward weights.
    num_generations: the group size ``G``.
  """
  r = np.nan_to_num(np.asarray(rewards_per_func, np.float64))
  n, k = r.shape
  w = np.asarray(weights, np.float64)
  per_component = np.zeros((n, k))
  for j in range(k):
    for start in range(0, n, num_generations):
      grp = r[start : start + num_generations, j]
      mean, std = grp.mean(), grp.std(ddof=1)
      for i in range(start, start + num_generations):
        per_component[i, j] = (r[i, j] - mean) / (std + 1e-4)
  pre = np.nansum(per_component * w[None, :], axis=1)
  return (pre - pre.mean()) / (pre.std(ddof=1) + 1e-4)
