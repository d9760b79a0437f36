"""DepthBench's depth-aware residuals: DeepNorm, KEEL, depth-muP, CompleteP.

The DeepNorm and KEEL steps, DeepNorm's branch initialization gain, and the
builders their specs carry (depth-muP and CompleteP build the scaled
residual step of `jaxnorm.nn.residual.wiring` with a depth rule).

Examples:
  >>> from jaxnorm.residual import deepnorm_alpha, deepnorm_beta
  >>> round(deepnorm_alpha(6), 4), round(deepnorm_beta(6), 4)  # 6 layers
  (1.8612, 0.3799)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn.residual._common import (
  NormSpec,
  Placement,
  StepBuilder,
  Sublayer,
  build_norm,
  check_input,
  params_key,
)
from jaxnorm.nn.residual.wiring import (
  PreNormResidual,
  ResidualStack,
  ScaledResidual,
  make_residual_stack,
)

QUERY_KEY: tuple[str, ...] = ("q_kernel", "k_kernel")
"""Parameter names that `scale_branch_init` leaves alone: the query and key
projections of `jaxnorm.nn.attention.MultiHeadAttention` (DeepNet keeps
their gain at 1)."""


class ScaledPostNormResidual(nnx.Module):
  """Scaled post-norm step ``norm(alpha * x + f(norm_in(x)))``.

  See `jaxnorm.residual.scaled_post_norm`. DeepNorm: ``pre_norm=False``,
  ``alpha = jaxnorm.residual.deepnorm_alpha(L)``; KEEL: ``pre_norm=True``,
  ``alpha = jaxnorm.residual.keel_alpha(L)`` (1 in the first layer's MLP).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxnorm.residual import deepnorm_alpha
    >>> step = ScaledPostNormResidual(2, alpha=deepnorm_alpha(6),
    ...                               rngs=nnx.Rngs(0))
    >>> round(step.alpha, 4)  # (2 L)^(1/4), L = 6
    1.8612
    >>> x = jnp.array([[1.0, 3.0]], jnp.float32)
    >>> [round(v, 4) for v in step(x, lambda h: h)[0].tolist()]  # LayerNorm
    [-1.0, 1.0]
  """

  def __init__(
    self,
    num_features: int,
    *,
    alpha: float,
    pre_norm: bool = False,
    norm: str = "layernorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    who = "ScaledPostNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    if not (isinstance(alpha, (int, float)) and alpha > 0):
      raise ValueError(f"{who}: alpha must be a positive float, got {alpha=}")
    key = params_key(rngs)
    self.num_features, self.alpha = num_features, float(alpha)
    self.norm = build_norm(norm, num_features, norm_kwargs, key, 0)
    self.norm_in = (
      build_norm(norm, num_features, norm_kwargs, key, 1) if pre_norm else None
    )

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_post_norm(
      x, sublayer, self.norm, alpha=self.alpha, norm_in=self.norm_in
    )


def keel_step(
  num_features: int,
  *,
  sublayer: int,
  sublayers_per_layer: int,
  num_layers: int,
  norm: NormSpec = "rmsnorm",
  norm_kwargs: Mapping | None = None,
  rngs: nnx.Rngs,
) -> nnx.Module:
  """KEEL's step of ``sublayer`` (0-based over the whole stack).

  Layer 0 follows DepthBench's ``KeelTransformerBlock``: its first sublayer
  (attention) is the pre-norm step ``x + f(norm(x))``, the others are
  ``norm_out(x + f(norm_in(x)))`` (alpha 1); every later sublayer is
  ``norm_out(2L x + f(norm_in(x)))``.

  Every norm of the step (input, output, layer 0's pre-norm) is ``norm``:
  DepthBench builds all of KEEL's norms from its base model's norm config
  (``layer_norm.build``), which for its Llama-style models is RMSNorm
  (OLMo-core ``TransformerConfig.llama_like``: ``LayerNormType.rms``, no
  bias, eps = the config's ``rms_norm_eps``, 1e-6), the norm the model's
  other layers and its final norm use. The default is therefore
  ``"rmsnorm"`` (jaxnorm's: eps 1e-6, unit gain, no bias); the models of
  `jaxnorm.nn.models` pass their own ``norm``, as DepthBench does.

  Args:
    num_features: hidden size ``d``.
    sublayer: 0-based index of the sublayer over the whole stack.
    sublayers_per_layer: sublayers of each layer (2: attention, MLP).
    num_layers: layers ``L`` of the stack.
    norm: every norm of the step (default ``"rmsnorm"``, DepthBench's).
    norm_kwargs: options of every norm.
    rngs: parameter RNG streams (one ``params`` key).

  Returns:
    A `PreNormResidual` (layer 0's attention) or a `ScaledPostNormResidual`.

  Examples:
    >>> kw = dict(sublayers_per_layer=2, num_layers=3, rngs=nnx.Rngs(0))
    >>> [type(keel_step(4, sublayer=k, **kw)).__name__ for k in (0, 1)]
    ['PreNormResidual', 'ScaledPostNormResidual']
    >>> [keel_step(4, sublayer=k, **kw).alpha for k in (1, 2)]  # 1, then 2 L
    [1.0, 6.0]
    >>> type(keel_step(4, sublayer=1, **kw).norm).__name__  # DepthBench's
    'RMSNorm'
  """
  if sublayer == 0:
    return PreNormResidual(
      num_features, norm=norm, norm_kwargs=norm_kwargs, rngs=rngs
    )
  first_layer = sublayer < sublayers_per_layer
  alpha = 1.0 if first_layer else residual.keel_alpha(num_layers)
  return ScaledPostNormResidual(
    num_features,
    alpha=alpha,
    pre_norm=True,
    norm=norm,
    norm_kwargs=norm_kwargs,
    rngs=rngs,
  )


def scale_branch_init(blocks: Sequence[Sublayer], gain: float) -> None:
  """Multiplies the sublayers' weight matrices by ``gain``, in place.

  DeepNet's init: every parameter with two or more dimensions of every
  `nnx.Module` sublayer (attention value and output projections, MLP
  matrices) is scaled, except the query and key projections named in
  `QUERY_KEY`; vectors (biases, norm scales) are left alone. Plain
  functions have nothing to scale.

  Deviation: DeepNet draws Xavier-normal weights with gain ``beta``;
  DepthBench scales its truncated-normal std by ``beta``; this scales
  whatever init the sublayers drew (same factor on the standard
  deviation). A fused ``qkv`` matrix is scaled whole.

  Args:
    blocks: the sublayers.
    gain: the factor, e.g. `jaxnorm.residual.deepnorm_beta`.

  Examples:
    >>> from jaxnorm.nn.attention import MultiHeadAttention
    >>> mha = MultiHeadAttention(4, 2, rngs=nnx.Rngs(0))
    >>> q, v = mha.q_kernel[...], mha.v_kernel[...]
    >>> scale_branch_init([mha, jax.nn.gelu], 0.5)  # functions: nothing
    >>> bool((mha.q_kernel[...] == q).all())  # QUERY_KEY: left alone
    True
    >>> bool((mha.v_kernel[...] == 0.5 * v).all())
    True
  """
  for block in blocks:
    if not isinstance(block, nnx.Module):
      continue
    for path, param in nnx.iter_graph(block):
      if (
        isinstance(param, nnx.Param)
        and param.ndim >= 2
        and str(path[-1]) not in QUERY_KEY
      ):
        param[...] = param[...] * jax.numpy.asarray(gain, param.dtype)


# ---------------------------------------------------------------------------
# Builders of the specs: ``step(num_features, place, *, rngs, **options)``.


def make_deepnorm_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> ScaledPostNormResidual:
  """DeepNorm's step: ``alpha`` of the whole stack's depth."""
  alpha = residual.deepnorm_alpha(place.num_layers)
  return ScaledPostNormResidual(num_features, alpha=alpha, rngs=rngs, **options)


def make_keel_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> nnx.Module:
  """`keel_step` at ``place`` (its first layer is wired differently).

  Without a ``norm`` option the norms are RMSNorm, DepthBench's.
  """
  return keel_step(
    num_features,
    sublayer=place.sublayer,
    sublayers_per_layer=place.sublayers_per_layer,
    num_layers=place.num_layers,
    rngs=rngs,
    **options,
  )


def make_depth_scaled_step(
  num_features: int,
  place: Placement,
  *,
  exponent: float,
  base_depth: int,
  rngs: nnx.Rngs,
  **options: Any,
) -> ScaledResidual:
  """Depth-muP's or CompleteP's step: ``(L / base_depth)^(-exponent)``.

  ``L`` is ``place.num_layers`` (Transformer layers); the spec's default
  ``base_depth`` is DepthBench's 24 (`jaxnorm.residual.BASE_DEPTH`).
  """
  scale = residual.depth_scale(place.num_layers, base_depth, exponent)
  return ScaledResidual(
    num_features,
    num_residuals=place.num_sublayers,
    scale=scale,
    rngs=rngs,
    **options,
  )


def make_deepnorm_stack(
  blocks: list[Sublayer],
  step: StepBuilder,
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int,
  init_gain: bool,
  **options: Any,
) -> ResidualStack:
  """DeepNorm's stack; ``init_gain`` first scales the branches by beta."""
  if init_gain:
    num_layers = residual.num_layers_of(len(blocks), sublayers_per_layer)
    scale_branch_init(blocks, residual.deepnorm_beta(num_layers))
  return make_residual_stack(
    blocks,
    step,
    num_features=num_features,
    rngs=rngs,
    sublayers_per_layer=sublayers_per_layer,
    **options,
  )
