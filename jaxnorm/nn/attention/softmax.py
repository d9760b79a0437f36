"""The softmax attention core (the maths is `jaxnorm.attention.softmax`).

`SoftmaxAttention` has no parameters; it runs a decode step on a key/value
cache (``supports_cache``).

Examples:
  >>> SoftmaxAttention.supports_cache, SoftmaxAttention.function.__name__
  (True, 'dot_product_attention')
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class SoftmaxAttention(_base.FunctionCore):
  """Softmax attention, `jaxnorm.attention.dot_product_attention`.

  Causal form: the lower-triangular mask (``is_causal=True``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = SoftmaxAttention(HeadDims(8, 2, 2, 4), is_causal=True,
    ...                         rngs=nnx.Rngs(0))
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [0.0, 4.0, 8.0]

    (``x`` is unused; zero queries and keys give equal logits, so query
    ``t`` averages the values ``0, 8, 16`` of the keys ``<= t``.)

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """

  function = staticmethod(attn.dot_product_attention)
  supports_cache = True
