"""The Sinkhorn attention core (the maths is `jaxnorm.attention.sinkhorn`).

`SinkhornAttention` has no parameters.
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class SinkhornAttention(_base.FunctionCore):
  """Sinkhorn (entropic OT plan) attention, `attention.sinkhorn_attention`.

  Causal form: ``is_causal=True`` as the pure function defines it.

  References:
    Freytes, *Geometric Attention: A Regime-Explicit Operator Semantics for
    Transformer Attention*, arXiv:2601.11618 (2026).
  """

  function = staticmethod(attn.sinkhorn_attention)
