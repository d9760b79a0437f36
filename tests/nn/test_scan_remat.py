"""Scanned layer stacks and rematerialization in jaxnorm.nn.models.

A scanned model (``scan_layers=True``) given the parameters of an unrolled
one (`stack_layers`) computes the same logits and, unstacked
(`unstack_layers`), the same gradients; ``remat`` changes neither, and it
shrinks what the backward pass keeps."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import residual as residual_fns
from jaxnorm import sharding
from jaxnorm.nn import layers, models
from jaxnorm.nn import residual as nn_res
from tests import helpers

TINY = dict(
  vocab_size=32, width=16, depth=2, num_heads=2, max_len=8, mlp_ratio=2
)
VIT = dict(
  num_classes=3, image_shape=(4, 4, 1), patch_size=2, width=16, depth=2
)
IMAGES = dict(num_classes=3, image_shape=(4, 4, 1), width=8, depth=2)
SCAN_FAST = ("hc",)
POLICIES = ("full", "dots", "dots_no_batch")


def _tokens(batch=2):
  return jax.random.randint(jax.random.key(3), (batch, 8), 0, 32)


def _images(batch=2):
  return jax.random.uniform(jax.random.key(4), (batch, 4, 4, 1))


def _perturbed(model):
  """``model`` with noise on every parameter (gates and zero inits too)."""
  rng = np.random.default_rng(7)
  leaves, tree = jax.tree.flatten(nnx.state(model, nnx.Param))
  noisy = [
    jnp.asarray(np.asarray(p) + 0.1 * rng.standard_normal(p.shape), p.dtype)
    for p in leaves
  ]
  nnx.update(model, jax.tree.unflatten(tree, noisy))
  return model


def _scanned_like(unrolled, config):
  """The scanned model of ``config`` holding ``unrolled``'s parameters."""
  cls = type(unrolled)
  scanned = dataclasses.replace(config, scan_layers=True)
  graphdef = nnx.graphdef(
    nnx.eval_shape(lambda: cls(scanned, rngs=nnx.Rngs(0)))
  )
  state = models.stack_layers(nnx.state(unrolled), config, constants=True)
  return nnx.merge(graphdef, state)


