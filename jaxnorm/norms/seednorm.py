"""SeeDNorm: RMSNorm with an input-dependent, bounded rescaling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope


@_scope.scoped
def seed_norm(
  x: Float[ArrayLike, "... d"],
  scale: Float[ArrayLike, " d"],
  dyn_scale: Float[ArrayLike, " d"],
  dyn_proj: Float[ArrayLike, " d"],
  *,
  eps: float = 1e-6,
  num_heads: int = 1,
  axis: int = -1,
  dyn_scale_div_dim: bool = False,
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "... d"]:
  r"""SeeDNorm: RMSNorm with an input-dependent, bounded rescaling.

  For each token ``x`` (features on ``axis``, width ``D``) and head ``h`` of
  ``H = num_heads`` contiguous chunks,

  .. math::
    s_h(x) = \gamma_h + \alpha_h \tanh(\langle x_h, \beta_h \rangle),\qquad
    y = s(x) \odot \frac{x}{\sqrt{\mathrm{mean}_D(x^2) + \epsilon}}

  where :math:`\gamma` = ``scale``, :math:`\alpha` = ``dyn_scale`` and
  :math:`\beta` = ``dyn_proj``. The RMS is always over the full ``D``. The
  dot product uses the raw (un-normalized) input, so the norm of ``x`` leaks
  into ``y`` but only boundedly: ``|s_i(x) - gamma_i| <= |alpha_i|``.
  ``dyn_proj = 0`` (or ``dyn_scale = 0``) gives RMSNorm with gain ``scale``.
  Paper init: ``scale = 1, dyn_scale = 1, dyn_proj = 0`` (language models).

  Unverified: the paper's full text was not readable when this was written
  (spec: secondary sources that agree). With ``dyn_scale_div_dim`` the dot
  product is divided by ``D`` (the full width) before the tanh; this is our
  reading of the vision-only "divide by the dimension" trick. The vision-only
  dropout on the dynamic term is left to the caller (apply it to the
  module's output difference), since pure functions hide no randomness.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input with features on ``axis``.
    scale: :math:`\gamma`, shape ``(D,)``.
    dyn_scale: :math:`\alpha`, shape ``(D,)``.
    dyn_proj: :math:`\beta`, shape ``(D,)``.
    eps: added inside the square root.
    num_heads: number of heads ``H``; must divide ``D``.
    axis: the feature axis.
    dyn_scale_div_dim: divide the dot product by ``D`` before the tanh.
    implementation: ``"xla"`` (this reference), ``"pallas"`` (the
      `pallas_kernels.norms` kernel) or ``None`` (the kernel on GPU/TPU when
      it supports the case, else the reference).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or head count.
    NotImplementedError: ``implementation="pallas"`` on a case the kernel
      does not support (named in the message).

  Examples:
    >>> x = jnp.array([3.0, 4.0])
    >>> y = norms.seed_norm(x, jnp.ones(2), jnp.ones(2), jnp.zeros(2))
    >>> print(np.asarray(y).round(4))  # dyn_proj 0: RMSNorm
    [0.8485 1.1314]
    >>> y = norms.seed_norm(x, jnp.ones(2), jnp.ones(2), jnp.full(2, 10.0))
    >>> print(np.asarray(y).round(4))  # gain 1 + tanh(70) ~ 2
    [1.6971 2.2627]

  References:
    Cai, Zhu, Liu & Min, *SeeDNorm: Self-Rescaled Dynamic Normalization*,
    arXiv:2510.22777 (2025).
  """
  who = "seed_norm"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  for name, p in (
    ("scale", scale),
    ("dyn_scale", dyn_scale),
    ("dyn_proj", dyn_proj),
  ):
    if p is None:
      raise ValueError(f"{who}: {name} is required, got None")
    _numerics.check_param(who, name, p, x, (ax,))
  d = x.shape[ax]
  _checks.check_positive_int(who, "num_heads", num_heads)
  _checks.check_divisible(who, "x.shape[axis]", d, "num_heads", num_heads)
  out = _dispatch.kernel_or_none(
    who,
    implementation,
    "seed_norm_pallas",
    lambda k: k(
      x,
      scale,
      dyn_scale,
      dyn_proj,
      eps=eps,
      num_heads=num_heads,
      axis=ax,
      dyn_scale_div_dim=dyn_scale_div_dim,
    ),
    arrays=(x,),
  )
  if out is not None:
    return out
  cdt = _numerics.compute_dtype(x)
  xf = jnp.moveaxis(x.astype(cdt), ax, -1)
  beta = jnp.asarray(dyn_proj).astype(cdt).reshape(num_heads, d // num_heads)
  xh = xf.reshape(*xf.shape[:-1], num_heads, d // num_heads)
  dot = jnp.sum(xh * beta.reshape((1,) * (xf.ndim - 1) + beta.shape), -1)
  if dyn_scale_div_dim:
    dot = dot / d
  t = jnp.repeat(jnp.tanh(dot), d // num_heads, axis=-1)
  last = (xf.ndim - 1,)
  s = (
    _numerics.expand(scale, xf.ndim, last, cdt)
    + _numerics.expand(dyn_scale, xf.ndim, last, cdt) * t
  )
  ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
  y = s * xf * jax.lax.rsqrt(ms + eps)
  return jnp.moveaxis(y, -1, ax).astype(x.dtype)
