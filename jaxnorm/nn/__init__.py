"""Flax nnx modules that hold parameters and call `jaxnorm`'s functions."""

from jaxnorm.nn.norms import (
    NORMS,
    BatchNorm,
    CRMSNorm,
    DyT,
    EvoNormB0,
    EvoNormS0,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    RMSNorm,
    SeeDNorm,
    make_norm,
)

__all__ = [
    "NORMS",
    "BatchNorm",
    "CRMSNorm",
    "DyT",
    "EvoNormB0",
    "EvoNormS0",
    "GroupNorm",
    "InstanceNorm",
    "LayerNorm",
    "RMSNorm",
    "SeeDNorm",
    "make_norm",
]
