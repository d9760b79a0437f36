"""The registry entries of the complex attention cores."""

from __future__ import annotations

import types
from collections.abc import Mapping

from jaxnorm.nn import registry
from jaxnorm.nn.cplx import born, complexformer, pct, softmax

_NO_DECAY_PHASES = types.MappingProxyType({"delta": False, "phase_bias": False})

ATTENTION_SPECS: Mapping[str, registry.AttentionSpec] = types.MappingProxyType(
  {
    "born": registry.AttentionSpec(
      born.BornAttention, "Crasmaru, CNet", takes_bias=False
    ),
    "complexformer": registry.AttentionSpec(
      complexformer.ComplexFormerAttention,
      "Shao et al., arXiv:2505.10222 (withdrawn)",
      decay=_NO_DECAY_PHASES,
    ),
    "pct": registry.AttentionSpec(pct.PCTAttention, "Hioki, arXiv:2605.10123"),
    "complex_softmax": registry.AttentionSpec(
      softmax.ComplexSoftmaxAttention, "Eilers & Jiang, arXiv:2306.09827"
    ),
  }
)
"""Registry entries of the complex attention cores: merge into
`jaxnorm.nn.attention.ATTENTIONS` (and its ``AttentionName``).

``born``, ``pct`` and ``complex_softmax`` are complex-valued (their cores'
``dtype_kind`` is ``"complex"``): `MultiHeadAttention` runs them on a
complex input with a complex ``param_dtype`` (or on real pairs with
``real_pairs=True``), and `jaxnorm.nn.cplx.ComplexMultiHeadAttention` on
complex projections with complex RoPE. ``complexformer`` is a real core
(real heads, complex phases inside). Born attention takes boolean masks but
no additive bias."""
