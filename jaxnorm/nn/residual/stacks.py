"""Networks of residual steps: one stream (`ResidualStack`) or several."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn.residual._common import (
  Branch,
  Sublayer,
  check_blocks,
  check_input,
)
from jaxnorm.nn.residual.steps import PreNormResidual


class ResidualStack(nnx.Module):
  """Single-stream network: ``x = steps[k](x, blocks[k])`` for every k.

  ``steps`` are residual-step modules (`PreNormResidual`, ...), one per
  sublayer (one module may serve several sublayers, e.g. ReZero's gate
  shared by a layer's attention and MLP).

  ``fused=True`` (pre-norm steps without LayerNorm Scaling whose norms have
  an ``add_and_norm`` method, e.g. `RMSNorm`, `LayerNorm`) runs each
  residual add together with the next step's norm, ``(h, y) =
  norm.add_and_norm(f(y_prev), h)`` (one kernel pass when the norm's
  ``implementation`` is ``"pallas"``); the recurrence is
  `jaxnorm.residual.fused_pre_norm`. The result equals the unfused stack.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    fused: bool = False,
  ):
    who = "ResidualStack"
    blocks = check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    for k, step in enumerate(steps if fused else ()):
      if not (
        isinstance(step, PreNormResidual)
        and step.layer_index is None
        and hasattr(step.norm, "add_and_norm")
      ):
        raise NotImplementedError(
          f"{who}: fused needs pre-norm steps whose norm has a fused "
          f"add_and_norm (RMSNorm, LayerNorm) and no LayerNorm Scaling; "
          f"steps[{k}] is {type(step).__name__} with norm "
          f"{type(getattr(step, 'norm', None)).__name__}"
        )
    self.num_features, self.fused = num_features, fused
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns the hidden state after every
    sublayer, stacked to ``(num_sublayers, ..., d)``.
    """
    check_input("ResidualStack", x, self.num_features)
    if self.fused:
      return residual.fused_pre_norm(
        x,
        [Branch(block) for block in self.blocks],
        self.steps[0].norm,
        [step.norm.add_and_norm for step in self.steps[1:]],
        return_hidden=return_hidden,
      )
    hidden = []
    for block, step in zip(self.blocks, self.steps):
      x = step(x, Branch(block))
      hidden.append(x)
    return (x, jnp.stack(hidden)) if return_hidden else x


class StreamStack(nnx.Module):
  """Multi-stream network (HC, mHC, oHC, iHC).

  Expands the input into ``num_streams`` identical streams, applies one
  stream step per sublayer and reads the streams out (``"sum"``, as in HC,
  or ``"mean"``). See `jaxnorm.residual.expand_streams` and
  `jaxnorm.residual.reduce_streams`.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    num_streams: int,
    readout: residual.Readout = "sum",
  ):
    who = "StreamStack"
    blocks = check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    _checks.check_choice(who, "readout", readout, residual.READOUTS)
    self.num_features, self.num_streams = num_features, num_streams
    self.readout = readout
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``; see `ResidualStack`.

    Hidden states are the read-out streams after every sublayer.
    """
    check_input("StreamStack", x, self.num_features)
    h = residual.expand_streams(x, self.num_streams)
    hidden = []
    for block, step in zip(self.blocks, self.steps):
      h = step(h, Branch(block))
      if return_hidden:
        hidden.append(residual.reduce_streams(h, readout=self.readout))
    out = residual.reduce_streams(h, readout=self.readout)
    return (out, jnp.stack(hidden)) if return_hidden else out
