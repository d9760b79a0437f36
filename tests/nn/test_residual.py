"""Tests for jaxnorm.nn.residual: step modules, stacks and make_residual."""

import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm import sharding
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.oracles import hc_golden

HC_GOLDEN = pathlib.Path(hc_golden.__file__).with_name("hc_golden.npz")
STREAMS = ("hc", "mhc", "ohc", "ihc")


class MLP(nnx.Module):
  """GELU MLP with std 1/sqrt(fan_in) weights."""

  def __init__(self, d, *, rngs):
    self.w1 = nnx.Param(jax.random.normal(rngs.params(), (d, 4 * d)) / d**0.5)
    self.w2 = nnx.Param(jax.random.normal(rngs.params(), (4 * d, d)) / (2 * d))

  def __call__(self, x):
    h = jax.nn.gelu(x @ self.w1[...].astype(x.dtype))
    return h @ self.w2[...].astype(x.dtype)


class CausalAttention(nnx.Module):
  """Single-head causal softmax attention over axis -2."""

  def __init__(self, d, *, rngs):
    self.wqkv = nnx.Param(jax.random.normal(rngs.params(), (d, 3 * d)) / d**0.5)
    self.wo = nnx.Param(jax.random.normal(rngs.params(), (d, d)) / d**0.5)

  def __call__(self, x):
    q, k, v = jnp.split(x @ self.wqkv[...].astype(x.dtype), 3, axis=-1)
    s = jnp.einsum("...qd,...kd->...qk", q, k).astype(jnp.float32)
    s = s / math.sqrt(x.shape[-1])
    t = x.shape[-2]
    mask = jnp.tril(jnp.ones((t, t), bool)).reshape(
      (1,) * (s.ndim - 2) + (t, t)
    )
    p = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1).astype(x.dtype)
    return jnp.einsum("...qk,...kd->...qd", p, v) @ self.wo[...].astype(x.dtype)


class Linear(nnx.Module):
  """Bias-free linear branch ``x @ w``."""

  def __init__(self, w):
    self.w = nnx.Param(jnp.asarray(w))

  def __call__(self, x):
    return x @ self.w[...].astype(x.dtype)


def transformer(num_layers, d, seed=0):
  rngs = nnx.Rngs(seed)
  return [
    f(d, rngs=rngs) for _ in range(num_layers) for f in (CausalAttention, MLP)
  ]


def _kwargs(name, **extra):
  kw = dict(extra)
  if name in STREAMS:
    kw.setdefault("readout", "mean")
  if name == "postnorm":
    kw.setdefault("norm", "rmsnorm")
  if name == "block_attnres":
    kw.setdefault("num_blocks", 2)
  return kw


def _net(name, num_layers, d, seed=0, **extra):
  return nn_res.make_residual(
    name,
    transformer(num_layers, d, seed),
    num_features=d,
    rngs=nnx.Rngs(seed + 1),
    **_kwargs(name, **extra),
  )


def _loss_and_grads(net, x):
  graphdef, params = nnx.split(net)

  def loss(params, x):
    y = nnx.merge(graphdef, params)(x)
    return jnp.mean(y.astype(jnp.float32) ** 2), y

  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
  return fn(params, x)


# ---------------------------------------------------------------------------
# Registry and errors.


