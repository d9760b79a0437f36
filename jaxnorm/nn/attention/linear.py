"""The causal linear attention core (the maths is `jaxnorm.attention.linear`).

`CausalLinearAttention` has no parameters and takes no mask.
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class CausalLinearAttention(_base.FunctionCore):
  """Causal linear attention, `attention.causal_linear_attention`.

  Always causal whatever ``is_causal`` says (the running key-value state
  only ever holds the prefix); takes no mask.

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
