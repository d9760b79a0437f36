"""NumPy float64 transcriptions of verl's advantage loops (tests only).

Loop-per-group re-implementations of ``compute_grpo_outcome_advantage``,
``grpo_covariance_coefficient``, GDPO with ``masked_whiten`` and the process
supervision of DeepSeekMath, written from the equations in the project spec
(``graph_rl_misc.md`` section 2), independent of ``jaxnorm.rl``. The policy
loss's aggregation is `verl_agg`'s transcription of verl's ``agg_loss``; the
official GDPO code is transcribed in `gdpo_official`.
"""

from __future__ import annotations

import numpy as np

from tests.oracles import verl_agg


def grpo(scores, *, eps=1e-6, scale=True, singleton="verl"):
  """Outcome GRPO over one group (1-D)."""
  s = np.asarray(scores, np.float64)
  if s.size == 1:
    if singleton == "zero":
      return np.zeros_like(s)
    mean, std = 0.0, 1.0
  else:
    mean, std = s.mean(), s.std(ddof=1)
  return (s - mean) / (std + eps) if scale else s - mean


def corrgrpo(rewards, weights=None, *, eps=1e-6, normalize=True):
  """CorrGRPO over one group, rewards (G, K)."""
  r = np.asarray(rewards, np.float64)
  if weights is not None:
    r = r * np.asarray(weights, np.float64)
  g = r.shape[0]
  c = r - r.mean(0, keepdims=True)
  total = c.sum(-1)
  if not normalize:
    return total
  if g > 1:
    cov = c.T @ c / (g - 1)
    var = np.diag(cov)
    inv = np.array([v**-0.5 if v > 0 else 0.0 for v in var])
    coef = max((cov * np.outer(inv, inv)).sum(), 0.0)
  else:
    coef = 0.0
  return total / np.sqrt(coef + eps)


def gdpo(rewards, weights=None, lengths=None, *, eps=1e-6, mode="std"):
  """GDPO over a batch of groups, rewards (B, G, K), lengths (B, G)."""
  r = np.asarray(rewards, np.float64)
  b, g, k = r.shape
  w = np.ones(k) if weights is None else np.asarray(weights, np.float64)
  n = np.ones((b, g)) if lengths is None else np.asarray(lengths, np.float64)
  z = np.zeros_like(r)
  for i in range(b):
    for j in range(k):
      z[i, :, j] = w[j] * grpo(r[i, :, j], eps=eps)
  s = z.sum(-1).ravel()
  nn = n.ravel()
  mean = (s * nn).sum() / nn.sum()
  if mode == "std":
    var = (nn * (s - mean) ** 2).sum() / nn.sum() * nn.sum() / (nn.sum() - 1)
    out = (s - mean) / np.sqrt(var + 1e-8)
  else:
    rows = z.reshape(-1, k)[nn > 0]
    c = rows - rows.mean(0)
    cross = c.T @ c
    sq = np.diag(cross)
    inv = np.array([v**-0.5 if v > 0 else 0.0 for v in sq])
    den = np.sqrt(max((cross * np.outer(inv, inv)).sum(), 0.0) + eps)
    out = (s - mean) / den
  out[nn == 0] = 0.0
  return out.reshape(b, g)


def process(step_rewards, step_mask, step_index, num_tokens, *, eps=1e-6):
  """Process-supervision advantages of one group, inputs (G, S)."""
  r = np.asarray(step_rewards, np.float64)
  m = np.asarray(step_mask, bool)
  vals = r[m]
  mean, std = vals.mean(), vals.std(ddof=1)
  g, s = r.shape
  out = np.zeros((g, num_tokens))
  for i in range(g):
    for t in range(num_tokens):
      for j in range(s):
        if m[i, j] and step_index[i, j] >= t:
          out[i, t] += (r[i, j] - mean) / (std + eps)
  return out


def policy_loss(logp, old, ref, adv, mask, *, clip_eps, kl_coef, agg, **counts):
  """GRPO clipped surrogate + k3 KL, aggregated by verl's ``agg_loss``.

  ``agg`` is jaxnorm's mode name; ``counts`` (``batch_num_tokens``,
  ``global_batch_size``, ``loss_scale_factor``) go to `verl_agg.agg_loss`.
  """
  logp, old = np.asarray(logp, np.float64), np.asarray(old, np.float64)
  adv = np.asarray(adv, np.float64)
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], logp.shape[1], 1)
  b, t = logp.shape
  loss = np.zeros((b, t))
  for i in range(b):
    for j in range(t):
      rho = np.exp(logp[i, j] - old[i, j])
      cl = min(max(rho, 1 - clip_eps), 1 + clip_eps)
      v = -min(rho * adv[i, j], cl * adv[i, j])
      if ref is not None:
        d = ref[i, j] - logp[i, j]
        v += kl_coef * (np.exp(d) - d - 1)
      loss[i, j] = v
  return verl_agg.agg_loss(loss, mask, agg.replace("_", "-"), **counts)
