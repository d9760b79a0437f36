"""Scale-vector modules (HG, dual placement) and the IWD norm roles."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  cast,
  maybe,
  param,
  promote,
)

NormRole = Literal["input", "output"]
NORM_ROLES: tuple[str, ...] = ("input", "output")


class ScaleVectorNorm(nnx.Module):
  """RMSNorm whose scale vectors follow the scale-vector paper's switches.

  Maths in `jaxnorm.norms.branch_rms_norm` and
  `jaxnorm.norms.magnitude_direction_scale`. Switches (defaults give the
  plain `RMSNorm`):

  * ``num_branches`` (HG): one affine-free RMSNorm read by that many
    branches (Q, K, V; gate, up), each with its own scale; the call then
    returns a tuple. Parameter ``scale`` has shape ``(num_features,)`` or
    ``(num_branches, num_features)``.
  * ``reparam`` (magnitude-direction): each scale is
    ``scale_magnitude * scale_direction / ||scale_direction|| * sqrt(d)``
    (parameters ``scale_magnitude`` and ``scale_direction``, init 1).
  * ``role``: ``"input"`` (pre-norm, decayed under IWD) or ``"output"``
    (QK-norm, post-branch norm; not decayed); read by `weight_decay_mask`.

  The third improvement, dual placement, is `DualScaledLinear`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_branches: int = 1,
    reparam: bool = False,
    eps: float = 1e-6,
    eps_mode: norms.EpsMode = "inside",
    role: NormRole = "input",
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "ScaleVectorNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_branches", num_branches)
    _checks.check_choice(who, "role", role, NORM_ROLES)
    _checks.check_choice(who, "eps_mode", eps_mode, norms.EPS_MODES)
    draw_keys(rngs)  # Constant initialization: drawn, unused.
    self.num_features, self.num_branches = num_features, num_branches
    self.reparam, self.eps, self.eps_mode = reparam, eps, eps_mode
    self.role, self.dtype = role, dtype
    lead = () if num_branches == 1 else (num_branches,)
    names = (
      None if axis_names is None else (None,) * len(lead) + tuple(axis_names)
    )
    vec = jnp.ones((*lead, num_features), param_dtype)
    if reparam:
      self.scale_magnitude = param(
        jnp.ones(lead or (1,), param_dtype),
        None if axis_names is None else (None,),
      )
      self.scale_direction = param(vec, names)
    else:
      self.scale = param(vec, names)

  def scales(self) -> list[jax.Array]:
    """The effective per-branch scale vectors."""
    if not self.reparam:
      s = self.scale[...]
      return [s] if self.num_branches == 1 else list(s)
    m, u = self.scale_magnitude[...], self.scale_direction[...]
    if self.num_branches == 1:
      return [norms.magnitude_direction_scale(m, u)]
    return [
      norms.magnitude_direction_scale(m[i], u[i])
      for i in range(self.num_branches)
    ]

  def __call__(self, x: jax.Array) -> jax.Array | tuple[jax.Array, ...]:
    """Normalizes ``x``; a tuple of branch outputs if ``num_branches > 1``."""
    x = promote(x, self)
    ys = norms.branch_rms_norm(
      x, self.scales(), eps=self.eps, eps_mode=self.eps_mode
    )
    ys = tuple(cast(y, self) for y in ys)
    return ys[0] if self.num_branches == 1 else ys


class DualScaledLinear(nnx.Module):
  """A bias-free linear map with optional two-sided scale vectors.

  Maths in `jaxnorm.norms.dual_scaled_linear`. ``dual=True`` adds
  ``scale_in`` and ``scale_out`` (init 1, the paper's DP), ``dnp=True`` the
  extra RMS normalization (DNP). The defaults are a plain linear layer.
  ``role`` tags the scales for `weight_decay_mask`; which role the paper
  gives them is unverified (default ``"input"``).
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    dual: bool = False,
    dnp: bool = False,
    eps: float = 1e-6,
    role: NormRole = "input",
    kernel_init: Initializer = nnx.initializers.lecun_normal(),
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    kernel_axis_names: Names = ("embed", "mlp"),
    rngs: nnx.Rngs,
  ):
    who = "DualScaledLinear"
    _checks.check_positive_int(who, "in_features", in_features)
    _checks.check_positive_int(who, "out_features", out_features)
    _checks.check_choice(who, "role", role, NORM_ROLES)
    self.in_features, self.out_features = in_features, out_features
    self.dnp, self.eps, self.role, self.dtype = dnp, eps, role, dtype
    self.kernel = param(
      kernel_init(rngs.params(), (in_features, out_features), param_dtype),
      kernel_axis_names,
    )
    in_names = None if kernel_axis_names is None else kernel_axis_names[:1]
    out_names = None if kernel_axis_names is None else kernel_axis_names[1:]
    self.scale_in = (
      param(jnp.ones((in_features,), param_dtype), in_names) if dual else None
    )
    self.scale_out = (
      param(jnp.ones((out_features,), param_dtype), out_names) if dual else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ``s_out * ((s_in * x) @ kernel)`` (then RMS with ``dnp``)."""
    x = promote(x, self)
    y = norms.dual_scaled_linear(
      x,
      self.kernel[...],
      maybe(self.scale_in),
      maybe(self.scale_out),
      dnp=self.dnp,
      eps=self.eps,
    )
    return cast(y, self)
