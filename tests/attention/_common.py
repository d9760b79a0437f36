"""Shared inputs and contexts of the attention tests."""

import contextlib

import jax
import jax.numpy as jnp

from tests.pallas_kernels import _common as pallas_common


def qkv(key, b=2, t=5, s=6, n=4, k=2, h=8, dtype=jnp.float32):
  """Gaussian ``q (b, t, n, h)``, ``k, v (b, s, k, h)`` in ``dtype``."""
  kq, kk, kv = jax.random.split(key, 3)
  q = jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype)
  k_ = jax.random.normal(kk, (b, s, k, h), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (b, s, k, h), jnp.float32).astype(dtype)
  return q, k_, v


def lowering_context(platform: str):
  """For a cross-lowering to ``platform``: on ``"cuda"`` the Triton target
  device and JAX's Triton deprecation warning (where it warns)."""
  if platform != "cuda":
    return contextlib.nullcontext()
  stack = contextlib.ExitStack()
  stack.enter_context(pallas_common.triton_target())
  stack.enter_context(pallas_common.expect_triton_deprecation())
  return stack
