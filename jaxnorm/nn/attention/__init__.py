"""Multi-head attention modules around the cores of `jaxnorm.attention`.

`MultiHeadAttention` holds the projections, QK-norm and RoPE; the part
between the projections and the output is a core, one class per paper in
the module named as the paper's pure file of `jaxnorm.attention` (`softmax`,
`sinks`, `affine_scaled`, `soft`, `nala`, `lina`, `linear`, `mxfp4`,
`sinkhorn`), registered in `ATTENTIONS` with its capabilities
(`jaxnorm.nn.registry.AttentionSpec`). ``make_attention(name, ...)`` builds
one by name; `from_flax_attention` loads a flax ``nnx.MultiHeadAttention``.

Each core is built as ``Core(dims, *, is_causal, param_dtype, rngs,
**options)`` (`HeadDims`) and called as ``core(x, q, k, v, *, mask,
bias)`` by `MultiHeadAttention` (plus ``cached=True`` in a decode step for
the cores with ``supports_cache``: softmax, off-by-one, sink, gated and
affine-scaled). ``options`` are the keyword options of the
core's pure function (checked when the core is built) plus the core's own
constructor arguments. Parameter paths below are relative to the core, which
sits at ``<attention>.core`` in a model.

======================  ==============================================
core                    parameters / state (logical axis names)
======================  ==============================================
`SoftmaxAttention`      none
`OffByOneAttention`     none
`SinkAttention`         ``sinks (N,)`` ``("heads",)``, init 0
`GatedAttention`        ``gate_kernel (D, N, H)`` or ``(D, N, 1)``
`AffineScaledAttention` ``alpha_kernel (D, N)``; state ``alpha_ma``
`SoftAttention`         map form: ``landmark_kernel (r, r, H, H)``,
                        ``landmark_scale``/``landmark_bias (H,)``,
                        ``local_kernel (k, k, N)``; token form: none
`NaLaAttention`         map form: ``gate_kernel (D, N, H)``,
                        ``gate_bias``, ``lepe_bias``, ``norm_scale``,
                        ``norm_bias (N*H,)``, ``lepe_kernel (k, k,
                        N*H)``; token form: none
`LinaAttention`         ``key_gate``, ``value_gate (max_len, K)``
`CausalLinearAttention` none
`MXFP4Attention`        none
`SinkhornAttention`     none
======================  ==============================================

Cores whose paper layer acts on a 2-D token map (SOFT, NaLaFormer) have the
class attribute ``needs_grid`` (read into their spec): a model with a map
(the ViT) builds them with ``grid_shape=(h, w)`` and ``num_prefix`` (its
[CLS]); without ``grid_shape`` they run a documented token form for 1-D
sequences.

The ``images`` entries of `ATTENTIONS` (`IMAGE_ATTENTIONS`: ``"ela"``,
`ELA`; ``"psa"``, `PolarizedSelfAttention`) are whole layers on NHWC maps,
not cores: ``make_image_attention(name, channels, *, rngs, **options)``
builds one (`jaxnorm.nn.models.CNN` places one per block with
``block_attention``); `TOKEN_ATTENTIONS` are the cores above.

Examples:
  >>> from flax import nnx
  >>> mha = make_attention("sink", 8, 2, is_causal=True, rngs=nnx.Rngs(0))
  >>> sorted(nnx.to_pure_dict(nnx.state(mha, nnx.Param)))  # core: sinks
  ['core', 'k_kernel', 'out_kernel', 'q_kernel', 'v_kernel']
"""

from jaxnorm.nn.attention._base import AttentionCore, HeadDims
from jaxnorm.nn.attention._registry import (
  ATTENTION_NAMES,
  ATTENTIONS,
  IMAGE_ATTENTIONS,
  TOKEN_ATTENTIONS,
  AttentionName,
  make_image_attention,
)
from jaxnorm.nn.attention.affine_scaled import (
  AffineScaledAttention,
  AffineScaleEMA,
)
from jaxnorm.nn.attention.ela import ELA
from jaxnorm.nn.attention.from_flax import from_flax_attention
from jaxnorm.nn.attention.lina import LinaAttention
from jaxnorm.nn.attention.linear import CausalLinearAttention
from jaxnorm.nn.attention.multihead import MultiHeadAttention, make_attention
from jaxnorm.nn.attention.mxfp4 import MXFP4Attention
from jaxnorm.nn.attention.nala import NaLaAttention
from jaxnorm.nn.attention.psa import PolarizedSelfAttention
from jaxnorm.nn.attention.sinkhorn import SinkhornAttention
from jaxnorm.nn.attention.sinks import (
  GatedAttention,
  OffByOneAttention,
  SinkAttention,
)
from jaxnorm.nn.attention.soft import SoftAttention
from jaxnorm.nn.attention.softmax import SoftmaxAttention

__all__ = [
  "ATTENTIONS",
  "ATTENTION_NAMES",
  "AffineScaleEMA",
  "AffineScaledAttention",
  "AttentionCore",
  "AttentionName",
  "CausalLinearAttention",
  "ELA",
  "GatedAttention",
  "HeadDims",
  "IMAGE_ATTENTIONS",
  "LinaAttention",
  "MXFP4Attention",
  "MultiHeadAttention",
  "NaLaAttention",
  "OffByOneAttention",
  "PolarizedSelfAttention",
  "SinkAttention",
  "SinkhornAttention",
  "SoftAttention",
  "SoftmaxAttention",
  "TOKEN_ATTENTIONS",
  "from_flax_attention",
  "make_attention",
  "make_image_attention",
]
