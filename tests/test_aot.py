"""`jaxnorm.aot` topologies and `jaxnorm._target`: what dispatch compiles for.

The parsing, chip table and target rules run everywhere; the deviceless
meshes need the aot extra (marker ``aot``).
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import _target, aot, norms
from jaxnorm import sharding as jsharding


@pytest.mark.parametrize(
  "name,chip,shape",
  [
    ("h100:8", "h100", (8,)),
    ("H200:1", "h200", (1,)),
    ("a100:4", "a100", (4,)),
    ("v5e:2x2", "v5e", (2, 2)),
    ("v5p:2x2x1", "v5p", (2, 2, 1)),
    ("v6e:4x4", "v6e", (4, 4)),
  ],
)
def test_topology_names_parse(name, chip, shape):
  got, dims = aot.parse(name)
  assert (got.name, dims) == (chip, shape)


@pytest.mark.parametrize(
  "name", ["h100", "h100:2x2", "v5e:2x2x1", "v5p:2x2", "b200:8", "v5e:0x2"]
)
def test_unknown_topology_lists_the_valid_forms(name):
  with pytest.raises(ValueError) as e:
    aot.topology(name)
  msg = str(e.value)
  assert "\n" not in msg
  assert f"unknown topology {name!r}" in msg
  assert "'h100:8'" in msg and "'v5e:2x2'" in msg and "'v5p:2x2x1'" in msg


def test_missing_extra_names_the_pip_command(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    "find_spec",
    lambda name, *a: (
      None if name in ("libtpu", "jax_cuda12_plugin") else real(name, *a)
    ),
  )
  for name in ("h100:1", "v5e:2x2"):
    with pytest.raises(ModuleNotFoundError, match=r'pip install -e ".\[aot\]"'):
      aot.topology(name)


def test_chip_table_matches_device_kinds():
  assert aot.chip_of("NVIDIA H100 80GB HBM3").name == "h100"
  assert aot.chip_of("NVIDIA H100 PCIe").name == "h100"
  assert aot.chip_of("NVIDIA H200").name == "h200"
  assert aot.chip_of("NVIDIA A100-SXM4-40GB").name == "a100"
  assert aot.chip_of("TPU v5 lite").name == "v5e"
  assert aot.chip_of("TPU v5").name == "v5p"
  assert aot.chip_of("TPU v6 lite").name == "v6e"
  assert aot.chip_of("cpu") is None
  for name, config in aot.GPU_TARGETS.items():
    assert aot.CHIPS[name].device_kind in config
  assert "major: 9 minor: 0 feature_extension" in aot.GPU_TARGETS["h100"]
  assert "major: 8 minor: 0 }" in aot.GPU_TARGETS["a100"]


def test_gpu_capabilities_by_device_kind():
  assert _target._capability("NVIDIA H100 80GB HBM3") == (9, 0)
  assert _target._capability("NVIDIA H200") == (9, 0)
  assert _target._capability("NVIDIA A100-SXM4-80GB") == (8, 0)
  assert _target._capability("NVIDIA L40S") == (8, 9)
  assert _target._capability("AMD Instinct MI300X") is None


def test_target_on_cpu_reads_mesh_then_arguments_then_backend():
  t = _target.current()
  assert (t.platform, t.source, t.accelerator) == (
    "cpu",
    "default backend",
    False,
  )
  mesh = jsharding.make_mesh((2,), ("data",))
  x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P("data")))
  assert _target.current(x).source == "arguments"
  seen = []
  jax.jit(lambda x: seen.append(_target.current(x)) or x)(x)
  assert seen[-1].platform == "cpu"
  with jax.set_mesh(mesh):
    assert _target.current().source == "mesh"
    jax.jit(lambda x: seen.append(_target.current(x)) or x)(x)
  assert seen[-1].source == "mesh"


def test_pallas_on_a_cpu_target_says_how_to_compile_for_a_chip():
  x = jnp.ones((8, 128))
  with pytest.raises(NotImplementedError) as e:
    norms.rms_norm(x, jnp.ones(128), implementation="pallas")
  assert "the target: cpu" in str(e.value)
  assert "jaxnorm.aot.topology" in str(e.value)


@pytest.mark.aot
@pytest.mark.parametrize(
  "name,platform,kind,cc",
  [
    ("h100:1", "gpu", "NVIDIA H100 80GB HBM3", (9, 0)),
    ("h200:2", "gpu", "NVIDIA H200", (9, 0)),
    ("a100:1", "gpu", "NVIDIA A100-SXM4-80GB", (8, 0)),
    ("v5e:2x2", "tpu", "TPU v5 lite", None),
    ("v5p:2x2x1", "tpu", "TPU v5", None),
    ("v6e:1x1", "tpu", "TPU v6 lite", None),
  ],
)
def test_deviceless_meshes_are_the_named_chips(name, platform, kind, cc):
  mesh = aot.topology(name)
  chip, shape = aot.parse(name)
  assert mesh.devices.shape == shape
  assert mesh.devices.flat[0].device_kind == kind
  with jax.set_mesh(mesh):
    t = _target.current()
  assert (t.platform, t.device_kind, t.source) == (platform, kind, "mesh")
  assert t.compute_capability == cc and t.chip == chip
  x = jax.ShapeDtypeStruct(
    (8, 128), jnp.float32, sharding=NamedSharding(mesh, P())
  )
  seen = []
  jax.jit(lambda x: seen.append(_target.current(x)) or x).lower(x)
  assert (seen[0].platform, seen[0].source) == (platform, "arguments")
