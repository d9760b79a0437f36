"""Every public pure function runs under ``jax.named_scope(<its name>)``.

Profiles and HLO dumps then name each op after the paper's function that
emitted it (`jaxnorm._scope`). The functions are collected from the
packages' ``__all__`` (tests/fuzz/_property.py), so a new one is covered
without an edit here; its arguments come from its fuzz builder.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import _scope
from tests.fuzz import _builders, _cases, _property

_ALL = _property.all_public_functions()


@pytest.mark.parametrize("name", sorted(_ALL))
def test_public_function_is_scoped(name):
  fn = _ALL[name]
  assert getattr(fn, _scope.SCOPE_ATTR, None) == fn.__name__, (
    f"{name} lacks @_scope.scoped"
  )
  # functools.wraps keeps what docs/make_api.py and jax.jit read.
  assert inspect.signature(fn) == inspect.signature(inspect.unwrap(fn))
  assert fn.__doc__ == inspect.unwrap(fn).__doc__


@pytest.mark.parametrize("name", sorted(set(_ALL) & set(_builders.BUILDERS)))
def test_every_op_carries_the_scope(name):
  fn = _ALL[name]
  spec = _builders.BUILDERS[name]
  draw = _property.default_draw(spec)
  case = spec.build(draw, _cases.Fill(draw, "normal"))
  if case.then is not None:
    pytest.skip("a factory: its ops run when the returned function is called")
  call, arrays = _property.traced(fn, case)

  def arrays_out(*xs):
    leaves = jax.tree.leaves(call(*xs))
    return [leaf for leaf in leaves if isinstance(leaf, jax.Array)]

  eqns = jax.make_jaxpr(arrays_out)(*arrays).jaxpr.eqns
  if arrays:
    assert eqns, f"{name} traced no op on its array arguments"
  for eqn in eqns:
    stack = str(eqn.source_info.name_stack)
    assert stack.split("/")[0] == fn.__name__, (
      f"{name}: {eqn.primitive} runs under scope {stack!r}"
    )


def test_scoped_keeps_custom_vjp_cores_working():
  # custom_vjp cores stay undecorated; the scoped public function still
  # differentiates through them (here SOFT's implicit Newton inverse).
  from jaxnorm import attention

  a = jnp.eye(3) * 2.0
  g = jax.grad(lambda m: attention.newton_inverse(m, reg=0.0).sum())(a)
  # d sum(A^-1) / dA = -A^-T 1 1^T A^-T = -1/4 everywhere for A = 2 I.
  np.testing.assert_allclose(g, np.full((3, 3), -0.25), atol=1e-5)
