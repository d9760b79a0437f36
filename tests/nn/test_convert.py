"""Exact LM conversions (Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm) and FakeLN.

Claims of ``../shared/specs/norms.md`` sections 2 and 10, on tiny LMs
trained for a few dozen steps on Shakespeare bytes (with random non-trivial
LayerNorm gains and offsets before training), in float32 against the JAX
model and in float64 against the NumPy oracle `tests/oracles/lm_numpy.py`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import norms
from jaxnorm.nn import convert, fakeln, models
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import config as config_lib
from jaxnorm.training import data, trainer
from tests.helpers import assert_close
from tests.oracles import lm_numpy

# Trains tiny LMs before converting them: CI runs these (-m slow).
pytestmark = pytest.mark.slow

SEQ = 16


@pytest.fixture(autouse=True)
def standard_promotion():
  # optax mixes int counts with floats, which strict promotion rejects.
  with jax.numpy_dtype_promotion("standard"):
    yield


@functools.cache
def _corpus():
  return data.load_text("shakespeare")


def _batches(n, batch=8, seed=0):
  it = iter(
    data.text_windows(
      _corpus().train, SEQ, batch_size=batch, seed=seed
    ).to_iter_dataset()
  )
  return [jnp.asarray(next(it)) for _ in range(n)]


def _val():
  return jnp.asarray(
    data.eval_windows(_corpus().val, SEQ, batch_size=8, max_batches=1)[0]
  )


def _config(**kw):
  base = dict(
    vocab_size=256,
    width=16,
    depth=2,
    num_heads=2,
    max_len=SEQ,
    norm="layernorm",
    tie_embeddings=False,
    use_bias=True,
  )
  return models.LMConfig(**{**base, **kw})


def _loss(model, batch):
  logits = model(batch[:, :-1]).astype(jnp.float32)
  return jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
  )


def _train(model, batches, lr=3e-3):
  """Adam steps on ``model`` in place; returns the per-step losses."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adamw(lr, weight_decay=0.01)
  opt = tx.init(params)

  @jax.jit
  def step(params, rest, opt, batch):
    def loss_fn(p):
      m = nnx.merge(graphdef, p, rest, copy=True)
      return _loss(m, batch), nnx.state(m, nnx.Not(nnx.Param))

    (loss, rest), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, updates), rest, opt, loss

  losses = []
  for b in batches:
    params, rest, opt, loss = step(params, rest, opt, b)
    losses.append(float(loss))
  nnx.update(model, params, rest)
  return losses


