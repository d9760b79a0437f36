"""Activations: the SELU family (with alpha-dropout and LeCun init) and SALU.

Every function is elementwise, computes in ``promote_types(x.dtype, float32)``
and returns ``x.dtype``. Parameters (SALU's gain and width) are explicit
arguments; the parameter-holding modules live in `jaxnorm.nn.activations`.
``__all__`` holds the functions; the constants (``SELU_ALPHA``...) and
`alpha_dropout_constants` are module attributes, not part of it.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import activations
  >>> y = activations.selu(jnp.array([-100.0, 0.0, 1.0]))
  >>> print(np.asarray(y).round(4))  # -lambda alpha, 0, lambda
  [-1.7581  0.      1.0507]
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "alpha_dropout",
  "elu",
  "galu",
  "lecun_normal",
  "salu",
  "salu_ab_from_sw",
  "salu_sw",
  "salu_sw_from_ab",
  "selu",
  "swalu",
]

# Fixed-point constants of Klambauer et al. (2017), eq. 14; identical to the
# constants in the `jax.nn.selu` source.
SELU_ALPHA: float = 1.6732632423543772848170429916717
SELU_LAMBDA: float = 1.0507009873554804934193349852946
# The negative saturation value -lambda * alpha of SELU.
SELU_SATURATION: float = -SELU_LAMBDA * SELU_ALPHA


@_scope.scoped
def elu(x: Float[Array, "..."], *, alpha: float = 1.0) -> Float[Array, "..."]:
  r"""Exponential linear unit.

  .. math:: \mathrm{elu}(x) = x \text{ if } x > 0 \text{ else }
     \alpha (e^{x} - 1)

  The exponential branch is taken at exactly 0, as in `jax.nn.elu` and
  ``torch.nn.ELU``, so the derivative there is ``alpha`` (``lambda *
  alpha`` for `selu`).

  Args:
    x: input of any shape, floating dtype.
    alpha: negative saturation magnitude.

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    TypeError: if ``x`` is not floating.

  Examples:
    >>> y = activations.elu(jnp.array([-1.0, 0.0, 2.0]))
    >>> print(np.asarray(y).round(4))  # e^x - 1 below 0
    [-0.6321  0.      2.    ]

  References:
    Clevert, Unterthiner & Hochreiter, *Fast and Accurate Deep Network
    Learning by Exponential Linear Units (ELUs)*, arXiv:1511.07289 (2015).
  """
  _checks.check_floating("elu", "x", x)
  x = jnp.asarray(x)
  xc = x.astype(_numerics.compute_dtype(x))
  pos = xc > 0
  neg = jnp.asarray(alpha, xc.dtype) * jnp.expm1(jnp.where(pos, 0.0, xc))
  return jnp.where(pos, xc, neg).astype(x.dtype)


@_scope.scoped
def selu(x: Float[Array, "..."]) -> Float[Array, "..."]:
  r"""Scaled exponential linear unit, the self-normalizing activation.

  .. math:: \mathrm{selu}(x) = \lambda_{01}\,\mathrm{elu}(x; \alpha_{01})

  with :math:`\alpha_{01} \approx 1.6733` and :math:`\lambda_{01} \approx
  1.0507` (`SELU_ALPHA`, `SELU_LAMBDA`), the fixed point that maps zero-mean,
  unit-variance inputs to zero-mean, unit-variance outputs. Pair it with
  `lecun_normal` weights and `alpha_dropout`.

  Args:
    x: input of any shape, floating dtype.

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    TypeError: if ``x`` is not floating.

  Examples:
    >>> y = activations.selu(jnp.array([-100.0, 0.0, 1.0]))
    >>> print(np.asarray(y).round(4))  # saturates at -lambda alpha
    [-1.7581  0.      1.0507]

  References:
    Klambauer, Unterthiner, Mayr & Hochreiter, *Self-Normalizing Neural
    Networks*, arXiv:1706.02515 (2017).
  """
  _checks.check_floating("selu", "x", x)
  x = jnp.asarray(x)
  xc = x.astype(_numerics.compute_dtype(x))
  y = elu(xc, alpha=SELU_ALPHA) * jnp.asarray(SELU_LAMBDA, xc.dtype)
  return y.astype(x.dtype)


def alpha_dropout_constants(rate: float) -> tuple[float, float]:
  r"""The affine correction ``(a, b)`` of alpha-dropout at drop rate ``rate``.

  With keep rate :math:`q = 1 - p` and :math:`\alpha' = -\lambda\alpha`:
  :math:`a = (q + \alpha'^2 q (1 - q))^{-1/2}` and
  :math:`b = -a (1 - q) \alpha'`.

  Args:
    rate: drop probability ``p`` in ``[0, 1)``.

  Returns:
    The Python floats ``(a, b)``.

  Raises:
    ValueError: if ``rate`` is outside ``[0, 1)``.
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"alpha_dropout: rate must be in [0, 1), got {rate=}")
  q = 1.0 - rate
  sat = SELU_SATURATION
  a = (q + sat * sat * q * (1.0 - q)) ** -0.5
  b = -a * (1.0 - q) * sat
  return a, b


