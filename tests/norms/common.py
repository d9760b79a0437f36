"""Shared inputs and assertions of the `jaxnorm.norms` tests."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
F32_TOL = 1e-6


def normal(key, shape, dtype=jnp.float32, scale=1.0, shift=0.0):
  """``N(shift, scale^2)`` samples drawn in float32, cast to ``dtype``."""
  return (jax.random.normal(key, shape, jnp.float32) * scale + shift).astype(
    dtype
  )


def vec(key, c, center=1.0, spread=0.3):
  """A ``(c,)`` parameter vector around ``center``."""
  return center + spread * normal(key, (c,))


def params(key, d):
  """A gain around 1 and a bias around 0, each ``(d,)``."""
  k1, k2 = jax.random.split(key)
  return vec(k1, d), vec(k2, d, 0.0)


def mesh4():
  """A 1-D mesh ``("data",)`` over four fake CPU devices."""
  return jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))


def assert_same_structure(a, b):
  """Same pytree structure, leaf shapes and leaf dtypes."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert la.dtype == lb.dtype and la.shape == lb.shape
