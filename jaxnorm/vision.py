"""Conv-side attention for NHWC feature maps: ELA and polarized self-attention.

Inputs are ``(B, H, W, C)``. Statistics (GroupNorm, LayerNorm, softmax) run
in ``promote_types(x.dtype, float32)``; GroupNorm and LayerNorm are
`jaxnorm.norms.group_norm` and `jaxnorm.norms.layer_norm` (two-pass
variances). Outputs have ``x.dtype``. Weights are explicit arguments; the
modules live in `jaxnorm.nn.vision`.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, norms

# ELA presets: (kernel size, conv group size or None for depthwise, GN groups).
# Conv groups are C (depthwise) for T/B and C/8 (8 channels per group) for
# S/L. Unverified: the table comes from third-party re-implementations that
# agree with each other; the paper body was not readable.
ELA_PRESETS: dict[str, tuple[int, int | None, int]] = {
  "T": (5, None, 32),
  "B": (7, None, 16),
  "S": (5, 8, 16),
  "L": (7, 8, 16),
}


def ela_config(variant: str, channels: int) -> tuple[int, int, int]:
  """``(kernel_size, conv_groups, norm_groups)`` of ELA-T/B/S/L at ``C``.

  Raises:
    ValueError: on an unknown variant or channels the groups do not divide.
  """
  who = "ela_config"
  _checks.check_choice(who, "variant", variant, tuple(ELA_PRESETS))
  _checks.check_positive_int(who, "channels", channels)
  k, per_group, ng = ELA_PRESETS[variant]
  if per_group is None:
    groups = channels
  else:
    _checks.check_divisible(who, "channels", channels, "8 (ELA-S/L)", 8)
    groups = channels // per_group
  _checks.check_divisible(who, "channels", channels, "norm_groups", ng)
  return k, groups, ng


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

  References:
    Xu & Wan, *ELA: Efficient Local Attention for Deep Convolutional Neural
    Networks*, arXiv:2403.01123 (2024).
  """
  who = "efficient_local_attention"
  _checks.check_floating(who, "x", x)
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


def _spatial_softmax(s: jax.Array) -> jax.Array:
  b, h, w, c = s.shape
  return jax.nn.softmax(s.reshape(b, h * w, c), axis=1).reshape(s.shape)


def psa_channel(
  x: Float[Array, "B H W C"],
  query: Float[Array, "C 1"],
  value: Float[Array, "C Cp"],
  out: Float[Array, "Cp C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  *,
  eps: float = 1e-5,
) -> Float[Array, "B H W C"]:
  r"""PSA channel-only branch (paper form).

  .. math:: q = \mathrm{softmax}_{HW}(x W_q), \ z = \sum_{HW} q \odot
     (x W_v), \ A = \sigma(\mathrm{LN}_C(z W_z)), \ Z = A \odot x

  ``W_q: C -> 1``, ``W_v: C -> C'``, ``W_z: C' -> C`` are 1x1 convs without
  bias; the LayerNorm normalizes over ``C``.
  """
  who = "psa_channel"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, expected=4)
  c = x.shape[-1]
  _checks.check_shape(who, "query", query, (c, 1), "(C, 1)")
  if value.ndim != 2 or value.shape[0] != c:
    raise ValueError(
      f"{who}: value must have shape ({c}, C'), got {value.shape=}"
    )
  cp = value.shape[1]
  _checks.check_shape(who, "out", out, (cp, c), "(C', C)")
  _checks.check_shape(who, "norm_scale", norm_scale, (c,), "channels")
  _checks.check_shape(who, "norm_bias", norm_bias, (c,), "channels")
  dtype = _numerics.compute_dtype(x)
  xc = x.astype(dtype)
  q = _spatial_softmax(xc @ query.astype(dtype))  # B H W 1
  z = jnp.sum(q * (xc @ value.astype(dtype)), axis=(1, 2))  # B C'
  y = norms.layer_norm(z @ out.astype(dtype), norm_scale, norm_bias, eps=eps)
  a = jax.nn.sigmoid(y)[:, None, None, :]
  return (xc * a).astype(x.dtype)


def psa_spatial(
  x: Float[Array, "B H W C"],
  query: Float[Array, "C Cp"],
  value: Float[Array, "C Cp"],
) -> Float[Array, "B H W C"]:
  r"""PSA spatial-only branch (paper form).

  .. math:: q = \mathrm{softmax}_{C'}(\mathrm{GAP}(x W_q)), \
     A = \sigma(\langle q, x W_v \rangle_{C'}), \ Z = A \odot x
  """
  who = "psa_spatial"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, expected=4)
  c = x.shape[-1]
  if query.ndim != 2 or query.shape[0] != c:
    raise ValueError(
      f"{who}: query must have shape ({c}, C'), got {query.shape=}"
    )
  _checks.check_shape(who, "value", value, query.shape, "like query")
  dtype = _numerics.compute_dtype(x)
  xc = x.astype(dtype)
  q = jax.nn.softmax(jnp.mean(xc @ query.astype(dtype), axis=(1, 2)), -1)
  s = jnp.einsum("bhwc,bc->bhw", xc @ value.astype(dtype), q)
  return (xc * jax.nn.sigmoid(s)[..., None]).astype(x.dtype)


def polarized_self_attention(
  x: Float[Array, "B H W C"],
  *,
  channel_query: Float[Array, "C 1"],
  channel_value: Float[Array, "C Cp"],
  channel_out: Float[Array, "Cp C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  spatial_query: Float[Array, "C Cp"],
  spatial_value: Float[Array, "C Cp"],
  layout: Literal["parallel", "sequential"] = "parallel",
  eps: float = 1e-5,
) -> Float[Array, "B H W C"]:
  r"""Polarized self-attention: channel-only and spatial-only branches.

  Parallel: :math:`Z_{ch}(x) + Z_{sp}(x)`; sequential:
  :math:`Z_{sp}(Z_{ch}(x))` (channel first). Branches are `psa_channel` and
  `psa_spatial` with ``C' = C/2`` by convention.

  Unverified: this is the paper form as read from third-party
  re-implementations (the paper body was not readable); the LayerNorm
  placement and the spatial softmax axis follow them. The official code's
  ``PSA_p``/``PSA_s`` differ (no LayerNorm / a bottleneck ``W_z``, softmax
  over HW in the spatial branch) and are not reproduced here.

  Raises:
    ValueError: on mismatched weight shapes or an unknown layout.
    TypeError: if ``x`` is not floating.

  References:
    Liu et al., *Polarized Self-Attention: Towards High-quality Pixel-wise
    Regression*, arXiv:2107.00782 (2021).
  """
  _checks.check_choice(
    "polarized_self_attention", "layout", layout, ("parallel", "sequential")
  )
  ch = psa_channel(
    x, channel_query, channel_value, channel_out, norm_scale, norm_bias, eps=eps
  )
  if layout == "sequential":
    return psa_spatial(ch, spatial_query, spatial_value)
  sp = psa_spatial(x, spatial_query, spatial_value)
  dtype = _numerics.compute_dtype(x)
  return (ch.astype(dtype) + sp.astype(dtype)).astype(x.dtype)
