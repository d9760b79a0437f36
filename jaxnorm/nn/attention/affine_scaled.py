"""The Affine-Scaled Attention core (`jaxnorm.attention.affine_scaled`).

`AffineScaledAttention` holds ``alpha_kernel (D, N)`` and the running
estimate `AffineScaleEMA` ``alpha_ma``; it decodes from a cache in eval mode.

Examples:
  >>> from jaxnorm.nn.attention import make_attention
  >>> mha = make_attention("affine_scaled", 8, 2, rngs=nnx.Rngs(0))
  >>> mha.core.alpha_kernel.shape, mha.core.alpha_ma.shape
  ((8, 2), (2,))
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base


class AffineScaleEMA(nnx.BatchStat):
  """The running estimate ``alpha_ma`` of Affine-Scaled Attention.

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = AffineScaledAttention(HeadDims(8, 2, 2, 4),
    ...                              ema_axes="per_layer", rngs=nnx.Rngs(0))
    >>> list(nnx.to_pure_dict(nnx.state(core, AffineScaleEMA)))  # the state
    ['alpha_ma']
    >>> core.alpha_ma.shape  # one estimate for the layer
    ()
  """


class AffineScaledAttention(_base.AttentionCore):
  r"""Affine-Scaled Attention, `attention.affine_scaled_attention`.

  Parameters: ``alpha_kernel (D, N)`` (no bias), ``alpha =
  linear_clipping(x @ alpha_kernel)``; state `AffineScaleEMA` ``alpha_ma``
  (``(N,)``, or ``()`` with ``ema_axes="per_layer"``), updated in training
  mode. ``use_running_average=True`` (``model.eval()``, or ``nnx.view(model,
  use_running_average=True)`` through `set_view`) uses and keeps the stored
  estimate.

  Causal form: ``is_causal=True`` with the pure function's causal handling
  of the running estimate (see its docstring).

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = AffineScaledAttention(HeadDims(8, 2, 2, 4), rngs=nnx.Rngs(0))
    >>> core.alpha_kernel.shape, core.alpha_ma[...].tolist()  # (D, N), (N,)
    ((8, 2), [0.0, 0.0])
    >>> q = jnp.ones((1, 3, 2, 4), jnp.float32)
    >>> y = core(jnp.ones((1, 3, 8), jnp.float32), q, q, q)  # training mode
    >>> y.shape, bool((core.alpha_ma[...] != 0).all())  # alpha_ma updated
    ((1, 3, 2, 4), True)

  References:
    Bae et al., *Affine-Scaled Attention: Towards Flexible and Stable
    Transformer Attention*, arXiv:2602.23057 (2026).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    ema_axes: Literal["per_head", "per_layer"] = "per_head",
    use_running_average: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _checks.check_choice(who, "ema_axes", ema_axes, ("per_head", "per_layer"))
    self.is_causal, self.use_running_average = is_causal, use_running_average
    self.options = _base.check_options(
      who,
      attn.affine_scaled_attention,
      options,
      owned=("alpha", "alpha_ma", "training"),
    )
    n = dims.num_heads
    self.alpha_kernel = _base.dense_param(
      rngs, (dims.num_features, n), 0, 1, param_dtype, ("embed", "heads")
    )
    shape, names = ((n,), ("heads",)) if ema_axes == "per_head" else ((), ())
    self.alpha_ma = _param.param(
      jnp.zeros(shape, jnp.float32), names, AffineScaleEMA
    )

  supports_cache = True

  def cache_refusal(self) -> str | None:
    """Decoding runs in eval mode: training updates ``alpha_ma`` per call."""
    if not self.use_running_average:
      return (
        "in training mode every call updates alpha_ma, so a decode step "
        "would not equal the full forward; decode in eval mode "
        "(model.eval() or nnx.view(model, use_running_average=True))"
      )
    return None

  def set_view(self, use_running_average: bool | None = None) -> None:
    """The `nnx.view` protocol: train (False) or eval (True) behaviour.

    Args:
      use_running_average: use and keep the stored ``alpha_ma`` (True) or
        update it from the batch (False); None leaves it unchanged.
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``; updates ``alpha_ma`` in training mode."""
    logits = jnp.einsum(
      "btd,dn->btn", x, _base.cast_param(self.alpha_kernel, x)
    )
    alpha = attn.linear_clipping(logits.astype(jnp.float32))
    training = not self.use_running_average
    is_causal, options = _base.call_structure(self, cached)
    y, new_ma = attn.affine_scaled_attention(
      q,
      k,
      v,
      bias,
      mask,
      alpha=alpha,
      alpha_ma=self.alpha_ma[...],
      is_causal=is_causal,
      training=training,
      **options,
    )
    if training:
      self.alpha_ma[...] = new_ma
    return y
