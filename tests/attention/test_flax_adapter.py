"""as_flax_attention_fn: jaxnorm attention inside flax's MultiHeadAttention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from tests import helpers
from tests.attention import _common

B, T, D, HEADS = 2, 6, 16, 4


def _mha(attention_fn=None, dropout_rate=0.0):
  kw = {} if attention_fn is None else {"attention_fn": attention_fn}
  return nnx.MultiHeadAttention(
    num_heads=HEADS,
    in_features=D,
    qkv_features=D,
    dropout_rate=dropout_rate,
    decode=False,
    rngs=nnx.Rngs(params=0, dropout=1),
    **kw,
  )


@pytest.fixture(scope="module")
def x_and_mask():
  x = jax.random.normal(jax.random.key(0), (B, T, D))
  keep = jax.random.bernoulli(jax.random.key(1), 0.8, (B, 1, T, T))
  keep = keep.at[..., 0].set(True)  # no fully masked row
  return x, keep.astype(jnp.float32)  # flax's float 0/1 mask


def test_equals_flax_at_dropout_zero(x_and_mask):
  x, mask = x_and_mask
  ours = _mha(attn.as_flax_attention_fn(attn.dot_product_attention))
  flax_own = _mha()
  helpers.assert_close(
    ours(x, mask=mask, deterministic=True),
    flax_own(x, mask=mask, deterministic=True),
    atol=1e-5,
  )
  causal_ours = _mha(
    attn.as_flax_attention_fn(attn.dot_product_attention, logits_soft_cap=1e6)
  )
  helpers.assert_close(
    causal_ours(x, mask=nnx.make_causal_mask(x[..., 0])),
    flax_own(x, mask=nnx.make_causal_mask(x[..., 0])),
    atol=1e-4,
  )


@pytest.mark.parametrize("broadcast", [True, False])
def test_applies_dropout_as_flax(x_and_mask, broadcast):
  x, mask = x_and_mask
  fn = attn.as_flax_attention_fn(attn.dot_product_attention)
  q, k, v = _common.qkv(jax.random.key(2), t=T, s=T, n=HEADS, k=HEADS)
  rng = jax.random.key(3)
  kw = dict(
    mask=mask,
    dropout_rng=rng,
    dropout_rate=0.4,
    deterministic=False,
    broadcast_dropout=broadcast,
  )
  got = fn(q, k, v, **kw)
  want = nnx.dot_product_attention(q, k, v, **kw)
  helpers.assert_close(got, want, atol=1e-5)
  plain = fn(q, k, v, mask=mask)
  assert float(jnp.abs(got - plain).max()) > 1e-2  # dropout did happen
  helpers.assert_close(
    fn(q, k, v, **dict(kw, deterministic=True)), plain, atol=0
  )


def test_dropout_inside_multi_head_attention(x_and_mask):
  x, mask = x_and_mask
  ours = _mha(attn.as_flax_attention_fn(attn.dot_product_attention), 0.3)
  flax_own = _mha(dropout_rate=0.3)
  a = ours(x, mask=mask, deterministic=False)
  b = flax_own(x, mask=mask, deterministic=False)
  helpers.assert_close(a, b, atol=1e-5)
  assert float(jnp.abs(a - ours(x, mask=mask, deterministic=True)).max()) > 0


def test_extra_batch_axes_and_sown_weights(x_and_mask):
  _, mask = x_and_mask
  fn = attn.as_flax_attention_fn(attn.dot_product_attention)
  q, k, v = _common.qkv(jax.random.key(4), b=6, t=T, s=T, n=HEADS, k=HEADS)
  q5, k5, v5 = (a.reshape((2, 3) + a.shape[1:]) for a in (q, k, v))
  helpers.assert_close(
    fn(q5, k5, v5, is_causal=True),
    fn(q, k, v, is_causal=True).reshape(q5.shape),
    atol=1e-6,
  )
  x, _ = x_and_mask
  ours, flax_own = _mha(fn), _mha()
  out, sown = nnx.capture(ours, nnx.Intermediate)(
    x, mask=mask, sow_weights=True
  )
  want, want_sown = nnx.capture(flax_own, nnx.Intermediate)(
    x, mask=mask, sow_weights=True
  )
  helpers.assert_close(out, want, atol=1e-5)
  helpers.assert_close(
    jax.tree.leaves(sown), jax.tree.leaves(want_sown), atol=1e-6
  )
  assert jax.tree.leaves(sown)[0].shape == (B, HEADS, T, T)


def test_refuses_what_it_cannot_do(x_and_mask):
  x, mask = x_and_mask
  q, k, v = _common.qkv(jax.random.key(5), t=T, s=T, n=HEADS, k=HEADS)
  nala = attn.as_flax_attention_fn(attn.nala_attention)
  helpers.assert_close(nala(q, k, v), attn.nala_attention(q, k, v), atol=0)
  with pytest.raises(ValueError, match=r"dropout \(dropout_rate=0.1"):
    nala(q, k, v, dropout_rng=jax.random.key(0), dropout_rate=0.1)
  with pytest.raises(ValueError, match="takes no mask"):
    nala(q, k, v, mask=mask)
  with pytest.raises(ValueError, match="takes no is_causal"):
    nala(q, k, v, is_causal=True)
  sdpa = attn.as_flax_attention_fn(attn.dot_product_attention)
  with pytest.raises(ValueError, match="needs a dropout_rng"):
    sdpa(q, k, v, dropout_rate=0.1)
  module = _mha(attn.as_flax_attention_fn(attn.sink_attention), 0.2)
  with pytest.raises(ValueError, match="pass weights_fn="):
    module(x, deterministic=False)
  np.testing.assert_array_equal(module(x, deterministic=True).shape, (B, T, D))
