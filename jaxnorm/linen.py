"""`flax.linen` wrappers for the norms and attention linen users reach for.

Thin ``nn.Module``s over the pure functions of `jaxnorm.norms`: each creates
its parameters with ``self.param`` under the names, shapes and initializers
of the `jaxnorm.nn` module of the same name, and calls the pure function (no
maths here). The feature width is read from the input, as in linen.

* `LayerNorm`, `RMSNorm`: drop-ins for ``nn.LayerNorm``/``nn.RMSNorm`` over
  the last axis (same parameter names ``scale``/``bias``, same ``mask=``
  semantics, same dtype rule); ``eps`` is flax's ``epsilon``.
* `CRMSNorm`, `DyT`, `SeeDNorm`, `GroupNorm`: the jaxnorm layers.
* `dot_product_attention`: jaxnorm's softmax attention as a linen
  ``attention_fn`` (``nn.MultiHeadDotProductAttention(attention_fn=...)``),
  built by `jaxnorm.attention.as_flax_attention_fn`.

Common attributes: ``dtype`` (output dtype; ``None`` promotes the input with
the parameter dtypes, as flax does), ``param_dtype`` (float32) and
``axis_names``: the logical name of the feature axis, attached with
``nn.with_logical_partitioning`` (flax's linen spelling of
``scale_metadata``); ``None`` leaves the parameters unboxed. linen replicates
names without a rule in ``nn.logical_axis_rules``; derive rules for your
mesh with `jaxnorm.sharding.rules_for_mesh`.

Examples:
  >>> attn = nn.MultiHeadDotProductAttention(
  ...     num_heads=2, attention_fn=dot_product_attention)
  >>> x = jnp.ones((1, 3, 8), jnp.float32)
  >>> attn.apply(attn.init(jax.random.key(0), x), x).shape
  (1, 3, 8)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnorm import _numerics, attention, norms
from jaxnorm.nn.norms import _common

__all__ = [
  "CRMSNorm",
  "DyT",
  "GroupNorm",
  "LayerNorm",
  "RMSNorm",
  "SeeDNorm",
  "dot_product_attention",
]

Initializer = Callable[..., jax.Array]

dot_product_attention = attention.as_flax_attention_fn(
  attention.dot_product_attention
)
dot_product_attention.__doc__ = """Softmax attention, a linen ``attention_fn``.

`jaxnorm.attention.dot_product_attention` with linen's ``attention_fn``
signature (``bias``, ``mask``, ``dropout_rng``, ``dropout_rate``,
``deterministic`` ...); see `jaxnorm.attention.as_flax_attention_fn`.

Examples:
  Inputs ``(batch, length, heads, head_dim)``, as flax passes them:

  >>> q = jnp.ones((1, 3, 2, 4), jnp.float32)
  >>> dot_product_attention(q, q, q).shape
  (1, 3, 2, 4)
