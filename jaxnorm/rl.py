r"""Advantage normalization and policy losses for RL fine-tuning of LMs.

GRPO normalizes each response's reward by its group's statistics (one group =
the ``G`` responses sampled for one prompt); Dr.GRPO drops the division by
the standard deviation; CorrGRPO divides the centred total of ``K`` reward
components by the square root of the sum of their correlations; GDPO
normalizes every component on its own, sums them and whitens over the batch.
Groups sit on axis ``-1`` (``-2`` with components last); leading axes are
independent batches of groups. Statistics are computed in float32 (float64
stays), outputs come back in that compute dtype.

ERPO (arXiv:2603.28204) is **not** implemented: its three components
(entropy-aware gating at "critical decision pivots", bucket-based implicit
normalization, result-anchored advantage synthesis) are specified in nothing
that could be read (abstract only, no code). Only its verifiable ingredient,
the per-token policy entropy, is here (`token_entropy`).

References:
  Shao et al., *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
  Open Language Models*, arXiv:2402.03300 (2024).
  Liu et al., *Understanding R1-Zero-Like Training: A Critical Perspective*
  (Dr.GRPO), arXiv:2503.20783 (2025).
  HKUST-KnowComp, *CorrGRPO* (official code, ``verl/trainer/ppo/
  core_algos.py``; arXiv id not confirmed).
  Liu et al., *GDPO: Group reward-Decoupled Normalization Policy
  Optimization*, arXiv:2601.05242 (2026).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from jaxnorm import _checks, _numerics

Singleton = Literal["zero", "verl"]
Aggregation = Literal[
  "token_mean",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
]
GdpoNormalization = Literal["std", "correlation"]
SINGLETONS = ("zero", "verl")
AGGREGATIONS = (
  "token_mean",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
)
GDPO_NORMALIZATIONS = ("std", "correlation")

# verl's ``masked_whiten`` adds this inside the reciprocal square root.
_WHITEN_EPS = 1e-8


def _as_float(who: str, name: str, x: ArrayLike) -> jax.Array:
  x = jnp.asarray(x)
  _checks.check_floating(who, name, x)
  return x.astype(_numerics.compute_dtype(x))


def grpo_advantages(
  rewards: Float[ArrayLike, "... G"],
  *,
  eps: float = 1e-6,
  ddof: int = 1,
  scale_by_std: bool = True,
  singleton: Singleton = "zero",
) -> Float[Array, "... G"]:
  r"""GRPO outcome advantages: rewards normalized within each group.

  .. math::
    \hat A_i = \frac{r_i - \mathrm{mean}_G(r)}
                    {\mathrm{std}_G(r;\,\mathrm{ddof}) + \epsilon}

  broadcast by the caller to every token of response ``i``. With
  ``scale_by_std=False`` the division is dropped (Dr.GRPO):
  :math:`\hat A_i = r_i - \mathrm{mean}_G(r)`.

  Convention (verl ``compute_grpo_outcome_advantage``, read in the CorrGRPO
  repository): ``torch.std`` (``ddof=1``) with ``eps`` outside the std. A
  group of one (``G == 1``) has an undefined ``ddof=1`` std; verl then uses
  mean 0 and std 1 (``singleton="verl"``: the raw reward over ``1 + eps``,
  or the raw reward without the std), jaxnorm defaults to an advantage of 0
  (``singleton="zero"``), which a lone sample carries no comparison for.

  Unverified: the paper's equations are recalled, not re-read; the
  convention above is the reference implementation's.

  Args:
    rewards: scalar reward per response, groups on the last axis.
    eps: added to the std (outside the square root).
    ddof: delta degrees of freedom of the std (1 = verl, 0 = population).
    scale_by_std: divide by the std (GRPO) or not (Dr.GRPO).
    singleton: ``"zero"`` or ``"verl"``, the rule for ``G == 1``.

  Returns:
    Advantages of the shape of ``rewards``, in the compute dtype.

  Raises:
    TypeError: for non-floating rewards.
    ValueError: for a scalar input, a bad ``singleton``, a negative ``eps``
      or a ``ddof`` outside ``[0, G)`` for ``G > 1``.

  References:
    Shao et al., arXiv:2402.03300 (2024); Liu et al., arXiv:2503.20783
    (2025).
  """
  who = "grpo_advantages"
  _checks.check_ndim(who, "rewards", rewards, minimum=1)
  _checks.check_choice(who, "singleton", singleton, SINGLETONS)
  _checks.check_nonnegative(who, "eps", eps)
  r = _as_float(who, "rewards", rewards)
  g = r.shape[-1]
  if g == 1:
    if singleton == "zero":
      return jnp.zeros_like(r)
    return r / (1.0 + eps) if scale_by_std else r
  if not 0 <= ddof < g:
    raise ValueError(
      f"{who}: ddof must be in [0, G) for groups of G={g}, got {ddof=}"
    )
  centred = r - jnp.mean(r, axis=-1, keepdims=True)
  if not scale_by_std:
    return centred
  std = jnp.sqrt(
    jnp.sum(centred * centred, axis=-1, keepdims=True) / (g - ddof)
  )
  return centred / (std + eps)


def grpo_process_advantages(
  step_rewards: Float[ArrayLike, "... G S"],
  step_mask: Bool[ArrayLike, "... G S"],
  step_token_index: Int[ArrayLike, "... G S"],
  *,
  num_tokens: int,
  eps: float = 1e-6,
  ddof: int = 1,
) -> Float[Array, "... G T"]:
  r"""GRPO process-supervision advantages (one reward per reasoning step).

  .. math::
    \tilde r_{i,j} = \frac{r_{i,j} - \mathrm{mean}(R)}{\mathrm{std}(R) +
      \epsilon},\qquad
    \hat A_{i,t} = \sum_{j:\ \mathrm{index}(j) \ge t} \tilde r_{i,j}

  where :math:`R` holds every valid step reward of the group's ``G``
  responses and :math:`\mathrm{index}(j)` is the token at which step
  ``j`` ends. Padded steps (``step_mask`` false) neither enter the
  statistics nor the sums.

  Deviation: the paper writes the plain std; ``eps`` (outside) and
  ``ddof=1`` follow the outcome convention, so a group whose step rewards
  are all equal gets zero advantages instead of NaN.

  Args:
    step_rewards: reward of step ``j`` of response ``i``.
    step_mask: which steps exist.
    step_token_index: end-token index of each step, in ``[0, num_tokens)``.
    num_tokens: response length ``T`` of the output.
    eps: added to the std.
    ddof: delta degrees of freedom of the std over the valid steps.

  Returns:
    ``(..., G, T)`` token advantages in the compute dtype.

  Raises:
    TypeError: for non-floating rewards or a non-integer index.
    ValueError: for mismatched shapes, rank < 2 or a non-positive
      ``num_tokens``.

  References:
    Shao et al., arXiv:2402.03300 (2024), section 4.1.3.
  """
  who = "grpo_process_advantages"
  _checks.check_ndim(who, "step_rewards", step_rewards, minimum=2)
  _checks.check_shape(who, "step_mask", step_mask, jnp.shape(step_rewards))
  _checks.check_shape(
    who, "step_token_index", step_token_index, jnp.shape(step_rewards)
  )
  _checks.check_positive_int(who, "num_tokens", num_tokens)
  _checks.check_nonnegative(who, "eps", eps)
  index = jnp.asarray(step_token_index)
  if not jnp.issubdtype(index.dtype, jnp.integer):
    raise TypeError(
      f"{who}: step_token_index must have an integer dtype, got "
      f"step_token_index.dtype={index.dtype}"
    )
  r = _as_float(who, "step_rewards", step_rewards)
  m = jnp.asarray(step_mask, bool)
  w = m.astype(r.dtype)
  axes = (-2, -1)
  n = jnp.sum(w, axis=axes, keepdims=True)
  mean = jnp.sum(r * w, axis=axes, keepdims=True) / jnp.maximum(n, 1.0)
  dev = (r - mean) * w
  var = jnp.sum(dev * dev, axis=axes, keepdims=True) / jnp.maximum(
    n - ddof, 1.0
  )
  normed = dev / (jnp.sqrt(var) + eps)
  t = jnp.arange(num_tokens, dtype=index.dtype)
  t = t.reshape((1,) * (index.ndim - 1) + (num_tokens, 1))
  after = index[..., None, :] >= t  # (..., G, T, S)
  return jnp.sum(jnp.where(after, normed[..., None, :], 0.0), axis=-1)


def _weighted_components(
  who: str, rewards: ArrayLike, weights: ArrayLike | None
) -> jax.Array:
  _checks.check_ndim(who, "rewards", rewards, minimum=2)
  r = _as_float(who, "rewards", rewards)
  if weights is None:
    return r
  _checks.check_shape(
    who, "weights", weights, (r.shape[-1],), "one weight per component K"
  )
  w = _as_float(who, "weights", weights).astype(r.dtype)
  return r * w.reshape((1,) * (r.ndim - 1) + w.shape)


def _correlation_sum(centred: jax.Array, axis: int) -> jax.Array:
  """``max(sum_kl corr_kl, 0)`` of centred components (rows along axis)."""
  c = jnp.moveaxis(centred, axis, -2)
  cross = jnp.einsum("...ik,...il->...kl", c, c)
  sq = jnp.diagonal(cross, axis1=-2, axis2=-1)
  inv = jnp.where(sq > 0, jax.lax.rsqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
  corr = cross * inv[..., :, None] * inv[..., None, :]
  return jnp.maximum(jnp.sum(corr, axis=(-2, -1)), 0.0)


def corrgrpo_advantages(
  rewards: Float[ArrayLike, "... G K"],
  weights: Float[ArrayLike, " K"] | None = None,
  *,
  eps: float = 1e-6,
  normalize: bool = True,
) -> Float[Array, "... G"]:
  r"""CorrGRPO: centred total reward over the root of summed correlations.

  .. math::
    C = R - \mathrm{mean}_G R,\quad c_i = \textstyle\sum_k C_{ik},\quad
    \Sigma = \frac{C^\top C}{G-1},\quad
    \rho_{kl} = \frac{\Sigma_{kl}}{\sqrt{\Sigma_{kk}\Sigma_{ll}}},\quad
    \hat A_i = \frac{c_i}{\sqrt{\max(\sum_{kl}\rho_{kl}, 0) + \epsilon}}

  with ``R`` the ``weights``-scaled components. GRPO on
  :math:`\sum_k r_k` divides by :math:`\sqrt{\sum_{kl}\Sigma_{kl}}`;
  CorrGRPO replaces the covariances by correlations. A component with zero
  variance in a group gets a zero row and column of :math:`\rho`; a group
  of one gets a coefficient sum of 0 (and a zero centred reward). With
  ``K = 1`` this is Dr.GRPO over :math:`\sqrt{1 + \epsilon}`, not GRPO.
  ``eps`` sits inside the square root (GRPO: outside the std).

  Args:
    rewards: ``(..., G, K)`` reward components per response.
    weights: ``(K,)`` component weights, applied before everything.
    eps: added inside the square root.
    normalize: ``False`` returns :math:`c_i` (the Dr.GRPO switch).

  Returns:
    ``(..., G)`` advantages in the compute dtype.

  Raises:
    TypeError: for non-floating rewards or weights.
    ValueError: for rank < 2, a weight vector of another length or a
      negative ``eps``.

  References:
    HKUST-KnowComp, *CorrGRPO*, ``grpo_covariance_coefficient`` in
    ``verl/trainer/ppo/core_algos.py`` (official code, read).
  """
  who = "corrgrpo_advantages"
  _checks.check_nonnegative(who, "eps", eps)
  r = _weighted_components(who, rewards, weights)
  centred = r - jnp.mean(r, axis=-2, keepdims=True)
  total = jnp.sum(centred, axis=-1)
  if not normalize:
    return total
  # The covariance divisor G - 1 cancels in the correlations; G == 1 has
  # zero centred rows and therefore a zero sum.
  return total / jnp.sqrt(_correlation_sum(centred, -2)[..., None] + eps)


def gdpo_advantages(
  rewards: Float[ArrayLike, "... G K"],
  weights: Float[ArrayLike, " K"] | None = None,
  *,
  lengths: Float[ArrayLike, "... G"] | None = None,
  eps: float = 1e-6,
  batch_normalization: GdpoNormalization = "std",
) -> Float[Array, "... G"]:
  r"""GDPO: per-component GRPO, weighted sum, then batch whitening.

  .. math::
    Z_{ik} = w_k\,\mathrm{GRPO}_G(r_{\cdot k})_i,\quad S_i = \textstyle
    \sum_k Z_{ik},\quad \hat A_i = \frac{S_i - \bar S}{\sigma_S}

  over **every** response of the batch (all leading axes and ``G``).
  ``batch_normalization="std"`` is verl's ``masked_whiten``: token-weighted
  mean :math:`\bar S`, unbiased token-weighted variance, divisor
  :math:`\sqrt{\sigma^2 + 10^{-8}}`. ``"correlation"`` (CorrGRPO's
  variant) keeps the token-weighted mean and divides by
  :math:`\sqrt{\max(\sum_{kl}\mathrm{corr}(Z_k, Z_l), 0) + \epsilon}` with
  one row per response of positive length. Per-component GRPO uses the
  verl conventions (``ddof=1``, ``eps`` outside, singletons verl-style).

  Args:
    rewards: ``(..., G, K)`` reward components.
    weights: ``(K,)`` component weights.
    lengths: response lengths in tokens (the token mask's weights); default
      all ones (one observation per response). Responses of length 0 get 0.
    eps: GRPO's ``eps`` and the correlation variant's.
    batch_normalization: ``"std"`` or ``"correlation"``.

  Returns:
    ``(..., G)`` advantages in the compute dtype.

  Raises:
    TypeError: for non-floating rewards, weights or lengths.
    ValueError: for rank < 2, mismatched ``weights``/``lengths`` or a bad
      ``batch_normalization``.

  References:
    Liu et al., arXiv:2601.05242 (2026); the CorrGRPO repository's
    ``compute_gdpo_outcome_advantage`` (official code, read).
  """
  who = "gdpo_advantages"
  _checks.check_choice(
    who, "batch_normalization", batch_normalization, GDPO_NORMALIZATIONS
  )
  _checks.check_nonnegative(who, "eps", eps)
  _checks.check_ndim(who, "rewards", rewards, minimum=2)
  r = _as_float(who, "rewards", rewards)
  z = jnp.moveaxis(
    grpo_advantages(jnp.moveaxis(r, -1, -2), eps=eps, singleton="verl"),
    -2,
    -1,
  )
  z = _weighted_components(who, z, weights)
  s = jnp.sum(z, axis=-1)
  if lengths is None:
    n = jnp.ones_like(s)
  else:
    _checks.check_shape(who, "lengths", lengths, s.shape, "rewards.shape[:-1]")
    n = _as_float(who, "lengths", lengths).astype(s.dtype)
  total = jnp.sum(n)
  mean = jnp.sum(s * n) / total
  valid = n > 0
  if batch_normalization == "std":
    var = jnp.sum(n * (s - mean) ** 2) / (total - 1.0)
    out = (s - mean) * jax.lax.rsqrt(var + _WHITEN_EPS)
  else:
    flat = z.reshape(-1, z.shape[-1])
    keep = valid.reshape(-1, 1)
    count = jnp.maximum(jnp.sum(keep.astype(flat.dtype)), 1.0)
    col_mean = jnp.sum(jnp.where(keep, flat, 0.0), 0, keepdims=True) / count
    zc = jnp.where(keep, flat - col_mean, 0.0)
    out = (s - mean) / jnp.sqrt(_correlation_sum(zc, 0) + eps)
  return jnp.where(valid, out, 0.0)


def token_entropy(
  logits: Float[ArrayLike, "... V"],
  mask: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, "..."]:
  r"""Entropy of the policy at every token, :math:`-\sum_v p_v\log p_v`.

  .. math:: H_t = -\textstyle\sum_v \mathrm{softmax}(z_t)_v\,
     \log\mathrm{softmax}(z_t)_v

  computed from ``log_softmax`` in float32 (exact for ``-inf`` logits).
  ERPO gates advantages by this quantity; that gate is not specified in
  anything that could be read and is not implemented.

  Args:
    logits: ``(..., V)`` logits over the vocabulary.
    mask: optional ``(...)`` token mask; masked tokens get 0.

  Returns:
    ``(...)`` entropies in the compute dtype, in nats, in ``[0, log V]``.

  Raises:
    TypeError: for non-floating logits.
    ValueError: for a scalar input or a mask of another shape.

  References:
    ERPO, arXiv:2603.28204 (2026), abstract only.
  """
  who = "token_entropy"
  _checks.check_ndim(who, "logits", logits, minimum=1)
  z = _as_float(who, "logits", logits)
  logp = jax.nn.log_softmax(z, axis=-1)
  p = jnp.exp(logp)
  h = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
  if mask is None:
    return h
  _checks.check_shape(who, "mask", mask, h.shape, "logits.shape[:-1]")
  return jnp.where(jnp.asarray(mask, bool), h, 0.0)


def kl_k3(
  logp: Float[ArrayLike, "..."], ref_logp: Float[ArrayLike, "..."]
) -> Float[Array, "..."]:
  r"""Schulman's k3 estimator of :math:`\mathrm{KL}(\pi\,\|\,\pi_{ref})`.

  .. math:: k_3 = e^{\log\pi_{ref} - \log\pi} - (\log\pi_{ref} - \log\pi)
     - 1 \;\ge 0

  per sampled token; unbiased for samples from :math:`\pi`.

  Args:
    logp: log-probabilities of the sampled tokens under the policy.
    ref_logp: the same under the reference policy.

  Returns:
    Non-negative estimates, the shape of ``logp``, in the compute dtype.

  Raises:
    TypeError: for non-floating input.
    ValueError: for shapes that differ.

  References:
    Shao et al., arXiv:2402.03300 (2024), eq. 4.
  """
  who = "kl_k3"
  _checks.check_shape(who, "ref_logp", ref_logp, jnp.shape(logp))
  a = _as_float(who, "logp", logp)
  d = _as_float(who, "ref_logp", ref_logp).astype(a.dtype) - a
  return jnp.exp(d) - d - 1.0


def grpo_policy_loss(
  logp: Float[ArrayLike, "B T"],
  old_logp: Float[ArrayLike, "B T"],
  ref_logp: Float[ArrayLike, "B T"] | None,
  advantages: Float[ArrayLike, "B ..."],
  mask: Bool[ArrayLike, "B T"],
  *,
  clip_eps: float = 0.2,
  kl_coef: float = 0.04,
  agg: Aggregation = "seq_mean_token_mean",
  norm_length: int | None = None,
) -> Float[Array, ""]:
  r"""The GRPO clipped surrogate with a k3 KL penalty, as a loss to minimize.

  .. math::
    \ell_{i,t} = -\min(\rho_{i,t}\hat A_{i,t},
      \mathrm{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon)\hat A_{i,t})
      + \beta\,k_3(\pi_\theta, \pi_{ref})_{i,t},\quad
    \rho = e^{\log\pi_\theta - \log\pi_{old}}

  aggregated over the valid tokens as verl's ``agg_loss``:

  * ``"seq_mean_token_mean"`` (the paper's :math:`\frac1G\sum_i
    \frac1{|o_i|}\sum_t`);
  * ``"token_mean"``: one mean over every valid token (DAPO);
  * ``"seq_mean_token_sum"``: per-sequence sums, averaged;
  * ``"seq_mean_token_sum_norm"``: per-sequence sums over a constant
    ``norm_length`` (default ``T``), averaged (Dr.GRPO).

  Gradients flow through ``logp`` only (``old_logp``, ``ref_logp`` and the
  advantages are stopped). A sequence without valid tokens contributes 0 to
  ``seq_mean_token_mean``.

  Args:
    logp: ``(B, T)`` log-probabilities of the sampled tokens, current policy.
    old_logp: the same under the policy that sampled them.
    ref_logp: the same under the reference policy, or ``None`` (no KL).
    advantages: ``(B,)`` per response or ``(B, T)`` per token.
    mask: ``(B, T)`` valid response tokens.
    clip_eps: :math:`\varepsilon`.
    kl_coef: :math:`\beta` (ignored without ``ref_logp``).
    agg: aggregation mode (above).
    norm_length: the constant of ``"seq_mean_token_sum_norm"``.

  Returns:
    Scalar loss in the compute dtype.

  Raises:
    TypeError: for non-floating log-probabilities or advantages.
    ValueError: for ranks/shapes that do not match, a bad ``agg``, negative
      ``clip_eps`` or ``kl_coef``, or a non-positive ``norm_length``.

  References:
    Shao et al., arXiv:2402.03300 (2024), eq. 3; Liu et al.,
    arXiv:2503.20783 (2025); verl ``agg_loss`` (CorrGRPO repository).
  """
  who = "grpo_policy_loss"
  _checks.check_choice(who, "agg", agg, AGGREGATIONS)
  _checks.check_nonnegative(who, "clip_eps", clip_eps)
  _checks.check_nonnegative(who, "kl_coef", kl_coef)
  _checks.check_ndim(who, "logp", logp, expected=2)
  shape = jnp.shape(logp)
  _checks.check_shape(who, "old_logp", old_logp, shape)
  _checks.check_shape(who, "mask", mask, shape)
  if jnp.shape(advantages) not in (shape, shape[:1]):
    raise ValueError(
      f"{who}: advantages must have shape {shape} (per token) or "
      f"{shape[:1]} (per response), got advantages.shape="
      f"{jnp.shape(advantages)}"
    )
  if norm_length is not None:
    _checks.check_positive_int(who, "norm_length", norm_length)
  lp = _as_float(who, "logp", logp)
  dt = lp.dtype
  old = jax.lax.stop_gradient(_as_float(who, "old_logp", old_logp).astype(dt))
  adv = jax.lax.stop_gradient(
    _as_float(who, "advantages", advantages).astype(dt)
  )
  if adv.ndim == 1:
    adv = adv[:, None]
  ratio = jnp.exp(lp - old)
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
  loss = -jnp.minimum(ratio * adv, clipped * adv)
  if ref_logp is not None:
    _checks.check_shape(who, "ref_logp", ref_logp, shape)
    ref = jax.lax.stop_gradient(_as_float(who, "ref_logp", ref_logp))
    loss = loss + kl_coef * kl_k3(lp, ref.astype(dt))
  m = jnp.asarray(mask, bool)
  w = m.astype(dt)
  loss = jnp.where(m, loss, 0.0)
  if agg == "token_mean":
    return jnp.sum(loss) / jnp.maximum(jnp.sum(w), 1.0)
  seq = jnp.sum(loss, axis=-1)
  if agg == "seq_mean_token_mean":
    seq = seq / jnp.maximum(jnp.sum(w, axis=-1), 1.0)
  elif agg == "seq_mean_token_sum_norm":
    seq = seq / (shape[1] if norm_length is None else norm_length)
  return jnp.mean(seq)