@_scope.scoped
def alpha_dropout(
  x: Float[Array, "..."],
  rate: float,
  *,
  key: jax.Array | None = None,
  mask: Bool[Array, "..."] | None = None,
  deterministic: bool = False,
) -> Float[Array, "..."]:
  r"""Alpha-dropout: dropout that keeps SELU activations at mean 0, var 1.

  Dropped units are set to the SELU saturation value
  :math:`\alpha' = -\lambda\alpha` (not to 0, and with no ``1/q`` rescale),
  then an affine map restores the moments:

  .. math:: y = a\,(m \odot x + (1 - m)\,\alpha') + b,
     \quad m \sim \mathrm{Bernoulli}(1 - p)

  with ``(a, b)`` from `alpha_dropout_constants`. JAX and Flax ship no
  alpha-dropout; this matches ``torch.nn.functional.alpha_dropout``.

  Args:
    x: input of any shape, floating dtype.
    rate: drop probability ``p`` in ``[0, 1)``.
    key: PRNG key for the Bernoulli keep-mask; needed unless ``mask`` is
      given or ``deterministic``.
    mask: optional explicit boolean keep-mask of ``x.shape`` (True keeps),
      used instead of sampling (for cross-framework comparisons).
    deterministic: if True (inference), return ``x`` unchanged.

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    TypeError: if ``x`` is not floating or ``mask`` is not boolean.
    ValueError: if ``rate`` is outside ``[0, 1)``, if neither or both of
      ``key`` and ``mask`` are given, or if ``mask.shape != x.shape``.

  Examples:
    >>> x = jnp.zeros(4)
    >>> keep = jnp.array([True, True, False, True])
    >>> y = activations.alpha_dropout(x, 0.25, mask=keep)
    >>> print(np.asarray(y).round(4))  # a x + b kept, a alpha' + b dropped
    [ 0.3812  0.3812 -1.1435  0.3812]

  References:
    Klambauer et al., *Self-Normalizing Neural Networks*, arXiv:1706.02515
    (2017), Sec. "New Dropout Technique".
  """
  who = "alpha_dropout"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  a, b = alpha_dropout_constants(rate)
  if deterministic or rate == 0.0:
    return x
  if (key is None) == (mask is None):
    raise ValueError(
      f"{who}: pass exactly one of key (to sample the keep-mask) or mask "
      f"(an explicit keep-mask), got key={'set' if key is not None else None}"
      f" and mask={'set' if mask is not None else None}"
    )
  if mask is None:
    mask = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  else:
    if jnp.result_type(mask) != jnp.bool_:
      raise TypeError(
        f"{who}: mask must be boolean (True keeps), got "
        f"mask.dtype={jnp.result_type(mask)}"
      )
    _checks.check_shape(who, "mask", mask, x.shape, "x.shape")
  xc = x.astype(_numerics.compute_dtype(x))
  kept = jnp.where(mask, xc, jnp.asarray(SELU_SATURATION, xc.dtype))
  y = kept * jnp.asarray(a, xc.dtype) + jnp.asarray(b, xc.dtype)
  return y.astype(x.dtype)


