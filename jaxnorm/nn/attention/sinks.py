"""Cores of `jaxnorm.attention.sinks`: off-by-one, learned sinks, gated output.

All three have a causal form and a decode cache (``supports_cache``); their
parameters are in the table of `jaxnorm.nn.attention`.

Examples:
  >>> from jaxnorm.nn.attention import make_attention
  >>> mha = make_attention("sink", 8, 2, is_causal=True, rngs=nnx.Rngs(0))
  >>> type(mha.core).__name__, mha.core.sinks.shape
  ('SinkAttention', (2,))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base


class OffByOneAttention(_base.FunctionCore):
  """Softmax off-by-one: `jaxnorm.attention.sink_attention` with zero sinks.

  Causal form: the lower-triangular mask; the sink is a key every query
  sees.

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = OffByOneAttention(HeadDims(8, 2, 2, 4), is_causal=True,
    ...                          rngs=nnx.Rngs(0))
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [0.0, 2.6667, 6.0]

    (zero queries and keys: the zero-logit sink joins the visible keys,
    ``0 / 2``, ``(0 + 8) / 3``, ``(0 + 8 + 16) / 4``.)

  References:
    E. Miller, *Attention Is Off By One* (2023, blog).
  """

  function = staticmethod(attn.sink_attention)
  supports_cache = True


class SinkAttention(_base.AttentionCore):
  """Learned per-head sink logits, `jaxnorm.attention.sink_attention`.

  Parameters: ``sinks (N,)``, init 0 (off-by-one at init). Causal form: the
  lower-triangular mask.

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = SinkAttention(HeadDims(8, 2, 2, 4), rngs=nnx.Rngs(0))
    >>> core.sinks.shape, core.sinks[...].tolist()  # (N,), init 0
    ((2,), [0.0, 0.0])
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [6.0, 6.0, 6.0]

    (three equal keys and the sink: ``(0 + 8 + 16) / 4``.)

  References:
    OpenAI, *gpt-oss-120b & gpt-oss-20b Model Card*, arXiv:2508.10925
    (2025); Xiao et al., *Efficient Streaming Language Models with Attention
    Sinks*, arXiv:2309.17453 (2023).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs  # Zero init.
    self.is_causal = is_causal
    self.options = _base.check_options(
      type(self).__name__, attn.sink_attention, options, owned=("sinks",)
    )
    self.sinks = _param.param(
      jnp.zeros((dims.num_heads,), param_dtype), ("heads",)
    )

  supports_cache = True

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``: attention with the learned sinks."""
    del x
    is_causal, options = _base.call_structure(self, cached)
    return attn.sink_attention(
      q, k, v, bias, mask, sinks=self.sinks[...], is_causal=is_causal, **options
    )


class GatedAttention(_base.AttentionCore):
  r"""Gated attention output: SDPA then :math:`Y \odot \sigma(x W_g)`.

  Parameters: ``gate_kernel (D, N, H)``, or ``(D, N, 1)`` with
  ``headwise=True``, LeCun-normal init; `attention.gated_attention_output`.
  Causal form: the lower-triangular mask (the gate is per position).

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = GatedAttention(HeadDims(8, 2, 2, 4), headwise=True,
    ...                       rngs=nnx.Rngs(0))
    >>> core.gate_kernel.shape  # (D, N, 1)
    (8, 2, 1)
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> x = jnp.zeros((1, 3, 8), jnp.float32)  # gates sigmoid(0) = 0.5
    >>> [round(t, 4) for t in core(x, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [4.0, 4.0, 4.0]

  References:
    Qiu et al., *Gated Attention for Large Language Models*,
    arXiv:2505.06708 (2025).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    headwise: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    self.is_causal = is_causal
    self.options = _base.check_options(
      type(self).__name__, attn.dot_product_attention, options
    )
    width = 1 if headwise else dims.head_dim
    self.gate_kernel = _base.dense_param(
      rngs,
      (dims.num_features, dims.num_heads, width),
      0,
      (1, 2),
      param_dtype,
      ("embed", "heads", None if headwise else "head_dim"),
    )

  supports_cache = True

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``: gated SDPA output."""
    is_causal, options = _base.call_structure(self, cached)
    y = attn.dot_product_attention(
      q, k, v, bias, mask, is_causal=is_causal, **options
    )
    gates = jnp.einsum(
      "btd,dnh->btnh", x, _base.cast_param(self.gate_kernel, x)
    )
    return attn.gated_attention_output(y, gates)
