"""LINA linear attention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import D, K, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = functools.partial(_common.qkv, t=6)


def test_lina_division_matches_normalized_weights(key):
  q, k, v = _qkv(key)
  out = attn.lina_attention(q, k, v)
  phi = lambda x: jax.nn.relu(x) + 1e-6  # noqa
  w = jnp.einsum("btnh,bsnh->bnts", phi(q), phi(jnp.repeat(k, 2, 2)))
  total = w.sum(-1, keepdims=True)
  wv = jnp.einsum("bnts,bsnh->btnh", w / 6, jnp.repeat(v, 2, 2))
  den = jnp.transpose(total / 6 + 1e-6, (0, 2, 1, 3))
  helpers.assert_close(out, wv / den, atol=1e-5)
  # The classic normalized form, wherever eps is negligible.
  want = jnp.einsum("bnts,bsnh->btnh", w / total, jnp.repeat(v, 2, 2))
  big = jnp.transpose(total > 1e-2, (0, 2, 1, 3))
  helpers.assert_close(
    jnp.where(big, out, 0.0), jnp.where(big, want, 0.0), atol=1e-3
  )


def _subtraction_weights(q, k, shift):
  """NumPy float64 weights of the subtraction form, phi = ReLU + shift."""
  s = q.shape[-1] ** -0.5
  fq = np.maximum(np.asarray(q, np.float64), 0) + shift
  fk = np.maximum(np.asarray(k, np.float64), 0) + shift
  qk = np.einsum("btnh,bsnh->bnts", fq, fk)
  n = k.shape[1]
  return 1 / n + s / n * (qk - qk.mean(-1, keepdims=True))


@pytest.mark.parametrize("relu_eps", [None, 1e-6, 0.3])
def test_lina_subtraction_rows_sum_to_one(key, relu_eps):
  q, k, v = _qkv(key, k=4)
  # Official (vision_transformer_linear9.py): plain ReLU; relu_eps=1e-6 is
  # jaxnorm's earlier form.
  w = _subtraction_weights(q, k, 0.0 if relu_eps is None else relu_eps)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)
  out = attn.lina_attention(
    q, k, v, normalization="subtraction", relu_eps=relu_eps
  )
  vv = np.asarray(v, np.float64)
  helpers.assert_close(out, np.einsum("bnts,bsnh->btnh", w, vv), atol=1e-5)
  if relu_eps == 0.3:  # the shift is visible: the default is plain ReLU
    base = attn.lina_attention(q, k, v, normalization="subtraction")
    assert float(jnp.abs(out - base).max()) > 1e-3


def test_lina_division_keeps_the_official_relu_shift(key):
  q, k, v = _qkv(key)
  helpers.assert_close(
    attn.lina_attention(q, k, v),
    attn.lina_attention(q, k, v, relu_eps=1e-6),
    atol=0,
  )


def test_lina_gates(key):
  q, k, v = _qkv(key)
  q = jnp.abs(q)  # keeps the normalizer far above eps
  base = attn.lina_attention(q, k, v)
  ones = jnp.ones((6, 2))
  helpers.assert_close(
    attn.lina_attention(q, k, v, key_gate=ones, value_gate=ones), base, atol=0
  )
  helpers.assert_close(
    attn.lina_attention(q, k, v, key_gate=3 * ones), base, atol=1e-5
  )
  helpers.assert_close(
    attn.lina_attention(q, k, v, value_gate=2.5 * ones), 2.5 * base, atol=1e-5
  )
  dyn = jax.random.uniform(key, (2, 6, 2))
  assert helpers.all_finite(attn.lina_attention(q, k, v, key_gate=dyn))
  with pytest.raises(ValueError, match=r"lina_attention: key_gate must"):
    attn.lina_attention(q, k, v, key_gate=jnp.ones((5, 2)))
  with pytest.raises(ValueError, match=r"normalization must be one of"):
    attn.lina_attention(q, k, v, normalization="softmax")


def test_lina_depthwise_conv(key):
  x = jax.random.normal(key, (2, 3 + 16, 5))
  kern = jax.random.normal(jax.random.key(1), (3, 3, 5))
  bias = jnp.arange(5.0)
  y = attn.lina_depthwise_conv(x, kern, bias, grid_shape=(4, 4), num_prefix=3)
  helpers.assert_close(y[:, :3], np.zeros((2, 3, 5)), atol=0)
  img = np.pad(
    np.asarray(x[:, 3:]).reshape(2, 4, 4, 5), ((0, 0), (1, 1), (1, 1), (0, 0))
  )
  want = np.zeros((2, 4, 4, 5))
  for i in range(3):
    for j in range(3):
      want += img[:, i : i + 4, j : j + 4] * np.asarray(kern[i, j])
  helpers.assert_close(
    y[:, 3:], (want + np.arange(5.0)).reshape(2, 16, 5), atol=1e-5
  )
  with pytest.raises(ValueError, match=r"x must have num_prefix"):
    attn.lina_depthwise_conv(x, kern, grid_shape=(4, 5))
  with pytest.raises(ValueError, match=r"kernel must have shape"):
    attn.lina_depthwise_conv(x, kern[..., :2], grid_shape=(4, 4), num_prefix=3)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.lina).


def test_lina_module_matches_function_up_to_max_len(key):
  m = nn_attn.make_attention(
    "lina", D, N, num_kv_heads=K, max_len=8, rngs=nnx.Rngs(0)
  )
  x = _common.tokens(key)
  q, k, v = _common.project_qkv(m, x)
  helpers.assert_close(
    m(x), _common.project_out(m, attn.lina_attention(q, k, v)), atol=1e-5
  )
  with pytest.raises(ValueError, match="exceeds max_len=8"):
    m(_common.tokens(key, t=9))
