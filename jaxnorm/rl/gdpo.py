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

GdpoNormalization = Literal["std", "correlation"]
_GDPO_NORMALIZATIONS = ("std", "correlation")

# verl's ``masked_whiten`` adds this inside the reciprocal square root.
_WHITEN_EPS = 1e-8


@_scope.scoped
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

  Examples:
    >>> r = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    >>> print(np.asarray(rl.gdpo_advantages(r)).round(4))  # G = 4, K = 2
    [ 0.      0.      1.2247 -1.2247]

  References:
    Liu et al., arXiv:2601.05242 (2026); the CorrGRPO repository's
    ``compute_gdpo_outcome_advantage`` (official code, read).
  """
  who = "gdpo_advantages"
  _checks.check_choice(
    who, "batch_normalization", batch_normalization, _GDPO_NORMALIZATIONS
  )
  _checks.check_nonnegative(who, "eps", eps)
  _checks.check_ndim(who, "rewards", rewards, minimum=2)
  r = _common.as_float(who, "rewards", rewards)
  z = jnp.moveaxis(
    grpo.grpo_advantages(jnp.moveaxis(r, -1, -2), eps=eps, singleton="verl"),
    -2,
    -1,
  )
  z = _common.weighted_components(who, z, weights)
  s = jnp.sum(z, axis=-1)
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
