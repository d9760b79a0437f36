"""Causal linear attention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import D, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = functools.partial(_common.qkv, t=6)


@pytest.mark.parametrize(
  "feature_map,chunk",
  [("elu_plus_one", 1), ("elu_plus_one", 4), ("relu", 5), ("identity", 64)],
)
def test_chunked_equals_quadratic(key, feature_map, chunk):
  q, k, v = _qkv(key, t=13, s=13)
  norm = feature_map != "identity"
  kw = dict(feature_map=feature_map, normalize=norm)
  fast = attn.causal_linear_attention(q, k, v, chunk_size=chunk, **kw)
  slow = attn.causal_linear_attention(q, k, v, algorithm="quadratic", **kw)
  helpers.assert_close(fast, slow, atol=1e-4)


def test_causal_linear_explicit_and_grad(key):
  q, k, v = _qkv(key, t=7, s=7, k=4)
  phi = lambda x: jax.nn.elu(x) + 1  # noqa
  w = jnp.einsum("btnh,bsnh->bnts", phi(q), phi(k))
  w = jnp.where(jnp.tril(jnp.ones((7, 7), bool)), w, 0)
  want = jnp.einsum("bnts,bsnh->btnh", w / (w.sum(-1, keepdims=True) + 1e-6), v)
  out = attn.causal_linear_attention(q, k, v, chunk_size=3)
  helpers.assert_close(out, want, atol=1e-5)
  f = jax.jit(
    lambda q, k, v: attn.causal_linear_attention(q, k, v, chunk_size=3)
  )
  g = jax.jit(
    lambda q, k, v: attn.causal_linear_attention(q, k, v, algorithm="quadratic")
  )
  helpers.assert_vjp_matches(f, g, (q, k, v), key=key, atol=1e-4)
  one = attn.causal_linear_attention(q[:, :1], k[:, :1], v[:, :1])
  helpers.assert_close(one, v[:, :1], atol=1e-5)
  with pytest.raises(ValueError, match=r"key must have the query's length"):
    attn.causal_linear_attention(q, k[:, :3], v[:, :3])
  with pytest.raises(ValueError, match=r"chunk_size must be a positive"):
    attn.causal_linear_attention(q, k, v, chunk_size=0)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.linear).


def test_causal_linear_module_matches_function(key):
  x = _common.tokens(key)
  cl = nn_attn.make_attention(
    "causal_linear", D, N, feature_map="relu", rngs=nnx.Rngs(0)
  )
  q, k, v = _common.project_qkv(cl, x)
  want = attn.causal_linear_attention(q, k, v, feature_map="relu")
  helpers.assert_close(cl(x), _common.project_out(cl, want), atol=1e-5)
