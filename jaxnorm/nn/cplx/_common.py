"""What the complex attention cores share: head checks, real pairs."""

from __future__ import annotations

import jax

from jaxnorm import cplx
from jaxnorm.nn.attention import _base


def even_head(who: str, dims: _base.HeadDims) -> None:
  """Raises `ValueError` unless the head dim splits into ``[Re | Im]``."""
  if dims.head_dim % 2:
    raise ValueError(
      f"{who}: the head dim must be even (split halves [Re | Im] per head), "
      f"got head_dim={dims.head_dim}"
    )


def heads(core: _base.AttentionCore, fn, q, k, v) -> jax.Array:
  """``fn(q, k, v)`` on complex heads, or on ``to_complex`` of real pairs."""
  if not core.real_pairs:
    return fn(q, k, v)
  q, k, v = (cplx.to_complex(a) for a in (q, k, v))
  return cplx.to_real(fn(q, k, v))