def _perturb_norms(params, key, amount=0.3):
  """Random non-trivial LayerNorm gains and offsets (spec's check setup)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  leaves = []
  for i, (path, leaf) in enumerate(flat):
    names = [getattr(p, "key", None) for p in path]
    if "norm" in names or "final_norm" in names:
      noise = jax.random.normal(jax.random.fold_in(key, i), leaf.shape)
      leaf = leaf + amount * noise
    leaves.append(leaf)
  return jax.tree.unflatten(jax.tree.structure(params), leaves)


@functools.cache
def _trained(depth, width, heads, use_bias, tie=False, steps=25):
  cfg = _config(
    depth=depth,
    width=width,
    num_heads=heads,
    use_bias=use_bias,
    tie_embeddings=tie,
  )
  model = models.DecoderLM(cfg, rngs=nnx.Rngs(depth * 100 + width))
  params = _perturb_norms(convert.lm_params(model), jax.random.key(width))
  model = convert.load_lm(cfg, params)
  with jax.numpy_dtype_promotion("standard"):
    losses = _train(model, _batches(steps, seed=depth))
  assert losses[-1] < losses[0] - 0.5, losses  # It did learn.
  return cfg, convert.lm_params(model)


GRID = [(1, 16, 2, True), (2, 24, 3, False), (3, 8, 2, True)]


# ---------------------------------------------------------------------------
# Exactness on trained models.


@pytest.mark.parametrize("depth,width,heads,use_bias", GRID)
def test_three_variants_agree_float32(depth, width, heads, use_bias):
  cfg, params = _trained(depth, width, heads, use_bias)
  tokens = _val()[:, :-1]
  ref = convert.load_lm(cfg, params)(tokens)
  rms_p, rms_c = convert.to_pre_rmsnorm(params, cfg)
  crms_p, crms_c = convert.to_pre_crmsnorm(params, cfg)
  fold_p, fold_c = convert.fold_layer_norm_affine(params, cfg)
  assert rms_c.norm == "rmsnorm" and crms_c.norm == "crmsnorm"
  assert crms_c.width == width - 1
  for p, c in ((fold_p, fold_c), (rms_p, rms_c), (crms_p, crms_c)):
    out = convert.load_lm(c, p)(tokens)
    assert out.shape == ref.shape
    assert_close(out, ref, atol=1e-5)
  # Chained: Pre-RMSNorm -> Pre-CRMSNorm gives the same model.
  chain_p, chain_c = convert.to_pre_crmsnorm(rms_p, rms_c)
  assert chain_c == crms_c
  assert_close(chain_p, crms_p, atol=1e-6)


@pytest.mark.parametrize("depth,width,heads,use_bias", GRID)
def test_three_variants_agree_float64_numpy(depth, width, heads, use_bias):
  cfg, params = _trained(depth, width, heads, use_bias)
  p64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  tokens = np.asarray(_val()[:, :-1])
  ref = lm_numpy.lm_logits(p64, cfg, tokens)
  # The oracle is the JAX model's function (float32 tolerance).
  assert_close(convert.load_lm(cfg, params)(tokens), ref, atol=1e-4)
  rms_p, rms_c = convert.to_pre_rmsnorm(p64, cfg)
  crms_p, crms_c = convert.to_pre_crmsnorm(p64, cfg)
  for p, c in ((rms_p, rms_c), (crms_p, crms_c)):
    assert all(leaf.dtype == np.float64 for leaf in jax.tree.leaves(p))
    assert_close(lm_numpy.lm_logits(p, c, tokens), ref, atol=1e-10)
    assert_close(convert.load_lm(c, p)(tokens), ref, atol=1e-4)
  # Claim 2: after step 2 every token has zero mean at every layer.
  assert lm_numpy.stream_means(rms_p, rms_c, tokens) < 1e-12
  assert lm_numpy.stream_means(p64, cfg, tokens) > 1e-3


def test_tied_model_converts_after_untie():
  cfg, params = _trained(1, 16, 2, False, tie=True)
  tokens = _val()[:, :-1]
  ref = convert.load_lm(cfg, params)(tokens)
  with pytest.raises(ValueError, match="untie_embeddings"):
    convert.to_pre_rmsnorm(params, cfg)
  with pytest.raises(ValueError, match="ties its head"):
    convert.to_pre_crmsnorm(params, cfg)
  up, uc = convert.untie_embeddings(params, cfg)
  assert not uc.tie_embeddings and "head" in up
  assert convert.untie_embeddings(up, uc)[1] is uc
  assert_close(convert.load_lm(uc, up)(tokens), ref, atol=1e-6)
  p, c = convert.to_pre_crmsnorm(up, uc)
  assert_close(convert.load_lm(c, p)(tokens), ref, atol=1e-5)
  # use_bias models get a zero head bias.
  bp, bc = convert.untie_embeddings(
    params, dataclasses.replace(cfg, use_bias=True)
  )
  assert bc.use_bias and float(jnp.abs(bp["head"]["bias"]).max()) == 0.0


def test_rope_and_affine_free_layernorm_convert():
  cfg = _config(
    positional="rope",
    use_bias=False,
    norm_kwargs=(("use_scale", False), ("use_bias", False), ("eps", 1e-5)),
  )
  model = models.DecoderLM(cfg, rngs=nnx.Rngs(3))
  params = convert.lm_params(model)
  tokens = _val()[:, :-1]
  ref = model(tokens)
  p, c = convert.to_pre_crmsnorm(params, cfg)
  assert not c.use_bias and dict(c.norm_kwargs)["eps"] == 1e-5
  assert_close(convert.load_lm(c, p)(tokens), ref, atol=1e-5)


def test_zero_mean_rmsnorm_model_converts_to_crmsnorm():
  cfg = _config(norm="rmsnorm", zero_mean_writers=True)
  model = models.DecoderLM(cfg, rngs=nnx.Rngs(4))
  params = _perturb_norms(convert.lm_params(model), jax.random.key(4))
  tokens = _val()[:, :-1]
  ref = convert.load_lm(cfg, params)(tokens)
  p, c = convert.to_pre_crmsnorm(params, cfg)
  assert_close(convert.load_lm(c, p)(tokens), ref, atol=1e-5)


# ---------------------------------------------------------------------------
# Training equivalence (the re-parameterized Pre-RMSNorm form).


def test_pre_rmsnorm_trains_like_pre_ln():
  cfg = _config(
    depth=2, width=16, use_bias=True, norm_kwargs=(("use_bias", False),)
  )
  model = models.DecoderLM(cfg, rngs=nnx.Rngs(7))
  params = _perturb_norms(convert.lm_params(model), jax.random.key(7))
  rms_p, rms_c = convert.to_pre_rmsnorm(params, cfg, reparameterize=True)
  assert rms_c.zero_mean_writers and rms_c.norm == "rmsnorm"
  batches = _batches(20, seed=11)
  ln_model = convert.load_lm(cfg, params)
  rms_model = convert.load_lm(rms_c, rms_p)
  ln_losses = _train(ln_model, batches)
  rms_losses = _train(rms_model, batches)
  assert ln_losses[-1] < ln_losses[0] - 0.3
  np.testing.assert_allclose(rms_losses, ln_losses, atol=2e-5, rtol=0)
  # The free weights follow the same trajectory too.
  back = convert.lm_params(rms_model)
  after = convert.lm_params(ln_model)
  assert_close(back["embed"], after["embed"], atol=2e-4)
  # A model trained with stored-centered weights is a different model: the
  # plain (inference) conversion does not keep the parameterization.
  inf_p, _ = convert.to_pre_rmsnorm(*convert.untie_embeddings(params, cfg))
  assert float(jnp.abs(inf_p["embed"] - params["embed"]).max()) > 1e-3


# ---------------------------------------------------------------------------
# Refusals.


def test_unsupported_models_are_refused():
  cfg, params = _trained(1, 16, 2, True)
  with pytest.raises(ValueError, match="only pre-norm models"):
    convert.to_pre_rmsnorm(
      params, dataclasses.replace(cfg, residual="postnorm")
    )
  with pytest.raises(
    ValueError, match="must be one of layernorm, got norm='dyt'"
  ):
    convert.to_pre_rmsnorm(params, dataclasses.replace(cfg, norm="dyt"))
  with pytest.raises(
    ValueError, match="layernorm, rmsnorm, got norm='crmsnorm'"
  ):
    convert.to_pre_crmsnorm(params, dataclasses.replace(cfg, norm="crmsnorm"))
  with pytest.raises(ValueError, match="attention='gated'"):
    convert.center_writers(params, dataclasses.replace(cfg, attention="gated"))
  with pytest.raises(ValueError, match="must be a jaxnorm.nn.models.LMConfig"):
    convert.to_pre_rmsnorm(params, models.ViTConfig())
  with pytest.raises(ValueError, match=r"norm_kwargs \['eps_mode'\]"):
    convert.to_pre_rmsnorm(
      params, dataclasses.replace(cfg, norm_kwargs=(("eps_mode", "outside"),))
    )
  with pytest.raises(ValueError, match="RMSNorm has no bias"):
    convert.to_pre_rmsnorm(params, cfg, reparameterize=True)
  # An RMSNorm model whose stream is not zero-mean has no CRMSNorm form.
  rms_cfg = dataclasses.replace(cfg, norm="rmsnorm")
  rms_params = convert.lm_params(models.DecoderLM(rms_cfg, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="zero mean"):
    convert.to_pre_crmsnorm(rms_params, rms_cfg)
  one = models.LMConfig(
    vocab_size=5,
    width=1,
    depth=1,
    num_heads=1,
    max_len=4,
    norm="layernorm",
    tie_embeddings=False,
  )
  one_p = convert.lm_params(models.DecoderLM(one, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="width must be at least 2"):
    convert.to_pre_crmsnorm(one_p, one)


def test_load_lm_checks_the_tree():
  cfg, params = _trained(1, 16, 2, True)
  with pytest.raises(ValueError, match="missing .*'head'"):
    convert.load_lm(cfg, {k: v for k, v in params.items() if k != "head"})
  bad = dict(params)
  bad["embed"] = params["embed"][:, :-1]
  with pytest.raises(ValueError, match=r"\('embed',\) must have shape"):
    convert.load_lm(cfg, bad)


def test_norm_free_decoder_needs_prenorm():
  with pytest.raises(
    ValueError, match=r"norm='none' \(no norm\) needs a scheme that runs"
  ):
    models.DecoderLM(
      _config(norm="none", residual="postnorm"), rngs=nnx.Rngs(0)
    )


# ---------------------------------------------------------------------------
# FakeLN and LayerNorm removal.


def test_public_paths_of_the_fake_ln_maths():
  # The maths is `jaxnorm.norms.fakeln` (tests/norms/test_fakeln.py).
  assert convert.fake_layer_norm is norms.fake_layer_norm
  assert convert.removal_steps is norms.fakeln.removal_steps
  assert convert.removal_events is norms.fakeln.removal_events


def test_fake_ln_module_is_the_function(key):
  ln = nn_norms.LayerNorm(8, eps=1e-5, rngs=nnx.Rngs(0))
  ln.scale[...] = jnp.linspace(0.5, 1.5, 8)
  fake = fakeln.FakeLayerNorm.from_layer_norm(
    ln, remove_at=2, bos_off_at=3, momentum=0.5
  )
  state = norms.init_fake_ln_state(remove_at=2, bos_off_at=3)
  for k in jax.random.split(key, 4):
    x = jax.random.normal(k, (2, 4, 8)).astype(jnp.bfloat16)
    y, state = norms.fake_ln(
      x.astype(jnp.float32),
      ln.scale[...],
      ln.bias[...],
      state,
      eps=1e-5,
      momentum=0.5,
    )
    out = fake(x)
    assert out.dtype == jnp.bfloat16
    assert_close(out, y.astype(jnp.bfloat16), atol=0)
    for name, value in zip(state._fields, state):
      assert_close(getattr(fake, name)[...], value, atol=0)


def test_fake_ln_module_real_then_frozen(key):
  ln = nn_norms.LayerNorm(8, rngs=nnx.Rngs(0))
  ln.scale[...] = jnp.linspace(0.5, 1.5, 8)
  ln.bias[...] = jnp.linspace(-1.0, 1.0, 8)
  fake = fakeln.FakeLayerNorm.from_layer_norm(
    ln, remove_at=2, bos_off_at=3, momentum=0.5
  )
  k1, k2, k3 = jax.random.split(key, 3)
  x1 = jax.random.normal(k1, (2, 4, 8)) * 2.0
  x2 = jax.random.normal(k2, (2, 4, 8)) * 4.0

  def tok_std(x):
    xc = x - x.mean(-1, keepdims=True)
    return jnp.sqrt(jnp.mean(xc * xc, -1) + 1e-6)

  # Steps 0, 1: real LayerNorm; the bias-corrected average after one update
  # is the batch mean (positions >= 1; position 0 separately).
  assert_close(fake(x1), ln(x1), atol=1e-5)
  assert_close(fake.std[...], jnp.mean(tok_std(x1)[:, 1:]), atol=1e-6)
  assert_close(fake.bos_std[...], jnp.mean(tok_std(x1)[:, 0]), atol=1e-6)
  assert_close(fake(x2), ln(x2), atol=1e-5)
  expected = (
    0.5 * 0.5 * jnp.mean(tok_std(x1)[:, 1:])
    + 0.5 * jnp.mean(tok_std(x2)[:, 1:])
  ) / 0.75
  assert_close(fake.std[...], expected, atol=1e-5)
  frozen, frozen_bos = fake.std[...], fake.bos_std[...]
  # Step 2: fake; position 0 uses its own std, the rest the shared one.
  x3 = jax.random.normal(k3, (2, 4, 8))
  std = jnp.broadcast_to(
    jnp.where(jnp.arange(4) == 0, frozen_bos, frozen), (2, 4)
  )
  assert_close(
    fake(x3),
    norms.fake_layer_norm(x3, ln.scale[...], ln.bias[...], std=std),
    atol=1e-6,
  )
  assert_close(fake.std[...], frozen, atol=0.0)
  # Step 3: position-0 std off. Eval mode reads without counting.
  fake.eval()
  y = fake(x3)
  assert int(fake.step[...]) == 3
  assert_close(
    y,
    norms.fake_layer_norm(x3, ln.scale[...], ln.bias[...], std=frozen),
    atol=1e-6,
  )
  with pytest.raises(ValueError, match="num_features=8"):
    fake(jnp.ones((2, 4, 7)))
  with pytest.raises(ValueError, match="remove_at must be a non-negative"):
    fakeln.FakeLayerNorm(8, remove_at=-1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="momentum must be in"):
    fakeln.FakeLayerNorm(8, momentum=1.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="must be a jaxnorm.nn.LayerNorm"):
    fakeln.FakeLayerNorm.from_layer_norm(nn_norms.RMSNorm(8, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="scale_offset must be 0"):
    fakeln.FakeLayerNorm.from_layer_norm(
      nn_norms.LayerNorm(8, scale_offset=1.0, rngs=nnx.Rngs(0))
    )
  with pytest.raises(
    ValueError, match="pre-norm DecoderLM with norm='layernorm'"
  ):
    fakeln.install_fake_ln(
      models.DecoderLM(_config(norm="rmsnorm"), rngs=nnx.Rngs(0))
    )


def test_layernorm_removal_by_fine_tuning_then_export(tmp_path):
  """The training mode end to end: trainer.train on a FakeLN model."""
  cfg, params = _trained(1, 16, 2, True)
  model = convert.load_lm(cfg, params)
  schedule = fakeln.install_fake_ln(model, start=2)
  total = schedule[("bos_off", None)] + 2
  with pytest.raises(ValueError, match="still a real LayerNorm"):
    convert.remove_fake_ln(convert.lm_params(model), cfg)
  with pytest.raises(ValueError, match="no FakeLN state"):
    convert.remove_fake_ln(params, cfg)
  run = config_lib.TrainConfig(
    seq_len=SEQ,
    batch_size=8,
    steps=total,
    eval_every=total,
    eval_batches=1,
    checkpoint_every=total,
    log_every=total,
    warmup_steps=2,
    learning_rate=1e-3,
    out_dir=str(tmp_path / "rm"),
    progress=False,
  )
  summary = trainer.train(run, model=model)
  assert np.isfinite(summary["val_loss"])
  state = convert.lm_params(model)
  assert int(state["final_norm"]["step"]) == total
  ln_free_p, ln_free_c = convert.remove_fake_ln(state, cfg)
  assert ln_free_c.norm == "none" and "final_norm" not in ln_free_p
  tokens = _val()[:, :-1]
  # Claim 2: the exported weights compute the fake-mode logits.
  assert_close(
    convert.load_lm(ln_free_c, ln_free_p)(tokens), model(tokens), atol=1e-4
  )
  p64 = jax.tree.map(lambda x: np.asarray(x, np.float64), state)
  e64, c64 = convert.remove_fake_ln(p64, cfg)
  assert_close(
    lm_numpy.lm_logits(e64, c64, np.asarray(tokens)), model(tokens), atol=1e-4
  )


def test_remove_fake_ln_refuses_position_zero_std():
  cfg, params = _trained(1, 16, 2, True)
  model = convert.load_lm(cfg, params)
  fakeln.install_fake_ln(model, start=0, gap=1)
  tokens = _val()[:, :-1]
  for _ in range(8):  # Past ln_f (7 for one layer), before bos_off (19).
    model(tokens)
  with pytest.raises(ValueError, match="position-0 std"):
    convert.remove_fake_ln(convert.lm_params(model), cfg)
