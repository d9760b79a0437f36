r"""DepthBench's depth-aware residuals: DeepNorm, KEEL, depth-muP, CompleteP.

Two families, both functions of the network depth ``L`` (Transformer layers,
each an attention and an MLP sublayer):

* scaled post-norm, :math:`\mathrm{norm}(\alpha x + f(\mathrm{norm_{in}}(x)))`
  (`scaled_post_norm`): DeepNorm (no input norm, :math:`\alpha =
  (2L)^{1/4}`, `deepnorm_alpha`; branch weights initialized with gain
  :math:`\beta = (8L)^{-1/4}`, `deepnorm_beta`) and KEEL (an input norm,
  :math:`\alpha = 2L`, `keel_alpha`; its first layer is wired as pre-norm
  and plain post-norm);
* depth-scaled pre-norm, :math:`x + (L/L_0)^{-e} f(\mathrm{norm}(x))`
  (`depth_scale` with `jaxnorm.residual.scaled_residual`): depth-muP
  (:math:`e = 1/2`) and CompleteP (:math:`e = 1`).

Provenance: the block equations, DeepNorm's :math:`\alpha` and its
:math:`\beta` init (value and output projections and every FFN matrix),
KEEL's :math:`\alpha = 2L` and its first layer were read in DepthBench's
official code (``keyu-wang-2002/DepthBench``, OLMo-core
``nn/transformer/block.py`` ``DeepNormTransformerBlock``,
``KeelTransformerBlock``; ``nn/transformer/init.py`` ``InitMethod.deepnorm``).
DeepNorm's constants agree with the decoder-only row of DeepNet's table
(Wang et al. 2022). The depth-muP and CompleteP branch multipliers are
DepthBench's; their papers' learning-rate and initialization rules by depth
are not applied here (Unverified: read in no paper body).
"""

from __future__ import annotations

import jax
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.residual._common import ArrayFn, branch

DEPTH_EXPONENTS = {"depth_mup": 0.5, "completep": 1.0}
"""Exponent ``e`` of the branch multiplier :math:`(L/L_0)^{-e}`."""


@_scope.scoped
def deepnorm_alpha(num_layers: int) -> float:
  r"""DeepNorm's residual weight :math:`\alpha = (2L)^{1/4}` (decoder-only).

  Args:
    num_layers: Transformer layers ``L`` (each an attention and an FFN).

  Returns:
    The Python float :math:`\alpha`.

  Raises:
    ValueError: for a non-positive ``num_layers``.

  Examples:
    >>> print(round(residual.deepnorm_alpha(8), 4))  # (2 * 8) ** 0.25
    2.0

  References:
    Wang et al., *DeepNet: Scaling Transformers to 1,000 Layers*,
    arXiv:2203.00555 (2022), decoder-only row of the constants table;
    DepthBench ``DeepNormTransformerBlock`` (``(2 * n_layers) ** 0.25``).
  """
  _checks.check_positive_int("deepnorm_alpha", "num_layers", num_layers)
  return (2.0 * num_layers) ** 0.25


@_scope.scoped
def deepnorm_beta(num_layers: int) -> float:
  r"""DeepNorm's init gain :math:`\beta = (8L)^{-1/4}` (decoder-only).

  DeepNet multiplies the Xavier init of the value and output projections
  and of the FFN matrices by :math:`\beta` (query and key keep gain 1);
  DepthBench multiplies its truncated-normal standard deviation the same
  way (``InitMethod.deepnorm``).

  Args:
    num_layers: Transformer layers ``L``.

  Returns:
    The Python float :math:`\beta`.

  Raises:
    ValueError: for a non-positive ``num_layers``.

  Examples:
    >>> print(round(residual.deepnorm_beta(2), 4))  # (8 * 2) ** -0.25
    0.5

  References:
    Wang et al., *DeepNet: Scaling Transformers to 1,000 Layers*,
    arXiv:2203.00555 (2022).
  """
  _checks.check_positive_int("deepnorm_beta", "num_layers", num_layers)
  return (8.0 * num_layers) ** -0.25


@_scope.scoped
def keel_alpha(num_layers: int) -> float:
  r"""KEEL's residual weight :math:`\alpha = 2L`.

  KEEL counts attention and FFN as separate sublayers, so :math:`\alpha` is
  the number of sublayers of an ``L``-layer Transformer (DepthBench:
  ``float(2 * n_layers)``).

  Raises:
    ValueError: for a non-positive ``num_layers``.

  Examples:
    >>> print(residual.keel_alpha(12))
    24.0

  References:
    KEEL, arXiv:2601.19895 (2026) (abstract only: Unverified beyond
    DepthBench's ``KeelTransformerBlock``).
  """
  _checks.check_positive_int("keel_alpha", "num_layers", num_layers)
  return 2.0 * num_layers


