"""Shared helpers of the complex tests: complex-aware comparisons, inputs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def close(actual: Any, expected: Any, *, atol: float, rtol: float = 0.0):
  """Trees equal within tolerance, compared in complex128 NumPy."""
  if isinstance(expected, list) and not isinstance(actual, list):
    expected = np.asarray(expected)
  a_leaves, e_leaves = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(a_leaves) == len(e_leaves)
  for a, e in zip(a_leaves, e_leaves):
    np.testing.assert_allclose(
      np.asarray(a).astype(np.complex128),
      np.asarray(e).astype(np.complex128),
      atol=atol,
      rtol=rtol,
    )


def finite(tree: Any) -> bool:
  """True when no leaf (real or complex) holds NaN or Inf."""
  return all(
    bool(np.all(np.isfinite(np.asarray(leaf))))
    for leaf in jax.tree.leaves(tree)
  )


def cnormal(key: jax.Array, shape, dtype=jnp.complex64, scale=1.0):
  """A circular complex normal draw with ``E|z|^2 = 2 scale^2``."""
  kr, ki = jax.random.split(key)
  re = jax.random.normal(kr, shape) * scale
  im = jax.random.normal(ki, shape) * scale
  return jax.lax.complex(re, im).astype(dtype)


def np_cnormal(rng: np.random.Generator, shape, scale=1.0) -> np.ndarray:
  return (rng.normal(size=shape) + 1j * rng.normal(size=shape)) * scale


def complex_qkv(rng: np.random.Generator, b, t, n, kv, h, dtype=jnp.complex64):
  """Complex normal ``q (b, t, n, h)`` and ``k``, ``v (b, t, kv, h)``."""
  return tuple(
    jnp.asarray(np_cnormal(rng, (b, t, m, h)), dtype) for m in (n, kv, kv)
  )


def real_loss(fn, cot):
  """``L(args) = Re Σ conj(cot) fn(args)``: its ``dL/dOut = conj(cot)/2``."""

  def loss(*args):
    return jnp.sum(jnp.real(jnp.conj(cot) * fn(*args)))

  return loss
