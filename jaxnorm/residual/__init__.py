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
depth-muP, CompleteP).

``__all__`` is what a user imports: the residual steps, the maps and
initial values they take, the depth rules, and the ``Literal`` types of
their signatures. Tables of choices (``READOUTS``, ``DEPTH_EXPONENTS``,
``BASE_DEPTH``), the checks and type aliases shared with `jaxnorm.nn` and
the quaternion matrices behind `quaternion_rotation` still import from the
package but are not part of it.

Examples:
  Every example in this package assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``; the norm and the
  sublayer are any functions:

  >>> from jaxnorm import residual
  >>> x = jnp.array([3.0, 4.0])
  >>> y = residual.pre_norm(x, lambda h: 2 * h, lambda h: h / 5)
  >>> print(np.asarray(y))  # x + f(norm(x)) = x + 2 x / 5
  [4.2 5.6]
"""

from jaxnorm.residual._common import (
  IndexLike,  # noqa: F401 (not public; jaxnorm.nn)
  check_layer_index,  # noqa: F401 (not public; jaxnorm.nn)
)
from jaxnorm.residual.attnres import attn_res, attn_res_weights
from jaxnorm.residual.depth import (
  BASE_DEPTH,  # noqa: F401 (not public; jaxnorm.nn, jaxnorm.training, tests)
  DEPTH_EXPONENTS,  # noqa: F401 (not public; jaxnorm.nn, tests)
  deepnorm_alpha,
  deepnorm_beta,
  depth_adam_scales,
  depth_scale,
  keel_alpha,
  num_layers_of,  # noqa: F401 (not public; jaxnorm.nn, tests)
  scaled_post_norm,
)
from jaxnorm.residual.hyper import (
  READOUTS,  # noqa: F401 (not public; jaxnorm.nn)
  Readout,
  expand_streams,
  hc_maps,
  hc_static_init,
  hyper_connection,
  reduce_streams,
)
from jaxnorm.residual.manifold import (
  RESIDUAL_MAPS,  # noqa: F401 (not public; jaxnorm.nn)
  ResidualMap,
  mhc_maps,
  mhc_static_init,
  quaternion_left_matrix,  # noqa: F401 (not public; tests)
  quaternion_right_matrix,  # noqa: F401 (not public; tests)
  quaternion_rotation,
  sinkhorn_knopp,
)
from jaxnorm.residual.wiring import (
  ScaleRule,
  fused_pre_norm,
  post_norm,
  pre_norm,
  residual_scale,
  sandwich_norm,
  scaled_residual,
)

__all__ = [
  "Readout",
  "ResidualMap",
  "ScaleRule",
  "attn_res",
  "attn_res_weights",
  "deepnorm_alpha",
  "deepnorm_beta",
  "depth_adam_scales",
  "depth_scale",
  "expand_streams",
  "fused_pre_norm",
  "hc_maps",
  "hc_static_init",
  "hyper_connection",
  "keel_alpha",
  "mhc_maps",
  "mhc_static_init",
  "post_norm",
  "pre_norm",
  "quaternion_rotation",
  "reduce_streams",
  "residual_scale",
  "sandwich_norm",
  "scaled_post_norm",
  "scaled_residual",
  "sinkhorn_knopp",
]
