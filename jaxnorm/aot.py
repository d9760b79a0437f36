"""Compile for GPUs and TPUs you do not have: chip facts and deviceless meshes.

JAX compiles *deviceless* for a GPU or TPU target on a CPU-only host: the
real compilers (XLA:GPU with Mosaic GPU, PTX and ptxas; XLA:TPU with Mosaic
TPU inside libtpu) run at ``.compile()``, so layouts, shared memory, VMEM,
registers and HBM use are checked as on the chip, though nothing runs.
`topology` returns such a mesh; under ``jax.set_mesh`` every jaxnorm kernel
then picks the lowering and tiling of that chip (`jaxnorm._target`)::

  mesh = jaxnorm.aot.topology("h100:1")
  x = jax.ShapeDtypeStruct((8192, 4096), jnp.bfloat16)
  with jax.set_mesh(mesh):
    compiled = jax.jit(jaxnorm.norms.rms_norm).lower(x, s).compile()
  compiled.memory_analysis(), compiled.cost_analysis()

The compilers come with the ``aot`` extra (Python >= 3.12):
``pip install -e ".[aot]"`` (jax-cuda12-plugin, jax-cuda12-pjrt,
nvidia-cuda-nvcc-cu12 for ptxas, and the libtpu the installed jax pins).
Call `setup_environment` before JAX starts a backend (or set the variables
it sets yourself): it pins the host platform to the CPU and puts the wheel's
ptxas first on ``PATH``.

`CHIPS` holds each chip's datasheet numbers (HBM, bandwidth, peak dense
bfloat16 flops) and the on-chip limits the kernels' tiling takes (shared
memory and registers per SM; physical and default scoped VMEM per TPU core).

Examples:
  >>> sorted(CHIPS)
  ['a100', 'h100', 'h200', 'v5e', 'v5p', 'v6e']
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import jax

# The command that installs the deviceless compilers.
__all__ = [
  "CHIPS",
  "GPU_TARGETS",
  "INSTALL",
  "Chip",
  "PtxasKernel",
  "available",
  "chip_of",
  "parse",
  "parse_ptxas",
  "setup_environment",
  "topology",
]

INSTALL = 'pip install -e ".[aot]" (Python >= 3.12)'


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator's facts, as the compile-only tools use them.

  Attributes:
    name: jaxnorm's short name (``"h100"``, ``"v5e"``).
    platform: ``"gpu"`` or ``"tpu"``.
    device_kind: the device kind JAX reports (``"NVIDIA H100 80GB HBM3"``,
      ``"TPU v5 lite"``).
    hbm_bytes: device memory per chip (per device JAX sees).
    hbm_bandwidth: bytes per second (datasheet).
    peak_flops: dense bfloat16 flops per second (datasheet).
    smem_per_block: shared memory a CUDA block may opt into (GPU).
    registers_per_sm: 32-bit registers per SM (GPU).
    vmem_bytes: physical VMEM per TensorCore (TPU).
    scoped_vmem_bytes: Mosaic's default scoped-VMEM limit per kernel (TPU),
      raised per call with ``CompilerParams(vmem_limit_bytes=...)``.

  Examples:
    >>> v5e, h100 = CHIPS["v5e"], CHIPS["h100"]
    >>> v5e.platform, v5e.vmem_bytes // 2**20, v5e.scoped_vmem_bytes // 2**20
    ('tpu', 128, 16)
    >>> h100.platform, h100.smem_per_block // 2**10, h100.hbm_bandwidth
    ('gpu', 227, 3350000000000.0)
  """

  name: str
  platform: str
  device_kind: str
  hbm_bytes: int
  hbm_bandwidth: float
  peak_flops: float
  smem_per_block: int = 0
  registers_per_sm: int = 0
  vmem_bytes: int = 0
  scoped_vmem_bytes: int = 0


_KIB, _MIB, _GIB = 1 << 10, 1 << 20, 1 << 30