def _outputs_and_grads(model, x):
  """Jitted outputs and parameter gradients of a random linear loss."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(params, rest):
    out = nnx.merge(graphdef, params, rest, copy=True)(x)
    cotangent = jax.random.normal(jax.random.key(5), out.shape, out.dtype)
    return jnp.sum(out * cotangent), out

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, out), grads = step(params, rest)
  return out, grads


def _assert_scanned_equals_unrolled(unrolled, config, x, *, grads=True):
  """Same outputs and (``grads``) gradients, scanned and unrolled."""
  scanned = _scanned_like(_perturbed(unrolled), config)
  if not grads:
    forward = nnx.jit(lambda m, x: m(x))
    helpers.assert_close(forward(scanned, x), forward(unrolled, x), atol=1e-5)
    return
  want, want_grads = _outputs_and_grads(unrolled, x)
  got, got_grads = _outputs_and_grads(scanned, x)
  helpers.assert_close(got, want, atol=1e-5)
  helpers.assert_close(
    models.unstack_layers(got_grads, config),
    want_grads,
    atol=1e-5,
    rtol=1e-5,
  )


# ---------------------------------------------------------------------------
# Scanned == unrolled.


@pytest.mark.parametrize(
  "residual",
  [
    n if n in SCAN_FAST else pytest.param(n, marks=pytest.mark.slow)
    for n in nn_res.SCAN_RESIDUALS
  ],
)
def test_scanned_lm_equals_unrolled(residual):
  config = models.LMConfig(**TINY, residual=residual)
  unrolled = models.DecoderLM(config, rngs=nnx.Rngs(0))
  _assert_scanned_equals_unrolled(unrolled, config, _tokens())


@pytest.mark.parametrize(
  "options",
  [
    {
      "positional": "rope",
      "zero_mean_writers": True,
      "norm": "none",
      "tie_embeddings": False,
      "use_bias": True,
    },
    pytest.param({"quant": "mixed"}, marks=pytest.mark.slow),
    pytest.param(
      {"norm": "layernorm", "attention": "gated", "activation": "swiglu"},
      marks=pytest.mark.slow,
    ),
    pytest.param(
      {"residual": "deepnorm", "mlp_hidden": 24}, marks=pytest.mark.slow
    ),
  ],
  ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_scanned_lm_supports_the_unrolled_options(options):
  config = models.LMConfig(**TINY, **options)
  unrolled = models.DecoderLM(config, rngs=nnx.Rngs(0))
  _assert_scanned_equals_unrolled(unrolled, config, _tokens(), grads=False)


@pytest.mark.slow
def test_scanned_vit_equals_unrolled():
  config = models.ViTConfig(**VIT, num_heads=2)
  unrolled = models.ViT(config, rngs=nnx.Rngs(0))
  _assert_scanned_equals_unrolled(unrolled, config, _images())


def test_scanned_lm_returns_hidden_states_per_layer():
  config = models.LMConfig(**TINY, residual="hc")
  unrolled = _perturbed(models.DecoderLM(config, rngs=nnx.Rngs(0)))
  scanned = _scanned_like(unrolled, config)
  tokens = _tokens()
  hidden = nnx.jit(lambda m, t: m(t, return_hidden=True))
  (logits, states), (want_logits, want_states) = (
    hidden(scanned, tokens),
    hidden(unrolled, tokens),
  )
  assert states.shape == (3, 2, 8, 16)
  helpers.assert_close(states, want_states, atol=1e-5)
  helpers.assert_close(logits, want_logits, atol=1e-5)


@pytest.mark.slow
def test_scanned_params_carry_the_layers_axis():
  config = models.LMConfig(
    **{**TINY, "depth": 3}, residual="hc", scan_layers=True
  )
  mesh = sharding.make_mesh((2, 2, 2))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    lm = models.DecoderLM(config, rngs=nnx.Rngs(0))
    spec = nnx.get_partition_spec(nnx.state(lm.net, nnx.Param))
    sharded = nnx.jit(lambda m, t: m(t))(lm, _tokens(4))
  layer = lm.net.layers
  assert layer.blocks[0].q_kernel.shape == (3, 16, 2, 8)
  assert layer.blocks[0].q_kernel.out_sharding == (
    "layers",
    "embed",
    "heads",
    "head_dim",
  )
  assert layer.res.steps[0].alpha_scale.out_sharding == ("layers",)
  assert spec["layers"]["blocks"][0]["q_kernel"].get_value() == (
    jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  )
  # HC's initial read stream is k mod n, k the sublayer: 0, 2, 4 (attn).
  reads = layer.res.steps[0].static_alpha[...][:, :, 0].argmax(axis=1)
  np.testing.assert_array_equal(reads, [0, 2, 0])
  # The same parameters, gathered to one device, give the same logits.
  graphdef, state = nnx.split(lm)
  local = nnx.merge(graphdef, jax.device_get(state))
  helpers.assert_close(
    sharded, nnx.jit(lambda m, t: m(t))(local, _tokens(4)), atol=1e-5
  )


@pytest.mark.slow
def test_scanned_lm_builds_under_a_mesh_without_the_layers_rule():
  # A foreign mesh and no rules: every name, "layers" too, is replicated.
  mesh = sharding.make_mesh((4, 2), ("fsdp", "tp"))
  config = models.LMConfig(**TINY, residual="hc", scan_layers=True)
  with jax.set_mesh(mesh), pytest.warns(sharding.UnmappedAxisWarning) as rec:
    lm = models.DecoderLM(config, rngs=nnx.Rngs(0))
  assert any("'layers'" in str(w.message) for w in rec)
  layer = lm.net.layers
  assert layer.blocks[1].up.kernel.out_sharding == (None, None, None)
  assert layer.res.steps[0].alpha_scale.out_sharding == (None,)


def test_scanned_deepnorm_scales_each_layer_at_init():
  # The same seed draws the same sublayers; DeepNorm scales them by beta
  # (query and key projections excepted) inside the stacking.
  def lm(residual):
    config = models.LMConfig(**TINY, residual=residual, scan_layers=True)
    return models.DecoderLM(config, rngs=nnx.Rngs(0))

  deep, post = lm("deepnorm"), lm("postnorm")
  beta = residual_fns.deepnorm_beta(2)
  for name in ("v_kernel", "out_kernel"):
    np.testing.assert_allclose(
      getattr(deep.net.layers.blocks[0], name)[...],
      beta * getattr(post.net.layers.blocks[0], name)[...],
      rtol=1e-6,
    )
  np.testing.assert_array_equal(
    deep.net.layers.blocks[0].q_kernel[...],
    post.net.layers.blocks[0].q_kernel[...],
  )
  np.testing.assert_allclose(
    deep.net.layers.blocks[1].up.kernel[...],
    beta * post.net.layers.blocks[1].up.kernel[...],
    rtol=1e-6,
  )


@pytest.mark.parametrize("residual", ["attnres", "block_attnres", "keel"])
def test_scan_refuses_schemes_without_a_scan_form(residual):
  reason = nn_res.RESIDUALS[residual].scan_refusal
  with pytest.raises(
    ValueError,
    match=rf"^DecoderLM: residual '{residual}' cannot be scanned: "
    rf"{reason}; use scan_layers=False$",
  ):
    models.DecoderLM(
      models.LMConfig(**TINY, residual=residual, scan_layers=True),
      rngs=nnx.Rngs(0),
    )
  with pytest.raises(ValueError, match=r"^ViT: residual 'attnres' cannot"):
    models.ViT(
      models.ViTConfig(**VIT, residual="attnres", scan_layers=True),
      rngs=nnx.Rngs(0),
    )


# ---------------------------------------------------------------------------
# Layout conversion.


def test_stack_and_unstack_round_trip_exactly():
  config = models.LMConfig(**TINY, residual="lns")
  unrolled = _perturbed(models.DecoderLM(config, rngs=nnx.Rngs(0)))
  state = nnx.state(unrolled)
  stacked = models.stack_layers(state, config, constants=True)
  built = models.DecoderLM(
    dataclasses.replace(config, scan_layers=True), rngs=nnx.Rngs(1)
  )
  # The structure (paths, variable types and metadata) of a built model.
  assert jax.tree.structure(stacked) == jax.tree.structure(nnx.state(built))
  kernel = stacked["net"]["layers"]["blocks"][1]["up"]["kernel"]
  np.testing.assert_array_equal(
    kernel[...][1], unrolled.net.blocks[3].up.kernel[...]
  )
  index = stacked["net"]["layers"]["res"]["steps"][1]["layer_index"]
  np.testing.assert_array_equal(index[...], [0, 1])
  helpers.assert_close(models.unstack_layers(stacked, config), state, atol=0)
  again = models.stack_layers(
    models.unstack_layers(stacked, config), config, constants=True
  )
  helpers.assert_close(again, stacked, atol=0)
  # Parameters only: no constants; bf16 stays bf16.
  params = jax.tree.map(
    lambda p: p.astype(jnp.bfloat16), nnx.state(unrolled, nnx.Param)
  )
  stacked_params = models.stack_layers(params, config)
  dtypes = {p.dtype for p in jax.tree.leaves(stacked_params)}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}
  assert jax.tree.structure(stacked_params) == jax.tree.structure(
    nnx.state(built, nnx.Param)
  )


def test_conversion_keeps_abstract_shardings():
  # Abstract leaves keep their shardings with the layer axis added or
  # dropped.
  config = models.LMConfig(**TINY, remat="full")
  mesh = sharding.make_mesh((2, 2, 2))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    abstract = nnx.eval_shape(
      lambda: models.DecoderLM(
        dataclasses.replace(config, scan_layers=True), rngs=nnx.Rngs(0)
      )
    )
    params = nnx.state(abstract, nnx.Param)
    shardings = nnx.get_named_sharding(params, mesh)
  target = jax.tree.map(
    lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
    params,
    shardings,
  )
  unrolled = models.unstack_layers(target, config)
  kernel = unrolled["net"]["blocks"][2]["q_kernel"]
  assert kernel.shape == (16, 2, 8)
  assert kernel.out_sharding == ("embed", "heads", "head_dim")
  assert kernel.get_value().sharding.spec == jax.sharding.PartitionSpec(
    "fsdp", "tensor", None
  )
  back = models.stack_layers(unrolled, config)
  assert jax.tree.structure(back) == jax.tree.structure(target)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(target)):
    assert a.shape == b.shape and a.sharding.spec == b.sharding.spec


def test_conversion_errors():
  config = models.LMConfig(**TINY)
  with pytest.raises(ValueError, match=r"config must be an LMConfig or a "):
    models.stack_layers(nnx.State({}), models.CNNConfig())
  with pytest.raises(ValueError, match=r"residual 'attnres' cannot be scanned"):
    models.stack_layers(
      nnx.State({}), dataclasses.replace(config, residual="attnres")
    )
  state = nnx.state(models.DecoderLM(config, rngs=nnx.Rngs(0)), nnx.Param)
  with pytest.raises(
    ValueError,
    match=r"stack_layers: net/blocks/2/k_kernel is not a variable of the "
    r"unrolled layout of this config",
  ):
    models.stack_layers(state, dataclasses.replace(config, depth=1))
  with pytest.raises(
    ValueError,
    match=r"net/blocks/4/k_kernel is missing \(layer 2 of "
    r"net/layers/blocks/0/k_kernel\)",
  ):
    models.stack_layers(state, dataclasses.replace(config, depth=3))
  with pytest.raises(
    ValueError,
    match=r"embed has shape \(32, 16\), but the config's model has "
    r"\(64, 16\)",
  ):
    models.stack_layers(state, dataclasses.replace(config, vocab_size=64))
  with pytest.raises(
    ValueError, match=r"unstack_layers: net/blocks/0/k_kernel is not a"
  ):
    models.unstack_layers(state, config)
  stacked = models.stack_layers(state, config)
  with pytest.raises(ValueError, match=r"stack_layers: net/layers/blocks"):
    models.stack_layers(stacked, config)


# ---------------------------------------------------------------------------
# Rematerialization.


def _remat_model(kind, remat, *, abstract=False):
  if kind in ("lm", "lm_scanned"):
    scan = kind == "lm_scanned"
    config = models.LMConfig(
      **TINY, residual="hc", scan_layers=scan, remat=remat
    )
    cls = models.DecoderLM
  elif kind == "vit":
    config = models.ViTConfig(**VIT, scan_layers=True, remat=remat)
    cls = models.ViT
  elif kind == "cnn":
    config = models.CNNConfig(**IMAGES, norm="groupnorm", remat=remat)
    cls = models.CNN
  else:
    config, cls = models.SNNConfig(**IMAGES, remat=remat), models.SNN
  build = lambda: cls(config, rngs=nnx.Rngs(0))  # noqa: E731
  return nnx.eval_shape(build) if abstract else build()


def _remat_input(kind, batch=2):
  return _tokens(batch) if kind.startswith("lm") else _images(batch)


@functools.cache
def _outputs_and_grads_of(kind, remat):
  return _outputs_and_grads(_remat_model(kind, remat), _remat_input(kind))


FAST_REMAT = {("lm_scanned", "dots")}


@pytest.mark.parametrize(
  ("kind", "remat"),
  [
    (k, r)
    if (k, r) in FAST_REMAT or k == "snn"
    else pytest.param(k, r, marks=pytest.mark.slow)
    for k in ("lm", "lm_scanned", "vit", "cnn", "snn")
    for r in POLICIES
  ],
)
def test_remat_keeps_outputs_and_gradients(kind, remat):
  want, want_grads = _outputs_and_grads_of(kind, "none")
  got, grads = _outputs_and_grads_of(kind, remat)
  # XLA fuses the rematerialized program differently: round-off only.
  helpers.assert_close(got, want, atol=1e-6, rtol=1e-5)
  # The same parameter tree: remat changes no path.
  assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    helpers.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _saved_bytes(model, x):
  """Bytes of the residuals ``jax.vjp`` keeps for the backward pass."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def residuals(params, rest):
    fn = lambda p: nnx.merge(graphdef, p, rest, copy=True)(x)  # noqa: E731
    return jax.tree.leaves(jax.vjp(fn, params)[1])

  return sum(
    int(np.prod(r.shape)) * r.dtype.itemsize
    for r in jax.eval_shape(residuals, params, rest)
  )


