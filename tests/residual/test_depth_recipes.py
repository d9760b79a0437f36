"""Depth-muP, CompleteP and KEEL as DepthBench's official code builds them.

Against `tests.oracles.depthbench_depth`, a NumPy float64 transcription of
DepthBench's ``apply_depth_only_scaling``, ``DepthScaledTransformerBlock``
and ``KeelTransformerBlock`` (and of CompleteP's own nanoGPT-mup optimizer
groups): the base depth 24, the branch multiplier, each parameter's AdamW
learning rate and eps at several depths (the base depth included, where
they are plain AdamW's), AdamW steps through the runner's optimizer, and
KEEL's norm (the base model's RMSNorm).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm.nn import decay as nn_decay
from jaxnorm.nn import models
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import residual as nn_res
from jaxnorm.training import config as config_lib
from jaxnorm.training import optimizers, trainer
from tests import helpers
from tests.oracles import depthbench_depth as oracle

SCHEMES = ("depth_mup", "completep")
LR, EPS = 2e-3, 1e-8


def _alpha(scheme):
  return oracle.PARAMETERIZATION_TO_ALPHA[scheme]


def test_base_depth_and_exponents_are_depthbench():
  assert R.BASE_DEPTH == oracle.BASE_DEPTH == 24
  assert R.DEPTH_EXPONENTS == oracle.PARAMETERIZATION_TO_ALPHA
  for scheme in SCHEMES:
    for layers in (2, 24, 32):
      defaults = nn_res.RESIDUALS[scheme].defaults(2 * layers, 2)
      assert defaults == {"base_depth": 24}


# ---------------------------------------------------------------------------
# Branch multiplier.


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("layers", [1, 2, 6, 16, 24, 32, 48, 96])
def test_branch_multiplier_matches_depthbench(scheme, layers):
  want = oracle.residual_scale(layers, 24, _alpha(scheme))
  got = R.depth_scale(layers, R.BASE_DEPTH, R.DEPTH_EXPONENTS[scheme])
  np.testing.assert_allclose(got, want, rtol=1e-15)
  if layers == 24:
    assert got == 1.0


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("layers", [2, 3, 24])
def test_depth_scaled_stack_matches_depthbench_blocks(scheme, layers):
  # make_residual with the spec's defaults (base depth 24) against
  # DepthBench's block: both residual streams of every layer scaled by
  # (L / 24)^(-alpha), OLMo-core's RMSNorm (unit weight at init).
  d = 8
  keys = jax.random.split(jax.random.key(layers), 2 * layers)
  weights = [np.asarray(jax.random.normal(k, (d, d))) / d**0.5 for k in keys]
  blocks = [
    lambda h, w=w: jnp.tanh(h @ jnp.asarray(w, h.dtype)) for w in weights
  ]
  net = nn_res.make_residual(scheme, blocks, num_features=d, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(7), (2, 3, d))
  scale = oracle.residual_scale(layers, 24, _alpha(scheme))
  assert [s.scale for s in net.steps] == pytest.approx([scale] * 2 * layers)
  want = np.asarray(x, np.float64)
  f64 = [lambda h, w=w: np.tanh(h @ np.asarray(w, np.float64)) for w in weights]
  for i in range(layers):
    norms = (oracle.rms_norm, oracle.rms_norm)
    want = oracle.depth_scaled_block(
      want, f64[2 * i], f64[2 * i + 1], norms, scale
    )
  helpers.assert_close(net(x), want, atol=5e-5 * max(1.0, scale), rtol=2e-5)


# ---------------------------------------------------------------------------
# Adam's learning rate and eps.


@pytest.mark.parametrize("scheme", SCHEMES)
def test_adam_scales_match_depthbench_overrides(scheme):
  for layers in (1, 2, 6, 16, 23, 24, 25, 32, 48, 96):
    got = R.depth_adam_scales(layers, 24, R.DEPTH_EXPONENTS[scheme])
    overrides = oracle.depth_only_group_overrides(
      layers, alpha=_alpha(scheme), lr=1.0, eps=1.0
    )
    if layers == 24:  # No override: plain AdamW.
      assert overrides == [] and got == (1.0, 1.0)
      continue
    (patterns, opts), *rest = overrides
    assert patterns == ["blocks.*"] and not rest
    np.testing.assert_allclose(got, (opts["lr"], opts["eps"]), rtol=1e-15)


def _olmo_name(path):
  """DepthBench (OLMo-core) name of a DecoderLM parameter path."""
  head, *rest = path
  if head == "embed":
    return "embeddings.weight"
  if head == "pos":  # DepthBench uses RoPE; a learned table is no block.
    return "pos_embeddings.weight"
  if head == "final_norm":
    return "lm_head.norm.weight"
  if head == "head":
    return f"lm_head.w_out.{'weight' if rest[-1] == 'kernel' else 'bias'}"
  assert head == "net", path
  kind, k, *leaf = rest
  layer, j = divmod(int(k), 2)
  if kind == "steps":
    norm = ("attention_norm", "feed_forward_norm")[j]
    return f"blocks.{layer}.{norm}.weight"
  if j == 0:  # q_kernel, out_bias, ...
    proj, what = leaf[0].split("_")
    part = f"attention.w_{proj}"
  else:  # ("up", "kernel"), ("down", "bias")
    part = f"feed_forward.w{1 if leaf[0] == 'up' else 2}"
    what = leaf[1]
  return f"blocks.{layer}.{part}.{'weight' if what == 'kernel' else 'bias'}"


def _nanogpt_name(path):
  """nanoGPT-mup's name of a DecoderLM parameter path (tied head)."""
  head, *rest = path
  if head == "embed":
    return "transformer.wte.weight"
  if head == "pos":
    return "transformer.wpe.weight"
  if head == "final_norm":
    return "transformer.ln_f.weight"
  assert head == "net", path
  kind, k, *leaf = rest
  layer, j = divmod(int(k), 2)
  if kind == "steps":
    return f"transformer.h.{layer}.ln_{j + 1}.weight"
  if j == 0:
    proj, what = leaf[0].split("_")
    part = "attn.c_proj" if proj == "out" else "attn.c_attn"
  else:
    part = "mlp.c_fc" if leaf[0] == "up" else "mlp.c_proj"
    what = leaf[1]
  suffix = "weight" if what == "kernel" else "bias"
  return f"transformer.h.{layer}.{part}.{suffix}"


