r"""GRPO and Dr.GRPO: group-normalized advantages and the clipped loss.

GRPO normalizes each response's reward by its group's statistics (one group
= the ``G`` responses sampled for one prompt); Dr.GRPO drops the division by
the standard deviation.

References:
  Shao et al., *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in
  Open Language Models*, arXiv:2402.03300 (2024).
  Liu et al., *Understanding R1-Zero-Like Training: A Critical Perspective*
  (Dr.GRPO), arXiv:2503.20783 (2025).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from jaxnorm import _checks, _scope
from jaxnorm.rl import _common

Singleton = Literal["zero", "verl"]
Aggregation = Literal[
  "token_mean",
  "token_sum",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
]
_SINGLETONS = ("zero", "verl")
# verl's seq-mean-token-mean divides each response's sum by (n_i + 1e-8).
_SEQ_MEAN_EPS = 1e-8
AGGREGATIONS = (
  "token_mean",
  "token_sum",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "seq_mean_token_sum_norm",
)


@_scope.scoped
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

  Examples:
    >>> r = jnp.array([1.0, 0.0, 0.0, 1.0])  # one group of G = 4, std 0.5774
    >>> print(np.asarray(rl.grpo_advantages(r)).round(4))
    [ 0.866 -0.866 -0.866  0.866]
    >>> print(np.asarray(rl.grpo_advantages(r, scale_by_std=False)))  # Dr.GRPO
    [ 0.5 -0.5 -0.5  0.5]

  References:
    Shao et al., arXiv:2402.03300 (2024); Liu et al., arXiv:2503.20783
    (2025).
  """
  who = "grpo_advantages"
  _checks.check_ndim(who, "rewards", rewards, minimum=1)
  _checks.check_choice(who, "singleton", singleton, _SINGLETONS)
  _checks.check_nonnegative(who, "eps", eps)
  r = _common.as_float(who, "rewards", rewards)
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


@_scope.scoped
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

  Examples:
    >>> steps = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # G = 2, two steps each
    >>> ends = jnp.array([[0, 2], [1, 2]])  # the token where each step ends
    >>> a = rl.grpo_process_advantages(
    ...     steps, jnp.ones((2, 2), bool), ends, num_tokens=3, ddof=0)
    >>> print(np.asarray(a).round(4))  # sums of later normalized step rewards
    [[ 0. -1. -1.]
     [ 0.  0.  1.]]

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
  r = _common.as_float(who, "step_rewards", step_rewards)
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