# Datasheets: NVIDIA H100 SXM5 (989 TFLOP/s dense BF16, 3.35 TB/s, 80 GB),
# H200 SXM (989 TFLOP/s, 4.8 TB/s, 141 GB), A100 SXM4 80GB (312 TFLOP/s,
# 2.04 TB/s); Google Cloud TPU system architecture pages: v5e (197 TFLOP/s,
# 819 GB/s, 16 GiB), v5p (459 TFLOP/s, 2765 GB/s, 95 GiB), v6e (918 TFLOP/s,
# 1640 GB/s, 32 GiB). sm_80/sm_90: 64K registers per SM; opt-in shared
# memory per block 227 KiB (sm_90), 163 KiB (sm_80). VMEM per TensorCore as
# jax's TPU info lists it (v5e, v6e 128 MiB; v5p 64 MiB); default scoped
# limits 16 MiB (v5e, v5p) and 32 MiB (v6e).
CHIPS: Mapping[str, Chip] = {
  "h100": Chip(
    "h100", "gpu", "NVIDIA H100 80GB HBM3", 80 * 10**9, 3.35e12, 989e12,
    smem_per_block=227 * _KIB, registers_per_sm=65536,
  ),
  "h200": Chip(
    "h200", "gpu", "NVIDIA H200", 141 * 10**9, 4.8e12, 989e12,
    smem_per_block=227 * _KIB, registers_per_sm=65536,
  ),
  "a100": Chip(
    "a100", "gpu", "NVIDIA A100-SXM4-80GB", 80 * 10**9, 2.039e12, 312e12,
    smem_per_block=163 * _KIB, registers_per_sm=65536,
  ),
  "v5e": Chip(
    "v5e", "tpu", "TPU v5 lite", 16 * _GIB, 819e9, 197e12,
    vmem_bytes=128 * _MIB, scoped_vmem_bytes=16 * _MIB,
  ),
  "v5p": Chip(
    "v5p", "tpu", "TPU v5", 95 * _GIB, 2765e9, 459e12,
    vmem_bytes=64 * _MIB, scoped_vmem_bytes=16 * _MIB,
  ),
  "v6e": Chip(
    "v6e", "tpu", "TPU v6 lite", 32 * _GIB, 1640e9, 918e12,
    vmem_bytes=128 * _MIB, scoped_vmem_bytes=32 * _MIB,
  ),
}  # fmt: skip


def chip_of(device_kind: str) -> Chip | None:
  """The `CHIPS` entry whose device kind ``device_kind`` is, else ``None``.

  GPU kinds match by model (``"NVIDIA H100 PCIe"`` is an H100); TPU kinds
  exactly (``"TPU v5"`` is v5p, ``"TPU v5 lite"`` v5e).

  Examples:
    >>> chip_of("NVIDIA H100 PCIe").name, chip_of("TPU v5").name
    ('h100', 'v5p')
    >>> chip_of("cpu") is None
    True
  """
  for chip in CHIPS.values():
    if chip.platform == "tpu" and device_kind == chip.device_kind:
      return chip
    model = " ".join(chip.device_kind.split()[:2]).split("-")[0]
    if chip.platform == "gpu" and device_kind.startswith(model):
      return chip
  return None


def _gpu_config(chip: Chip, capability: tuple[int, int]) -> str:
  """The ``gpu_device_info`` text proto XLA's deviceless GPU compiler takes."""
  major, minor = capability
  extension = " feature_extension: ACCELERATED_FEATURES" if major >= 9 else ""
  cores = {"h100": 132, "h200": 132, "a100": 108}[chip.name]
  clock = {"h100": 1.98, "h200": 1.98, "a100": 1.41}[chip.name]
  smem_core = chip.smem_per_block + _KIB  # the driver reserves 1 KiB/block
  return (
    "gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32 "
    f"shared_memory_per_block: 49152 shared_memory_per_core: {smem_core} "
    f"shared_memory_per_block_optin: {chip.smem_per_block} "
    f"threads_per_core_limit: 2048 core_count: {cores} fpus_per_core: 128 "
    "block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 "
    f"block_dim_limit_z: 65535 memory_bandwidth: {int(chip.hbm_bandwidth)} "
    "l2_cache_size: 52428800 "
    f"clock_rate_ghz: {clock} device_memory_size: {chip.hbm_bytes} "
    f"registers_per_core_limit: {chip.registers_per_sm} "
    f"registers_per_block_limit: 65536 cuda_compute_capability {{ major: "
    f'{major} minor: {minor}{extension} }} }} platform_name: "CUDA" '
    "dnn_version_info { major: 9 minor: 10 } runtime_version { major: 12 "
    f'minor: 9 }} device_description_str: "{chip.device_kind}"'
  )


# XLA's deviceless GPU target configs, one per GPU of `CHIPS`.
GPU_TARGETS: Mapping[str, str] = {
  "h100": _gpu_config(CHIPS["h100"], (9, 0)),
  "h200": _gpu_config(CHIPS["h200"], (9, 0)),
  "a100": _gpu_config(CHIPS["a100"], (8, 0)),
}

