"""Registry-driven tests: every entry of `jaxnorm.nn.NORMS`, in every layout
its spec declares, is built by `make_norm` and checked for what its spec
claims (causality, batch statistics, state) and for degenerate inputs. A
norm added to the registry is covered here without editing this file."""

import inspect
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm.nn import registry
from jaxnorm.nn.norms._common import RunningAverage
from tests import helpers

D = 8
SHAPES = {"tokens": (2, 5, D), "images": (2, 3, 3, D), "graphs": (2, 5, D)}
CASES = [
  (name, layout)
  for name, spec in sorted(jnn.NORMS.items())
  for layout in sorted(spec.layouts)
]
IDS = [f"{n}-{layout}" for n, layout in CASES]
# Graphs are ``(batch, nodes, d)`` like tokens: the same computation.
FAST_CASES = [(n, layout) for n, layout in CASES if layout != "graphs"]
FAST_IDS = [f"{n}-{layout}" for n, layout in FAST_CASES]


def _build(name, layout, **kwargs):
  return jnn.make_norm(name, D, rngs=nnx.Rngs(0), layout=layout, **kwargs)


def _input(name, layout, key, *, offset=0.0, dtype=jnp.float32):
  x = (jax.random.normal(key, SHAPES[layout]) + offset).astype(dtype)
  return helpers.as_dtype_kind(x, jnn.NORMS[name].dtype_kind)


def _loss(module, x, cotangent):
  """A random linear read-out: bounded cotangents, as a real loss has."""
  y = helpers.real_readout(module(x))
  return jnp.sum(y.astype(jnp.float32) * cotangent)


_value_and_grads = nnx.value_and_grad(_loss, argnums=(0, 1))


def test_literal_equals_registry():
  assert set(typing.get_args(jnn.norms.NormName)) == set(jnn.NORMS)
  assert len(typing.get_args(jnn.norms.NormName)) == len(jnn.NORMS)


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_spec_fields(name):
  spec = jnn.NORMS[name]
  assert isinstance(spec, registry.NormSpec)
  assert issubclass(spec.module, nnx.Module)
  assert spec.layouts and spec.layouts <= set(registry.LAYOUTS)
  assert spec.paper
  if spec.backward_state:
    assert spec.batch_stats
  module = _build(name, None)
  source = inspect.getsource(spec.module)
  assert all(f"self.{name} = " in source for name in spec.decay)
  has_backward = bool(jax.tree.leaves(nnx.state(module, jnn.BackwardStat)))
  assert spec.backward_state == has_backward
  assert spec.kernel == hasattr(module, "implementation")


def test_group_defaults():
  assert jnn.NORMS["groupnorm"].defaults(48) == {"num_groups": 16}
  assert jnn.NORMS["groupnorm"].defaults(64, "tokens") == {
    "num_groups": 32,
    "reduction_axes": -1,
  }
  # A group of one channel has variance 0: two per group on sequences.
  assert jnn.NORMS["evonorms0"].defaults(8, "tokens")["num_groups"] == 4
  assert jnn.NORMS["evonorms0"].defaults(8)["num_groups"] == 8
  assert jnn.NORMS["timestepdecaynorm"].defaults(64) == {"num_groups": 32}
  assert jnn.NORMS["timestepdecaynorm"].defaults(96) == {"num_groups": 32}
  module = jnn.make_norm("groupnorm", 48, rngs=nnx.Rngs(0), num_groups=4)
  assert module.num_groups == 4 and module.reduction_axes is None


def test_layout_errors():
  with pytest.raises(
    ValueError, match=r"make_norm: layout must be one of .*'tokens'"
  ):
    jnn.make_norm("rmsnorm", D, rngs=nnx.Rngs(0), layout="video")
  with pytest.raises(
    ValueError,
    match=r"make_norm: norm 'instancenorm' does not support layout 'tokens' "
    r"\(it supports images\); norms for 'tokens' are batchnorm, ",
  ):
    jnn.make_norm("instancenorm", D, rngs=nnx.Rngs(0), layout="tokens")


