"""Backward-pass state shared by the PowerNorm and Unified Norm modules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.nn.norms._common import Names, param


class BackwardStat(nnx.Variable):
  """State that a custom backward pass updates (PowerNorm, UN).

  The pure functions return the increment of such state as its cotangent.
  Differentiate with respect to it as well, e.g. ``nnx.grad(loss,
  argnums=nnx.DiffState(0, BACKWARD_DIFF))``, keep it out of the optimizer,
  and add it with `apply_backward_updates`. Plain ``nnx.grad`` (parameters
  only) leaves it unchanged.

  Examples:
    >>> from jaxnorm.nn import PowerNorm
    >>> norm = PowerNorm(2, rngs=nnx.Rngs(0))
    >>> list(nnx.state(norm, BackwardStat)), norm.grad_ema[...].dtype
    (['grad_ema'], dtype('float32'))
  """


BACKWARD_DIFF = nnx.Any(nnx.Param, BackwardStat)


def apply_backward_updates(module: nnx.Module, grads: nnx.State) -> None:
  """Adds the `BackwardStat` increments found in ``grads`` to ``module``.

  Args:
    module: the model that was differentiated.
    grads: gradients taken with respect to (at least) its `BackwardStat`
      variables, e.g. with ``nnx.DiffState(0, BACKWARD_DIFF)``.

  Examples:
    >>> from jaxnorm.nn import PowerNorm
    >>> norm, x = PowerNorm(2, rngs=nnx.Rngs(0)), jnp.array([[1.0, -2.0]])
    >>> diff = nnx.DiffState(0, BACKWARD_DIFF)  # parameters and BackwardStat
    >>> grads = nnx.grad(lambda m: jnp.sum(m(x) * x), argnums=diff)(norm)
    >>> apply_backward_updates(norm, grads)  # adds the grad_ema increment
    >>> bool(jnp.all(norm.grad_ema[...] != 0))
    True
  """
  increments = nnx.split_state(grads, BackwardStat, ...)[0]
  current = nnx.state(module, BackwardStat)
  nnx.update(
    module,
    jax.tree.map(lambda v, d: v + d.astype(v.dtype), current, increments),
  )


def counter(names: Names) -> nnx.BatchStat:
  """An int32 step counter (`nnx.BatchStat`), replicated under a mesh."""
  return param(
    jnp.zeros((), jnp.int32), None if names is None else (), nnx.BatchStat
  )
