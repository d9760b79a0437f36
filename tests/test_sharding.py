"""Mesh-agnostic sharding: rules for the user's mesh, unmapped names, flax.

The user's mesh here is gemma's ``("fsdp", "tp")`` on the 8 fake CPU devices
of ``conftest.py``: none of jaxnorm's own mesh axes ``data``/``tensor``.
"""

import warnings

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import nn as jnn
from jaxnorm import sharding
from tests import helpers

D = 8


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh((4, 2), ("fsdp", "tp"))


def _unmapped(caught):
  return [
    str(w.message)
    for w in caught
    if issubclass(w.category, sharding.UnmappedAxisWarning)
  ]


def test_rules_for_gemma_mesh(mesh):
  rules = dict(sharding.rules_for_mesh(mesh, {"tensor": "tp"}))
  assert set(rules) == {name for name, _ in sharding.DEFAULT_RULES}
  assert rules["batch"] == "fsdp"  # ("data", "fsdp") without data
  assert rules["embed"] == "fsdp"
  for name in ("heads", "kv_heads", "mlp", "vocab", "channels"):
    assert rules[name] == "tp"
  assert rules["norm"] is None and rules["seq"] is None
  # Without a rename, tensor-parallel names lose their (absent) axis.
  plain = dict(sharding.rules_for_mesh(("fsdp", "tp")))
  assert plain["heads"] is None and plain["batch"] == "fsdp"
  # Renaming to None drops an axis; multi-axis rules keep a tuple.
  both = dict(
    sharding.rules_for_mesh(
      ("data", "fsdp"), {"fsdp": None}, rules=(("batch", ("data", "fsdp")),)
    )
  )
  assert both == {"batch": "data"}
  kept = dict(sharding.rules_for_mesh(("data", "fsdp", "tensor")))
  assert kept == dict(sharding.DEFAULT_RULES)


def test_rules_for_mesh_errors(mesh):
  with pytest.raises(
    ValueError,
    match=r"rules_for_mesh: rename maps 'model', which the rules do not "
    r"use; the rules use the mesh axes data, fsdp, tensor",
  ):
    sharding.rules_for_mesh(mesh, {"model": "tp"})
  with pytest.raises(
    ValueError,
    match=r"rename maps 'tensor' to 'model', which is not an axis of the "
    r"mesh; its axes are fsdp, tp",
  ):
    sharding.rules_for_mesh(mesh, {"tensor": "model"})
  with pytest.raises(ValueError, match=r"rules_for_mesh: mesh must be a jax"):
    sharding.rules_for_mesh("fsdp")


def test_no_mesh_keeps_names():
  assert sharding.param_names(("norm", None)) == ("norm", None)
  assert sharding.param_names(None) is None


def test_every_norm_builds_under_a_foreign_mesh_without_rules(mesh, key):
  """No rules at all: every name replicates, with one warning per name."""
  x = jax.random.normal(key, (2, 4, 4, D))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    with jax.set_mesh(mesh):
      modules = {
        name: jnn.make_norm(name, D, rngs=nnx.Rngs(0))
        for name in sorted(jnn.NORMS)
      }
      for module in modules.values():
        specs = nnx.get_partition_spec(nnx.state(module))
        for spec in jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P)):
          NamedSharding(mesh, spec)  # Refuses a name the mesh lacks.
          assert all(a is None for a in spec)
        for leaf in jax.tree.leaves(nnx.state(module)):
          assert leaf.sharding.is_fully_replicated
  assert _unmapped(caught) == [
    "jaxnorm: logical axis name 'norm' has no rule in the active "
    "nnx.logical_axis_rules; parameters that name it are replicated. Give "
    "it a rule, or derive jaxnorm's rules for your mesh with "
    "jaxnorm.sharding.rules_for_mesh"
  ]
  # Built under the mesh, the layer computes what an unsharded one does.
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", sharding.UnmappedAxisWarning)
    with jax.set_mesh(mesh):
      y = jax.jit(lambda x: modules["layernorm"](x))(x)
  helpers.assert_close(y, jnn.LayerNorm(D, rngs=nnx.Rngs(0))(x), atol=1e-6)


