"""NaP recipe: ELR oracle (scale-invariant SGD), re-warmed schedule, joint
projection of norm affine parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnorm.optim import nap_recipe


def _loss(w, x, y):
  """A Linear -> (affine-free) LayerNorm -> fixed readout: invariant in w."""
  h = x @ w
  h = h - h.mean(-1, keepdims=True)
  h = h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True))
  return jnp.mean((h[:, :2] - y) ** 2)


def test_scale_invariant_sgd_oracle():
  """From c W0 at lr c^2 the function path equals W0 at lr (float64)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 5))
  y = rng.normal(size=(16, 2))
  w0 = rng.normal(size=(5, 6))
  c, lr = 3.0, 0.05
  with jax.enable_x64(True):
    grad = jax.jit(jax.grad(_loss))
    a, b = jnp.asarray(w0), jnp.asarray(c * w0)
    for _ in range(20):
      a = a - lr * grad(a, x, y)
      b = b - lr * c**2 * grad(b, x, y)
      np.testing.assert_allclose(_loss(b, x, y), _loss(a, x, y), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(b), c * np.asarray(a), rtol=1e-10)
    elr_a = nap_recipe.effective_learning_rate(lr, {"w": a})["w"]
    elr_b = nap_recipe.effective_learning_rate(lr * c**2, {"w": b})["w"]
    np.testing.assert_allclose(elr_b, elr_a, rtol=1e-10)


def test_effective_learning_rate_values():
  p = {"w": jnp.full((2, 2), 2.0), "b": jnp.ones(3)}
  sgd = nap_recipe.effective_learning_rate(0.1, p, {"w": True, "b": False})
  assert sgd["b"] is None
  np.testing.assert_allclose(sgd["w"], 0.1 / 16.0, rtol=1e-6)
  adam = nap_recipe.effective_learning_rate(0.1, p, optimizer="adam")
  np.testing.assert_allclose(adam["w"], 0.1 / 4.0, rtol=1e-6)
  np.testing.assert_allclose(adam["b"], 0.1 / np.sqrt(3.0), rtol=1e-6)


def test_rewarm_schedule():
  s = nap_recipe.nap_rewarm_schedule(3000)
  np.testing.assert_allclose(s(0), 1e-8, atol=1e-10)  # f32 interpolation
  np.testing.assert_allclose(s(1000), 6.25e-4, rtol=1e-5)
  assert float(s(2999)) < 1e-5
  np.testing.assert_allclose(s(3000), s(0))
  np.testing.assert_allclose(s(4000 + 3000 * 5), s(1000))
  base = optax.linear_schedule(1.0, 0.0, 10)
  per = nap_recipe.task_reset_schedule(base, 10)
  np.testing.assert_allclose([per(i) for i in (0, 5, 10, 15)], [1, 0.5, 1, 0.5])


def test_joint_projection():
  rng = np.random.default_rng(1)
  params = {
    "ln": {"scale": jnp.ones(4), "bias": jnp.zeros(4)},
    "ln2": {"scale": jnp.full(3, 2.0), "bias": jnp.ones(3)},
    "w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
  }
  groups = {
    "ln": {"scale": 0, "bias": 0},
    "ln2": {"scale": 1, "bias": 1},
    "w": -1,
  }
  tx = optax.chain(optax.sgd(0.5), nap_recipe.nap_project_joint(groups))
  state = tx.init(params)
  step = jax.jit(tx.update)
  p = params
  for k in range(3):
    g = jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), p
    )
    u, state = step(g, state, p)
    expect_w = p["w"] - 0.5 * g["w"]
    new_ln = jax.tree.map(lambda a, b: a - 0.5 * b, p["ln"], g["ln"])
    p = optax.apply_updates(p, u)
    np.testing.assert_allclose(p["w"], expect_w, rtol=1e-6)
    for name, init in (("ln", 2.0), ("ln2", np.sqrt(12 + 3))):
      leaves = jnp.concatenate([p[name]["scale"], p[name]["bias"]])
      np.testing.assert_allclose(jnp.linalg.norm(leaves), init, rtol=1e-5)
    # Direction of the pair kept: scale/bias ratio as before projection.
    np.testing.assert_allclose(
      p["ln"]["scale"] / new_ln["scale"],
      p["ln"]["bias"] / new_ln["bias"],
      rtol=1e-4,
    )
  zero = jax.tree.map(jnp.zeros_like, p)
  u, _ = tx.update(zero, state, p)
  np.testing.assert_allclose(u["ln"]["scale"], 0.0, atol=1e-6)


def test_errors():
  with pytest.raises(ValueError, match="optimizer must be one of"):
    nap_recipe.effective_learning_rate(0.1, {"w": jnp.ones(2)}, optimizer="x")
  with pytest.raises(ValueError, match="task_length must be a positive"):
    nap_recipe.task_reset_schedule(optax.constant_schedule(1.0), 0)
  with pytest.raises(ValueError, match="task_length must exceed warmup"):
    nap_recipe.nap_rewarm_schedule(500)
  tx = nap_recipe.nap_project_joint({"a": 1.5})
  with pytest.raises(ValueError, match="groups must hold one Python int"):
    tx.init({"a": jnp.ones(2)})
  tx = nap_recipe.nap_project_joint({"a": 0})
  st = tx.init({"a": jnp.ones(2)})
  with pytest.raises(ValueError, match="params are required"):
    tx.update({"a": jnp.ones(2)}, st)
  with pytest.raises(ValueError, match="eps must lie in"):
    nap_recipe.nap_project_joint({"a": 0}, eps=-1.0)
