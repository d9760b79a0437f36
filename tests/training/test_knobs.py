"""The knobs: schedules, accumulation, EMA, dtypes, sinks, backward state."""

import dataclasses
import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import nn, optim
from jaxnorm.nn import decay
from jaxnorm.training import build, config, data, flags, optimizers, trainer
from tests.training import runs


class TestSchedules:
  LR, WARMUP, TOTAL = 0.1, 4, 20

  def values(self, kind):
    s = optimizers.make_schedule(kind, self.LR, self.WARMUP, self.TOTAL)
    return np.array([float(s(t)) for t in range(self.TOTAL + 1)])

  def test_warmup_is_linear(self):
    for kind in ("cosine", "wsd", "constant"):
      np.testing.assert_allclose(
        self.values(kind)[:5], self.LR * np.arange(5) / 4, rtol=1e-6
      )

  def test_cosine(self):
    t = np.arange(4, 21)
    frac = (t - 4) / 16
    want = self.LR * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * frac)))
    np.testing.assert_allclose(self.values("cosine")[4:], want, rtol=1e-5)

  def test_wsd_holds_then_decays_to_zero(self):
    v = self.values("wsd")
    np.testing.assert_allclose(v[4:17], self.LR, rtol=1e-6)
    np.testing.assert_allclose(
      v[16:], self.LR * (1 - np.arange(5) / 4), rtol=1e-6, atol=1e-9
    )

  def test_constant(self):
    np.testing.assert_allclose(self.values("constant")[4:], self.LR, rtol=1e-6)

  def test_unknown(self):
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
      optimizers.make_schedule("linear", 1.0, 1, 10)


class TestOptimizerFlags:
  def params(self):
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
      "w": jax.random.normal(k1, (4, 3)),
      "b": jax.random.normal(k2, (3,)),
    }

  def test_betas_and_no_clip_reach_adamw(self):
    params = self.params()
    grads = jax.tree.map(lambda p: 3.0 * p + 1.0, params)
    tx = optimizers.build_optimizer(
      "adamw",
      learning_rate=0.1,
      weight_decay=0.2,
      warmup_steps=0,
      total_steps=10,
      schedule="constant",
      clip_norm=0.0,
      b1=0.5,
      b2=0.6,
    )
    ref = optax.adamw(
      optimizers.make_schedule("constant", 0.1, 0, 10),
      b1=0.5,
      b2=0.6,
      weight_decay=0.2,
      mask=optimizers.matrix_mask,
    )
    got, want = tx.init(params), ref.init(params)
    for _ in range(3):
      u, got = tx.update(grads, got, params)
      v, want = ref.update(grads, want, params)
      jax.tree.map(np.testing.assert_allclose, u, v)

  def test_clip_norm(self):
    params = self.params()
    big = jax.tree.map(lambda p: 100.0 * jnp.ones_like(p), params)
    tx = optimizers.build_optimizer(
      "sgd",
      learning_rate=1.0,
      weight_decay=0.0,
      warmup_steps=0,
      total_steps=10,
      schedule="constant",
      clip_norm=0.5,
      b1=0.0,
    )
    state = tx.init(params)
    state = tx.update(big, state, params)[1]  # Warmup step: lr 0.
    u, _ = tx.update(big, state, params)
    assert optax.tree.norm(u) == pytest.approx(0.5, rel=1e-5)

  def test_b2_refused_without_second_moment(self):
    with pytest.raises(ValueError, match="sgdp has no second moment"):
      optimizers.build_optimizer(
        "sgdp",
        learning_rate=1.0,
        weight_decay=0.0,
        warmup_steps=1,
        total_steps=10,
        b2=0.9,
      )
    with pytest.raises(ValueError, match="unknown optimizer 'adam2'"):
      optimizers.build_optimizer(
        "adam2",
        learning_rate=1.0,
        weight_decay=0.0,
        warmup_steps=1,
        total_steps=10,
      )

  @pytest.mark.parametrize("name", sorted(optimizers.OPTIMIZERS))
  def test_options_are_the_methods_other_arguments(self, name):
    entry = optimizers.OPTIMIZERS[name]
    params = set(inspect.signature(entry.method).parameters)
    assert set(entry.sets) <= params, set(entry.sets) - params
    assert "learning_rate" in entry.sets
    assert set(optimizers.options(name)) == params - set(entry.sets)

  def test_options_reach_the_method(self):
    # Conda's basis is refreshed every update_proj_gap steps: gap 1 and
    # the default 2000 differ once the gradients turn, and gap 1 through
    # the config is optim.conda(update_proj_gap=1) itself.
    params = {"w": jax.random.normal(jax.random.key(0), (6, 4))}
    turns = [
      {"w": jax.random.normal(jax.random.key(i), (6, 4))} for i in (1, 2, 3)
    ]

    def updates(tx):
      state, out = tx.init(params), []
      for g in turns:
        u, state = tx.update(g, state, params)
        out.append(u["w"])
      return np.stack(out)

    def runner(kwargs):
      cfg = runs.tiny(
        ".",
        optimizer="conda",
        learning_rate=0.1,
        weight_decay=0.0,
        warmup_steps=0,
        schedule="constant",
        clip_norm=0.0,
        optimizer_kwargs=kwargs,
      )
      return updates(optimizers.from_config(cfg))

    official = optim.conda(
      optimizers.make_schedule("constant", 0.1, 0, runs.TINY.steps),
      b1=0.9,
      b2=0.95,
      weight_decay=0.0,
      adam_weight_decay=0.0,
      mask=optimizers.matrix_mask,
      update_proj_gap=1,
    )
    gap1 = runner((("update_proj_gap", 1),))
    np.testing.assert_allclose(gap1, updates(official), rtol=1e-6, atol=1e-7)
    assert not np.allclose(gap1[1:], runner(())[1:], rtol=1e-3)

  def test_options_refused_with_the_valid_names(self):
    build = functools.partial(
      optimizers.build_optimizer,
      learning_rate=1.0,
      weight_decay=0.0,
      warmup_steps=1,
      total_steps=10,
    )
    with pytest.raises(ValueError, match=r"\['gap'\] are not options of conda"):
      build("conda", kwargs={"gap": 3})
    with pytest.raises(ValueError, match=r"its options: .*update_proj_gap"):
      build("conda", kwargs={"gap": 3})
    with pytest.raises(ValueError, match=r"runner's own flags set .*b1"):
      build("adamw", kwargs={"b1": 0.5})
    with pytest.raises(ValueError, match="per-parameter eps"):
      build("adamw", kwargs={"nesterov": True}, eps={"w": 1e-8})

  def test_options_from_the_command_line(self):
    got = flags.parse_value("optimizer_kwargs", '{"update_proj_gap": 200}')
    assert got == (("update_proj_gap", 200),)
    assert "optimizer_kwargs" in config.STRUCTURAL