@_scope.scoped
def lecun_normal(
  distribution: Literal["truncated_normal", "normal"] = "truncated_normal",
  *,
  in_axis: int | tuple[int, ...] = -2,
  out_axis: int | tuple[int, ...] = -1,
) -> jax.nn.initializers.Initializer:
  r"""LeCun-normal initializer: weights with variance ``1 / fan_in``.

  The SNN paper draws a plain normal with variance ``1/fan_in`` and zero
  bias (``distribution="normal"``). The default ``"truncated_normal"`` is
  `jax.nn.initializers.lecun_normal`: a normal truncated at two standard
  deviations and rescaled so the variance is still ``1/fan_in``.

  Args:
    distribution: ``"truncated_normal"`` (default) or ``"normal"``.
    in_axis: kernel axis (or axes) that sum into fan-in.
    out_axis: kernel axis (or axes) that sum into fan-out.

  Returns:
    An initializer ``init(key, shape, dtype=jnp.float32)``.

  Raises:
    ValueError: if ``distribution`` is not one of the two names.

  Examples:
    >>> init = activations.lecun_normal("normal")
    >>> w = init(jax.random.key(0), (400, 300))
    >>> print(round(float(w.var()) * 400, 1))  # variance 1 / fan_in
    1.0

  References:
    Klambauer et al., *Self-Normalizing Neural Networks*, arXiv:1706.02515
    (2017); LeCun, Bottou, Orr & Müller, *Efficient BackProp* (1998).
  """
  _checks.check_choice(
    "lecun_normal", "distribution", distribution, ("truncated_normal", "normal")
  )
  return jax.nn.initializers.variance_scaling(
    1.0, "fan_in", distribution, in_axis=in_axis, out_axis=out_axis
  )


def _channels_last(who: str, x: ArrayLike) -> jax.Array:
  """Checks ``x`` is floating with a channel axis; casts to compute dtype."""
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  return x.astype(_numerics.compute_dtype(x))


def _per_channel(
  who: str, name: str, p: ArrayLike, x: jax.Array, dtype: jnp.dtype
) -> jax.Array:
  """Casts a scalar or ``(C,)`` parameter and reshapes it to broadcast."""
  p = jnp.asarray(p)
  if p.ndim == 0:
    return p.astype(dtype).reshape((1,) * x.ndim)
  _checks.check_shape(
    who,
    name,
    p,
    (x.shape[-1],),
    "a scalar or one entry per channel, x.shape[-1]",
  )
  return p.astype(dtype).reshape((1,) * (x.ndim - 1) + (x.shape[-1],))


@_scope.scoped
def salu(
  x: Float[Array, "... c"], gain: ArrayLike, curvature: ArrayLike
) -> Float[Array, "... c"]:
  r"""SALU, the bounded odd activation that replaces normalization in SaluNet.

  .. math:: \mathrm{SALU}(x; a, b) = \frac{a x}{\sqrt{1 + a b x^2}}

  with ``gain`` :math:`a > 0` (the slope at 0) and ``curvature``
  :math:`b > 0`. It saturates at :math:`\pm\sqrt{a/b}`. Positivity is not
  checked (it is value-dependent); the module stores logarithms. SALU is the
  whole normalization replacement: the paper adds no affine after it.

  Args:
    x: input ``(..., c)``, floating dtype.
    gain: ``a``, a scalar or a per-channel ``(c,)`` vector.
    curvature: ``b``, a scalar or a per-channel ``(c,)`` vector.

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    TypeError: if ``x`` is not floating.
    ValueError: for a scalar ``x`` (no channel axis) or a parameter that is
      neither a scalar nor of shape ``(c,)``.

  Examples:
    >>> y = activations.salu(jnp.array([0.0, 1.0, 1e6]), 2.0, 0.5)
    >>> print(np.asarray(y).round(4))  # 2 x / sqrt(1 + x^2): saturates at 2
    [0.     1.4142 2.    ]

  References:
    Zaied, *SaluNet: Enabling Total Plasticity in Normalization-Free Deep
    Networks*, arXiv:2606.02927 (2026), eq. 1. Unverified: the per-channel
    granularity is our default; the paper body was not read.
  """
  who = "salu"
  xc = _channels_last(who, x)
  x = jnp.asarray(x)
  dt = xc.dtype
  a = _per_channel(who, "gain", gain, xc, dt)
  b = _per_channel(who, "curvature", curvature, xc, dt)
  y = a * xc * jax.lax.rsqrt(1.0 + a * b * xc * xc)
  return y.astype(x.dtype)


