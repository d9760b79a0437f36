"""The MXFP4 attention core (the maths is `jaxnorm.attention.mxfp4`).

`MXFP4Attention` has no parameters.
"""

from __future__ import annotations

from jaxnorm import attention as attn
from jaxnorm.nn.attention import _base


class MXFP4Attention(_base.FunctionCore):
  """MXFP4 fake-quantized attention, `jaxnorm.attention.mxfp4_attention`.

  Causal form: ``is_causal=True`` (the pure function's causal mode decides
  how V's block scales avoid later tokens; see its docstring).

  References:
    Yu et al., *MXAttention: Data-Free Optimal Scaling and Pre-Normalization
    Quantization for MXFP4 Attention*, arXiv:2607.24377 (2026).
  """

  function = staticmethod(attn.mxfp4_attention)
