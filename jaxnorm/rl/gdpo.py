r"""GDPO: per-component GRPO, a weighted sum, then batch whitening.

GDPO normalizes every reward component on its own, sums them and whitens
over the batch.

References:
  Liu et al., *GDPO: Group reward-Decoupled Normalization Policy
  Optimization*, arXiv:2601.05242 (2026).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _scope
from jaxnorm.rl import _common, grpo

GdpoNormalization = Literal["std", "trl", "correlation"]
_GDPO_NORMALIZATIONS = ("std", "trl", "correlation")

# verl's ``masked_whiten`` adds this inside the reciprocal square root.
_WHITEN_EPS = 1e-8
# The default ``eps`` of each mode: verl's GRPO epsilon (verl-GDPO, CorrGRPO)
# and the constant of NVlabs' TRL implementation (group and batch std).
_DEFAULT_EPS = {"std": 1e-6, "correlation": 1e-6, "trl": 1e-4}


@_scope.scoped
def gdpo_advantages(
  rewards: Float[ArrayLike, "... G K"],
  weights: Float[ArrayLike, " K"] | None = None,
  *,
  lengths: Float[ArrayLike, "... G"] | None = None,
  eps: float | None = None,
  batch_normalization: GdpoNormalization = "std",
) -> Float[Array, "... G"]:
  r"""GDPO: per-component GRPO, weighted sum, then batch whitening.

  .. math::
    Z_{ik} = w_k\,\mathrm{GRPO}_G(r_{\cdot k})_i,\quad S_i = \textstyle
    \sum_k Z_{ik},\quad \hat A_i = \frac{S_i - \bar S}{\sigma_S}

  over **every** response of the batch (all leading axes and ``G``). The
  official code (``NVlabs/GDPO`` at b080e63d0126, 2026-01-09) has two
  implementations that weigh the batch statistics differently; each mode
  follows one of them exactly:

  * ``"std"``: ``verl-GDPO/verl/trainer/ppo/ray_trainer.py``
    (``compute_advantage``, ``adv_estimator == 'gdpo'``; the tool-calling
    runs), also ``compute_gdpo_outcome_advantage`` in the CorrGRPO
    repository. verl's GRPO per component (``ddof=1``, ``eps`` outside,
    a group of one has mean 0 and std 1), then verl's ``masked_whiten`` over
    the batch's **tokens**: each response weighs as many times as it has
    valid tokens (``lengths``), mean :math:`\bar S = \sum_i n_i S_i / N`,
    unbiased variance :math:`\sigma^2 = \sum_i n_i (S_i - \bar S)^2 /
    (N - 1)` with :math:`N = \sum_i n_i`, divisor :math:`\sqrt{\sigma^2 +
    10^{-8}}`. Without ``lengths`` each response counts once, which equals
    verl-GDPO only for one-token responses: pass the response lengths
    (``mask.sum(-1)``) to follow it.
  * ``"trl"``: ``trl-GDPO/trl-0.18.0-gdpo/trl/trainer/grpo_trainer.py``
    (``apply_gdpo``; the GSM8K runs), the equation of the paper's project
    page. Per component :math:`(r - \mathrm{mean}_G)/(\mathrm{std}_G +
    \epsilon)` (``ddof=1``), then one observation per **response**:
    :math:`\hat A = (S - \bar S)/(\mathrm{std}(S) + \epsilon)` with the
    plain mean and the ``ddof=1`` std over the batch; ``eps`` defaults to
    TRL's ``1e-4``. ``lengths`` does not apply.
  * ``"correlation"`` (CorrGRPO's variant): the token-weighted mean of
    ``"std"``, divided by
    :math:`\sqrt{\max(\sum_{kl}\mathrm{corr}(Z_k, Z_l), 0) + \epsilon}`
    with one row per response of positive length.

  Both official implementations aggregate the policy loss with a token
  mean: `grpo_policy_loss` with ``agg="token_mean"``.

  Deviation: TRL replaces missing (NaN) rewards with 0 and gives NaN for a
  group of one (``ddof=1``); here rewards must be finite and, in
  ``"trl"``, a lone response's component advantage is 0 (and so is a batch
  of one response); TRL takes this branch only for ``K > 1``. verl's
  ``masked_whiten`` raises for fewer than two valid tokens; here a batch
  with one valid token gives NaN. The verl-GDPO fork sums its two
  components unweighted (``weights=None``); the CorrGRPO copy applies the
  weights.

  Args:
    rewards: ``(..., G, K)`` reward components.
    weights: ``(K,)`` component weights.
    lengths: response lengths in tokens (the token mask's row sums), for
      ``"std"`` and ``"correlation"``; default all ones (one observation per
      response). Responses of length 0 get 0.
    eps: GRPO's ``eps`` (and the batch std's in ``"trl"``, the correlation
      variant's in ``"correlation"``); ``None`` takes the mode's official
      value: ``1e-6`` (verl) or ``1e-4`` (TRL).
    batch_normalization: ``"std"``, ``"trl"`` or ``"correlation"``.

  Returns:
    ``(..., G)`` advantages in the compute dtype.

  Raises:
    TypeError: for non-floating rewards, weights or lengths.
    ValueError: for rank < 2, mismatched ``weights``/``lengths``, a bad
      ``batch_normalization``, a negative ``eps`` or ``lengths`` with
      ``"trl"``.

  Examples:
    >>> r = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> print(np.asarray(rl.gdpo_advantages(r)).round(4))  # G = 4, K = 2
    [ 0.      0.      1.2247 -1.2247]
    >>> n = jnp.array([1.0, 1.0, 1.0, 3.0])  # verl-GDPO: weigh by tokens
    >>> print(np.asarray(rl.gdpo_advantages(r, lengths=n)).round(4))
    [ 0.4082  0.4082  1.633  -0.8165]
    >>> a = rl.gdpo_advantages(r, batch_normalization="trl")  # the paper's
    >>> print(np.asarray(a).round(4))
    [ 0.      0.      1.2247 -1.2247]

  References:
    Liu et al., arXiv:2601.05242 (2026); ``NVlabs/GDPO`` (official code,
    read at b080e63d0126); ``HKUST-KnowComp/CorrGRPO``'s
    ``compute_gdpo_outcome_advantage`` (read at 3586915ec333).
  """
  who = "gdpo_advantages"
  _checks.check_choice(
    who, "batch_normalization", batch_normalization, _GDPO_NORMALIZATIONS
  )
  if eps is None:
    eps = _DEFAULT_EPS[batch_normalization]
  _checks.check_nonnegative(who, "eps", eps)
  _checks.check_ndim(who, "rewards", rewards, minimum=2)
  if batch_normalization == "trl" and lengths is not None:
    raise ValueError(
      f"{who}: lengths must be None with batch_normalization='trl' (TRL "
      f"weighs every response once), got lengths.shape={jnp.shape(lengths)};"
      " drop lengths, or use 'std' for verl-GDPO's token weighting"
    )
  r = _common.as_float(who, "rewards", rewards)
  singleton = "zero" if batch_normalization == "trl" else "verl"
  z = jnp.moveaxis(
    grpo.grpo_advantages(jnp.moveaxis(r, -1, -2), eps=eps, singleton=singleton),
    -2,
    -1,
  )
  z = _common.weighted_components(who, z, weights)
  s = jnp.sum(z, axis=-1)
  if batch_normalization == "trl":
    centred = s - jnp.mean(s)
    std = jnp.sqrt(jnp.sum(centred * centred) / max(s.size - 1, 1))
    return centred / (std + eps)
  if lengths is None:
    n = jnp.ones_like(s)
  else:
    _checks.check_shape(who, "lengths", lengths, s.shape, "rewards.shape[:-1]")
    n = _common.as_float(who, "lengths", lengths).astype(s.dtype)
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
    out = (s - mean) / jnp.sqrt(_common.correlation_sum(zc, 0) + eps)
  return jnp.where(valid, out, 0.0)
