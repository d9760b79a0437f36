"""UnMix-TNS: test-time normalization with un-mixed statistics."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope


class UnMixTNSState(NamedTuple):
  r"""The ``K`` statistic components of `unmix_tns`.

  Attributes:
    mean: component means :math:`\mu_k`, ``(K, C)``.
    var: component variances :math:`\sigma^2_k`, ``(K, C)``.
  """

  mean: jax.Array
  var: jax.Array


@_scope.scoped
def init_unmix_tns_state(
  mean: Float[ArrayLike, " c"],
  var: Float[ArrayLike, " c"],
  key: jax.Array,
  *,
  num_components: int = 16,
  spread: float = 0.5,
  dtype: jnp.dtype = jnp.float32,
) -> UnMixTNSState:
  r"""UnMix-TNS components from a trained BatchNorm's running statistics.

  For ``K > 1``: :math:`\mu_k = \mu_s + \sqrt{cK/(K-1)}\,\sigma_s \odot
  \xi_k`, :math:`\xi_k \sim N(0, I)`, and :math:`\sigma^2_k =
  (1-c)\sigma^2_s` (``c = spread``), so the mixture of the components has
  the source statistics on average. ``K = 1`` copies the source statistics.

  Args:
    mean: BN running mean :math:`\mu_s`, ``(c,)``.
    var: BN running variance :math:`\sigma^2_s`, ``(c,)``.
    key: PRNG key of the noise :math:`\xi`.
    num_components: ``K`` (16 for single/continual shifts, 128 for mixed).
    spread: ``c`` in ``[0, 1)``.
    dtype: state dtype.

  Returns:
    `UnMixTNSState` with ``(K, c)`` fields.

  Raises:
    TypeError: for non-floating statistics.
    ValueError: for a bad ``num_components`` or mismatched shapes.

  Examples:
    >>> state = norms.init_unmix_tns_state(
    ...     jnp.zeros(2), jnp.ones(2), jax.random.key(0), num_components=4)
    >>> print(state.mean.shape, np.asarray(state.var).round(4)[0])
    (4, 2) [0.5 0.5]

  References:
    Tomar, Vray, Thiran & Bozorgtabar, *Un-Mixing Test-Time Normalization
    Statistics: Combatting Label Temporal Correlation*, ICLR 2024.
  """
  who = "init_unmix_tns_state"
  _checks.check_positive_int(who, "num_components", num_components)
  _checks.check_floating(who, "mean", mean)
  _checks.check_floating(who, "var", var)
  _checks.check_ndim(who, "mean", mean, expected=1)
  _checks.check_shape(who, "var", var, jnp.shape(mean), "mean.shape")
  mu = jnp.asarray(mean, jnp.float32)
  sigma2 = jnp.asarray(var, jnp.float32)
  k, c = num_components, mu.shape[0]
  if k == 1:
    return UnMixTNSState(
      mu.reshape(1, c).astype(dtype), sigma2.reshape(1, c).astype(dtype)
    )
  noise = jax.random.normal(key, (k, c), jnp.float32)
  means = (
    mu.reshape(1, c)
    + math.sqrt(spread * k / (k - 1)) * jnp.sqrt(sigma2).reshape(1, c) * noise
  )
  variances = jnp.broadcast_to((1 - spread) * sigma2.reshape(1, c), (k, c))
  return UnMixTNSState(means.astype(dtype), variances.astype(dtype))


@_scope.scoped
def unmix_tns_momentum(
  batch_size: int, *, max_batch_size: int = 64, bn_momentum: float = 0.1
) -> float:
  r"""UnMix-TNS update rate :math:`M = 1 - (1 - m)^{B/B_{max}}`.

  ``bn_momentum`` is torch's (weight of the new batch; Flax's momentum
  ``0.9`` is torch's 0.1). ``max_batch_size`` is 64 (CIFAR) or 16
  (ImageNet).

  Raises:
    ValueError: for non-positive batch sizes.

  Examples:
    >>> print(round(norms.unmix_tns_momentum(64), 4))  # batch 64: bn_momentum
    0.1
    >>> print(round(norms.unmix_tns_momentum(16), 4))  # 1 - 0.9 ** (16 / 64)
    0.026
  """
  who = "unmix_tns_momentum"
  _checks.check_positive_int(who, "batch_size", batch_size)
  _checks.check_positive_int(who, "max_batch_size", max_batch_size)
  return 1.0 - (1.0 - bn_momentum) ** (batch_size / max_batch_size)


@_scope.scoped
def unmix_tns(
  x: Float[ArrayLike, "b *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: UnMixTNSState,
  *,
  momentum: float | None = None,
  temperature: float = 0.07,
  eps: float = 1e-5,
  update: bool = True,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "b *spatial c"], UnMixTNSState]:
  r"""UnMix-TNS: test-time normalization with ``K`` un-mixed components.

  For a batch ``x`` with instance statistics :math:`\tilde\mu_b,
  \tilde\sigma^2_b` (over the spatial axes, biased):

  1. :math:`p_{bk} = \mathrm{softmax}_k(\cos(\tilde\mu_b, \mu_k)/\tau)`,
     without gradient;
  2. :math:`m_{bk} = (1-p_{bk})\mu_k + p_{bk}\tilde\mu_b`,
     :math:`v_{bk} = (1-p_{bk})\sigma^2_k + p_{bk}\tilde\sigma^2_b`;
  3. :math:`\mu_b = \mathrm{mean}_k m_{bk}`, :math:`\sigma^2_b =
     \mathrm{mean}_k v_{bk} + \mathrm{mean}_k m_{bk}^2 - \mu_b^2`;
  4. :math:`y = \gamma (x - \mu_b)/\sqrt{\sigma^2_b + \epsilon} + \beta`;
  5. with ``update``, without gradient and from the old components:
     :math:`\mu_k \mathrel{+}= M\,\mathrm{mean}_b(p_{bk}(\tilde\mu_b -
     \mu_k))`, :math:`\sigma^2_k \mathrel{+}= M\,\mathrm{mean}_b(p_{bk}
     (\tilde\sigma^2_b - \sigma^2_k))` (not normalized by
     :math:`\sum_b p_{bk}`).

  Gradients flow into ``x`` through the instance statistics (for TENT-like
  adaptation), not through ``p``. There is no train/eval distinction.
  The cosine similarity is :math:`a\cdot b/\max(\|a\|\|b\|, 10^{-8})`
  (torch's ``cosine_similarity`` eps). An empty batch (a static fact of the
  shape) returns an empty output and leaves the components unchanged.

  Causality on ``(batch, seq, d)``: the instance statistics run over the
  sequence, so it is not causal-safe.

  Args:
    x: input ``(b, *spatial, c)`` with at least one spatial axis.
    scale: :math:`\gamma` (the replaced BN's scale) or ``None``.
    bias: :math:`\beta` (the replaced BN's bias) or ``None``.
    state: the components.
    momentum: :math:`M`; ``None`` uses `unmix_tns_momentum` of the (global)
      batch size with its defaults.
    temperature: :math:`\tau`.
    eps: the replaced BN's eps.
    update: apply step 5.
    axis_name: mapped axis name(s): the component update averages over the
      global batch.

  Returns:
    ``(y, new_state)``; ``y`` like ``x``, the state keeps its dtypes.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 3 or bad shapes.

  Examples:
    >>> state = norms.init_unmix_tns_state(
    ...     jnp.zeros(1), jnp.ones(1), jax.random.key(0), num_components=1)
    >>> x = jnp.array([[[4.0], [6.0]]])  # (b=1, w=2, c=1), mean 5, var 1
    >>> y, state = norms.unmix_tns(x, None, None, state, eps=0.0)
    >>> print(np.asarray(y[0, :, 0]).round(4))
    [-1.  1.]

  References:
    Tomar, Vray, Thiran & Bozorgtabar, *Un-Mixing Test-Time Normalization
    Statistics: Combatting Label Temporal Correlation*, ICLR 2024
    (OpenReview xyxU99Nutg); code ``devavratTomar/unmixtns``.
  """
  who = "unmix_tns"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  c = x.shape[-1]
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  _numerics.check_state(who, state, UnMixTNSState, {})
  k = state.mean.shape[0] if state.mean.ndim == 2 else -1
  _numerics.check_state(
    who, state, UnMixTNSState, {"mean": (k, c), "var": (k, c)}
  )
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  b = x.shape[0]
  inst_mean, inst_var = _numerics.moments(xf, tuple(range(1, x.ndim - 1)))
  mu_t, var_t = inst_mean.reshape(b, c), inst_var.reshape(b, c)
  mu_k, var_k = state.mean.astype(cdt), state.var.astype(cdt)
  mu_sg = jax.lax.stop_gradient(mu_t)
  dots = mu_sg @ mu_k.T
  norms_ = jnp.linalg.norm(mu_sg, axis=-1).reshape(b, 1) * jnp.linalg.norm(
    mu_k, axis=-1
  ).reshape(1, k)
  p = jax.nn.softmax(dots / jnp.maximum(norms_, 1e-8) / temperature, axis=-1)
  p = jax.lax.stop_gradient(p).reshape(b, k, 1)
  m = (1 - p) * mu_k.reshape(1, k, c) + p * mu_t.reshape(b, 1, c)
  v = (1 - p) * var_k.reshape(1, k, c) + p * var_t.reshape(b, 1, c)
  mu_b = jnp.mean(m, axis=1)
  # mean_k(m^2) - mu_b^2, written two-pass (no cancellation).
  var_b = jnp.mean(v, axis=1) + jnp.mean(
    jnp.square(m - mu_b.reshape(b, 1, c)), axis=1
  )
  shape = (b,) + (1,) * (x.ndim - 2) + (c,)
  y = (xf - mu_b.reshape(shape)) * jax.lax.rsqrt(var_b.reshape(shape) + eps)
  y = _numerics.affine(y, scale, bias)
  new_state = state
  if update and not _numerics.is_empty(x, range(x.ndim - 1)):
    if momentum is None:
      momentum = unmix_tns_momentum(b * _numerics.axis_count(axis_name))
    mu_d = jax.lax.stop_gradient(mu_t).reshape(b, 1, c) - mu_k.reshape(1, k, c)
    var_d = jax.lax.stop_gradient(var_t).reshape(b, 1, c) - var_k.reshape(
      1, k, c
    )
    new_state = UnMixTNSState(
      mean=(
        mu_k + momentum * _numerics.pmean(jnp.mean(p * mu_d, axis=0), axis_name)
      ).astype(state.mean.dtype),
      var=(
        var_k
        + momentum * _numerics.pmean(jnp.mean(p * var_d, axis=0), axis_name)
      ).astype(state.var.dtype),
    )
  return y.astype(x.dtype), new_state
