"""Sinkhorn attention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention as attn
from tests import helpers
from tests.attention import _common

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = functools.partial(_common.qkv, t=6)


def test_sinkhorn_zero_iters_is_softmax(key):
  q, k, v = _qkv(key)
  lg = jax.random.normal(key, (3, 5, 7))
  helpers.assert_close(
    attn.sinkhorn_weights(lg, num_iters=0), jax.nn.softmax(lg, -1), atol=1e-6
  )
  out = attn.sinkhorn_attention(q, k, v, num_iters=0, is_causal=True)
  helpers.assert_close(
    out, attn.dot_product_attention(q, k, v, is_causal=True), atol=1e-5
  )
  # Row-shift invariance of the row anchor.
  helpers.assert_close(
    attn.sinkhorn_weights(lg + 3.0, num_iters=0),
    attn.sinkhorn_weights(lg, num_iters=0),
    atol=1e-6,
  )


def test_sinkhorn_doubly_stochastic(key):
  lg = jax.random.normal(key, (4, 4))
  w = attn.sinkhorn_weights(lg, num_iters=50)
  helpers.assert_close(w.sum(-1), np.ones(4), atol=1e-5)
  helpers.assert_close(w.sum(-2), np.ones(4), atol=1e-5)
  rect = attn.sinkhorn_weights(jax.random.normal(key, (3, 6)), num_iters=50)
  helpers.assert_close(rect.sum(-2), np.full(6, 0.5), atol=1e-5)


def test_sinkhorn_masks_and_errors(key):
  q, k, v = _qkv(key)
  mask = jnp.ones((2, 1, 6, 6), bool).at[0, 0, 1].set(False)
  mask = mask.at[1, 0, :, 4].set(False)
  out = jax.jit(attn.sinkhorn_attention)(q, k, v, mask=mask)
  helpers.assert_close(out[0, 1], np.zeros((4, 8)), atol=0)
  g = jax.jit(
    jax.grad(lambda q: attn.sinkhorn_attention(q, k, v, mask=mask).sum())
  )(q)
  assert helpers.all_finite(g) and helpers.all_finite(out)
  w = attn.sinkhorn_weights(jnp.zeros((6, 6)), jnp.tril(jnp.ones((6, 6), bool)))
  helpers.assert_close(w.sum(-1), np.ones(6), atol=1e-5)
  assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0
  with pytest.raises(ValueError, match=r"mask must be broadcastable"):
    attn.sinkhorn_weights(jnp.zeros((6, 6)), jnp.ones((5, 6), bool))
  with pytest.raises(TypeError, match=r"sinkhorn_weights: mask must be bool"):
    attn.sinkhorn_weights(jnp.zeros((6, 6)), jnp.ones((6, 6)))
  with pytest.raises(ValueError, match=r"row_mass and col_mass must be > 0"):
    attn.sinkhorn_weights(jnp.zeros((6, 6)), row_mass=0.0)
