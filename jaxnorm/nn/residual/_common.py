"""Shared types, RNG, norm and input-check helpers of the residual modules.

Also the placement of a step in its stack (`Placement`) and the loops that
make a stack's or a layer's steps with a scheme's step builder (the ``step``
of its `jaxnorm.nn.registry.ResidualSpec`).

Examples:
  >>> p = Placement(layer=1, sublayer=3, num_sublayers=5, sublayers_per_layer=2)
  >>> p.num_layers  # the last layer is partial
  3
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import layers
from jaxnorm.nn import norms as nn_norms

Sublayer = Callable[[jax.Array], jax.Array]
NormSpec = str | None


class Placement(NamedTuple):
  """Where a residual step sits: what a scheme's depth rules read.

  Attributes:
    layer: 0-based layer (a Python integer, or an integer scalar array when
      the layers are created under ``nnx.vmap`` for ``nnx.scan``).
    sublayer: 0-based sublayer over the whole stack (same types).
    num_sublayers: sublayers of the whole stack.
    sublayers_per_layer: consecutive sublayers that form one layer.
  """

  layer: residual.IndexLike
  sublayer: residual.IndexLike
  num_sublayers: int
  sublayers_per_layer: int

  @property
  def num_layers(self) -> int:
    """Layers of the whole stack (the last one may be partial)."""
    return residual.num_layers_of(self.num_sublayers, self.sublayers_per_layer)


StepBuilder = Callable[..., nnx.Module]
"""``step(num_features, place, *, rngs, **options)``: the step module of the
sublayer at `Placement` ``place`` (a scheme's ``ResidualSpec.step``)."""


class LayerIndex(nnx.Variable):
  """A constant 0-based layer index held as state (never trained).

  A step module built with a traced index (under ``nnx.vmap``, to stack the
  layers of an ``nnx.scan``) keeps it here, so each scanned layer reads its
  own index; a Python integer index stays a static attribute.

  Examples:
    >>> from jaxnorm.nn.residual import PreNormResidual
    >>> step = PreNormResidual(4, layer_index=jnp.asarray(2), rngs=nnx.Rngs(0))
    >>> type(step.layer_index).__name__, int(step.layer_index[...])
    ('LayerIndex', 2)
    >>> PreNormResidual(4, layer_index=2, rngs=nnx.Rngs(0)).layer_index
    2
  """


def store_index(layer_index: residual.IndexLike | None) -> Any:
  if isinstance(layer_index, (jax.Array, np.ndarray)):
    return LayerIndex(jnp.asarray(layer_index))
  return None if layer_index is None else int(layer_index)


def read_index(layer_index: Any) -> residual.IndexLike | None:
  if isinstance(layer_index, LayerIndex):
    return layer_index[...]
  return layer_index


def params_key(rngs: nnx.Rngs) -> jax.Array:
  """The one ``params`` key a residual module draws, whatever its options.

  Norms, random initializers and options of a module all derive their keys
  from it (``fold_in``), so swapping the norm or an option never shifts the
  keys that later modules draw from ``rngs``.
  """
  return rngs.params()


def build_norm(
  norm: NormSpec,
  num_features: int,
  norm_kwargs: Mapping | None,
  key: jax.Array,
  slot: int = 0,
) -> nnx.Module | None:
  if norm is None:
    return None
  rngs = nnx.Rngs(params=jax.random.fold_in(key, slot))
  return nn_norms.make_norm(
    norm, num_features, rngs=rngs, **dict(norm_kwargs or {})
  )


def then(norm: nnx.Module | None, sublayer: Sublayer) -> Sublayer:
  """The branch with its own pre-norm: ``f(norm(x))``."""
  if norm is None:
    return sublayer
  return lambda x: sublayer(norm(x))


def _apply(fn: Sublayer, x: jax.Array) -> jax.Array:
  return fn(x)


class Branch:
  """A sublayer handed to a step module as a plain callable.

  ``nnx.tabulate`` records the arguments of every module call and cannot
  render a Module passed as one, so the stacks hand each step this wrapper
  (shown as the sublayer's class name) instead of the sublayer module.

  ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs the sublayer under
  that `jax.checkpoint` policy at call time: the sublayer's parameters keep
  their paths, so a stack's state is the same whatever its ``remat``.
  """

  __slots__ = ("fn", "remat")

  def __init__(self, fn: Sublayer, remat: layers.RematName = "none"):
    self.fn, self.remat = fn, remat

  def __call__(self, x: jax.Array) -> jax.Array:
    if self.remat == "none":
      return self.fn(x)
    if isinstance(self.fn, nnx.Module):  # Its state goes through checkpoint.
      return layers.rematerialize(_apply, self.remat)(self.fn, x)
    return layers.rematerialize(self.fn, self.remat)(x)

  def __repr__(self) -> str:
    return type(self.fn).__name__


def check_input(who: str, x: jax.Array, num_features: int) -> None:
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  if x.shape[-1] != num_features:
    raise ValueError(
      f"{who}: x must have num_features={num_features} "
      f"features in its last axis, got {x.shape=}"
    )


def check_state(
  who: str, h: jax.Array, num_streams: int, num_features: int
) -> None:
  _checks.check_ndim(who, "h", h, minimum=2)
  if tuple(h.shape[-2:]) != (num_streams, num_features):
    raise ValueError(
      f"{who}: h must end in (num_streams, num_features)=({num_streams}, "
      f"{num_features}), got {h.shape=}; expand the input with "
      "jaxnorm.residual.expand_streams(x, num_streams)"
    )


def check_blocks(who: str, blocks: Sequence[Sublayer]) -> list[Sublayer]:
  blocks = list(blocks)
  if not blocks:
    raise ValueError(
      f"{who}: blocks must hold at least one sublayer, got an empty sequence"
    )
  for i, b in enumerate(blocks):
    if not callable(b):
      raise ValueError(
        f"{who}: every block must be callable (..., d) -> "
        f"(..., d), got blocks[{i}] of type {type(b).__name__}"
      )
  return blocks


def layer_steps(
  step: StepBuilder,
  num_features: int,
  places: Sequence[Placement],
  *,
  rngs: nnx.Rngs,
  shared: bool = False,
  **options: Any,
) -> list[nnx.Module]:
  """The step modules of one layer, one per placement in ``places``.

  With ``shared=True`` (ReZero's official placement, or SkipInit on
  request: the schemes whose spec is ``shareable``) one module, built at
  the first placement, serves every sublayer of the layer.
  """
  if shared:
    return [step(num_features, places[0], rngs=rngs, **options)] * len(places)
  return [step(num_features, p, rngs=rngs, **options) for p in places]


def stack_steps(
  step: StepBuilder,
  num_features: int,
  num_sublayers: int,
  *,
  sublayers_per_layer: int,
  rngs: nnx.Rngs,
  **options: Any,
) -> list[nnx.Module]:
  """Steps of every sublayer, grouped ``sublayers_per_layer`` to a layer."""
  per_layer = sublayers_per_layer
  _checks.check_positive_int("make_residual", "sublayers_per_layer", per_layer)
  steps = []
  for layer, first in enumerate(range(0, num_sublayers, per_layer)):
    places = [
      Placement(layer, k, num_sublayers, per_layer)
      for k in range(first, min(first + per_layer, num_sublayers))
    ]
    steps += layer_steps(step, num_features, places, rngs=rngs, **options)
  return steps
