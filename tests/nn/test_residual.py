"""Tests for jaxnorm.nn.residual across its schemes: the registry, the
errors of make_residual and make_residual_step, and the claims every
scheme must meet (keys, degenerate rows, ranks, tabulate, scan, depth
table, sharding names). The modules of one paper are tested in
tests/residual/test_<paper>.py."""

import functools
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import sharding
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import registry
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.residual._common import (
  MLP,
  CausalAttention,
  _kwargs,
  _net,
  transformer,
)

STREAMS = ("hc", "mhc", "ohc", "ihc")
NAMES = tuple(nn_res.RESIDUALS)


# ---------------------------------------------------------------------------
# Registry and errors.


def test_make_residual_unknown_name_lists_names():
  with pytest.raises(
    ValueError,
    match=r"unknown residual scheme 'mhc2'; "
    r"valid names are attnres, block_attnres, completep, deepnorm, "
    r"depth_mup, hc, ihc, keel, layerscale, lns, mhc, ohc, postnorm, "
    r"prenorm, rezero, sandwich, scaled, skipinit",
  ):
    nn_res.make_residual(
      "mhc2", transformer(1, 8), num_features=8, rngs=nnx.Rngs(0)
    )


def test_make_residual_errors():
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match="blocks must hold at least one"):
    nn_res.make_residual("prenorm", [], num_features=8, rngs=rngs)
  with pytest.raises(
    ValueError,
    match=r"every block must be callable.*"
    r"blocks\[1\] of type int",
  ):
    nn_res.make_residual("prenorm", [jnp.tanh, 3], num_features=8, rngs=rngs)
  with pytest.raises(
    ValueError, match="len.blocks.=6 must be divisible by num_blocks=4"
  ):
    nn_res.make_residual(
      "block_attnres",
      transformer(3, 8),
      num_features=8,
      rngs=rngs,
      num_blocks=4,
    )
  with pytest.raises(
    ValueError, match="needs num_streams=4, got num_streams=3"
  ):
    nn_res.make_residual(
      "ohc", transformer(1, 8), num_features=8, rngs=rngs, num_streams=3
    )
  with pytest.raises(ValueError, match="readout must be one of"):
    nn_res.make_residual(
      "hc", transformer(1, 8), num_features=8, rngs=rngs, readout="max"
    )
  with pytest.raises(ValueError, match="unknown norm 'bad'"):
    nn_res.make_residual(
      "prenorm", transformer(1, 8), num_features=8, rngs=rngs, norm="bad"
    )
  with pytest.raises(ValueError, match="need one step per block"):
    nn_res.ResidualStack([jnp.tanh], [], num_features=8)
  with pytest.raises(ValueError, match="layer_index must be a non-negative"):
    nn_res.PreNormResidual(8, layer_index=-2, rngs=rngs)
  with pytest.raises(ValueError, match="shape must be one of"):
    nn_res.GatedResidual(8, shape="matrix", rngs=rngs)


def test_wrong_input_width_or_stream_count_raises():
  net = nn_res.make_residual(
    "mhc", [jnp.tanh], num_features=8, rngs=nnx.Rngs(0)
  )
  with pytest.raises(
    ValueError,
    match=r"x must have num_features=8 "
    r"features in its last axis, got x.shape=\(2, 6\)",
  ):
    net(jnp.zeros((2, 6)))
  step = net.steps[0]
  with pytest.raises(
    ValueError,
    match=r"ManifoldHyperConnection: h must end "
    r"in \(num_streams, num_features\)=\(4, 8\), got "
    r"h.shape=\(2, 3, 8\)",
  ):
    step(jnp.zeros((2, 3, 8)), jnp.tanh)  # 3 streams into a 4-stream mHC
  hc = nn_res.HyperConnection(8, layer_index=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"HyperConnection: h must end in"):
    hc(jnp.zeros((5, 2, 8)), jnp.tanh)
  with pytest.raises(ValueError, match=r"h must have rank >= 2"):
    hc(jnp.zeros((8,)), jnp.tanh)


# ---------------------------------------------------------------------------
# Initialization claims.


@pytest.mark.parametrize("name", STREAMS)
def test_stream_networks_at_init_are_n_copies_of_prenorm(name):
  # HC spec 1 test 1 at network level; for mHC/oHC/iHC the same holds with
  # the documented init. "sum" readout = n * prenorm, "mean" = prenorm.
  d, x = 16, jax.random.normal(jax.random.key(0), (2, 5, 16))
  plain = _net("prenorm", 2, d)(x)
  net = _net(name, 2, d, readout="sum")
  helpers.assert_close(net(x), 4 * plain, atol=1e-5)
  y, hidden = _net(name, 2, d)(x, return_hidden=True)
  helpers.assert_close(y, plain, atol=1e-5)
  assert hidden.shape == (4, 2, 5, 16)


