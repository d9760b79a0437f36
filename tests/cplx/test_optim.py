"""Tests of `jaxnorm.optim.complex`: the conjugation and complex Adam.

Oracles: ``optax.adam`` on the explicit ``(Re, Im)`` real tree
(bit-for-bit), a NumPy transcription of the modulus variant, convergence
on ``Σ|z - z0|^2`` and the negative test (no conjugation climbs the loss).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.optim import complex as copt
from tests.cplx import _common as c

RNG = np.random.default_rng(3)
Z0 = jnp.asarray(c.np_cnormal(RNG, (5,)), jnp.complex64)


def _loss(params):
  return jnp.sum(jnp.abs(params["z"] - Z0) ** 2) + jnp.sum(params["w"] ** 2)


def _params():
  return {"z": jnp.zeros(5, jnp.complex64), "w": jnp.ones(3, jnp.float32)}


def test_conjugate_complex():
  tx = copt.conjugate_complex()
  u = {"z": jnp.asarray([1 + 2j], jnp.complex64), "w": jnp.ones(2)}
  out, _ = tx.update(u, tx.init(u))
  assert complex(out["z"][0]) == 1 - 2j
  np.testing.assert_array_equal(out["w"], u["w"])


def test_per_component_equals_optax_adam_on_re_im_tree():
  tx = copt.complex_adam(1e-2, weight_decay=1e-3)
  ref = optax.adamw(1e-2, weight_decay=1e-3)
  z = jnp.asarray(c.np_cnormal(RNG, (4, 3)), jnp.complex64)
  pair = {"re": jnp.real(z), "im": jnp.imag(z)}
  state, rstate = tx.init(z), ref.init(pair)
  for _ in range(5):
    g = jnp.asarray(c.np_cnormal(RNG, (4, 3)), jnp.complex64)
    u, state = tx.update(g, state, z)
    # jax.grad's g = dL/dx - i dL/dy, so the real tree's gradient is
    # (Re g, -Im g).
    real_grads = {"re": jnp.real(g), "im": -jnp.imag(g)}
    with jax.numpy_dtype_promotion("standard"):  # optax's own Adam.
      ru, rstate = ref.update(real_grads, rstate, pair)
    z, pair = optax.apply_updates(z, u), optax.apply_updates(pair, ru)
    np.testing.assert_array_equal(jnp.real(z), pair["re"])
    np.testing.assert_array_equal(jnp.imag(z), pair["im"])


def test_modulus_second_moment_numpy():
  tx = copt.complex_adam(0.1, b1=0.5, b2=0.8, eps=1e-6, second_moment="modulus")
  z = jnp.asarray(c.np_cnormal(RNG, (6,)), jnp.complex64)
  state = tx.init(z)
  m = np.zeros(6, complex)
  v = np.zeros(6)
  zn = np.asarray(z, complex)
  for t in range(1, 4):
    g = c.np_cnormal(RNG, (6,))
    u, state = tx.update(jnp.asarray(g, jnp.complex64), state, z)
    z = optax.apply_updates(z, u)
    d = np.conj(g)
    m = 0.5 * m + 0.5 * d
    v = 0.8 * v + 0.2 * np.abs(d) ** 2
    zn = zn - 0.1 * (m / (1 - 0.5**t)) / (np.sqrt(v / (1 - 0.8**t)) + 1e-6)
    c.close(z, zn, atol=1e-5)


def _descend(tx, steps=200):
  params = _params()
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    g = jax.grad(_loss)(params)
    u, state = tx.update(g, state, params)
    return optax.apply_updates(params, u), state

  losses = []
  for _ in range(steps):
    params, state = step(params, state)
    losses.append(float(_loss(params)))
  return params, state, losses


@pytest.mark.parametrize(
  "tx",
  [
    copt.complex_adam(0.05),
    copt.complex_adam(0.05, second_moment="modulus"),
    optax.chain(copt.conjugate_complex(), optax.sgd(0.1)),
  ],
  ids=["per_component", "modulus", "sgd"],
)
def test_converges_on_quadratic(tx):
  params, state, losses = _descend(tx)
  assert losses[-1] < 1e-3 * losses[0]
  c.close(params["z"], Z0, atol=2e-2)
  assert params["w"].dtype == jnp.float32 and params["z"].dtype == jnp.complex64
  leaves = jax.tree.leaves(state)
  again = jax.tree.leaves(tx.init(_params()))
  assert [a.dtype for a in leaves] == [b.dtype for b in again]


def test_without_conjugation_the_loss_climbs():
  """Negative test: raw jax.grad steps move the imaginary parts uphill."""
  for tx in (
    copt.complex_adam(0.05, conjugate=False),
    optax.sgd(0.1),
  ):
    params, _, losses = _descend(tx, steps=50)
    assert losses[-1] > losses[0]
    im_err = jnp.abs(jnp.imag(params["z"] - Z0))
    assert float(jnp.max(im_err)) > float(jnp.max(jnp.abs(jnp.imag(Z0))))


def test_inject_hyperparams_and_errors():
  tx = optax.inject_hyperparams(
    copt.complex_adam, hyperparam_dtype=jnp.float32
  )(learning_rate=0.05)
  _, state, losses = _descend(tx, steps=20)
  assert losses[-1] < losses[0]
  assert state.hyperparams["learning_rate"].dtype == jnp.float32
  with pytest.raises(ValueError, match=r"scale_by_complex_adam: second_moment"):
    copt.complex_adam(0.1, second_moment="diag")
