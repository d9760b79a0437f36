"""PowerNorm module; maths in `jaxnorm.norms.power_norm`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics, norms
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


class PowerNorm(RunningAverage):
  """PowerNorm over the last axis; see `jaxnorm.norms.power_norm`.

  Parameters ``scale`` (1) and ``bias`` (0); `nnx.BatchStat` ``count`` and
  ``running_phi``; `BackwardStat` ``grad_ema`` (updated through the
  backward pass, see `BackwardStat`); the floating statistics are float32
  whatever ``param_dtype`` (as `BatchNorm`'s), and the forward update runs
  under `jax.lax.stop_gradient`. ``use_running_average`` selects
  inference, as in `BatchNorm`. Call with ``pad_mask`` (``x.shape[:-1]``,
  True at pads) for padded batches. flax's ``use_scale``, ``use_bias``,
  ``scale_init`` and ``bias_init`` act on ``scale`` and ``bias``.

  Examples:
    >>> norm = PowerNorm(2, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([[1.0, -2.0], [3.0, 0.5]]))  # training mode
    >>> sorted(nnx.state(norm, nnx.Not(nnx.Param)))
    ['count', 'grad_ema', 'running_phi']
    >>> int(norm.count[...]), norm.running_phi[...].dtype
    (1, dtype('float32'))
  """

  @paper_affine()
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
    backward_stat: norms.BackwardStatSource = "batch",
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
    who = "PowerNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(
      who, "backward_stat", backward_stat, ("batch", "running")
    )
    if num_groups is not None:
      _numerics.resolve_groups(
        who, "num_features", num_features, num_groups, None
      )
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.eps = num_features, eps
    self.alpha_fwd, self.alpha_bkw = alpha_fwd, alpha_bkw
    self.warmup_iters, self.num_groups = warmup_iters, num_groups
    self.group_eps, self.backward_stat = group_eps, backward_stat
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    state = norms.init_power_norm_state(num_features, jnp.float32)
    self.count = counter(axis_names)
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
      maybe(self.scale),
      maybe(self.bias),
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
      new = jax.lax.stop_gradient(new)
      self.count[...] = new.count
      self.running_phi[...] = new.running_phi
    return cast(y, self)
