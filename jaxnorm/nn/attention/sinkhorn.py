"""The Sinkhorn attention core (the maths is `jaxnorm.attention.sinkhorn`).

`SinkhornAttention` has no parameters.

Examples:
  >>> SinkhornAttention.function.__name__, SinkhornAttention.causal_form
  ('sinkhorn_attention', True)
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class SinkhornAttention(_base.FunctionCore):
  """Sinkhorn (entropic OT plan) attention, `attention.sinkhorn_attention`.

  Causal form: ``is_causal=True`` as the pure function defines it.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = SinkhornAttention(HeadDims(8, 2, 2, 4), rngs=nnx.Rngs(0))
    >>> v = jnp.arange(24, dtype=jnp.float32).reshape(1, 3, 2, 4)
    >>> [round(t, 4) for t in core(None, 0 * v, 0 * v, v)[0, :, 0, 0].tolist()]
    [8.0, 8.0, 8.0]

  References:
    Freytes, *Geometric Attention: A Regime-Explicit Operator Semantics for
    Transformer Attention*, arXiv:2601.11618 (2026).
  """

  function = staticmethod(attn.sinkhorn_attention)
