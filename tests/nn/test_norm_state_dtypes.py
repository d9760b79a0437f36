"""Running statistics are float32 and carry no gradient, in every norm.

Registry-driven over the names of `jaxnorm.nn.NORMS` whose spec has
``batch_stats`` (ComplexBatchNorm among them): with ``param_dtype=bfloat16``
every floating non-parameter variable (`nnx.BatchStat`, `BackwardStat`) is
float32 (complex64 for complex statistics) after init and after a
training-mode call, as flax keeps its ``batch_stats`` (a bfloat16 average
with momentum 0.99 loses every update smaller than its last bit); the
update keeps every state dtype; and the updated statistics are a
`jax.lax.stop_gradient` of the input.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from tests import helpers

D = 8
SHAPES = {"tokens": (4, 5, D), "images": (4, 3, 3, D)}
BATCH_STATS = sorted(n for n, s in jnn.NORMS.items() if s.batch_stats)
# Statistics of one call, kept nowhere (RN-B and RN-L normalize each batch
# with its own region statistics).
NO_STATE = {"regionnormb", "regionnorml"}
STATEFUL = [n for n in BATCH_STATS if n not in NO_STATE]


def _build(name, **kwargs):
  return jnn.make_norm(name, D, rngs=nnx.Rngs(0), **kwargs)


def _input(name, key, dtype=jnp.float32):
  layout = min(jnn.NORMS[name].layouts)
  x = 1 + 2 * jax.random.normal(key, SHAPES[layout])
  x = helpers.as_dtype_kind(x, jnn.NORMS[name].dtype_kind)
  return x if jnp.iscomplexobj(x) else x.astype(dtype)


def _stats(module):
  """``{path: value}`` of the module's non-parameter variables."""
  state = nnx.state(module, nnx.Not(nnx.Param))
  return {
    "/".join(map(str, path)): var.get_value()
    for path, var in nnx.to_flat_state(state)
  }


def _floating(stats):
  return {
    k: v for k, v in stats.items() if jnp.issubdtype(v.dtype, jnp.inexact)
  }


@nnx.jit
def _train_step(module, x):
  return module(x)


def test_stateful_names_are_the_batch_statistics_norms():
  assert {"batchnorm", "complexbatchnorm", "powernorm"} <= set(STATEFUL)
  for name in BATCH_STATS:
    assert bool(_stats(_build(name))) == (name not in NO_STATE), name


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("name", STATEFUL)
def test_statistics_are_float32(key, name, x_dtype):
  module = _build(name, param_dtype=jnp.bfloat16)
  params = jax.tree.leaves(nnx.state(module, nnx.Param))
  assert params and all(
    p.dtype in (jnp.bfloat16, jnp.complex64) for p in params
  )
  before = _stats(module)
  assert _floating(before)
  for path, v in _floating(before).items():
    assert v.dtype in (jnp.float32, jnp.complex64), (path, v.dtype)
  _train_step(module, _input(name, key, x_dtype))
  after = _stats(module)
  assert {k: v.dtype for k, v in after.items()} == {
    k: v.dtype for k, v in before.items()
  }
  moved = [k for k in before if not np.array_equal(before[k], after[k])]
  assert moved, "a training-mode call updates the running statistics"


@pytest.mark.parametrize("name", STATEFUL)
def test_updated_statistics_stop_the_gradient(key, name):
  """No gradient reaches the input through the updated statistics."""
  x = _input(name, key)

  def stats_only(x):
    module = _build(name)
    module(x)
    total = jnp.zeros((), jnp.float32)
    for v in _floating(_stats(module)).values():
      total = total + jnp.sum(jnp.real(v)) + jnp.sum(jnp.imag(v))
    return total

  grad = jax.grad(stats_only)(x)
  assert grad.shape == x.shape
  np.testing.assert_array_equal(grad, np.zeros_like(grad))


@pytest.mark.parametrize(
  "name", [n for n in STATEFUL if jnn.NORMS[n].backward_state]
)
def test_backward_statistics_stay_float32(key, name):
  """The backward-pass increments of bfloat16 parameters keep float32."""
  module = _build(name, param_dtype=jnp.bfloat16)
  x = _input(name, key, jnp.bfloat16)
  cotangent = jax.random.normal(jax.random.fold_in(key, 1), x.shape)

  def loss(m):
    with jax.numpy_dtype_promotion("standard"):
      return jnp.sum(m(x) * cotangent)

  grads = nnx.grad(loss, argnums=nnx.DiffState(0, jnn.BACKWARD_DIFF))(module)
  before = jax.tree.leaves(nnx.state(module, jnn.BackwardStat))
  jnn.apply_backward_updates(module, grads)
  after = jax.tree.leaves(nnx.state(module, jnn.BackwardStat))
  assert [v.dtype for v in after] == [jnp.float32] * len(before)
  assert any(not np.array_equal(a, b) for a, b in zip(after, before))