@_scope.scoped
def salu_sw(
  x: Float[Array, "... c"], amplitude: ArrayLike, width: ArrayLike
) -> Float[Array, "... c"]:
  r"""SALU in its (amplitude S, width W) parameterization.

  .. math:: \mathrm{SALU}(x) = S\,\frac{u}{\sqrt{1 + u^2}}, \quad u = x / W

  an algebraic sigmoid of amplitude :math:`S = \sqrt{a/b}` and width
  :math:`W = 1/\sqrt{ab}`; the central gain is :math:`S/W = a`. The map
  :math:`(a, b) \leftrightarrow (S, W)` is a bijection of
  :math:`\mathbb{R}_+^2` (`salu_sw_from_ab`, `salu_ab_from_sw`). This
  reparameterization is exact and jaxnorm's own; whether the paper uses it is
  unverified.

  Args:
    x: input ``(..., c)``, floating dtype.
    amplitude: ``S``, a scalar or ``(c,)``.
    width: ``W``, a scalar or ``(c,)``.

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    TypeError: if ``x`` is not floating.
    ValueError: for a scalar ``x`` (no channel axis) or a parameter that is
      neither a scalar nor of shape ``(c,)``.

  Examples:
    >>> y = activations.salu_sw(jnp.array([0.0, 1.0, 1e6]), 2.0, 1.0)
    >>> print(np.asarray(y).round(4))  # the salu(x; a=2, b=0.5) of `salu`
    [0.     1.4142 2.    ]

  References:
    Zaied, arXiv:2606.02927 (2026), eq. 1 (the ``(a, b)`` form).
  """
  who = "salu_sw"
  xc = _channels_last(who, x)
  x = jnp.asarray(x)
  dt = xc.dtype
  s = _per_channel(who, "amplitude", amplitude, xc, dt)
  w = _per_channel(who, "width", width, xc, dt)
  u = xc / w
  return (s * u * jax.lax.rsqrt(1.0 + u * u)).astype(x.dtype)


@_scope.scoped
def salu_sw_from_ab(
  gain: ArrayLike, curvature: ArrayLike
) -> tuple[jax.Array, jax.Array]:
  """Maps SALU's ``(a, b)`` to ``(S, W) = (sqrt(a/b), 1/sqrt(a*b))``.

  Examples:
    >>> s, w = activations.salu_sw_from_ab(2.0, 0.5)
    >>> print(np.asarray(s).round(4), np.asarray(w).round(4))  # sqrt(4), 1
    2.0 1.0
  """
  _checks.check_floating("salu_sw_from_ab", "gain", gain)
  _checks.check_floating("salu_sw_from_ab", "curvature", curvature)
  a, b = jnp.asarray(gain), jnp.asarray(curvature)
  # rsqrt(a) * rsqrt(b), not rsqrt(a * b): the product of two tiny (large)
  # values underflows (overflows) where the answer is representable.
  return jnp.sqrt(a / b), jax.lax.rsqrt(a) * jax.lax.rsqrt(b)


@_scope.scoped
def salu_ab_from_sw(
  amplitude: ArrayLike, width: ArrayLike
) -> tuple[jax.Array, jax.Array]:
  """Maps SALU's ``(S, W)`` to ``(a, b) = (S/W, 1/(S*W))``.

  Examples:
    >>> a, b = activations.salu_ab_from_sw(2.0, 1.0)
    >>> print(np.asarray(a).round(4), np.asarray(b).round(4))  # 2 / 1, 1 / 2
    2.0 0.5
  """
  _checks.check_floating("salu_ab_from_sw", "amplitude", amplitude)
  _checks.check_floating("salu_ab_from_sw", "width", width)
  s, w = jnp.asarray(amplitude), jnp.asarray(width)
  return s / w, 1.0 / (s * w)


