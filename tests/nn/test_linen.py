"""`jaxnorm.linen` against flax.linen's own layers and the pure functions."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxnorm import linen as jln
from jaxnorm import nn as jnn
from jaxnorm import norms, sharding
from tests import helpers

D = 8


@pytest.fixture(scope="module")
def x():
  return 1 + 2 * jax.random.normal(jax.random.key(1), (2, 5, D))


def _perturbed(params, key):
  """Every parameter moved off its init (so the affine tail matters)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(
    tree,
    [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)],
  )


@pytest.mark.parametrize(
  "ours, theirs",
  [
    (jln.LayerNorm(), nn.LayerNorm(use_fast_variance=False)),
    (jln.RMSNorm(), nn.RMSNorm(use_fast_variance=False)),
  ],
  ids=["layernorm", "rmsnorm"],
)
def test_matches_flax_linen(ours, theirs, x):
  params = nn.meta.unbox(ours.init(jax.random.key(0), x))
  flax_params = theirs.init(jax.random.key(0), x)
  chex_struct = jax.tree.map(np.shape, params)
  assert chex_struct == jax.tree.map(np.shape, flax_params)
  params = _perturbed(params, jax.random.key(2))
  mask = jax.random.bernoulli(jax.random.key(3), 0.7, x.shape)
  xb = x.astype(jnp.bfloat16)

  @jax.jit
  def outputs(params):
    out = []
    for model in (ours, theirs):
      with jax.numpy_dtype_promotion("standard"):  # flax needs it for bf16
        out.append(
          (
            model.apply(params, x),
            model.apply(params, x, mask=mask),
            model.apply(params, xb),
          )
        )
    return out

  (y, y_mask, y_bf16), (ref, ref_mask, ref_bf16) = outputs(params)
  helpers.assert_close(y, ref, atol=2e-6)
  helpers.assert_close(y_mask, ref_mask, atol=2e-5)
  # flax's dtype rule: bf16 input with f32 parameters gives f32.
  assert y_bf16.dtype == ref_bf16.dtype == jnp.float32
  helpers.assert_close(y_bf16, ref_bf16, atol=2e-5)


def _nnx_twin(name):
  return {
    "crmsnorm": jnn.CRMSNorm,
    "dyt": jnn.DyT,
    "seednorm": jnn.SeeDNorm,
    "groupnorm": lambda d, rngs: jnn.GroupNorm(d, num_groups=4, rngs=rngs),
  }[name](D, rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
  "name, module, pure",
  [
    ("crmsnorm", jln.CRMSNorm(), lambda x, p: norms.crms_norm(x, p["scale"])),
    (
      "dyt",
      jln.DyT(),
      lambda x, p: norms.dyt(x, p["alpha"], p["scale"], p["bias"]),
    ),
    (
      "seednorm",
      jln.SeeDNorm(),
      lambda x, p: norms.seed_norm(
        x, p["scale"], p["dyn_scale"], p["dyn_proj"]
      ),
    ),
    (
      "groupnorm",
      jln.GroupNorm(num_groups=4, reduction_axes=-1),
      lambda x, p: norms.group_norm(
        x, p["scale"], p["bias"], num_groups=4, reduction_axes=-1
      ),
    ),
  ],
  ids=lambda v: v if isinstance(v, str) else "",
)
def test_jaxnorm_layers(name, module, pure, x):
  params = nn.meta.unbox(module.init(jax.random.key(0), x))["params"]
  # Same names, shapes and initial values as the nnx module.
  twin = {
    str(path[0]): np.asarray(v.get_value())
    for path, v in nnx.to_flat_state(nnx.state(_nnx_twin(name), nnx.Param))
  }
  assert sorted(params) == sorted(twin)
  for key in twin:
    np.testing.assert_array_equal(params[key], twin[key])
  params = _perturbed(params, jax.random.key(4))
  helpers.assert_close(
    module.apply({"params": params}, x), pure(x, params), atol=1e-6
  )


def test_group_norm_mask_and_errors(x):
  module = jln.GroupNorm(num_groups=None, group_size=2)
  variables = module.init(jax.random.key(0), x)
  mask = jax.random.bernoulli(jax.random.key(5), 0.7, x.shape)
  flax = nn.GroupNorm(num_groups=None, group_size=2, use_fast_variance=False)
  helpers.assert_close(
    module.apply(variables, x, mask=mask),
    flax.apply(nn.meta.unbox(variables), x, mask=mask),
    atol=2e-5,
  )
  with pytest.raises(ValueError, match=r"GroupNorm: x.shape\[-1\]=8 must be"):
    jln.GroupNorm(num_groups=3).init(jax.random.key(0), x)


class _Block(nn.Module):
  norm: type

  @nn.compact
  def __call__(self, h, _):
    h = h + nn.Dense(D)(jax.nn.gelu(self.norm()(h)))
    return h, None


class _Stack(nn.Module):
  norm: type

  @nn.compact
  def __call__(self, h):
    layers = nn.scan(
      _Block,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      length=3,
    )(self.norm)
    return layers(h, None)[0]


def test_scan_over_layers_equals_linen(x):
  """A scanned stack with jaxnorm's RMSNorm is flax's, init included."""
  ours = _Stack(lambda: jln.RMSNorm(axis_names=None))
  theirs = _Stack(lambda: nn.RMSNorm(use_fast_variance=False))
  params = ours.init(jax.random.key(0), x)
  flax_params = theirs.init(jax.random.key(0), x)
  helpers.assert_close(params, flax_params, atol=0)

  def loss(model):
    return lambda p: jnp.mean(jnp.square(model.apply(p, x)))

  l_ours, g_ours = jax.jit(jax.value_and_grad(loss(ours)))(params)
  l_theirs, g_theirs = jax.jit(jax.value_and_grad(loss(theirs)))(params)
  helpers.assert_close(l_ours, l_theirs, atol=2e-5)
  helpers.assert_close(g_ours, g_theirs, atol=2e-5)


def test_attention_fn_in_linen_multihead(x):
  kwargs = {"num_heads": 2, "qkv_features": D, "deterministic": True}
  ours = nn.MultiHeadDotProductAttention(
    attention_fn=jln.dot_product_attention, **kwargs
  )
  theirs = nn.MultiHeadDotProductAttention(**kwargs)
  mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
  params = theirs.init(jax.random.key(0), x, mask=mask)
  helpers.assert_close(
    ours.apply(params, x, mask=mask),
    theirs.apply(params, x, mask=mask),
    atol=2e-5,
  )


def test_logical_names_under_a_foreign_mesh(x):
  mesh = sharding.make_mesh((4, 2), ("fsdp", "tp"))
  variables = jln.LayerNorm().init(jax.random.key(0), x)
  specs = nn.get_partition_spec(variables)
  assert specs["params"]["scale"] == P("norm")
  rules = sharding.rules_for_mesh(mesh, {"tensor": "tp"})
  shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
  assert shardings["params"]["scale"].spec == P(None)
  placed = jax.device_put(nn.meta.unbox(variables), shardings)
  assert placed["params"]["bias"].sharding.is_fully_replicated
