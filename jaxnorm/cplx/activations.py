"""Elementwise complex activations: CReLU, zReLU, modReLU, cardioid, split GELU.

Complex in, complex out (same shape and dtype). Every kink (``|z|``,
``arg z``, ``z/|z|``) goes through `jaxnorm.cplx.basics`, so gradients at
``z = 0`` are finite.

Name clash: CNet's ``CRelu`` is not Trabelsi et al.'s CReLU but zReLU on the
*open* first quadrant, ``zrelu(z, closed=False)``. torchcomplex's ``tanh`` and
``sigmoid`` are not used as oracles (its tanh imaginary part uses
``sin(2 Re z)`` and its sigmoid has an operator-precedence error).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.cplx import _common, basics


def _split(fn, z: jax.Array) -> jax.Array:
  """``fn(Re z) + i fn(Im z)``."""
  return jax.lax.complex(fn(jnp.real(z)), fn(jnp.imag(z)))


@_scope.scoped
def crelu(z: Complex[ArrayLike, "..."]) -> Complex[Array, "..."]:
  r"""CReLU: ReLU of the real and imaginary parts separately.

  .. math:: \mathrm{ReLU}(\mathrm{Re}\,z) + i\,\mathrm{ReLU}(\mathrm{Im}\,z)

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.crelu(jnp.array([1 - 2j, -1 + 3j]))))
    [1.+0.j 0.+3.j]

  References:
    Trabelsi et al., *Deep Complex Networks*, arXiv:1705.09792 (2018),
    eq. 4 as cited by torchcomplex.
  """
  _common.check_complex("crelu", "z", z)
  return _split(jax.nn.relu, jnp.asarray(z))


@_scope.scoped
def zrelu(
  z: Complex[ArrayLike, "..."], *, closed: bool = True
) -> Complex[Array, "..."]:
  r"""zReLU: ``z`` where :math:`\arg z \in [0, \pi/2]`, else 0.

  ``closed=True`` keeps the boundary (``Re z >= 0`` and ``Im z >= 0``, the
  interval quoted by the cvnn docs); ``closed=False`` is the open quadrant
  (``Re z > 0`` and ``Im z > 0``): torchcomplex's zReLU and CNet's
  ``CRelu``.

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> print(np.asarray(cplx.zrelu(jnp.array([1 + 2j, -1 + 3j, 2 + 0j]))))
    [1.+2.j 0.+0.j 2.+0.j]

  References:
    Guberman, *On Complex Valued Convolutional Neural Networks*,
    arXiv:1602.09046 (2016); Trabelsi et al., arXiv:1705.09792 (2018).
  """
  _common.check_complex("zrelu", "z", z)
  z = jnp.asarray(z)
  re, im = jnp.real(z), jnp.imag(z)
  keep = (re >= 0) & (im >= 0) if closed else (re > 0) & (im > 0)
  return jnp.where(keep, z, jnp.zeros_like(z))


@_scope.scoped
def modrelu(
  z: Complex[ArrayLike, "... c"],
  bias: Float[ArrayLike, " c"],
  *,
  power: int = 1,
) -> Complex[Array, "... c"]:
  r"""modReLU: :math:`\mathrm{ReLU}(|z| + b)^p \, z / |z|` (0 at ``z = 0``).

  ``bias`` is real, per feature (last axis) or a scalar; init 0 (the PCT),
  torchcomplex draws it from U(0, 0.25). The PCT's FFN uses ``power=2``.

  Args:
    z: complex input, features last.
    bias: real ``(c,)`` or ``()``.
    power: the exponent ``p`` (a positive integer).

  Returns:
    ``z``'s shape and dtype.

  Raises:
    TypeError: for a non-complex ``z`` or a non-real ``bias``.
    ValueError: for a bias shape other than ``(c,)`` or ``()``, or a
      non-positive ``power``.

  Examples:
    >>> y = cplx.modrelu(jnp.array([3 + 4j, 0.6 + 0.8j]), jnp.array(-2.0))
    >>> print(np.asarray(y).round(4))  # relu(|z| - 2) z / |z|
    [1.8+2.4j 0. +0.j ]

  References:
    Arjovsky, Shah & Bengio, *Unitary Evolution Recurrent Neural Networks*,
    arXiv:1511.06464 (2016); Hioki, arXiv:2605.10123 (2026) for ``p = 2``.
  """
  who = "modrelu"
  _common.check_complex(who, "z", z)
  _common.check_real(who, "bias", bias)
  _checks.check_positive_int(who, "power", power)
  z = jnp.asarray(z)
  _checks.check_ndim(who, "z", z, minimum=1)
  if jnp.shape(bias) not in ((), (z.shape[-1],)):
    raise ValueError(
      f"{who}: bias must have shape () or (z.shape[-1],)=({z.shape[-1]},), "
      f"got bias.shape={jnp.shape(bias)}"
    )
  real = _common.real_dtype(z.dtype)
  b = jnp.asarray(bias).astype(real)
  if b.ndim:
    b = _numerics.channel(b, z.ndim, real)
  mag = jax.nn.relu(basics.modulus(z) + b)
  return (jax.lax.integer_pow(mag, power).astype(z.dtype)) * basics.unit_phasor(
    z
  )


@_scope.scoped
def cardioid(z: Complex[ArrayLike, "..."]) -> Complex[Array, "..."]:
  r"""Complex cardioid: :math:`\tfrac12 (1 + \cos\arg z)\, z`.

  Equals ReLU on the real axis and scales by the phase only, so it is
  smooth away from 0; :math:`\cos\arg z = \mathrm{Re}\,z/|z|` is taken as 1
  at ``z = 0`` (output 0, finite gradient).

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> y = cplx.cardioid(jnp.array([2 + 0j, 1j, 1 + 1j]))
    >>> print(np.asarray(y).round(4))  # (1 + cos(arg z)) z / 2
    [2.    +0.j     0.    +0.5j    0.8536+0.8536j]

  References:
    Virtue, Yu & Lustig, *Better than Real: Complex-valued Neural Nets for
    MRI Fingerprinting*, arXiv:1707.00070 (2017).
  """
  _common.check_complex("cardioid", "z", z)
  z = jnp.asarray(z)
  cos = jnp.real(basics.unit_phasor(z))
  cos = jnp.where(_common.abs2(z) > 0, cos, 1.0)
  return (0.5 * (1.0 + cos)).astype(z.dtype) * z


@_scope.scoped
def split_gelu(
  z: Complex[ArrayLike, "..."], *, approximate: bool = True
) -> Complex[Array, "..."]:
  r"""Split GELU: GELU of the real and imaginary parts separately.

  .. math:: \mathrm{GELU}(\mathrm{Re}\,z) + i\,\mathrm{GELU}(\mathrm{Im}\,z)

  CNet's ``CGelu`` uses the tanh approximation (``approximate=True``).

  Raises:
    TypeError: for a non-complex ``z``.

  Examples:
    >>> y = cplx.split_gelu(jnp.array([1 - 1j]))
    >>> print(np.asarray(y).round(4))  # gelu(1) + i gelu(-1)
    [0.8412-0.1588j]

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``, ``CGelu``); Hendrycks &
    Gimpel, *Gaussian Error Linear Units*, arXiv:1606.08415 (2016).
  """
  _common.check_complex("split_gelu", "z", z)
  return _split(
    lambda t: jax.nn.gelu(t, approximate=approximate), jnp.asarray(z)
  )


ACTIVATIONS: Mapping[str, Callable[..., jax.Array]] = types.MappingProxyType(
  {
    "crelu": crelu,
    "zrelu": zrelu,
    "cardioid": cardioid,
    "split_gelu": split_gelu,
  }
)
"""The parameter-free complex activations by name (modReLU takes a bias)."""
