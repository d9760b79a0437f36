"""ELA: efficient local attention, a gate for NHWC CNN feature maps.

GroupNorm is `jaxnorm.norms.group_norm` (two-pass variance), in
``promote_types(dtype, float32)``; the output has the input's dtype. Weights
are explicit arguments; the module is `jaxnorm.nn.ELA`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope, norms

# ELA presets: (kernel size, conv group size or None for depthwise, GN groups).
# Conv groups are C (depthwise) for T/B and C/8 (8 channels per group) for
# S/L. Unverified: the table comes from third-party re-implementations that
# agree with each other; the paper body was not readable.
_ELA_PRESETS: dict[str, tuple[int, int | None, int]] = {
  "T": (5, None, 32),
  "B": (7, None, 16),
  "S": (5, 8, 16),
  "L": (7, 8, 16),
}


@_scope.scoped
def ela_config(variant: str, channels: int) -> tuple[int, int, int]:
  """``(kernel_size, conv_groups, norm_groups)`` of ELA-T/B/S/L at ``C``.

  Raises:
    ValueError: on an unknown variant or channels the groups do not divide.

  Examples:
    >>> print(attention.ela_config("T", 64), attention.ela_config("S", 64))
    (5, 64, 32) (5, 8, 16)
  """
  who = "ela_config"
  _checks.check_choice(who, "variant", variant, tuple(_ELA_PRESETS))
  _checks.check_positive_int(who, "channels", channels)
  k, per_group, ng = _ELA_PRESETS[variant]
  if per_group is None:
    groups = channels
  else:
    _checks.check_divisible(who, "channels", channels, "8 (ELA-S/L)", 8)
    groups = channels // per_group
  _checks.check_divisible(who, "channels", channels, "norm_groups", ng)
  return k, groups, ng


@_scope.scoped
def efficient_local_attention(
  x: Float[Array, "B H W C"],
  conv_kernel: Float[Array, "k Cg C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  *,
  norm_groups: int,
  eps: float = 1e-5,
) -> Float[Array, "B H W C"]:
  r"""ELA: strip-pooled 1-D conv + GroupNorm + sigmoid gates on H and W.

  .. math::
     z_h = \mathrm{mean}_W\,x, \quad z_w = \mathrm{mean}_H\,x, \quad
     a_\bullet = \sigma(\mathrm{GN}(\mathrm{conv1d}(z_\bullet))), \quad
     y = x \odot a_h \odot a_w

  One conv (``padding = k//2``, no bias) and one GroupNorm are shared by both
  strips; GN statistics are per sample and per strip. There is no channel
  reduction. Conv groups ``G = C / conv_kernel.shape[1]`` (``C`` for the
  depthwise ELA-T/B, ``C/8`` for ELA-S/L; see `ela_config`).

  Args:
    x: ``(B, H, W, C)``.
    conv_kernel: ``(k, C/G, C)`` (flax ``Conv`` layout), ``k`` odd.
    norm_scale: GroupNorm scale ``(C,)``.
    norm_bias: GroupNorm bias ``(C,)``.
    norm_groups: GroupNorm groups.
    eps: GroupNorm epsilon (torch default 1e-5).

  Returns:
    ``x.shape`` in ``x.dtype``.

  Raises:
    ValueError: on mismatched shapes, an even kernel or indivisible groups.
    TypeError: if ``x`` is not floating.

  Examples:
    >>> x = jnp.ones((1, 2, 2, 2))  # (B, H, W, C)
    >>> y = attention.efficient_local_attention(
    ...     x, jnp.zeros((3, 1, 2)), jnp.ones(2), jnp.zeros(2), norm_groups=1)
    >>> print(np.asarray(y[0, 0, 0]))  # both gates sigmoid(0)
    [0.25 0.25]

  References:
    Xu & Wan, *ELA: Efficient Local Attention for Deep Convolutional Neural
    Networks*, arXiv:2403.01123 (2024).
  """
  who = "efficient_local_attention"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=4)
  c = x.shape[-1]
  if (
    conv_kernel.ndim != 3
    or conv_kernel.shape[2] != c
    or (c % conv_kernel.shape[1])
    or conv_kernel.shape[0] % 2 == 0
  ):
    raise ValueError(
      f"{who}: conv_kernel must have shape (k, C/G, C) with odd k and "
      f"C={c} divisible by C/G, got {conv_kernel.shape=}"
    )
  _checks.check_shape(who, "norm_scale", norm_scale, (c,), "channels")
  _checks.check_shape(who, "norm_bias", norm_bias, (c,), "channels")
  _checks.check_positive_int(who, "norm_groups", norm_groups)
  _checks.check_divisible(who, "channels", c, "norm_groups", norm_groups)
  dtype = _numerics.compute_dtype(x)
  xc = x.astype(dtype)
  groups = c // conv_kernel.shape[1]
  kern = conv_kernel.astype(dtype)

  def gate(z):  # (B, L, C)
    y = jax.lax.conv_general_dilated(
      z,
      kern,
      (1,),
      "SAME",
      dimension_numbers=("NWC", "WIO", "NWC"),
      feature_group_count=groups,
    )
    gn = norms.group_norm(
      y, norm_scale, norm_bias, num_groups=norm_groups, eps=eps
    )
    return jax.nn.sigmoid(gn)

  a_h = gate(jnp.mean(xc, axis=2))  # (B, H, C)
  a_w = gate(jnp.mean(xc, axis=1))  # (B, W, C)
  return (xc * a_h[:, :, None, :] * a_w[:, None, :, :]).astype(x.dtype)
