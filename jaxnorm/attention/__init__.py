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
NaLaFormer's patch-map layers sit in `soft` and `nala`).

``__all__`` is what a user imports: the attention functions, their weights
and the helpers a caller needs to build their inputs (`soft_landmarks`,
`grid_rope_tables`, `linear_clipping`, `ela_config`, the KV-cache
functions), and the ``Literal`` types of their signatures. The building
blocks the layers call (feature maps, kernels, the block-scale exponent,
the running estimate of `affine_scaled_attention`) live in their modules
and are not part of it (some still import from the package, for
`jaxnorm.nn` and the tests).

Examples:
  Every example in this package assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import attention
  >>> q = k = jnp.zeros((1, 2, 1, 2))  # (B, T, N, H): equal logits
  >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
  >>> out = attention.dot_product_attention(q, k, v)
  >>> print(np.asarray(out[0, :, 0]))  # every query reads the mean of v
  [[2. 1.]
   [2. 1.]]
"""

from jaxnorm.attention._grid import (
  grid_tokens,  # noqa: F401 (not public; jaxnorm.nn, tests)
)
from jaxnorm.attention.affine_scaled import (
  affine_scaled_attention,
  linear_clipping,
)
from jaxnorm.attention.ela import efficient_local_attention, ela_config
from jaxnorm.attention.flax_adapter import as_flax_attention_fn
from jaxnorm.attention.kv_cache import decode_mask, streaming_cache_update
from jaxnorm.attention.lina import lina_attention, lina_depthwise_conv
from jaxnorm.attention.linear import FeatureMap, causal_linear_attention
from jaxnorm.attention.mxfp4 import (
  hadamard_rotation,  # noqa: F401 (not public; tests)
  mxfp4_attention,
  mxfp4_quantize,
  mxfp4_scale_exponent,  # noqa: F401 (not public; tests)
)
from jaxnorm.attention.nala import (
  grid_rope_tables,
  nala_attention,
  nala_grid_attention,
  nala_key_feature,  # noqa: F401 (not public; tests)
  nala_query_feature,  # noqa: F401 (not public; tests)
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
  gaussian_kernel,  # noqa: F401 (not public; tests)
  newton_inverse,
  soft_attention,
  soft_conv_landmarks,  # noqa: F401 (not public; tests)
  soft_grid_attention,
  soft_landmarks,
  soft_local_conv,  # noqa: F401 (not public; tests)
)
from jaxnorm.attention.softmax import attention_weights, dot_product_attention

__all__ = [
  "FeatureMap",
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
  "grid_rope_tables",
  "lina_attention",
  "lina_depthwise_conv",
  "linear_clipping",
  "mxfp4_attention",
  "mxfp4_quantize",
  "nala_attention",
  "nala_grid_attention",
  "newton_inverse",
  "psa_paper_form",
  "psa_parallel",
  "psa_sequential",
  "rope",
  "sink_attention",
  "sinkhorn_attention",
  "sinkhorn_weights",
  "soft_attention",
  "soft_grid_attention",
  "soft_landmarks",
  "softmax_off_by_one",
  "streaming_cache_update",
]
