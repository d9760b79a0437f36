"""The devices a program is compiled for, as kernel dispatch sees them.

A kernel's lowering (Mosaic GPU, Triton, Mosaic TPU, or none: the XLA
reference) and its tiling depend on the chip the program will run on, and
that is not always the machine's default backend: a user may compile for a
deviceless H100 or TPU topology on a CPU host (`jaxnorm.aot`), or run on a
mesh of another backend than the default. `current` reads the target in this
order, the first that names devices winning:

1. the current mesh (``jax.set_mesh`` / ``jax.sharding.use_abstract_mesh``):
   its abstract device's platform and kind;
2. the arguments' shardings: inside ``jit`` the mesh of each tracer's type,
   outside it the devices each array lives on;
3. the default backend and its first device.

A GPU's compute capability is read from a local device of the same kind
where one exists (real hardware) and otherwise from `GPU_CAPABILITIES`, the
table of NVIDIA device kinds (a deviceless target has no local device). ROCm
devices have none, so they never qualify for Mosaic GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from jaxnorm import aot

# Platform names as `jax.default_backend()` and devices spell them, mapped
# to the three families dispatch distinguishes.
_PLATFORMS = {"cuda": "gpu", "rocm": "gpu", "gpu": "gpu", "tpu": "tpu"}

# NVIDIA device kinds (`device.device_kind`, matched by prefix, longest
# first) and their CUDA compute capabilities, from NVIDIA's CUDA GPU table.
GPU_CAPABILITIES: Mapping[str, tuple[int, int]] = {
  "NVIDIA GB200": (10, 0),
  "NVIDIA B200": (10, 0),
  "NVIDIA H200": (9, 0),
  "NVIDIA H100": (9, 0),
  "NVIDIA H800": (9, 0),
  "NVIDIA GH200": (9, 0),
  "NVIDIA L40S": (8, 9),
  "NVIDIA L4": (8, 9),
  "NVIDIA A100": (8, 0),
  "NVIDIA A800": (8, 0),
  "NVIDIA A10": (8, 6),
  "Tesla V100": (7, 0),
}


@dataclasses.dataclass(frozen=True)
class Target:
  """The chip a program is compiled for.

  Attributes:
    platform: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (other backends keep their
      own name and are treated as having no kernels).
    device_kind: the device's kind, e.g. ``"NVIDIA H100 80GB HBM3"`` or
      ``"TPU v5 lite"``.
    source: where it was read: ``"mesh"``, ``"arguments"`` or ``"default
      backend"`` (for messages).
    compute_capability: ``(major, minor)`` of an NVIDIA GPU, else ``None``.
  """

  platform: str
  device_kind: str
  source: str
  compute_capability: tuple[int, int] | None = None

  @property
  def accelerator(self) -> bool:
    """Whether kernels can be compiled for this target (a GPU or a TPU)."""
    return self.platform in ("gpu", "tpu")

  @property
  def chip(self) -> aot.Chip | None:
    """The `jaxnorm.aot.CHIPS` entry of this device kind, else ``None``."""
    return aot.chip_of(self.device_kind)

  def describe(self) -> str:
    """``"gpu 'NVIDIA H100 80GB HBM3', from the mesh"`` and the like."""
    return f"{self.platform} {self.device_kind!r}, from the {self.source}"


def _capability(device_kind: str) -> tuple[int, int] | None:
  """Compute capability of an NVIDIA device kind, local device first."""
  try:
    local = jax.devices("gpu")
  except RuntimeError:  # no GPU backend in this process
    local = []
  for device in local:
    if device.device_kind == device_kind:
      parts = str(getattr(device, "compute_capability", "")).split(".")
      if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]):
        return int(parts[0]), int(parts[1])
      return None
  for prefix in sorted(GPU_CAPABILITIES, key=len, reverse=True):
    if device_kind.startswith(prefix):
      return GPU_CAPABILITIES[prefix]
  return None


def _make(platform: str, device_kind: str, source: str) -> Target:
  platform = _PLATFORMS.get(platform, platform)
  cc = _capability(device_kind) if platform == "gpu" else None
  return Target(platform, device_kind, source, cc)


def _from_abstract_mesh(mesh: Any) -> tuple[str, str] | None:
  device = None if mesh is None or mesh.empty else mesh.abstract_device
  if device is None:
    return None
  return device.platform, device.device_kind


def _from_array(x: Any) -> tuple[str, str] | None:
  if isinstance(x, jax.core.Tracer):
    sharding = getattr(jax.typeof(x), "sharding", None)
    return _from_abstract_mesh(getattr(sharding, "mesh", None))
  sharding = getattr(x, "sharding", None)
  if sharding is None:
    return None
  device = next(iter(sharding.device_set))
  return device.platform, device.device_kind


def current(*arrays: Any) -> Target:
  """The target of the program being traced (see the module docstring).

  Args:
    *arrays: the kernel's array arguments; non-arrays are skipped.

  Returns:
    The `Target`.
  """
  found = _from_abstract_mesh(jax.sharding.get_abstract_mesh())
  if found is not None:
    return _make(*found, "mesh")
  for x in arrays:
    found = _from_array(x)
    if found is not None:
      return _make(*found, "arguments")
  device = jax.devices()[0]
  return _make(jax.default_backend(), device.device_kind, "default backend")
