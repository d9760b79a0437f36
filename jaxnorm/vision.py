"""Vision attention: ELA and PSA on NHWC maps, SOFT and NaLa on token maps.

Conv-side attention (ELA, polarized self-attention) takes ``(B, H, W, C)``.
The SOFT and NaLaFormer layers act on a token sequence that holds a 2-D map
(``grid_shape``, after ``num_prefix`` tokens such as a ViT's [CLS]); they
add the pieces of the papers' layers that need the map (learned conv
landmarks, depthwise-conv branches, 2-D RoPE) around the kernels of
`jaxnorm.attention`.

Statistics (GroupNorm, LayerNorm, softmax) run in ``promote_types(dtype,
float32)``; GroupNorm and LayerNorm are `jaxnorm.norms.group_norm` and
`jaxnorm.norms.layer_norm` (two-pass variances). Outputs have the input's
dtype. Weights are explicit arguments; the modules live in
`jaxnorm.nn.vision` and `jaxnorm.nn.attention.cores`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, norms
from jaxnorm import attention as attn

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


# ---------------------------------------------------------------------------
# Polarized self-attention (PSA).


def _spatial_softmax(s: jax.Array) -> jax.Array:
  """Softmax over the ``H, W`` axes of ``(B, H, W, C)``, per channel."""
  b, h, w, c = s.shape
  return jax.nn.softmax(s.reshape(b, h * w, c), axis=1).reshape(s.shape)


def _matrix_columns(
  who: str, name: str, w: jax.Array, rows: int, columns: str
) -> int:
  """Checks a ``(rows, columns)`` 1x1-conv matrix; returns its columns."""
  if w.ndim != 2 or w.shape[0] != rows:
    raise ValueError(
      f"{who}: {name} must have shape ({rows}, {columns}), got "
      f"{name}.shape={w.shape}"
    )
  return w.shape[1]


def _check_psa(
  who: str,
  x: jax.Array,
  channel_query: jax.Array,
  channel_value: jax.Array,
  spatial_query: jax.Array,
  spatial_value: jax.Array,
) -> tuple[int, int]:
  """Checks the weights every PSA form has; returns ``(C, C')``."""
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, expected=4)
  c = x.shape[-1]
  _checks.check_shape(who, "channel_query", channel_query, (c, 1), "(C, 1)")
  cp = _matrix_columns(who, "channel_value", channel_value, c, "C'")
  for name, w in (
    ("spatial_query", spatial_query),
    ("spatial_value", spatial_value),
  ):
    _checks.check_shape(who, name, w, (c, cp), "(C, C') like channel_value")
  return c, cp


def _psa_channel_gate(
  xc: jax.Array,
  query: jax.Array,
  value: jax.Array,
  up: Callable[[jax.Array], jax.Array],
) -> jax.Array:
  r""":math:`\sigma(\mathrm{up}(z))`, ``(B, 1, 1, C)``, with ``z (B, C')``.

  :math:`z = \sum_{HW} \mathrm{softmax}_{HW}(x W_q) \odot x W_v`.
  """
  q = _spatial_softmax(xc @ query.astype(xc.dtype))  # B H W 1
  z = jnp.sum(q * (xc @ value.astype(xc.dtype)), axis=(1, 2))  # B C'
  return jax.nn.sigmoid(up(z))[:, None, None, :]


def _psa_spatial_gate(
  xc: jax.Array,
  query: jax.Array,
  value: jax.Array,
  softmax: Literal["logits", "values", "channels"],
) -> jax.Array:
  r""":math:`\sigma(\langle g, \theta \rangle_{C'})`, ``(B, H, W, 1)``.

  ``g = GAP(x W_q) (B, C')`` and ``theta = x W_v (B, H, W, C')``; the
  softmax runs over ``HW`` on the logits (``PSA_p``), over ``HW`` on
  ``theta`` per channel (``PSA_s``) or over ``C'`` on ``g`` (paper form).
  """
  g = jnp.mean(xc @ query.astype(xc.dtype), axis=(1, 2))  # B C'
  theta = xc @ value.astype(xc.dtype)  # B H W C'
  if softmax == "channels":
    g = jax.nn.softmax(g, axis=-1)
  elif softmax == "values":
    theta = _spatial_softmax(theta)
  s = jnp.einsum("bhwc,bc->bhw", theta, g)[..., None]
  if softmax == "logits":
    s = _spatial_softmax(s)
  return jax.nn.sigmoid(s)


