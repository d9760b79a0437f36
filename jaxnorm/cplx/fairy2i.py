"""Fairy2i: phase quantization of widely-linear weights to {±1, ±i}.

A real ``(2m, 2n)`` kernel is exactly the widely-linear pair ``(u, w)``
(`jaxnorm.cplx.widely_linear_from_real`); Fairy2i quantizes each of ``u``
and ``w`` to codes in {±1, ±i} with two per-tensor scales, optionally with
residual stages, and recomposes the real kernel for an ordinary matmul.
The BitNet baselines of the Fairy2i repository (binary and ternary) are
here too, for the comparison.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Complex, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.cplx import _common, basics, layers

_MIN_SCALE = 1e-6


def _straight_through(w: jax.Array, q: jax.Array, ste: bool) -> jax.Array:
  """``w + stop_gradient(q - w)`` (identity gradient) or ``q`` (no grad)."""
  if ste:
    return w + jax.lax.stop_gradient(q - w)
  return jax.lax.stop_gradient(q)


def _masked_mean(a: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of ``a`` over ``mask`` (0 for an empty mask), clamped >= 1e-6."""
  total = jnp.sum(jnp.where(mask, a, 0.0))
  count = jnp.sum(mask).astype(total.dtype)
  mean = jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)
  return jnp.maximum(mean, _MIN_SCALE)


@_scope.scoped
def phase_codes(w: Complex[ArrayLike, "..."]) -> Complex[Array, "..."]:
  r"""The PhaseQuant code of each entry: the sector of :math:`\arg w`.

  .. math::
    +1: \varphi \in [-\pi/4, \pi/4),\ +i: [\pi/4, 3\pi/4),\
    -1: \varphi \ge 3\pi/4 \text{ or } \varphi < -3\pi/4,\ -i: [-3\pi/4,
    -\pi/4)

  with :math:`\arg 0 = 0` (code +1), as ``torch.angle``. Away from the
  sector boundaries this is :math:`\arg\max_c \mathrm{Re}(w \bar c)` over
  {±1, ±i}.

  Raises:
    TypeError: for a non-complex ``w``.

  Examples:
    >>> w = jnp.array([2 + 1j, 1 + 2j, 1 - 3j])  # arg near 0, pi/2, -pi/2
    >>> print(np.asarray(cplx.phase_codes(w)))
    [1.+0.j 0.+1.j 0.-1.j]
  """
  _common.check_complex("phase_codes", "w", w)
  w = jnp.asarray(w)
  phi = basics.phase(w)
  q = math.pi / 4
  one = jnp.ones_like(w)
  codes = jnp.where((phi >= -q) & (phi < q), one, -one)
  codes = jnp.where((phi >= q) & (phi < 3 * q), 1j * one, codes)
  return jnp.where((phi >= -3 * q) & (phi < -q), -1j * one, codes)


def _phase_quant_stage(w: jax.Array) -> jax.Array:
  """One PhaseQuant stage: ``s_re (±1)`` or ``s_im (±i)`` per entry."""
  codes = phase_codes(w)
  on_real = jnp.imag(codes) == 0
  s_re = _masked_mean(jnp.abs(jnp.real(w)), on_real)
  s_im = _masked_mean(jnp.abs(jnp.imag(w)), ~on_real)
  return jax.lax.complex(jnp.real(codes) * s_re, jnp.imag(codes) * s_im)


@_scope.scoped
def phase_quantize(
  w: Complex[ArrayLike, "..."],
  *,
  num_stages: int = 1,
  straight_through: bool = True,
) -> Complex[Array, "..."]:
  r"""Fairy2i PhaseQuant of a complex tensor, with residual stages.

  One stage maps each entry to its `phase_codes` code times a per-tensor
  scale: :math:`s_{re}` = mean :math:`|\mathrm{Re}\,w|` over the ±1
  entries, :math:`s_{im}` = mean :math:`|\mathrm{Im}\,w|` over the ±i
  entries (each clamped ≥ 1e-6; an empty set gives 1e-6). Residual stages:
  :math:`q_1 = Q(w)`, :math:`q_t = Q(w - \sum_{<t} q)`, :math:`w_q =
  \sum_t q_t` (``num_stages=2`` is Fairy2i-W2, 2 bits per real parameter;
  ``1`` is W1). :math:`Q(i w) = i Q(w)` with the two scales swapped.

  Args:
    w: complex weights (one tensor: scales are per whole tensor).
    num_stages: residual stages ``T >= 1``.
    straight_through: identity gradient to ``w`` (STE,
      ``w + stop_gradient(w_q - w)``); False blocks the gradient.

  Returns:
    ``w_q`` with ``w``'s shape and complex compute dtype.

  Raises:
    TypeError: for a non-complex ``w``.
    ValueError: for a non-positive ``num_stages``.

  Examples:
    >>> w = jnp.array([2 + 1j, 1 + 3j, -4 + 0j, -1j])
    >>> print(np.asarray(cplx.phase_quantize(w)))  # s_re = 3, s_im = 2
    [ 3.+0.j  0.+2.j -3.+0.j  0.-2.j]

  References:
    Wang et al., *Fairy2i: Training Complex LLMs from Real LLMs with All
    Parameters in {±1, ±i}*, arXiv:2512.02901 (2025); code
    ``PKULab1806/Fairy2i-W2`` (``PhaseQuantSTE``, ``PhaseQuantSTE_V2``).
  """
  who = "phase_quantize"
  _common.check_complex(who, "w", w)
  _checks.check_positive_int(who, "num_stages", num_stages)
  w = jnp.asarray(w)
  wf = w.astype(_common.complex_dtype(w))
  target = jax.lax.stop_gradient(wf)
  total = jnp.zeros_like(target)
  for _ in range(num_stages):
    total = total + _phase_quant_stage(target - total)
  return _straight_through(wf, total, straight_through)