@nnx.jit
def _degenerate(module, x, small, cotangent):
  """The float32 degenerate cases of one norm in one compiled function.

  ``x`` has example 0 all zero and the others around 1e4; ``small`` is ``x``
  centred. Training mode (the module as built): loss, values and gradients.
  Eval mode (``nnx.view``) on ``small``: a NaN in the last position of
  example 1, and the last token changed (causality).
  """
  loss, (grads, dx) = _value_and_grads(module, x, cotangent)
  view = nnx.view(module, use_running_average=True, raise_if_not_found=False)
  return {
    "train": (loss, module(x), grads, dx),
    "nan": view(small.at[(1,) + (-1,) * (x.ndim - 2)].set(jnp.nan)),
    "eval": view(small),
    "eval_last_changed": view(small.at[:, -1].add(3.0)),
  }


@pytest.fixture(scope="module", params=FAST_CASES, ids=FAST_IDS)
def degenerate(request):
  name, layout = request.param
  module = _build(name, layout)
  key = jax.random.key(0)
  x = _input(name, layout, key, offset=1e4).at[0].set(0.0)
  cotangent = jax.random.normal(jax.random.fold_in(key, 1), x.shape)
  # Centred once, outside the program: XLA would recompute a mean of values
  # around 1e4 in each consumer fusion, in another order, and the causality
  # check compares two of them.
  small = jnp.asarray(np.asarray(x) - np.asarray(x).mean(), x.dtype)
  return name, layout, _degenerate(module, x, small, cotangent)


def test_zero_rows_and_1e4(degenerate):
  """An all-zero example and values around 1e4: finite outputs and finite
  gradients for the input and every parameter."""
  _, _, out = degenerate
  loss, y, grads, dx = out["train"]
  assert np.isfinite(float(loss))
  assert helpers.all_finite(y) and helpers.all_finite(dx)
  assert helpers.all_finite(nnx.state(grads))


@nnx.jit
def _half_precision(module, x, cotangent):
  """bf16 and fp16 at 1e4, each beside float32 on the same rounded values:
  ``(y, parameter gradients, input gradient)`` per dtype."""
  out = {}
  for dtype in (jnp.bfloat16, jnp.float16):
    xd = x.astype(dtype)
    pair = []
    for xi in (xd, xd.astype(jnp.float32)):
      _, (grads, dx) = _value_and_grads(module, xi, cotangent)
      pair.append((module(xi), nnx.state(grads), dx))
    out[dtype.__name__] = pair
  return out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layout"), FAST_CASES, ids=FAST_IDS)
def test_half_precision_at_1e4(name, layout):
  """bf16/fp16 inputs around 1e4: input gradients keep the dtype; every
  value and gradient is finite wherever the float32 computation on the
  same rounded values is representable in that dtype
  (fp16 overflows at 65504: fp16 rounds 1e4 + N(0, 1) to multiples of 8,
  so a row may have no spread left and its exact gradient is ~1/eps)."""
  if jnn.NORMS[name].dtype_kind == "complex":
    pytest.skip("no complex half-precision dtype")
  module = _build(name, layout)
  key = jax.random.key(0)
  x = _input(name, layout, key, offset=1e4)
  cotangent = jax.random.normal(jax.random.fold_in(key, 1), x.shape)
  for dtype, (half, ref) in _half_precision(module, x, cotangent).items():
    # float32 parameters: flax's rule gives a float32 output.
    assert half[0].dtype == jnp.float32 and half[2].dtype == jnp.dtype(dtype)
    limit = float(jnp.finfo(dtype).max) / 2
    for got, want in zip(jax.tree.leaves(half), jax.tree.leaves(ref)):
      representable = np.abs(np.asarray(want, np.float64)) < limit
      assert np.isfinite(np.asarray(got, np.float64))[representable].all()


