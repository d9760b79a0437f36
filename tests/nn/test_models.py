"""Models read the part specs: defaults, accepted parts and refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import decay, model_registry, models
from jaxnorm.nn import norms as nn_norms

TINY = dict(
  vocab_size=32, width=16, depth=1, num_heads=2, max_len=8, mlp_ratio=2
)
IMAGES = dict(num_classes=3, image_shape=(4, 4, 1), width=16, depth=2)


def _lm(**kw):
  return models.DecoderLM(models.LMConfig(**{**TINY, **kw}), rngs=nnx.Rngs(0))


def test_registries_follow_the_specs():
  norms, attentions = nn_norms.NORMS, nn_attention.ATTENTIONS
  lm = model_registry.registries("lm")
  opt_in = model_registry.registries("lm", allow_batch_stats=True)
  vit, cnn = model_registry.registries("vit"), model_registry.registries("cnn")
  for name, spec in norms.items():
    real = spec.dtype_kind == "real"  # The models are real-valued.
    tokens = "tokens" in spec.layouts and real
    assert (name in lm["norm"]) == (
      tokens and spec.causal and not spec.batch_stats
    ), name
    assert (name in opt_in["norm"]) == (tokens and spec.causal), name
    assert (name in vit["norm"]) == tokens, name
    assert (name in cnn["norm"]) == ("images" in spec.layouts and real), name
  for name, spec in attentions.items():
    tokens = spec.dtype_kind == "real" and "tokens" in spec.layouts
    assert (name in lm["attention"]) == (spec.causal and tokens), name
    assert (name in vit["attention"]) == tokens, name
  # Known capabilities, as a check on the specs themselves.
  assert {"rmsnorm", "layernorm"} <= set(lm["norm"])
  assert "batchnorm" not in lm["norm"] and "batchnorm" in opt_in["norm"]
  assert {"soft", "nala", "lina"}.isdisjoint(lm["attention"])
  assert {"softmax", "causal_linear"} <= set(lm["attention"])
  assert "regionnorml" in cnn["norm"] and "regionnorml" not in vit["norm"]
  assert "timestepdecaynorm" in lm["norm"]
  assert "timestepdecaynorm" not in cnn["norm"]
  mlp = model_registry.registries("mlp")
  assert mlp["norm"] == tuple(sorted(norms))
  assert cnn["attention"] == tuple(sorted(attentions))  # CNN: unused.
  for parts in (lm, vit, cnn, mlp):
    assert all(parts[k] == tuple(sorted(parts[k])) for k in parts)


def test_lm_refusals_name_reason_and_alternatives():
  valid_norms = ", ".join(model_registry.registries("lm")["norm"])
  with pytest.raises(
    ValueError,
    match=r"DecoderLM: norm 'batchnorm' takes batch statistics in training "
    r"mode .*set allow_batch_stats=True in the config to accept this; "
    rf"choose one of {valid_norms}",
  ):
    _lm(norm="batchnorm")
  with pytest.raises(
    ValueError, match=r"DecoderLM: unknown norm 'nonorm'; valid names are"
  ):
    _lm(norm="nonorm")
  with pytest.raises(
    ValueError, match=r"DecoderLM: unknown attention 'flash'; valid names"
  ):
    _lm(attention="flash")
  with pytest.raises(
    ValueError,
    match=r"make_residual: norm='none' \(no norm\) needs a scheme that runs "
    r"without one, got 'postnorm'; choose one of prenorm, scaled",
  ):
    _lm(norm="none", residual="postnorm")
  lm = _lm(norm="batchnorm", allow_batch_stats=True)
  assert isinstance(lm.final_norm, nn_norms.BatchNorm)


def test_vit_and_cnn_refuse_layouts():
  with pytest.raises(
    ValueError,
    match=r"ViT: norm 'regionnorml' does not normalize the tokens layout "
    r"\(it supports images\); choose one of",
  ):
    models.ViT(models.ViTConfig(norm="regionnorml"), rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError,
    match=r"CNN: norm 'timestepdecaynorm' does not normalize the images",
  ):
    models.CNN(models.CNNConfig(norm="timestepdecaynorm"), rngs=nnx.Rngs(0))


def test_norm_free_lm_is_x_plus_f_x():
  lm = _lm(norm="none")
  assert lm.final_norm is None
  params = nnx.state(lm, nnx.Param)
  names = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(params)}
  assert not any("norm" in n for n in names)
  tokens = jnp.arange(8)[None] % TINY["vocab_size"]
  x = jnp.take(lm.embed[...], tokens, axis=0) + lm.pos[...][None, :8]
  attn, mlp = lm.net.blocks[0], lm.net.blocks[1]
  h = x + attn(x)
  h = h + mlp(h)
  want = h @ lm.embed[...].T
  np.testing.assert_allclose(lm(tokens), want, atol=1e-5)


def test_config_kwargs_reach_the_parts():
  lm = _lm(
    attention="gated",
    attention_kwargs=(("headwise", True),),
    norm="layernorm",
    norm_kwargs=(("use_bias", False),),
  )
  attn = lm.net.blocks[0]
  assert attn.core.gate_kernel.shape == (16, 2, 1)
  assert lm.final_norm.bias is None
  vit = models.ViT(
    models.ViTConfig(
      **IMAGES, patch_size=2, num_heads=2, norm="rmsnorm", attention="lina"
    ),
    rngs=nnx.Rngs(0),
  )
  # The spec's default: static gates over CLS + 4 patches.
  assert vit.net.blocks[0].core.key_gate.shape == (5, 2)
  soft = models.ViT(
    models.ViTConfig(**IMAGES, patch_size=2, num_heads=2, attention="soft"),
    rngs=nnx.Rngs(0),
  )
  assert soft.net.blocks[0].core.ratio == 1  # 5 tokens: windows of 1.
  images = jax.random.uniform(jax.random.key(0), (2, 4, 4, 1))
  assert soft(images).shape == (2, 3)
  cnn = models.CNN(
    models.CNNConfig(
      **IMAGES, norm="groupnorm", norm_kwargs=(("num_groups", 4),)
    ),
    rngs=nnx.Rngs(0),
  )
  assert cnn.final_norm.num_groups == 4
  # The norm spec's width default: 32 groups -> gcd(16, 32) = 16.
  default = models.CNN(
    models.CNNConfig(**IMAGES, norm="groupnorm"), rngs=nnx.Rngs(0)
  )
  assert default.final_norm.num_groups == 16


@pytest.mark.parametrize("residual", ["lns", "rezero", "mhc"])
def test_residual_defaults_from_the_scheme(residual):
  lm = _lm(residual=residual, depth=2)
  tokens = jnp.arange(8)[None] % TINY["vocab_size"]
  assert np.all(np.isfinite(np.asarray(lm(tokens))))
  params = {
    ".".join(map(str, p))
    for p, _ in nnx.to_flat_state(nnx.state(lm.net, nnx.Param))
  }
  has_norm = any("norm" in p for p in params)
  assert has_norm == (residual != "rezero")  # ReZero's branch has no norm.
  if residual == "lns":  # 1/sqrt(l) per layer: two sublayers per layer.
    steps = lm.net.steps
    assert [s.layer_index for s in steps] == [0, 0, 1, 1]


# ---------------------------------------------------------------------------
# Per-layer hidden states and the DepthBench schemes.


@nnx.jit
def _with_hidden(lm, tokens):
  return lm(tokens), lm(tokens, return_hidden=True)


@pytest.mark.parametrize(
  "residual", ["prenorm", "deepnorm", "keel", "depth_mup", "completep"]
)
def test_lm_returns_hidden_states_per_layer(residual):
  # The DepthBench schemes plug in by name, with no model change.
  lm = _lm(residual=residual, depth=3)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 32)
  logits, (again, hidden) = _with_hidden(lm, tokens)
  assert hidden.shape == (4, 2, 8, 16)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(logits))
  embed = lm.embed[...][tokens] + lm.pos[...][None, :8]
  np.testing.assert_allclose(hidden[0], embed, atol=1e-6)
  # The last state is the stream the final norm and tied head read.
  head = lm.final_norm(hidden[-1]) @ lm.embed[...].T
  np.testing.assert_allclose(head, logits, atol=1e-5)
  # Each state is the stream after a layer's MLP sublayer.
  _, per_sublayer = lm.net(embed, return_hidden=True)
  np.testing.assert_allclose(hidden[1:], per_sublayer[1::2], atol=1e-5)


def test_norm_free_stack_is_chosen_by_the_residual_registry():
  lm = _lm(norm="none", residual="scaled", depth=2)
  assert lm.final_norm is None
  x = jax.random.normal(jax.random.key(1), (2, 8, 16))
  # scaled (1/n) without norm: x + f(x) / 4 per sublayer.
  want = x
  for block in lm.net.blocks:
    want = want + block(want) / 4
  np.testing.assert_allclose(lm.net(x), want, atol=1e-5)


def test_embed_scale_multiplies_the_embedding_by_a_learned_sqrt_width():
  # DyT's LLaMA recipe: x = s * E[t], s learnable from sqrt(d); the tied
  # head reads the unscaled table. With s = 1 the model is the plain one.
  config = models.LMConfig(**TINY, norm="none", positional="none")
  plain = models.DecoderLM(config, rngs=nnx.Rngs(0))
  scaled = models.DecoderLM(
    models.LMConfig(**TINY, norm="none", positional="none", embed_scale=True),
    rngs=nnx.Rngs(0),
  )
  assert scaled.embed_scale[...] == pytest.approx(np.sqrt(TINY["width"]))
  assert decay.decay_mask(scaled)["embed_scale"] is False
  tokens = jnp.arange(6, dtype=jnp.int32).reshape(1, 6)
  assert not np.allclose(scaled(tokens), plain(tokens))
  scaled.embed_scale[...] = jnp.ones_like(scaled.embed_scale[...])
  np.testing.assert_allclose(scaled(tokens), plain(tokens), atol=1e-6)
