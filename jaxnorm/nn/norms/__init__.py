"""Flax nnx modules for the normalization functions of `jaxnorm.norms`.

Each module only declares its parameters (and running statistics) and calls
the pure function; the maths and its documentation live there. Common
arguments:

* ``num_features``: size of the normalized (last) axis.
* ``dtype``: output dtype; ``None`` keeps the input dtype. Statistics are
  always computed in at least float32.
* ``param_dtype``: storage dtype of parameters (float32). Running
  statistics (`nnx.BatchStat`, `BackwardStat`) are float32 whatever it is,
  as flax's ``batch_stats`` (a bfloat16 average with momentum 0.99 loses
  updates), and are written back under `jax.lax.stop_gradient`.
* ``axis_names``: logical axis name of the feature axis, attached to every
  parameter for sharding (default ``("norm",)``, replicated by the default
  rules of `jaxnorm.sharding`). Under a mesh, a name without a rule in the
  active rules is replicated with one warning, so the modules build under a
  user's mesh with other axis names (`jaxnorm.sharding.param_names`).
* ``rngs``: an `nnx.Rngs`; every module draws exactly two keys from the
  ``params`` stream (as flax's LayerNorm/BatchNorm/GroupNorm do), whatever
  its options, so swapping one norm for another leaves the initialization
  of later layers unchanged.

`LayerNorm`, `RMSNorm`, `GroupNorm` and `BatchNorm` take flax's ``mask=`` in
``__call__``: statistics over the ``True`` elements only (a mask of shape
``x.shape[:-1]`` masks positions; BatchNorm then updates its running
statistics from the valid elements only).

Modules with running statistics follow flax's train/eval protocol
(``use_running_average``, ``model.eval()``, ``nnx.view``). `NORMS` maps each
name to its `jaxnorm.nn.registry.NormSpec` and `make_norm` builds any of
them by name. One file per paper, named as its pure function's file in
`jaxnorm.norms`: `layer` (LayerNorm, RMSNorm, CRMSNorm), `batch` (BatchNorm,
GroupNorm, InstanceNorm), `dyt`, `seednorm`, `scalenorm`, `evonorm`,
`powernorm`, `unified`, `region`, `unmix_tns`, `l1`, `scale_vectors`, `cls`
and `timestep_decay`; `iwd` holds the scale-vector paper's weight-decay
masks, `_backward` the backward-pass state of PowerNorm and Unified Norm.

Examples:
  >>> from flax import nnx
  >>> norm = make_norm("layernorm", 4, rngs=nnx.Rngs(0))
  >>> type(norm).__name__, sorted(nnx.state(norm)), NORMS["layernorm"].causal
  ('LayerNorm', ['bias', 'scale'], True)
"""

from jaxnorm.nn.norms._backward import (
  BACKWARD_DIFF,
  BackwardStat,
  apply_backward_updates,
)
from jaxnorm.nn.norms._registry import (
  FLAX_NORMS,
  NORMS,
  NormName,
  make_norm,
  norm_decay,
)
from jaxnorm.nn.norms.batch import BatchNorm, GroupNorm, InstanceNorm
from jaxnorm.nn.norms.cls import CLSNorm
from jaxnorm.nn.norms.dyt import DyT
from jaxnorm.nn.norms.evonorm import EvoNormB0, EvoNormS0
from jaxnorm.nn.norms.iwd import (
  OUTPUT_NORM_PATTERN,
  WeightDecayRule,
  weight_decay_mask,
)
from jaxnorm.nn.norms.l1 import L1BatchNorm, L1LayerNorm
from jaxnorm.nn.norms.layer import CRMSNorm, LayerNorm, RMSNorm
from jaxnorm.nn.norms.powernorm import PowerNorm
from jaxnorm.nn.norms.region import RegionNormB, RegionNormL
from jaxnorm.nn.norms.scale_vectors import (
  NORM_ROLES,
  DualScaledLinear,
  NormRole,
  ScaleVectorNorm,
)
from jaxnorm.nn.norms.scalenorm import ScaleNorm
from jaxnorm.nn.norms.seednorm import SeeDNorm
from jaxnorm.nn.norms.timestep_decay import TimestepDecayNorm
from jaxnorm.nn.norms.unified import UnifiedNorm
from jaxnorm.nn.norms.unmix_tns import UnMixTNS

__all__ = [
  "BACKWARD_DIFF",
  "FLAX_NORMS",
  "NORMS",
  "NORM_ROLES",
  "OUTPUT_NORM_PATTERN",
  "BackwardStat",
  "BatchNorm",
  "CLSNorm",
  "CRMSNorm",
  "DualScaledLinear",
  "DyT",
  "EvoNormB0",
  "EvoNormS0",
  "GroupNorm",
  "InstanceNorm",
  "L1BatchNorm",
  "L1LayerNorm",
  "LayerNorm",
  "NormName",
  "NormRole",
  "PowerNorm",
  "RMSNorm",
  "ScaleNorm",
  "RegionNormB",
  "RegionNormL",
  "ScaleVectorNorm",
  "SeeDNorm",
  "TimestepDecayNorm",
  "UnMixTNS",
  "UnifiedNorm",
  "WeightDecayRule",
  "apply_backward_updates",
  "make_norm",
  "norm_decay",
  "weight_decay_mask",
]
