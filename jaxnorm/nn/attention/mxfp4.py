"""The MXFP4 attention core (the maths is `jaxnorm.attention.mxfp4`).

`MXFP4Attention` has no parameters.

Examples:
  >>> MXFP4Attention.function.__name__, MXFP4Attention.supports_cache
  ('mxfp4_attention', False)
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class MXFP4Attention(_base.FunctionCore):
  """MXFP4 fake-quantized attention, `jaxnorm.attention.mxfp4_attention`.

  Causal form: ``is_causal=True`` (the pure function's causal mode decides
  how V's block scales avoid later tokens; see its docstring).

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = MXFP4Attention(HeadDims(8, 2, 2, 4), rngs=nnx.Rngs(0))
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [8.0, 8.0, 8.0]

  References:
    Yu et al., *MXAttention: Data-Free Optimal Scaling and Pre-Normalization
    Quantization for MXFP4 Attention*, arXiv:2607.24377 (2026).
  """

  function = staticmethod(attn.mxfp4_attention)
