"""The keys every norm module draws, complex norms included.

Outside `jaxnorm.nn.norms` so that the complex norms of `jaxnorm.nn.cplx`,
which the norm registry lists, follow the convention without importing the
norm package (which imports them).
"""

from __future__ import annotations

import jax
from flax import nnx

NUM_KEYS = 2
"""Keys every norm module draws from ``rngs.params``, whatever its options.

Two is the count of flax's ``nnx.LayerNorm``, ``BatchNorm``, ``GroupNorm``
and ``InstanceNorm`` in their default form (one for ``scale``, one for
``bias``), so swapping one norm for another, or for those flax norms, leaves
the initialization of every later layer unchanged. Deviation: flax's
``nnx.RMSNorm`` draws one key, jaxnorm's `RMSNorm` two.
"""


def draw_keys(rngs: nnx.Rngs) -> tuple[jax.Array, jax.Array]:
  """The module's `NUM_KEYS` keys ``(scale_key, bias_key)``, drawn in order.

  Every norm module calls this once in ``__init__``, even when its
  initializers are constant; a module that needs more randomness splits
  these keys.
  """
  return rngs.params(), rngs.params()
