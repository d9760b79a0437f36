"""Residual schemes as nnx modules, and `make_residual` to pick one by name.

A block is written once as a list of sublayers (attention, MLP, ...), each a
callable from ``(..., d)`` to ``(..., d)`` without its own residual or norm.
A residual scheme wraps the list into a network:

  net = make_residual("mhc", [attn0, mlp0, attn1, mlp1], num_features=d,
                      norm="rmsnorm", rngs=nnx.Rngs(0))
  h = net(x)  # (..., d) embedding in, (..., d) hidden state out

The output is the residual stream before the model's final norm and head
(for multi-stream schemes, after the stream readout). The maths lives in
`jaxnorm.residual`; these modules only declare parameters (with logical axis
names ``embed``, ``streams``, ``norm``) and call it.

`RESIDUALS` maps each name to a `jaxnorm.nn.registry.ResidualSpec`: its
network builder, its step builder (the step module of the sublayer at a
`Placement`), paper, defaults as a function of ``(num_sublayers,
sublayers_per_layer)``, its capabilities (places norms, runs norm-free,
shares a layer's step, fuses the residual add into the norm, scans over
layers or why not) and weight-decay exceptions; `make_residual` applies the
spec's defaults under the caller's options and refuses the options its
capabilities exclude. For an ``nnx.scan`` over layers, `make_residual_step`
builds one layer's steps with the same step builder (`SCAN_RESIDUALS`: every
scheme whose state is a fixed-size carry). Every step module draws exactly
one ``params`` key from ``rngs`` whatever its norm and options, so swapping
a norm never shifts the initialization of later modules.

Files, named as those of `jaxnorm.residual`, each with the builders its
schemes' specs carry: `wiring` (single-stream steps and `ResidualStack`),
`hyper` (HC's step and `StreamStack`), `manifold` (mHC, oHC, iHC steps),
`attnres` (Attention Residuals), `depth` (DeepNorm, KEEL, depth-muP,
CompleteP; DeepNorm's init gain) and `_registry` (`RESIDUALS`,
`make_residual`, `make_residual_step`); this package re-exports every
public name but the builders (reach them through `RESIDUALS`).

Schemes (`RESIDUALS`):

======================  ====================================================
name                    wiring of sublayer ``f_k`` (norms from `make_norm`)
======================  ====================================================
``prenorm``             ``x + f(norm(x))``
``postnorm``            ``norm(x + f(x))``
``sandwich``            ``x + norm_out(f(norm_in(x)))``
``lns``                 ``x + f(norm(x) / sqrt(l))``, ``l`` the layer
``scaled``              ``x + lam * f(norm(x))``, ``lam = 1/n`` or 1/sqrt(n)
``skipinit``            ``x + alpha * f(x)``, scalar ``alpha`` init 0
``rezero``              same, one ``alpha`` per layer (all its sublayers)
``layerscale``          ``x + diag(gamma) f(norm(x))``, CaiT's ``gamma`` init
``hc``                  Hyper-Connections (dynamic or static), ``n`` streams
``mhc``                 mHC: Sinkhorn-constrained stream mixing
``ohc``                 oHC: SO(4) stream mixing from two quaternions
``ihc``                 iHC: mHC with identity stream mixing
``attnres``             Full Attention Residuals
``block_attnres``       Block Attention Residuals
``deepnorm``            ``norm(a x + f(x))``, ``a = (2L)^(1/4)``; branch
                        weights (not q, k) scaled by ``(8L)^(-1/4)``
``keel``                ``norm_out(2L x + f(norm_in(x)))``; layer 0:
                        ``x + f(norm(x))``, then ``norm_out(x + f(norm_in(x)))``
``depth_mup``           ``x + (L/L0)^(-1/2) f(norm(x))``, ``L0 = 24``
``completep``           ``x + (L/L0)^(-1) f(norm(x))``, ``L0 = 24``
======================  ====================================================

Depth growth at initialization, measured by
``tests/nn/test_residual.py::test_24_layer_stack_depth_growth_and_finite``
(marked slow) on a
24-layer (48-sublayer) stack of single-head causal softmax attention and
GELU MLP sublayers with Gaussian weights (std ``1/sqrt(fan_in)``), ``d = 32``,
RMSNorm everywhere, batch 2 x 8 tokens of unit-RMS Gaussian embeddings,
float32, every scheme with its spec defaults. "growth" is the RMS of the
hidden state after the last sublayer over its RMS after the first
(multi-stream schemes read out with ``"mean"``; for AttnRes the hidden state
is the aggregated sublayer input :math:`h_l`). All schemes also stay finite
in float32 and bfloat16, with finite gradients (same test).

=================  ======  ================================================
scheme             growth  note
=================  ======  ================================================
prenorm            3.67    the stream accumulates unnormalized branches
postnorm           1.00    every step ends in a norm
sandwich           4.05    branch outputs normalized to RMS 1 and summed
lns                1.44    1/sqrt(l) per layer damps the late branches
scaled (1/n)       1.00    every branch weighted 1/48
skipinit, rezero   1.00    identity network at init (gate 0)
layerscale         1.00    branches weighted 1e-5
hc                 3.67    n copies of prenorm at init
mhc, ohc, ihc      3.67    same: identical streams, rows of H_res sum to 1
attnres            0.15    inputs are means over a growing set of sources
block_attnres      0.81    8 blocks: means over at most 9 sources
deepnorm, keel     1.00    every step ends in a norm (as postnorm)
depth_mup          3.67    24 layers = base depth 24: prenorm
completep          3.67    same (multiplier (24/24)^(-1) = 1)
=================  ======  ================================================

The slow test recomputes every entry and checks it within 10%.

Examples:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> net = make_residual("mhc", [jnp.tanh] * 4, num_features=8,
  ...                     rngs=nnx.Rngs(0))
  >>> net(jnp.ones((2, 8), jnp.float32)).shape  # 4 streams, read out by mean
  (2, 8)
"""

