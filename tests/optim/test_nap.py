"""NaP projection: norms kept, function unchanged, idempotent, mask honoured."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm import optim
from tests import helpers


def _params(key):
  k1, k2, k3 = jax.random.split(key, 3)
  return {
    "hidden": jax.random.normal(k1, (6, 8), jnp.float32),
    "stack": jax.random.normal(k2, (2, 5, 4), jnp.float32),
    "readout": jax.random.normal(k3, (8, 3), jnp.float32),
  }


def _mask(p):
  return {"hidden": True, "stack": True, "readout": False}


AXES = {
  "hidden": optim.MatrixAxes(),
  "stack": optim.MatrixAxes(output=2, reduction=1),
  "readout": optim.MatrixAxes(),
}


def _run(tx, params, key, steps=4):
  state = tx.init(params)
  step = jax.jit(tx.update)
  for k in jax.random.split(key, steps):
    grads = jax.tree.map(lambda p: jax.random.normal(k, p.shape), params)
    u, state = step(grads, state, params)
    params = optax.apply_updates(params, u)
  return params


@pytest.mark.parametrize("granularity", ["layer", "unit"])
def test_norms_kept_and_readout_bit_identical(key, granularity):
  p0 = _params(key)
  tx = optax.chain(
    optax.sgd(0.3), optim.nap_project(_mask, granularity=granularity, axes=AXES)
  )
  plain = _run(optax.sgd(0.3), p0, key)
  out = _run(tx, p0, key)
  np.testing.assert_array_equal(out["readout"], plain["readout"])
  red = {
    "hidden": (0,) if granularity == "unit" else (0, 1),
    "stack": (1,) if granularity == "unit" else (1, 2),
  }
  for k, ax in red.items():
    np.testing.assert_allclose(
      np.linalg.norm(out[k], axis=ax), np.linalg.norm(p0[k], axis=ax), rtol=1e-6
    )
  assert not np.allclose(plain["hidden"], out["hidden"])


def test_linear_layernorm_output_unchanged(key):
  k1, k2 = jax.random.split(key)
  w = jax.random.normal(k1, (5, 7), jnp.float32)
  x = jax.random.normal(k2, (9, 5), jnp.float32)

  def block(w):
    h = x @ w
    h = h - h.mean(-1, keepdims=True)
    return h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-12)

  tx = optim.nap_project(lambda p: True)
  state = tx.init(w)
  u = 0.7 * jax.random.normal(k1, w.shape)
  proj, _ = tx.update(u, state, w)
  helpers.assert_close(block(w + proj), block(w + u), atol=1e-5)


def test_idempotent(key):
  p = _params(key)
  tx = optim.nap_project(_mask, axes=AXES)
  state = tx.init(jax.tree.map(lambda x: 2.0 * x, p))
  zero = jax.tree.map(jnp.zeros_like, p)
  u1, state = tx.update(zero, state, p)
  once = optax.apply_updates(p, u1)
  u2, _ = tx.update(zero, state, once)
  twice = optax.apply_updates(once, u2)
  helpers.assert_close(twice, once, atol=1e-6)
  helpers.assert_close(once["hidden"], 2.0 * p["hidden"], atol=1e-5)


def test_period(key):
  p = {"w": jax.random.normal(key, (4, 4))}
  tx = optim.nap_project(lambda q: {"w": True}, period=3)
  state = tx.init(p)
  u = {"w": jnp.ones((4, 4))}
  outs = []
  for _ in range(3):
    out, state = tx.update(u, state, p)
    outs.append(out)
  helpers.assert_close(outs[0], u, atol=0)
  helpers.assert_close(outs[1], u, atol=0)
  np.testing.assert_allclose(
    np.linalg.norm(p["w"] + outs[2]["w"]), np.linalg.norm(p["w"]), rtol=1e-6
  )


def test_errors(key):
  p = {"b": jnp.ones((3,))}
  with pytest.raises(ValueError, match="nap_project: granularity must be"):
    optim.nap_project(_mask, granularity="row")
  with pytest.raises(ValueError, match="nap_project: period must be"):
    optim.nap_project(_mask, period=0)
  with pytest.raises(ValueError, match="nap_project: eps must lie in"):
    optim.nap_project(_mask, eps=-1.0)
  tx = optim.nap_project(lambda q: {"b": True}, granularity="unit")
  with pytest.raises(ValueError, match="granularity='unit' needs matrix"):
    tx.init(p)
  tx = optim.nap_project(lambda q: {"b": True})
  with pytest.raises(ValueError, match="nap_project: params are required"):
    tx.update(p, tx.init(p))
