"""dot_product_attention and attention_weights vs jax.nn."""

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
from tests.attention._common import D, H, K, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = _common.qkv

CASES = {
  "mha": dict(n=4, k=4),
  "gqa": dict(n=4, k=2),
  "mqa": dict(n=4, k=1),
}


@pytest.mark.parametrize("heads", list(CASES))
@pytest.mark.parametrize("extras", ["plain", "mask", "causal", "bias", "all"])
def test_sdpa_matches_jax(key, heads, extras):
  q, k, v = _qkv(key, **CASES[heads])
  b, t, n, _ = q.shape
  s = k.shape[1]
  kw = {}
  if extras in ("mask", "all"):
    kw["mask"] = jax.random.bernoulli(jax.random.key(1), 0.7, (b, 1, t, s))
  if extras in ("bias", "all"):
    kw["bias"] = jax.random.normal(jax.random.key(2), (1, n, t, s))
  if extras in ("causal", "all"):
    kw["is_causal"] = True

  def ours(q, k, v):
    return attn.dot_product_attention(q, k, v, **kw)

  def ref(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)

  helpers.assert_vjp_matches(
    ours, ref, (q, k, v), key=jax.random.key(3), atol=2e-5
  )


def test_sdpa_bias_gradient_and_scale(key):
  q, k, v = _qkv(key)
  bias = jax.random.normal(jax.random.key(4), (2, 4, 5, 6))
  f = lambda bb: attn.dot_product_attention(q, k, v, bias=bb, scale=0.3)  # noqa
  g = lambda bb: jax.nn.dot_product_attention(q, k, v, bias=bb, scale=0.3)  # noqa
  helpers.assert_vjp_matches(f, g, (bias,), key=jax.random.key(5), atol=2e-5)


def test_sdpa_unbatched_and_jit(key):
  q, k, v = _qkv(key, b=1)
  out = attn.dot_product_attention(q[0], k[0], v[0], is_causal=True)
  want = attn.dot_product_attention(q, k, v, is_causal=True)[0]
  helpers.assert_close(out, want, atol=1e-6)
  helpers.assert_jit_matches_eager(
    attn.dot_product_attention, q, k, v, is_causal=True
  )


def test_sdpa_fully_masked_row_is_mean_of_v(key):
  q, k, v = _qkv(key, n=2, k=2)
  mask = jnp.ones((2, 1, 5, 6), bool).at[:, :, 2, :].set(False)
  out = attn.dot_product_attention(q, k, v, mask=mask)
  helpers.assert_close(out[:, 2], v.mean(axis=1), atol=1e-6)
  assert helpers.all_finite(
    jax.grad(lambda q: attn.dot_product_attention(q, k, v, mask=mask).sum())(q)
  )


def test_sdpa_length_one_and_bfloat16(key):
  q, k, v = _qkv(key, t=1, s=1)
  out = attn.dot_product_attention(q, k, v, is_causal=True)
  helpers.assert_close(out, jnp.repeat(v, 2, axis=2), atol=1e-6)
  qb, kb, vb = _qkv(key, dtype=jnp.bfloat16)
  ob = attn.dot_product_attention(qb, kb, vb, is_causal=True)
  assert ob.dtype == jnp.bfloat16 and helpers.all_finite(ob)
  of = attn.dot_product_attention(
    *(x.astype(jnp.float32) for x in (qb, kb, vb)), is_causal=True
  )
  helpers.assert_close(ob, of, atol=2e-2)


