"""The softmax attention core (the maths is `jaxnorm.attention.softmax`).

`SoftmaxAttention` has no parameters; it runs a decode step on a key/value
cache (``supports_cache``).
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class SoftmaxAttention(_base.FunctionCore):
  """Softmax attention, `jaxnorm.attention.dot_product_attention`.

  Causal form: the lower-triangular mask (``is_causal=True``).

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """

  function = staticmethod(attn.dot_product_attention)
  supports_cache = True
