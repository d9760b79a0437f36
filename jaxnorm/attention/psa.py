"""Polarized self-attention (PSA), a gate for NHWC CNN feature maps.

Softmax, sigmoids and the LayerNorms (`jaxnorm.norms.layer_norm`, two-pass
variance) run in ``promote_types(dtype, float32)``; outputs have the input's
dtype. Weights are explicit arguments; the module is
`jaxnorm.nn.PolarizedSelfAttention`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope, norms


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


@_scope.scoped
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

  Examples:
    >>> x = jnp.ones((1, 2, 2, 2))  # (B, H, W, C), C' = 1
    >>> w = {n: jnp.zeros((2, 1)) for n in ("channel_query", "channel_value",
    ...                                     "spatial_query", "spatial_value")}
    >>> y = attention.psa_parallel(x, channel_up=jnp.zeros((1, 2)), **w)
    >>> print(np.asarray(y[0, 0, 0]).round(4))  # sigmoid(0) + sigmoid(1 / HW)
    [1.0622 1.0622]

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
  x = jnp.asarray(x)
  xc = x.astype(_numerics.compute_dtype(x))
  a_ch = _psa_channel_gate(
    xc, channel_query, channel_value, lambda z: z @ channel_up.astype(z.dtype)
  )
  a_sp = _psa_spatial_gate(xc, spatial_query, spatial_value, "logits")
  return (xc * a_ch + xc * a_sp).astype(x.dtype)


@_scope.scoped
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

  Examples:
    >>> x = jnp.ones((1, 2, 2, 2))
    >>> w = {n: jnp.zeros((2, 1)) for n in ("channel_query", "channel_value",
    ...                                     "spatial_query", "spatial_value")}
    >>> y = attention.psa_sequential(
    ...     x, channel_down=jnp.zeros((1, 1)), channel_down_bias=jnp.zeros(1),
    ...     channel_norm_scale=jnp.ones(1), channel_norm_bias=jnp.zeros(1),
    ...     channel_up=jnp.zeros((1, 2)), channel_up_bias=jnp.zeros(2), **w)
    >>> print(np.asarray(y[0, 0, 0]).round(4))  # sigmoid(0) * sigmoid(0)
    [0.25 0.25]

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
  x = jnp.asarray(x)
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


@_scope.scoped
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

  Examples:
    >>> x = jnp.ones((1, 2, 2, 2))
    >>> w = {n: jnp.zeros((2, 1)) for n in ("channel_query", "channel_value",
    ...                                     "spatial_query", "spatial_value")}
    >>> y = attention.psa_paper_form(
    ...     x, channel_up=jnp.zeros((1, 2)), norm_scale=jnp.ones(2),
    ...     norm_bias=jnp.zeros(2), **w)
    >>> print(np.asarray(y[0, 0, 0]).round(4))  # sigmoid(0) + sigmoid(0)
    [1. 1.]

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
  x = jnp.asarray(x)
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
