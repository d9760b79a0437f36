"""Cost estimates of the row kernels, counted from their traced bodies.

`pl.CostEstimate` is what XLA's cost analysis counts for a Pallas call
(``compiled.cost_analysis()``); both row lowerings (`pallas_kernels._rows`
for Triton and Mosaic TPU, `pallas_kernels.mosaic_gpu_rows` for Mosaic GPU)
trace their `RowBody` on one float32 block and count it here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl

# What `body_cost` counts: one flop per result element of these primitives,
# one per operand element of the reductions, one transcendental per result
# element of the last set; layout ops, casts and comparisons are free.
_FLOPS = frozenset(
  ("add", "sub", "mul", "div", "max", "min", "neg", "abs", "square")
  + ("integer_pow",)
)
_REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min"))
_TRANSCENDENTALS = frozenset(
  ("exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt")
  + ("rsqrt", "cbrt", "pow", "sin", "cos", "tan", "erf", "erf_inv", "atan2")
)


def _count(jaxpr: Any) -> tuple[int, int]:
  """``(flops, transcendentals)`` of a jaxpr and the jaxprs it calls."""
  flops = transcendentals = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    out = sum(math.prod(v.aval.shape) for v in eqn.outvars)
    if name in _TRANSCENDENTALS:
      transcendentals += out
    elif name in _REDUCTIONS:
      flops += math.prod(eqn.invars[0].aval.shape)
    elif name in _FLOPS:
      flops += out
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        f, t = _count(inner)
        flops, transcendentals = flops + f, transcendentals + t
  return flops, transcendentals


def body_cost(
  jaxpr: Any,
  num_blocks: int,
  block_elems: int,
  num_partials: int,
  operands: Sequence[Any],
  results: Sequence[Any],
) -> pl.CostEstimate:
  """The cost estimate of a row kernel (both row lowerings use it).

  Args:
    jaxpr: the `pallas_kernels._rows.RowBody` traced on one float32 block
      (`jax.make_jaxpr`), with the row operations of its lowering.
    num_blocks: grid size.
    block_elems: elements of one block (``block_rows * width``).
    num_partials: partial sums the kernel reduces over each block's rows.
    operands: the kernel's input arrays (anything with shape and dtype).
    results: its output shapes (`jax.ShapeDtypeStruct`s).

  Returns:
    ``flops``: the body's count (`_count`) plus one add per element and
    partial sum, per block, times ``num_blocks``; ``transcendentals``: the
    body's count times ``num_blocks`` (an rsqrt per row for RMSNorm and
    LayerNorm, a tanh per element for DyT); ``bytes_accessed``: every
    operand read once and every result written once.
  """
  flops, transcendentals = _count(jaxpr.jaxpr)
  nbytes = sum(
    math.prod(a.shape) * jnp.dtype(a.dtype).itemsize
    for a in (*operands, *results)
  )
  return pl.CostEstimate(
    flops=num_blocks * (flops + num_partials * block_elems),
    transcendentals=num_blocks * transcendentals,
    bytes_accessed=nbytes,
  )