# Widths that match the slope at 0 of the gate each variant imitates: the
# logistic sigmoid has slope 1/4 at 0 (Swish), the normal CDF 1/sqrt(2 pi)
# (GELU); the algebraic gate 0.5 * (1 + u / sqrt(1 + u^2)) has slope 1/(2W).
SWALU_WIDTH: float = 2.0
GALU_WIDTH: float = math.sqrt(math.pi / 2.0)


def _experimental_gate(
  who: str, x: jax.Array, width: ArrayLike, experimental: bool
) -> jax.Array:
  if not experimental:
    raise ValueError(
      f"{who}: the SaluNet gate formulas are unverified (only the paper's "
      f"abstract was readable), so {who} is jaxnorm's own design; pass "
      f"experimental=True to use it, got {experimental=}"
    )
  xc = _channels_last(who, x)
  x = jnp.asarray(x)
  dt = xc.dtype
  w = _per_channel(who, "width", width, xc, dt)
  u = xc / w
  gate = 0.5 * (1.0 + u * jax.lax.rsqrt(1.0 + u * u))
  return (xc * gate).astype(x.dtype)


@_scope.scoped
def swalu(
  x: Float[Array, "... c"],
  width: ArrayLike = SWALU_WIDTH,
  *,
  experimental: bool = False,
) -> Float[Array, "... c"]:
  r"""SWALU: a Swish-like gate built on SALU (experimental, jaxnorm's design).

  .. math:: \mathrm{swalu}(x) = x \cdot \tfrac12\left(1 +
     \mathrm{SALU}(x; S{=}1, W)\right)

  Unverified: SaluNet names SWALU as a gating activation that replaces
  ReLU/Swish, but its formula was not readable. This algebraic-sigmoid Swish
  is our design; the default ``width=2`` matches Swish's gate slope (1/4) at
  0. No paper parity is claimed.

  Args:
    x: input ``(..., c)``, floating dtype.
    width: ``W``, a scalar or ``(c,)``.
    experimental: must be True (acknowledges the formula is not the paper's).

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    ValueError: if ``experimental`` is False, ``x`` is a scalar or
      ``width`` has a bad shape.
    TypeError: if ``x`` is not floating.

  Examples:
    >>> y = activations.swalu(jnp.array([-2.0, 0.0, 2.0]), experimental=True)
    >>> print(np.asarray(y).round(4))  # x (1 + u / sqrt(1 + u^2)) / 2, u = x/2
    [-0.2929  0.      1.7071]

  References:
    Zaied, arXiv:2606.02927 (2026), abstract (names only).
  """
  return _experimental_gate("swalu", x, width, experimental)


@_scope.scoped
def galu(
  x: Float[Array, "... c"],
  width: ArrayLike = GALU_WIDTH,
  *,
  experimental: bool = False,
) -> Float[Array, "... c"]:
  r"""GALU: a GELU-like gate built on SALU (experimental, jaxnorm's design).

  The same form as `swalu`, :math:`x \cdot \tfrac12(1 + \mathrm{SALU}(x;
  1, W))`, with the default ``width = sqrt(pi/2)`` so that the gate's slope at
  0 equals the normal CDF's, :math:`1/\sqrt{2\pi}` (as in GELU).
  Unverified: the paper's GALU formula was not readable.

  Args:
    x: input ``(..., c)``, floating dtype.
    width: ``W``, a scalar or ``(c,)``.
    experimental: must be True (acknowledges the formula is not the paper's).

  Returns:
    Array of ``x.shape`` and ``x.dtype``.

  Raises:
    ValueError: if ``experimental`` is False, ``x`` is a scalar or
      ``width`` has a bad shape.
    TypeError: if ``x`` is not floating.

  Examples:
    >>> y = activations.galu(jnp.array([-1.0, 0.0, 1.0]), experimental=True)
    >>> print(np.asarray(y).round(4))  # as swalu with u = x / sqrt(pi / 2)
    [-0.1882  0.      0.8118]

  References:
    Zaied, arXiv:2606.02927 (2026), abstract (names only).
  """
  return _experimental_gate("galu", x, width, experimental)
