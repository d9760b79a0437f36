"""Real <-> complex layout and the kink-safe modulus, phase and unit phasor.

The real layout of a complex array is **split halves** ``[Re | Im]`` on the
feature axis (Trabelsi et al.'s Keras code, Fairy2i, ComplexFormer and the
rotate-half `jaxnorm.attention.rope` all use it): a real ``(..., 2d)`` array
is the complex ``(..., d)`` array ``x[..., :d] + i x[..., d:]``.

``|z|``, ``arg z`` and ``z/|z|`` are not differentiable at ``z = 0`` and
their naive JAX gradients there are NaN. The functions below use the
double-``where`` pattern (a safe operand substituted where ``z = 0``, the
result selected afterwards), so their gradients at 0 are finite: 0 for
``modulus``, ``phase`` and ``unit_phasor``.

Complex autodiff contract (used by every test of this package): for a real
loss ``L(z)``, ``jax.grad(L)(z) = dL/dx - i dL/dy = conj(2 dL/dz̄)``; the
steepest-descent step is ``z - lr * conj(grad)`` (`jaxnorm.optim.complex`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Complex, Float

from jaxnorm import _checks, _scope
from jaxnorm.cplx import _common


@_scope.scoped
def to_complex(
  x: Float[Array, "... two_d"], *, axis: int = -1
) -> Complex[Array, "... d"]:
  """Pairs the split halves ``[Re | Im]`` of ``axis`` into a complex array.

  Args:
    x: real array whose ``axis`` has even length ``2d``.
    axis: the feature axis.

  Returns:
    ``x[..., :d] + i x[..., d:]`` (on ``axis``) in complex64 (half and
    float32 inputs, which are upcast: there is no complex bfloat16) or
    complex128 (float64).

  Raises:
    TypeError: for a non-real-floating ``x``.
    ValueError: for a bad ``axis`` or an odd length.

  Examples:
    >>> print(np.asarray(cplx.to_complex(jnp.array([1.0, 2.0, 3.0, 4.0]))))
    [1.+3.j 2.+4.j]
  """
  who = "to_complex"
  _common.check_real(who, "x", x)
  x = jnp.asarray(x)
  (ax,) = _checks.normalize_axes(who, axis, x.ndim)
  n = x.shape[ax]
  if n % 2:
    raise ValueError(
      f"{who}: x.shape[axis] must be even (split halves [Re | Im]), got "
      f"{x.shape=} with {axis=}"
    )
  dtype = _common.complex_dtype(x)
  re, im = jnp.split(x.astype(_common.real_dtype(dtype)), 2, axis=ax)
  return jax.lax.complex(re, im)


@_scope.scoped
def to_real(
  z: Complex[Array, "... d"], *, axis: int = -1
) -> Float[Array, "... two_d"]:
  """Concatenates ``[Re z | Im z]`` on ``axis``; the inverse of `to_complex`.

  Args:
    z: complex array.
    axis: the feature axis.

  Returns:
    Real array with ``axis`` doubled, in the parts' dtype (float32 for
    complex64, float64 for complex128).

  Raises:
    TypeError: for a non-complex ``z``.
    ValueError: for a bad ``axis``.

  Examples:
    >>> print(np.asarray(cplx.to_real(jnp.array([1 + 3j, 2 + 4j]))))
    [1. 2. 3. 4.]
  """
  who = "to_real"
  _common.check_complex(who, "z", z)
  z = jnp.asarray(z)
  (ax,) = _checks.normalize_axes(who, axis, z.ndim)
  return jnp.concatenate([jnp.real(z), jnp.imag(z)], axis=ax)


def _nonzero(z: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(z != 0, z with 1 substituted at 0)``: the double-where operands.

  ``z != 0``, not ``|z|^2 > 0``: the square underflows for ``|z| < 1e-19``
  (float32) where ``|z|`` itself is representable.
  """
  nz = z != 0
  return nz, jnp.where(nz, z, jnp.ones_like(z))


@_scope.scoped
def modulus(z: Complex[Array, "..."]) -> Float[Array, "..."]:
  r"""``|z|`` with a finite gradient (0) at ``z = 0``.

  Args:
    z: complex array.

  Returns:
    Real array (the parts' dtype).

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.modulus(jnp.array([3 + 4j, 0j]))))
    [5. 0.]
  """
  _common.check_complex("modulus", "z", z)
  nz, safe = _nonzero(jnp.asarray(z))
  # jnp.abs scales (hypot), sqrt(Re^2 + Im^2) overflows for |z| > 1e19.
  return jnp.where(nz, jnp.abs(safe), 0.0)


@_scope.scoped
def phase(z: Complex[Array, "..."]) -> Float[Array, "..."]:
  r"""``arg z = atan2(Im z, Re z)`` in ``(-pi, pi]``, 0 (and gradient 0) at 0.

  Args:
    z: complex array.

  Returns:
    Real array (the parts' dtype).

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.phase(jnp.array([1j, -1 + 0j, 0j]))).round(4))
    [1.5708 3.1416 0.    ]
  """
  _common.check_complex("phase", "z", z)
  nz, safe = _nonzero(jnp.asarray(z))
  return jnp.where(nz, jnp.arctan2(jnp.imag(safe), jnp.real(safe)), 0.0)


@_scope.scoped
def unit_phasor(z: Complex[Array, "..."]) -> Complex[Array, "..."]:
  r"""``z / |z|``, and 0 (with gradient 0) at ``z = 0``.

  Args:
    z: complex array.

  Returns:
    Complex array of ``z``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.unit_phasor(jnp.array([3 + 4j, 0j]))).round(4))
    [0.6+0.8j 0. +0.j ]
  """
  _common.check_complex("unit_phasor", "z", z)
  z = jnp.asarray(z)
  nz, safe = _nonzero(z)
  return jnp.where(nz, safe / jnp.abs(safe).astype(z.dtype), jnp.zeros_like(z))


@_scope.scoped
def modulus_squared(z: Complex[Array, "..."]) -> Float[Array, "..."]:
  """``|z|^2`` (CNet's ``ModulusSquared``), real and smooth.

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.modulus_squared(jnp.array([3 + 4j, 1j]))))
    [25.  1.]
  """
  _common.check_complex("modulus_squared", "z", z)
  return _common.abs2(jnp.asarray(z))


@_scope.scoped
def complex_power(z: Complex[Array, "..."], m: int) -> Complex[Array, "..."]:
  """``z^m`` for an integer ``m >= 1`` (CNet's ``Power``), holomorphic.

  Raises:
    TypeError: for a non-complex ``z``.
    ValueError: for ``m`` not a positive integer.

  Examples:
    >>> print(np.asarray(cplx.complex_power(jnp.array([1j, 1 + 1j]), 2)))
    [-1.+0.j  0.+2.j]
  """
  _common.check_complex("complex_power", "z", z)
  _checks.check_positive_int("complex_power", "m", m)
  return jax.lax.integer_pow(jnp.asarray(z), m)
