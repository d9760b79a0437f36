"""Gecko's timestep-decay normalization: causal, decayed group statistics."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope


class TimestepDecayNormState(NamedTuple):
  """Carried statistics of `timestep_decay_norm`, per sequence and group.

  Attributes:
    count: tokens accumulated since the last reset, int32 ``(B,)``.
    mean: decayed mean accumulator ``M``, ``(B, G)``.
    var: decayed variance accumulator ``V``, ``(B, G)``.
  """

  count: jax.Array
  mean: jax.Array
  var: jax.Array


@_scope.scoped
def init_timestep_decay_norm_state(
  batch_size: int, num_groups: int = 64, dtype: jnp.dtype = jnp.float32
) -> TimestepDecayNormState:
  """The empty `timestep_decay_norm` state: ``n = M = V = 0``.

  Examples:
    >>> state = norms.init_timestep_decay_norm_state(2, num_groups=4)
    >>> print(state.count, state.mean.shape, state.var.shape)
    [0 0] (2, 4) (2, 4)
  """
  who = "init_timestep_decay_norm_state"
  _checks.check_positive_int(who, "batch_size", batch_size)
  _checks.check_positive_int(who, "num_groups", num_groups)
  return TimestepDecayNormState(
    count=jnp.zeros((batch_size,), jnp.int32),
    mean=jnp.zeros((batch_size, num_groups), dtype),
    var=jnp.zeros((batch_size, num_groups), dtype),
  )


def _affine_scan(a: jax.Array, b: jax.Array, h0: jax.Array) -> jax.Array:
  """``h_t = a_t h_{t-1} + b_t`` along axis 1, from ``h0`` (prefix scan)."""

  def combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2

  big_a, big_b = jax.lax.associative_scan(combine, (a, b), axis=1)
  return big_a * jnp.expand_dims(h0, 1) + big_b


@_scope.scoped
def timestep_decay_norm(
  x: Float[ArrayLike, "b l d"],
  scale: Float[ArrayLike, " d"] | None = None,
  bias: Float[ArrayLike, " d"] | None = None,
  state: TimestepDecayNormState | None = None,
  *,
  num_groups: int = 64,
  beta1: float = 0.999,
  beta2: float = 0.9999,
  eps: float = 1e-5,
  padding_mask: ArrayLike | None = None,
  bos_mask: ArrayLike | None = None,
) -> tuple[Float[Array, "b l d"], TimestepDecayNormState]:
  r"""Gecko's timestep-decay normalization: causal, decayed group stats.

  For token ``t`` and group ``g``, :math:`u_t` and :math:`v_t` are the mean
  and biased variance over the group's ``D/G`` channels. From the carried
  state ``(n, M, V)``:
  :math:`n \leftarrow n + 1`, :math:`M \leftarrow \beta_1 M +
  (1-\beta_1)u_t`, :math:`V \leftarrow \beta_2 V + (1-\beta_2)v_t`, then

  .. math::
    \hat\mu_t = \frac{M}{1-\beta_1^n},\quad
    \hat\sigma^2_t = \frac{V}{1-\beta_2^n},\quad
    y_t = \frac{x_t - \hat\mu_t}{\sqrt{\hat\sigma^2_t + \epsilon}}
          \odot (1 + w) + b

  ``V`` averages within-token group variances (not the spread of the means
  over time). Pad tokens (``padding_mask`` True) leave the state unchanged
  and output 0. At a BOS token (``bos_mask`` True) the state resets to
  empty before the update, so that token gets :math:`\hat\mu = u_t,
  \hat\sigma^2 = v_t`. Unverified: the official CUDA combine appears to
  store the unweighted :math:`(u_t, v_t)` at a BOS; we follow the spec's
  reset-then-update reading. The recurrence is evaluated with a parallel
  prefix scan; gradients flow through the statistics into ``x`` and the
  incoming state. No train/eval difference.

  Causal-safe on ``(batch, seq, d)``: token ``t`` reads only tokens
  ``<= t`` of its own sequence (and the carried state).

  Args:
    x: input ``(B, L, D)``.
    scale: :math:`w` (used as ``1 + w``, init 0), ``(D,)``, or ``None``.
    bias: :math:`b` (init 0), ``(D,)``, or ``None``.
    state: carried `TimestepDecayNormState` or ``None`` (empty).
    num_groups: ``G``; ``D % G == 0`` and ``G < D``.
    beta1: decay of the mean accumulator.
    beta2: decay of the variance accumulator.
    eps: added to :math:`\hat\sigma^2`.
    padding_mask: boolean ``(B, L)``, True at pads.
    bos_mask: boolean ``(B, L)``, True where a new document starts.

  Returns:
    ``(y, new_state)``: ``y`` like ``x``; the state after the last token,
    to carry into the next segment (streaming).

  Raises:
    TypeError: for non-floating input or parameters, non-boolean masks or a
      bad state type.
    ValueError: for bad shapes or group counts.

  Examples:
    >>> x = jnp.array([[[1.0, 3.0], [2.0, 6.0]]])  # (b=1, l=2, d=2)
    >>> y, state = norms.timestep_decay_norm(
    ...     x, num_groups=1, beta1=0.5, beta2=0.5)
    >>> print(np.asarray(y[0]).round(4))  # token 2: mean 2.5 / 0.75, var 3
    [[-1.      1.    ]
     [-0.7698  1.5396]]
    >>> print(state.count)
    [2]

  References:
    Ma et al., *Gecko: An Efficient Neural Architecture Inherently
    Processing Sequences with Arbitrary Lengths*, arXiv:2601.06463 (2026);
    code ``XuezheMax/gecko-llm``.
  """
  who = "timestep_decay_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=3)
  bsz, length, d = x.shape
  _checks.check_positive_int(who, "num_groups", num_groups)
  _checks.check_divisible(who, "x.shape[-1]", d, "num_groups", num_groups)
  if num_groups >= d:
    raise ValueError(
      f"{who}: num_groups must be < x.shape[-1]={d} (at "
      f"least two channels per group), got {num_groups=}"
    )
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  masks = []
  for name, mk in (("padding_mask", padding_mask), ("bos_mask", bos_mask)):
    if mk is None:
      masks.append(jnp.zeros((bsz, length, 1), bool))
      continue
    if jnp.result_type(mk) != jnp.bool_:
      raise TypeError(
        f"{who}: {name} must be boolean, got {name}.dtype={jnp.result_type(mk)}"
      )
    _checks.check_shape(who, name, mk, (bsz, length), "x.shape[:2]")
    masks.append(jnp.asarray(mk).reshape(bsz, length, 1))
  pad, bos = masks
  cdt = _numerics.compute_dtype(x)
  if state is None:
    state = init_timestep_decay_norm_state(bsz, num_groups, cdt)
  _numerics.check_state(
    who,
    state,
    TimestepDecayNormState,
    {"count": (bsz,), "mean": (bsz, num_groups), "var": (bsz, num_groups)},
  )
  xf = x.astype(cdt)
  xg = xf.reshape(bsz, length, num_groups, d // num_groups)
  u, v = _numerics.moments(xg, (3,))
  u, v = u.reshape(bsz, length, num_groups), v.reshape(bsz, length, num_groups)
  keep = jnp.logical_not(pad).astype(cdt)
  reset = jnp.logical_and(bos, jnp.logical_not(pad)).astype(cdt)

  def decay(beta, val, h0):
    a = keep * (1 - reset) * beta + (1 - keep)
    return _affine_scan(
      jnp.broadcast_to(a, val.shape), keep * (1 - beta) * val, h0
    )

  m = decay(beta1, u, state.mean.astype(cdt))
  vv = decay(beta2, v, state.var.astype(cdt))
  n = _affine_scan(
    keep * (1 - reset) + (1 - keep),
    keep,
    state.count.astype(cdt).reshape(bsz, 1),
  )
  live = n > 0
  safe_n = jnp.where(live, n, 1.0)
  corr1 = -jnp.expm1(safe_n * math.log(beta1))
  corr2 = -jnp.expm1(safe_n * math.log(beta2))
  mu = (m / corr1).reshape(bsz, length, num_groups, 1)
  var = (vv / corr2).reshape(bsz, length, num_groups, 1)
  y = ((xg - mu) * jax.lax.rsqrt(var + eps)).reshape(x.shape)
  # The gain is ``1 + w``; without ``w`` there is no gain at all.
  offset = 0.0 if scale is None else 1.0
  y = _numerics.affine(y, scale, bias, scale_offset=offset) * keep
  new_state = TimestepDecayNormState(
    count=n[:, -1, 0].astype(state.count.dtype),
    mean=m[:, -1].astype(state.mean.dtype),
    var=vv[:, -1].astype(state.var.dtype),
  )
  return y.astype(x.dtype), new_state