LM_DATA = {"vocab_size": 256, "max_len": 16}


def test_param_dtype(tmp_path):
  cfg = runs.tiny(tmp_path, param_dtype="bfloat16")
  model = build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype("bfloat16")}
  logits = model(jnp.zeros((2, 16), jnp.int32))
  assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


def test_model_summary_counts_every_parameter(tmp_path):
  # nnx.tabulate fails on models built with make_residual; the summary
  # only walks the parameter state, so it works for every registered part.
  cfg = runs.tiny(tmp_path, residual="mhc", norm="seednorm")
  model = nnx.eval_shape(
    lambda: build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(0))
  )
  counts = build.parameter_counts(model)
  assert {"embed", "net", "final_norm"} <= set(counts)
  params = nnx.state(model, nnx.Param)
  total = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  assert sum(counts.values()) == total
  lines = build.summary_lines(model)
  assert lines[0] == "DecoderLM parameters:"
  assert lines[-1].split() == ["total", f"{total:,}"]


def test_model_kwargs_from_the_command_line(tmp_path):
  cfg = runs.tiny(tmp_path, norm="layernorm", norm_kwargs=(("eps", 1e-3),))
  lm = build.model_config(cfg, LM_DATA)
  assert dict(lm.norm_kwargs) == {"eps": 1e-3}
  model = build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(0))
  assert model.final_norm.eps == 1e-3
  mlp = dataclasses.replace(
    cfg,
    model="mlp",
    data="digits",
    norm_kwargs=(),
    attention_kwargs=(("x", 1),),
  )
  with pytest.raises(ValueError, match="--attention-kwargs is not supported"):
    build.model_config(mlp, {"num_classes": 10, "image_shape": (8, 8, 1)})


@pytest.mark.slow
def test_grad_accumulation_equals_the_large_batch(tmp_path):
  accum = runs.tiny(
    tmp_path / "accum",
    steps=4,
    grad_accum=2,
    eval_every=4,
    eval_batches=2,
    log_every=4,
  )
  big = runs.tiny(
    tmp_path / "big",
    steps=2,
    batch_size=16,
    eval_every=2,
    eval_batches=1,
    log_every=2,
  )
  trainer.train(accum)
  trainer.train(big)
  a, b = runs.losses(accum.out_dir), runs.losses(big.out_dir)
  np.testing.assert_allclose(a[1][4], b[1][2], rtol=1e-5)
  np.testing.assert_allclose(a[0][4], b[0][2], rtol=1e-5)


