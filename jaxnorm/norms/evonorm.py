"""EvoNorm-B0 and EvoNorm-S0: normalization-activation layers."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer


class EvoNormB0State(NamedTuple):
  """Running statistic of `evo_norm_b0`.

  Attributes:
    var: running batch variance, shape ``(C,)``, initialized to 1; like
      torch (and timm) it stores the **unbiased** batch variance.
  """

  var: jax.Array


@_scope.scoped
def init_evo_norm_b0_state(
  num_features: int, dtype: jnp.dtype = jnp.float32
) -> EvoNormB0State:
  """`evo_norm_b0` state at initialization: running variance 1.

  Examples:
    >>> print(norms.init_evo_norm_b0_state(2).var)
    [1. 1.]
  """
  _checks.check_positive_int(
    "init_evo_norm_b0_state", "num_features", num_features
  )
  return EvoNormB0State(var=jnp.ones((num_features,), dtype))


@_scope.scoped
def evo_norm_b0(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  v: Float[ArrayLike, " c"] | None,
  state: EvoNormB0State,
  *,
  training: bool,
  momentum: float = 0.9,
  eps: float = 1e-3,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "n *spatial c"], EvoNormB0State]:
  r"""EvoNorm-B0: batch-dependent normalization-activation layer.

  For channels-last ``x`` (NHWC),

  .. math::
    y = \frac{x}{\max\left(\sqrt{\sigma^2_B + \epsilon},\;
        v \odot x + \sqrt{\sigma^2_I + \epsilon}\right)} \odot \gamma + \beta

  with the element-wise max, :math:`\sigma^2_B[c]` the biased variance over
  batch and spatial axes (training) or the running variance (inference),
  and :math:`\sigma^2_I[n, c]` the per-instance variance over the spatial
  axes, always from the sample. There is no mean subtraction. Training
  updates the running variance with the **unbiased** batch variance
  (torch convention, as in timm):
  :math:`\bar\sigma^2 \leftarrow m \bar\sigma^2 + (1 - m)\,\sigma^2_B
  \frac{n}{n - 1}`, ``n`` the number of values per channel (across devices
  with ``axis_name``).

  ``momentum`` follows the Flax convention (weight of the old value): the
  default 0.9 is timm's ``momentum=0.1``. With ``v=None`` (timm's
  ``apply_act=False``) the layer is only the affine map and the state is
  returned unchanged, as in timm.

  Causality on ``(batch, seq, d)``: not causal-safe in either mode, since
  :math:`\sigma^2_I` always runs over the sequence (and training's
  :math:`\sigma^2_B` over the batch too).

  Args:
    x: input ``(n, *spatial, c)`` with at least one spatial axis.
    scale: :math:`\gamma`, shape ``(c,)``, or ``None``.
    bias: :math:`\beta`, shape ``(c,)``, or ``None``.
    v: :math:`v`, shape ``(c,)`` (init 1), or ``None`` for no normalization.
    state: running variance.
    training: batch statistics and a state update when True.
    momentum: decay of the running variance (Flax convention).
    eps: added to both variances (timm default 1e-3).
    axis_name: mapped axis name(s) across which batch statistics are
      averaged (cross-device EvoNorm).

  Returns:
    ``(y, new_state)``: ``y`` with the shape and dtype of ``x``,
    ``new_state`` with the structure and dtypes of ``state``.

  Raises:
    TypeError: for non-floating input or parameters, or a bad state type.
    ValueError: for rank < 3, bad parameter or state shapes, or a training
      batch with one value per channel.

  Examples:
    >>> x = jnp.array([[[1.0], [-1.0]], [[1.0], [-1.0]]])  # (n=2, w=2, c=1)
    >>> state = norms.init_evo_norm_b0_state(1)
    >>> y, state = norms.evo_norm_b0(
    ...     x, None, None, jnp.ones(1), state, training=True, eps=0.0)
    >>> print(np.asarray(y[0, :, 0]))  # x / max(1, x + 1)
    [ 0.5 -1. ]
    >>> print(np.asarray(state.var).round(4))  # 0.9 + 0.1 * 4 / 3
    [1.0333]

  References:
    Liu, Brock, Simonyan & Le, *Evolving Normalization-Activation Layers*,
    arXiv:2004.02967 (NeurIPS 2020). Layer formula as in timm's
    ``EvoNorm2dB0``.
  """
  who = "evo_norm_b0"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=3)
  _numerics.check_channels(who, x, scale=scale, bias=bias, v=v)
  c = x.shape[-1]
  _numerics.check_state(who, state, EvoNormB0State, {"var": (c,)})
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  y, new_state = xf, state
  if v is not None:
    if training:
      n = math.prod(x.shape[:-1]) * _numerics.axis_count(axis_name)
      if n < 2:
        raise ValueError(
          f"{who}: training needs more than one value per "
          f"channel, got {x.shape=}"
        )
      _, var_b = _numerics.moments(xf, tuple(range(x.ndim - 1)), axis_name)
      new_state = EvoNormB0State(
        var=_numerics.ema(state.var, var_b * (n / (n - 1)), momentum)
      )
    else:
      var_b = _numerics.channel(state.var, x.ndim, cdt)
    _, var_i = _numerics.moments(xf, tuple(range(1, x.ndim - 1)))
    left = jnp.sqrt(var_b + eps)
    right = _numerics.channel(v, x.ndim, cdt) * xf + jnp.sqrt(var_i + eps)
    y = xf / jnp.maximum(left, right)
  return _numerics.affine(y, scale, bias).astype(x.dtype), new_state


EvoNormS0Variant = Literal["s0", "s0a"]


@_scope.scoped
def evo_norm_s0(
  x: Float[ArrayLike, "n *spatial c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  v: Float[ArrayLike, " c"] | None,
  *,
  num_groups: int | None = 32,
  group_size: int | None = None,
  eps: float = 1e-5,
  variant: EvoNormS0Variant = "s0",
  reduction_axes: layer.Axis | None = None,
) -> Float[Array, "n *spatial c"]:
  r"""EvoNorm-S0: sample-based normalization-activation layer (stateless).

  .. math::
    y = \frac{x \odot \mathrm{sigmoid}(v \odot x)}
             {\sqrt{\sigma^2_G + \epsilon}} \odot \gamma + \beta

  with :math:`\sigma^2_G[n, g]` the biased variance per example over the
  spatial axes and the channels of group ``g`` (the default
  ``reduction_axes=None``: every axis but 0). No mean subtraction;
  training and inference are the same. ``reduction_axes`` names the
  statistics axes explicitly as in `jaxnorm.norms.group_norm` (it must
  include the channel axis ``-1``).

  Causality on ``(batch, seq, d)``: the default takes the group variance
  over the whole sequence (not causal-safe); ``reduction_axes=-1`` takes it
  per token over the group's channels (causal-safe). The numerator is
  element-wise either way.

  timm quirks kept: with ``v=None`` (``apply_act=False``) variant ``"s0"``
  is only the affine map; ``"s0a"`` (timm ``EvoNorm2dS0a``, whose default
  ``eps`` is 1e-3) always divides by the group std, with or without ``v``.

  Args:
    x: input ``(n, *spatial, c)`` with at least one spatial axis for the
      default ``reduction_axes``.
    scale: :math:`\gamma`, shape ``(c,)``, or ``None``.
    bias: :math:`\beta`, shape ``(c,)``, or ``None``.
    v: :math:`v`, shape ``(c,)`` (init 1), or ``None``.
    num_groups: number of channel groups; give exactly one of this and
      ``group_size``.
    group_size: channels per group.
    eps: added to the group variance (timm: 1e-5 for S0, 1e-3 for S0a).
    variant: ``"s0"`` or ``"s0a"``.
    reduction_axes: axes of the group variance, containing ``-1``;
      ``None`` means every axis but 0.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a rank below 3 (default) or 1, ``reduction_axes``
      without the channel axis, a bad group configuration, parameter shape
      or variant.

  Examples:
    >>> x = jnp.array([[[1.0], [-1.0]]])  # (n=1, w=2, c=1)
    >>> y = norms.evo_norm_s0(x, None, None, jnp.ones(1), num_groups=1)
    >>> print(np.asarray(y[0, :, 0]).round(4))  # x sigmoid(x) / std(x)
    [ 0.7311 -0.2689]

  References:
    Liu, Brock, Simonyan & Le, *Evolving Normalization-Activation Layers*,
    arXiv:2004.02967 (NeurIPS 2020). Layer formula as in timm's
    ``EvoNorm2dS0`` / ``EvoNorm2dS0a``.
  """
  who = "evo_norm_s0"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "variant", variant, ("s0", "s0a"))
  x = jnp.asarray(x)
  axes = _numerics.group_reduction_axes(who, reduction_axes, x, min_rank=3)
  groups = _numerics.resolve_groups(
    who, "x.shape[-1]", x.shape[-1], num_groups, group_size
  )
  _numerics.check_channels(who, x, scale=scale, bias=bias, v=v)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  y = xf
  if v is not None:
    y = xf * jax.nn.sigmoid(_numerics.channel(v, x.ndim, cdt) * xf)
  if v is not None or variant == "s0a":
    _, var = _numerics.group_moments(xf, groups, axes)
    y = y * jax.lax.rsqrt(var + eps)
  return _numerics.affine(y, scale, bias).astype(x.dtype)
