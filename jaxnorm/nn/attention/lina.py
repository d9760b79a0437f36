"""The LINA core (the maths is `jaxnorm.attention.lina`).

`LinaAttention` holds, with ``max_len``, the static KV gates ``key_gate``
and ``value_gate (max_len, K)``.

Examples:
  >>> from jaxnorm.nn.attention import make_attention
  >>> mha = make_attention("lina", 8, 2, max_len=16, rngs=nnx.Rngs(0))
  >>> mha.core.key_gate.shape
  (16, 2)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base


class LinaAttention(_base.AttentionCore):
  """LINA linear attention, `attention.lina_attention`.

  Parameters (only with ``max_len``): static KV gates ``key_gate`` and
  ``value_gate`` of shape ``(max_len, K)`` (``("seq", "kv_heads")``), init
  1, indexed by key position; the keys (``inputs_k`` in cross-attention)
  may then be at most ``max_len`` long. No causal form, no
  mask.

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = LinaAttention(HeadDims(8, 2, 2, 4), max_len=4, rngs=nnx.Rngs(0))
    >>> core.key_gate.shape, core.value_gate[...].tolist()[0]  # init 1
    ((4, 2), [1.0, 1.0])
    >>> q = jnp.ones((1, 3, 2, 4), jnp.float32)  # up to max_len keys
    >>> core(None, q, q, q).shape
    (1, 3, 2, 4)

  References:
    Wang et al., *LINA: Linear Autoregressive Image Generative Models with
    Continuous Tokens*, arXiv:2601.22630 (2026).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    max_len: int | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs  # Ones init.
    who = type(self).__name__
    _base.refuse_causal(who, is_causal, _base.CAUSAL_ALTERNATIVES)
    self.options = _base.check_options(
      who, attn.lina_attention, options, owned=("key_gate", "value_gate")
    )
    if max_len is None:
      self.key_gate = self.value_gate = None
    else:
      _checks.check_positive_int(who, "max_len", max_len)
      shape, names = (max_len, dims.num_kv_heads), ("seq", "kv_heads")
      self.key_gate = _param.param(jnp.ones(shape, param_dtype), names)
      self.value_gate = _param.param(jnp.ones(shape, param_dtype), names)

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)`` LINA output with the static gates, if any."""
    who = type(self).__name__
    _base.refuse_mask(who, mask, bias)
    gates = {}
    if self.key_gate is not None:
      t, max_len = v.shape[1], self.key_gate.shape[0]
      if t > max_len:
        raise ValueError(
          f"{who}: key/value length {t} exceeds max_len={max_len}"
        )
      gates = dict(
        key_gate=self.key_gate[...][:t], value_gate=self.value_gate[...][:t]
      )
    return attn.lina_attention(q, k, v, **gates, **dict(self.options))
