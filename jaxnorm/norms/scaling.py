"""LayerNorm Scaling (Curse of Depth): a constant per-layer factor."""

from __future__ import annotations

import math

from jaxnorm import _scope


@_scope.scoped
def layer_norm_scaling(layer_index: int) -> float:
  r"""LayerNorm Scaling factor :math:`1/\sqrt{\ell}` for a 0-based layer.

  The Curse of Depth paper multiplies both pre-norm outputs of block
  :math:`\ell = \mathrm{layer\_index} + 1` by this constant (not learned,
  after the norm's own gain); the final norm is not scaled. Combine it with
  plain (not depth-scaled) initialization.

  Args:
    layer_index: 0-based index of the block.

  Returns:
    ``1 / sqrt(layer_index + 1)``.

  Raises:
    ValueError: for a negative or non-integer ``layer_index``.

  Examples:
    >>> print(norms.layer_norm_scaling(0), norms.layer_norm_scaling(3))
    1.0 0.5

  References:
    Sun et al., *The Curse of Depth in Large Language Models*,
    arXiv:2502.05795 (2025).
  """
  if (
    isinstance(layer_index, bool)
    or not isinstance(layer_index, int)
    or (layer_index < 0)
  ):
    raise ValueError(
      "layer_norm_scaling: layer_index must be a non-negative "
      f"integer (0-based), got {layer_index=}"
    )
  return 1.0 / math.sqrt(layer_index + 1)
