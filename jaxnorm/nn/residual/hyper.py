"""Hyper-Connections: the HC step, and the multi-stream network of steps.

`StreamStack` runs the steps of every multi-stream scheme (HC here; mHC,
oHC and iHC in `jaxnorm.nn.residual.manifold`).

Examples:
  >>> from jaxnorm.residual import expand_streams
  >>> expand_streams(jnp.ones((2, 8), jnp.float32), 4).shape  # (..., n, d)
  (2, 4, 8)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param, layers
from jaxnorm.nn.residual._common import (
  Branch,
  NormSpec,
  Placement,
  StepBuilder,
  Sublayer,
  build_norm,
  check_blocks,
  check_input,
  check_state,
  params_key,
  stack_steps,
  then,
)


class HyperConnection(nnx.Module):
  """One Hyper-Connection around sublayer ``layer_index``.

  ``layer_index`` is the 0-based sublayer index ``k`` (a Python integer, or
  an integer scalar array under ``nnx.vmap``); it only selects the stream
  the branch reads at initialization.

  Parameters (paper init, equivalent to Pre-Norm): ``static_alpha``
  ``(n, n+1)`` = ``[e_{k mod n} | I]``, ``static_beta`` ``(n,)`` = 1 and, when
  ``dynamic``, ``dynamic_alpha`` ``(d, n+1)`` = 0, ``dynamic_beta`` ``(d,)`` =
  0, ``alpha_scale`` = ``beta_scale`` = 0.01 and the coefficient norm gain
  ``norm_scale`` ``(d,)`` = 0. The branch keeps its own pre-norm ``norm``.
  Maths in `jaxnorm.residual.hc_maps` and `jaxnorm.residual.hyper_connection`.

  Examples:
    >>> hc = HyperConnection(4, layer_index=1, num_streams=2, rngs=nnx.Rngs(0))
    >>> hc.static_alpha[...].tolist()  # [e_{k mod n} | I], k = 1
    [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    >>> h = jnp.ones((3, 2, 4), jnp.float32)  # (..., n, d) stream state
    >>> hc(h, jnp.tanh).shape
    (3, 2, 4)
  """

  def __init__(
    self,
    num_features: int,
    *,
    layer_index: residual.IndexLike,
    num_streams: int = 4,
    dynamic: bool = True,
    tanh: bool = True,
    scale_init: float = 0.01,
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "HyperConnection"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_streams", num_streams)
    key = params_key(rngs)
    d, n = num_features, num_streams
    self.num_features, self.num_streams = d, n
    self.dynamic, self.tanh = dynamic, tanh
    alpha, beta = residual.hc_static_init(n, layer_index, dtype=param_dtype)
    self.static_alpha = _param.param(alpha, ("streams", None))
    self.static_beta = _param.param(beta, ("streams",))
    if dynamic:
      self.dynamic_alpha = _param.param(
        jnp.zeros((d, n + 1), param_dtype), ("embed", None)
      )
      self.dynamic_beta = _param.param(jnp.zeros((d,), param_dtype), ("embed",))
      self.alpha_scale = _param.param(jnp.full((), scale_init, param_dtype), ())
      self.beta_scale = _param.param(jnp.full((), scale_init, param_dtype), ())
      self.norm_scale = _param.param(jnp.zeros((d,), param_dtype), ("norm",))
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def maps(self, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(h_pre, h_post, h_res)`` for stream state ``h`` ``(..., n, d)``."""
    kw = {}
    if self.dynamic:
      kw = dict(
        dynamic_alpha=self.dynamic_alpha[...],
        dynamic_beta=self.dynamic_beta[...],
        alpha_scale=self.alpha_scale[...],
        beta_scale=self.beta_scale[...],
        norm_scale=self.norm_scale[...],
      )
    return residual.hc_maps(
      h,
      static_alpha=self.static_alpha[...],
      static_beta=self.static_beta[...],
      tanh=self.tanh,
      **kw,
    )

  def __call__(self, h: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Updates the stream state ``h`` ``(..., n, d)`` around ``sublayer``."""
    check_state(type(self).__name__, h, self.num_streams, self.num_features)
    h_pre, h_post, h_res = self.maps(h)
    return residual.hyper_connection(
      h, then(self.norm, sublayer), h_pre=h_pre, h_post=h_post, h_res=h_res
    )


def make_hc_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> HyperConnection:
  """HC's step at ``place``: its initial read is stream ``k mod n``."""
  return HyperConnection(
    num_features, layer_index=place.sublayer, rngs=rngs, **options
  )


class StreamStack(nnx.Module):
  """Multi-stream network (HC, mHC, oHC, iHC).

  Expands the input into ``num_streams`` identical streams, applies one
  stream step per sublayer and reads the streams out (``"sum"``, as in HC,
  or ``"mean"``). See `jaxnorm.residual.expand_streams` and
  `jaxnorm.residual.reduce_streams`.

  ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs every sublayer under
  that `jax.checkpoint` policy, the parameters unchanged.

  Examples:
    >>> steps = [HyperConnection(4, layer_index=k, num_streams=2,
    ...                          rngs=nnx.Rngs(k)) for k in range(2)]
    >>> net = StreamStack([jnp.tanh] * 2, steps, num_features=4, num_streams=2)
    >>> net(jnp.ones((3, 4), jnp.float32)).shape  # (..., d) in and out
    (3, 4)
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    num_streams: int,
    readout: residual.Readout = "sum",
    remat: layers.RematName = "none",
  ):
    who = "StreamStack"
    layers.check_remat(who, remat)
    blocks = check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    _checks.check_choice(who, "readout", readout, residual.READOUTS)
    self.num_features, self.num_streams = num_features, num_streams
    self.readout, self.remat = readout, remat
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
      h = step(h, Branch(block, self.remat))
      if return_hidden:
        hidden.append(residual.reduce_streams(h, readout=self.readout))
    out = residual.reduce_streams(h, readout=self.readout)
    return (out, jnp.stack(hidden)) if return_hidden else out


def make_stream_stack(
  blocks: list[Sublayer],
  step: StepBuilder,
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int,
  readout: residual.Readout,
  remat: layers.RematName = "none",
  **options: Any,
) -> StreamStack:
  """A `StreamStack` of the steps ``step`` makes (HC, mHC, oHC, iHC)."""
  steps = stack_steps(
    step,
    num_features,
    len(blocks),
    sublayers_per_layer=sublayers_per_layer,
    rngs=rngs,
    **options,
  )
  return StreamStack(
    blocks,
    steps,
    num_features=num_features,
    num_streams=options["num_streams"],
    readout=readout,
    remat=remat,
  )