def psa_parallel(
  x: Float[Array, "B H W C"],
  *,
  channel_query: Float[Array, "C 1"],
  channel_value: Float[Array, "C Cp"],
  channel_up: Float[Array, "Cp C"],
  spatial_query: Float[Array, "C Cp"],
  spatial_value: Float[Array, "C Cp"],
) -> Float[Array, "B H W C"]:
  r"""Polarized self-attention, the official parallel layer ``PSA_p``.

  .. math::
     z = \sum_{HW} \mathrm{softmax}_{HW}(x W_q^{ch}) \odot x W_v^{ch}, \quad
     A_{ch} = \sigma(z\, W_{up}), \\
     g = \mathrm{GAP}(x W_q^{sp}), \quad
     A_{sp} = \sigma\big(\mathrm{softmax}_{HW}
       (\langle g, x W_v^{sp} \rangle_{C'})\big), \quad
     y = A_{ch} \odot x + A_{sp} \odot x

  All ``W`` are bias-free 1x1 convs (matrices here). The channel branch has
  no LayerNorm; the spatial branch takes the softmax over ``HW`` of the
  logits, then the sigmoid (softmax and sigmoid in that order, as in
  ``PSA_p.channel_pool`` of the official code). Official names (NCHW
  there): ``conv_q_right`` = ``channel_query``, ``conv_v_right`` =
  ``channel_value``, ``conv_up`` = ``channel_up``, ``conv_q_left`` (g) =
  ``spatial_query``, ``conv_v_left`` (theta) = ``spatial_value``; the
  official ``C' = C // 2``. Softmax and sigmoids run in
  ``promote_types(x.dtype, float32)``.

  Args:
    x: ``(B, H, W, C)``.
    channel_query: ``(C, 1)``.
    channel_value: ``(C, C')``.
    channel_up: ``(C', C)``.
    spatial_query: ``(C, C')``.
    spatial_value: ``(C, C')``.

  Returns:
    ``x.shape`` in ``x.dtype``.

  Raises:
    ValueError: on mismatched weight shapes.
    TypeError: if ``x`` is not floating.

  References:
    Liu et al., *Polarized Self-Attention: Towards High-quality Pixel-wise
    Regression*, arXiv:2107.00782 (2021); official code
    ``DeLightCMU/PSA semantic-segmentation/network/PSA.py`` (``PSA_p``).
  """
  who = "psa_parallel"
  c, cp = _check_psa(
    who, x, channel_query, channel_value, spatial_query, spatial_value
  )
  _checks.check_shape(who, "channel_up", channel_up, (cp, c), "(C', C)")
  xc = x.astype(_numerics.compute_dtype(x))
  a_ch = _psa_channel_gate(
    xc, channel_query, channel_value, lambda z: z @ channel_up.astype(z.dtype)
  )
  a_sp = _psa_spatial_gate(xc, spatial_query, spatial_value, "logits")
  return (xc * a_ch + xc * a_sp).astype(x.dtype)


