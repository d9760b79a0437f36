"""CNet's FFT-Hadamard convolution layer for complex models.

The maths is `jaxnorm.cplx.pad_kernel` and
`jaxnorm.cplx.fourier_hadamard_conv` (`jaxnorm.cplx.cnet`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _param
from jaxnorm.nn.cplx.layers import cnet_input_init


class FourierHadamardConv(nnx.Module):
  """CNet's convolution: ``IFT(FT(x) * FT(Pad(k)))`` with learned taps ``k``.

  Parameter: ``kernel (K,)`` complex taps (a ``CInput`` in CNet),
  `jaxnorm.nn.cplx.layers.cnet_input_init` by default (CNet's init;
  ``kernel_init`` replaces it). With ``kernel_index`` the taps are scattered
  into ``size`` zeros by `jaxnorm.cplx.pad_kernel` (CNet's ``Pad``, e.g.
  ``jaxnorm.cplx.local_kernel_index((7, 7), (28, 28))``); without it
  ``K = size`` (a full-length spatial filter). Then
  `jaxnorm.cplx.fourier_hadamard_conv` along the last axis: the circular
  convolution divided by ``sqrt(size)``, or with ``inverse=False`` the
  frequency-domain product (the README's MNIST net).

  Examples:
    >>> conv = FourierHadamardConv(8, (0, 1), rngs=nnx.Rngs(0))  # 2 taps
    >>> y = conv(jnp.ones((3, 8), jnp.complex64))
    >>> y.shape, y.dtype, conv.kernel[...].shape
    ((3, 8), dtype('complex64'), (2,))

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``: ``Pad``, ``FourierTrans``,
    ``Hadamard``, ``InverseFourierTrans``); Crasmaru, *On the Equivalence
    of Convolutional and Hadamard Networks using DFT*, arXiv:1810.11650
    (2018).
  """

  def __init__(
    self,
    size: int,
    kernel_index: Sequence[int] | None = None,
    *,
    inverse: bool = True,
    kernel_init: Callable[..., jax.Array] = cnet_input_init,
    param_dtype: Any = jnp.complex64,
    rngs: nnx.Rngs,
  ):
    """Builds the taps.

    Args:
      size: the transform length ``N`` (``x.shape[-1]``).
      kernel_index: ``K`` distinct positions in ``[0, size)``, or None.
      inverse: return to the spatial domain.
      kernel_init: initializer of the taps ``(key, (K,), param_dtype)``.
      param_dtype: complex dtype of the taps.
      rngs: parameter RNG streams.

    Raises:
      ValueError: for a bad ``size`` or ``kernel_index`` (as `pad_kernel`).
    """
    who = "FourierHadamardConv"
    _checks.check_positive_int(who, "size", size)
    self.size, self.inverse = size, inverse
    self.kernel_index = None if kernel_index is None else tuple(kernel_index)
    taps = size if kernel_index is None else len(self.kernel_index)
    if self.kernel_index is not None:
      # Validate now (static), not at the first call.
      cplx.pad_kernel(jnp.zeros((taps,), param_dtype), self.kernel_index, size)
    self.kernel = _param.param(
      kernel_init(rngs.params(), (taps,), param_dtype), (None,)
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Complex ``(..., size)`` -> complex ``(..., size)``."""
    k = self.kernel[...]
    if self.kernel_index is not None:
      k = cplx.pad_kernel(k, self.kernel_index, self.size)
    return cplx.fourier_hadamard_conv(x, k, inverse=self.inverse)
