"""Multi-head attention modules around the cores of `jaxnorm.attention`.

`MultiHeadAttention` holds the projections, QK-norm and RoPE; the part
between the projections and the output is a core, one class per paper
(`cores`), registered in `ATTENTIONS` with its capabilities
(`jaxnorm.nn.registry.AttentionSpec`). ``make_attention(name, ...)`` builds
one by name; `from_flax_attention` loads a flax ``nnx.MultiHeadAttention``.
"""

from jaxnorm.nn.attention._base import AttentionCore, HeadDims
from jaxnorm.nn.attention.cores import (
  AffineScaledAttention,
  AffineScaleEMA,
  CausalLinearAttention,
  GatedAttention,
  LinaAttention,
  MXFP4Attention,
  NaLaAttention,
  OffByOneAttention,
  SinkAttention,
  SinkhornAttention,
  SoftAttention,
  SoftmaxAttention,
)
from jaxnorm.nn.attention.from_flax import from_flax_attention
from jaxnorm.nn.attention.multihead import (
  ATTENTION_NAMES,
  ATTENTIONS,
  AttentionName,
  MultiHeadAttention,
  make_attention,
)

__all__ = [
  "ATTENTIONS",
  "ATTENTION_NAMES",
  "AffineScaleEMA",
  "AffineScaledAttention",
  "AttentionCore",
  "AttentionName",
  "CausalLinearAttention",
  "GatedAttention",
  "HeadDims",
  "LinaAttention",
  "MXFP4Attention",
  "MultiHeadAttention",
  "NaLaAttention",
  "OffByOneAttention",
  "SinkAttention",
  "SinkhornAttention",
  "SoftAttention",
  "SoftmaxAttention",
  "from_flax_attention",
  "make_attention",
]
