"""Tests for the norm modules in `jaxnorm.nn.norms`."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxnorm import nn as jnn
from jaxnorm import norms, sharding
from tests import helpers

D = 8

# name -> (constructor kwargs, input shape, the pure function given the
# module's parameters).
CASES = {
  "layernorm": (
    {},
    (2, 3, D),
    lambda m, x: norms.layer_norm(x, m.scale[...], m.bias[...]),
  ),
  "rmsnorm": (
    {"eps_mode": "outside", "eps": 1e-8},
    (2, 3, D),
    lambda m, x: norms.rms_norm(x, m.scale[...], eps=1e-8, eps_mode="outside"),
  ),
  "crmsnorm": ({}, (2, 3, D), lambda m, x: norms.crms_norm(x, m.scale[...])),
  "batchnorm": (
    {"use_running_average": True},
    (4, 3, D),
    lambda m, x: norms.batch_norm(
      x,
      m.scale[...],
      m.bias[...],
      norms.BatchNormState(m.mean[...], m.var[...]),
      training=False,
    )[0],
  ),
  "groupnorm": (
    {"num_groups": 2},
    (2, 3, D),
    lambda m, x: norms.group_norm(x, m.scale[...], m.bias[...], num_groups=2),
  ),
  "instancenorm": (
    {},
    (2, 3, D),
    lambda m, x: norms.instance_norm(x, m.scale[...], m.bias[...]),
  ),
  "dyt": (
    {"alpha_init": 0.8},
    (2, 3, D),
    lambda m, x: norms.dyt(x, m.alpha[...], m.scale[...], m.bias[...]),
  ),
  "seednorm": (
    {"num_heads": 2},
    (2, 3, D),
    lambda m, x: norms.seed_norm(
      x, m.scale[...], m.dyn_scale[...], m.dyn_proj[...], num_heads=2
    ),
  ),
  "evonormb0": (
    {"use_running_average": True},
    (2, 3, 2, D),
    lambda m, x: norms.evo_norm_b0(
      x,
      m.scale[...],
      m.bias[...],
      m.v[...],
      norms.EvoNormB0State(m.var[...]),
      training=False,
    )[0],
  ),
  "evonorms0": (
    {"num_groups": 2},
    (2, 3, 2, D),
    lambda m, x: norms.evo_norm_s0(
      x, m.scale[...], m.bias[...], m.v[...], num_groups=2
    ),
  ),
  "powernorm": (
    {"use_running_average": True, "num_groups": 2},
    (3, 2, D),
    lambda m, x: norms.power_norm(
      x,
      m.scale[...],
      m.bias[...],
      m.state_tuple(),
      training=False,
      num_groups=2,
    )[0],
  ),
  "unifiednorm": (
    {"use_running_average": True},
    (2, 3, D),
    lambda m, x: norms.unified_norm(
      x, m.scale[...], m.bias[...], m.state_tuple(), training=False
    )[0],
  ),
  "regionnormb": (
    {},
    (2, 3, 2, D),
    lambda m, x: norms.region_norm_b(
      x,
      jnp.ones((2, 3, 2, 1)),
      m.scale_fg[...],
      m.bias_fg[...],
      m.scale_bg[...],
      m.bias_bg[...],
    ),
  ),
  "regionnorml": (
    {"kernel_size": 3, "threshold": 0.5},
    (2, 4, 4, D),
    lambda m, x: norms.region_norm_l(
      x,
      m.mask_kernel[...],
      m.scale_kernel[...],
      m.scale_bias[...],
      m.bias_kernel[...],
      m.bias_bias[...],
      threshold=0.5,
    ),
  ),
  "unmixtns": (
    {"num_components": 3, "update_stats": False},
    (2, 3, 2, D),
    lambda m, x: norms.unmix_tns(
      x,
      m.scale[...],
      m.bias[...],
      norms.UnMixTNSState(m.mean[...], m.var[...]),
      update=False,
    )[0],
  ),
  "l1layernorm": (
    {"eps_mode": "inside"},
    (2, 3, D),
    lambda m, x: norms.l1_layer_norm(
      x, m.scale[...], m.bias[...], eps_mode="inside"
    ),
  ),
  "l1batchnorm": (
    {"use_running_average": True},
    (4, 3, D),
    lambda m, x: norms.l1_batch_norm(
      x,
      m.scale[...],
      m.bias[...],
      norms.L1BatchNormState(m.mean[...], m.dev[...]),
      training=False,
    )[0],
  ),
  "scalevectornorm": (
    {"reparam": True},
    (2, 3, D),
    lambda m, x: norms.rms_norm(
      x,
      norms.magnitude_direction_scale(
        m.scale_magnitude[...], m.scale_direction[...]
      ),
    ),
  ),
  "clsnorm": (
    {},
    (2, 3, D),
    lambda m, x: norms.specialized_layer_norm(
      x,
      jnp.array([1, 0, 0]),
      m.scale_cls[...],
      m.bias_cls[...],
      m.scale_patch[...],
      m.bias_patch[...],
    ),
  ),
  "timestepdecaynorm": (
    {"num_groups": 2},
    (2, 3, D),
    lambda m, x: norms.timestep_decay_norm(
      x, m.scale[...], m.bias[...], num_groups=2
    )[0],
  ),
}


def _perturb(module, key):
  """Moves every parameter away from its init so the check can fail."""
  params = nnx.state(module, nnx.Param)
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  new = [
    leaf + 0.3 * jax.random.normal(k, leaf.shape, leaf.dtype)
    for k, leaf in zip(keys, leaves)
  ]
  nnx.update(module, jax.tree.unflatten(treedef, new))


def test_cases_are_registered_norms():
  # Norms registered later test module == function in their own test file
  # (e.g. tests/norms/test_scalenorm.py); the registry-driven tests of
  # tests/nn/test_norm_registry.py cover every registered norm.
  assert set(CASES) <= set(jnn.NORMS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_module_equals_function(key, name):
  kwargs, shape, fn = CASES[name]
  module = jnn.make_norm(name, D, rngs=nnx.Rngs(0), **kwargs)
  _perturb(module, key)
  x = jax.random.normal(jax.random.fold_in(key, 1), shape)
  helpers.assert_close(module(x), fn(module, x), atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dtypes(name):
  kwargs, shape, _ = CASES[name]
  module = jnn.make_norm(
    name,
    D,
    rngs=nnx.Rngs(0),
    param_dtype=jnp.bfloat16,
    dtype=jnp.float32,
    **kwargs,
  )
  for leaf in jax.tree.leaves(nnx.state(module, nnx.Param)):
    assert leaf.dtype == jnp.bfloat16
  x = jnp.ones(shape, jnp.bfloat16)
  assert module(x).dtype == jnp.float32
  # dtype=None follows flax: the input promoted with the parameters.
  default = jnn.make_norm(name, D, rngs=nnx.Rngs(0), **kwargs)
  assert default(x).dtype == jnp.float32
  half = jnn.make_norm(
    name, D, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, **kwargs
  )
  # BatchNorm promotes with its float32 running statistics, as flax's does.
  want = jnp.float32 if name == "batchnorm" else jnp.bfloat16
  assert half(x).dtype == want


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_and_grad_through_module(name):
  kwargs, shape, _ = CASES[name]
  module = jnn.make_norm(name, D, rngs=nnx.Rngs(0), **kwargs)
  x = jnp.linspace(-2, 3, np.prod(shape)).reshape(shape)

  @nnx.jit
  def loss_and_grad(m, x):
    return nnx.value_and_grad(lambda m: jnp.sum(m(x) ** 2))(m)

  loss, grads = loss_and_grad(module, x)
  assert np.isfinite(float(loss))
  assert helpers.all_finite(nnx.state(grads))


@pytest.mark.parametrize(
  ("ours", "theirs"),
  [(jnn.LayerNorm, nnx.LayerNorm), (jnn.RMSNorm, nnx.RMSNorm)],
)
@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_dtype_semantics_beside_flax(key, ours, theirs, param_dtype):
  """dtype=None, bf16 input: the output dtype and values of flax's module
  (float32 from float32 parameters, computed from the exact upcast)."""
  x = (jax.random.normal(key, (3, D)) * 3 + 1).astype(jnp.bfloat16)
  kw = {"param_dtype": param_dtype, "rngs": nnx.Rngs(0)}
  with jax.numpy_dtype_promotion("standard"):  # flax promotes implicitly.
    want = theirs(D, epsilon=1e-6, **kw)(x)
  got = ours(D, eps=1e-6, **kw)(x)
  assert got.dtype == want.dtype == param_dtype  # bf16 promotes to f32.
  atol = 1e-6 if got.dtype == jnp.float32 else 2e-2
  helpers.assert_close(got, want, atol=atol)


@pytest.mark.parametrize("cls", [jnn.LayerNorm, jnn.RMSNorm])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_add_and_norm(key, cls, dtype):
  """``(h, y)`` with h = x + residual and y = the module at h; the fused
  path is the module's own parameters (perturbed so a mix-up fails)."""
  module = cls(D, scale_offset=0.5, rngs=nnx.Rngs(0))
  _perturb(module, key)
  k1, k2 = jax.random.split(jax.random.fold_in(key, 3))
  x = jax.random.normal(k1, (2, 3, D)).astype(dtype)
  residual = jax.random.normal(k2, (2, 3, D)).astype(dtype)
  h, y = module.add_and_norm(x, residual)
  expected_h = (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(
    dtype
  )
  np.testing.assert_array_equal(h, expected_h)
  assert y.dtype == jnp.float32  # flax's rule: f32 parameters.
  want = module(h.astype(jnp.float32)).astype(dtype).astype(jnp.float32)
  helpers.assert_close(y, want, atol=1e-6 if dtype == jnp.float32 else 2e-2)


FLAX_EQUIVALENTS = [
  (jnn.LayerNorm, nnx.LayerNorm, {}),
  (jnn.RMSNorm, nnx.RMSNorm, {}),
  (jnn.BatchNorm, nnx.BatchNorm, {"use_running_average": True}),
  (jnn.GroupNorm, nnx.GroupNorm, {"num_groups": 2}),
]


@pytest.mark.parametrize(("ours", "theirs", "kw"), FLAX_EQUIVALENTS)
def test_flax_keywords(key, ours, theirs, kw):
  """flax's spellings build the same layer as flax (same output)."""
  flax_kw = {"epsilon": 1e-3, "use_fast_variance": False, **kw}
  if ours is jnn.BatchNorm:
    flax_kw["axis"] = -1
  elif ours is not jnn.GroupNorm:
    flax_kw |= {"reduction_axes": -1, "feature_axes": -1}
  x = jax.random.normal(key, (4, 3, D)) * 2 + 1
  module = ours(D, rngs=nnx.Rngs(0), **flax_kw)
  assert module.eps == 1e-3
  if ours is jnn.GroupNorm:  # Flax's GroupNorm reduces every non-batch axis.
    flax_kw["reduction_axes"] = None
  helpers.assert_close(
    module(x), theirs(D, rngs=nnx.Rngs(0), **flax_kw)(x), atol=2e-5
  )


class TestFlaxKeywordErrors:
  def test_both_eps_spellings(self):
    with pytest.raises(
      TypeError, match=r"LayerNorm: give eps or flax's epsilon, not both"
    ):
      jnn.LayerNorm(D, eps=1e-5, epsilon=1e-5, rngs=nnx.Rngs(0))

  def test_other_axes(self):
    with pytest.raises(
      ValueError,
      match=r"RMSNorm: reduction_axes must be -1 \(jaxnorm modules "
      r"normalize the last, feature axis\), got reduction_axes=\(-2, -1\)",
    ):
      jnn.RMSNorm(D, reduction_axes=(-2, -1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"BatchNorm: axis must be -1"):
      jnn.BatchNorm(D, axis=1, rngs=nnx.Rngs(0))

  def test_fast_variance(self):
    with pytest.raises(
      ValueError, match=r"InstanceNorm: use_fast_variance=True is not"
    ):
      jnn.InstanceNorm(D, use_fast_variance=True, rngs=nnx.Rngs(0))

  def test_metadata(self):
    with pytest.raises(
      TypeError,
      match=r"LayerNorm: scale_metadata is flax's spelling; jaxnorm takes "
      r"axis_names",
    ):
      jnn.LayerNorm(D, scale_metadata={}, rngs=nnx.Rngs(0))

  def test_unknown_keyword_stays_a_type_error(self):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'eta'"):
      jnn.LayerNorm(D, eta=1.0, rngs=nnx.Rngs(0))


def test_batchnorm_train_eval():
  module = jnn.BatchNorm(D, momentum=0.5, rngs=nnx.Rngs(0))
  x = jnp.linspace(0, 4, 4 * D).reshape(4, D)
  y = module(x)
  helpers.assert_close(jnp.mean(y, 0), jnp.zeros(D), atol=1e-5)
  helpers.assert_close(module.mean[...], 0.5 * jnp.mean(x, 0), atol=1e-6)
  module.eval()
  before = module.mean[...]
  y_eval = module(x)
  np.testing.assert_array_equal(module.mean[...], before)
  expected = (x - before[None]) / jnp.sqrt(module.var[...][None] + 1e-5)
  helpers.assert_close(y_eval, expected, atol=1e-5)
  module.train()
  module(x, use_running_average=True)
  np.testing.assert_array_equal(module.mean[...], before)


def test_without_scale_or_bias():
  ln = jnn.LayerNorm(D, use_scale=False, use_bias=False, rngs=nnx.Rngs(0))
  assert ln.scale is None and ln.bias is None
  assert len(jax.tree.leaves(nnx.state(ln, nnx.Param))) == 0
  x = jnp.linspace(-1, 1, 2 * D).reshape(2, D)
  helpers.assert_close(ln(x), norms.layer_norm(x), atol=0)


def test_seednorm_init_is_rms_norm(key):
  module = jnn.SeeDNorm(D, rngs=nnx.Rngs(0))
  x = jax.random.normal(key, (3, D))
  helpers.assert_close(module(x), norms.rms_norm(x), atol=1e-6)
  np.testing.assert_array_equal(module.dyn_scale[...], np.ones(D))
  np.testing.assert_array_equal(module.dyn_proj[...], np.zeros(D))


def test_logical_axis_names_and_sharding(key):
  mesh = sharding.make_mesh((2, 1, 4))
  rules = sharding.DEFAULT_RULES + (("norm", "tensor"),)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules[-1:] + rules):
    module = jnn.RMSNorm(D, rngs=nnx.Rngs(0))
    specs = nnx.get_partition_spec(nnx.state(module))
    assert specs["scale"].get_value() == P("tensor")
    assert module.scale[...].sharding.spec == P("tensor")
    x = jax.random.normal(key, (4, 6, D))
    y = jax.jit(lambda x: module(x))(x)
  ref = jnn.RMSNorm(D, rngs=nnx.Rngs(0))
  helpers.assert_close(y, ref(x), atol=1e-6)
  assert nnx.get_partition_spec(nnx.state(ref))["scale"].get_value() == P(
    "norm"
  )


def test_default_rules_replicate_norm_params():
  mesh = sharding.make_mesh((2, 2, 2))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    module = jnn.LayerNorm(D, rngs=nnx.Rngs(0))
    assert module.scale[...].sharding.spec == P(None)


class TestErrors:
  def test_unknown_name_lists_valid_names(self):
    with pytest.raises(
      ValueError,
      match=r"make_norm: unknown norm 'lnorm'; valid names are "
      + re.escape(", ".join(sorted(jnn.NORMS))),
    ):
      jnn.make_norm("lnorm", D, rngs=nnx.Rngs(0))

  @pytest.mark.parametrize("name", sorted(CASES))
  def test_num_features(self, name):
    with pytest.raises(
      ValueError,
      match=r"num_features must be a positive "
      r"integer, got num_features=0",
    ):
      jnn.make_norm(name, 0, rngs=nnx.Rngs(0))

  def test_wrong_width_at_call(self):
    module = jnn.RMSNorm(D, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"rms_norm: scale must have shape "
      r"\(5,\)",
    ):
      module(jnp.ones((2, 5)))

  def test_group_config(self):
    with pytest.raises(
      ValueError,
      match=r"num_features=8 must be divisible "
      r"by num_groups=3",
    ):
      jnn.GroupNorm(D, num_groups=3, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError,
      match=r"num_features=8 must be divisible "
      r"by group_size=3",
    ):
      jnn.GroupNorm(D, num_groups=None, group_size=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"exactly one of num_groups"):
      jnn.GroupNorm(D, num_groups=None, rngs=nnx.Rngs(0))
    module = jnn.GroupNorm(D, num_groups=None, group_size=2, rngs=nnx.Rngs(0))
    assert module.num_groups == 4

  def test_seednorm_heads(self):
    with pytest.raises(
      ValueError,
      match=r"SeeDNorm: num_features=8 must be "
      r"divisible by num_heads=3",
    ):
      jnn.SeeDNorm(D, num_heads=3, rngs=nnx.Rngs(0))

  def test_rmsnorm_eps_mode(self):
    with pytest.raises(ValueError, match=r"RMSNorm: eps_mode must be one of"):
      jnn.RMSNorm(D, eps_mode="both", rngs=nnx.Rngs(0))

  def test_param_names_rank(self):
    with pytest.raises(
      ValueError,
      match=r"param: axis names must have one "
      r"entry per axis",
    ):
      jnn.LayerNorm(D, axis_names=("norm", "embed"), rngs=nnx.Rngs(0))


class TestSharding:
  def test_make_mesh_errors(self):
    with pytest.raises(
      ValueError,
      match=r"shape and axis_names must have "
      r"the same length",
    ):
      sharding.make_mesh((2, 2))
    with pytest.raises(ValueError, match=r"needs 64 devices, but only 8"):
      sharding.make_mesh((4, 4, 4))
    with pytest.raises(ValueError, match=r"shape entries must be a positive"):
      sharding.make_mesh((0, 1, 1))

  def test_constrain(self, key):
    x = jax.random.normal(key, (8, 4))
    np.testing.assert_array_equal(sharding.constrain(x, ("batch", "embed")), x)
    with pytest.raises(
      ValueError,
      match=r"constrain: names must have one "
      r"entry per axis",
    ):
      sharding.constrain(x, ("batch",))
    mesh = sharding.make_mesh((4, 2, 1))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
      y = jax.jit(lambda x: sharding.constrain(x * 2, ("batch", None)))(x)
    assert y.sharding.is_equivalent_to(
      jax.sharding.NamedSharding(mesh, P(("data", "fsdp"), None)), 2
    )
    helpers.assert_close(y, 2 * x, atol=0)

  def test_rule_resolution(self):
    rules = sharding.rules_with([("norm", "tensor"), ("seq", "data")])
    assert dict(rules)["norm"] == "tensor"
    assert len({name for name, _ in rules}) == len(rules)
    assert sharding.logical_to_mesh(("batch", "seq", "embed"), rules) == P(
      ("data", "fsdp"), None, None
    )
    assert sharding.logical_to_mesh(("seq", "batch"), rules) == P(
      "data", "fsdp"
    )
    assert sharding.logical_to_mesh(("mlp", None, "unknown")) == P(
      "tensor", None, None
    )