"""


def _param(
  module: nn.Module,
  name: str,
  init: Initializer,
  width: int,
  use: bool = True,
) -> jax.Array | None:
  """A ``(width,)`` parameter of ``module`` (logically named), or None."""
  if not use:
    return None
  names = module.axis_names
  if names is not None:
    init = nn.with_logical_partitioning(init, tuple(names))
  return module.param(name, init, (width,), module.param_dtype)


def _constant(value: float) -> Initializer:
  """An initializer filling its shape with ``value``."""
  return nn.initializers.constant(value)


def _promote(
  module: nn.Module, x: jax.Array, params: Sequence[jax.Array | None]
) -> jax.Array:
  """``x`` promoted as the nnx modules promote it (`_common.promote_to`)."""
  return _common.promote_to(x, module.dtype, params)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis; maths in `jaxnorm.norms.layer_norm`.

  Parameters ``scale`` (``scale_init``, ones) and ``bias`` (zeros), as
  ``nn.LayerNorm``. ``mask=`` restricts the statistics to its ``True``
  elements, as in flax (see `jaxnorm.nn.LayerNorm`).

  Examples:
    >>> norm = LayerNorm()
    >>> x = jnp.array([[1.0, 3.0]], jnp.float32)
    >>> variables = norm.init(jax.random.key(0), x)
    >>> jax.tree.map(jnp.shape, nn.unbox(variables))
    {'params': {'bias': (2,), 'scale': (2,)}}
    >>> [round(v, 4) for v in norm.apply(variables, x)[0].tolist()]
    [-1.0, 1.0]
  """

  eps: float = 1e-6
  use_scale: bool = True
  use_bias: bool = True
  scale_offset: float = 0.0
  scale_init: Initializer = nn.initializers.ones
  bias_init: Initializer = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)
  implementation: Literal["xla", "pallas"] | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` (features last)."""
    d = jnp.shape(x)[-1]
    scale = _param(self, "scale", self.scale_init, d, self.use_scale)
    bias = _param(self, "bias", self.bias_init, d, self.use_bias)
    x = _promote(self, x, (scale, bias))
    y = norms.layer_norm(
      x,
      scale,
      bias,
      eps=self.eps,
      scale_offset=self.scale_offset,
      mask=mask,
      implementation=self.implementation,
    )
    return _common.cast(y, self)


class RMSNorm(nn.Module):
  """RMSNorm over the last axis; maths in `jaxnorm.norms.rms_norm`.

  Parameter ``scale`` (ones), as ``nn.RMSNorm``; ``mask=`` as in flax.

  Examples:
    >>> norm = RMSNorm()
    >>> x = jnp.array([[1.0, 7.0]], jnp.float32)  # RMS 5
    >>> variables = norm.init(jax.random.key(0), x)
    >>> [round(v, 4) for v in norm.apply(variables, x)[0].tolist()]
    [0.2, 1.4]
  """

  eps: float = 1e-6
  eps_mode: norms.EpsMode = "inside"
  use_scale: bool = True
  scale_offset: float = 0.0
  scale_init: Initializer = nn.initializers.ones
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)
  implementation: Literal["xla", "pallas"] | None = None

  @nn.compact
  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` (features last)."""
    d = jnp.shape(x)[-1]
    scale = _param(self, "scale", self.scale_init, d, self.use_scale)
    x = _promote(self, x, (scale,))
    y = norms.rms_norm(
      x,
      scale,
      eps=self.eps,
      eps_mode=self.eps_mode,
      scale_offset=self.scale_offset,
      mask=mask,
      implementation=self.implementation,
    )
    return _common.cast(y, self)


class CRMSNorm(nn.Module):
  """Compressed RMSNorm on ``d-1`` features; see `jaxnorm.norms.crms_norm`.

  Examples:
    >>> norm = CRMSNorm()
    >>> z = jnp.array([[1.0, 1.0]], jnp.float32)  # x = (1, 1, -2), RMS sqrt(2)
    >>> variables = norm.init(jax.random.key(0), z)
    >>> [round(v, 4) for v in norm.apply(variables, z)[0].tolist()]
    [0.7071, 0.7071]
  """

  eps: float = 1e-6
  use_scale: bool = True
  scale_init: Initializer = nn.initializers.ones
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes the compressed ``x`` (features last)."""
    d = jnp.shape(x)[-1]
    scale = _param(self, "scale", self.scale_init, d, self.use_scale)
    x = _promote(self, x, (scale,))
    return _common.cast(norms.crms_norm(x, scale, eps=self.eps), self)


