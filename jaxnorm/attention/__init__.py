"""Attention as pure functions: softmax SDPA and the research variants.

Layout follows `jax.nn.dot_product_attention`: ``query`` is ``(B, T, N, H)``
(or unbatched ``(T, N, H)``), ``key`` and ``value`` are ``(B, S, K, H)``;
logits, ``bias`` and ``mask`` are ``(B, N, T, S)`` (each axis may be 1 to
broadcast). ``T`` is the query length, ``S`` the key length, ``N`` the query
heads, ``K`` the key/value heads (``N % K == 0``; ``K < N`` is grouped-query
attention, query head ``n`` reads kv head ``n // (N // K)``) and ``H`` the head
dim. A boolean ``mask`` is True where attending is allowed; ``is_causal`` lets
query ``i`` see keys ``j <= i`` (top-left aligned, as in JAX).

Every function computes logits, softmax statistics, normalizers and inverses
in ``promote_types(query.dtype, float32)`` and returns ``query.dtype``.
Shape problems raise ``ValueError`` at trace time, naming the argument.

One module per paper or family: `softmax` (SDPA), `sinks` (off-by-one,
learnable sinks, gated output), `affine_scaled`, `rotary` (RoPE), `soft`,
`nala`, `lina`, `linear` (causal linear attention and its feature maps),
`mxfp4`, `sinkhorn`, `kv_cache` (decode-cache masks and the StreamingLLM
policy), `flax_adapter` (any of them as a flax ``attention_fn``), and the CNN
attention gates `ela` and `psa` (on ``(B, H, W, C)`` maps; SOFT's and
NaLaFormer's patch-map layers sit in `soft` and `nala`). This package
re-exports every public name.
"""

from jaxnorm.attention._grid import grid_tokens
from jaxnorm.attention.affine_scaled import (
  affine_scale_running_estimate,
  affine_scaled_attention,
  linear_clipping,
)
from jaxnorm.attention.ela import (
  ELA_PRESETS,
  efficient_local_attention,
  ela_config,
)
from jaxnorm.attention.flax_adapter import as_flax_attention_fn
from jaxnorm.attention.kv_cache import decode_mask, streaming_cache_update
from jaxnorm.attention.lina import lina_attention, lina_depthwise_conv
from jaxnorm.attention.linear import FEATURE_MAPS, causal_linear_attention
from jaxnorm.attention.mxfp4 import (
  E2M1_MAX,
  UOS_QMAX,
  hadamard_rotation,
  mxfp4_attention,
  mxfp4_quantize,
  mxfp4_scale_exponent,
)
from jaxnorm.attention.nala import (
  grid_rope_tables,
  nala_attention,
  nala_grid_attention,
  nala_key_feature,
  nala_query_feature,
)
from jaxnorm.attention.psa import (
  psa_paper_form,
  psa_parallel,
  psa_sequential,
)
from jaxnorm.attention.rotary import rope
from jaxnorm.attention.sinkhorn import (
  causal_sinkhorn_weights,
  sinkhorn_attention,
  sinkhorn_weights,
)
from jaxnorm.attention.sinks import (
  gated_attention_output,
  sink_attention,
  softmax_off_by_one,
)
from jaxnorm.attention.soft import (
  gaussian_kernel,
  newton_inverse,
  soft_attention,
  soft_conv_landmarks,
  soft_grid_attention,
  soft_landmarks,
  soft_local_conv,
)
from jaxnorm.attention.softmax import attention_weights, dot_product_attention

__all__ = [
  "E2M1_MAX",
  "ELA_PRESETS",
  "FEATURE_MAPS",
  "UOS_QMAX",
  "affine_scale_running_estimate",
  "affine_scaled_attention",
  "as_flax_attention_fn",
  "attention_weights",
  "causal_linear_attention",
  "causal_sinkhorn_weights",
  "decode_mask",
  "dot_product_attention",
  "efficient_local_attention",
  "ela_config",
  "gated_attention_output",
  "gaussian_kernel",
  "grid_rope_tables",
  "grid_tokens",
  "hadamard_rotation",
  "lina_attention",
  "lina_depthwise_conv",
  "linear_clipping",
  "mxfp4_attention",
  "mxfp4_quantize",
  "mxfp4_scale_exponent",
  "nala_attention",
  "nala_grid_attention",
  "nala_key_feature",
  "nala_query_feature",
  "newton_inverse",
  "psa_paper_form",
  "psa_parallel",
  "psa_sequential",
  "rope",
  "sink_attention",
  "sinkhorn_attention",
  "sinkhorn_weights",
  "soft_attention",
  "soft_conv_landmarks",
  "soft_grid_attention",
  "soft_landmarks",
  "soft_local_conv",
  "softmax_off_by_one",
  "streaming_cache_update",
]
