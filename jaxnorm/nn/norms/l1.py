"""L1 LayerNorm and L1 BatchNorm modules; maths in `jaxnorm.norms.l1`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
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


class L1LayerNorm(nnx.Module):
  """L1 LayerNorm over the last axis; see `jaxnorm.norms.l1_layer_norm`.

  flax's ``use_scale``, ``use_bias``, ``scale_init`` and ``bias_init`` act
  on ``scale`` and ``bias``.

  Examples:
    >>> norm = L1LayerNorm(2, rngs=nnx.Rngs(0))  # mean |x - mu| = 1
    >>> y = norm(jnp.array([1.0, 3.0]))  # (x - mu) / (sqrt(pi / 2) + eps)
    >>> [round(v, 4) for v in y.tolist()]
    [-0.7979, 0.7979]
  """

  @paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    kappa: float = norms.L1_KAPPA,
    eps_mode: norms.EpsMode = "outside",
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("L1LayerNorm", "num_features", num_features)
    _checks.check_choice("L1LayerNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.eps, self.kappa = num_features, eps, kappa
    self.eps_mode, self.dtype = eps_mode, dtype
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last) with this module's parameters."""
    x = promote(x, self)
    y = norms.l1_layer_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      eps=self.eps,
      kappa=self.kappa,
      eps_mode=self.eps_mode,
    )
    return cast(y, self)


class L1BatchNorm(RunningAverage):
  """L1 BatchNorm (features last); see `jaxnorm.norms.l1_batch_norm`.

  `nnx.BatchStat` ``mean`` and ``dev``, float32 whatever ``param_dtype``
  (as `BatchNorm`'s), updated under `jax.lax.stop_gradient`;
  ``use_running_average`` selects inference, as in `BatchNorm`. flax's
  affine keywords as in `L1LayerNorm`.

  Examples:
    >>> norm = L1BatchNorm(1, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([[1.0], [3.0]]))  # training: batch statistics
    >>> [round(v, 4) for v in y[:, 0].tolist()]
    [-0.7979, 0.7979]
    >>> sorted(nnx.state(norm, nnx.BatchStat)), norm.mean[...].dtype
    (['dev', 'mean'], dtype('float32'))
  """

  @paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.99,
    eps: float = 1e-5,
    kappa: float = norms.L1_KAPPA,
    eps_mode: norms.EpsMode = "outside",
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
    _checks.check_positive_int("L1BatchNorm", "num_features", num_features)
    _checks.check_choice("L1BatchNorm", "eps_mode", eps_mode, norms.EPS_MODES)
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.momentum, self.eps = num_features, momentum, eps
    self.kappa, self.eps_mode = kappa, eps_mode
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    state = norms.init_l1_batch_norm_state(num_features, jnp.float32)
    self.scale = optional(
      use_scale, scale_init, scale_key, num_features, param_dtype, axis_names
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.mean = param(state.mean, axis_names, nnx.BatchStat)
    self.dev = param(state.dev, axis_names, nnx.BatchStat)

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes ``x``; in training mode also updates ``mean``/``dev``."""
    x = promote(x, self)
    eval_mode = self.eval_mode(use_running_average)
    y, new = norms.l1_batch_norm(
      x,
      maybe(self.scale),
      maybe(self.bias),
      norms.L1BatchNormState(self.mean[...], self.dev[...]),
      training=not eval_mode,
      momentum=self.momentum,
      eps=self.eps,
      kappa=self.kappa,
      eps_mode=self.eps_mode,
      axis_name=self.axis_name,
    )
    if not eval_mode:
      new = jax.lax.stop_gradient(new)
      self.mean[...] = new.mean
      self.dev[...] = new.dev
    return cast(y, self)
