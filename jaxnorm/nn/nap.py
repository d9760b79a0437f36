"""NaP's network side: a norm before every nonlinearity, and its mask.

Normalize-and-Project (Lyle et al., *Normalization and effective learning
rates in reinforcement learning*, arXiv:2407.01800, 2024) has two halves.
The optimizer half is `jaxnorm.optim.nap_project` (and the schedule pieces of
`jaxnorm.optim.nap_recipe`); this module is the placement it prescribes:
every hidden pre-activation is normalized (LayerNorm by default, RMSNorm was
also studied), the bias before a mean-subtracting norm is removed as
redundant, and the final readout keeps its bias and no norm. `nap_mask`
selects the hidden kernels, the matrices the projection may rescale because
a norm follows them; the readout is not scale-invariant and stays out
(the spec's correction). Sources are secondary (the paper body could not be
read, see the spec, norms section 12): UNVERIFIED beyond them.

Examples:
  >>> mlp = NaPMLP((4, 8, 2), norm="rmsnorm", rngs=nnx.Rngs(0))
  >>> type(mlp.norms[0]).__name__, mlp.hidden[0].bias is None
  ('RMSNorm', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm.nn import activations as nn_activations
from jaxnorm.nn import layers
from jaxnorm.nn import norms as nn_norms


class NaPMLP(nnx.Module):
  """MLP with ``Dense (no bias) -> norm -> activation`` hidden layers.

  Args:
    sizes: ``(in, hidden_1, ..., hidden_k, out)``.
    norm: a `jaxnorm.nn.NORMS` name applied to every hidden pre-activation
      (``"layernorm"`` removes the bias before it, as the paper does; any
      registered norm is accepted).
    activation: an elementwise name of `jaxnorm.nn.activations.ACTIVATIONS`.
    dtype: compute dtype of the dense layers.
    rngs: parameter RNG streams.

  Raises:
    ValueError: fewer than two sizes, or a gated/learnable activation.

  Examples:
    >>> mlp = NaPMLP((4, 8, 8, 2), rngs=nnx.Rngs(0))
    >>> [d.bias is None for d in mlp.hidden], mlp.readout.bias is None
    ([True, True], False)
    >>> [type(n).__name__ for n in mlp.norms]
    ['LayerNorm', 'LayerNorm']
    >>> mlp(jnp.ones((3, 4), jnp.float32)).shape
    (3, 2)
  """

  def __init__(
    self,
    sizes: Sequence[int],
    *,
    norm: str = "layernorm",
    activation: str = "relu",
    dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "NaPMLP"
    if len(sizes) < 2:
      raise ValueError(f"{who}: sizes needs (in, ..., out), got {sizes=}")
    for i, s in enumerate(sizes):
      _checks.check_positive_int(who, f"sizes[{i}]", s)
    _checks.check_choice(
      who, "activation", activation, sorted(nn_activations.ACTIVATIONS)
    )
    spec = nn_activations.ACTIVATIONS[activation]
    if not spec.elementwise:
      valid = sorted(
        n for n, s in nn_activations.ACTIVATIONS.items() if s.elementwise
      )
      raise ValueError(
        f"{who}: activation must be elementwise, got {activation!r}; "
        f"choose one of {', '.join(valid)}"
      )
    self.act = spec.fn
    pairs = list(zip(sizes[:-2], sizes[1:-1]))
    self.hidden = nnx.List(
      [
        layers.Dense(
          a, b, names=(None, "mlp"), use_bias=False, dtype=dtype, rngs=rngs
        )
        for a, b in pairs
      ]
    )
    self.norms = nnx.List(
      [nn_norms.make_norm(norm, b, rngs=rngs) for _, b in pairs]
    )
    self.readout = layers.Dense(
      sizes[-2], sizes[-1], names=("mlp", None), dtype=dtype, rngs=rngs
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """``(..., in) -> (..., out)``."""
    for dense, norm in zip(self.hidden, self.norms):
      x = self.act(norm(dense(x)))
    return self.readout(x)


def nap_mask(model: NaPMLP) -> nnx.State:
  """True for the hidden kernels of ``model``, the leaves NaP projects.

  Shaped like ``nnx.state(model, nnx.Param)`` (pure), so it is a valid
  ``mask`` of `jaxnorm.optim.nap_project`.

  Examples:
    >>> mask = nap_mask(NaPMLP((4, 8, 2), rngs=nnx.Rngs(0)))
    >>> mask["hidden"][0]["kernel"], mask["readout"]["kernel"]
    (True, False)
    >>> mask["norms"][0]["scale"]
    False
  """
  params = nnx.as_pure(nnx.state(model, nnx.Param))
  mask = jax.tree.map(lambda _: False, params)
  for i in range(len(model.hidden)):
    mask["hidden"][i]["kernel"] = True
  return mask
