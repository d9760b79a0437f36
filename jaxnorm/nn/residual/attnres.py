"""Attention Residuals modules: per-sublayer pseudo-queries and the stack.

With the stack builders of the Full and Block AttnRes specs (AttnRes has no
per-sublayer step: one module attends over depth).

Examples:
  >>> net = AttnResStack([jnp.tanh] * 2, num_features=4, rngs=nnx.Rngs(0))
  >>> net(jnp.ones((3, 4), jnp.float32)).shape
  (3, 4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param, layers
from jaxnorm.nn.residual._common import (
  Branch,
  NormSpec,
  StepBuilder,
  Sublayer,
  build_norm,
  check_blocks,
  check_input,
  params_key,
  then,
)


class AttnResQuery(nnx.Module):
  """Pseudo-query ``query`` (init 0) and key RMSNorm gain ``key_scale``.

  One per sublayer (and one for the readout); ``self(sources)`` is
  `jaxnorm.residual.attn_res`.

  Examples:
    >>> query = AttnResQuery(4)
    >>> query.query[...].tolist(), query.key_scale.shape  # zero query
    ([0.0, 0.0, 0.0, 0.0], (4,))
    >>> x = jnp.ones((3, 4), jnp.float32)
    >>> query(jnp.stack([0 * x, x]))[0].tolist()  # (m, ..., d): uniform mean
    [0.5, 0.5, 0.5, 0.5]
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    param_dtype: Any = jnp.float32,
  ):
    _checks.check_positive_int("AttnResQuery", "num_features", num_features)
    self.num_features, self.eps = num_features, eps
    self.query = _param.param(
      jnp.zeros((num_features,), param_dtype), ("embed",)
    )
    self.key_scale = _param.param(
      jnp.ones((num_features,), param_dtype), ("norm",)
    )

  def __call__(
    self, sources: jax.Array, mask: jax.Array | None = None
  ) -> jax.Array:
    """Aggregates ``sources`` ``(m, ..., d)`` (``mask``: which exist)."""
    return residual.attn_res(
      sources,
      self.query[...],
      key_scale=self.key_scale[...],
      eps=self.eps,
      mask=mask,
    )


class AttnResStack(nnx.Module):
  """Attention Residuals network (Full, or Block with ``block_size``).

  Sublayer ``l`` reads ``h_l = attn_res(sources, w_l)`` and adds its output
  ``f_l(norm_l(h_l))`` as a new source. Full AttnRes (``block_size=1``): the
  sources are the embedding and every earlier sublayer output. Block AttnRes:
  the embedding, the completed block sums and the current partial block sum,
  a new block starting every ``block_size`` sublayers (checked before the
  block's first sublayer runs, after its input is formed, as in the official
  pseudo-code). ``readout="attnres"`` aggregates all final sources with one
  more query; ``"sum"`` adds them (the plain residual stream). ``remat``
  (`jaxnorm.nn.layers.REMAT_CHOICES`) runs every sublayer under that
  `jax.checkpoint` policy, the parameters unchanged.

  Unverified: the paper states the ``attnres`` readout for Block AttnRes
  only; Full AttnRes uses the same by default.

  Examples:
    >>> net = AttnResStack([jnp.tanh] * 4, num_features=4, block_size=2,
    ...                    rngs=nnx.Rngs(0))  # Block AttnRes, 2 blocks
    >>> len(net.queries), net.readout_query is not None
    (4, True)
    >>> y, h = net(jnp.ones((3, 4), jnp.float32), return_hidden=True)
    >>> y.shape, h.shape  # h: every sublayer's input h_l
    ((3, 4), (4, 3, 4))
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    *,
    num_features: int,
    block_size: int = 1,
    readout: Literal["attnres", "sum"] = "attnres",
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    eps: float = 1e-6,
    param_dtype: Any = jnp.float32,
    remat: layers.RematName = "none",
    rngs: nnx.Rngs,
  ):
    who = "AttnResStack"
    layers.check_remat(who, remat)
    blocks = check_blocks(who, blocks)
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "block_size", block_size)
    _checks.check_choice(who, "readout", readout, ("attnres", "sum"))
    self.num_features, self.block_size = num_features, block_size
    self.readout, self.remat = readout, remat
    self.blocks = nnx.List(blocks)
    self.queries = nnx.List(
      [
        AttnResQuery(num_features, eps=eps, param_dtype=param_dtype)
        for _ in blocks
      ]
    )
    key = params_key(rngs)
    self.norms = nnx.List(
      [
        build_norm(norm, num_features, norm_kwargs, key, k)
        for k in range(len(blocks))
      ]
    )
    self.readout_query = (
      AttnResQuery(num_features, eps=eps, param_dtype=param_dtype)
      if readout == "attnres"
      else None
    )

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns every sublayer's input ``h_l``
    stacked to ``(num_sublayers, ..., d)``.
    """
    check_input("AttnResStack", x, self.num_features)
    # Slot 0 holds the embedding, slot j >= 1 the (partial) sum of block j;
    # sublayer k reads the non-empty slots 0..ceil(k / block_size), the
    # others masked out. One buffer of fixed shape keeps the traced graph
    # linear in depth and every sublayer's ops of one shape.
    size = self.block_size
    num_slots = -(-len(self.blocks) // size) + 1
    slots = jnp.zeros((num_slots, *x.shape), x.dtype).at[0].set(x)
    slot = jnp.arange(num_slots)
    hidden = []
    for k, (block, query, norm) in enumerate(
      zip(self.blocks, self.queries, self.norms)
    ):
      h = query(slots, slot <= -(-k // size))
      hidden.append(h)
      y = then(norm, Branch(block, self.remat))(h)
      slots = slots.at[k // size + 1].add(y.astype(x.dtype))
    if self.readout_query is not None:
      out = self.readout_query(slots)
    else:
      out = jnp.sum(slots.astype(jnp.float32), axis=0).astype(x.dtype)
    return (out, jnp.stack(hidden)) if return_hidden else out


def make_attnres_stack(
  blocks: list[Sublayer],
  step: StepBuilder | None,
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int,
  **options: Any,
) -> AttnResStack:
  """Full AttnRes: one source per sublayer (``block_size=1``).

  ``step`` (None: AttnRes has no step modules) and
  ``sublayers_per_layer`` are unused: the sources are sublayers, not
  layers.
  """
  del step, sublayers_per_layer
  return AttnResStack(blocks, num_features=num_features, rngs=rngs, **options)


def make_block_attnres_stack(
  blocks: list[Sublayer],
  step: StepBuilder | None,
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int,
  num_blocks: int,
  **options: Any,
) -> AttnResStack:
  """Block AttnRes: ``num_blocks`` blocks, which must divide the sublayers."""
  del step, sublayers_per_layer
  who = "make_residual"
  _checks.check_positive_int(who, "num_blocks", num_blocks)
  _checks.check_divisible(
    who, "len(blocks)", len(blocks), "num_blocks", num_blocks
  )
  return AttnResStack(
    blocks,
    num_features=num_features,
    block_size=len(blocks) // num_blocks,
    rngs=rngs,
    **options,
  )