@_scope.scoped
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
  batch_num_tokens: ArrayLike | None = None,
  global_batch_size: ArrayLike | None = None,
) -> Float[Array, ""]:
  r"""The GRPO clipped surrogate with a k3 KL penalty, as a loss to minimize.

  .. math::
    \ell_{i,t} = -\min(\rho_{i,t}\hat A_{i,t},
      \mathrm{clip}(\rho_{i,t}, 1-\varepsilon, 1+\varepsilon)\hat A_{i,t})
      + \beta\,k_3(\pi_\theta, \pi_{ref})_{i,t},\quad
    \rho = e^{\log\pi_\theta - \log\pi_{old}}

  aggregated over the valid tokens (``mask``) exactly as verl's
  ``agg_loss`` (``verl/trainer/ppo/core_algos.py``, ``verl-project/verl``
  commit 1dda039b9c63, 2026-08-22, identical in release v0.9.0), with
  :math:`m_{i,t}` the mask, :math:`n_i = \sum_t m_{i,t}` the valid tokens of
  response :math:`i` and :math:`s_i = \sum_t m_{i,t}\ell_{i,t}`:

  * ``"seq_mean_token_mean"`` (the paper's :math:`\frac1G\sum_i
    \frac1{|o_i|}\sum_t`): :math:`\frac1{N_{seq}}\sum_{i: n_i>0}
    \frac{s_i}{n_i + 10^{-8}}`;
  * ``"token_mean"`` (DAPO; verl's default): :math:`\sum_i s_i / N_{tok}`;
  * ``"token_sum"``: :math:`\sum_i s_i`;
  * ``"seq_mean_token_sum"``: :math:`\frac1{N_{seq}}\sum_{i: n_i>0} s_i`;
  * ``"seq_mean_token_sum_norm"`` (Dr.GRPO): :math:`\frac1{N_{seq}\,L}
    \sum_{i: n_i>0} s_i` with the constant :math:`L` = ``norm_length``
    (verl's ``loss_scale_factor``, default ``T``).

  :math:`N_{tok}` = ``batch_num_tokens``, by default :math:`\sum_i n_i`.
  :math:`N_{seq}` = ``global_batch_size``, by default the number of
  responses with at least one valid token: verl's ``agg_loss`` leaves fully
  masked responses out of the sequence means. verl's PPO trainer instead
  passes ``global_batch_size = ppo_mini_batch_size * rollout.n`` (every
  response of the mini-batch, empty ones included;
  ``verl/trainer/ppo/ray_trainer.py``) and the mini-batch's token count as
  ``batch_num_tokens``; pass the same numbers to reproduce a trainer step,
  e.g. ``global_batch_size=B`` to count empty responses. When a batch is
  split into micro-batches, pass the whole batch's counts to every
  micro-batch and sum the micro-batch losses (verl's gradient
  accumulation).

  Gradients flow through ``logp`` only (``old_logp``, ``ref_logp`` and the
  advantages are stopped).

  Deviation: where the denominator is 0 (no valid token in the batch, in
  the default counts) verl returns 0/0 = NaN; this returns 0 (zero
  gradient). verl's ``dp_size`` argument is absent: it multiplies each
  data-parallel rank's loss so that DDP's gradient average gives the global
  sum over the global counts, while a jitted JAX program computes the loss
  of the global batch (``dp_size = 1``). The per-token loss follows the
  GRPO paper: verl's ``compute_policy_loss_vanilla`` also clamps the log
  ratio to :math:`[-20, 20]` and applies the dual clip (``clip_ratio_c =
  3``) to negative advantages, and its ``low_var_kl`` clamps k3 to
  :math:`[-10, 10]`; none of these is applied here.

  Args:
    logp: ``(B, T)`` log-probabilities of the sampled tokens, current policy.
    old_logp: the same under the policy that sampled them.
    ref_logp: the same under the reference policy, or ``None`` (no KL).
    advantages: ``(B,)`` per response or ``(B, T)`` per token.
    mask: ``(B, T)`` valid response tokens.
    clip_eps: :math:`\varepsilon`.
    kl_coef: :math:`\beta` (ignored without ``ref_logp``).
    agg: aggregation mode (above).
    norm_length: :math:`L` of ``"seq_mean_token_sum_norm"``.
    batch_num_tokens: scalar :math:`N_{tok}` of ``"token_mean"``, or
      ``None`` (the valid tokens of ``mask``).
    global_batch_size: scalar :math:`N_{seq}` of the ``"seq_mean_*"``
      modes, or ``None`` (the responses of ``mask`` with a valid token).

  Returns:
    Scalar loss in the compute dtype.

  Raises:
    TypeError: for non-floating log-probabilities or advantages.
    ValueError: for ranks/shapes that do not match, a bad ``agg``, negative
      ``clip_eps`` or ``kl_coef``, a non-positive ``norm_length``, or a
      ``batch_num_tokens``/``global_batch_size`` that is not a scalar or is
      a non-positive number.

  Examples:
    >>> logp = jnp.log(jnp.array([[0.5, 0.5]]))  # one response of two tokens
    >>> loss = rl.grpo_policy_loss(logp, logp, None, jnp.array([2.0]),
    ...                            jnp.ones((1, 2), bool))
    >>> print(np.asarray(loss))  # ratio 1: minus the advantage
    -2.0
    >>> mask = jnp.array([[True, True], [False, False]])  # 2nd one is empty
    >>> logp2 = jnp.concatenate([logp, logp])
    >>> adv = jnp.array([2.0, 5.0])
    >>> print(np.asarray(rl.grpo_policy_loss(logp2, logp2, None, adv, mask)))
    -2.0
    >>> print(np.asarray(rl.grpo_policy_loss(  # count it, as verl's trainer
    ...     logp2, logp2, None, adv, mask, global_batch_size=2)))
    -1.0

  References:
    Shao et al., arXiv:2402.03300 (2024), eq. 3; Liu et al.,
    arXiv:2503.20783 (2025); verl ``agg_loss`` (``verl-project/verl``
    1dda039b9c63, ``verl/trainer/ppo/core_algos.py``).
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
  for name, count in (
    ("batch_num_tokens", batch_num_tokens),
    ("global_batch_size", global_batch_size),
  ):
    if count is not None:
      _check_count(who, name, count)
  lp = _common.as_float(who, "logp", logp)
  dt = lp.dtype
  old = jax.lax.stop_gradient(
    _common.as_float(who, "old_logp", old_logp).astype(dt)
  )
  adv = jax.lax.stop_gradient(
    _common.as_float(who, "advantages", advantages).astype(dt)
  )
  if adv.ndim == 1:
    adv = adv[:, None]
  ratio = jnp.exp(lp - old)
  clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
  loss = -jnp.minimum(ratio * adv, clipped * adv)
  if ref_logp is not None:
    _checks.check_shape(who, "ref_logp", ref_logp, shape)
    ref = jax.lax.stop_gradient(_common.as_float(who, "ref_logp", ref_logp))
    loss = loss + kl_coef * _common.kl_k3(lp, ref.astype(dt))
  m = jnp.asarray(mask, bool)
  w = m.astype(dt)
  loss = jnp.where(m, loss, 0.0)
  if agg == "token_sum":
    return jnp.sum(loss)
  if agg == "token_mean":
    den = jnp.sum(w) if batch_num_tokens is None else batch_num_tokens
    return jnp.sum(loss) / _denominator(den, dt)
  tokens = jnp.sum(w, axis=-1)
  seq = jnp.sum(loss, axis=-1)
  if agg == "seq_mean_token_mean":
    seq = seq / (tokens + _SEQ_MEAN_EPS)
  kept = tokens > 0  # fully masked responses are left out (verl)
  den = global_batch_size
  if den is None:
    den = jnp.sum(kept.astype(dt))
  out = jnp.sum(jnp.where(kept, seq, 0.0)) / _denominator(den, dt)
  if agg == "seq_mean_token_sum_norm":
    out = out / (shape[1] if norm_length is None else norm_length)
  return out


def _check_count(who: str, name: str, count: ArrayLike) -> None:
  """A global count: a scalar; a positive one when it is a static number."""
  if jnp.ndim(count) != 0:
    raise ValueError(
      f"{who}: {name} must be a scalar, got {name}.shape={jnp.shape(count)}"
    )
  if isinstance(count, bool) or (
    isinstance(count, (int, float, np.integer, np.floating)) and count <= 0
  ):
    raise ValueError(f"{who}: {name} must be a positive number, got {count!r}")


def _denominator(count: ArrayLike, dtype) -> jax.Array:
  """``count`` in ``dtype``, with 0 replaced by 1 (a 0/0 loss becomes 0)."""
  c = jnp.asarray(count).astype(dtype)
  return jnp.where(c > 0, c, jnp.ones_like(c))
