"""Pre-norm stacks with the fused residual-add + norm path."""

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxnorm import _dispatch
from jaxnorm.nn import layers
from jaxnorm.nn import residual as nn_residual
from tests import helpers

D = 32  # Mosaic GPU interpret mode needs a multiple of 32.


def stack(norm, fused=None, **kwargs):
  blocks = [
    layers.MLP(D, 32, activation="gelu", dtype=jnp.float32, rngs=nnx.Rngs(k))
    for k in range(4)
  ]
  extra = {} if fused is None else {"fused_implementation": fused}
  return nn_residual.make_residual(
    "prenorm",
    blocks,
    num_features=D,
    norm=norm,
    rngs=nnx.Rngs(0),
    **extra,
    **kwargs,
  )


def loss_and_grads(net, x):
  return nnx.value_and_grad(lambda m: jnp.sum(jnp.tanh(m(x))))(net)


@pytest.fixture
def interpreted_kernels(monkeypatch):
  """Runs the Pallas kernels in interpret mode on CPU."""
  real = _dispatch._kernel
  monkeypatch.setattr(
    _dispatch,
    "_kernel",
    lambda name: functools.partial(real(name), interpret=True),
  )


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_fused_reference_equals_unfused(key, norm):
  x = jax.random.normal(key, (2, 5, D))
  ref, fused = stack(norm), stack(norm, "xla")
  y, hidden = fused(x, return_hidden=True)
  y_ref, hidden_ref = ref(x, return_hidden=True)
  helpers.assert_close(y, y_ref, atol=1e-6)
  helpers.assert_close(hidden, hidden_ref, atol=1e-6)
  (l1, g1), (l2, g2) = loss_and_grads(fused, x), loss_and_grads(ref, x)
  helpers.assert_close(l1, l2, atol=1e-5)
  helpers.assert_close(nnx.state(g1), nnx.state(g2), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_fused_pallas_kernel_equals_unfused(key, norm, interpreted_kernels):
  x = jax.random.normal(key, (2, 5, D))
  ref, fused = stack(norm), stack(norm, "pallas")
  helpers.assert_close(fused(x), ref(x), atol=2e-5)
  (l1, g1), (l2, g2) = loss_and_grads(fused, x), loss_and_grads(ref, x)
  helpers.assert_close(l1, l2, atol=1e-4)
  helpers.assert_close(nnx.state(g1), nnx.state(g2), atol=1e-4)


def test_pallas_on_cpu_without_interpreter_is_refused(key):
  with pytest.raises(
    NotImplementedError, match=r"rms_norm\(implementation='pallas'\)"
  ):
    stack("rmsnorm", "pallas")(jax.random.normal(key, (2, 5, D)))


def test_unsupported_configurations():
  with pytest.raises(
    ValueError,
    match=r"fused_implementation applies to "
    r"'prenorm' only, got 'postnorm'",
  ):
    nn_residual.make_residual(
      "postnorm",
      [lambda h: h],
      num_features=D,
      rngs=nnx.Rngs(0),
      fused_implementation="xla",
    )
  with pytest.raises(
    NotImplementedError,
    match=r"fused needs pre-norm steps whose norm has a fused add_and_norm "
    r".*steps\[0\] is PreNormResidual with norm DyT",
  ):
    nn_residual.ResidualStack(
      [jnp.tanh],
      [nn_residual.PreNormResidual(D, norm="dyt", rngs=nnx.Rngs(0))],
      num_features=D,
      fused=True,
    )
  with pytest.raises(
    ValueError,
    match=r"fused_implementation must be one "
    r"of 'xla', 'pallas'; got 'cuda'",
  ):
    stack("rmsnorm", "cuda")
  with pytest.raises(
    ValueError,
    match=r"fused_implementation='xla' conflicts with norm_kwargs "
    r"implementation='pallas'",
  ):
    stack("rmsnorm", "xla", norm_kwargs={"implementation": "pallas"})


def test_fused_stack_uses_the_norms_add_and_norm(key):
  # The fused path calls each norm's add_and_norm (duck-typed), so any norm
  # module with that method fuses; count the calls.
  net = stack("rmsnorm", "xla")
  assert all(s.norm.implementation == "xla" for s in net.steps)
  calls = []
  for step in net.steps:
    real = step.norm.add_and_norm
    object.__setattr__(
      step.norm,
      "add_and_norm",
      lambda b, h, real=real: calls.append(1) or real(b, h),
    )
  net(jax.random.normal(key, (2, 5, D)))
  assert len(calls) == len(net.steps) - 1
