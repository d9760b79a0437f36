"""Tests of `jaxnorm.fused_norms`: float64 oracle, dtypes, dispatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import fused_norms, norms
from tests import helpers


def _xr(key, shape, dtype):
  kx, kr = jax.random.split(key)
  x = jax.random.normal(kx, shape, jnp.float32) * 2.0 + 0.5
  r = jax.random.normal(kr, shape, jnp.float32) - 1.0
  return x.astype(dtype), r.astype(dtype)


def _params(key, d):
  ks, kb = jax.random.split(jax.random.fold_in(key, 7))
  return (
    jax.random.normal(ks, (d,)) * 0.5 + 1.0,
    jax.random.normal(kb, (d,)) * 0.5,
  )


def _oracle(x, r, s, b=None, *, rms, eps=1e-6):
  h = np.asarray(x, np.float64) + np.asarray(r, np.float64)
  if rms:
    y = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps)
  else:
    mu = h.mean(-1, keepdims=True)
    y = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + eps)
  y = y * np.asarray(s, np.float64)
  if b is not None:
    y = y + np.asarray(b, np.float64)
  return h, y


def test_references_match_float64_oracle(key):
  x, r = _xr(key, (6, 48), jnp.float32)
  s, b = _params(key, 48)
  helpers.assert_close(
    fused_norms.add_rms_norm(x, r, s), _oracle(x, r, s, rms=True), atol=1e-5
  )
  helpers.assert_close(
    fused_norms.add_layer_norm(x, r, s, b),
    _oracle(x, r, s, b, rms=False),
    atol=1e-5,
  )


def test_reference_normalizes_the_stored_stream(key):
  x, r = _xr(key, (6, 48), jnp.bfloat16)
  h, y = fused_norms.add_rms_norm(x, r)
  assert h.dtype == y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(y, np.float32), np.asarray(norms.rms_norm(h), np.float32)
  )
  grads = jax.grad(
    lambda x, r: jnp.sum(fused_norms.add_rms_norm(x, r)[1].astype(jnp.float32)),
    argnums=(0, 1),
  )(x, r)
  assert grads[0].dtype == jnp.bfloat16
  helpers.assert_close(grads[0], grads[1], atol=0.0)


def test_reference_errors():
  x = jnp.ones((4, 16))
  with pytest.raises(ValueError, match="residual must have shape"):
    fused_norms.add_rms_norm(x, jnp.ones((4, 8)))
  with pytest.raises(TypeError, match="x must have a floating dtype"):
    fused_norms.add_layer_norm(jnp.ones((4, 16), jnp.int32), x)
  with pytest.raises(ValueError, match="implementation must be one of"):
    fused_norms.add_rms_norm(x, x, implementation="cuda")


def test_dispatch_on_cpu():
  x = jax.random.normal(jax.random.key(3), (4, 16))
  ref = fused_norms.add_rms_norm(x, x, implementation="xla")
  helpers.assert_close(fused_norms.add_rms_norm(x, x), ref, atol=0.0)
  with pytest.raises(
    NotImplementedError,
    match=r"add_layer_norm\(implementation='pallas'\): .*backend 'cpu'",
  ):
    fused_norms.add_layer_norm(x, x, implementation="pallas")
