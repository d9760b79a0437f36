"""What the complex attention cores share: head checks, real pairs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

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


class FunctionCore(_base.AttentionCore):
  """A parameter-free complex core that forwards to its pure ``function``.

  Complex heads ``(B, T, N, H)``, or with ``real_pairs=True`` real heads
  ``(B, T, N, 2h)`` read as complex split halves ``[Re | Im]`` (see
  `heads`). ``options`` are keyword options of ``function``, checked at
  construction; the subclass's ``__call__`` passes the data arguments.
  """

  dtype_kind: ClassVar[str] = "complex"
  function: ClassVar[Callable[..., jax.Array]]

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    real_pairs: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del param_dtype, rngs
    who = type(self).__name__
    if real_pairs:
      even_head(who, dims)
    self.is_causal, self.real_pairs = is_causal, real_pairs
    self.options = _base.check_options(who, type(self).function, options)
