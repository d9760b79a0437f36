"""The causal linear attention core (the maths is `jaxnorm.attention.linear`).

`CausalLinearAttention` has no parameters and takes no mask.

Examples:
  >>> CausalLinearAttention.masked, CausalLinearAttention.supports_cache
  (False, False)
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class CausalLinearAttention(_base.FunctionCore):
  """Causal linear attention, `attention.causal_linear_attention`.

  Always causal whatever ``is_causal`` says (the running key-value state
  only ever holds the prefix); takes no mask.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = CausalLinearAttention(HeadDims(8, 2, 2, 4), rngs=nnx.Rngs(0))
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [0.0, 4.0, 8.0]

    (zero queries and keys give equal feature maps: the means of the
    prefixes, causal although ``is_causal`` is False.)

  References:
    Katharopoulos et al., *Transformers are RNNs: Fast Autoregressive
    Transformers with Linear Attention*, arXiv:2006.16236 (2020).
  """

  function = staticmethod(attn.causal_linear_attention)
  masked = False

  def cross_refusal(self) -> str | None:
    """The running key-value state is the prefix of the queries' sequence."""
    return (
      "it is always causal self-attention (its running key-value state "
      "is the queries' own prefix)"
    )