def psa_sequential(
  x: Float[Array, "B H W C"],
  *,
  channel_query: Float[Array, "C 1"],
  channel_value: Float[Array, "C Cp"],
  channel_down: Float[Array, "Cp Cb"],
  channel_down_bias: Float[Array, " Cb"],
  channel_norm_scale: Float[Array, " Cb"],
  channel_norm_bias: Float[Array, " Cb"],
  channel_up: Float[Array, "Cb C"],
  channel_up_bias: Float[Array, " C"],
  spatial_query: Float[Array, "C Cp"],
  spatial_value: Float[Array, "C Cp"],
  eps: float = 1e-5,
) -> Float[Array, "B H W C"]:
  r"""Polarized self-attention, the official sequential layer ``PSA_s``.

  .. math::
     z = \sum_{HW} \mathrm{softmax}_{HW}(x W_q^{ch}) \odot x W_v^{ch}, \quad
     A_{ch} = \sigma\big(\mathrm{ReLU}(\mathrm{LN}(z W_d + b_d)) W_u + b_u
       \big), \quad x' = A_{ch} \odot x, \\
     g = \mathrm{GAP}(x' W_q^{sp}), \quad
     A_{sp} = \sigma\big(\langle g, \mathrm{softmax}_{HW}(x' W_v^{sp})
       \rangle_{C'}\big), \quad y = A_{sp} \odot x'

  Channel branch first, then the spatial branch on its output. The channel
  branch's ``conv_up`` is a bottleneck ``C' -> C_b -> C`` with biases and a
  LayerNorm over ``C_b`` (official ``C_b = C' // 4``,
  ``nn.LayerNorm([C_b, 1, 1])``, eps 1e-5); the spatial branch takes the
  softmax over ``HW`` of ``x' W_v^{sp}`` per channel, before the product
  with the pooled query. Other names as in `psa_parallel`.

  Args:
    x: ``(B, H, W, C)``.
    channel_query: ``(C, 1)``, bias-free.
    channel_value: ``(C, C')``, bias-free.
    channel_down: ``(C', C_b)`` (``conv_up[0]``).
    channel_down_bias: ``(C_b,)``.
    channel_norm_scale: ``(C_b,)`` (``conv_up[1]``).
    channel_norm_bias: ``(C_b,)``.
    channel_up: ``(C_b, C)`` (``conv_up[3]``).
    channel_up_bias: ``(C,)``.
    spatial_query: ``(C, C')``, bias-free.
    spatial_value: ``(C, C')``, bias-free.
    eps: the bottleneck LayerNorm epsilon (torch default 1e-5).

  Returns:
    ``x.shape`` in ``x.dtype``.

  Raises:
    ValueError: on mismatched weight shapes.
    TypeError: if ``x`` is not floating.

  References:
    Liu et al., arXiv:2107.00782 (2021); official code
    ``DeLightCMU/PSA semantic-segmentation/network/PSA.py`` (``PSA_s``).
  """
  who = "psa_sequential"
  c, cp = _check_psa(
    who, x, channel_query, channel_value, spatial_query, spatial_value
  )
  cb = _matrix_columns(who, "channel_down", channel_down, cp, "C_b")
  for name, w in (
    ("channel_down_bias", channel_down_bias),
    ("channel_norm_scale", channel_norm_scale),
    ("channel_norm_bias", channel_norm_bias),
  ):
    _checks.check_shape(who, name, w, (cb,), "(C_b,)")
  _checks.check_shape(who, "channel_up", channel_up, (cb, c), "(C_b, C)")
  _checks.check_shape(who, "channel_up_bias", channel_up_bias, (c,), "(C,)")
  xc = x.astype(_numerics.compute_dtype(x))

  def up(z):
    h = (
      z @ channel_down.astype(z.dtype) + channel_down_bias.astype(z.dtype)[None]
    )
    h = norms.layer_norm(h, channel_norm_scale, channel_norm_bias, eps=eps)
    h = jax.nn.relu(h)
    return (
      h @ channel_up.astype(z.dtype) + channel_up_bias.astype(z.dtype)[None]
    )

  xc = xc * _psa_channel_gate(xc, channel_query, channel_value, up)
  a_sp = _psa_spatial_gate(xc, spatial_query, spatial_value, "values")
  return (xc * a_sp).astype(x.dtype)


