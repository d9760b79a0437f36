r"""CorrGRPO: the centred total reward over its summed correlations.

CorrGRPO divides the centred total of ``K`` reward components by the square
root of the sum of their correlations.

References:
  HKUST-KnowComp, *CorrGRPO* (official code, ``verl/trainer/ppo/
  core_algos.py``; arXiv id not confirmed).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _scope
from jaxnorm.rl import _common


@_scope.scoped
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

  Examples:
    >>> r = jnp.array([[1.0, 1.0], [0.0, 0.0]])  # G = 2, K = 2 equal parts
    >>> print(np.asarray(rl.corrgrpo_advantages(r)).round(4))  # +-1 / sqrt(4)
    [ 0.5 -0.5]

  References:
    HKUST-KnowComp, *CorrGRPO*, ``grpo_covariance_coefficient`` in
    ``verl/trainer/ppo/core_algos.py`` (official code, read).
  """
  who = "corrgrpo_advantages"
  _checks.check_nonnegative(who, "eps", eps)
  r = _common.weighted_components(who, rewards, weights)
  centred = r - jnp.mean(r, axis=-2, keepdims=True)
  total = jnp.sum(centred, axis=-1)
  if not normalize:
    return total
  # The covariance divisor G - 1 cancels in the correlations; G == 1 has
  # zero centred rows and therefore a zero sum.
  return total / jnp.sqrt(_common.correlation_sum(centred, -2)[..., None] + eps)
