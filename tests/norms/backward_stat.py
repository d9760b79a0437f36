"""The module train step of the norms with `jaxnorm.nn.BackwardStat` state.

Shared by `test_powernorm` and `test_unified`: jitted steps through the
module, differentiated with `jaxnorm.nn.BACKWARD_DIFF` and followed by
`jaxnorm.nn.apply_backward_updates`, equal the pure function's new state plus
the VJP increments of its backward statistics.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm import nn as jnn
from tests import helpers
from tests.norms import common


def check_train_steps(key, name, fn, fields, **kwargs):
  """Three module steps of ``make_norm(name, 4)`` against ``fn`` and its VJP.

  Args:
    key: PRNG key of the inputs and cotangents.
    name: the registry name (``"powernorm"``, ``"unifiednorm"``).
    fn: its pure function (`jaxnorm.norms.power_norm`, ...).
    fields: the state fields the backward pass updates.
    **kwargs: the module's keyword arguments; all but ``window_size`` are
      the function's too.
  """
  module = jnn.make_norm(name, 4, rngs=nnx.Rngs(0), **kwargs)
  state = module.state_tuple()
  fn_kwargs = {k: v for k, v in kwargs.items() if k != "window_size"}
  for k in jax.random.split(key, 3):
    kx, kg = jax.random.split(k)
    x = common.normal(kx, (3, 2, 4), scale=2.0)
    gy = common.normal(kg, (3, 2, 4))

    @nnx.jit
    def step(m, x, gy):
      loss = lambda m: jnp.sum(m(x) * gy)
      return nnx.grad(loss, argnums=nnx.DiffState(0, jnn.BACKWARD_DIFF))(m)

    grads = step(module, x, gy)
    jnn.apply_backward_updates(module, grads)

    def f(x, *stats):
      return fn(
        x,
        jnp.ones(4),
        jnp.zeros(4),
        state._replace(**dict(zip(fields, stats))),
        training=True,
        **fn_kwargs,
      )

    _, vjp, new = jax.vjp(
      f, x, *(getattr(state, n) for n in fields), has_aux=True
    )
    increments = vjp(gy)[1:]
    state = new._replace(
      **{n: getattr(new, n) + d for n, d in zip(fields, increments)}
    )
    helpers.assert_close(module.state_tuple(), state, atol=1e-6)
    assert isinstance(module.grad_ema, jnn.BackwardStat)
  assert int(module.count[...]) == 3
  # Plain nnx.grad (parameters only) leaves the backward statistics alone.
  before = module.grad_ema[...]
  nnx.grad(lambda m: jnp.sum(m(x) * gy))(module)
  np.testing.assert_array_equal(module.grad_ema[...], before)