@_scope.scoped
def fairy2i_quantize_kernel(
  kernel: Float[ArrayLike, "two_m two_n"],
  *,
  num_stages: int = 2,
  straight_through: bool = True,
) -> Float[Array, "two_m two_n"]:
  """Fairy2i fake-quantized real kernel for quantization-aware training.

  Decomposes the real kernel into ``(u, w)``
  (`jaxnorm.cplx.widely_linear_from_real`), quantizes each with
  `phase_quantize` (scales per tensor, ``u`` and ``w`` separately) and
  recomposes the real kernel, used in an ordinary real matmul. The gradient
  is the identity to the master kernel (STE). Kernels with an odd
  dimension are skipped by Fairy2i: check `widely_linear_from_real`'s
  requirement before calling. Activations are not quantized.

  Unverified: Fairy2i's QAT schedule and learning rate are not in the
  training script read; the paper body is known only through summaries.

  Args:
    kernel: real ``(2m, 2n)`` (Flax ``(in, out)``).
    num_stages: 2 for W2, 1 for W1.
    straight_through: identity gradient (STE) or none.

  Returns:
    The quantized real kernel, ``kernel``'s shape and dtype.

  Raises:
    TypeError: for a non-real kernel.
    ValueError: for odd dimensions or a bad ``num_stages``.

  Examples:
    >>> k = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # u = 1, w = 0 exactly
    >>> print(np.asarray(cplx.fairy2i_quantize_kernel(k)).round(4))
    [[1. 0.]
     [0. 1.]]

  References:
    Wang et al., arXiv:2512.02901 (2025); code ``PKULab1806/Fairy2i-W2``.
  """
  k = jnp.asarray(kernel)
  u, w = layers.widely_linear_from_real(k)
  kq = layers.real_from_widely_linear(
    phase_quantize(u, num_stages=num_stages, straight_through=False),
    phase_quantize(w, num_stages=num_stages, straight_through=False),
  )
  kf = k.astype(kq.dtype)
  return _straight_through(kf, kq, straight_through).astype(k.dtype)


@_scope.scoped
def binary_quantize_kernel(
  kernel: Float[ArrayLike, "..."], *, straight_through: bool = True
) -> Float[Array, "..."]:
  r"""BitNet 1-bit baseline, the centred sign times the mean modulus.

  :math:`\mathrm{sign}(w - \bar w) \cdot \mathrm{mean}|w|` (``+1`` where
  ``w > mean``, else ``-1``).

  The Fairy2i repository's ``BitNetQuantSTE`` (per tensor, STE).

  Raises:
    TypeError: for a non-real kernel.

  Examples:
    >>> k = jnp.array([0.5, -1.5, 2.0, 1.0])  # mean 0.5, mean |w| 1.25
    >>> print(np.asarray(cplx.binary_quantize_kernel(k)))
    [-1.25 -1.25  1.25  1.25]

  References:
    Wang et al., *BitNet*, arXiv:2310.11453 (2023); code
    ``PKULab1806/Fairy2i-W2``.
  """
  _common.check_real("binary_quantize_kernel", "kernel", kernel)
  k = jnp.asarray(kernel)
  kf = k.astype(_numerics.compute_dtype(k))
  sign = jnp.where(kf - jnp.mean(kf) > 0, 1.0, -1.0).astype(kf.dtype)
  q = sign * jnp.mean(jnp.abs(kf))
  return _straight_through(kf, q, straight_through).astype(k.dtype)


@_scope.scoped
def ternary_quantize_kernel(
  kernel: Float[ArrayLike, "..."], *, straight_through: bool = True
) -> Float[Array, "..."]:
  r"""BitNet b1.58 baseline, ternary codes times the mean modulus.

  :math:`\mathrm{clip}(\mathrm{round}(w / (\gamma + 10^{-5})), -1, 1)\,
  \gamma`, :math:`\gamma = \mathrm{mean}|w|`.

  The Fairy2i repository's ``BitNet1_58QuantSTE`` (per tensor, STE).

  Raises:
    TypeError: for a non-real kernel.

  Examples:
    >>> k = jnp.array([0.1, -1.5, 2.0, 0.4])  # gamma = mean |w| = 1
    >>> print(np.asarray(cplx.ternary_quantize_kernel(k)).round(4))
    [ 0. -1.  1.  0.]

  References:
    Ma et al., *The Era of 1-bit LLMs*, arXiv:2402.17764 (2024); code
    ``PKULab1806/Fairy2i-W2``.
  """
  _common.check_real("ternary_quantize_kernel", "kernel", kernel)
  k = jnp.asarray(kernel)
  kf = k.astype(_numerics.compute_dtype(k))
  gamma = jnp.mean(jnp.abs(kf))
  q = jnp.clip(jnp.round(kf / (gamma + 1e-5)), -1.0, 1.0) * gamma
  return _straight_through(kf, q, straight_through).astype(k.dtype)
