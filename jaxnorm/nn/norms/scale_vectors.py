"""Scale-vector modules (HG, dual placement) and the IWD norm roles."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
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
  ``scale_init`` initializes ``scale`` (its full shape); with ``reparam``
  the paper's start (magnitude 1, direction ones) is kept and
  ``scale_init`` refused. The scale vectors are the module, so
  ``use_scale=False`` is refused (`RMSNorm` takes it), and there is no
  bias.

  Examples:
    >>> norm = ScaleVectorNorm(2, num_branches=2, rngs=nnx.Rngs(0))  # HG
    >>> q, k = norm(jnp.array([3.0, 4.0]))  # one RMS, a unit scale per branch
    >>> norm.scale[...].shape, [round(v, 4) for v in k.tolist()]
    ((2, 2), [0.8485, 1.1314])
  """

  @paper_affine(
    no_bias="the paper studies RMSNorm's scale vectors; no shift",
    needs_scale="the scale vectors are what this module studies; "
    "RMSNorm(use_scale=False) is the norm without them",
  )
  def __init__(
    self,
    num_features: int,
    *,
    num_branches: int = 1,
    reparam: bool = False,
    eps: float = 1e-6,
    eps_mode: norms.EpsMode = "inside",
    role: NormRole = "input",
    scale_init: Initializer | None = None,
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
    if reparam and scale_init is not None:
      raise ValueError(
        f"{who}: scale_init is not available with reparam=True: the "
        "magnitude-direction scale starts as the paper's (magnitude 1, "
        "direction ones); give reparam=False for an initialized scale"
      )
    scale_key, _ = draw_keys(rngs)
    self.num_features, self.num_branches = num_features, num_branches
    self.reparam, self.eps, self.eps_mode = reparam, eps, eps_mode
    self.role, self.dtype = role, dtype
    lead = () if num_branches == 1 else (num_branches,)
    names = (
      None if axis_names is None else (None,) * len(lead) + tuple(axis_names)
    )
    init = nnx.initializers.ones if scale_init is None else scale_init
    vec = init(scale_key, (*lead, num_features), param_dtype)
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

  Examples:
    >>> layer = DualScaledLinear(2, 3, dual=True, rngs=nnx.Rngs(0))
    >>> x = jnp.ones((4, 2))
    >>> y = layer(x)  # unit scales at init: x @ kernel
    >>> y.shape, bool(jnp.allclose(y, x @ layer.kernel[...]))
    ((4, 3), True)
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
