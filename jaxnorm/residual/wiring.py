"""Residual wiring as pure functions: where the norm sits around a sublayer.

A block is written once as a sublayer ``f`` (attention, MLP) and a norm
``norm``; these functions decide how the residual stream ``x`` flows around
them. They take callables, so they compose with plain functions as well as
with nnx modules (call them inside a module's ``__call__``). Pre-norm,
post-norm, sandwich and the fused pre-norm stack, then the scaled residuals
(depth rule, SkipInit, ReZero, LayerScale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope, norms
from jaxnorm.residual._common import (
  AddNormFn,
  ArrayFn,
  IndexLike,
  branch,
  check_layer_index,
  leading,
)

ScaleRule = Literal["1/n", "1/sqrt(n)"]
_SCALE_RULES: tuple[str, ...] = ("1/n", "1/sqrt(n)")


def _add(x: ArrayLike, y: jax.Array) -> jax.Array:
  """The residual add ``x + y`` in the compute dtype, cast to ``x.dtype``.

  The stream keeps its dtype whatever the branch or a norm returns (e.g. a
  float32 norm output for a bfloat16 stream, flax's dtype rule).
  """
  x = jnp.asarray(x)
  ct = _numerics.compute_dtype(x)
  return (x.astype(ct) + y.astype(ct)).astype(x.dtype)


def _scaled(norm: ArrayFn, layer_index: IndexLike | None) -> ArrayFn:
  if layer_index is None:
    return norm
  if not isinstance(layer_index, (jax.Array, np.ndarray)):
    factor = norms.layer_norm_scaling(int(layer_index))
    return lambda h: norm(h) * factor

  def scaled(h: jax.Array) -> jax.Array:
    y = norm(h)
    ell = jnp.asarray(layer_index).astype(jnp.float32) + 1.0
    return y * jax.lax.rsqrt(ell).astype(y.dtype)

  return scaled


@_scope.scoped
def pre_norm(
  x: jax.Array,
  sublayer: ArrayFn,
  norm: ArrayFn,
  *,
  layer_index: IndexLike | None = None,
) -> jax.Array:
  r"""Pre-norm residual step :math:`x + f(\mathrm{norm}(x))`.

  With ``layer_index`` (0-based) the norm output is multiplied by the
  LayerNorm Scaling factor :math:`1/\sqrt{\ell}`, ``ell = layer_index + 1``
  (see `jaxnorm.norms.layer_norm_scaling`), giving
  :math:`x + f(\mathrm{norm}(x)/\sqrt{\ell})`.

  Args:
    x: residual stream.
    sublayer: the branch ``f``.
    norm: the normalization applied to the branch input.
    layer_index: 0-based block index enabling LayerNorm Scaling: a Python
      integer, or an integer scalar array (traced, e.g. inside ``nnx.scan``
      over layers; the factor is then formed in float32 and cast to the
      norm's output dtype); ``None`` (default) is the plain pre-norm block.

  Returns:
    The updated stream, with the shape and dtype of ``x`` (the sum is formed
    in ``promote_types(x.dtype, float32)``).

  Raises:
    ValueError: for a negative, non-integer or non-scalar ``layer_index``.

  Examples:
    >>> x = jnp.array([3.0, 4.0])
    >>> y = residual.pre_norm(x, lambda h: 2 * h, lambda h: h / 5)
    >>> print(np.asarray(y))  # x + f(norm(x))
    [4.2 5.6]

  References:
    Xiong et al., *On Layer Normalization in the Transformer Architecture*,
    arXiv:2002.04745 (2020); Sun et al., *The Curse of Depth in Large
    Language Models*, arXiv:2502.05795 (2025).
  """
  check_layer_index("pre_norm", layer_index)
  return _add(x, sublayer(_scaled(norm, layer_index)(x)))


@_scope.scoped
def post_norm(x: jax.Array, sublayer: ArrayFn, norm: ArrayFn) -> jax.Array:
  r"""Post-norm residual step :math:`\mathrm{norm}(x + f(x))`.

  The original Transformer wiring. The sum is formed in
  ``promote_types(x.dtype, float32)``; the output has the dtype of ``x``
  (the residual steps keep the stream's dtype).

  Examples:
    >>> x = jnp.array([3.0, 4.0])
    >>> y = residual.post_norm(x, lambda h: h, lambda h: h / 5)
    >>> print(np.asarray(y))  # norm(x + f(x))
    [1.2 1.6]

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """
  return norm(_add(x, sublayer(x))).astype(jnp.result_type(x))


@_scope.scoped
def sandwich_norm(
  x: jax.Array,
  sublayer: ArrayFn,
  norm_in: ArrayFn,
  norm_out: ArrayFn,
  *,
  layer_index: IndexLike | None = None,
) -> jax.Array:
  r"""Sandwich residual step.

  .. math:: x + \mathrm{norm_{out}}(f(\mathrm{norm_{in}}(x)))

  ``layer_index`` applies LayerNorm Scaling to the input norm as in
  `pre_norm`.

  Examples:
    >>> x = jnp.array([3.0, 4.0])
    >>> f, norm_in, norm_out = (lambda h: h), (lambda h: h / 5), (lambda h: -h)
    >>> y = residual.sandwich_norm(x, f, norm_in, norm_out)
    >>> print(np.asarray(y).round(4))  # x + norm_out(f(norm_in(x)))
    [2.4 3.2]

  References:
    Ding et al., *CogView: Mastering Text-to-Image Generation via
    Transformers*, arXiv:2105.13290 (2021).
  """
  check_layer_index("sandwich_norm", layer_index)
  return _add(x, norm_out(sublayer(_scaled(norm_in, layer_index)(x))))


@_scope.scoped
def fused_pre_norm(
  x: Float[ArrayLike, "... d"],
  sublayers: Sequence[ArrayFn],
  norm: ArrayFn,
  add_norms: Sequence[AddNormFn],
  *,
  return_hidden: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  r"""A stack of `pre_norm` steps with every residual add fused into a norm.

  The pre-norm stack :math:`x_{k+1} = x_k + f_k(\mathrm{norm}_k(x_k))`,
  ``k = 0 .. K-1``, regrouped so that each residual add meets the norm that
  reads its result (one pass over the stream with a fused kernel):

  .. math::
    y_0 = \mathrm{norm}_0(x_0),\quad b_k = f_k(y_k),\quad
    (x_{k+1}, y_{k+1}) = \mathrm{add\_norm}_{k+1}(b_k, x_k)
    \ (k < K - 1),\quad x_K = x_{K-1} + b_{K-1},

  where ``add_norm(b, x)`` returns :math:`(x + b, \mathrm{norm}(x + b))`
  (`jaxnorm.fused_norms.add_rms_norm`, ``add_layer_norm``, or a norm
  module's ``add_and_norm``). The result equals the unfused stack.

  Args:
    x: residual stream ``(..., d)``.
    sublayers: the branches ``f_0 .. f_{K-1}``, each ``(..., d)`` to
      ``(..., d)``.
    norm: :math:`\mathrm{norm}_0`, applied to ``x``.
    add_norms: :math:`\mathrm{add\_norm}_1 .. \mathrm{add\_norm}_{K-1}`
      (one fewer than ``sublayers``).
    return_hidden: also return :math:`x_1 .. x_K` stacked to
      ``(K, ..., d)``.

  Returns:
    :math:`x_K` in the dtype of ``x`` (and the stacked hidden states).

  Raises:
    ValueError: for an empty ``sublayers``, or ``add_norms`` whose length is
      not ``len(sublayers) - 1``.

  Examples:
    >>> norm = lambda h: h / 2
    >>> add_norm = lambda b, x: (x + b, norm(x + b))
    >>> f = [lambda h: h, lambda h: 3 * h]
    >>> y = residual.fused_pre_norm(jnp.array([2.0]), f, norm, [add_norm])
    >>> print(np.asarray(y))  # x1 = 2 + 1 = 3, x2 = 3 + 3 * 1.5
    [7.5]

  References:
    Xiong et al., *On Layer Normalization in the Transformer Architecture*,
    arXiv:2002.04745 (2020).
  """
  who = "fused_pre_norm"
  if not sublayers or len(add_norms) != len(sublayers) - 1:
    raise ValueError(
      f"{who}: need at least one sublayer and one add_norm per sublayer "
      f"after the first, got {len(sublayers)} sublayers and "
      f"{len(add_norms)} add_norms"
    )
  x = jnp.asarray(x)
  hidden = []
  branch = sublayers[0](norm(x))
  for sublayer, add_norm in zip(sublayers[1:], add_norms):
    x, y = add_norm(branch, x)
    hidden.append(x)
    branch = sublayer(y)
  x = _add(x, branch)
  hidden.append(x)
  return (x, jnp.stack(hidden)) if return_hidden else x


# ---------------------------------------------------------------------------
# Scaled residuals: depth rule, SkipInit, ReZero, LayerScale.


@_scope.scoped
def residual_scale(
  num_residuals: int, rule: ScaleRule | float = "1/n"
) -> float:
  r"""Depth-dependent branch scale :math:`\lambda` for ``num_residuals`` n.

  "On residual network depth" expands the tower
  :math:`x_k = x_{k-1} + \lambda f_k(x_{k-1})` into :math:`\binom{n}{j}`
  paths of order :math:`j` weighted :math:`\lambda^j`; with
  :math:`\lambda = 1/n` the total weight :math:`(1 + 1/n)^n \le e` is
  bounded in depth. The paper's best empirical setting is
  :math:`1/\sqrt{n}`.

  Unverified: for Transformers the paper does not say whether ``n`` counts
  blocks or sublayers; jaxnorm's wrappers pass the number of sublayers
  (attention and MLP each count).

  Args:
    num_residuals: number of residual branches ``n`` in the tower.
    rule: ``"1/n"`` (the derived rule, default), ``"1/sqrt(n)"``, or a
      positive float used as is.

  Returns:
    The Python float :math:`\lambda`.

  Raises:
    ValueError: for a non-positive ``num_residuals``, an unknown rule or a
      non-positive float.

  Examples:
    >>> print(residual.residual_scale(4))
    0.25
    >>> print(residual.residual_scale(4, "1/sqrt(n)"))
    0.5

  References:
    Dherin & Munn, *On residual network depth*, arXiv:2510.03470 (2025).
  """
  who = "residual_scale"
  _checks.check_positive_int(who, "num_residuals", num_residuals)
  if isinstance(rule, str):
    _checks.check_choice(who, "rule", rule, _SCALE_RULES)
    return 1.0 / (num_residuals if rule == "1/n" else math.sqrt(num_residuals))
  if (
    isinstance(rule, bool) or not isinstance(rule, (int, float)) or (rule <= 0)
  ):
    raise ValueError(
      f"{who}: rule must be '1/n', '1/sqrt(n)' or a positive float, got {rule=}"
    )
  return float(rule)


@_scope.scoped
def scaled_residual(
  x: Float[ArrayLike, "... d"],
  sublayer: ArrayFn,
  scale: Float[ArrayLike, "*d"] | float,
  *,
  norm: ArrayFn | None = None,
) -> Float[Array, "... d"]:
  r"""Scaled residual step :math:`x + s \odot f(\mathrm{norm}(x))`.

  One function covers the scaled-residual family; only ``scale`` differs:

  * depth rule (Dherin & Munn): a constant :math:`s = 1/n` or
    :math:`1/\sqrt{n}` from `residual_scale`;
  * SkipInit (De & Smith) and ReZero (Bachlechner et al.): a learnable scalar
    :math:`\alpha` initialized to 0 and no normalization (``norm=None``), so
    the network is the identity at initialization;
  * LayerScale (Touvron et al., CaiT): a learnable per-channel vector
    :math:`\mathrm{diag}(\lambda)` (init 1e-5 to 0.1) after a pre-norm.

  The sum is formed in ``promote_types(x.dtype, float32)`` and cast back to
  ``x.dtype``.

  Args:
    x: residual stream ``(..., d)``.
    sublayer: the branch ``f``, mapping ``(..., d)`` to ``(..., d)``.
    scale: a Python float, a scalar array (shape ``()`` or ``(1,)``) or a
      vector of shape ``(d,)``.
    norm: optional normalization of the branch input (pre-norm placement).

  Returns:
    The updated stream with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x`` or ``scale`` is not floating.
    ValueError: if ``scale`` is neither a scalar nor shaped ``(d,)``, or the
      branch output does not have the shape of ``x``.

  Examples:
    >>> x = jnp.array([1.0, 2.0])
    >>> y = residual.scaled_residual(x, lambda h: h, jnp.array([0.0, 0.5]))
    >>> print(np.asarray(y))  # LayerScale: x + s * f(x)
    [1. 3.]

  References:
    Dherin & Munn, *On residual network depth*, arXiv:2510.03470 (2025);
    De & Smith, *Batch Normalization Biases Residual Blocks Towards the
    Identity Function in Deep Networks*, arXiv:2002.10444 (2020);
    Bachlechner et al., *ReZero is All You Need: Fast Convergence at Large
    Depth*, arXiv:2003.04887 (2020); Touvron et al., *Going deeper with
    Image Transformers*, arXiv:2103.17239 (2021).
  """
  who = "scaled_residual"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  d = x.shape[-1]
  if not isinstance(scale, (int, float)):
    _checks.check_floating(who, "scale", scale)
    if np.ndim(scale) != 0 and tuple(np.shape(scale)) not in ((1,), (d,)):
      raise ValueError(
        f"{who}: scale must be a scalar or have shape (x.shape[-1],)="
        f"({d},), got scale.shape={np.shape(scale)}"
      )
  y = branch(who, x, sublayer, norm)
  ct = _numerics.compute_dtype(x)
  if isinstance(scale, (int, float)):
    s = jnp.asarray(scale, ct)
  else:
    s = jnp.asarray(scale).astype(ct)
    s = (
      jnp.reshape(s, ())
      if s.size == 1 and d != 1
      else leading(jnp.reshape(s, (-1,)), x.shape)
    )
  return (x.astype(ct) + s * y.astype(ct)).astype(x.dtype)
