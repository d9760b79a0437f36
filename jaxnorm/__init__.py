"""jaxnorm: normalization research primitives for JAX and Flax.

Layers: pure functions (`jaxnorm.norms`, `jaxnorm.fused_norms`,
`jaxnorm.activations`, `jaxnorm.attention` (with the CNN gates ELA and PSA),
`jaxnorm.residual`; beyond layers: `jaxnorm.rl` advantage
normalization, `jaxnorm.quant` LLM.int8, `jaxnorm.looped`, `jaxnorm.analysis`),
optax optimizers
(`jaxnorm.optim`), nnx modules and
model conversions (`jaxnorm.nn`, `jaxnorm.nn.convert`), sharding helpers
(`jaxnorm.sharding`), deviceless GPU/TPU targets (`jaxnorm.aot`) and the
experiment engine (`jaxnorm.training`, imported
on demand).
"""

from jaxnorm import (
  activations,
  analysis,
  aot,
  attention,
  depth_metrics,
  fused_norms,
  graph,
  looped,
  norms,
  optim,
  quant,
  residual,
  rl,
  sharding,
)

__version__ = "0.1.0"

__all__ = [
  "activations",
  "aot",
  "analysis",
  "attention",
  "depth_metrics",
  "fused_norms",
  "graph",
  "looped",
  "norms",
  "optim",
  "quant",
  "residual",
  "rl",
  "sharding",
]
