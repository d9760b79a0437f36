"""Affine-Scaled Attention."""

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
from tests.attention._common import D, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = _common.qkv


def test_linear_clipping():
  x = jnp.array([-6.0, -5.0, 0.0, 2.0, 5.0, 9.0])
  helpers.assert_close(
    attn.linear_clipping(x), np.array([0, 0, 0.5, 0.7, 1, 1.0]), atol=1e-7
  )


def test_affine_unit_scale_zero_bias_is_softmax(key):
  q, k, v = _qkv(key)
  ones = jnp.ones((2, 5, 4))
  for kw in (
    {},
    {"is_causal": True},
    {"mask": jax.random.bernoulli(key, 0.8, (2, 1, 5, 6))},
  ):
    out, ma = attn.affine_scaled_attention(
      q, k, v, alpha=ones, alpha_ma=jnp.ones((4,)), **kw
    )
    want = attn.dot_product_attention(q, k, v, **kw)
    rows = (
      jnp.ones((2, 5), bool) if "mask" not in kw else kw["mask"].any(-1)[:, 0]
    )
    helpers.assert_close(
      jnp.where(rows[..., None, None], out, 0.0),
      jnp.where(rows[..., None, None], want, 0.0),
      atol=1e-6,
    )
    helpers.assert_close(ma, np.ones(4), atol=0)


def _explicit_affine(q, k, v, alpha, ama, causal):
  p = np.asarray(attn.attention_weights(q, k, is_causal=causal), np.float64)
  b, n, t, s = p.shape
  allowed = np.tril(np.ones((t, s), bool)) if causal else np.ones((t, s), bool)
  cnt = allowed.sum(-1)[None, None, :, None]
  a = np.asarray(alpha, np.float64).transpose(0, 2, 1)[..., None]
  w = np.where(allowed, a * p + (ama - a) / cnt, 0.0)
  return w


@pytest.mark.parametrize("causal", [False, True])
def test_affine_weights_rows_sum_to_alpha_ma(key, causal):
  q, k, v = _qkv(key, n=4, k=4, s=5)
  alpha = jax.random.uniform(jax.random.key(7), (2, 5, 4))
  w = _explicit_affine(q, k, v, alpha, 0.4, causal)
  np.testing.assert_allclose(w.sum(-1), 0.4, atol=1e-6)
  assert w.min() < 0  # Negative weights appear.
  out, _ = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.full((4,), 0.4), is_causal=causal
  )
  want = np.einsum("bnts,bsnh->btnh", w, np.asarray(v, np.float64))
  helpers.assert_close(out, want, atol=1e-5)
  if causal:  # Position 0 uses only v_0.
    helpers.assert_close(out[:, 0], 0.4 * v[:, 0], atol=1e-6)


def test_affine_two_key_example():
  # N=2, alpha=0.8, alpha_ma=0.4, P=(0.1, 0.9) -> A=(-0.12, 0.52).
  lg = np.log(np.array([0.1, 0.9]))
  q = jnp.ones((1, 1, 1, 1))
  k = jnp.asarray(lg, jnp.float32).reshape(1, 2, 1, 1)
  v = jnp.eye(2).reshape(1, 2, 1, 2)
  out, _ = attn.affine_scaled_attention(
    q,
    k,
    v,
    alpha=jnp.full((1, 1, 1), 0.8),
    alpha_ma=jnp.array([0.4]),
    scale=1.0,
  )
  helpers.assert_close(out[0, 0, 0], np.array([-0.12, 0.52]), atol=1e-6)