_FORMS = (
  "GPUs as NAME:N (N devices of one host), NAME in "
  f"{tuple(GPU_TARGETS)}, e.g. 'h100:8', 'h200:1'; TPUs as jax spells "
  "them, 'v5e:AxB', 'v6e:AxB' or 'v5p:AxBxC', e.g. 'v5e:2x2', 'v6e:4x4', "
  "'v5p:2x2x1'"
)


def setup_environment() -> None:
  """Sets the variables deviceless compiles need; call before JAX starts.

  ``JAX_PLATFORMS=cpu`` (the host runs nothing on a GPU/TPU plugin),
  ``TPU_SKIP_MDS_QUERY`` (no TPU metadata server),
  ``ALLOW_MULTIPLE_LIBTPU_LOAD`` (parallel test processes), and the
  ptxas of ``nvidia-cuda-nvcc-cu12`` first on ``PATH`` (XLA takes the first
  one it finds). Values already set are kept. ``TPU_WORKER_HOSTNAMES`` is
  left unset: it would silence libtpu's harmless "host bounds" line, but
  JAX then takes the process for a TPU pod worker and expects
  ``jax.distributed.initialize`` to be called. It may run after ``import
  jax`` but must run before JAX initializes a backend (the CUDA plugin
  validates a local CUDA install unless the platforms exclude it). On a
  machine with a GPU or TPU to run on, do not call it: it hides them.

  Examples:
    Here the environment is restored afterwards (a script calls it once,
    first):

    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"JAX_PLATFORMS": "cpu"}):
    ...   aot.setup_environment()
    ...   print(os.environ["JAX_PLATFORMS"], "TPU_SKIP_MDS_QUERY" in os.environ)
    cpu True
  """
  if "JAX_PLATFORMS" not in os.environ:
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "true")
  # find_spec of a submodule imports its parent: no nvidia package, no nvcc.
  nvidia = importlib.util.find_spec("nvidia")
  spec = nvidia and importlib.util.find_spec("nvidia.cuda_nvcc")
  if spec is not None and spec.submodule_search_locations:
    bin_dir = os.path.join(list(spec.submodule_search_locations)[0], "bin")
    path = os.environ.get("PATH", "")
    if not path.startswith(bin_dir):
      os.environ["PATH"] = bin_dir + os.pathsep + path


def _need(module: str, what: str) -> None:
  if importlib.util.find_spec(module) is None:
    raise ModuleNotFoundError(
      f"jaxnorm.aot: compiling for {what} needs the {module!r} package of "
      f"the aot extra; install it with {INSTALL}"
    )


def available(platform: str) -> bool:
  """Whether the compilers for ``platform`` (``"gpu"``/``"tpu"``) installed.

  Examples:
    >>> isinstance(available("gpu"), bool)  # True with the aot extra
    True
  """
  module = {"gpu": "jax_cuda12_plugin", "tpu": "libtpu"}[platform]
  return importlib.util.find_spec(module) is not None


def parse(name: str) -> tuple[Chip, tuple[int, ...]]:
  """``(chip, shape)`` of a topology name such as ``"v5e:2x2"``, ``"h100:8"``.

  Raises:
    ValueError: for an unknown name, listing the valid forms.

  Examples:
    >>> chip, shape = parse("v5e:2x2")
    >>> chip.name, chip.platform, shape
    ('v5e', 'tpu', (2, 2))
    >>> parse("h100:8")[1]  # GPUs: N devices of one host
    (8,)
  """
  m = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)*)", name.strip().lower())
  chip = CHIPS.get(m.group(1)) if m else None
  shape = tuple(int(d) for d in m.group(2).split("x")) if m else ()
  dims = {"gpu": (1,), "tpu": (2, 3)}
  ok = chip is not None and len(shape) in dims[chip.platform]
  ok = ok and all(d >= 1 for d in shape)
  if ok and chip.name in ("v5e", "v6e"):
    ok = len(shape) == 2
  if ok and chip.name == "v5p":
    ok = len(shape) == 3
  if not ok:
    raise ValueError(f"topology: unknown topology {name!r}; valid: {_FORMS}")
  return chip, shape


