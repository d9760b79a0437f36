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
  (:math:`e = 1/2`) and CompleteP (:math:`e = 1`), with DepthBench's base
  depth :math:`L_0 = 24` (`BASE_DEPTH`) and its Adam rule by depth
  (`depth_adam_scales`: the learning rate and eps of the hidden parameters).

Provenance: the block equations, DeepNorm's :math:`\alpha` and its
:math:`\beta` init (value and output projections and every FFN matrix),
KEEL's :math:`\alpha = 2L` and its first layer were read in DepthBench's
official code (``keyu-wang-2002/DepthBench``, OLMo-core
``nn/transformer/block.py`` ``DeepNormTransformerBlock``,
``KeelTransformerBlock`` at commit 183c4d1f;
``nn/transformer/init.py`` ``InitMethod.deepnorm``).
DeepNorm's constants agree with the decoder-only row of DeepNet's table
(Wang et al. 2022). The depth-muP and CompleteP rules (branch multiplier,
base depth, Adam learning rate and eps by depth) were read in DepthBench's
``examples/pretrain_preln_mup.py`` (commit aba1f652: ``--base-depth``
default 24, ``apply_depth_only_scaling``) and
``nn/transformer/block.py`` ``DepthScaledTransformerBlock`` (built by
``nn/transformer/config.py`` at commit 2a9d668a: exponent 0.5 for
``depth_mup``, 1.0 for ``completep``, both residual streams of a layer
scaled), and agree with CompleteP's official minimal code
(``EleutherAI/nanoGPT-mup``, branch ``completep``, ``model.py`` at commit
39044043: ``depth_multiplier ** -depth_alpha_exp`` on every branch, hidden
groups' ``lr_scale`` ``depth_multiplier ** (depth_alpha_exp - 1)`` and
``eps * depth_multiplier ** -depth_alpha_exp``, embeddings and final norm
unchanged). The papers' width rules (muP) are not applied: the width is
held fixed, as in DepthBench's ``depth_only`` axis.
"""

from __future__ import annotations

import jax
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.residual._common import ArrayFn, branch

DEPTH_EXPONENTS = {"depth_mup": 0.5, "completep": 1.0}
"""Exponent ``e`` of the branch multiplier :math:`(L/L_0)^{-e}`."""

BASE_DEPTH = 24
"""DepthBench's base depth :math:`L_0` of depth-muP and CompleteP: the depth
(Transformer layers) whose multipliers are all 1 (``--base-depth``, default
24, of ``examples/pretrain_preln_mup.py``; its 400M grid spans 16 to 32
layers around it)."""


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
  hyperparameters were tuned (multiplier 1 there). DepthBench multiplies
  both sublayers of every layer (attention and MLP) by it, with ``L`` the
  number of Transformer layers and :math:`L_0 = 24` (`BASE_DEPTH`); their
  Adam learning rate and eps follow `depth_adam_scales`.

  Args:
    num_layers: layers ``L`` of the network.
    base_depth: the base depth :math:`L_0` (`BASE_DEPTH` in DepthBench).
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
def depth_adam_scales(
  num_layers: int, base_depth: int, exponent: float
) -> tuple[float, float]:
  r"""Adam's learning-rate and eps factors of the hidden parameters by depth.

  With the depth multiplier :math:`m = L / L_0` and the branch exponent
  :math:`e` (`DEPTH_EXPONENTS`: 1/2 for depth-muP, 1 for CompleteP), the
  hidden parameters (everything inside the residual blocks: attention and
  MLP matrices, the blocks' norm scales, biases) train with

  .. math::
    \eta_{\mathrm{hidden}} = \eta\, m^{e - 1}, \qquad
    \epsilon_{\mathrm{hidden}} = \epsilon\, m^{-e},

  while the embeddings, the final norm and the head keep :math:`\eta` and
  :math:`\epsilon`. Both factors are 1 at the base depth (plain Adam).
  Decoupled weight decay is not rescaled: under AdamW it acts as
  :math:`\eta_{\mathrm{hidden}} \lambda`, as in PyTorch's ``AdamW`` whose
  parameter group carries the rescaled learning rate.

  Provenance: DepthBench's ``apply_depth_only_scaling``
  (``keyu-wang-2002/DepthBench`` ``examples/pretrain_preln_mup.py``, commit
  aba1f652: ``lr * m ** (alpha - 1)`` and ``eps * m ** -alpha`` on the
  parameter group ``blocks.*``); CompleteP's official code
  (``EleutherAI/nanoGPT-mup`` ``model.py``, commit 39044043) applies the
  same factors to its hidden norm, weight and bias groups (times its width
  factors, 1 at fixed width). The Adam learning rate :math:`\eta L^{-1/2}`
  of depth-muP is Yang et al.'s rule restated by Dey et al. as the
  :math:`e = 1/2` member of this family; the eps factor is CompleteP's
  (their Eq. 40, per the nanoGPT-mup code comment).

  Args:
    num_layers: layers ``L`` of the network (Transformer layers, each an
      attention and an MLP sublayer).
    base_depth: the base depth :math:`L_0` (`BASE_DEPTH` = 24 in
      DepthBench).
    exponent: :math:`e > 0`.

  Returns:
    ``(lr_scale, eps_scale)``: the Python floats :math:`m^{e-1}` and
    :math:`m^{-e}`.

  Raises:
    ValueError: for non-positive depths or exponent.

  Examples:
    >>> residual.depth_adam_scales(96, 24, 0.5)  # depth-muP at 4x the base
    (0.5, 0.5)
    >>> residual.depth_adam_scales(96, 24, 1.0)  # CompleteP: lr unchanged
    (1.0, 0.25)
    >>> residual.depth_adam_scales(24, 24, 0.5)  # base depth: plain Adam
    (1.0, 1.0)

  References:
    Yang et al., *Tensor Programs VI: Feature Learning in Infinite-Depth
    Neural Networks*, arXiv:2310.02244 (2023); Dey et al., *Don't be lazy:
    CompleteP enables compute-efficient deep transformers*,
    arXiv:2505.01618 (2025); Wang et al., *DepthBench: Measuring How
    Residual Connections Enable More Computational Depth*, arXiv:2609.32534
    (2026).
  """
  who = "depth_adam_scales"
  _checks.check_positive_int(who, "num_layers", num_layers)
  _checks.check_positive_int(who, "base_depth", base_depth)
  if not (
    isinstance(exponent, (int, float))
    and not isinstance(exponent, bool)
    and exponent > 0
  ):
    raise ValueError(
      f"{who}: exponent must be a positive float, got {exponent=}"
    )
  m, e = num_layers / base_depth, float(exponent)
  return m ** (e - 1.0), m**-e


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