class DyT(nn.Module):
  """Dynamic Tanh; see `jaxnorm.norms.dyt`.

  Parameters ``alpha`` (shape ``(1,)``, ``alpha_init``), ``scale`` (ones)
  and ``bias`` (zeros), as `jaxnorm.nn.DyT`.

  Examples:
    >>> dyt = DyT()  # alpha 0.5
    >>> x = jnp.array([[0.0, 2.0]], jnp.float32)
    >>> variables = dyt.init(jax.random.key(0), x)
    >>> [round(v, 4) for v in dyt.apply(variables, x)[0].tolist()]  # tanh(x/2)
    [0.0, 0.7616]
  """

  alpha_init: float = 0.5
  use_scale: bool = True
  use_bias: bool = True
  scale_init: Initializer = nn.initializers.ones
  bias_init: Initializer = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)
  implementation: Literal["xla", "pallas"] | None = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ``scale * tanh(alpha * x) + bias`` (features last)."""
    d = jnp.shape(x)[-1]
    alpha_init = _constant(self.alpha_init)
    if self.axis_names is not None:
      alpha_init = nn.with_logical_partitioning(alpha_init, (None,))
    alpha = self.param("alpha", alpha_init, (1,), self.param_dtype)
    scale = _param(self, "scale", self.scale_init, d, self.use_scale)
    bias = _param(self, "bias", self.bias_init, d, self.use_bias)
    x = _promote(self, x, (alpha, scale, bias))
    y = norms.dyt(x, alpha, scale, bias, implementation=self.implementation)
    return _common.cast(y, self)


class SeeDNorm(nn.Module):
  """SeeDNorm over the last axis; see `jaxnorm.norms.seed_norm`.

  Parameters ``scale`` (1), ``dyn_scale`` (``dyn_scale_init``) and
  ``dyn_proj`` (0), as `jaxnorm.nn.SeeDNorm`; the paper decays
  ``dyn_scale`` and ``dyn_proj``.

  Examples:
    >>> norm = SeeDNorm()
    >>> x = jnp.array([[1.0, 7.0]], jnp.float32)  # RMS 5
    >>> variables = norm.init(jax.random.key(0), x)
    >>> sorted(variables["params"])
    ['dyn_proj', 'dyn_scale', 'scale']
    >>> [round(v, 4) for v in norm.apply(variables, x)[0].tolist()]  # RMSNorm
    [0.2, 1.4]
  """

  eps: float = 1e-6
  num_heads: int = 1
  dyn_scale_init: float = 1.0
  dyn_scale_div_dim: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` (features last)."""
    d = jnp.shape(x)[-1]
    scale = _param(self, "scale", nn.initializers.ones, d)
    dyn_scale = _param(self, "dyn_scale", _constant(self.dyn_scale_init), d)
    dyn_proj = _param(self, "dyn_proj", nn.initializers.zeros, d)
    x = _promote(self, x, (scale, dyn_scale, dyn_proj))
    y = norms.seed_norm(
      x,
      scale,
      dyn_scale,
      dyn_proj,
      eps=self.eps,
      num_heads=self.num_heads,
      dyn_scale_div_dim=self.dyn_scale_div_dim,
    )
    return _common.cast(y, self)


class GroupNorm(nn.Module):
  """GroupNorm of channels-last input; see `jaxnorm.norms.group_norm`.

  Parameters ``scale`` (ones) and ``bias`` (zeros); ``reduction_axes`` and
  ``mask=`` as in `jaxnorm.nn.GroupNorm`.

  Examples:
    >>> norm = GroupNorm(num_groups=2)
    >>> x = jnp.array([[0.0, 2.0, 4.0, 8.0]], jnp.float32)  # 2 groups of 2
    >>> variables = norm.init(jax.random.key(0), x)
    >>> [round(v, 4) for v in norm.apply(variables, x)[0].tolist()]
    [-1.0, 1.0, -1.0, 1.0]
  """

  num_groups: int | None = 32
  group_size: int | None = None
  eps: float = 1e-6
  reduction_axes: norms.Axis | None = None
  use_scale: bool = True
  use_bias: bool = True
  scale_init: Initializer = nn.initializers.ones
  bias_init: Initializer = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32
  axis_names: Sequence[str | None] | None = ("norm",)

  @nn.compact
  def __call__(
    self, x: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``x`` (features last)."""
    d = jnp.shape(x)[-1]
    scale = _param(self, "scale", self.scale_init, d, self.use_scale)
    bias = _param(self, "bias", self.bias_init, d, self.use_bias)
    x = _promote(self, x, (scale, bias))
    groups = _numerics.resolve_groups(
      "GroupNorm", "x.shape[-1]", d, self.num_groups, self.group_size
    )
    kwargs = {
      "num_groups": groups,
      "eps": self.eps,
      "reduction_axes": self.reduction_axes,
    }
    y = norms.group_norm(x, scale, bias, mask=mask, **kwargs)
    return _common.cast(y, self)
