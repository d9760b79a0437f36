"""Optimizers as optax transforms: AdamP, SGDP, Conda, RMNP and NaP.

Each method is a ``scale_by_<name>`` transform with a NamedTuple state plus a
user-facing optimizer (``adamp``, ``sgdp``, ...) that takes ``mask=`` as
``optax.adamw`` does (``None`` keeps the official decay of every leaf).
Matrix axes are named with `MatrixAxes` (Flax ``(in, out)`` layout by
default), or derived from logical axis names with `logical_axes`. Every
transform runs its ``init`` and ``update`` under
``jax.named_scope(<its factory's name>)``, so profiles show ``adamp`` or
``rmnp``, not anonymous ops. Where they differ from optax on purpose
(float32 moments by default, ``mu_dtype`` for the first moment only) is
listed in docs/API.md, "Deviations from flax and optax".

Examples:
  The matrix ``w`` takes the RMNP step, the bias AdamW's (only it has
  Adam's second moment):

  >>> import jax.numpy as jnp
  >>> from jaxnorm import optim
  >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}  # Flax (in, out)
  >>> state = optim.rmnp(learning_rate=0.02).init(params)
  >>> print(state._fields, state.nu["b"].shape, state.nu["w"])
  ('count', 'momentum', 'nu') (2,) MaskedNode()
"""

from jaxnorm.optim._axes import MatrixAxes, axes_from_names, logical_axes
from jaxnorm.optim.adamp import (
  ScaleByAdampState,
  ScaleBySgdpState,
  adamp,
  scale_by_adamp,
  scale_by_sgdp,
  sgdp,
)
from jaxnorm.optim.complex import (
  ScaleByComplexAdamState,
  complex_adam,
  conjugate_complex,
  scale_by_complex_adam,
)
from jaxnorm.optim.conda import (
  PostStepDecayState,
  ScaleByCondaState,
  add_decayed_weights_after_step,
  conda,
  scale_by_conda,
)
from jaxnorm.optim.nap import NapProjectState, nap_project
from jaxnorm.optim.nap_recipe import (
  NapProjectJointState,
  effective_learning_rate,
  nap_project_joint,
  nap_rewarm_schedule,
  task_reset_schedule,
)
from jaxnorm.optim.rmnp import (
  RmnpState,
  ScaleByRmnpState,
  rmnp,
  scale_by_rmnp,
)

__all__ = [
  "ScaleByComplexAdamState",
  "complex_adam",
  "conjugate_complex",
  "scale_by_complex_adam",
  "MatrixAxes",
  "RmnpState",
  "axes_from_names",
  "logical_axes",
  "NapProjectJointState",
  "NapProjectState",
  "effective_learning_rate",
  "nap_project_joint",
  "nap_rewarm_schedule",
  "task_reset_schedule",
  "PostStepDecayState",
  "ScaleByCondaState",
  "ScaleByRmnpState",
  "add_decayed_weights_after_step",
  "conda",
  "nap_project",
  "rmnp",
  "scale_by_conda",
  "scale_by_rmnp",
  "ScaleByAdampState",
  "ScaleBySgdpState",
  "adamp",
  "scale_by_adamp",
  "scale_by_sgdp",
  "sgdp",
]
