"""Residual wiring as pure functions: where the norm sits around a sublayer.

A block is written once as a sublayer ``f`` (attention, MLP) and a norm
``norm``; these functions decide how the residual stream ``x`` flows around
them. They take callables, so they compose with plain functions as well as
with nnx modules (call them inside a module's ``__call__``).

One module per family: `wiring` (pre-norm, post-norm, sandwich, the fused
pre-norm stack and the scaled residuals: depth rule, SkipInit, ReZero,
LayerScale), `hyper` (multi-stream expansion, readout and update;
Hyper-Connections), `manifold` (Sinkhorn-Knopp, quaternion rotations; mHC,
oHC, iHC), `attnres` (Attention Residuals) and `depth` (DeepNorm, KEEL,
depth-muP, CompleteP). This package re-exports every public name.
"""

from jaxnorm.residual._common import (
  AddNormFn,
  ArrayFn,
  IndexLike,
  check_layer_index,
)
from jaxnorm.residual.attnres import attn_res, attn_res_weights
from jaxnorm.residual.depth import (
  DEPTH_EXPONENTS,
  deepnorm_alpha,
  deepnorm_beta,
  depth_scale,
  keel_alpha,
  num_layers_of,
  scaled_post_norm,
)
from jaxnorm.residual.hyper import (
  READOUTS,
  Readout,
  expand_streams,
  hc_maps,
  hc_static_init,
  hyper_connection,
  reduce_streams,
)
from jaxnorm.residual.manifold import (
  RESIDUAL_MAPS,
  ResidualMap,
  mhc_maps,
  mhc_static_init,
  quaternion_left_matrix,
  quaternion_right_matrix,
  quaternion_rotation,
  sinkhorn_knopp,
)
from jaxnorm.residual.wiring import (
  SCALE_RULES,
  ScaleRule,
  fused_pre_norm,
  post_norm,
  pre_norm,
  residual_scale,
  sandwich_norm,
  scaled_residual,
)

__all__ = [
  "DEPTH_EXPONENTS",
  "READOUTS",
  "RESIDUAL_MAPS",
  "SCALE_RULES",
  "AddNormFn",
  "ArrayFn",
  "IndexLike",
  "Readout",
  "ResidualMap",
  "ScaleRule",
  "attn_res",
  "attn_res_weights",
  "check_layer_index",
  "deepnorm_alpha",
  "deepnorm_beta",
  "depth_scale",
  "expand_streams",
  "fused_pre_norm",
  "hc_maps",
  "hc_static_init",
  "hyper_connection",
  "keel_alpha",
  "mhc_maps",
  "mhc_static_init",
  "num_layers_of",
  "post_norm",
  "pre_norm",
  "quaternion_left_matrix",
  "quaternion_right_matrix",
  "quaternion_rotation",
  "reduce_streams",
  "residual_scale",
  "sandwich_norm",
  "scaled_post_norm",
  "scaled_residual",
  "sinkhorn_knopp",
]