def topology(name: str, axis_names: tuple[str, ...] | None = None) -> Any:
  """A deviceless mesh of the named chips, to compile for under `set_mesh`.

  Args:
    name: ``"h100:8"``, ``"h200:1"``, ``"a100:4"`` (N GPUs of one host) or a
      TPU topology as jax spells it (``"v5e:2x2"``, ``"v6e:4x4"``,
      ``"v5p:2x2x1"``).
    axis_names: names of the mesh axes, one per axis of the topology's
      shape (for GPUs one axis); default ``("x",)``, ``("x", "y")`` or
      ``("x", "y", "z")``. Reshape the devices into another mesh with
      ``jax.sharding.Mesh(mesh.devices.reshape(...), names)``.

  Returns:
    A `jax.sharding.Mesh` of the topology's devices (not addressable: arrays
    are `jax.ShapeDtypeStruct`s with a `NamedSharding` on it, or the mesh is
    set with ``jax.set_mesh``).

  Raises:
    ValueError: for an unknown name (listing the valid forms) or axis names
      that do not match the shape.
    ModuleNotFoundError: when the aot extra is missing, naming the pip
      command.

  Examples:
    A name is checked before any compiler is needed (v5e is 2-D):

    >>> topology("v5e:8")
    Traceback (most recent call last):
    ValueError: topology: unknown topology 'v5e:8'; valid: GPUs as NAME:N ...
  """
  chip, shape = parse(name)
  if axis_names is None:
    axis_names = ("x", "y", "z")[: len(shape)]
  if len(axis_names) != len(shape):
    raise ValueError(
      f"topology: axis_names must name the {len(shape)} axes of {name!r} "
      f"(shape {shape}), got axis_names={axis_names}"
    )
  from jax.experimental import topologies

  if chip.platform == "gpu":
    _need("jax_cuda12_plugin", chip.name)
    desc = topologies.get_topology_desc(
      platform="cuda",
      target_config=GPU_TARGETS[chip.name],
      topology=f"1x{shape[0]}x1",
    )
  else:
    _need("libtpu", chip.name)
    desc = topologies.get_topology_desc(
      platform="tpu", topology_name=f"{chip.name}:{'x'.join(map(str, shape))}"
    )
  devices = list(desc.devices)
  if len(devices) != math.prod(shape):
    raise ValueError(
      f"topology: {name!r} gave {len(devices)} devices, expected "
      f"{math.prod(shape)}"
    )
  return topologies.make_mesh(desc, shape, axis_names)


@dataclasses.dataclass(frozen=True)
class PtxasKernel:
  """One entry function of a ptxas ``-v`` report.

  Attributes:
    name: the kernel's entry function.
    registers: 32-bit registers per thread.
    spill_stores: bytes spilled to local memory.
    spill_loads: bytes reloaded from it.

  Examples:
    >>> kernel = PtxasKernel("add_kernel", 32, 0, 0)
    >>> kernel.registers, kernel.spill_stores + kernel.spill_loads
    (32, 0)
  """

  name: str
  registers: int
  spill_stores: int
  spill_loads: int


def parse_ptxas(text: str) -> list[PtxasKernel]:
  """The kernels of a ptxas report, in order, each name once.

  ``MOSAIC_GPU_DUMP_PTXAS=1`` prints the report of every Mosaic GPU kernel
  compiled (on stdout, or to ``NAME.ptxas`` files under
  ``MOSAIC_GPU_DUMP_TO``). A kernel's entry starts at "Compiling entry
  function 'NAME'", its spills are on the "bytes stack frame" line and it
  ends at "Used N registers". The warning "wgmma.mma_async instructions are
  serialized due to insufficient register resources" is not parsed: search
  the text for it.

  Examples:
    >>> report = '''ptxas info : Compiling entry function 'add' for 'sm_90a'
    ... ptxas info : Function properties for add
    ...     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
    ... ptxas info : Used 32 registers, 384 bytes cmem[0]'''
    >>> parse_ptxas(report)
    [PtxasKernel(name='add', registers=32, spill_stores=4, spill_loads=4)]
  """
  kernels: dict[str, PtxasKernel] = {}
  name, spills = None, (0, 0)
  for line in text.splitlines():
    if m := re.search(r"Compiling entry function '([^']+)'", line):
      name, spills = m.group(1), (0, 0)
    elif m := re.search(
      r"bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
      line,
    ):
      spills = (int(m.group(1)), int(m.group(2)))
    elif (m := re.search(r"Used (\d+) registers", line)) and name:
      kernels.setdefault(name, PtxasKernel(name, int(m.group(1)), *spills))
      name = None
  return list(kernels.values())
