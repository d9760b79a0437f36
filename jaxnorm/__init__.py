"""jaxnorm: normalization research primitives for JAX and Flax.

Layers: pure functions (`jaxnorm.norms`, `jaxnorm.residual`), nnx modules
(`jaxnorm.nn`), sharding helpers (`jaxnorm.sharding`).
"""

from jaxnorm import norms, residual, sharding

__version__ = "0.1.0"

__all__ = ["norms", "residual", "sharding"]