def test_user_rules_without_norm_replicate_once(mesh):
  """gemma-style rules that know only the user's own names."""
  user_rules = (("embed", "fsdp"), ("mlp", "tp"))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    with jax.set_mesh(mesh), nnx.logical_axis_rules(user_rules):
      for _ in range(3):
        module = jnn.LayerNorm(D, axis_names=("mlp",), rngs=nnx.Rngs(0))
        other = jnn.RMSNorm(D, rngs=nnx.Rngs(0))
      assert module.scale[...].sharding.spec == P("tp")
      assert nnx.get_partition_spec(nnx.state(module))[
        "scale"
      ].get_value() == P("tp")
      assert other.scale[...].sharding.is_fully_replicated
  assert len(_unmapped(caught)) == 1


def test_derived_rules_shard_like_flax_metadata(mesh, key):
  """axis_names is flax's scale_metadata/bias_metadata out_sharding."""
  rules = sharding.rules_for_mesh(mesh, {"tensor": "tp"})
  rules = (("norm", "tp"), *((n, a) for n, a in rules if n != "norm"))
  x = jax.random.normal(key, (4, 3, D))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      ours = jnn.LayerNorm(D, rngs=nnx.Rngs(0))
      theirs = nnx.LayerNorm(
        D,
        scale_metadata={"out_sharding": ("norm",)},
        bias_metadata={"out_sharding": ("norm",)},
        rngs=nnx.Rngs(0),
      )
      ours_specs = nnx.get_partition_spec(nnx.state(ours))
      theirs_specs = nnx.get_partition_spec(nnx.state(theirs))
      for name in ("scale", "bias"):
        assert ours_specs[name].get_value() == P("tp")
        assert theirs_specs[name].get_value() == P("tp")
        assert getattr(ours, name)[...].sharding == (
          getattr(theirs, name)[...].sharding
        )
      y_ours = jax.jit(lambda x: ours(x))(x)
      y_theirs = jax.jit(lambda x: theirs(x))(x)
  assert _unmapped(caught) == []
  helpers.assert_close(y_ours, y_theirs, atol=1e-6)
  # Outside the rules the stored names are the logical ones, as in flax.
  assert nnx.get_partition_spec(nnx.state(ours))["scale"].get_value() == P(
    "norm"
  )


def test_physical_names_are_kept(mesh):
  with jax.set_mesh(mesh):
    module = jnn.RMSNorm(D, axis_names=("tp",), rngs=nnx.Rngs(0))
  assert module.scale[...].sharding.spec == P("tp")


def test_rule_to_a_missing_mesh_axis_names_the_fix(mesh):
  rules = sharding.rules_with([("norm", "tensor")])
  with (
    jax.set_mesh(mesh),
    nnx.logical_axis_rules(rules),
    pytest.raises(
      ValueError,
      match=r"param_names: the active rules map logical axis 'norm' to mesh "
      r"axis 'tensor', but the mesh has axes fsdp, tp; derive rules for this "
      r"mesh with jaxnorm.sharding.rules_for_mesh",
    ),
  ):
    jnn.LayerNorm(D, rngs=nnx.Rngs(0))


def test_constrain_under_a_foreign_mesh_without_rules(mesh, key):
  x = jax.random.normal(key, (8, D))
  with jax.set_mesh(mesh):
    assert sharding.logical_to_mesh(("batch", "embed", "mlp")) == P(
      "fsdp", None, None
    )
    y = jax.jit(lambda x: sharding.constrain(x * 2, ("batch", "embed")))(x)
  assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("fsdp", None)), 2)
  np.testing.assert_array_equal(np.asarray(y), 2 * np.asarray(x))