@pytest.mark.parametrize("kind", ["lm", "lm_scanned", "cnn", "snn"])
def test_remat_saves_fewer_residuals(kind):
  # A batch of 32: activations, not parameters, dominate what is saved.
  x = _remat_input(kind, batch=32)
  sizes = {
    r: _saved_bytes(_remat_model(kind, r, abstract=True), x)
    for r in layers.REMAT_CHOICES
  }
  assert sizes["full"] <= sizes["dots_no_batch"] <= sizes["dots"], sizes
  assert sizes["dots"] < sizes["none"] and sizes["full"] < sizes["none"], sizes


@pytest.mark.slow
def test_remat_shrinks_the_compiled_scanned_step():
  # Width 64, depth 4, 64 tokens: the scan body's remat leaves XLA only
  # each layer's carry to keep (measured on XLA:CPU, jax 0.10: temp
  # 23.4 MB without remat, 7.0 MB with "full").
  def temp_bytes(remat):
    config = models.LMConfig(
      vocab_size=64,
      width=64,
      depth=4,
      num_heads=4,
      max_len=64,
      scan_layers=True,
      remat=remat,
    )
    model = nnx.eval_shape(lambda: models.DecoderLM(config, rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, rest, tokens):
      logits = nnx.merge(graphdef, params, rest, copy=True)(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
        logits, tokens[:, 1:]
      ).mean()

    tokens = jax.ShapeDtypeStruct((8, 65), jnp.int32)
    compiled = jax.jit(jax.grad(loss)).lower(params, rest, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  assert temp_bytes("full") < 0.5 * temp_bytes("none")


def test_remat_refuses_unknown_policies():
  valid = r"'none', 'full', 'dots', 'dots_no_batch'; got 'all'"
  cases = [
    (models.DecoderLM, models.LMConfig(**TINY, remat="all")),
    (models.ViT, models.ViTConfig(**VIT, remat="all")),
    (models.CNN, models.CNNConfig(**IMAGES, remat="all")),
    (models.SNN, models.SNNConfig(**IMAGES, remat="all")),
  ]
  for cls, config in cases:
    with pytest.raises(
      ValueError, match=rf"^{cls.__name__}: remat must be one of {valid}$"
    ):
      cls(config, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"^rematerialize: remat must be one"):
    layers.rematerialize(jnp.tanh, "all")
