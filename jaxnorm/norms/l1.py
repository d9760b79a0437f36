"""L1 normalization: the mean absolute deviation replaces the std."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer

L1_KAPPA = math.sqrt(math.pi / 2)


def _l1_denominator(
  s1: jax.Array, kappa: float, eps: float, eps_mode: str
) -> jax.Array:
  if eps_mode == "outside":
    return kappa * s1 + eps
  return jnp.sqrt(jnp.square(kappa * s1) + eps)


def _l1_moments(
  xf: jax.Array, axes: tuple[int, ...], axis_name: _numerics.AxisName = None
) -> tuple[jax.Array, jax.Array]:
  """Mean and mean absolute deviation over ``axes`` (keepdims), two-pass."""
  mu = _numerics.pmean(jnp.mean(xf, axis=axes, keepdims=True), axis_name)
  s1 = jnp.mean(jnp.abs(xf - mu), axis=axes, keepdims=True)
  return mu, _numerics.pmean(s1, axis_name)


@_scope.scoped
def l1_layer_norm(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-5,
  axis: layer.Axis = -1,
  kappa: float = L1_KAPPA,
  eps_mode: layer.EpsMode = "outside",
) -> Float[Array, "..."]:
  r"""L1 layer normalization: the mean absolute deviation replaces the std.

  .. math::
    \mu = \mathrm{mean}_{axis}(x),\quad
    s_1 = \mathrm{mean}_{axis}(|x - \mu|),\quad
    y = \gamma \odot \frac{x - \mu}{\kappa s_1 + \epsilon} + \beta

  :math:`\kappa = \sqrt{\pi/2}` makes :math:`\kappa s_1 \approx \sigma` for
  Gaussian data. ``eps_mode="inside"`` uses
  :math:`\sqrt{(\kappa s_1)^2 + \epsilon}` instead.

  Unverified: the paper's exact layer (constants, ``kappa``, where ``eps``
  sits) could not be read (abstract only, no code); this is the standard
  L1 norm of Hoffer et al., *Norm matters*, arXiv:1803.01814 (2018).
  Gradients are plain autodiff (:math:`d|u|/du = \mathrm{sign}(u)`).

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input of any rank.
    scale: gain over ``axis`` or ``None``.
    bias: offset over ``axis`` or ``None``.
    eps: stabilizer, placed according to ``eps_mode``.
    axis: axis or axes to normalize over.
    kappa: :math:`\kappa`.
    eps_mode: ``"outside"`` (default) or ``"inside"``.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or ``eps_mode``.

  Examples:
    >>> y = norms.l1_layer_norm(jnp.array([1.0, 3.0]), kappa=1.0, eps=0.0)
    >>> print(np.asarray(y))  # (x - 2) / mean|x - 2|
    [-1.  1.]

  References:
    Guo et al., *Towards Accurate and Efficient Sub-8-Bit Integer Training*,
    arXiv:2411.10948 (2024).
  """
  who = "l1_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, layer.EPS_MODES)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  _numerics.check_param(who, "scale", scale, x, axes)
  _numerics.check_param(who, "bias", bias, x, axes)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  mu, s1 = _l1_moments(xf, axes)
  y = (xf - mu) / _l1_denominator(s1, kappa, eps, eps_mode)
  return _numerics.affine(y, scale, bias, axes).astype(x.dtype)


class L1BatchNormState(NamedTuple):
  """Running statistics of `l1_batch_norm`.

  Attributes:
    mean: running mean, ``(C,)``, init 0.
    dev: running ``kappa * s1`` (the L1 estimate of the std), ``(C,)``,
      init 1.
  """

  mean: jax.Array
  dev: jax.Array


@_scope.scoped
def init_l1_batch_norm_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> L1BatchNormState:
  """`l1_batch_norm` state at initialization: mean 0, deviation 1.

  Examples:
    >>> state = norms.init_l1_batch_norm_state(2)
    >>> print(state.mean, state.dev)
    [0. 0.] [1. 1.]
  """
  _checks.check_positive_int(
    "init_l1_batch_norm_state", "num_features", num_features
  )
  return L1BatchNormState(
    mean=jnp.zeros((num_features,), dtype), dev=jnp.ones((num_features,), dtype)
  )


@_scope.scoped
def l1_batch_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: L1BatchNormState,
  *,
  training: bool,
  momentum: float = 0.99,
  eps: float = 1e-5,
  kappa: float = L1_KAPPA,
  eps_mode: layer.EpsMode = "outside",
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], L1BatchNormState]:
  r"""L1 batch normalization with running statistics (features last).

  Training uses the batch :math:`\mu` and :math:`d = \kappa\,
  \mathrm{mean}(|x - \mu|)` over every axis but the last, normalizes
  :math:`y = \gamma (x - \mu)/(d + \epsilon) + \beta` and updates
  :math:`\bar\mu \leftarrow m\bar\mu + (1-m)\mu`,
  :math:`\bar d \leftarrow m\bar d + (1-m)d` (Flax momentum convention);
  inference uses the running values. ``eps_mode="inside"`` uses
  :math:`\sqrt{d^2 + \epsilon}`. Unverified details as in `l1_layer_norm`.
  A training batch with no elements per channel (a static fact of the
  shape) returns an empty output and leaves the state unchanged.

  Causality on ``(batch, seq, d)``: training statistics mix every position
  (not causal-safe); inference (running statistics) is per token.

  Args:
    x: input ``(..., c)``.
    scale: per-channel gain or ``None``.
    bias: per-channel offset or ``None``.
    state: running statistics.
    training: batch statistics and a state update when True.
    momentum: decay of the running statistics.
    eps: stabilizer.
    kappa: :math:`\kappa`.
    eps_mode: ``"outside"`` or ``"inside"``.
    axis_name: mapped axis name(s) for cross-device batch statistics.

  Returns:
    ``(y, new_state)``.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 2, bad shapes or ``eps_mode``.

  Examples:
    >>> x = jnp.array([[1.0], [3.0]])
    >>> state = norms.init_l1_batch_norm_state(1)
    >>> y, state = norms.l1_batch_norm(
    ...     x, None, None, state, training=True, kappa=1.0, eps=0.0)
    >>> print(np.asarray(y[:, 0]), np.asarray(state.mean).round(4))
    [-1.  1.] [0.02]

  References:
    Guo et al., *Towards Accurate and Efficient Sub-8-Bit Integer Training*,
    arXiv:2411.10948 (2024); Hoffer et al., *Norm matters*,
    arXiv:1803.01814 (2018).
  """
  who = "l1_batch_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "eps_mode", eps_mode, layer.EPS_MODES)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  _numerics.check_state(
    who, state, L1BatchNormState, {"mean": (c,), "dev": (c,)}
  )
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  axes = tuple(range(x.ndim - 1))
  if training and not _numerics.is_empty(x, axes):
    mu, s1 = _l1_moments(xf, axes, axis_name)
    dev = kappa * s1
    new_state = L1BatchNormState(
      mean=_numerics.ema(state.mean, mu, momentum),
      dev=_numerics.ema(state.dev, jax.lax.stop_gradient(dev), momentum),
    )
  else:
    mu = _numerics.channel(state.mean, x.ndim, cdt)
    dev = _numerics.channel(state.dev, x.ndim, cdt)
    new_state = state
  y = (xf - mu) / _l1_denominator(dev, 1.0, eps, eps_mode)
  return _numerics.affine(y, scale, bias).astype(x.dtype), new_state
