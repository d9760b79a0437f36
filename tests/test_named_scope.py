"""Every public pure function runs under ``jax.named_scope(<its name>)``.

Profiles and HLO dumps then name each op after the paper's function that
emitted it (`jaxnorm._scope`). The functions are collected from the
packages' ``__all__`` (tests/fuzz/_property.py), so a new one is covered
without an edit here; its arguments come from its fuzz builder.

The optimizers too: every factory in ``jaxnorm.optim.__all__`` that returns
an optax transform runs the transform's ``init`` and ``update`` under its
own name (`jaxnorm.optim._common.scoped_transform`). They are found by
their return annotation; required arguments come from `_REQUIRED`, keyed
by argument name, so a new optimizer is covered without an edit here.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import _scope, optim
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


def _transform_factories():
  """``name -> factory`` for the transform factories of `jaxnorm.optim`."""
  out = {}
  for name in optim.__all__:
    fn = getattr(optim, name)
    if not inspect.isfunction(fn):
      continue
    returns = str(inspect.signature(fn).return_annotation)
    if "GradientTransformation" in returns:
      out[name] = fn
  return out


_TRANSFORMS = _transform_factories()

# Values of the arguments some factories require, by argument name.
_REQUIRED = {
  "learning_rate": 0.1,
  "mask": lambda params: jax.tree.map(lambda _: True, params),
  "groups": lambda params: jax.tree.map(lambda _: 0, params),
}


def _build(fn):
  kwargs = {}
  for arg in inspect.signature(fn).parameters.values():
    if arg.default is inspect.Parameter.empty:
      assert arg.name in _REQUIRED, (
        f"{fn.__name__}: add a value for its required {arg.name!r} to _REQUIRED"
      )
      kwargs[arg.name] = _REQUIRED[arg.name]
  return fn(**kwargs)


def _params(fn):
  """A matrix (a bias would stop `scale_by_rmnp`); complex for the complex
  optimizers, whose conjugation touches only complex leaves."""
  w = jnp.arange(1.0, 13.0).reshape(4, 3) / 7.0
  if inspect.unwrap(fn).__module__ == "jaxnorm.optim.complex":
    w = jax.lax.complex(w, jnp.flip(w))
  return {"w": w}


def test_every_optimizer_is_found():
  expected = {"adamp", "sgdp", "conda", "rmnp", "nap_project"}
  expected |= {f"scale_by_{n}" for n in ("adamp", "sgdp", "conda", "rmnp")}
  assert expected <= set(_TRANSFORMS)
  assert "effective_learning_rate" not in _TRANSFORMS  # not a transform


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_optimizer_is_scoped(name):
  fn = _TRANSFORMS[name]
  assert getattr(fn, _scope.SCOPE_ATTR, None) == fn.__name__ == name, (
    f"{name} lacks @_common.scoped_transform"
  )
  assert inspect.signature(fn) == inspect.signature(inspect.unwrap(fn))
  assert fn.__doc__ == inspect.unwrap(fn).__doc__
  # The transform keeps optax's class (extra keyword arguments included).
  inner = inspect.unwrap(fn)(
    **{
      a.name: _REQUIRED[a.name]
      for a in inspect.signature(fn).parameters.values()
      if a.default is inspect.Parameter.empty
    }
  )
  assert type(_build(fn)) is type(inner)


def _assert_scoped(name, jaxpr, what):
  eqns = jaxpr.jaxpr.eqns
  # An init of constants alone (a counter, an empty state) traces no op.
  assert eqns or what == "init", f"{name}: its {what} traced no op"
  for eqn in eqns:
    stack = str(eqn.source_info.name_stack)
    assert stack.split("/")[0] == name, (
      f"{name}.{what}: {eqn.primitive} runs under scope {stack!r}"
    )


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_every_optimizer_op_carries_the_scope(name):
  fn = _TRANSFORMS[name]
  tx = _build(fn)
  params = _params(fn)
  grads = jax.tree.map(lambda p: jnp.cos(p) - 0.5, params)
  state = tx.init(params)
  _assert_scoped(name, jax.make_jaxpr(tx.init)(params), "init")
  update = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))
  _assert_scoped(name, update(grads, state, params), "update")


def test_scope_survives_inject_hyperparams():
  tx = optax.inject_hyperparams(optim.adamp)(learning_rate=0.1)
  params = _params(optim.adamp)
  jaxpr = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(
    params, tx.init(params), params
  )
  stacks = {str(e.source_info.name_stack) for e in jaxpr.jaxpr.eqns}
  assert any(s.startswith("adamp/scale_by_adamp") for s in stacks), stacks
