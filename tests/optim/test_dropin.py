"""The optimizers inside other people's models: nnx.Optimizer under a mesh,
linen ``nn.Partitioned`` trees, einsum and ``(out, in)`` kernels, axes from
logical names, and axes rules that never see optax placeholders."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.nnx.training import optimizer as nnx_optimizer

from jaxnorm import optim
from tests import helpers

RULES = (("embed", None), ("heads", "tp"), ("head_dim", None), ("norm", None))
NAMES = {
  "q": ("embed", "heads", "head_dim"),  # flax query kernel
  "o": ("heads", "head_dim", "embed"),  # output projection
  "scale": ("norm",),
}
SHAPES = {"q": (8, 4, 6), "o": (4, 6, 8), "scale": (8,)}


def _decayed(params):
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _factory(name, axes):
  kw = dict(axes=axes, mask=_decayed)
  return {
    "adamp": lambda: optim.adamp(0.05, weight_decay=0.1, **kw),
    "sgdp": lambda: optim.sgdp(0.05, momentum=0.9, weight_decay=0.1, **kw),
    # eps bounds the amplification of rounding in small projected
    # coordinates (sharded reductions round differently).
    "conda": lambda: optax.chain(
      optim.conda(0.05, eps=1e-3, weight_decay=0.1, update_proj_gap=2, **kw),
      optim.nap_project(_decayed),
    ),
    "rmnp": lambda: optim.rmnp(0.05, weight_decay=0.1, **kw),
  }[name]()


class _Block(nnx.Module):
  def __init__(self, rngs):
    for k, shape in SHAPES.items():
      value = 0.5 * jax.random.normal(rngs.params(), shape)
      setattr(self, k, nnx.Param(value, out_sharding=NAMES[k]))

  def __call__(self, x):
    h = jnp.einsum("bd,dnh->bnh", x, self.q[...])
    y = jnp.einsum("bnh,nhd->bd", h, self.o[...])
    return y * self.scale[...].reshape(1, -1)


def _loss(model, x, y):
  return jnp.mean(jnp.square(model(x) - y))


@nnx.jit
def _nnx_step(model, opt, x, y):
  grads = nnx.grad(_loss)(model, x, y)
  opt.update(model, grads)


def _train_nnx(name, mesh):
  # A batch of 16 keeps Conda's moments full rank (a rank-deficient moment
  # has projected coordinates at rounding level, of arbitrary sign).
  kx, ky = jax.random.split(jax.random.key(1))
  x = jax.random.normal(kx, (16, 8))
  y = jax.random.normal(ky, (16, 8))
  model = _Block(nnx.Rngs(0))
  axes = optim.logical_axes(nnx.state(model, nnx.Param))
  opt = nnx.Optimizer(model, _factory(name, axes), wrt=nnx.Param)
  for _ in range(2):
    _nnx_step(model, opt, x, y)
  return model, opt


@pytest.mark.parametrize("name", ["adamp", "sgdp", "conda", "rmnp"])
def test_nnx_optimizer_under_a_mesh_with_logical_rules(name):
  mesh = jax.make_mesh(
    (2,),
    ("tp",),
    devices=jax.devices()[:2],
    axis_types=(jax.sharding.AxisType.Auto,),
  )
  with jax.set_mesh(mesh), nnx.logical_axis_rules(RULES):
    model, opt = _train_nnx(name, mesh)
  with nnx.use_eager_sharding(False):
    ref, _ = _train_nnx(name, None)
  helpers.assert_close(
    nnx.to_pure_dict(nnx.state(model, nnx.Param)),
    nnx.to_pure_dict(nnx.state(ref, nnx.Param)),
    atol=2e-5 if name == "conda" else 2e-6,
  )
  assert tuple(model.q[...].sharding.spec)[:2] == (None, "tp")
  # Parameter-shaped state keeps the parameter's names; the rest (Conda's
  # bases, NaP's targets, scalars) carries none.
  variables = jax.tree.leaves(
    opt.opt_state, is_leaf=lambda v: isinstance(v, nnx.Variable)
  )
  shapes = set(SHAPES.values())
  for v in variables:
    if isinstance(v.get_value(), optax.MaskedNode):  # RMNP's unused nu
      continue
    named = isinstance(v, nnx_optimizer.OptVariable)
    assert named == (v.get_value().shape in shapes), (v, named)
  assert any(
    not isinstance(v, nnx_optimizer.OptVariable) and v.get_value().ndim >= 2
    for v in variables
  ) == (name == "conda")


@pytest.mark.parametrize("name", ["conda", "rmnp"])
def test_linen_partitioned_tree_shards_its_state(name, key):
  mesh = jax.make_mesh(
    (2,),
    ("tp",),
    devices=jax.devices()[:2],
    axis_types=(jax.sharding.AxisType.Auto,),
  )
  ks = jax.random.split(key, len(SHAPES))
  mesh_names = {"q": (None, "tp", None), "o": ("tp", None, None)}
  mesh_names["scale"] = (None,)
  raw = {k: jax.random.normal(kk, s) for kk, (k, s) in zip(ks, SHAPES.items())}
  boxed = {k: nn.Partitioned(v, names=mesh_names[k]) for k, v in raw.items()}
  axes = {"q": optim.MatrixAxes(output=(1, 2)), "o": optim.MatrixAxes()}
  axes["scale"] = None
  tx = _factory(name, axes)
  specs = nn.get_partition_spec(jax.eval_shape(tx.init, boxed))
  shardings = jax.tree.map(
    lambda s: jax.NamedSharding(mesh, s),
    specs,
    is_leaf=lambda s: isinstance(s, jax.P),
  )
  grads = jax.tree.map(jnp.cos, boxed)
  with jax.set_mesh(mesh):
    state = jax.jit(tx.init, out_shardings=shardings)(boxed)
    out, _ = jax.jit(tx.update)(grads, state, boxed)
  ref, _ = tx.update(jax.tree.map(jnp.cos, raw), tx.init(raw), raw)
  helpers.assert_close(nn.unbox(out), ref, atol=1e-6)


@pytest.mark.parametrize(
  "names,layout,expect",
  [
    (NAMES["q"], "in_out", optim.MatrixAxes(output=(1, 2), reduction=(0,))),
    (NAMES["o"], "in_out", optim.MatrixAxes(output=(2,), reduction=(0, 1))),
    # gemma: q_einsum (N, D, H) and attn_vec_einsum (N, H, D).
    (
      ("heads", "embed", "head_dim"),
      "in_out",
      optim.MatrixAxes(output=(0, 2), reduction=(1,)),
    ),
    (("embed", "mlp"), "in_out", optim.MatrixAxes(output=(1,), reduction=(0,))),
    (
      ("layers", "mlp", "embed"),
      "in_out",
      optim.MatrixAxes(output=(2,), reduction=(1,)),
    ),
    # torch / equinox (out, in): up and down projections.
    (("mlp", "embed"), "out_in", optim.MatrixAxes(output=(0,), reduction=(1,))),
    (("embed", "mlp"), "out_in", optim.MatrixAxes(output=(0,), reduction=(1,))),
    # conv (kh, kw, in, out) without a model axis: positional.
    (
      (None, None, "channels", "channels"),
      "in_out",
      optim.MatrixAxes(output=(3,), reduction=(0, 1, 2)),
    ),
    (("vocab", "embed"), "in_out", None),
    (("embed",), "in_out", None),
    (("layers", "embed"), "in_out", None),
  ],
)
def test_axes_from_names(names, layout, expect):
  assert optim.axes_from_names(names, layout=layout) == expect


def test_axes_from_names_rejects_unknown_layout():
  with pytest.raises(ValueError, match="axes_from_names: layout must be one"):
    optim.axes_from_names(("embed", "mlp"), layout="torch")


def test_logical_axes_reads_nnx_and_linen_boxes():
  with nnx.use_eager_sharding(False):
    model = _Block(nnx.Rngs(0))
  from_nnx = optim.logical_axes(nnx.state(model, nnx.Param))
  boxed = {
    k: nn.LogicallyPartitioned(jnp.zeros(s), names=NAMES[k])
    for k, s in SHAPES.items()
  }
  from_linen = optim.logical_axes(boxed)
  unnamed = optim.logical_axes({"w": jnp.zeros((3, 5)), "b": jnp.zeros(5)})
  want = {
    "q": optim.MatrixAxes(output=(1, 2), reduction=(0,)),
    "o": optim.MatrixAxes(output=(2,), reduction=(0, 1)),
    "scale": None,
  }
  assert dict(from_nnx) == want
  assert from_linen == want
  assert unnamed == {
    "w": optim.MatrixAxes(output=(1,), reduction=(0,)),
    "b": None,
  }


def _flax2d(q):
  # gemma (N, D, H) -> flax (D, N*H).
  return jnp.transpose(q, (1, 0, 2)).reshape(q.shape[1], -1)


MAKERS = {
  "adamp": lambda axes: optim.adamp(0.1, weight_decay=0.1, axes=axes),
  "sgdp": lambda axes: optim.sgdp(0.1, momentum=0.9, axes=axes),
  "conda": lambda axes: optim.conda(0.1, weight_decay=0.1, axes=axes),
  "rmnp": lambda axes: optim.rmnp(0.1, weight_decay=0.1, axes=axes),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_einsum_kernel_equals_its_flax_matrix(name, key):
  # gemma's q_einsum (N, D, H) with axes from its names is the Flax Dense
  # kernel (D, N*H) in another layout; equinox/torch (out, in) is its
  # transpose. All three give the same update.
  make = MAKERS[name]
  k1, k2 = jax.random.split(key)
  q = jax.random.normal(k1, (3, 8, 4))
  h = jax.random.normal(k2, (3, 8, 4))
  # orthogonal to every (n, h) unit over D, so AdamP's projection fires.
  g = h - q * jnp.sum(q * h, 1, keepdims=True) / jnp.sum(
    q * q, 1, keepdims=True
  )
  axes = optim.axes_from_names(("heads", "embed", "head_dim"))
  einsum = make(axes)
  flat = make(None)
  torch = make(optim.axes_from_names(("heads", "embed"), layout="out_in"))

  def first(tx, g, p):
    return jax.jit(tx.update)(g, tx.init(p), p)[0]

  u_e = first(einsum, g, q)
  u_f = first(flat, _flax2d(g), _flax2d(q))
  qt, gt = _flax2d(q).T, _flax2d(g).T
  u_t = first(torch, gt, qt)
  helpers.assert_close(_flax2d(u_e), u_f, atol=1e-6)
  helpers.assert_close(u_t.T, u_f, atol=1e-6)
  if name != "sgdp":  # SGDP's first direction g is already projected
    # the default rule (output = last axis) is a different matrix.
    u_d = first(make(None), g, q)
    assert np.abs(np.asarray(u_d - u_e)).max() > 1e-3


def _spy():
  seen = []

  def rule(params):
    seen.extend(
      jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
    )
    return jax.tree.map(
      lambda p: optim.MatrixAxes() if p.ndim >= 2 else None, params
    )

  return rule, seen


@pytest.mark.parametrize("name", ["adamp", "sgdp", "conda", "rmnp"])
def test_axes_rule_sees_only_real_parameters(name, key):
  rule, seen = _spy()
  tx = _factory(name, rule)
  p = {"w": jax.random.normal(key, (4, 3)), "b": jnp.ones((3,))}
  tx.update(p, tx.init(p), p)
  assert seen and all(isinstance(x, jax.Array) for x in seen)


def test_axes_rule_inside_partition_is_refused(key):
  rule, seen = _spy()
  tx = optax.partition(
    {"m": optim.scale_by_conda(axes=rule), "v": optax.sgd(0.1)},
    {"w": "m", "b": "v"},
  )
  p = {"w": jax.random.normal(key, (4, 3)), "b": jnp.ones((3,))}
  with pytest.raises(ValueError, match="scale_by_conda: a callable `axes`"):
    tx.init(p)
  assert not seen
  resolved = optax.partition(
    {"m": optim.scale_by_conda(axes=rule(p)), "v": optax.sgd(0.1)},
    {"w": "m", "b": "v"},
  )
  u, _ = resolved.update(p, resolved.init(p))
  assert helpers.all_finite(u)
