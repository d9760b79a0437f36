"""Registry-driven tests of the ``images`` attentions (ELA, PSA) as layers.

Parametrized over `IMAGE_ATTENTIONS`, so an image attention added to the
registry is covered with no edit here: built by `make_image_attention` on
odd NHWC maps, finite values and gradients at the extremes, jit equals
eager, weight decay from the spec, and one training step inside the CNN
(``block_attention``); plus the refusals of the wrong layout. The pure
functions and their oracles are in tests/attention/test_ela.py and
test_psa.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm.nn import attention as nn_attn
from jaxnorm.nn import decay, models, registry
from tests import helpers

# Channels every preset accepts (ELA-T's GroupNorm has 32 groups; PSA_s
# needs C >= 8), on an odd 5x7 map.
C = 32
SHAPE = (2, 5, 7, C)
IMAGES = nn_attn.IMAGE_ATTENTIONS
REAL_TOKENS = tuple(
  n
  for n in nn_attn.TOKEN_ATTENTIONS
  if nn_attn.ATTENTIONS[n].dtype_kind == "real"
)


def _layer(name, seed=0):
  return nn_attn.make_image_attention(name, C, rngs=nnx.Rngs(seed))


def _params(model):
  """Parameter path -> NumPy copy of its value."""
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return {p: np.array(v[...]) for p, v in flat}


def test_image_specs_state_the_layout():
  assert IMAGES == ("ela", "psa")
  for name in IMAGES:
    spec = nn_attn.ATTENTIONS[name]
    assert spec.layouts == frozenset({"images"}), name
    assert not spec.causal and not spec.takes_mask, name
    assert not issubclass(spec.core, nn_attn.AttentionCore), name
  assert set(IMAGES).isdisjoint(nn_attn.TOKEN_ATTENTIONS)


@pytest.mark.parametrize("name", IMAGES)
def test_keeps_the_shape_of_odd_maps(key, name):
  x = jax.random.normal(key, SHAPE)
  y = _layer(name)(x)
  assert y.shape == x.shape and y.dtype == x.dtype
  assert helpers.all_finite(y)


@pytest.mark.parametrize("scale", [0.0, 1e4])
@pytest.mark.parametrize("name", IMAGES)
def test_finite_values_and_gradients(key, name, scale):
  """All-zero maps and maps of size ~1e4: finite output and gradients."""
  kx, kc = jax.random.split(key)
  x = scale * jax.random.normal(kx, SHAPE)
  cot = jax.random.normal(kc, SHAPE)
  m = _layer(name)
  y = m(x)
  assert helpers.all_finite(y)

  def loss(m, x):
    return jnp.sum(m(x) * cot)

  g_params, g_x = nnx.grad(loss, argnums=(0, 1))(m, x)
  assert helpers.all_finite(nnx.state(g_params)) and helpers.all_finite(g_x)


@pytest.mark.parametrize("name", IMAGES)
def test_jit_matches_eager(key, name):
  m = _layer(name)
  x = jax.random.normal(key, SHAPE)
  helpers.assert_close(nnx.jit(lambda m, x: m(x))(m, x), m(x), atol=1e-5)


@pytest.mark.parametrize("name", IMAGES)
def test_decay_mask_follows_the_spec(name):
  m = _layer(name)
  override = nn_attn.ATTENTIONS[name].decay
  mask = dict(nnx.to_flat_state(decay.decay_mask(m)))
  params = nnx.to_flat_state(nnx.state(m, nnx.Param))
  assert set(mask) == {p for p, _ in params}
  for path, p in params:
    want = registry.decays(path[-1], p.ndim, override)
    assert mask[path] is want, (name, path)


@pytest.mark.slow
@pytest.mark.parametrize("name", IMAGES)
def test_one_training_step_in_the_cnn(key, name):
  """A finite loss, and the attention's parameters move after one step."""
  config = models.CNNConfig(
    num_classes=3, image_shape=(5, 7, 1), width=C, depth=2
  )
  model = models.CNN(
    dataclasses.replace(config, block_attention=name), rngs=nnx.Rngs(0)
  )
  core = nn_attn.ATTENTIONS[name].core
  layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, core)]
  assert len(layers) == config.depth  # One per ConvBlock.
  plain = models.CNN(config, rngs=nnx.Rngs(0))  # block_attention="none".
  before = _params(model)
  attn_paths = {p for p in before if "attn" in p}
  assert attn_paths and set(_params(plain)) == set(before) - attn_paths
  kx, ky = jax.random.split(key)
  images = jax.random.normal(kx, (4, 5, 7, 1))
  labels = jax.random.randint(ky, (4,), 0, 3)

  def loss_fn(model):
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(
      logits, labels
    ).mean()

  opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  loss, grads = nnx.value_and_grad(loss_fn)(model)
  with jax.numpy_dtype_promotion("standard"):  # optax's int step count.
    opt.update(model, grads)
  assert np.isfinite(float(loss))
  after = _params(model)
  for path in attn_paths:
    assert not np.array_equal(after[path], before[path]), path


@pytest.mark.parametrize("attention", REAL_TOKENS)
def test_cnn_refuses_a_token_attention(attention):
  with pytest.raises(
    ValueError,
    match=rf"CNN: attention '{attention}' does not act on the images "
    rf"layout; choose one of {', '.join(sorted(IMAGES))}",
  ):
    models.CNN(models.CNNConfig(block_attention=attention), rngs=nnx.Rngs(0))


def test_cnn_refuses_an_unknown_attention():
  with pytest.raises(
    ValueError,
    match=rf"CNN: unknown attention 'flash'; valid names are "
    rf"{', '.join(sorted(IMAGES))}",
  ):
    models.CNN(models.CNNConfig(block_attention="flash"), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", IMAGES)
def test_token_builders_refuse_an_image_attention(name):
  match = rf"attention '{name}' acts on NHWC images, not on tokens; build it "
  match += rf"with make_image_attention\('{name}', channels"
  with pytest.raises(ValueError, match=rf"make_attention: {match}"):
    nn_attn.make_attention(name, 16, 2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=rf"MultiHeadAttention: {match}"):
    nn_attn.MultiHeadAttention(16, 2, attention=name, rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError, match=rf"ViT: attention '{name}' does not act on the tokens"
  ):
    models.ViT(models.ViTConfig(attention=name), rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
  ("name", "reason"),
  [
    ("softmax", r"a token attention: build it with make_attention"),
    ("flash", r"unknown attention"),
  ],
)
def test_make_image_attention_refuses_other_names(name, reason):
  with pytest.raises(
    ValueError,
    match=rf"make_image_attention: '{name}' is not an images attention "
    rf"\({reason}\); valid names are {', '.join(IMAGES)}",
  ):
    nn_attn.make_image_attention(name, C, rngs=nnx.Rngs(0))
