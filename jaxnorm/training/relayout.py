"""A train state moved between the unrolled and the scanned layer layouts.

A run may resume with another ``--scan-layers`` than the one its checkpoint
was saved with. The checkpoint is then restored into an abstract target of
the saved layout (the current state's target converted), and the restored
state is converted back to the current layout. Both directions use
`jaxnorm.nn.models.stack_layers` / `unstack_layers`, which move array
leaves (a restored state) and `jax.ShapeDtypeStruct` leaves (a restore
target) alike.

Every part of the state that mirrors the model moves: the parameters, the
`jaxnorm.nn.BackwardStat` and other model state, the EMA copy, and each
optimizer-state tree with the parameters' paths and shapes (Adam's
moments, momentum). An optimizer-state tree of another shape (Conda's
projection bases, NaP's targets) has no per-layer meaning that stacking
keeps, so such a resume is refused.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from jaxnorm.nn import models

_MODEL_PARTS = ("params", "backward", "ema")


def _paths(tree: nnx.State) -> dict[tuple, tuple[int, ...]]:
  return {
    tuple(p): tuple(getattr(v, "shape", ())) for p, v in nnx.to_flat_state(tree)
  }


def convert(
  state: dict[str, Any], model_config: Any, *, scanned: bool
) -> dict[str, Any]:
  """``state`` (a `jaxnorm.training.trainer.init_state` dict) in a layout.

  Args:
    state: the train state in the other layout: arrays, or
      `jax.ShapeDtypeStruct` leaves with shardings (a restore target).
    model_config: the model's config (`LMConfig` / `ViTConfig`): its depth
      and parts decide both layouts.
    scanned: convert to the scanned layout (``True``) or to the unrolled
      one (``False``).

  Returns:
    The state in the requested layout. Stacked leaves of a target get a
    replicated leading axis; the caller places arrays as its run needs.

  Raises:
    ValueError: an optimizer-state tree that does not mirror the
      parameters (its leaves have no layer to stack), or the conversion's
      own errors (a state of another model).
  """

  def move(tree: nnx.State, constants: bool = False) -> nnx.State:
    if scanned:
      return models.stack_layers(tree, model_config, constants=constants)
    return models.unstack_layers(tree, model_config)

  params = _paths(state["params"])

  def move_optimizer(tree: Any) -> Any:
    if not isinstance(tree, nnx.State):
      return tree
    if _paths(tree) != params:
      raise ValueError(
        "relayout: the optimizer state holds a tree that is not laid out "
        "as the parameters (e.g. projection bases or targets), which "
        "cannot move between unrolled and scanned layers; resume with the "
        "--scan-layers the checkpoint was saved with"
      )
    return move(tree)

  out = dict(state)
  for part in _MODEL_PARTS:
    if part in state:
      out[part] = move(state[part])
  out["rest"] = move(state["rest"], constants=True)
  out["opt_state"] = jax.tree.map(
    move_optimizer,
    state["opt_state"],
    is_leaf=lambda x: isinstance(x, nnx.State),
  )
  return out