def test_nan_stays_in_its_example(degenerate):
  """In eval mode a NaN in example 1 leaves example 0 finite; on sequences
  a causal norm also keeps the NaN example's earlier tokens finite."""
  name, layout, out = degenerate
  spec = jnn.NORMS[name]
  y = out["nan"]
  if spec.batch_stats and not issubclass(spec.module, RunningAverage):
    # Region norms and UnMix-TNS take batch statistics in every call, so a
    # NaN may reach every example: the method's behaviour.
    return
  assert helpers.all_finite(y[0])
  if layout == "tokens" and spec.causal:
    assert helpers.all_finite(y[1, :-1])


def test_causal_flag_is_honest(degenerate):
  """Eval mode on sequences: a causal norm's outputs before the last token
  ignore it; a norm flagged non-causal does mix positions."""
  name, layout, out = degenerate
  if layout != "tokens":
    pytest.skip("causality is a property of sequences")
  y0, y1 = out["eval"], out["eval_last_changed"]
  same = np.allclose(y0[:, :-1], y1[:, :-1], atol=1e-6)
  assert same == jnn.NORMS[name].causal


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_scalar_input_is_a_named_error(name):
  """A wrong-rank input raises a ValueError naming the function or module."""
  layout = sorted(jnn.NORMS[name].layouts)[0]
  module = _build(name, layout)
  with pytest.raises(ValueError, match=r"^\w+: .*(rank|ndim|scalar)"):
    module(helpers.as_dtype_kind(jnp.float32(1.0), jnn.NORMS[name].dtype_kind))


@pytest.mark.parametrize(("name", "layout"), FAST_CASES, ids=FAST_IDS)
def test_empty_batch(name, layout):
  """A batch of zero examples: an empty output, and in training mode the
  running statistics stay finite (or a clear error names the function)."""
  module = _build(name, layout)
  x = helpers.as_dtype_kind(
    jnp.zeros((0, *SHAPES[layout][1:])), jnn.NORMS[name].dtype_kind
  )
  try:
    y = module(x)
  except ValueError as e:
    assert re.search(r"^\w+: .*(\(0,|=0\b)", str(e)), str(e)
    return
  assert y.shape == x.shape
  assert helpers.all_finite(nnx.state(module))


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_jitted_train_step_keeps_state(key, name):
  """Two jitted SGD steps with the backward-state update: the state tree
  keeps its structure and dtypes; batch and backward statistics move."""
  spec = jnn.NORMS[name]
  layout = min(spec.layouts)
  module = _build(name, layout)
  x = _input(name, layout, key, dtype=jnp.bfloat16)
  cotangent = jax.random.normal(key, x.shape)
  before = jax.tree.map(lambda a: a, nnx.state(module))
  kinds = (nnx.Param, nnx.BatchStat, jnn.BackwardStat)
  before_by_kind = {
    kind: jax.tree.leaves(nnx.state(module, kind)) for kind in kinds
  }

  @nnx.jit
  def step(module, x):
    diff = nnx.DiffState(0, jnn.BACKWARD_DIFF)
    grads = nnx.grad(_loss, argnums=diff)(module, x, cotangent)
    params = nnx.state(module, nnx.Param)
    new = jax.tree.map(
      lambda p, g: p - 0.1 * g, params, nnx.state(grads, nnx.Param)
    )
    nnx.update(module, new)
    jnn.apply_backward_updates(module, grads)

  step(module, x)
  step(module, x)
  after = nnx.state(module)
  assert jax.tree.structure(before) == jax.tree.structure(after)
  for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    assert b.dtype == a.dtype and b.shape == a.shape

  def moved(kind):
    pairs = zip(before_by_kind[kind], jax.tree.leaves(nnx.state(module, kind)))
    return any(not np.array_equal(b, a) for b, a in pairs)

  assert moved(nnx.Param)
  assert moved(jnn.BackwardStat) == spec.backward_state
  if before_by_kind[nnx.BatchStat]:
    assert moved(nnx.BatchStat)
