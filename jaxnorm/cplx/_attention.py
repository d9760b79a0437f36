"""What the complex attention functions share: layouts and input checks.

Layouts follow `jaxnorm.attention`: ``query (B, T, N, H)`` (or unbatched
``(T, N, H)``), ``key``/``value`` ``(B, S, K, H)`` with ``N % K == 0``
(grouped-query), boolean ``mask`` broadcastable to ``(B, N, T, S)`` (True
attends), ``is_causal`` lets query ``i`` see keys ``j <= i``. Born
(`jaxnorm.cplx.born`), PCT (`jaxnorm.cplx.pct`) and complex softmax
(`jaxnorm.cplx.softmax`) attention take complex q, k, v (``H`` complex
dims); ComplexFormer (`jaxnorm.cplx.complexformer`)
takes real q, k, v whose head dim is split into halves ``[Re | Im]``.
Statistics in float32 / complex64 (64-bit inputs stay 64-bit); outputs in
the query's dtype. Pallas has no complex support: there is no kernel.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxnorm.attention import _core
from jaxnorm.cplx import _common


def prepare(who, query, key, value, bias, mask):
  """`jaxnorm.attention._core.prepare` for complex q, k, v."""
  arrays = [("query", query), ("key", key)]
  if value is not None:
    arrays.append(("value", value))
  for name, a in arrays:
    _common.check_complex(who, name, a)
  # Shapes only: the real layout checks of the real attention functions.
  shapes = [
    None if a is None else np.broadcast_to(np.float32(0), jnp.shape(a))
    for a in (query, key, value)
  ]
  d = _core.check_qkv(who, *shapes)
  bias = _core.check_logits_arg(who, "bias", bias, d)
  mask = _core.check_logits_arg(who, "mask", mask, d)
  if mask is not None and mask.dtype != jnp.bool_:
    raise TypeError(
      f"{who}: mask must be boolean (True attends), got {mask.dtype=}"
    )
  if bias is not None:
    _common.check_real(who, "bias", bias)
  arrays = [jnp.asarray(a) for a in (query, key)]
  arrays.append(None if value is None else jnp.asarray(value))
  if d.unbatched:
    arrays = [None if a is None else a[None] for a in arrays]
  return d, *arrays, bias, mask
