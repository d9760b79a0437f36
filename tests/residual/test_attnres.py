"""Tests for jaxnorm.residual.attnres: depth attention weights and their
limits, against a NumPy transcription of the AttnRes equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.residual import _common as common
from tests.residual._common import Linear, transformer

# ---------------------------------------------------------------------------
# Attention residuals.


def test_attn_res_zero_query_is_mean(key):
  # Spec 4 test 1.
  v = jax.random.normal(key, (5, 2, 3, 8))
  out = R.attn_res(v, jnp.zeros(8))
  helpers.assert_close(out, jnp.mean(v, axis=0), atol=1e-6)


def test_attn_res_weights_scale_invariant_and_normalized(key):
  # Spec 4 test 2.
  kv, kw = jax.random.split(key)
  v = jax.random.normal(kv, (4, 6, 16))
  w = jax.random.normal(kw, (16,))
  a = R.attn_res_weights(v, w, eps=0.0)
  np.testing.assert_allclose(a.sum(0), 1.0, atol=1e-6)
  scaled = v * jnp.array([1.0, 7.0, 0.1, 3.0]).reshape(4, 1, 1)
  helpers.assert_close(R.attn_res_weights(scaled, w, eps=0.0), a, atol=1e-5)


def test_attn_res_one_hot_limit(key):
  # Spec 4 test 3: a query aligned with one normalized key selects it.
  v = jax.random.normal(key, (5, 16))
  j = 2
  k = np.asarray(common.rms(v[j]))
  w = 1e3 * k / np.linalg.norm(k)
  helpers.assert_close(
    R.attn_res(v[:, None], jnp.asarray(w))[0], v[j], atol=1e-3
  )


def test_attn_res_matches_numpy_with_key_scale(key):
  kv, kw, kg = jax.random.split(key, 3)
  v = jax.random.normal(kv, (3, 4, 8))
  w = jax.random.normal(kw, (8,))
  g = jax.random.normal(kg, (8,))
  vn = np.asarray(v, np.float64)
  keys = vn / np.sqrt(np.mean(vn**2, -1, keepdims=True) + 1e-6)
  s = (keys * np.asarray(g)) @ np.asarray(w)
  a = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)
  helpers.assert_close(
    R.attn_res(v, w, key_scale=g), np.sum(a[..., None] * vn, 0), atol=1e-5
  )
  assert R.attn_res(v.astype(jnp.bfloat16), w).dtype == jnp.bfloat16


def test_attn_res_errors():
  with pytest.raises(ValueError, match=r"query must have shape \(8,\)"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(4))
  with pytest.raises(ValueError, match="sources must have rank >= 2"):
    R.attn_res(jnp.zeros(8), jnp.zeros(8))
  with pytest.raises(ValueError, match=r"key_scale must have shape \(8,\)"):
    R.attn_res_weights(jnp.zeros((3, 8)), jnp.zeros(8), key_scale=jnp.ones(3))
  with pytest.raises(TypeError, match="attn_res_weights: mask must be boolean"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(8), mask=jnp.ones(3))
  with pytest.raises(ValueError, match=r"mask must have shape \(3,\)"):
    R.attn_res(jnp.zeros((3, 8)), jnp.zeros(8), mask=jnp.ones(2, bool))


def test_attn_res_mask_equals_the_existing_sources(key):
  kv, kw = jax.random.split(key)
  v = jax.random.normal(kv, (5, 2, 8))
  w = jax.random.normal(kw, (8,))
  buffer = v.at[3:].set(0.0)  # Two slots not yet written.
  mask = jnp.arange(5) < 3
  helpers.assert_close(
    R.attn_res(buffer, w, mask=mask), R.attn_res(v[:3], w), atol=1e-6
  )
  a = R.attn_res_weights(buffer, w, mask=mask)
  assert float(jnp.max(a[3:])) == 0.0
  g = jax.grad(lambda b: jnp.sum(R.attn_res(b, w, mask=mask) ** 2))(buffer)
  assert helpers.all_finite(g) and float(jnp.max(jnp.abs(g[3:]))) == 0.0


# ---------------------------------------------------------------------------
# The modules (jaxnorm.nn.residual.attnres).


def _attnres_numpy(x, ys_fn, queries, block_size):
  """Float64 AttnRes wiring from the spec, with zero or given queries."""
  completed, partial, inputs = [x], None, []
  for k, (f, w) in enumerate(zip(ys_fn, queries)):
    src = np.stack(completed if partial is None else completed + [partial])
    keys = src / np.sqrt(np.mean(src**2, -1, keepdims=True) + 1e-6)
    s = keys @ w
    a = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)
    h = np.sum(a[..., None] * src, 0)
    inputs.append(h)
    if k and k % block_size == 0:
      completed, partial = completed + [partial], None
    y = f(h)
    partial = y if partial is None else partial + y
  return inputs, completed + [partial]


@pytest.mark.parametrize("block_size", [1, 2])
def test_attnres_stack_matches_numpy_wiring(block_size):
  d, num = 8, 6
  rng = np.random.RandomState(0)
  ws = [rng.randn(d, d) / np.sqrt(d) for _ in range(num)]
  blocks = [Linear(w.astype(np.float32)) for w in ws]
  net = nn_res.AttnResStack(
    blocks, num_features=d, block_size=block_size, norm=None, rngs=nnx.Rngs(0)
  )
  queries = [rng.randn(d) for _ in range(num)]
  for q, w in zip(net.queries, queries):
    q.query[...] = jnp.asarray(w, jnp.float32)
  x = rng.randn(3, d)
  y, hidden = net(jnp.asarray(x, jnp.float32), return_hidden=True)
  fns = [lambda h, w=w: h @ w for w in ws]
  inputs, final = _attnres_numpy(x, fns, queries, block_size)
  helpers.assert_close(hidden, np.stack(inputs), atol=1e-4)
  helpers.assert_close(y, np.mean(np.stack(final), 0), atol=1e-4)


def test_block_attnres_limits():
  # Spec 4 test 4: N = L equals Full; N = 1 with w = 0 gives
  # b_0 first, then (b_0 + b_1^{i-1}) / 2.
  d, x = 8, jax.random.normal(jax.random.key(0), (2, 3, 8))
  blocks = transformer(2, d)
  full = nn_res.make_residual(
    "attnres", blocks, num_features=d, rngs=nnx.Rngs(1)
  )
  per = nn_res.make_residual(
    "block_attnres", blocks, num_features=d, rngs=nnx.Rngs(1), num_blocks=4
  )
  helpers.assert_close(per(x), full(x), atol=1e-6)
  one = nn_res.make_residual(
    "block_attnres",
    blocks,
    num_features=d,
    rngs=nnx.Rngs(1),
    num_blocks=1,
    norm=None,
  )
  _, hidden = one(x, return_hidden=True)
  helpers.assert_close(hidden[0], x, atol=1e-6)
  partial = blocks[0](x)
  helpers.assert_close(hidden[1], (x + partial) / 2, atol=1e-5)
  partial = partial + blocks[1](hidden[1])
  helpers.assert_close(hidden[2], (x + partial) / 2, atol=1e-5)
