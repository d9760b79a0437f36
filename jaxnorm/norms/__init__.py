"""Normalization layers as pure functions, one module per paper or family.

Every function here is the executable form of its paper's equation: arrays and
static keyword arguments in, arrays out, no parameters created. Conventions
shared by all of them (helpers in `jaxnorm._numerics`):

* Features are last by default (``axis=-1``); images are NHWC.
* Statistics are computed in ``promote_types(x.dtype, float32)``: half inputs
  are upcast, float64 stays float64. The output has ``x.dtype``.
* Variances are two-pass, ``mean((x - mean(x))**2)``, so they are
  non-negative by construction (no ``E[x^2] - E[x]^2`` cancellation to clamp)
  and stay accurate when ``|mean| >> std``, e.g. inputs of magnitude 1e4.
* Parameters are cast to the compute dtype at use, so a float32 ``scale``
  works with a bfloat16 ``x`` under strict dtype promotion.
* Static facts (rank, axis, parameter shapes, dtypes) are validated at trace
  time by `jaxnorm._checks`; a wrong rank is a `ValueError` naming the
  function.
* Each docstring says whether the function is causal-safe on ``(batch, seq,
  d)`` inputs (no statistic mixes positions of a sequence).

The public path of every name is ``jaxnorm.norms.<name>``; the modules are
`layer` (LayerNorm, RMSNorm, CRMSNorm), `batch` (BatchNorm, GroupNorm,
InstanceNorm), `dyt`, `seednorm`, `scalenorm` (ScaleNorm), `scaling`
(LayerNorm Scaling), `evonorm`, `powernorm`, `unified`, `region`, `unmix_tns`,
`l1`, `scale_vectors`, `cls`, `timestep_decay` and `fakeln` (FakeLN, the
LayerNorm-removal schedule).

``__all__`` is what a user imports: the functions, the state tuples and
``init_*_state`` functions of the stateful ones, and the ``Literal`` types
of their signatures. Constants and helpers (``EPS_MODES``, ``L1_KAPPA``,
``Axis``, ``resize_mask_nearest``) still import from the package for
`jaxnorm.nn` and the tests but are not part of it.

Examples:
  Every example in this package assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import norms
  >>> y = norms.rms_norm(jnp.array([3.0, 4.0]), jnp.ones(2))
  >>> print(np.asarray(y).round(4))  # [3, 4] / sqrt(12.5)
  [0.8485 1.1314]
"""

from jaxnorm.norms.batch import (
  BatchNormState,
  batch_norm,
  group_norm,
  init_batch_norm_state,
  instance_norm,
)
from jaxnorm.norms.cls import (
  RegistersWith,
  cls_token_type,
  specialized_layer_norm,
  specialized_linear,
)
from jaxnorm.norms.dyt import dyt
from jaxnorm.norms.evonorm import (
  EvoNormB0State,
  EvoNormS0Variant,
  evo_norm_b0,
  evo_norm_s0,
  init_evo_norm_b0_state,
)
from jaxnorm.norms.fakeln import (
  FakeLNState,
  fake_layer_norm,
  fake_ln,
  init_fake_ln_state,
)
from jaxnorm.norms.l1 import (
  L1_KAPPA,  # noqa: F401 (not public; jaxnorm.nn)
  L1BatchNormState,
  init_l1_batch_norm_state,
  l1_batch_norm,
  l1_layer_norm,
)
from jaxnorm.norms.layer import (
  EPS_MODES,  # noqa: F401 (not public; jaxnorm.nn)
  Axis,  # noqa: F401 (not public; jaxnorm.nn, linen, fused_norms)
  EpsMode,
  crms_norm,
  layer_norm,
  rms_norm,
)
from jaxnorm.norms.powernorm import (
  BackwardStatSource,
  PowerNormState,
  init_power_norm_state,
  power_norm,
)
from jaxnorm.norms.region import (
  region_norm,
  region_norm_b,
  region_norm_l,
  resize_mask_nearest,  # noqa: F401 (not public; jaxnorm.nn, tests)
)
from jaxnorm.norms.scale_vectors import (
  branch_rms_norm,
  dual_scaled_linear,
  magnitude_direction_scale,
)
from jaxnorm.norms.scalenorm import scale_norm
from jaxnorm.norms.scaling import layer_norm_scaling
from jaxnorm.norms.seednorm import seed_norm
from jaxnorm.norms.timestep_decay import (
  TimestepDecayNormState,
  init_timestep_decay_norm_state,
  timestep_decay_norm,
)
from jaxnorm.norms.unified import (
  UnifiedNormState,
  fold_unified_norm,
  init_unified_norm_state,
  unified_norm,
)
from jaxnorm.norms.unmix_tns import (
  UnMixTNSState,
  init_unmix_tns_state,
  unmix_tns,
  unmix_tns_momentum,
)

__all__ = [
  "BackwardStatSource",
  "BatchNormState",
  "EpsMode",
  "EvoNormB0State",
  "EvoNormS0Variant",
  "FakeLNState",
  "L1BatchNormState",
  "PowerNormState",
  "RegistersWith",
  "TimestepDecayNormState",
  "UnMixTNSState",
  "UnifiedNormState",
  "batch_norm",
  "branch_rms_norm",
  "cls_token_type",
  "crms_norm",
  "dual_scaled_linear",
  "dyt",
  "evo_norm_b0",
  "evo_norm_s0",
  "fake_layer_norm",
  "fake_ln",
  "fold_unified_norm",
  "group_norm",
  "init_batch_norm_state",
  "init_evo_norm_b0_state",
  "init_fake_ln_state",
  "init_l1_batch_norm_state",
  "init_power_norm_state",
  "init_timestep_decay_norm_state",
  "init_unified_norm_state",
  "init_unmix_tns_state",
  "instance_norm",
  "l1_batch_norm",
  "l1_layer_norm",
  "layer_norm",
  "layer_norm_scaling",
  "magnitude_direction_scale",
  "power_norm",
  "region_norm",
  "region_norm_b",
  "region_norm_l",
  "rms_norm",
  "scale_norm",
  "seed_norm",
  "specialized_layer_norm",
  "specialized_linear",
  "timestep_decay_norm",
  "unified_norm",
  "unmix_tns",
  "unmix_tns_momentum",
]