# ---------------------------------------------------------------------------
# Registry: specs, defaults, names.


def test_registry_holds_specs_and_the_literal_lists_every_name():
  assert typing.get_args(nn_res.ResidualName) == NAMES
  assert all(
    isinstance(spec, registry.ResidualSpec)
    for spec in nn_res.RESIDUALS.values()
  )
  with pytest.raises(TypeError):
    nn_res.RESIDUALS["x"] = nn_res.RESIDUALS["prenorm"]
  # The papers' SkipInit and ReZero branches have no norm.
  assert {n for n, s in nn_res.RESIDUALS.items() if not s.uses_norm} == {
    "skipinit",
    "rezero",
  }
  assert nn_res.SCAN_RESIDUALS == tuple(
    n for n in NAMES if "attnres" not in n and n != "keel"
  )
  assert nn_res.NORM_FREE_SCHEMES == (
    "prenorm",
    "scaled",
    "layerscale",
    "depth_mup",
    "completep",
  )
  specs = nn_res.RESIDUALS.items()
  assert {n for n, s in specs if s.shareable} == {"skipinit", "rezero"}
  assert {n for n, s in specs if s.fused} == {"prenorm"}
  assert {n for n, s in specs if s.step is None} == {"attnres", "block_attnres"}


def test_residual_spec_checks_its_capabilities():
  spec = nn_res.RESIDUALS["prenorm"]
  with pytest.raises(
    ValueError,
    match=r"ResidualSpec: a scheme without a step builder cannot be "
    r"scanned; give scan_refusal the reason",
  ):
    registry.ResidualSpec(spec.build, spec.paper)
  with pytest.raises(
    ValueError, match=r"ResidualSpec: norm_free=True needs uses_norm=True"
  ):
    registry.ResidualSpec(
      spec.build, spec.paper, step=spec.step, uses_norm=False, norm_free=True
    )
  assert registry.ResidualSpec(spec.build, spec.paper, step=spec.step).scannable
  assert not nn_res.RESIDUALS["keel"].scannable


_NORM_CLASSES = tuple({spec.module for spec in nn_norms.NORMS.values()})


def _norm_modules(net):
  return [m for _, m in nnx.iter_graph(net) if isinstance(m, _NORM_CLASSES)]


def _scan_two_layers(name, x):
  """Two layers of ``name``'s steps, stacked by vmap and run by nnx.scan."""

  @nnx.split_rngs(splits=2)
  @nnx.vmap(in_axes=(0, 0))
  def create(index, rngs):
    return nn_res.make_residual_step(
      name, x.shape[-1], layer_index=index, num_layers=2, rngs=rngs
    )

  layers = create(jnp.arange(2), nnx.Rngs(0))

  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
  def body(carry, layer):
    return layer(carry, [jnp.tanh, jnp.sin])

  return layers.output(body(layers.embed(x), layers))


@pytest.mark.parametrize("name", NAMES)
def test_spec_capabilities_match_behaviour(name):
  # Each capability field of the spec, against what make_residual and
  # make_residual_step do with the scheme (a new scheme is checked here
  # the moment it is registered).
  spec = nn_res.RESIDUALS[name]
  d, blocks = 8, [jnp.tanh, jnp.sin] * 2
  x = jax.random.normal(jax.random.key(0), (2, 3, d))

  def build(**kwargs):
    return nn_res.make_residual(
      name, blocks, num_features=d, rngs=nnx.Rngs(0), **kwargs
    )

  net = build()
  assert bool(_norm_modules(net)) == spec.uses_norm
  assert hasattr(net, "steps") == (spec.step is not None)
  if spec.norm_free:
    free = build(norm=nn_res.NORM_FREE)
    assert not _norm_modules(free)
    assert helpers.all_finite(free(x))
  else:
    with pytest.raises(
      ValueError, match=rf"needs a scheme that runs without one, got '{name}'"
    ):
      build(norm=nn_res.NORM_FREE)
  if spec.shareable:
    shared = build(shared=True)
    assert shared.steps[0] is shared.steps[1]
    assert shared.steps[1] is not shared.steps[2]
  else:
    with pytest.raises(
      ValueError, match=rf"shared applies to .* only, got '{name}'"
    ):
      build(shared=True)
  if spec.fused:
    fused = build(fused_implementation="xla")
    assert fused.fused
    helpers.assert_close(fused(x), net(x), atol=1e-5)
  else:
    with pytest.raises(
      ValueError, match=rf"fused_implementation applies to .* got '{name}'"
    ):
      build(fused_implementation="xla")
  if spec.scannable:
    y = _scan_two_layers(name, x)
    assert y.shape == x.shape and helpers.all_finite(y)
  else:
    with pytest.raises(
      ValueError,
      match=rf"make_residual_step: residual scheme '{name}' "
      + re.escape(spec.scan_refusal),
    ):
      nn_res.make_residual_step(
        name, d, layer_index=0, num_layers=2, rngs=nnx.Rngs(0)
      )


