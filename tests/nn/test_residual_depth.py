"""DeepNorm, KEEL, depth-muP and CompleteP through `make_residual`, against
NumPy float64 transcriptions of their stacks (RMSNorm with unit gain at
init), DeepNorm's init gain, and the scan refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import residual as nn_res
from tests import helpers

D, LAYERS = 8, 2


class Linear(nnx.Module):
  """Bias-free ``tanh(x @ w)`` branch (a nonlinear sublayer)."""

  def __init__(self, w):
    self.w = nnx.Param(jnp.asarray(w, jnp.float32))

  def __call__(self, x):
    return jnp.tanh(x @ self.w[...].astype(x.dtype))


def _weights(seed=0):
  keys = jax.random.split(jax.random.key(seed), 2 * LAYERS)
  return [np.asarray(jax.random.normal(k, (D, D))) / np.sqrt(D) for k in keys]


def _blocks(weights):
  return [Linear(w) for w in weights]


def _rms64(x, eps=1e-6):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def _x():
  return jax.random.normal(jax.random.key(7), (2, 3, D))


def _run(name, weights, **kwargs):
  net = nn_res.make_residual(
    name,
    _blocks(weights),
    num_features=D,
    rngs=nnx.Rngs(0),
    norm="rmsnorm",
    **kwargs,
  )
  return net, net(_x())


def _f64(w):
  w = np.asarray(w, np.float64)
  return lambda h: np.tanh(h @ w)


def test_deepnorm_stack_and_init_gain():
  weights = _weights()
  net, got = _run("deepnorm", weights)
  alpha, beta = (2 * LAYERS) ** 0.25, (8 * LAYERS) ** -0.25
  # The branch matrices were scaled by beta in place, once.
  for block, w in zip(net.blocks, weights):
    helpers.assert_close(block.w[...], beta * w, atol=1e-6)
  x = np.asarray(_x(), np.float64)
  for w in weights:
    x = _rms64(alpha * x + _f64(beta * w)(x))
  helpers.assert_close(got, x, atol=2e-5)
  # init_gain=False: the sublayers keep their init.
  net, got = _run("deepnorm", weights, init_gain=False)
  helpers.assert_close(net.blocks[0].w[...], weights[0], atol=1e-7)
  x = np.asarray(_x(), np.float64)
  for w in weights:
    x = _rms64(alpha * x + _f64(w)(x))
  helpers.assert_close(got, x, atol=2e-5)


def test_keel_stack_wires_its_first_layer_apart():
  weights = _weights(1)
  net, got = _run("keel", weights)
  x = np.asarray(_x(), np.float64)
  f = [_f64(w) for w in weights]
  x = x + f[0](_rms64(x))  # Layer 0, attention: pre-norm.
  x = _rms64(x + f[1](_rms64(x)))  # Layer 0, MLP: post-norm, alpha 1.
  for k in (2, 3):  # Later sublayers: alpha = 2L.
    x = _rms64(2 * LAYERS * x + f[k](_rms64(x)))
  helpers.assert_close(got, x, atol=2e-5)
  kinds = [type(s).__name__ for s in net.steps]
  assert kinds == ["PreNormResidual"] + ["ScaledPostNormResidual"] * 3
  assert [s.alpha for s in net.steps[1:]] == [1.0, 4.0, 4.0]


@pytest.mark.parametrize("name", ["depth_mup", "completep"])
@pytest.mark.parametrize("base_depth", [None, 2])
def test_depth_scaled_stacks(name, base_depth):
  weights = _weights(2)
  extra = {} if base_depth is None else {"base_depth": base_depth}
  _, got = _run(name, weights, **extra)
  exponent = {"depth_mup": 0.5, "completep": 1.0}[name]
  # The spec's default base depth is DepthBench's 24 (it was 1 before the
  # recipe was fixed to the official code, issue 27), so a 2-layer stack
  # weights its branches (2 / 24)^(-e) > 1.
  scale = (LAYERS / (base_depth or 24)) ** -exponent
  x = np.asarray(_x(), np.float64)
  for w in weights:
    x = x + scale * _f64(w)(_rms64(x))
  helpers.assert_close(got, x, atol=2e-5)


def test_scale_branch_init_spares_query_key_and_vectors():
  attn = nn_attention.MultiHeadAttention(
    D, 2, use_bias=True, is_causal=True, rngs=nnx.Rngs(0)
  )
  before = jax.tree.map(np.asarray, nnx.state(attn, nnx.Param))
  nn_res.scale_branch_init([attn, jnp.tanh], 0.5)
  after = nnx.state(attn, nnx.Param)
  for name in ("q_kernel", "k_kernel", "q_bias", "v_bias", "out_bias"):
    helpers.assert_close(after[name][...], before[name][...], atol=0)
  for name in ("v_kernel", "out_kernel"):
    helpers.assert_close(after[name][...], 0.5 * before[name][...], atol=0)
  assert set(nn_res.QUERY_KEY) == {"q_kernel", "k_kernel"}


def test_scan_builder_refuses_keel_and_init_gain():
  with pytest.raises(
    ValueError,
    match=r"make_residual_step: residual scheme 'keel' wires its first "
    r"layer differently from the others; valid names are prenorm",
  ):
    nn_res.make_residual_step(
      "keel", D, layer_index=0, num_layers=2, rngs=nnx.Rngs(0)
    )
  with pytest.raises(
    ValueError, match=r"make_residual_step: init_gain scales the sublayers'"
  ):
    nn_res.make_residual_step(
      "deepnorm",
      D,
      layer_index=0,
      num_layers=2,
      rngs=nnx.Rngs(0),
      init_gain=True,
    )
  # Without init_gain, a DeepNorm layer uses alpha of the whole stack.
  layer = nn_res.make_residual_step(
    "deepnorm", D, layer_index=1, num_layers=6, rngs=nnx.Rngs(0)
  )
  assert [s.alpha for s in layer.steps] == [R.deepnorm_alpha(6)] * 2


def test_scaled_post_norm_module_errors():
  with pytest.raises(
    ValueError, match=r"ScaledPostNormResidual: alpha must be a positive"
  ):
    nn_res.ScaledPostNormResidual(D, alpha=-1.0, rngs=nnx.Rngs(0))
