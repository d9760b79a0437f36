"""Every causal form: changing only the last token leaves earlier outputs.

Issue 12, item 1. Each case changes the last token's query, key, value (and
its per-token inputs such as Affine-Scaled's alpha) and checks that outputs
at every earlier position are unchanged, in float32. Negative controls show
that the non-causal variants do leak, so the check can fail.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention as attn
from tests.attention import _common

T = 20  # < 32: every token shares one MX block along the sequence


@pytest.fixture(scope="module")
def inputs():
  q, k, v = _common.qkv(jax.random.key(0), t=T, s=T, n=4, k=2, h=16)
  alpha = jax.random.uniform(jax.random.key(1), (2, T, 4))
  kq, kk, kv, ka = jax.random.split(jax.random.key(2), 4)
  q2 = q.at[:, -1].set(10.0 * jax.random.normal(kq, q[:, -1].shape))
  k2 = k.at[:, -1].set(10.0 * jax.random.normal(kk, k[:, -1].shape))
  v2 = v.at[:, -1].set(10.0 * jax.random.normal(kv, v[:, -1].shape))
  alpha2 = alpha.at[:, -1].set(jax.random.uniform(ka, alpha[:, -1].shape))
  return (q, k, v, alpha), (q2, k2, v2, alpha2)


def _affine(q, k, v, alpha, training):
  out, _ = attn.affine_scaled_attention(
    q,
    k,
    v,
    alpha=alpha,
    alpha_ma=jnp.full((4,), 0.3),
    is_causal=True,
    training=training,
  )
  return out


CAUSAL = {
  "softmax": lambda q, k, v, a: attn.dot_product_attention(
    q, k, v, is_causal=True
  ),
  "softmax_window_softcap": lambda q, k, v, a: attn.dot_product_attention(
    q, k, v, is_causal=True, local_window_size=(3, 0), logits_soft_cap=2.0
  ),
  "sink": lambda q, k, v, a: attn.sink_attention(
    q, k, v, is_causal=True, sinks=jnp.linspace(-1.0, 1.0, 4)
  ),
  "affine_train": lambda q, k, v, a: _affine(q, k, v, a, True),
  "affine_eval": lambda q, k, v, a: _affine(q, k, v, a, False),
  "linear_chunked": lambda q, k, v, a: attn.causal_linear_attention(
    q, k, v, chunk_size=8
  ),
  "linear_quadratic": lambda q, k, v, a: attn.causal_linear_attention(
    q, k, v, algorithm="quadratic"
  ),
  "mxfp4": lambda q, k, v, a: attn.mxfp4_attention(q, k, v, is_causal=True),
  "mxfp4_direct": lambda q, k, v, a: attn.mxfp4_attention(
    q, k, v, is_causal=True, p_quant="direct", hadamard="plain"
  ),
  "sinkhorn": lambda q, k, v, a: attn.sinkhorn_attention(
    q, k, v, is_causal=True, num_iters=20
  ),
}


def _leak(fn, inputs):
  before, after = inputs
  y1, y2 = jax.jit(fn)(*before), jax.jit(fn)(*after)
  assert np.abs(np.asarray(y1[:, -1] - y2[:, -1])).max() > 1e-3  # it changed
  return float(np.abs(np.asarray(y1[:, :-1] - y2[:, :-1])).max())


@pytest.mark.parametrize("name", list(CAUSAL))
def test_last_token_does_not_reach_earlier_outputs(name, inputs):
  assert _leak(CAUSAL[name], inputs) <= 1e-6


LEAKY = {
  # V blocked along the sequence: one shared scale for all 20 tokens.
  "mxfp4_value_blocks_keys": lambda q, k, v, a: attn.mxfp4_attention(
    q, k, v, is_causal=True, value_blocks="keys"
  ),
  # Balanced Sinkhorn under a causal mask: columns sum over later queries.
  "sinkhorn_masked_balanced": lambda q, k, v, a: jnp.einsum(
    "bnts,bsnh->btnh",
    attn.sinkhorn_weights(
      jnp.einsum("btnh,bsnh->bnts", q, jnp.repeat(k, 2, 2)) / 4.0,
      jnp.tril(jnp.ones((1, 1, T, T), bool)),
    ),
    jnp.repeat(v, 2, 2),
  ),
}


@pytest.mark.parametrize("name", list(LEAKY))
def test_non_causal_variants_do_leak(name, inputs):
  assert _leak(LEAKY[name], inputs) > 1e-3


def test_causal_sinkhorn_keeps_off_diagonal_mass():
  lg = jax.random.normal(jax.random.key(3), (2, 12, 12)) * 2.0
  tri = jnp.tril(jnp.ones((1, 12, 12), bool))
  diag = functools.partial(jnp.diagonal, axis1=-2, axis2=-1)
  causal_fn = jax.jit(attn.causal_sinkhorn_weights, static_argnames="num_iters")
  w = causal_fn(lg, num_iters=50)
  causal = diag(w)[:, 1:]
  balanced_fn = jax.jit(attn.sinkhorn_weights, static_argnames="num_iters")
  balanced = diag(balanced_fn(lg, tri, num_iters=50))[:, 1:]
  # Balanced marginals collapse toward the identity; the prefix plan with
  # uniform-attention column masses does not.
  assert float(jnp.mean(balanced)) > 0.8
  assert float(jnp.mean(causal)) < 0.4
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0
  # Zero iterations is causal softmax; equal logits stay uniform.
  np.testing.assert_allclose(
    causal_fn(lg, num_iters=0),
    jax.nn.softmax(jnp.where(tri, lg, -jnp.inf), -1),
    atol=1e-6,
  )
  uniform = np.tril(np.ones((12, 12))) / np.arange(1, 13)[:, None]
  np.testing.assert_allclose(
    causal_fn(jnp.zeros((2, 12, 12)), num_iters=30)[0],
    uniform,
    atol=1e-6,
  )


def test_causal_sinkhorn_prefix_oracle():
  """Row t equals row t of the NumPy float64 prefix problem."""
  lg = np.asarray(jax.random.normal(jax.random.key(4), (5, 5)), np.float64)
  w = np.asarray(attn.causal_sinkhorn_weights(jnp.asarray(lg), num_iters=30))
  for t in range(5):
    g = np.where(
      np.tril(np.ones((t + 1, t + 1))) > 0, np.exp(lg[: t + 1, : t + 1]), 0
    )
    col = (np.tril(np.ones((t + 1, t + 1))) / np.arange(1, t + 2)[:, None]).sum(
      0
    )
    c = np.ones(t + 1)
    for _ in range(30):
      r = 1.0 / (g @ c)
      c = col / (g.T @ r)
    r = 1.0 / (g @ c)
    plan = r[:, None] * g * c[None, :]
    np.testing.assert_allclose(w[t, : t + 1], plan[t], atol=1e-5)
    np.testing.assert_allclose(w[t, t + 1 :], 0.0, atol=0)


def test_mxfp4_causal_value_blocks_and_errors(inputs):
  (q, k, v, _), _ = inputs
  f = jax.jit(
    functools.partial(attn.mxfp4_attention, is_causal=True),
    static_argnames="value_blocks",
  )
  per_token = f(q, k, v)
  np.testing.assert_array_equal(per_token, f(q, k, v, value_blocks="features"))
  keys = f(q, k, v, value_blocks="keys")
  assert float(jnp.abs(per_token - keys).max()) > 0
  with pytest.raises(ValueError, match="value_blocks must be one of"):
    attn.mxfp4_attention(q, k, v, value_blocks="tokens")