def test_spec_defaults():
  spec = nn_res.RESIDUALS
  assert spec["lns"].defaults(48, 2) == {"sublayers_per_layer": 2}
  assert spec["rezero"].defaults(48, 2) == {
    "sublayers_per_layer": 2,
    "shared": True,
  }
  assert spec["skipinit"].defaults(48, 2) == {}
  for name in STREAMS:
    assert spec[name].defaults(8, 2) == {"num_streams": 4, "readout": "mean"}
  blocks = spec["block_attnres"].defaults
  assert [blocks(n, 2)["num_blocks"] for n in (48, 12, 14, 4)] == [8, 6, 7, 4]
  init = [
    spec["layerscale"].defaults(2 * L, 2)["init_value"] for L in (12, 24, 36)
  ]
  assert init == [0.1, 1e-5, 1e-6]  # CaiT's rule by depth.
  assert spec["hc"].decay == {"static_alpha": False}
  assert spec["mhc"].decay == {"b_res": False}


def test_make_residual_applies_spec_defaults_under_user_kwargs():
  blocks = transformer(1, 8)
  net = nn_res.make_residual("hc", blocks, num_features=8, rngs=nnx.Rngs(0))
  assert (net.readout, net.num_streams) == ("mean", 4)
  net = nn_res.make_residual(
    "hc", blocks, num_features=8, rngs=nnx.Rngs(0), readout="sum"
  )
  assert net.readout == "sum"
  net = nn_res.make_residual(
    "block_attnres", transformer(3, 8), num_features=8, rngs=nnx.Rngs(0)
  )
  assert net.block_size == 1  # 6 sublayers: 6 blocks (8 does not divide).
  with pytest.raises(
    ValueError, match="shared applies to skipinit, rezero only, got 'prenorm'"
  ):
    nn_res.make_residual(
      "prenorm", blocks, num_features=8, rngs=nnx.Rngs(0), shared=True
    )
  with pytest.raises(
    ValueError, match="sublayers_per_layer must be a positive"
  ):
    nn_res.make_residual(
      "lns", blocks, num_features=8, rngs=nnx.Rngs(0), sublayers_per_layer=0
    )


@pytest.mark.parametrize("name", NAMES)
def test_every_module_draws_one_key_whatever_the_norm(name):
  # Norms draw 0 (seednorm), 1 (rmsnorm) or 2 (layernorm) keys themselves;
  # inside a residual module they draw from a key derived from the
  # module's one key, so later modules initialize the same.
  variants = [{"norm": n} for n in ("rmsnorm", "layernorm", "seednorm")]
  if name in ("mhc", "ohc", "ihc"):
    variants.append({"phi_init_std": 0.1})
  counts, nexts = set(), set()
  for kwargs in variants:
    rngs = nnx.Rngs(0)
    net = nn_res.make_residual(
      name, [jnp.tanh] * 4, num_features=8, rngs=rngs, **kwargs
    )
    modules = len({id(s) for s in net.steps}) if hasattr(net, "steps") else 1
    counts.add((int(rngs.params.count[...]), modules))
    nexts.add(int(jax.random.key_data(rngs.params())[-1]))
  assert len(nexts) == 1 and len(counts) == 1
  ((drawn, modules),) = counts
  assert drawn == modules


# ---------------------------------------------------------------------------
# Degenerate inputs and wrong ranks, walking the registry.


@functools.cache
def _small_net(name):
  """A one-layer (attention + MLP) stack per scheme, built once."""
  return _net(name, 1, 16)


@pytest.mark.parametrize("name", NAMES)
def test_degenerate_rows_stay_finite_with_gradients(name):
  # bf16 rows: unit Gaussian, all zero, and scaled to 1e4.
  x = jax.random.normal(jax.random.key(0), (3, 4, 16))
  x = x.at[1].set(0.0).at[2].multiply(1e4).astype(jnp.bfloat16)
  net = _small_net(name)
  graphdef, params = nnx.split(net)

  def loss(params, x):
    y = nnx.merge(graphdef, params)(x)
    return jnp.mean(jnp.tanh(y.astype(jnp.float32))), y

  (value, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
    params, x
  )
  assert y.dtype == jnp.bfloat16 and y.shape == x.shape
  assert helpers.all_finite((value, y, grads)), name
  assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("name", NAMES)