def _lm(scheme, layers, *, tie):
  cfg = models.LMConfig(
    vocab_size=16,
    width=8,
    depth=layers,
    num_heads=2,
    max_len=4,
    residual=scheme,
    use_bias=True,
    tie_embeddings=tie,
  )
  return nnx.eval_shape(lambda: models.DecoderLM(cfg, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
  "layers", [2, 24, pytest.param(40, marks=pytest.mark.slow)]
)
def test_per_parameter_lr_and_eps_match_depthbench_groups(scheme, layers):
  model = _lm(scheme, layers, tie=False)
  rule = optimizers.depth_adam_rule(
    optimizers.hidden_mask(model), scheme=scheme, num_layers=layers
  )
  lr = dict(nnx.to_flat_state(rule.lr_multipliers))
  eps = dict(nnx.to_flat_state(rule.eps))
  names = {path: _olmo_name(tuple(str(p) for p in path)) for path in lr}
  overrides = oracle.depth_only_group_overrides(
    layers, alpha=_alpha(scheme), lr=LR, eps=EPS
  )
  want = oracle.param_group_options(names.values(), overrides, lr=LR, eps=EPS)
  # Per layer: q, k, v, out kernels and biases, 2 MLP kernels and biases,
  # 2 norms.
  assert sum(n.startswith("blocks.") for n in names.values()) == 14 * layers
  for path, name in names.items():
    np.testing.assert_allclose(
      (LR * lr[path], eps[path]), want[name], rtol=1e-14, err_msg=name
    )
  if layers == 24:  # The base depth: every factor 1, eps 1e-8 (plain AdamW).
    assert set(lr.values()) == {1.0} and set(eps.values()) == {EPS}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
  "layers", [3, 24, pytest.param(48, marks=pytest.mark.slow)]
)
def test_per_parameter_lr_and_eps_match_completep_nanogpt(scheme, layers):
  # CompleteP's own code (width multiplier 1) gives the same groups.
  model = _lm(scheme, layers, tie=True)
  rule = optimizers.depth_adam_rule(
    optimizers.hidden_mask(model), scheme=scheme, num_layers=layers
  )
  lr = dict(nnx.to_flat_state(rule.lr_multipliers))
  eps = dict(nnx.to_flat_state(rule.eps))
  names = {path: _nanogpt_name(tuple(str(p) for p in path)) for path in lr}
  want = oracle.nanogpt_completep_options(
    names.values(),
    depth_multiplier=layers / 24,
    depth_alpha_exp=_alpha(scheme),
    lr=LR,
    eps=EPS,
  )
  for path, name in names.items():
    np.testing.assert_allclose(
      (LR * lr[path], eps[path]), want[name], rtol=1e-14, err_msg=name
    )


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("grad_scale", [1.0, 1e-8])
def test_runner_adamw_steps_match_torch_adamw_groups(scheme, grad_scale):
  # The runner's optimizer (trainer.make_optimizer) at L = 2 (m = 1/12)
  # against torch's AdamW with DepthBench's groups, step by step; gradients
  # of 1e-8 make eps (12x or sqrt(12)x the base) visible in the update.
  layers = 2
  cfg = config_lib.TrainConfig(
    model="lm",
    residual=scheme,
    depth=layers,
    width=8,
    num_heads=2,
    optimizer="adamw",
    learning_rate=LR,
    weight_decay=0.1,
    warmup_steps=2,
    steps=20,
    schedule="cosine",
    clip_norm=0.0,
  )
  lm_cfg = models.LMConfig(
    vocab_size=16,
    width=8,
    depth=layers,
    num_heads=2,
    max_len=4,
    residual=scheme,
  )
  model = models.DecoderLM(lm_cfg, rngs=nnx.Rngs(0))
  _, params, _ = nnx.split(model, nnx.Param, ...)  # As the runner does.
  tx = trainer.make_optimizer(cfg, model, params)
  schedule = optimizers.make_schedule("cosine", LR, 2, 20)
  decayed = dict(nnx.to_flat_state(nn_decay.decay_mask(model)))
  names = {p: _olmo_name(tuple(str(q) for q in p)) for p in decayed}
  overrides = oracle.depth_only_group_overrides(
    layers, alpha=_alpha(scheme), lr=1.0, eps=EPS
  )
  factors = oracle.param_group_options(
    names.values(), overrides, lr=1.0, eps=EPS
  )
  flat0 = dict(nnx.to_flat_state(params))
  ref = {
    p: (np.asarray(v[...], np.float64), 0.0, 0.0) for p, v in flat0.items()
  }
  state = tx.init(params)

  @jax.jit
  def step(grads, state, params):
    with jax.numpy_dtype_promotion("standard"):  # As the runner's step.
      return tx.update(grads, state, params)

  leaves, treedef = jax.tree.flatten(params)
  moved = {path: 0.0 for path in flat0}
  for t in range(1, 5):
    keys = jax.random.split(jax.random.key(t), len(leaves))
    grads = jax.tree.unflatten(
      treedef,
      [
        grad_scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)
      ],
    )
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    for path, u in nnx.to_flat_state(updates):  # In float64: no rounding
      moved[path] = moved[path] + np.asarray(u[...], np.float64)  # of p.
    for p, g in nnx.to_flat_state(grads):
      lr_factor, eps = factors[names[p]]
      w, m, v = ref[p]
      ref[p] = oracle.adamw_step(
        w,
        np.asarray(g[...], np.float64),
        m,
        v,
        t,
        lr=lr_factor * float(schedule(t - 1)),
        eps=eps,
        wd=0.1 if decayed[p] else 0.0,
      )
  for p, got in moved.items():
    want = ref[p][0] - np.asarray(flat0[p][...], np.float64)
    # float32 updates: an entry where decay and the Adam step nearly cancel
    # keeps the round-off of its largest neighbours (1.5e-4 relative at
    # 5.5e-6 beside 1.7e-2 under jax 0.12.1), hence the floor.
    np.testing.assert_allclose(
      got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max(), err_msg=names[p]
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_base_depth_updates_equal_plain_adamw(scheme):
  hidden = {"embed": False, "w": True, "scale": True}
  rule = optimizers.depth_adam_rule(hidden, scheme=scheme, num_layers=24)
  kw = dict(learning_rate=LR, weight_decay=0.1, warmup_steps=1, total_steps=10)
  depth = optimizers.build_optimizer(
    "adamw", eps=rule.eps, lr_multipliers=rule.lr_multipliers, **kw
  )
  plain = optimizers.build_optimizer("adamw", **kw)
  params = {
    "embed": jnp.ones((4, 3)),
    "w": jnp.full((3, 3), 0.5),
    "scale": jnp.ones(3),
  }
  s_depth, s_plain = depth.init(params), plain.init(params)
  promotion = jax.numpy_dtype_promotion("standard")  # As the runner's step.
  for t in range(3):
    g = jax.tree.map(lambda p, t=t: jnp.sin(p + t) * 1e-7, params)
    with promotion:
      u_depth, s_depth = depth.update(g, s_depth, params)
      u_plain, s_plain = plain.update(g, s_plain, params)
    for k in params:
      np.testing.assert_array_equal(u_depth[k], u_plain[k])
    params = optax.apply_updates(params, u_plain)


# ---------------------------------------------------------------------------
# KEEL's norm.


def test_keel_norms_are_depthbench_rmsnorm():
  d, layers = 8, 3
  keys = jax.random.split(jax.random.key(3), 2 * layers)
  weights = [np.asarray(jax.random.normal(k, (d, d))) / d**0.5 for k in keys]
  blocks = [
    lambda h, w=w: jnp.tanh(h @ jnp.asarray(w, h.dtype)) for w in weights
  ]
  net = nn_res.make_residual("keel", blocks, num_features=d, rngs=nnx.Rngs(0))
  found = [
    node
    for _, node in nnx.iter_graph(net)
    if isinstance(node, nnx.Module) and hasattr(node, "eps")
  ]
  # Layer 0: 1 pre-norm + 2 (MLP); later layers 2 per sublayer.
  assert len(found) == 1 + 2 + 4 * (layers - 1)
  for norm in found:
    assert type(norm) is nn_norms.RMSNorm
    assert norm.eps == oracle.RMS_NORM_EPS
    assert norm.scale_offset == 0.0
    np.testing.assert_array_equal(norm.scale[...], np.ones(d))
  x = jax.random.normal(jax.random.key(5), (2, 3, d))
  want = np.asarray(x, np.float64)
  f64 = [lambda h, w=w: np.tanh(h @ np.asarray(w, np.float64)) for w in weights]
  for i in range(layers):
    want = oracle.keel_block(
      want,
      f64[2 * i],
      f64[2 * i + 1],
      (oracle.rms_norm,) * 4,
      block_idx=i,
      n_layers=layers,
    )
  helpers.assert_close(net(x), want, atol=2e-5)


def test_keel_in_the_lm_uses_the_models_norm():
  # DepthBench builds KEEL's norms from the base model's norm config, the
  # one of its final norm too; the LM passes its own norm (RMSNorm default).
  cfg = models.LMConfig(
    vocab_size=16, width=8, depth=2, num_heads=2, max_len=4, residual="keel"
  )
  lm = models.DecoderLM(cfg, rngs=nnx.Rngs(0))
  kinds = {
    type(node)
    for path, node in nnx.iter_graph(lm.net)
    if path and str(path[-1]) in ("norm", "norm_in")
  }
  assert kinds == {type(lm.final_norm)} == {nn_norms.RMSNorm}
