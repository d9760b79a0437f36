"""jaxnorm: normalization research primitives for JAX and Flax.

Layers: pure functions (`jaxnorm.norms`, `jaxnorm.activations`,
`jaxnorm.attention`, `jaxnorm.vision`, `jaxnorm.residual`), optax optimizers
(`jaxnorm.optim`), nnx modules (`jaxnorm.nn`), sharding helpers
(`jaxnorm.sharding`) and the experiment engine (`jaxnorm.training`, imported
on demand).
"""

from jaxnorm import (
           activations,
           attention,
           norms,
           optim,
           residual,
           sharding,
           vision,
)

__version__ = "0.1.0"

__all__ = ["activations", "attention", "norms", "optim", "residual",
           "sharding", "vision"]
