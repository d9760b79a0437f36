"""jaxnorm: normalization research primitives for JAX and Flax.

Layers: pure functions (`jaxnorm.norms`, `jaxnorm.fused_norms`,
`jaxnorm.activations`, `jaxnorm.attention`, `jaxnorm.vision`,
`jaxnorm.residual`), optax optimizers
(`jaxnorm.optim`), nnx modules and
model conversions (`jaxnorm.nn`, `jaxnorm.nn.convert`), sharding helpers
(`jaxnorm.sharding`) and the experiment engine (`jaxnorm.training`, imported
on demand).
"""

from jaxnorm import (
  activations,
  attention,
  fused_norms,
  norms,
  optim,
  residual,
  sharding,
  vision,
)

__version__ = "0.1.0"

__all__ = [
  "activations",
  "attention",
  "fused_norms",
  "norms",
  "optim",
  "residual",
  "sharding",
  "vision",
]
