"""jaxnorm.residual.depth: DeepNorm, KEEL, depth-muP and CompleteP maths
against NumPy float64 transcriptions of their equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import residual as R
from tests import helpers
from tests.residual import _common as common

_rms = common.rms


def _rms64(x, eps=1e-6):
  """RMSNorm without a gain (eps inside the root), in float64."""
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


@pytest.mark.parametrize("num_layers", [1, 6, 24, 250])
def test_constants_match_the_papers_tables(num_layers):
  n = num_layers
  # DeepNet, decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4).
  np.testing.assert_allclose(R.deepnorm_alpha(n), (2 * n) ** 0.25, rtol=1e-15)
  np.testing.assert_allclose(R.deepnorm_beta(n), (8 * n) ** -0.25, rtol=1e-15)
  assert R.keel_alpha(n) == 2.0 * n
  np.testing.assert_allclose(R.depth_scale(n, 1, 0.5), n**-0.5, rtol=1e-15)
  np.testing.assert_allclose(R.depth_scale(n, 2, 1.0), 2 / n, rtol=1e-15)
  assert R.depth_scale(n, n, 0.5) == 1.0  # Multiplier 1 at the base depth.
  assert R.DEPTH_EXPONENTS == {"depth_mup": 0.5, "completep": 1.0}
  # Adam's hidden-parameter factors (L / L0)^(e - 1) and (L / L0)^(-e).
  for e in (0.5, 1.0):
    lr, eps = R.depth_adam_scales(n, 24, e)
    np.testing.assert_allclose(lr, (n / 24) ** (e - 1), rtol=1e-15)
    np.testing.assert_allclose(eps, (n / 24) ** -e, rtol=1e-15)
    # eps scales as the branch multiplier; lr times multiplier is 1/m.
    np.testing.assert_allclose(eps, R.depth_scale(n, 24, e), rtol=1e-15)
    np.testing.assert_allclose(lr * eps, 24 / n, rtol=1e-14)
  assert R.depth_adam_scales(n, n, 0.5) == (1.0, 1.0)
  assert R.BASE_DEPTH == 24  # DepthBench's --base-depth.


def test_deepnet_1000_layer_values():
  # Decoder-only constants at N = 1000 layers: 2000^(1/4), 8000^(-1/4).
  np.testing.assert_allclose(R.deepnorm_alpha(1000), 6.6874, atol=1e-4)
  np.testing.assert_allclose(R.deepnorm_beta(1000), 0.10574, atol=1e-5)
  assert R.num_layers_of(48, 2) == 24 and R.num_layers_of(5, 2) == 3


@pytest.mark.parametrize(
  "alpha, with_in", [(1.0, False), (2.63, False), (48.0, True)]
)
def test_scaled_post_norm_matches_equation(alpha, with_in):
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  w = jax.random.normal(jax.random.key(1), (8, 8)) / 3

  def f(h):
    return jnp.tanh(h @ w)

  got = R.scaled_post_norm(
    x, f, _rms, alpha=alpha, norm_in=_rms if with_in else None
  )
  x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
  branch_in = _rms64(x64) if with_in else x64
  want = _rms64(alpha * x64 + np.tanh(branch_in @ w64))
  helpers.assert_close(got, want, atol=2e-5)
  # alpha = 1, no input norm: the post-norm step.
  if alpha == 1.0 and not with_in:
    helpers.assert_close(got, R.post_norm(x, f, _rms), atol=1e-6)


def test_scaled_post_norm_keeps_bfloat16_and_jits():
  x = jax.random.normal(jax.random.key(0), (3, 8)).astype(jnp.bfloat16)
  fn = jax.jit(lambda x: R.scaled_post_norm(x, jnp.sin, _rms, alpha=4.0))
  y = fn(x)
  assert y.dtype == jnp.bfloat16 and y.shape == x.shape
  want = _rms64(
    4.0 * np.asarray(x, np.float64) + np.sin(np.asarray(x, np.float64))
  )
  helpers.assert_close(y, want, atol=0.05)


def test_errors_name_the_function_and_argument():
  x = jnp.ones((2, 4))
  with pytest.raises(
    ValueError, match=r"scaled_post_norm: alpha must be a positive"
  ):
    R.scaled_post_norm(x, jnp.sin, _rms, alpha=0.0)
  with pytest.raises(
    ValueError, match=r"scaled_post_norm: the sublayer must keep"
  ):
    R.scaled_post_norm(x, lambda h: h[:, :2], _rms, alpha=1.0)
  with pytest.raises(
    TypeError, match=r"scaled_post_norm: x must have a floating dtype"
  ):
    R.scaled_post_norm(jnp.ones((2, 4), jnp.int32), jnp.sin, _rms, alpha=1.0)
  for fn in (R.deepnorm_alpha, R.deepnorm_beta, R.keel_alpha):
    with pytest.raises(ValueError, match=rf"{fn.__name__}: num_layers must"):
      fn(0)
  with pytest.raises(ValueError, match=r"depth_scale: base_depth must"):
    R.depth_scale(4, 0, 0.5)
  with pytest.raises(
    ValueError, match=r"depth_scale: exponent must be a positive"
  ):
    R.depth_scale(4, 1, 0.0)
  with pytest.raises(ValueError, match=r"depth_adam_scales: num_layers must"):
    R.depth_adam_scales(0, 24, 0.5)
  with pytest.raises(ValueError, match=r"depth_adam_scales: base_depth must"):
    R.depth_adam_scales(4, 2.5, 0.5)
  with pytest.raises(
    ValueError, match=r"depth_adam_scales: exponent must be a positive"
  ):
    R.depth_adam_scales(4, 24, -1.0)
