"""UnMix-TNS module; maths in `jaxnorm.norms.unmix_tns`."""

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
  cast,
  maybe,
  optional,
  param,
  promote,
)
from jaxnorm.nn.norms.batch import BatchNorm


class UnMixTNS(nnx.Module):
  """UnMix-TNS test-time normalization; see `jaxnorm.norms.unmix_tns`.

  Parameters ``scale``/``bias`` (the replaced BatchNorm's); `nnx.BatchStat`
  components ``mean`` and ``var`` of shape ``(K, C)``, initialized from
  ``source_mean``/``source_var`` (default 0 and 1) with noise from the
  first of the module's two keys, float32 whatever ``param_dtype`` (as
  `BatchNorm`'s statistics). Every call updates the components (under
  `jax.lax.stop_gradient`) unless ``update_stats=False``.
  `from_batch_norm` replaces a trained `BatchNorm`. flax's ``use_scale``,
  ``use_bias``, ``scale_init`` and ``bias_init`` act on ``scale`` and
  ``bias`` (``scale_init`` draws from a key folded from the first, which
  the components' noise uses).

  Examples:
    >>> norm = UnMixTNS(2, num_components=4, rngs=nnx.Rngs(0))
    >>> y = norm(jax.random.normal(jax.random.key(0), (2, 3, 3, 2)))  # NHWC
    >>> y.shape, norm.mean[...].shape, norm.var[...].dtype  # K = 4 components
    ((2, 3, 3, 2), (4, 2), dtype('float32'))
  """

  @paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    num_components: int = 16,
    spread: float = 0.5,
    temperature: float = 0.07,
    momentum: float | None = None,
    eps: float = 1e-5,
    update_stats: bool = True,
    source_mean: jax.Array | None = None,
    source_var: jax.Array | None = None,
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
    _checks.check_positive_int("UnMixTNS", "num_features", num_features)
    self.num_features, self.temperature = num_features, temperature
    self.momentum, self.eps, self.update_stats = momentum, eps, update_stats
    self.axis_name, self.dtype = axis_name, dtype
    shape = (num_features,)
    mean = jnp.zeros(shape) if source_mean is None else source_mean
    var = jnp.ones(shape) if source_var is None else source_var
    noise_key, bias_key = draw_keys(rngs)
    state = norms.init_unmix_tns_state(
      mean,
      var,
      noise_key,
      num_components=num_components,
      spread=spread,
      dtype=jnp.float32,
    )
    comp_names = None if axis_names is None else (None, *axis_names)
    self.scale = optional(
      use_scale,
      scale_init,
      jax.random.fold_in(noise_key, 1),
      num_features,
      param_dtype,
      axis_names,
    )
    self.bias = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.mean = param(state.mean, comp_names, nnx.BatchStat)
    self.var = param(state.var, comp_names, nnx.BatchStat)

  @classmethod
  def from_batch_norm(
    cls, bn: BatchNorm, *, rngs: nnx.Rngs, **kwargs: Any
  ) -> UnMixTNS:
    """An UnMix-TNS layer with ``bn``'s affine, eps and source statistics.

    The affine keeps ``bn``'s parameters, their presence and dtype.
    """
    kwargs.setdefault("eps", bn.eps)
    module = cls(
      bn.num_features,
      source_mean=bn.mean[...],
      source_var=bn.var[...],
      use_scale=bn.scale is not None,
      use_bias=bn.bias is not None,
      param_dtype=bn.param_dtype,
      rngs=rngs,
      **kwargs,
    )
    if bn.scale is not None:
      module.scale[...] = bn.scale[...]
    if bn.bias is not None:
      module.bias[...] = bn.bias[...]
    return module

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes NHWC ``x``; updates the components (``update_stats``)."""
    x = promote(x, self)
    y, new = norms.unmix_tns(
      x,
      maybe(self.scale),
      maybe(self.bias),
      norms.UnMixTNSState(self.mean[...], self.var[...]),
      momentum=self.momentum,
      temperature=self.temperature,
      eps=self.eps,
      update=self.update_stats,
      axis_name=self.axis_name,
    )
    if self.update_stats:
      new = jax.lax.stop_gradient(new)
      self.mean[...] = new.mean
      self.var[...] = new.var
    return cast(y, self)