def test_wrong_rank_or_width_raises_named_errors(name):
  net = _small_net(name)
  who = type(net).__name__
  with pytest.raises(
    ValueError, match=rf"^{who}: x must have rank >= 1, got x.ndim=0"
  ):
    net(jnp.float32(1.0))
  with pytest.raises(
    ValueError, match=rf"^{who}: x must have num_features=16 features"
  ):
    net(jnp.zeros((2, 3, 8)))
  if name in nn_res.SCAN_RESIDUALS:
    step = net.steps[0]
    rank = 2 if name in STREAMS else 1
    with pytest.raises(
      ValueError,
      match=rf"^{type(step).__name__}: (x|h) must have rank >= {rank}",
    ):
      step(jnp.zeros((16,) * (rank - 1)), jnp.tanh)


# ---------------------------------------------------------------------------
# nnx.tabulate.


@pytest.mark.parametrize("name", ["prenorm", "hc", "attnres"])
def test_tabulate_renders_every_stack(name):
  # Each step receives its sublayer; flax's tabulate cannot render a
  # Module argument, so the stacks hand over a named wrapper.
  rngs = nnx.Rngs(0)
  blocks = [nnx.Linear(8, 8, rngs=rngs), nnx.Linear(8, 8, rngs=rngs)]
  net = nn_res.make_residual(name, blocks, num_features=8, rngs=rngs)
  table = nnx.tabulate(net, jnp.ones((2, 8)), console_kwargs={"width": 200})
  assert "blocks/1" in table and "Total Parameters" in table
  if name != "attnres":
    assert re.search(r"steps/0\s.*\n.*\n?.*- Linear", table)


def test_tabulate_renders_the_fused_stack():
  rngs = nnx.Rngs(0)
  blocks = [nnx.Linear(8, 8, rngs=rngs), nnx.Linear(8, 8, rngs=rngs)]
  net = nn_res.make_residual(
    "prenorm", blocks, num_features=8, rngs=rngs, fused_implementation="xla"
  )
  assert "blocks/1" in nnx.tabulate(net, jnp.ones((2, 8)))


# ---------------------------------------------------------------------------
# nnx.scan over layers.

SCAN_FAST = ("lns", "rezero", "scaled", "hc", "mhc")
NUM_LAYERS, WIDTH = 2, 8


class _Layer(nnx.Module):
  """A user's layer: attention, MLP and the residual step by name."""

  def __init__(self, name, index, rngs):
    self.attn = CausalAttention(WIDTH, rngs=rngs)
    self.mlp = MLP(WIDTH, rngs=rngs)
    self.res = nn_res.make_residual_step(
      name,
      WIDTH,
      layer_index=index,
      num_layers=NUM_LAYERS,
      rngs=rngs,
      **_kwargs(name),
    )


def _scanned_layers(name):
  @nnx.split_rngs(splits=NUM_LAYERS)
  @nnx.vmap(in_axes=(0, 0))
  def create(index, rngs):
    return _Layer(name, index, rngs)

  return create(jnp.arange(NUM_LAYERS), nnx.Rngs(0))


@nnx.jit
def _scan_forward(layers, x):
  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
  def body(carry, layer):
    return layer.res(carry, [layer.attn, layer.mlp])

  return layers.res.output(body(layers.res.embed(x), layers))


def _unstack(layers):
  graphdef, state = nnx.split(layers)
  return [
    nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
    for i in range(NUM_LAYERS)
  ]


@pytest.mark.parametrize(
  "name",
  [
    n if n in SCAN_FAST else pytest.param(n, marks=pytest.mark.slow)
    for n in nn_res.SCAN_RESIDUALS
  ],
)
def test_scan_over_layers_equals_unrolled_stack(name):
  layers = _scanned_layers(name)
  x = jax.random.normal(jax.random.key(1), (2, 5, WIDTH))
  per_layer = _unstack(layers)
  blocks = [f for layer in per_layer for f in (layer.attn, layer.mlp)]
  # A scanned step cannot scale its sublayers (DeepNorm's init gain).
  extra = {"init_gain": False} if name == "deepnorm" else {}
  net = nn_res.make_residual(
    name, blocks, num_features=WIDTH, rngs=nnx.Rngs(5), **_kwargs(name, **extra)
  )
  # At init: the index-dependent parts (LNS factor, HC's read stream) agree.
  helpers.assert_close(_scan_forward(layers, x), net(x), atol=1e-5)
  # With perturbed residual parameters copied step by step.
  res_params = nnx.state(layers.res, nnx.Param)
  noise = jax.tree.map(
    lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape),
    res_params,
  )
  nnx.update(layers.res, noise)
  for i, layer in enumerate(_unstack(layers)):
    for j, step in enumerate(layer.res.steps):
      nnx.update(net.steps[2 * i + j], nnx.state(step, nnx.Param))
  helpers.assert_close(_scan_forward(layers, x), net(x), atol=1e-5)