@_scope.scoped
def depth_scale(num_layers: int, base_depth: int, exponent: float) -> float:
  r"""The depth-scaled branch multiplier :math:`(L / L_0)^{-e}`.

  depth-muP uses :math:`e = 1/2` and CompleteP :math:`e = 1`
  (`DEPTH_EXPONENTS`); :math:`L_0` is the base depth at which the
  hyperparameters were tuned (multiplier 1 there).

  Args:
    num_layers: layers ``L`` of the network.
    base_depth: the base depth :math:`L_0`.
    exponent: :math:`e > 0`.

  Returns:
    The Python float multiplier.

  Raises:
    ValueError: for non-positive depths or exponent.

  Examples:
    >>> print(residual.depth_scale(32, 8, 0.5))  # depth-muP: (32 / 8) ** -0.5
    0.5
    >>> print(residual.depth_scale(32, 8, 1.0))  # CompleteP
    0.25

  References:
    Yang et al., *Tensor Programs VI: Feature Learning in Infinite-Depth
    Neural Networks*, arXiv:2310.02244 (2023); Dey et al., *Don't be lazy:
    CompleteP enables compute-efficient deep transformers*,
    arXiv:2505.01618 (2025).
  """
  who = "depth_scale"
  _checks.check_positive_int(who, "num_layers", num_layers)
  _checks.check_positive_int(who, "base_depth", base_depth)
  if not (isinstance(exponent, (int, float)) and exponent > 0):
    raise ValueError(
      f"{who}: exponent must be a positive float, got {exponent=}"
    )
  return (num_layers / base_depth) ** -float(exponent)


@_scope.scoped
def scaled_post_norm(
  x: Float[ArrayLike, "... d"],
  sublayer: ArrayFn,
  norm: ArrayFn,
  *,
  alpha: float,
  norm_in: ArrayFn | None = None,
) -> Float[Array, "... d"]:
  r"""Scaled post-norm residual step.

  .. math:: \mathrm{norm}(\alpha x + f(\mathrm{norm_{in}}(x)))

  DeepNorm: no input norm, :math:`\alpha = (2L)^{1/4}` (`deepnorm_alpha`).
  KEEL: an input norm and :math:`\alpha = 2L` (`keel_alpha`). With
  :math:`\alpha = 1` and no input norm this is `post_norm`.

  The sum is formed in ``promote_types(x.dtype, float32)``; the output has
  the dtype of ``x``.

  Args:
    x: residual stream ``(..., d)``.
    sublayer: the branch ``f``, ``(..., d) -> (..., d)``.
    norm: the output norm.
    alpha: the weight of the shortcut, a positive Python float.
    norm_in: optional norm of the branch input (KEEL).

  Returns:
    The updated stream, shape and dtype of ``x``.

  Raises:
    TypeError: for a non-floating ``x``.
    ValueError: for a non-positive ``alpha`` or a branch that changes the
      shape of ``x``.

  Examples:
    >>> x = jnp.array([1.0, 2.0])
    >>> y = residual.scaled_post_norm(x, lambda h: h, lambda h: h, alpha=2.0)
    >>> print(np.asarray(y))  # norm(alpha x + f(x)) with identity norm
    [3. 6.]

  References:
    Wang et al., *DeepNet: Scaling Transformers to 1,000 Layers*,
    arXiv:2203.00555 (2022); KEEL, arXiv:2601.19895 (2026); DepthBench
    (``keyu-wang-2002/DepthBench``) block code.
  """
  who = "scaled_post_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  if not (isinstance(alpha, (int, float)) and alpha > 0):
    raise ValueError(f"{who}: alpha must be a positive float, got {alpha=}")
  x = jax.numpy.asarray(x)
  y = branch(who, x, sublayer, norm_in)
  ct = _numerics.compute_dtype(x)
  s = float(alpha) * x.astype(ct) + y.astype(ct)
  return norm(s.astype(x.dtype)).astype(x.dtype)


def num_layers_of(num_sublayers: int, sublayers_per_layer: int) -> int:
  """Layers ``ceil(num_sublayers / sublayers_per_layer)`` of a stack."""
  return -(-num_sublayers // sublayers_per_layer)