def test_affine_ema_update_and_eval(key):
  q, k, v = _qkv(key)
  alpha = jnp.full((2, 5, 4), 0.5)
  _, ma = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.zeros((4,)), training=True
  )
  helpers.assert_close(ma, np.full(4, 0.05), atol=1e-7)
  _, ma0 = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.zeros(()), training=True
  )
  assert ma0.shape == () and abs(float(ma0) - 0.05) < 1e-7
  # beta uses the estimate from before the batch: training output equals
  # eval with the same (old) estimate, not with the updated one.
  out_tr, new = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.full((4,), 0.2), training=True
  )
  helpers.assert_close(new, np.full(4, 0.9 * 0.2 + 0.1 * 0.5), atol=1e-7)
  out_old, kept = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.full((4,), 0.2)
  )
  helpers.assert_close(kept, np.full(4, 0.2, np.float32), atol=0)
  helpers.assert_close(out_tr, out_old, atol=0)
  out_new, _ = attn.affine_scaled_attention(q, k, v, alpha=alpha, alpha_ma=new)
  assert float(jnp.abs(out_tr - out_new).max()) > 1e-3


def test_affine_decomposition_and_masked_rows(key):
  q, k, v = _qkv(key, n=4, k=4)
  alpha = jax.random.uniform(jax.random.key(8), (2, 5, 4))
  mask = jnp.ones((2, 1, 5, 6), bool).at[0, 0, 3].set(False)
  out, _ = attn.affine_scaled_attention(
    q, k, v, mask=mask, alpha=alpha, alpha_ma=jnp.full((4,), 0.3)
  )
  sdpa = attn.dot_product_attention(q, k, v, mask=mask)
  a = alpha[..., None]
  want = a * sdpa + (0.3 - a) / 6 * v.sum(1, keepdims=True)
  helpers.assert_close(out[1], want[1], atol=1e-5)
  helpers.assert_close(out[0, 3], np.zeros((4, 8)), atol=0)
  assert helpers.all_finite(
    jax.grad(
      lambda q: attn.affine_scaled_attention(
        q, k, v, mask=mask, alpha=alpha, alpha_ma=jnp.zeros((4,))
      )[0].sum()
    )(q)
  )


def test_affine_errors(key):
  q, k, v = _qkv(key)
  f = functools.partial(attn.affine_scaled_attention, q, k, v)
  with pytest.raises(ValueError, match=r"alpha must have shape \(2, 5, 4\)"):
    f(alpha=jnp.ones((2, 5)), alpha_ma=jnp.zeros(4))
  with pytest.raises(ValueError, match=r"alpha_ma must have shape \(4,\)"):
    f(alpha=jnp.ones((2, 5, 4)), alpha_ma=jnp.zeros(3))
  with pytest.raises(ValueError, match=r"rho must be in \[0, 1\]"):
    f(alpha=jnp.ones((2, 5, 4)), alpha_ma=jnp.zeros(4), rho=2.0)
  with pytest.raises(ValueError, match=r"query must be batched"):
    attn.affine_scaled_attention(
      q[0], k[0], v[0], alpha=jnp.ones((5, 4)), alpha_ma=jnp.zeros(4)
    )


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.affine_scaled).


def test_affine_scaled_state_updates_and_eval(key):
  m = nn_attn.make_attention("affine_scaled", D, N, rngs=nnx.Rngs(0))
  x = _common.tokens(key)
  assert float(jnp.abs(m.core.alpha_ma[...]).max()) == 0.0
  m(x)
  alpha = attn.linear_clipping(
    jnp.einsum("btd,dn->btn", x, m.core.alpha_kernel[...])
  )
  helpers.assert_close(
    m.core.alpha_ma[...], 0.1 * alpha.mean(axis=(0, 1)), atol=1e-6
  )
  before = m.core.alpha_ma[...]
  m.eval()
  assert m.core.use_running_average
  m(x)
  helpers.assert_close(m.core.alpha_ma[...], before, atol=0)
  m.train()
  assert not m.core.use_running_average
  layer = nn_attn.make_attention(
    "affine_scaled", D, N, ema_axes="per_layer", rngs=nnx.Rngs(0)
  )
  assert layer.core.alpha_ma.shape == ()
  assert isinstance(m.core.alpha_ma, nn_attn.AffineScaleEMA)