def psa_paper_form(
  x: Float[Array, "B H W C"],
  *,
  channel_query: Float[Array, "C 1"],
  channel_value: Float[Array, "C Cp"],
  channel_up: Float[Array, "Cp C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  spatial_query: Float[Array, "C Cp"],
  spatial_value: Float[Array, "C Cp"],
  layout: Literal["parallel", "sequential"] = "parallel",
  eps: float = 1e-5,
) -> Float[Array, "B H W C"]:
  r"""Polarized self-attention as third-party re-implementations read it.

  .. math::
     A_{ch} = \sigma(\mathrm{LN}_C(z W_{up})), \quad
     A_{sp} = \sigma(\langle \mathrm{softmax}_{C'}(\mathrm{GAP}(x W_q^{sp})),
       x W_v^{sp} \rangle_{C'})

  with ``z`` as in `psa_parallel`; parallel :math:`A_{ch} \odot x + A_{sp}
  \odot x`, sequential :math:`A_{sp}(x') \odot x'` with :math:`x' = A_{ch}
  \odot x`. All convs bias-free.

  Unverified: this is the paper's form as widely re-implemented (e.g.
  External-Attention-pytorch's ``PolarizedSelfAttention``): a LayerNorm over
  ``C`` in the channel branch and a softmax over ``C'`` of the pooled query
  in the spatial branch. The paper body was not read, and the released
  checkpoints use the official layers `psa_parallel` / `psa_sequential`,
  which differ (no LayerNorm / a bottleneck, softmax over ``HW``).

  Raises:
    ValueError: on mismatched weight shapes or an unknown layout.
    TypeError: if ``x`` is not floating.

  References:
    Liu et al., arXiv:2107.00782 (2021).
  """
  who = "psa_paper_form"
  _checks.check_choice(who, "layout", layout, ("parallel", "sequential"))
  c, cp = _check_psa(
    who, x, channel_query, channel_value, spatial_query, spatial_value
  )
  _checks.check_shape(who, "channel_up", channel_up, (cp, c), "(C', C)")
  _checks.check_shape(who, "norm_scale", norm_scale, (c,), "channels")
  _checks.check_shape(who, "norm_bias", norm_bias, (c,), "channels")
  xc = x.astype(_numerics.compute_dtype(x))

  def up(z):
    y = z @ channel_up.astype(z.dtype)
    return norms.layer_norm(y, norm_scale, norm_bias, eps=eps)

  ch = xc * _psa_channel_gate(xc, channel_query, channel_value, up)
  if layout == "sequential":
    y = ch * _psa_spatial_gate(ch, spatial_query, spatial_value, "channels")
  else:
    y = ch + xc * _psa_spatial_gate(
      xc, spatial_query, spatial_value, "channels"
    )
  return y.astype(x.dtype)


# ---------------------------------------------------------------------------
# Attention layers on a 2-D token map (SOFT, NaLaFormer).
#
# A token sequence ``(B, T, ...)`` holds ``num_prefix`` tokens without a
# position (e.g. a ViT's [CLS]) followed by the ``grid_shape = (h, w)`` map
# in row-major order, ``T = num_prefix + h * w``.


def grid_tokens(
  grid_shape: tuple[int, int], num_prefix: int = 0, *, who: str = "grid_tokens"
) -> int:
  """The token count ``num_prefix + h * w`` of a token map.

  Args:
    grid_shape: ``(h, w)``, two positive ints.
    num_prefix: tokens before the map (e.g. 1 for a [CLS]), ``>= 0``.
    who: the caller's name, for the message.

  Returns:
    ``num_prefix + h * w``.

  Raises:
    ValueError: if ``grid_shape`` is not two positive ints or
      ``num_prefix`` is not a non-negative int.
  """
  if (
    not isinstance(grid_shape, tuple)
    or len(grid_shape) != 2
    or not all(
      isinstance(g, int) and not isinstance(g, bool) and g > 0
      for g in grid_shape
    )
  ):
    raise ValueError(
      f"{who}: grid_shape must be a tuple of two positive ints (h, w), got "
      f"{grid_shape=}"
    )
  if isinstance(num_prefix, bool) or not isinstance(num_prefix, int):
    raise ValueError(
      f"{who}: num_prefix must be a non-negative int, got {num_prefix=}"
    )
  _checks.check_nonnegative(who, "num_prefix", num_prefix)
  return num_prefix + grid_shape[0] * grid_shape[1]


def _check_grid(
  who: str, grid_shape: Any, num_prefix: Any, length: int
) -> tuple[int, int]:
  """Checks ``grid_shape``/``num_prefix`` against a sequence length."""
  total = grid_tokens(grid_shape, num_prefix, who=who)
  if length != total:
    raise ValueError(
      f"{who}: the sequence must hold num_prefix + h * w = {num_prefix} + "
      f"{grid_shape[0]} * {grid_shape[1]} = {total} tokens, got {length}"
    )
  return grid_shape


def _check_square_kernel(
  who: str, name: str, kernel: jax.Array, tail: tuple[int, ...], odd: bool
) -> int:
  """Checks a ``(k, k, *tail)`` kernel; returns ``k``."""
  k = kernel.shape[0] if kernel.ndim else 0
  if (
    kernel.ndim != 2 + len(tail)
    or kernel.shape[1] != k
    or tuple(kernel.shape[2:]) != tail
    or (odd and k % 2 == 0)
  ):
    kind = "odd k" if odd else "k"
    raise ValueError(
      f"{who}: {name} must have shape (k, k, {', '.join(map(str, tail))}) "
      f"with {kind}, got {name}.shape={kernel.shape}"
    )
  return k


def grid_rope_tables(
  grid_shape: tuple[int, int],
  head_dim: int,
  *,
  num_prefix: int = 0,
  base: float = 10000.0,
) -> tuple[Float[Array, "T H"], Float[Array, "T H"]]:
  r"""NaLaFormer's 2-D rotate-every-two RoPE tables ``(sin, cos)``.

  .. math::
     \omega_i = \mathrm{base}^{-i/(H/4 - 1)},\ i < H/4, \quad
     \theta_{(r, c)} = [r\,\omega \otimes 1_2;\ c\,\omega \otimes 1_2]

  Each frequency is repeated for the two entries of a rotated pair; the
  first ``H/2`` feature dims rotate with the row ``r``, the last ``H/2``
  with the column ``c`` (official ``RoPE`` of ``NALA.py``, where the
  exponents are ``linspace(0, 1, H/4)``). Rows are the tokens in sequence
  order; the ``num_prefix`` leading tokens get ``sin = 0, cos = 1`` (not
  rotated).

  Args:
    grid_shape: ``(h, w)`` of the token map.
    head_dim: ``H``, a multiple of 4.
    num_prefix: tokens before the map.
    base: frequency base.

  Returns:
    ``(sin, cos)``, each ``(num_prefix + h * w, H)`` float32.

  Raises:
    ValueError: on a bad grid or a head dim not divisible by 4.

  References:
    Meng et al., arXiv:2506.21137 (2025), code ``ZacharyMeng/NaLaFormer``.
  """
  who = "grid_rope_tables"
  _checks.check_positive_int(who, "head_dim", head_dim)
  _checks.check_divisible(who, "head_dim", head_dim, "4", 4)
  grid_tokens(grid_shape, num_prefix, who=who)
  gh, gw = grid_shape
  angle = jnp.repeat(
    1.0 / base ** jnp.linspace(0.0, 1.0, head_dim // 4, dtype=jnp.float32), 2
  )
  angle = angle[None, None, :]
  rows = jnp.arange(gh, dtype=jnp.float32)[:, None, None] * angle
  cols = jnp.arange(gw, dtype=jnp.float32)[None, :, None] * angle
  theta = jnp.concatenate(
    [
      jnp.broadcast_to(rows, (gh, gw, head_dim // 2)),
      jnp.broadcast_to(cols, (gh, gw, head_dim // 2)),
    ],
    axis=-1,
  ).reshape(gh * gw, head_dim)
  pad = jnp.zeros((num_prefix, head_dim), jnp.float32)
  theta = jnp.concatenate([pad, theta], axis=0)
  return jnp.sin(theta), jnp.cos(theta)


def nala_grid_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B T N H"],
  value: Float[Array, "B T N H"],
  gate: Float[Array, "B T N H"],
  *,
  lepe_kernel: Float[Array, "k k C"],
  lepe_bias: Float[Array, " C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  power_scale: float = 3.0,
  eps: float = 1e-6,
  norm_eps: float = 1e-5,
  rope_base: float = 10000.0,
) -> Float[Array, "B T N H"]:
  r"""NaLaFormer's attention layer on a token map (official ``NALA.py``).

  .. math::
     o = \mathrm{NaLa}(q, k, v;\ \mathrm{RoPE}_{2D}), \quad
     y = \mathrm{LN}_C\big(o + \mathrm{DWConv}_{k \times k}(v)\big)
       \odot \mathrm{SiLU}(g)

  ``NaLa`` is `jaxnorm.attention.nala_attention` with the 2-D RoPE of
  `grid_rope_tables` on the query and key *features* in the numerator only
  (the same table for both halves of the sign split). The LePE branch is a
  depthwise ``k x k`` conv with bias (official 5x5) of ``v`` over the
  ``C = N * H`` channels of the map (`attention.lina_depthwise_conv`); the
  LayerNorm (eps 1e-5, torch's default) runs over ``C``. The output
  projection is the caller's. Computed in ``promote_types(dtype,
  float32)`` (the official code runs this block in float32).

  Deviation: the official backbone has no prefix tokens; here the
  ``num_prefix`` tokens (a [CLS]) take part in the attention without a
  rotation and get no LePE term.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, T, N, H)``.
    value: ``(B, T, N, H)``.
    gate: ``(B, T, N, H)``, the gate projection ``g``.
    lepe_kernel: ``(k, k, C)`` depthwise kernel, odd ``k``.
    lepe_bias: ``(C,)``.
    norm_scale: LayerNorm scale ``(C,)``.
    norm_bias: LayerNorm bias ``(C,)``.
    grid_shape: ``(h, w)`` with ``T = num_prefix + h * w``.
    num_prefix: tokens before the map.
    power_scale: :math:`\lambda` of `attention.nala_query_feature`.
    eps: NaLa's denominator and norm-clamp epsilon.
    norm_eps: the LayerNorm epsilon.
    rope_base: RoPE frequency base.

  Returns:
    ``(B, T, N, H)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, a bad grid or ``H % 4 != 0``.
    TypeError: on non-floating inputs.

  References:
    Meng et al., *NaLaFormer: Norm-Aware Linear Attention for Transformer
    Models*, arXiv:2506.21137 (2025); ICML 2026 code ``ZacharyMeng/
    NaLaFormer NaLaformer/NALA.py`` (``NormAwareLinearAttn``).
  """
  who = "nala_grid_attention"
  arrays = (("query", query), ("key", key), ("value", value), ("gate", gate))
  for name, a in arrays:
    _checks.check_floating(who, name, a)
    _checks.check_ndim(who, name, a, expected=4)
  for name, a in arrays[1:]:
    _checks.check_shape(who, name, a, query.shape, "like query: (B, T, N, H)")
  b, t, n, h = query.shape
  _check_grid(who, grid_shape, num_prefix, t)
  c = n * h
  _check_square_kernel(who, "lepe_kernel", lepe_kernel, (c,), odd=True)
  for name, a in (
    ("lepe_bias", lepe_bias),
    ("norm_scale", norm_scale),
    ("norm_bias", norm_bias),
  ):
    _checks.check_shape(who, name, a, (c,), "C = N * H")
  dtype = _numerics.compute_dtype(query, key, value, gate)
  q, k, v, g = (a.astype(dtype) for _, a in arrays)
  sin, cos = grid_rope_tables(
    grid_shape, h, num_prefix=num_prefix, base=rope_base
  )
  both = (jnp.tile(a, 2).astype(dtype) for a in (sin, cos))
  o = attn.nala_attention(
    q, k, v, power_scale=power_scale, eps=eps, rope_sin_cos=tuple(both)
  )
  lepe = attn.lina_depthwise_conv(
    v.reshape(b, t, c),
    lepe_kernel,
    lepe_bias,
    grid_shape=grid_shape,
    num_prefix=num_prefix,
  )
  y = norms.layer_norm(
    o.reshape(b, t, c) + lepe, norm_scale, norm_bias, eps=norm_eps
  )
  y = y * jax.nn.silu(g.reshape(b, t, c))
  return y.reshape(b, t, n, h).astype(query.dtype)


def soft_conv_landmarks(
  query: Float[Array, "B T N H"],
  kernel: Float[Array, "r r H H"],
  norm_scale: Float[Array, " H"],
  norm_bias: Float[Array, " H"],
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  scale: float | None = None,
  eps: float = 1e-5,
) -> Float[Array, "B M N H"]:
  r"""SOFT's learned landmarks: strided conv, LayerNorm and GELU on the map.

  .. math::
     \tilde q = \mathrm{GELU}\big(\mathrm{LN}_H(\mathrm{Conv}_{r \times r,
       \mathrm{stride}\ r}(q \cdot s))\big)

  Per head, the scaled queries ``q * s`` (default ``s = H**-0.25``) of the
  map tokens form an ``(h, w, H)`` image; a bias-free ``r x r`` conv with
  stride ``r`` (``H -> H`` channels, shared by the heads, no padding, so
  ``M = (h // r) * (w // r)`` as torch floors) gives the landmarks, then a
  LayerNorm over ``H`` (eps 1e-5) and the exact (erf) GELU. Prefix tokens
  are not pooled. The landmarks live in the scaled space
  `attention.soft_attention` expects.

  Args:
    query: ``(B, T, N, H)`` with ``T = num_prefix + h * w``.
    kernel: ``(r, r, H, H)`` (``HWIO``; torch's ``(out, in, r, r)``
      transposed).
    norm_scale: ``(H,)``.
    norm_bias: ``(H,)``.
    grid_shape: ``(h, w)``.
    num_prefix: tokens before the map.
    scale: query scale, default ``H**-0.25``.
    eps: LayerNorm epsilon.

  Returns:
    ``(B, M, N, H)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, a bad grid or ``r`` above a side of
      the grid.
    TypeError: if ``query`` is not floating.

  References:
    Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity*,
    arXiv:2110.11945 (2021); code ``fudan-zvg/SOFT
    models/softmax_free_transformer.py`` (``Qlandmark_op``, ``Qnorm_act``).
  """
  who = "soft_conv_landmarks"
  _checks.check_floating(who, "query", query)
  _checks.check_ndim(who, "query", query, expected=4)
  b, t, n, h = query.shape
  gh, gw = _check_grid(who, grid_shape, num_prefix, t)
  r = _check_square_kernel(who, "kernel", kernel, (h, h), odd=False)
  if r > min(gh, gw):
    raise ValueError(
      f"{who}: the landmark window r={r} must fit the grid {grid_shape}"
    )
  _checks.check_shape(who, "norm_scale", norm_scale, (h,), "head_dim")
  _checks.check_shape(who, "norm_bias", norm_bias, (h,), "head_dim")
  s = h**-0.25 if scale is None else scale
  dtype = _numerics.compute_dtype(query)
  q = query[:, num_prefix:].astype(dtype) * s
  img = q.reshape(b, gh, gw, n, h).transpose(0, 3, 1, 2, 4)
  y = jax.lax.conv_general_dilated(
    img.reshape(b * n, gh, gw, h),
    kernel.astype(dtype),
    (r, r),
    "VALID",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
  )
  y = y.reshape(b, n, -1, h)
  y = jax.nn.gelu(
    norms.layer_norm(y, norm_scale, norm_bias, eps=eps), approximate=False
  )
  return jnp.swapaxes(y, 1, 2).astype(query.dtype)


def soft_local_conv(
  value: Float[Array, "B T N Hv"],
  kernel: Float[Array, "k k N"],
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT's local branch: a per-head depthwise conv of ``v`` on the map.

  .. math:: y_{n} = \mathrm{Conv}_{k \times k}(v_{n};\ w_n)

  One bias-free ``k x k`` kernel per head, shared by the head's ``Hv``
  value channels (official ``Conv2d(N, N, k, padding=k // 2, groups=N)``
  applied to each channel of the head), zero padding. The ``num_prefix``
  tokens pass their value through unchanged, as the official code does for
  [CLS] in its ratio-1 path.

  Args:
    value: ``(B, T, N, Hv)`` with ``T = num_prefix + h * w``.
    kernel: ``(k, k, N)``, odd ``k``.
    grid_shape: ``(h, w)``.
    num_prefix: tokens before the map.

  Returns:
    ``(B, T, N, Hv)`` in ``value.dtype``.

  Raises:
    ValueError: on mismatched shapes or a bad grid.
    TypeError: if ``value`` is not floating.

  References:
    Lu et al., arXiv:2110.11945 (2021); code ``fudan-zvg/SOFT``
    (``SoftmaxFreeAttentionKernel.conv``).
  """
  who = "soft_local_conv"
  _checks.check_floating(who, "value", value)
  _checks.check_ndim(who, "value", value, expected=4)
  b, t, n, e = value.shape
  _check_grid(who, grid_shape, num_prefix, t)
  _check_square_kernel(who, "kernel", kernel, (n,), odd=True)
  y = attn.lina_depthwise_conv(
    value.reshape(b, t, n * e),
    jnp.repeat(kernel, e, axis=-1),  # Channel n * Hv + j reads head n.
    grid_shape=grid_shape,
    num_prefix=num_prefix,
  ).reshape(b, t, n, e)
  return y.at[:, :num_prefix].set(value[:, :num_prefix])


def soft_grid_attention(
  query: Float[Array, "B T N H"],
  value: Float[Array, "B T N Hv"],
  *,
  landmark_kernel: Float[Array, "r r H H"],
  landmark_scale: Float[Array, " H"],
  landmark_bias: Float[Array, " H"],
  local_kernel: Float[Array, "k k N"] | None,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  scale: float | None = None,
  norm_eps: float = 1e-5,
  **options: Any,
) -> Float[Array, "B T N Hv"]:
  r"""SOFT's attention layer on a token map (official ``SOFT`` kernel).

  .. math::
     \mathrm{out} = \mathrm{SOFT}(q, v;\ \tilde q) + \mathrm{DWConv}(v)

  ``\tilde q`` are `soft_conv_landmarks`, ``SOFT`` is
  `jaxnorm.attention.soft_attention` (keys tied to queries, Gaussian
  kernel, Newton inverse) and the local branch `soft_local_conv` (skipped
  when ``local_kernel`` is None, the official ``use_conv = 0``). Computed in
  ``promote_types(dtype, float32)``.

  Deviation: the official ratio-1 path (a linear landmark map over every
  token and no inverse) is not reproduced; ``r = 1`` here is the general
  formula with a 1x1 conv.

  Args:
    query: ``(B, T, N, H)``.
    value: ``(B, T, N, Hv)``.
    landmark_kernel: ``(r, r, H, H)``.
    landmark_scale: landmark LayerNorm scale ``(H,)``.
    landmark_bias: landmark LayerNorm bias ``(H,)``.
    local_kernel: ``(k, k, N)`` or None.
    grid_shape: ``(h, w)`` with ``T = num_prefix + h * w``.
    num_prefix: tokens before the map.
    scale: query scale, default ``H**-0.25``.
    norm_eps: landmark LayerNorm epsilon.
    **options: the other keyword options of `attention.soft_attention`
      (``num_iters``, ``reg``, ``init``, ``grad``, ``symmetric_norm``).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or a bad grid.
    TypeError: on non-floating inputs.

  References:
    Lu et al., arXiv:2110.11945 (2021); Lu et al., arXiv:2207.03341 (2024).
  """
  dtype = _numerics.compute_dtype(query, value)
  q, v = query.astype(dtype), value.astype(dtype)
  landmarks = soft_conv_landmarks(
    q,
    landmark_kernel,
    landmark_scale,
    landmark_bias,
    grid_shape=grid_shape,
    num_prefix=num_prefix,
    scale=scale,
    eps=norm_eps,
  )
  y = attn.soft_attention(q, v, landmarks, scale=scale, **options)
  if local_kernel is not None:
    y = y + soft_local_conv(
      v, local_kernel, grid_shape=grid_shape, num_prefix=num_prefix
    )
  return y.astype(query.dtype)