def test_make_residual_step_errors_and_carry():
  with pytest.raises(
    ValueError,
    match=r"make_residual_step: residual scheme 'attnres' has no fixed-size "
    r"scan carry; valid names are prenorm, ",
  ):
    nn_res.make_residual_step(
      "attnres", 8, layer_index=0, num_layers=2, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match="num_layers must be a positive"):
    nn_res.make_residual_step(
      "prenorm", 8, layer_index=0, num_layers=0, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match="layer_index must be a non-negative"):
    nn_res.make_residual_step(
      "lns", 8, layer_index=-1, num_layers=2, rngs=nnx.Rngs(0)
    )
  layer = nn_res.make_residual_step(
    "mhc", 8, layer_index=1, num_layers=2, rngs=nnx.Rngs(0)
  )
  x = jnp.ones((3, 8))
  assert layer.embed(x).shape == (3, 4, 8)
  helpers.assert_close(layer.output(layer.embed(x)), x, atol=0)
  with pytest.raises(ValueError, match="need one sublayer per step, got 1"):
    layer(layer.embed(x), [jnp.tanh])


# ---------------------------------------------------------------------------
# 24-layer stacks: depth growth and finiteness, one evaluation per scheme.


def _table():
  rows = {}
  for line in nn_res.__doc__.splitlines():
    m = re.match(r"^([a-z0-9_ (/),]+?)\s{2,}(\d+\.\d+)\s", line + " ")
    if m:
      for name in re.split(r",\s*", m.group(1)):
        rows[name.split(" ")[0]] = float(m.group(2))
  return rows


def test_depth_table_lists_every_scheme():
  assert set(_table()) == set(nn_res.RESIDUALS)


def _deep_evaluation(name, dtype):
  """Loss, hidden states and gradients of the 24-layer table stack.

  Eager (op by op): the 48 sublayers repeat a few shapes, so each
  primitive compiles once for all schemes instead of one 48-sublayer
  program per scheme.
  """
  d = 32
  x = jax.random.normal(jax.random.key(0), (2, 8, d)).astype(dtype)
  graphdef, params = nnx.split(_net(name, 24, d))

  def loss(params, x):
    y, hidden = nnx.merge(graphdef, params)(x, return_hidden=True)
    return jnp.mean(y.astype(jnp.float32) ** 2), (y, hidden)

  fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  return fn(params, x)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_24_layer_stack_depth_growth_and_finite(name):
  # float32: the table's growth (hidden RMS after the last layer over its
  # RMS after the first), and finite values and gradients.
  (loss, (y, hidden)), grads = _deep_evaluation(name, jnp.float32)
  assert helpers.all_finite((loss, y, grads))
  rms = jnp.sqrt(jnp.mean(hidden**2, axis=(1, 2, 3)))
  np.testing.assert_allclose(rms[-1] / rms[1], _table()[name], rtol=0.1)
  # bfloat16: finite values and gradients, dtype kept.
  (loss, (y, _)), grads = _deep_evaluation(name, jnp.bfloat16)
  assert y.dtype == jnp.bfloat16
  assert helpers.all_finite((loss, y, grads))


# ---------------------------------------------------------------------------
# Sharding names.


def test_logical_axis_names_of_stream_parameters():
  mesh = sharding.make_mesh((2, 2, 1))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    net = nn_res.make_residual(
      "mhc", [jnp.tanh], num_features=8, rngs=nnx.Rngs(0)
    )
    specs = nnx.get_partition_spec(nnx.state(net))
  step = specs["steps"][0]
  assert step["b_res"].get_value() == jax.P(None, None)
  assert step["phi_res"].get_value() == jax.P("fsdp", None)
  hc = nn_res.HyperConnection(8, layer_index=0, rngs=nnx.Rngs(0))
  assert hc.static_alpha.out_sharding == ("streams", None)
  assert hc.dynamic_alpha.out_sharding == ("embed", None)
