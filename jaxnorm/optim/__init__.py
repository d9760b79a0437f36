"""Optimizers as optax transforms: AdamP, SGDP, Conda, RMNP and NaP.

Each method is a ``scale_by_<name>`` transform with a NamedTuple state plus a
user-facing chain (``adamp``, ``sgdp``, ...). Matrix axes are named with
`MatrixAxes` (Flax ``(in, out)`` layout by default).
"""

from jaxnorm.optim._axes import MatrixAxes
from jaxnorm.optim.adamp import (
    ScaleByAdampState,
    ScaleBySgdpState,
    adamp,
    scale_by_adamp,
    scale_by_sgdp,
    sgdp,
)

__all__ = [
    "MatrixAxes",
    "ScaleByAdampState",
    "ScaleBySgdpState",
    "adamp",
    "scale_by_adamp",
    "scale_by_sgdp",
    "sgdp",
]