def test_sdpa_shape_errors(key):
  q, k, v = _qkv(key)
  f = attn.dot_product_attention
  with pytest.raises(ValueError, match=r"query must have rank 4"):
    f(q[0, 0], k, v)
  with pytest.raises(ValueError, match=r"key must have the same rank"):
    f(q, k[0], v)
  with pytest.raises(ValueError, match=r"key batch size must equal"):
    f(q, k[:1], v[:1])
  with pytest.raises(ValueError, match=r"key head_dim must equal"):
    f(q, k[..., :4], v)
  with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple"):
    f(
      q,
      jnp.concatenate([k, k[:, :, :1]], 2),
      jnp.concatenate([v, v[:, :, :1]], 2),
    )
  with pytest.raises(ValueError, match=r"value must match key"):
    f(q, k, v[:, :3])
  with pytest.raises(ValueError, match=r"mask must be broadcastable"):
    f(q, k, v, mask=jnp.ones((2, 4, 5, 7), bool))
  with pytest.raises(ValueError, match=r"bias must be broadcastable"):
    f(q, k, v, bias=jnp.ones((5, 6)))
  with pytest.raises(TypeError, match=r"mask must be boolean"):
    f(q, k, v, mask=jnp.ones((2, 4, 5, 6)))
  with pytest.raises(TypeError, match=r"bias must have a floating dtype"):
    f(q, k, v, bias=jnp.ones((2, 4, 5, 6), jnp.int32))
  with pytest.raises(TypeError, match=r"value must have a floating dtype"):
    f(q, k, v.astype(jnp.int32))


def test_attention_weights_rows(key):
  q, k, _ = _qkv(key)
  w = attn.attention_weights(q, k, is_causal=True)
  helpers.assert_close(w.sum(-1), np.ones((2, 4, 5)), atol=1e-6)
  assert float(jnp.abs(w[..., 0, 1:]).max()) == 0.0


# --- Gemma 2/3 options: logits soft cap and local window --------------------


@pytest.mark.parametrize("window", [0, 2, (3, 0), (1, 4)])
def test_local_window_matches_jax(key, window):
  q, k, v = _qkv(key, t=7, s=7)
  for causal in (False, True):
    got = attn.dot_product_attention(
      q, k, v, local_window_size=window, is_causal=causal
    )
    want = jax.nn.dot_product_attention(
      q, k, v, local_window_size=window, is_causal=causal
    )
    helpers.assert_close(got, want, atol=1e-6)


def test_logits_soft_cap_matches_numpy(key):
  q, k, v = _qkv(key, n=2, k=2)
  bias = jax.random.normal(jax.random.key(6), (1, 2, 5, 6))
  cap = 0.7
  got = attn.dot_product_attention(
    q, k, v, bias=bias, logits_soft_cap=cap, is_causal=True
  )
  q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
  lg = np.einsum("btnh,bsnh->bnts", q64, k64) / np.sqrt(8)
  lg = cap * np.tanh(lg / cap) + np.asarray(bias, np.float64)
  lg = np.where(np.tril(np.ones((5, 6), bool)), lg, -np.inf)
  w = np.exp(lg - lg.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  helpers.assert_close(got, np.einsum("bnts,bsnh->btnh", w, v64), atol=1e-5)
  weights = attn.attention_weights(
    q, k, bias=bias, logits_soft_cap=cap, is_causal=True
  )
  helpers.assert_close(weights, w, atol=1e-6)
  # Gemma 2's cap of 50 barely changes moderate logits (x - 50 tanh(x / 50)
  # is about x^3 / 7500).
  helpers.assert_close(
    attn.dot_product_attention(q, k, v, logits_soft_cap=50.0),
    attn.dot_product_attention(q, k, v),
    atol=5e-3,
  )


def test_soft_cap_and_window_errors(key):
  q, k, v = _qkv(key)
  f = attn.dot_product_attention
  with pytest.raises(ValueError, match=r"logits_soft_cap must be None or > 0"):
    f(q, k, v, logits_soft_cap=0.0)
  for bad in (-1, (1, 2, 3), (1.5, 2), True):
    with pytest.raises(ValueError, match="local_window_size must be an int"):
      f(q, k, v, local_window_size=bad)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.softmax).


def test_softmax_module_matches_function(key):
  m = nn_attn.MultiHeadAttention(
    D, N, num_kv_heads=K, is_causal=True, rngs=nnx.Rngs(0)
  )
  x = _common.tokens(key)
  q, k, v = _common.project_qkv(m, x)
  want = _common.project_out(
    m, attn.dot_product_attention(q, k, v, is_causal=True)
  )
  helpers.assert_close(m(x), want, atol=1e-5)
  assert m.k_kernel.shape == (D, K, H)
  helpers.assert_jit_matches_eager(lambda x: m(x), x, atol=1e-5)