@pytest.mark.slow
def test_ema_follows_its_recurrence(tmp_path):
  cfg = runs.tiny(
    tmp_path, steps=3, ema_decay=0.5, checkpoint_every=1, keep_checkpoints=3
  )
  trainer.train(cfg)
  s2, s3 = runs.saved_state(cfg.out_dir, 2), runs.saved_state(cfg.out_dir, 3)
  jax.tree.map(
    lambda e3, e2, p3: np.testing.assert_allclose(
      e3, 0.5 * e2 + 0.5 * p3, rtol=1e-6
    ),
    s3["ema"],
    s2["ema"],
    s3["params"],
  )
  assert not np.allclose(
    jax.tree.leaves(s3["ema"])[0], jax.tree.leaves(s3["params"])[0]
  )


@pytest.mark.slow
def test_profile_trace(tmp_path):
  trainer.train(runs.tiny(tmp_path, profile_steps=(2, 3)))
  assert list((tmp_path / "profile").rglob("*.xplane.pb"))


@pytest.mark.slow
def test_tensorboard_sink(tmp_path):
  pytest.importorskip("tensorboardX")
  trainer.train(runs.tiny(tmp_path, tensorboard=True))
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_backward_state_is_trained_like_a_hand_written_step(tmp_path):
  # PowerNorm's grad_ema is a BackwardStat: only the backward pass updates
  # it. One runner step must equal nnx.grad over BACKWARD_DIFF plus
  # apply_backward_updates, for the parameters and every state variable.
  cfg = runs.tiny(
    tmp_path, norm="powernorm", allow_batch_stats=True, steps=1, eval_every=1
  )
  ran = build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(cfg.seed))
  hand = build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(cfg.seed))
  initial = jax.tree.map(jnp.copy, nnx.state(hand, nn.BackwardStat))
  trainer.train(cfg, model=ran)

  text = data.load_text(cfg.data)
  ds = data.text_windows(
    text.train, cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed
  )
  batch = jnp.asarray(next(iter(ds.to_iter_dataset())))
  tx = optimizers.from_config(cfg, mask=decay.decay_mask(hand))

  def loss_fn(model):
    logits = model(batch[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(
      logits, batch[:, 1:]
    ).mean()

  @nnx.jit
  def hand_step(model):
    grads = nnx.grad(loss_fn, argnums=nnx.DiffState(0, nn.BACKWARD_DIFF))(model)
    params = nnx.state(model, nnx.Param)
    param_grads = nnx.split_state(grads, nnx.Param, ...)[0]
    updates, _ = tx.update(param_grads, tx.init(params), params)
    nn.apply_backward_updates(model, grads)
    nnx.update(model, optax.apply_updates(params, updates))

  with jax.numpy_dtype_promotion("standard"):
    hand_step(hand)

  got, want = nnx.state(ran), nnx.state(hand)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7),
    got,
    want,
  )
  after = nnx.state(ran, nn.BackwardStat)
  changed = [
    not np.allclose(a, b)
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(initial))
  ]
  assert changed and all(changed)
  assert math.isfinite(float(jax.tree.leaves(after)[0].sum()))


@pytest.fixture(scope="module")
def decay_model():
  cfg = runs.tiny("unused", residual="layerscale", norm="seednorm")
  model = build.build_model(cfg, LM_DATA, rngs=nnx.Rngs(0))
  return model, decay.decay_mask(model)


@pytest.mark.parametrize("name", sorted(optimizers.OPTIMIZERS))
def test_every_optimizer_decays_exactly_the_masked_leaves(decay_model, name):
  # With zero gradients an update is the decay term alone: nonzero exactly
  # on the nonzero leaves the model's decay policy marks (muon: 2-D only).
  model, mask = decay_model
  params = nnx.state(model, nnx.Param)
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = optimizers.build_optimizer(
    name,
    learning_rate=0.1,
    weight_decay=0.5,
    warmup_steps=1,
    total_steps=10,
    schedule="constant",
    mask=mask,
  )
  state = tx.init(params)
  update = jax.jit(tx.update)  # One compile, not one per op and leaf shape.
  for _ in range(2):  # The first update has learning rate 0 (warmup).
    updates, state = update(zeros, state, params)
  got = [bool(jnp.any(u != 0)) for u in jax.tree.leaves(updates)]
  want = [
    m and bool(jnp.any(p != 0)) and (name != "muon" or p.ndim == 2)
    for m, p in zip(jax.tree.leaves(mask), jax.tree.leaves(params))
  ]
  assert got == want
  assert any(want) and not all(jax.tree.leaves(mask))