def test_make_residual_unknown_name_lists_names():
  with pytest.raises(
    ValueError,
    match=r"unknown residual scheme 'mhc2'; "
    r"valid names are attnres, block_attnres, hc, ihc, "
    r"layerscale, lns, mhc, ohc, postnorm, prenorm, "
    r"rezero, sandwich, scaled, skipinit",
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
# Modules equal their functions.


def test_hc_module_matches_golden_and_function():
  data = np.load(HC_GOLDEN)
  for case in ("dynamic", "dynamic_notanh", "static"):
    x = jnp.asarray(data[f"hc/{case}/x"])
    d = x.shape[-1]
    blocks = [Linear(data[f"hc/{case}/w{k}"].T) for k in range(2)]
    net = nn_res.make_residual(
      "hc",
      blocks,
      num_features=d,
      rngs=nnx.Rngs(0),
      norm=None,
      tanh=case != "dynamic_notanh",
    )
    for k, step in enumerate(net.steps):
      p = lambda n, k=k: jnp.asarray(data[f"hc/{case}/p{k}/{n}"])  # noqa
      step.static_alpha[...] = p("static_alpha")
      step.static_beta[...] = p("static_beta")
      step.dynamic_alpha[...] = p("dynamic_alpha_fn")
      step.dynamic_beta[...] = p("dynamic_beta_fn")
      step.alpha_scale[...] = p("dynamic_alpha_scale")
      step.beta_scale[...] = p("dynamic_beta_scale")
      step.norm_scale[...] = p("norm.gamma")
    helpers.assert_close(net(x), data[f"hc/{case}/y"], atol=1e-5)
  h = jax.random.normal(jax.random.key(0), (2, 4, d))
  step = net.steps[1]
  maps = R.hc_maps(
    h,
    static_alpha=step.static_alpha[...],
    static_beta=step.static_beta[...],
    dynamic_alpha=step.dynamic_alpha[...],
    dynamic_beta=step.dynamic_beta[...],
    alpha_scale=step.alpha_scale[...],
    beta_scale=step.beta_scale[...],
    norm_scale=step.norm_scale[...],
  )
  helpers.assert_close(
    step(h, jnp.tanh),
    R.hyper_connection(
      h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    atol=1e-6,
  )


@pytest.mark.parametrize("residual_map", ["sinkhorn", "quaternion"])
def test_mhc_module_matches_function(residual_map):
  d = 8
  m = nn_res.ManifoldHyperConnection(
    d, residual_map=residual_map, phi_init_std=0.1, norm=None, rngs=nnx.Rngs(3)
  )
  h = jax.random.normal(jax.random.key(1), (2, 4, d))
  maps = R.mhc_maps(
    h,
    phi_pre=m.phi_pre[...],
    phi_post=m.phi_post[...],
    phi_res=m.phi_res[...],
    b_pre=m.b_pre[...],
    b_post=m.b_post[...],
    b_res=m.b_res[...],
    residual=residual_map,
  )
  helpers.assert_close(
    m(h, jnp.sin),
    R.hyper_connection(
      h, jnp.sin, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    atol=1e-6,
  )
  assert float(jnp.std(m.phi_res[...])) > 0.05  # phi_init_std is used


def test_scaled_and_gated_modules():
  d = 8
  x = jax.random.normal(jax.random.key(0), (3, d))
  f = Linear(jax.random.normal(jax.random.key(1), (d, d)))
  blocks = [f, f, f, f]
  # Spec 5 test 3: ScaledResidual('1/n') = plain residual with branch / n.
  net = nn_res.make_residual(
    "scaled", blocks, num_features=d, rngs=nnx.Rngs(0), norm=None
  )
  expected = x
  for _ in range(4):
    expected = expected + f(expected) / 4
  helpers.assert_close(net(x), expected, atol=1e-6)
  # SkipInit / ReZero: identity network at init (spec 6 test 1).
  for name in ("skipinit", "rezero"):
    net = nn_res.make_residual(name, blocks, num_features=d, rngs=nnx.Rngs(0))
    helpers.assert_close(net(x), x, atol=0)
  shared = nn_res.make_residual(
    "rezero",
    blocks,
    num_features=d,
    rngs=nnx.Rngs(0),
    shared=True,
    sublayers_per_layer=2,
  )
  assert shared.steps[0] is shared.steps[1]
  assert shared.steps[1] is not shared.steps[2]
  assert len(jax.tree.leaves(nnx.state(shared, nnx.Param))) == 2 + 1
  ls = nn_res.make_residual(
    "layerscale", blocks, num_features=d, rngs=nnx.Rngs(0)
  )
  assert ls.steps[0].gate[...].shape == (d,)
  np.testing.assert_allclose(ls.steps[0].gate[...], 1e-5)


def test_lns_uses_layer_index_per_transformer_layer():
  net = nn_res.make_residual(
    "lns",
    transformer(3, 8),
    num_features=8,
    rngs=nnx.Rngs(0),
    sublayers_per_layer=2,
  )
  assert [s.layer_index for s in net.steps] == [0, 0, 1, 1, 2, 2]


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


def test_ihc_streams_equal_plain_residual_stream():
  d, x = 16, jax.random.normal(jax.random.key(0), (2, 5, 16))
  net = _net("ihc", 2, d)
  plain = _net("prenorm", 2, d)(x)
  h = R.expand_streams(x, 4)
  for block, step in zip(net.blocks, net.steps):
    h = step(h, block)
  helpers.assert_close(
    h, jnp.broadcast_to(plain[..., None, :], h.shape), atol=1e-5
  )


def _attnres_numpy(x, ys_fn, queries, block_size):
  """Float64 AttnRes wiring from the spec, with zero or given queries."""
  completed, partial, inputs = [x], None, []
  for k, (f, w) in enumerate(zip(ys_fn, queries)):
    src = np.stack(completed if partial is None else completed + [partial])
    keys = src / np.sqrt(np.mean(src**2, -1, keepdims=True) + 1e-6)
    s = keys @ w
    a = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)
    h = np.sum(a[..., None] * src, 0)
    inputs.append(h)
    if k and k % block_size == 0:
      completed, partial = completed + [partial], None
    y = f(h)
    partial = y if partial is None else partial + y
  return inputs, completed + [partial]


@pytest.mark.parametrize("block_size", [1, 2])
def test_attnres_stack_matches_numpy_wiring(block_size):
  d, num = 8, 6
  rng = np.random.RandomState(0)
  ws = [rng.randn(d, d) / np.sqrt(d) for _ in range(num)]
  blocks = [Linear(w.astype(np.float32)) for w in ws]
  net = nn_res.AttnResStack(
    blocks, num_features=d, block_size=block_size, norm=None, rngs=nnx.Rngs(0)
  )
  queries = [rng.randn(d) for _ in range(num)]
  for q, w in zip(net.queries, queries):
    q.query[...] = jnp.asarray(w, jnp.float32)
  x = rng.randn(3, d)
  y, hidden = net(jnp.asarray(x, jnp.float32), return_hidden=True)
  fns = [lambda h, w=w: h @ w for w in ws]
  inputs, final = _attnres_numpy(x, fns, queries, block_size)
  helpers.assert_close(hidden, np.stack(inputs), atol=1e-4)
  helpers.assert_close(y, np.mean(np.stack(final), 0), atol=1e-4)


def test_block_attnres_limits():
  # Spec 4 test 4: N = L equals Full; N = 1 with w = 0 gives
  # b_0 first, then (b_0 + b_1^{i-1}) / 2.
  d, x = 8, jax.random.normal(jax.random.key(0), (2, 3, 8))
  blocks = transformer(2, d)
  full = nn_res.make_residual(
    "attnres", blocks, num_features=d, rngs=nnx.Rngs(1)
  )
  per = nn_res.make_residual(
    "block_attnres", blocks, num_features=d, rngs=nnx.Rngs(1), num_blocks=4
  )
  helpers.assert_close(per(x), full(x), atol=1e-6)
  one = nn_res.make_residual(
    "block_attnres",
    blocks,
    num_features=d,
    rngs=nnx.Rngs(1),
    num_blocks=1,
    norm=None,
  )
  _, hidden = one(x, return_hidden=True)
  helpers.assert_close(hidden[0], x, atol=1e-6)
  partial = blocks[0](x)
  helpers.assert_close(hidden[1], (x + partial) / 2, atol=1e-5)
  partial = partial + blocks[1](hidden[1])
  helpers.assert_close(hidden[2], (x + partial) / 2, atol=1e-5)


# ---------------------------------------------------------------------------
# Numerics of every scheme.


@pytest.mark.parametrize("name", sorted(nn_res.RESIDUALS))
@pytest.mark.parametrize(
  "dtype", [pytest.param(jnp.float32, marks=pytest.mark.slow), jnp.bfloat16]
)
def test_short_stack_finite_and_keeps_dtype(name, dtype):
  d = 16
  x = jax.random.normal(jax.random.key(0), (2, 4, d)).astype(dtype)
  (loss, y), grads = _loss_and_grads(_net(name, 2, d), x)
  assert y.dtype == dtype and y.shape == x.shape
  assert helpers.all_finite((loss, y, grads))
  leaves = jax.tree.leaves(grads[0])
  assert any(float(jnp.max(jnp.abs(g))) > 0 for g in leaves)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(nn_res.RESIDUALS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_24_layer_stack_finite(name, dtype):
  d = 32
  x = jax.random.normal(jax.random.key(0), (2, 8, d)).astype(dtype)
  (loss, y), grads = _loss_and_grads(_net(name, 24, d), x)
  assert y.dtype == dtype
  assert helpers.all_finite((loss, y, grads))


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


def depth_growth(name):
  d = 32
  x = jax.random.normal(jax.random.key(0), (2, 8, d))
  net = _net(
    name, 24, d, **({"num_blocks": 8} if name == "block_attnres" else {})
  )
  graphdef, params = nnx.split(net)
  fn = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x, return_hidden=True))
  _, hidden = fn(params, x)
  rms = jnp.sqrt(jnp.mean(hidden**2, axis=(1, 2, 3)))
  return float(rms[-1] / rms[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(nn_res.RESIDUALS))
def test_depth_growth_table(name):
  np.testing.assert_allclose(depth_growth(name), _table()[name], rtol=0.1)


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
