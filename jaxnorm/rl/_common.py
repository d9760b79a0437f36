"""What the RL papers share: input casts, component sums, token statistics.

`token_entropy` (the one verifiable ingredient of ERPO) and `kl_k3`
(Schulman's estimator, GRPO's KL penalty) are public through `jaxnorm.rl`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, _scope


def as_float(who: str, name: str, x: ArrayLike) -> jax.Array:
  x = jnp.asarray(x)
  _checks.check_floating(who, name, x)
  return x.astype(_numerics.compute_dtype(x))


def weighted_components(
  who: str, rewards: ArrayLike, weights: ArrayLike | None
) -> jax.Array:
  _checks.check_ndim(who, "rewards", rewards, minimum=2)
  r = as_float(who, "rewards", rewards)
  if weights is None:
    return r
  _checks.check_shape(
    who, "weights", weights, (r.shape[-1],), "one weight per component K"
  )
  w = as_float(who, "weights", weights).astype(r.dtype)
  return r * w.reshape((1,) * (r.ndim - 1) + w.shape)


def correlation_sum(centred: jax.Array, axis: int) -> jax.Array:
  """``max(sum_kl corr_kl, 0)`` of centred components (rows along axis)."""
  c = jnp.moveaxis(centred, axis, -2)
  cross = jnp.einsum("...ik,...il->...kl", c, c)
  sq = jnp.diagonal(cross, axis1=-2, axis2=-1)
  inv = jnp.where(sq > 0, jax.lax.rsqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
  corr = cross * inv[..., :, None] * inv[..., None, :]
  return jnp.maximum(jnp.sum(corr, axis=(-2, -1)), 0.0)


@_scope.scoped
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

  Examples:
    >>> p = jnp.array([[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    >>> print(np.asarray(rl.token_entropy(jnp.log(p))).round(4))  # log 4, log 2
    [1.3863 0.6931]

  References:
    ERPO, arXiv:2603.28204 (2026), abstract only.
  """
  who = "token_entropy"
  _checks.check_ndim(who, "logits", logits, minimum=1)
  z = as_float(who, "logits", logits)
  logp = jax.nn.log_softmax(z, axis=-1)
  p = jnp.exp(logp)
  h = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
  if mask is None:
    return h
  _checks.check_shape(who, "mask", mask, h.shape, "logits.shape[:-1]")
  return jnp.where(jnp.asarray(mask, bool), h, 0.0)


@_scope.scoped
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

  Examples:
    >>> logp = jnp.log(jnp.array([0.5, 0.5]))
    >>> ref_logp = jnp.log(jnp.array([0.5, 1.0]))
    >>> k3 = rl.kl_k3(logp, ref_logp)
    >>> print(np.asarray(k3).round(4))  # e^u - u - 1 with u = log(ref / p)
    [0.     0.3069]

  References:
    Shao et al., arXiv:2402.03300 (2024), eq. 4.
  """
  who = "kl_k3"
  _checks.check_shape(who, "ref_logp", ref_logp, jnp.shape(logp))
  a = as_float(who, "logp", logp)
  d = as_float(who, "ref_logp", ref_logp).astype(a.dtype) - a
  return jnp.exp(d) - d - 1.0
