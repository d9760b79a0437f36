"""The optimizer side of depth-muP and CompleteP in the runner.

`scale_by_adam_leafwise` (Adam with one eps per parameter) and
`scale_by_multipliers` (one learning-rate factor per parameter) against
optax, on plain trees and on nnx states; jit, dtypes, state structure and
gradient accumulation; `hidden_mask` and the errors of the depth rule. The
rule's values against DepthBench's code: tests/residual/test_depth_recipes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm.nn import models
from jaxnorm.training import config as config_lib
from jaxnorm.training import optimizers

STANDARD = jax.numpy_dtype_promotion("standard")  # As the runner's step.


def _params(dtype=jnp.float32):
  return {
    "a": jnp.linspace(-1.0, 1.0, 6, dtype=dtype).reshape(2, 3),
    "b": jnp.linspace(0.5, 1.5, 3, dtype=dtype),
  }


def _grads(params, t, scale=1.0):
  return jax.tree.map(
    lambda p: (scale * jnp.cos(3.0 * p + t)).astype(p.dtype), params
  )


def test_leafwise_adam_with_one_eps_is_optax_adam():
  params = _params()
  ours = optimizers.scale_by_adam_leafwise(0.9, 0.95, eps=1e-8)
  ref = optax.scale_by_adam(0.9, 0.95, eps=1e-8)
  s1, s2 = ours.init(params), ref.init(params)
  assert jax.tree.structure(s1) == jax.tree.structure(s2)
  for t in range(3):
    g = _grads(params, t)
    with STANDARD:
      u1, s1 = ours.update(g, s1)
      u2, s2 = ref.update(g, s2)
    jax.tree.map(np.testing.assert_array_equal, u1, u2)


def test_leafwise_adam_eps_tree_is_optax_adam_per_leaf():
  params = _params()
  eps = {"a": 1e-3, "b": 0.5}
  ours = optimizers.scale_by_adam_leafwise(0.9, 0.95, eps=eps)
  refs = {k: optax.scale_by_adam(0.9, 0.95, eps=e) for k, e in eps.items()}
  s = ours.init(params)
  rs = {k: refs[k].init(params[k]) for k in params}
  for t in range(3):
    g = _grads(params, t, scale=1e-3)
    with STANDARD:
      u, s = ours.update(g, s)
      for k in params:
        want, rs[k] = refs[k].update(g[k], rs[k])
        # Same formula; XLA may round one element differently (1 ulp).
        np.testing.assert_allclose(u[k], want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_depth_adamw_jits_and_keeps_dtypes_and_state(dtype):
  params = _params(dtype)
  rule = optimizers.depth_adam_rule(
    {"a": True, "b": False}, scheme="completep", num_layers=6
  )
  tx = optimizers.build_optimizer(
    "adamw",
    learning_rate=1e-2,
    weight_decay=0.1,
    warmup_steps=1,
    total_steps=8,
    eps=rule.eps,
    lr_multipliers=rule.lr_multipliers,
  )
  state = tx.init(params)

  @jax.jit
  def step(params, state, t):
    with STANDARD:
      u, state = tx.update(_grads(params, t), state, params)
    return optax.apply_updates(params, u), state

  structure = jax.tree.structure(state)
  dtypes = [x.dtype for x in jax.tree.leaves(state)]
  for t in range(3):
    params, state = step(params, state, t)
  assert jax.tree.structure(state) == structure
  assert [x.dtype for x in jax.tree.leaves(state)] == dtypes
  assert all(p.dtype == dtype for p in jax.tree.leaves(params))


def test_multipliers_scale_each_update_under_multisteps():
  params = _params()
  mult = {"a": 0.25, "b": 1.0}
  kw = dict(
    learning_rate=1e-2,
    weight_decay=0.0,
    warmup_steps=1,
    total_steps=8,
    grad_accum=2,
    clip_norm=0.0,
    schedule="constant",
  )
  scaled = optimizers.build_optimizer("adamw", lr_multipliers=mult, **kw)
  plain = optimizers.build_optimizer("adamw", **kw)
  s1, s2 = scaled.init(params), plain.init(params)
  for t in range(4):
    g = _grads(params, t)
    with STANDARD:
      u1, s1 = scaled.update(g, s1, params)
      u2, s2 = plain.update(g, s2, params)
    np.testing.assert_allclose(u1["a"], 0.25 * u2["a"], rtol=1e-6)
    np.testing.assert_array_equal(u1["b"], u2["b"])


def _lm(residual, depth=2):
  cfg = models.LMConfig(
    vocab_size=16,
    width=8,
    depth=depth,
    num_heads=2,
    max_len=4,
    residual=residual,
  )
  return models.DecoderLM(cfg, rngs=nnx.Rngs(0))


def _train_config(**kw):
  base = dict(model="lm", width=8, depth=2, num_heads=2, steps=8)
  return config_lib.TrainConfig(**{**base, **kw})


def test_from_config_other_schemes_are_plain_adamw():
  model = _lm("prenorm")
  _, params, _ = nnx.split(model, nnx.Param, ...)
  cfg = _train_config(residual="prenorm", clip_norm=0.0)
  tx = optimizers.from_config(cfg, model=model)
  ref = optimizers.from_config(cfg)  # No model needed.
  g = jax.tree.map(jnp.ones_like, params)
  with STANDARD:
    u1, _ = tx.update(g, tx.init(params), params)
    u2, _ = ref.update(g, ref.init(params), params)
  jax.tree.map(np.testing.assert_array_equal, u1, u2)


def test_hidden_mask_scanned_and_unrolled_agree():
  def flags(model):
    return {
      "/".join(str(p) for p in path[:2]): v
      for path, v in nnx.to_flat_state(optimizers.hidden_mask(model))
    }

  for scan in (False, True):
    cfg = models.LMConfig(
      vocab_size=16,
      width=8,
      depth=2,
      num_heads=2,
      max_len=4,
      residual="completep",
      scan_layers=scan,
    )
    model = nnx.eval_shape(
      lambda cfg=cfg: models.DecoderLM(cfg, rngs=nnx.Rngs(0))
    )
    got = flags(model)
    assert got["embed"] is False and got["pos"] is False
    assert got["final_norm/scale"] is False
    net = {k: v for k, v in got.items() if k.startswith("net/")}
    assert net and all(net.values())


def test_depth_rule_errors():
  with pytest.raises(
    ValueError, match=r"depth_adam_rule: scheme must be one of depth_mup"
  ):
    optimizers.depth_adam_rule({"a": True}, scheme="prenorm", num_layers=4)
  with pytest.raises(
    ValueError, match=r"build_optimizer: a per-parameter eps applies to adamw"
  ):
    optimizers.build_optimizer(
      "lion",
      learning_rate=1e-3,
      weight_decay=0.0,
      warmup_steps=1,
      total_steps=4,
      eps={"a": 1e-8},
    )
  model = _lm("depth_mup")
  with pytest.raises(
    ValueError,
    match=r"from_config: --residual depth_mup trains with DepthBench's "
    r"AdamW rule .* got --optimizer sgd; use --optimizer adamw",
  ):
    optimizers.from_config(
      _train_config(residual="depth_mup", optimizer="sgd"), model=model
    )
  with pytest.raises(
    ValueError, match=r"from_config: --residual completep needs model="
  ):
    optimizers.from_config(_train_config(residual="completep"))
  with pytest.raises(
    ValueError, match=r"hidden_mask: Linear holds no residual network"
  ):
    optimizers.hidden_mask(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