from jaxnorm.nn.residual._common import (
  LayerIndex,
  NormSpec,
  Placement,
  Sublayer,
)
from jaxnorm.nn.residual._registry import (
  NORM_FREE,
  NORM_FREE_SCHEMES,
  RESIDUALS,
  SCAN_RESIDUALS,
  ResidualLayer,
  ResidualName,
  make_residual,
  make_residual_step,
)
from jaxnorm.nn.residual.attnres import AttnResQuery, AttnResStack
from jaxnorm.nn.residual.depth import (
  QUERY_KEY,
  ScaledPostNormResidual,
  keel_step,
  scale_branch_init,
)
from jaxnorm.nn.residual.hyper import HyperConnection, StreamStack
from jaxnorm.nn.residual.manifold import ManifoldHyperConnection
from jaxnorm.nn.residual.wiring import (
  GatedResidual,
  PostNormResidual,
  PreNormResidual,
  ResidualStack,
  SandwichNormResidual,
  ScaledResidual,
)

__all__ = [
  "NORM_FREE",
  "NORM_FREE_SCHEMES",
  "QUERY_KEY",
  "RESIDUALS",
  "SCAN_RESIDUALS",
  "AttnResQuery",
  "AttnResStack",
  "GatedResidual",
  "HyperConnection",
  "LayerIndex",
  "ManifoldHyperConnection",
  "NormSpec",
  "Placement",
  "PostNormResidual",
  "PreNormResidual",
  "ResidualLayer",
  "ResidualName",
  "ResidualStack",
  "SandwichNormResidual",
  "ScaledPostNormResidual",
  "ScaledResidual",
  "StreamStack",
  "Sublayer",
  "keel_step",
  "make_residual",
  "make_residual_step",
  "scale_branch_init",
]
