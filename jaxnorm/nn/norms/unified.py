"""Unified Normalization module; maths in `jaxnorm.norms.unified_norm`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._backward import BackwardStat, counter
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  RunningAverage,
  cast,
  maybe,
  optional,
  param,
  promote,
)


class UnifiedNorm(RunningAverage):
  """Unified Normalization over the last axis; see `norms.unified_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count``,
  ``skip_count``, ``running_var`` and ``buf_x2``; `BackwardStat`
  ``grad_ema`` and ``buf_gz``; the floating statistics are float32
  whatever ``param_dtype`` (as `BatchNorm`'s), and the forward update runs
  under `jax.lax.stop_gradient`. ``window_size`` is an int or ``(W_f, W_b)``.
  `fold` returns the kernel and bias of an adjacent linear layer with this
  (inference-mode) layer folded in. flax's ``use_scale``, ``use_bias``,
  ``scale_init`` and ``bias_init`` act on ``scale`` and ``bias``.

  Examples:
    >>> norm = UnifiedNorm(2, window_size=(4, 2), rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([[1.0, -2.0], [3.0, 0.5]]))  # training mode
    >>> sorted(nnx.state(norm, BackwardStat)), norm.buf_x2[...].shape
    (['buf_gz', 'grad_ema'], (4, 2))
    >>> int(norm.count[...]), norm.running_var[...].dtype
    (1, dtype('float32'))
  """

  @paper_affine()
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
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("UnifiedNorm", "num_features", num_features)
    scale_key, bias_key = draw_keys(rngs)
    state = norms.init_unified_norm_state(
      num_features, window_size, jnp.float32
    )
    self.num_features, self.warmup_iters = num_features, warmup_iters
    self.eps, self.momentum = eps, momentum
    self.outlier_filtration = outlier_filtration
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    buf_names = None if axis_names is None else (None, *axis_names)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.count = counter(axis_names)
    self.skip_count = counter(axis_names)
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
      maybe(self.scale),
      maybe(self.bias),
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
      new = jax.lax.stop_gradient(new)
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
      maybe(self.scale),
      maybe(self.bias),
      self.running_var[...],
      kernel,
      kernel_bias,
      eps=self.eps,
      position=position,
    )
