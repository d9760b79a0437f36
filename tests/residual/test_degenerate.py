"""Every residual function with a norm or a division: all-zero rows give
finite values and gradients; inputs of too low a rank raise an error that
names the function and the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import residual as R
from tests import helpers

# ---------------------------------------------------------------------------
# Degenerate inputs: every function with a norm or a division.


def _degenerate_cases():
  n, d = 4, 8
  alpha, beta = R.hc_static_init(n, 1)
  b_pre, b_post, b_res = R.mhc_static_init(n)
  rng = np.random.RandomState(0)
  phi = lambda out: jnp.asarray(0.1 * rng.randn(n * d, out), jnp.float32)  # noqa

  def hc(h):
    return R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=phi(n + 1)[:d],
      dynamic_beta=phi(1)[:d, 0],
    )

  def mhc(h, residual="sinkhorn"):
    out, bias = {"sinkhorn": (n * n, b_res), "quaternion": (8, None)}[residual]
    if bias is None:
      bias = R.mhc_static_init(n, residual="quaternion")[2]
    return R.mhc_maps(
      h,
      phi_pre=phi(n),
      phi_post=phi(n),
      phi_res=phi(out),
      b_pre=b_pre,
      b_post=b_post,
      b_res=bias,
      residual=residual,
    )

  return {
    "hc_maps": (hc, (3, n, d)),
    "mhc_maps": (mhc, (3, n, d)),
    "ohc_maps": (lambda h: mhc(h, "quaternion"), (3, n, d)),
    "quaternion_rotation": (lambda p: R.quaternion_rotation(p, p), (3, 4)),
    "attn_res": (lambda v: R.attn_res(v, jnp.ones(d)), (3, 2, d)),
    "reduce_streams": (
      lambda h: R.reduce_streams(h, readout="mean"),
      (3, n, d),
    ),
    "sinkhorn_knopp": (
      lambda z: R.sinkhorn_knopp(z, log_domain=False, eps=1e-6),
      (3, n, n),
    ),
  }


DEGENERATE = _degenerate_cases()


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_all_zero_rows_give_finite_values_and_gradients(name, key):
  fn, shape = DEGENERATE[name]
  x = jax.random.normal(key, shape).at[0].set(0.0)  # One all-zero row.

  def loss(x):
    return sum(jnp.sum(jnp.tanh(t)) for t in jax.tree.leaves(fn(x)))

  value, grad = jax.value_and_grad(loss)(x)
  assert helpers.all_finite((value, grad)), name
  assert helpers.all_finite(jax.grad(loss)(jnp.zeros(shape))), name


WRONG_RANK = {
  "expand_streams": (lambda: R.expand_streams(jnp.float32(1.0), 2), "x"),
  "reduce_streams": (lambda: R.reduce_streams(jnp.ones(4)), "h"),
  "hyper_connection": (
    lambda: R.hyper_connection(
      jnp.ones(4),
      jnp.tanh,
      h_pre=jnp.ones(4),
      h_post=jnp.ones(4),
      h_res=jnp.eye(4),
    ),
    "h",
  ),
  "hc_maps": (
    lambda: R.hc_maps(
      jnp.ones(4), static_alpha=jnp.ones((1, 2)), static_beta=jnp.ones(1)
    ),
    "h",
  ),
  "mhc_maps": (
    lambda: R.mhc_maps(
      jnp.ones(4),
      phi_pre=None,
      phi_post=None,
      phi_res=None,
      b_pre=jnp.ones(1),
      b_post=jnp.ones(1),
      b_res=None,
      residual="identity",
    ),
    "h",
  ),
  "sinkhorn_knopp": (lambda: R.sinkhorn_knopp(jnp.ones(4)), "logits"),
  "quaternion_left_matrix": (
    lambda: R.quaternion_left_matrix(jnp.float32(1.0)),
    "p",
  ),
  "quaternion_rotation": (
    lambda: R.quaternion_rotation(jnp.float32(1.0), jnp.float32(1.0)),
    "p",
  ),
  "scaled_residual": (
    lambda: R.scaled_residual(jnp.float32(1.0), jnp.tanh, 0.5),
    "x",
  ),
  "attn_res_weights": (
    lambda: R.attn_res_weights(jnp.ones(4), jnp.ones(4)),
    "sources",
  ),
}


@pytest.mark.parametrize("name", sorted(WRONG_RANK))
def test_wrong_rank_raises_a_named_error(name):
  call, arg = WRONG_RANK[name]
  with pytest.raises(ValueError, match=rf"^{name}: {arg} must have rank >= "):
    call()
