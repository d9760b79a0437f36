"""Degenerate inputs: all-zero rows and wrong ranks (issue 12, item 6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention as attn
from tests import helpers
from tests.attention import _common


def test_nala_all_zero_rows_have_finite_gradients(key):
  q, k, v = _common.qkv(key, t=6)
  q = q.at[0, 2].set(0.0)  # one token's query is zero in every head
  k = k.at[1, 3].set(0.0)
  grads = jax.jit(
    jax.grad(
      lambda q, k, v: jnp.sum(jnp.sin(attn.nala_attention(q, k, v))),
      (0, 1, 2),
    )
  )(q, k, v)
  assert all(helpers.all_finite(g) for g in grads)
  zero = jnp.zeros((3, 8))
  assert helpers.all_finite(
    jax.grad(lambda x: attn.nala_query_feature(x).sum())(zero)
  )
  # A zero query gives the zero feature, so its output is 0 (eps > 0).
  out = jax.jit(attn.nala_attention)(q, k, v)
  helpers.assert_close(out[0, 2], np.zeros((4, 8)), atol=0)


@pytest.mark.parametrize(
  "call,match",
  [
    (
      lambda: attn.nala_query_feature(jnp.float32(1.0)),
      "nala_query_feature: q must have rank >= 1",
    ),
    (
      lambda: attn.nala_key_feature(jnp.float32(1.0)),
      "nala_key_feature: k must have rank >= 1",
    ),
    (
      lambda: attn.softmax_off_by_one(jnp.float32(1.0)),
      "softmax_off_by_one: axis=-1 needs an input of rank >= 1",
    ),
    (
      lambda: attn.softmax_off_by_one(jnp.ones((2, 3)), axis=2),
      r"softmax_off_by_one: axis must be integers in \[-2, 2\)",
    ),
    (
      lambda: attn.gated_attention_output(jnp.float32(1.0), jnp.float32(1.0)),
      "gated_attention_output: attention_out must have rank >= 1",
    ),
    (
      lambda: attn.gaussian_kernel(jnp.ones(3), jnp.ones(3)),
      "gaussian_kernel: a must have rank >= 2",
    ),
    (
      lambda: attn.dot_product_attention(
        jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3))
      ),
      "dot_product_attention: query must have rank 4",
    ),
    (lambda: attn.rope(jnp.ones((2, 3, 4))), "rope: x must have rank 4"),
    (
      lambda: attn.sinkhorn_weights(jnp.ones(3)),
      "sinkhorn_weights: logits must have rank >= 2",
    ),
    (
      lambda: attn.causal_sinkhorn_weights(jnp.ones(3)),
      "causal_sinkhorn_weights: logits must have rank >= 2",
    ),
    (
      lambda: attn.mxfp4_quantize(jnp.float32(1.0)),
      "mxfp4_quantize: axis=-1 needs an input of rank >= 1",
    ),
    (
      lambda: attn.newton_inverse(jnp.ones(3)),
      "newton_inverse: a must have rank >= 2",
    ),
  ],
)
def test_wrong_rank_raises_named_value_error(call, match):
  with pytest.raises(ValueError, match=match):
    call()
