r"""Complex dense and conv, complex RoPE, and the widely-linear conversion.

``complex_dense`` and ``complex_conv`` are holomorphic (no conjugation of
the input). A real linear layer on split halves ``[Re | Im]`` is in general
*widely* linear in the complex input, :math:`y = U x + W \bar x`
(`widely_linear_from_real`, exact both ways); Fairy2i quantizes ``U`` and
``W``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Float

from jaxnorm import _checks, _numerics, _scope, attention
from jaxnorm.cplx import _common, basics


def _check_kernel(
  who: str, x: jax.Array, kernel: ArrayLike, bias: ArrayLike | None
) -> None:
  _common.check_complex(who, "kernel", kernel)
  _checks.check_ndim(who, "x", x, minimum=1)
  if bias is not None:
    _common.check_complex(who, "bias", bias)
    out = jnp.shape(kernel)[-1]
    _checks.check_shape(who, "bias", bias, (out,), "kernel.shape[-1]")


@_scope.scoped
def complex_dense(
  x: Complex[ArrayLike, "... m"],
  kernel: Complex[ArrayLike, "m n"],
  bias: Complex[ArrayLike, " n"] | None = None,
) -> Complex[Array, "... n"]:
  r"""Complex dense layer :math:`y = x K + b` (no conjugation).

  Args:
    x: complex ``(..., m)``.
    kernel: complex ``(m, n)`` (Flax ``(in, out)`` layout). Complex Glorot
      init is ``jax.nn.initializers.variance_scaling(1, "fan_avg",
      "normal")`` with a complex dtype (``E|w|^2 = 2/(m + n)``).
    bias: complex ``(n,)`` or ``None``.

  Returns:
    Complex ``(..., n)`` in the compute dtype of ``x`` and ``kernel``
    (complex64, or complex128 for 64-bit inputs).

  Raises:
    TypeError: for non-complex arguments.
    ValueError: for mismatched shapes.

  Examples:
    >>> x = jnp.array([1 + 1j, 2 + 0j])
    >>> k = jnp.array([[1j], [1 + 0j]])
    >>> print(np.asarray(cplx.complex_dense(x, k)))  # (1 + i) i + 2
    [1.+1.j]

  References:
    Trabelsi et al., *Deep Complex Networks*, arXiv:1705.09792 (2018).
  """
  who = "complex_dense"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  _check_kernel(who, x, kernel, bias)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  if jnp.shape(kernel)[0] != x.shape[-1]:
    raise ValueError(
      f"{who}: kernel must have shape (x.shape[-1]={x.shape[-1]}, n), got "
      f"kernel.shape={jnp.shape(kernel)}"
    )
  dtype = _common.complex_dtype(x, kernel)
  y = x.astype(dtype) @ jnp.asarray(kernel).astype(dtype)
  if bias is not None:
    y = y + _numerics.channel(bias, y.ndim, dtype)
  return y


def _conv(x, k, strides, padding) -> jax.Array:
  spatial = "DHW"[5 - x.ndim :]
  dims = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
  return jax.lax.conv_general_dilated(
    x, k, strides, padding, dimension_numbers=dims
  )


@_scope.scoped
def complex_conv(
  x: Complex[ArrayLike, "n *spatial c"],
  kernel: Complex[ArrayLike, "*window c o"],
  bias: Complex[ArrayLike, " o"] | None = None,
  *,
  strides: int | Sequence[int] = 1,
  padding: str | Sequence[tuple[int, int]] = "SAME",
  gauss_trick: bool = False,
) -> Complex[Array, "n *spatial o"]:
  r"""Complex convolution (cross-correlation) from real convolutions.

  With :math:`W = A + iB` and :math:`x = x_r + i x_i`:

  .. math:: W \star x = (A \star x_r - B \star x_i)
     + i (B \star x_r + A \star x_i)

  (four real ``lax.conv_general_dilated`` calls). ``gauss_trick=True`` uses
  Gauss's three products :math:`k_1 = A \star (x_r + x_i)`,
  :math:`k_2 = (B - A) \star x_r`, :math:`k_3 = (A + B) \star x_i`,
  real part :math:`k_1 - k_3`, imaginary part :math:`k_1 + k_2`: one conv
  fewer, slightly different rounding.

  Args:
    x: complex ``(N, *spatial, C)`` (channels last, 1 to 3 spatial axes).
    kernel: complex ``(*window, C, O)`` (Flax layout).
    bias: complex ``(O,)`` or ``None``.
    strides: an int or one per spatial axis.
    padding: ``"SAME"``, ``"VALID"`` or explicit pairs.
    gauss_trick: three real convolutions instead of four.

  Returns:
    Complex ``(N, *out_spatial, O)`` in the compute dtype.

  Raises:
    TypeError: for non-complex arguments.
    ValueError: for mismatched ranks or channels.

  Examples:
    >>> x = jnp.array([1 + 1j, 2 + 0j, 0 + 1j]).reshape(1, 3, 1)  # (N, W, C)
    >>> y = cplx.complex_conv(x, jnp.full((1, 1, 1), 1j))  # a 1-tap kernel i
    >>> print(np.asarray(y[0, :, 0]))  # i x
    [-1.+1.j  0.+2.j -1.+0.j]

  References:
    Trabelsi et al., *Deep Complex Networks*, arXiv:1705.09792 (2018);
    Chatterjee et al., *Complex Network for Complex Problems*,
    arXiv:2302.04584 (2023) (torchcomplex's four-conv form).
  """
  who = "complex_conv"
  _common.check_complex(who, "x", x)
  x = jnp.asarray(x)
  _check_kernel(who, x, kernel, bias)
  if x.ndim not in (3, 4, 5):
    raise ValueError(
      f"{who}: x must be (batch, *spatial, channels) with 1 to 3 spatial "
      f"axes, got {x.shape=}"
    )
  if jnp.ndim(kernel) != x.ndim:
    raise ValueError(
      f"{who}: kernel must have rank x.ndim={x.ndim} (*window, in, out), got "
      f"kernel.shape={jnp.shape(kernel)}"
    )
  if jnp.shape(kernel)[-2] != x.shape[-1]:
    raise ValueError(
      f"{who}: kernel.shape[-2] must equal the input channels "
      f"x.shape[-1]={x.shape[-1]}, got kernel.shape={jnp.shape(kernel)}"
    )
  nd = x.ndim - 2
  strides = (strides,) * nd if isinstance(strides, int) else tuple(strides)
  dtype = _common.complex_dtype(x, kernel)
  xf, k = x.astype(dtype), jnp.asarray(kernel).astype(dtype)
  xr, xi, a, b = jnp.real(xf), jnp.imag(xf), jnp.real(k), jnp.imag(k)

  def conv(inp, ker):
    return _conv(inp, ker, strides, padding)

  if gauss_trick:
    k1 = conv(xr + xi, a)
    k2 = conv(xr, b - a)
    k3 = conv(xi, a + b)
    y = jax.lax.complex(k1 - k3, k1 + k2)
  else:
    y = jax.lax.complex(conv(xr, a) - conv(xi, b), conv(xr, b) + conv(xi, a))
  if bias is not None:
    y = y + _numerics.channel(bias, y.ndim, dtype)
  return y


@_scope.scoped
def complex_rope(
  x: Complex[ArrayLike, "B T N D"],
  positions: Float[ArrayLike, "B T"] | None = None,
  *,
  base: float = 10000.0,
) -> Complex[Array, "B T N D"]:
  r"""Complex rotary embedding :math:`y_{td} = x_{td}\, e^{i \theta_d p_t}`.

  :math:`\theta_d = \mathrm{base}^{-d/D}` over the ``D`` complex dims
  (CNet and the PCT). This is exactly ``to_complex(rope(to_real(x)))``:
  rotate-half pairs ``(i, i + H/2)`` are the split halves and
  `jaxnorm.attention.rope`'s :math:`\mathrm{base}^{-2i/H} =
  \mathrm{base}^{-i/D}`, so it is implemented that way.

  Args:
    x: complex ``(B, T, N, D)``.
    positions: ``(B, T)`` or ``(T,)``; default ``arange(T)``.
    base: frequency base.

  Returns:
    ``x.shape``, complex compute dtype.

  Raises:
    TypeError: for a non-complex ``x``.
    ValueError: for a rank other than 4 or bad ``positions``.

  Examples:
    >>> x = jnp.ones((1, 2, 1, 1), jnp.complex64)  # positions 0 and 1
    >>> y = cplx.complex_rope(x)
    >>> print(np.asarray(y[0, :, 0, 0]).round(4))  # e^{i p}, theta = 1
    [1.    +0.j     0.5403+0.8415j]

  References:
    Su et al., *RoFormer*, arXiv:2104.09864 (2021); Crasmaru, *CNet* (code).
  """
  _common.check_complex("complex_rope", "x", x)
  _checks.check_ndim("complex_rope", "x", x, expected=4)
  return basics.to_complex(
    attention.rope(basics.to_real(x), positions, base=base)
  )


def _check_even_kernel(who: str, kernel: ArrayLike) -> tuple[int, int]:
  _common.check_real(who, "kernel", kernel)
  _checks.check_ndim(who, "kernel", kernel, expected=2)
  rows, cols = jnp.shape(kernel)
  if rows % 2 or cols % 2:
    raise ValueError(
      f"{who}: kernel must have even dimensions (split halves [Re | Im] in "
      f"and out), got kernel.shape={jnp.shape(kernel)}"
    )
  return rows // 2, cols // 2


@_scope.scoped
def widely_linear_from_real(
  kernel: Float[ArrayLike, "two_m two_n"],
) -> tuple[Complex[Array, "m n"], Complex[Array, "m n"]]:
  r"""The widely-linear form ``(u, w)`` of a real ``(2m, 2n)`` kernel.

  A real layer ``ỹ = x̃ K`` on split halves (Flax ``(in, out)`` kernel
  ``K = R^T``; torch's ``R = [[R11, R12], [R21, R22]]``) is, for
  ``x = x̃[:m] + i x̃[m:]``, ``y = x u + x̄ w`` with

  .. math::
    \mathrm{Re}\,U = (R_{11} + R_{22})/2,\
    \mathrm{Im}\,U = (R_{21} - R_{12})/2,\
    \mathrm{Re}\,W = (R_{11} - R_{22})/2,\
    \mathrm{Im}\,W = (R_{12} + R_{21})/2

  and ``u = U^T``, ``w = W^T``. Exact; `real_from_widely_linear` inverts it.

  Args:
    kernel: real ``(2m, 2n)``.

  Returns:
    ``(u, w)``, complex ``(m, n)`` each.

  Raises:
    TypeError: for a non-real kernel.
    ValueError: for a rank other than 2 or odd dimensions.

  Examples:
    >>> u, w = cplx.widely_linear_from_real(jnp.eye(2))  # the identity layer
    >>> print(np.asarray(u), np.asarray(w))
    [[1.+0.j]] [[0.+0.j]]

  References:
    Wang et al., *Fairy2i: Training Complex LLMs from Real LLMs with All
    Parameters in {±1, ±i}*, arXiv:2512.02901 (2025) (code
    ``PKULab1806/Fairy2i-W2``, ``quantization.py``).
  """
  m, n = _check_even_kernel("widely_linear_from_real", kernel)
  k = jnp.asarray(kernel)
  k = k.astype(_common.real_dtype(_common.complex_dtype(k)))
  k11, k12, k21, k22 = k[:m, :n], k[:m, n:], k[m:, :n], k[m:, n:]
  u = jax.lax.complex((k11 + k22) / 2, (k12 - k21) / 2)
  w = jax.lax.complex((k11 - k22) / 2, (k12 + k21) / 2)
  return u, w


@_scope.scoped
def real_from_widely_linear(
  u: Complex[ArrayLike, "m n"], w: Complex[ArrayLike, "m n"]
) -> Float[Array, "two_m two_n"]:
  """The real ``(2m, 2n)`` kernel of ``y = x u + x̄ w`` (inverse map).

  ``K11 = Re u + Re w``, ``K12 = Im u + Im w``, ``K21 = Im w - Im u``,
  ``K22 = Re u - Re w`` (Flax ``(in, out)`` blocks of split halves).

  Raises:
    TypeError: for non-complex ``u`` or ``w``.
    ValueError: for different or non-matrix shapes.

  Examples:
    >>> u, w = jnp.array([[1j]]), jnp.zeros((1, 1), jnp.complex64)
    >>> k = cplx.real_from_widely_linear(u, w)
    >>> print(np.asarray(k))  # y = i x: (a, b) -> (-b, a)
    [[ 0.  1.]
     [-1.  0.]]
  """
  who = "real_from_widely_linear"
  _common.check_complex(who, "u", u)
  _common.check_complex(who, "w", w)
  _checks.check_ndim(who, "u", u, expected=2)
  _checks.check_shape(who, "w", w, jnp.shape(u), "u.shape")
  u, w = jnp.asarray(u), jnp.asarray(w)
  top = jnp.concatenate([u.real + w.real, u.imag + w.imag], axis=1)
  bottom = jnp.concatenate([w.imag - u.imag, u.real - w.real], axis=1)
  return jnp.concatenate([top, bottom], axis=0)


@_scope.scoped
def widely_linear(
  x: Complex[ArrayLike, "... m"],
  u: Complex[ArrayLike, "m n"],
  w: Complex[ArrayLike, "m n"],
  bias: Complex[ArrayLike, " n"] | None = None,
) -> Complex[Array, "... n"]:
  r"""Widely-linear map :math:`y = x u + \bar x w + b`.

  Raises:
    TypeError: for non-complex arguments.
    ValueError: for mismatched shapes.

  Examples:
    >>> x = jnp.array([1 + 2j])
    >>> u, w = jnp.array([[1 + 0j]]), jnp.array([[1 + 0j]])
    >>> print(np.asarray(cplx.widely_linear(x, u, w)))  # x + conj(x) = 2 Re x
    [2.+0.j]
  """
  who = "widely_linear"
  for name, a in (("x", x), ("u", u), ("w", w)):
    _common.check_complex(who, name, a)
  _checks.check_shape(who, "w", w, jnp.shape(u), "u.shape")
  return complex_dense(x, u, bias) + complex_dense(jnp.conj(x), w)
