"""Unified Normalization (UN): smoothed batch statistics for Transformers.

Like PowerNorm, UN's backward pass updates state of its own; see
`jaxnorm.norms.powernorm` for how that state travels through a
`jax.custom_vjp`.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope


class UnifiedNormState(NamedTuple):
  r"""State of `unified_norm`.

  Attributes:
    count: training steps taken, int32 scalar.
    skip_count: steps skipped by outlier filtration, int32 scalar.
    running_var: running statistic :math:`\Phi`, ``(C,)``, init 1.
    grad_ema: EMA of the gradient statistic, ``(C,)``, init 0 (backward).
    buf_x2: window of forward statistics, ``(W_f, C)``, init 0.
    buf_gz: window of gradient statistics, ``(W_b, C)``, init 0 (backward).
  """

  count: jax.Array
  skip_count: jax.Array
  running_var: jax.Array
  grad_ema: jax.Array
  buf_x2: jax.Array
  buf_gz: jax.Array


@_scope.scoped
def init_unified_norm_state(
  num_features: int,
  window_size: int | tuple[int, int] = 4,
  dtype: jnp.dtype = jnp.float32,
) -> UnifiedNormState:
  """`unified_norm` state at initialization.

  Args:
    num_features: channels ``C``.
    window_size: ``W`` for both windows, or ``(W_f, W_b)``.
    dtype: dtype of the float fields.

  Returns:
    The state (counters 0, ``running_var`` 1, everything else 0).

  Raises:
    ValueError: for a non-positive size or a malformed ``window_size``.

  Examples:
    >>> state = norms.init_unified_norm_state(3, window_size=(4, 2))
    >>> print(state.running_var, state.buf_x2.shape, state.buf_gz.shape)
    [1. 1. 1.] (4, 3) (2, 3)
  """
  who = "init_unified_norm_state"
  _checks.check_positive_int(who, "num_features", num_features)
  if isinstance(window_size, (tuple, list)):
    if len(window_size) != 2:
      raise ValueError(
        f"{who}: window_size must be an int or a pair "
        f"(W_f, W_b), got {window_size=}"
      )
    w_f, w_b = window_size
  else:
    w_f = w_b = window_size
  _checks.check_positive_int(who, "window_size", w_f)
  _checks.check_positive_int(who, "window_size", w_b)
  zero = jnp.zeros((), jnp.int32)
  return UnifiedNormState(
    count=zero,
    skip_count=zero,
    running_var=jnp.ones((num_features,), dtype),
    grad_ema=jnp.zeros((num_features,), dtype),
    buf_x2=jnp.zeros((w_f, num_features), dtype),
    buf_gz=jnp.zeros((w_b, num_features), dtype),
  )


@_scope.scoped
def unified_norm(
  x: Float[ArrayLike, "... c"],
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  state: UnifiedNormState,
  *,
  training: bool,
  pad_mask: ArrayLike | None = None,
  warmup_iters: int = 4000,
  eps: float = 1e-5,
  momentum: float = 0.9,
  outlier_filtration: bool = False,
  axis_name: str | tuple[str, ...] | None = None,
) -> tuple[Float[Array, "... c"], UnifiedNormState]:
  r"""Unified Normalization (UN): smoothed batch statistics for Transformers.

  Follows the official code (``hikvision-research/Unified-Normalization``,
  ``UN1d``/``UN2dFunction``); the window sizes ``W_f, W_b`` are the first
  dimensions of ``state.buf_x2`` and ``state.buf_gz``. Training, with ``t``
  incremented first and :math:`\psi^2_B` the mean of :math:`x^2` over
  non-pad positions:

  1. ``r_var``: unbiased variance of all entries of
     :math:`\sqrt{\mathrm{buf\_x2}}` (before the insertion), then
     ``buf_x2[t % W_f] = psi2``.
  2. Adaptive outlier filtration (``outlier_filtration`` and
     ``t >= warmup_iters``): with the window's arithmetic mean ``AM`` and
     geometric mean ``GM``, if any channel has ``AM - GM > r_var * W_f``
     the step is skipped: ``buf_x2[t % W_f] = running_var`` and
     ``skip_count += 1``. ``W_f <= 1`` always skips.
  3. Fluctuation smoothing: :math:`\sigma^2 = \psi^2_B` if ``t <= W_f``,
     ``t < warmup_iters`` or skipped, else the window's geometric mean.
  4. Gradient compensation :math:`r = \sqrt{\sigma^2+\epsilon}/
     \sqrt{\Phi+\epsilon}`, forced to 1 while ``t <= max(1000, warmup)`` or
     when skipped, else clipped to ``[1/5, 5]``.
  5. :math:`z = x/\sqrt{\sigma^2+\epsilon}`, :math:`y = \gamma z + \beta`,
     :math:`\Phi \leftarrow m\Phi + (1-m)\sigma^2`.

  Custom backward (a `jax.custom_vjp`): :math:`g = r\,\gamma \odot g_y`,
  ``gz = mean_all(g * z)``, ``buf_gz[t % W_b] = ema_gz if skip else gz``,
  :math:`\mu_g` = ``gz`` if ``t <= W_b``, ``t < warmup`` or skipped, else
  the mean of ``buf_gz``; ``ema_gz = m ema_gz + (1-m) mu_g``;
  :math:`\tilde g = g - (\mu_g` if skipped else ``ema_gz``:math:`) \odot z`;
  :math:`\partial L/\partial x = \tilde g/\sqrt{\sigma^2+\epsilon}`,
  :math:`\partial L/\partial\gamma = \sum g_y \odot r z`,
  :math:`\partial L/\partial\beta = \sum g_y`. The increments of
  ``grad_ema`` and ``buf_gz`` are returned as their cotangents (see the
  module docstring of `jaxnorm.norms.powernorm`); ``new_state`` carries
  their input values. A training batch with no positions (a static fact of
  the shape) returns an empty output and leaves the state unchanged.

  Inference: :math:`y = \gamma \odot x/\sqrt{\Phi+\epsilon} + \beta`, a
  fixed affine map (`fold_unified_norm` folds it into a linear layer).

  Causality on ``(batch, seq, d)``: training statistics mix all positions
  (not causal-safe); inference is per token (causal-safe).

  Unverified: the paper's equations were not re-read; the code is
  normative (it produced the published numbers).

  Args:
    x: input ``(..., c)`` (the code's layout is ``(B, N, C)``).
    scale: :math:`\gamma`, ``(c,)`` or ``None``.
    bias: :math:`\beta`, ``(c,)`` or ``None``.
    state: `UnifiedNormState` (from `init_unified_norm_state`).
    training: training step (statistics, state update, custom backward).
    pad_mask: boolean ``x.shape[:-1]``, True at pads.
    warmup_iters: steps before smoothing (code default 4000).
    eps: added to the statistics.
    momentum: EMA decay ``m`` of ``running_var`` and ``grad_ema``.
    outlier_filtration: enable step 2 (False for NLP, True for CV).
    axis_name: mapped axis name(s): :math:`\psi^2_B` and ``gz`` are averaged
      across devices.

  Returns:
    ``(y, new_state)`` with ``y`` shaped and typed like ``x``.

  Raises:
    TypeError: for non-floating input or parameters, a non-boolean
      ``pad_mask`` or a bad state type.
    ValueError: for bad shapes.

  Examples:
    >>> x = jnp.array([[1.0], [-3.0]])  # psi^2 = 5
    >>> state = norms.init_unified_norm_state(1)
    >>> y, state = norms.unified_norm(
    ...     x, None, None, state, training=True, eps=0.0)
    >>> print(np.asarray(y[:, 0]).round(4), int(state.count))
    [ 0.4472 -1.3416] 1

  References:
    Yang et al., *Unified Normalization for Accelerating and Stabilizing
    Transformers*, arXiv:2208.01313 (ACM MM 2022).
  """
  who = "unified_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=2)
  c = x.shape[-1]
  _numerics.check_channels(who, x, scale=scale, bias=bias)
  _numerics.check_state(who, state, UnifiedNormState, {})
  w_f, w_b = state.buf_x2.shape[0], state.buf_gz.shape[0]
  _numerics.check_state(
    who,
    state,
    UnifiedNormState,
    {
      "count": (),
      "skip_count": (),
      "running_var": (c,),
      "grad_ema": (c,),
      "buf_x2": (w_f, c),
      "buf_gz": (w_b, c),
    },
  )
  pad_mask = _numerics.check_pad_mask(who, pad_mask, x)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  phi = state.running_var.astype(cdt)
  if not training or _numerics.is_empty(x, range(x.ndim - 1)):
    z = xf * jax.lax.rsqrt(_numerics.channel(phi, x.ndim, cdt) + eps)
    return _numerics.affine(z, scale, bias).astype(x.dtype), state
  gamma = _numerics.vector_or(scale, 1.0, c, cdt)
  beta = _numerics.vector_or(bias, 0.0, c, cdt)
  t = state.count + 1
  psi2 = _numerics.quadratic_mean(xf, pad_mask, axis_name)
  buf = state.buf_x2.astype(cdt)
  r_var = jnp.var(jnp.sqrt(buf), ddof=1) if buf.size > 1 else jnp.nan
  slot = t % w_f
  buf = buf.at[slot].set(psi2)
  skip = jnp.asarray(w_f <= 1)
  outlier = jnp.asarray(False)
  if outlier_filtration:
    am = jnp.mean(buf, axis=0)
    gm = jnp.exp(jnp.mean(jnp.log(buf), axis=0))
    outlier = jnp.logical_and(t >= warmup_iters, jnp.any(am - gm > r_var * w_f))
    buf = jnp.where(outlier, buf.at[slot].set(phi), buf)
    skip = jnp.logical_or(skip, outlier)
  gm = jnp.exp(jnp.mean(jnp.log(buf), axis=0))
  use_batch = (t <= w_f) | (t < warmup_iters) | skip
  var = jnp.where(use_batch, psi2, gm)
  r = jnp.sqrt(var + eps) / jnp.sqrt(phi + eps)
  r = jnp.where(
    (t <= max(1000, warmup_iters)) | skip,
    jnp.ones_like(r),
    jnp.clip(r, 1 / 5, 5),
  )
  y = _unified_norm_core(
    xf,
    gamma,
    beta,
    state.grad_ema.astype(cdt),
    state.buf_gz.astype(cdt),
    var,
    r,
    t,
    skip,
    float(eps),
    float(momentum),
    int(warmup_iters),
    axis_name,
  )
  new_state = UnifiedNormState(
    count=t.astype(state.count.dtype),
    skip_count=(state.skip_count + outlier.astype(state.skip_count.dtype)),
    running_var=_numerics.ema(state.running_var, var, momentum),
    grad_ema=state.grad_ema,
    buf_x2=buf.astype(state.buf_x2.dtype),
    buf_gz=state.buf_gz,
  )
  return y.astype(x.dtype), new_state


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12))
def _unified_norm_core(
  x,
  gamma,
  beta,
  ema_gz,
  buf_gz,
  var,
  r,
  t,
  skip,
  eps,
  momentum,
  warmup,
  axis_name,
):
  return _unified_norm_core_fwd(
    x,
    gamma,
    beta,
    ema_gz,
    buf_gz,
    var,
    r,
    t,
    skip,
    eps,
    momentum,
    warmup,
    axis_name,
  )[0]


def _unified_norm_core_fwd(
  x,
  gamma,
  beta,
  ema_gz,
  buf_gz,
  var,
  r,
  t,
  skip,
  eps,
  momentum,
  warmup,
  axis_name,
):
  del momentum, warmup, axis_name
  z = x * jax.lax.rsqrt(_numerics.channel(var, x.ndim, x.dtype) + eps)
  return _numerics.affine(z, gamma, beta), (
    z,
    gamma,
    ema_gz,
    buf_gz,
    var,
    r,
    t,
    skip,
  )


def _unified_norm_core_bwd(eps, momentum, warmup, axis_name, res, dy):
  z, gamma, ema_gz, buf_gz, var, r, t, skip = res
  nd, cdt = z.ndim, z.dtype
  dy = dy.astype(cdt)
  g = dy * _numerics.channel(r * gamma, nd, cdt)
  gz = _numerics.all_mean(g * z, axis_name)
  w_b = buf_gz.shape[0]
  new_buf = buf_gz.at[t % w_b].set(jnp.where(skip, ema_gz, gz))
  batch = (t <= w_b) | (t < warmup) | skip
  mu_g = jnp.where(batch, gz, jnp.mean(new_buf, axis=0))
  new_ema = _numerics.ema(ema_gz, mu_g, momentum)
  sub = jnp.where(skip, mu_g, new_ema)
  g_tilde = g - _numerics.channel(sub, nd, cdt) * z
  dx = g_tilde * jax.lax.rsqrt(_numerics.channel(var, nd, cdt) + eps)
  reduce = tuple(range(nd - 1))
  dgamma = jnp.sum(dy * z, axis=reduce) * r
  dbeta = jnp.sum(dy, axis=reduce)
  return (
    dx,
    dgamma,
    dbeta,
    new_ema - ema_gz,
    new_buf - buf_gz,
    None,
    None,
    None,
    None,
  )


_unified_norm_core.defvjp(_unified_norm_core_fwd, _unified_norm_core_bwd)


@_scope.scoped
def fold_unified_norm(
  scale: Float[ArrayLike, " c"] | None,
  bias: Float[ArrayLike, " c"] | None,
  running_var: Float[ArrayLike, " c"],
  kernel: Float[ArrayLike, "a b"],
  kernel_bias: Float[ArrayLike, " d"] | None = None,
  *,
  eps: float = 1e-5,
  position: Literal["next", "previous"] = "next",
) -> tuple[Float[Array, "a b"], Float[Array, " d"]]:
  r"""Folds an inference-mode UN layer into an adjacent linear layer.

  Inference UN is :math:`y = s \odot x + \beta` with
  :math:`s = \gamma/\sqrt{\Phi + \epsilon}`. For a linear layer
  ``h @ kernel + kernel_bias`` (Flax layout, ``kernel`` is
  ``(d_in, d_out)``):

  * ``position="next"`` (UN then linear, ``d_in = c``):
    :math:`W \leftarrow \mathrm{diag}(s) W`,
    :math:`b \leftarrow b + \beta W`;
  * ``position="previous"`` (linear then UN, ``d_out = c``):
    :math:`W \leftarrow W \mathrm{diag}(s)`,
    :math:`b \leftarrow b \odot s + \beta`.

  The same folding holds for any per-channel affine inference norm
  (BatchNorm, PowerNorm with ``running_var`` = :math:`\Phi` and no group
  scaling).

  Args:
    scale: :math:`\gamma` ``(c,)`` or ``None`` (ones).
    bias: :math:`\beta` ``(c,)`` or ``None`` (zeros).
    running_var: :math:`\Phi` ``(c,)`` (``state.running_var``).
    kernel: ``(d_in, d_out)`` weight of the adjacent linear layer.
    kernel_bias: ``(d_out,)`` bias or ``None`` (zeros).
    eps: the UN layer's eps.
    position: where the linear layer sits relative to the UN layer.

  Returns:
    ``(kernel, kernel_bias)`` of the fused linear layer, float32 or wider.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for inconsistent shapes or a bad ``position``.

  Examples:
    >>> w, b = norms.fold_unified_norm(
    ...     jnp.array([2.0]), jnp.array([1.0]), jnp.array([4.0]),
    ...     jnp.array([[3.0]]), eps=0.0)  # s = 2 / sqrt(4) = 1
    >>> print(np.asarray(w), np.asarray(b))
    [[3.]] [3.]

  References:
    Yang et al., *Unified Normalization for Accelerating and Stabilizing
    Transformers*, arXiv:2208.01313 (ACM MM 2022).
  """
  who = "fold_unified_norm"
  _checks.check_choice(who, "position", position, ("next", "previous"))
  _checks.check_floating(who, "kernel", kernel)
  _checks.check_floating(who, "running_var", running_var)
  kernel = jnp.asarray(kernel)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  d_in, d_out = kernel.shape
  c = d_in if position == "next" else d_out
  for name, p in (
    ("scale", scale),
    ("bias", bias),
    ("running_var", running_var),
  ):
    if p is not None:
      _checks.check_floating(who, name, p)
      _checks.check_shape(
        who,
        name,
        p,
        (c,),
        "kernel.shape[0]" if position == "next" else "kernel.shape[1]",
      )
  if kernel_bias is not None:
    _checks.check_floating(who, "kernel_bias", kernel_bias)
    _checks.check_shape(
      who, "kernel_bias", kernel_bias, (d_out,), "kernel.shape[1]"
    )
  cdt = _numerics.compute_dtype(kernel)
  w = kernel.astype(cdt)
  gamma = _numerics.vector_or(scale, 1.0, c, cdt)
  beta = _numerics.vector_or(bias, 0.0, c, cdt)
  b = _numerics.vector_or(kernel_bias, 0.0, d_out, cdt)
  s = gamma * jax.lax.rsqrt(jnp.asarray(running_var).astype(cdt) + eps)
  if position == "next":
    return w * s.reshape(-1, 1), b + beta @ w
  return w * s.reshape(1, -1), b * s + beta
