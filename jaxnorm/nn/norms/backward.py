"""Norms with backward-pass state: PowerNorm and Unified Normalization."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics, norms
from jaxnorm.nn.norms._common import (
  Names,
  RunningAverage,
  cast,
  draw_keys,
  param,
  promote,
)


class BackwardStat(nnx.Variable):
  """State that a custom backward pass updates (PowerNorm, UN).

  The pure functions return the increment of such state as its cotangent.
  Differentiate with respect to it as well, e.g. ``nnx.grad(loss,
  argnums=nnx.DiffState(0, BACKWARD_DIFF))``, keep it out of the optimizer,
  and add it with `apply_backward_updates`. Plain ``nnx.grad`` (parameters
  only) leaves it unchanged.
  """


BACKWARD_DIFF = nnx.Any(nnx.Param, BackwardStat)


def apply_backward_updates(module: nnx.Module, grads: nnx.State) -> None:
  """Adds the `BackwardStat` increments found in ``grads`` to ``module``.

  Args:
    module: the model that was differentiated.
    grads: gradients taken with respect to (at least) its `BackwardStat`
      variables, e.g. with ``nnx.DiffState(0, BACKWARD_DIFF)``.
  """
  increments = nnx.split_state(grads, BackwardStat, ...)[0]
  current = nnx.state(module, BackwardStat)
  nnx.update(
    module,
    jax.tree.map(lambda v, d: v + d.astype(v.dtype), current, increments),
  )


def _counter(names: Names) -> nnx.BatchStat:
  return param(
    jnp.zeros((), jnp.int32), None if names is None else (), nnx.BatchStat
  )


class PowerNorm(RunningAverage):
  """PowerNorm over the last axis; see `jaxnorm.norms.power_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count`` and
  ``running_phi``; `BackwardStat` ``grad_ema`` (updated through the
  backward pass, see `BackwardStat`). ``use_running_average`` selects
  inference, as in `BatchNorm`. Call with ``pad_mask`` (``x.shape[:-1]``,
  True at pads) for padded batches.
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    alpha_fwd: float = 0.9,
    alpha_bkw: float = 0.9,
    warmup_iters: int = 10000,
    num_groups: int | None = 1,
    group_eps: float = 1e-5,
    backward_stat: norms.BackwardStat = "batch",
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "PowerNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(
      who, "backward_stat", backward_stat, ("batch", "running")
    )
    if num_groups is not None:
      _numerics.resolve_groups(
        who, "num_features", num_features, num_groups, None
      )
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_features, self.eps = num_features, eps
    self.alpha_fwd, self.alpha_bkw = alpha_fwd, alpha_bkw
    self.warmup_iters, self.num_groups = warmup_iters, num_groups
    self.group_eps, self.backward_stat = group_eps, backward_stat
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = param(jnp.zeros(shape, param_dtype), axis_names)
    state = norms.init_power_norm_state(num_features, param_dtype)
    self.count = _counter(axis_names)
    self.running_phi = param(state.running_phi, axis_names, nnx.BatchStat)
    self.grad_ema = param(state.grad_ema, axis_names, BackwardStat)

  def state_tuple(self) -> norms.PowerNormState:
    """The module's statistics as a `jaxnorm.norms.PowerNormState`."""
    return norms.PowerNormState(
      self.count[...], self.running_phi[...], self.grad_ema[...]
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    pad_mask: jax.Array | None = None,
    use_running_average: bool | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new = norms.power_norm(
      x,
      self.scale[...],
      self.bias[...],
      self.state_tuple(),
      training=not eval_mode,
      pad_mask=pad_mask,
      eps=self.eps,
      alpha_fwd=self.alpha_fwd,
      alpha_bkw=self.alpha_bkw,
      warmup_iters=self.warmup_iters,
      num_groups=self.num_groups,
      group_eps=self.group_eps,
      backward_stat=self.backward_stat,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.count[...] = new.count
      self.running_phi[...] = new.running_phi
    return cast(y, self)


class UnifiedNorm(RunningAverage):
  """Unified Normalization over the last axis; see `norms.unified_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count``,
  ``skip_count``, ``running_var`` and ``buf_x2``; `BackwardStat`
  ``grad_ema`` and ``buf_gz``. ``window_size`` is an int or ``(W_f, W_b)``.
  `fold` returns the kernel and bias of an adjacent linear layer with this
  (inference-mode) layer folded in.
  """

  def __init__(
    self,
    num_features: int,
    *,
    window_size: int | tuple[int, int] = 4,
    warmup_iters: int = 4000,
    eps: float = 1e-5,
    momentum: float = 0.9,
    outlier_filtration: bool = False,
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("UnifiedNorm", "num_features", num_features)
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    state = norms.init_unified_norm_state(
      num_features, window_size, param_dtype
    )
    self.num_features, self.warmup_iters = num_features, warmup_iters
    self.eps, self.momentum = eps, momentum
    self.outlier_filtration = outlier_filtration
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    shape = (num_features,)
    buf_names = None if axis_names is None else (None, *axis_names)
    self.scale = param(jnp.ones(shape, param_dtype), axis_names)
    self.bias = param(jnp.zeros(shape, param_dtype), axis_names)
    self.count = _counter(axis_names)
    self.skip_count = _counter(axis_names)
    self.running_var = param(state.running_var, axis_names, nnx.BatchStat)
    self.buf_x2 = param(state.buf_x2, buf_names, nnx.BatchStat)
    self.grad_ema = param(state.grad_ema, axis_names, BackwardStat)
    self.buf_gz = param(state.buf_gz, buf_names, BackwardStat)

  def state_tuple(self) -> norms.UnifiedNormState:
    """The module's statistics as a `jaxnorm.norms.UnifiedNormState`."""
    return norms.UnifiedNormState(
      self.count[...],
      self.skip_count[...],
      self.running_var[...],
      self.grad_ema[...],
      self.buf_x2[...],
      self.buf_gz[...],
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    pad_mask: jax.Array | None = None,
    use_running_average: bool | None = None,
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates the statistics."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new = norms.unified_norm(
      x,
      self.scale[...],
      self.bias[...],
      self.state_tuple(),
      training=not eval_mode,
      pad_mask=pad_mask,
      warmup_iters=self.warmup_iters,
      eps=self.eps,
      momentum=self.momentum,
      outlier_filtration=self.outlier_filtration,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      self.count[...] = new.count
      self.skip_count[...] = new.skip_count
      self.running_var[...] = new.running_var
      self.buf_x2[...] = new.buf_x2
    return cast(y, self)

  def fold(
    self,
    kernel: jax.Array,
    kernel_bias: jax.Array | None = None,
    *,
    position: str = "next",
  ) -> tuple[jax.Array, jax.Array]:
    """Folds this layer into a linear layer; see `norms.fold_unified_norm`."""
    return norms.fold_unified_norm(
      self.scale[...],
      self.bias[...],
      self.running_var[...],
      kernel,
      kernel_bias,
      eps=self.eps,
      position=position,
    )
