"""Test-wide JAX configuration: fake CPU devices, strict numerics, markers.

The device count must be set before JAX initializes a backend, so this module
sets ``XLA_FLAGS`` before anything imports jax.

The suite is compile-bound (thousands of small jitted programs, each run once
or twice), so the tests ask XLA:CPU for its cheapest compiles. The lowest
LLVM optimization level cuts the suite's CPU time by about a third (measured
on tests/norms and tests/optim: 315 s -> 214 s); the HLO passes (fusion,
layout, algebraic rewrites) are the same and only machine-code optimization
is skipped, so results move only at float32 round-off (multiply-adds are
contracted differently). On jaxlib 0.10 the older fusion emitters save a
third more (below). Benchmarks and experiments run at XLA's defaults.

With the ``aot`` extra installed (deviceless GPU/TPU compilers), the host
platform is pinned to the CPU (`jaxnorm.aot.setup_environment`, which keeps a
``JAX_PLATFORMS`` that is already set: set ``JAX_PLATFORMS=cuda`` to run the
suite on a real GPU with the extra installed). Tests marked ``aot`` compile
for deviceless chips and skip with the install command where the extra is
missing.
"""

import importlib.metadata
import os

_TEST_FLAGS = [
  "--xla_force_host_platform_device_count=8",
  "--xla_backend_optimization_level=0",
]
# Each compile of a small program costs XLA:CPU a fixed ~50 ms of CPU, most
# of it in the MLIR fusion emitters; jaxlib 0.10's older emitters take a
# third less (measured: 50 -> 33 ms per program; tests/norms/test_batch.py
# and the residual degenerate-row tests 63 -> 39 s of CPU). The flag is gone
# in jaxlib 0.12 (an unknown XLA flag aborts the process), so only 0.10 gets
# it.
_JAXLIB = tuple(
  int(p) for p in importlib.metadata.version("jaxlib").split(".")[:2]
)
if _JAXLIB < (0, 11):
  _TEST_FLAGS.append("--xla_cpu_use_fusion_emitters=false")
for _flag in _TEST_FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + " " + _flag
    ).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

from jaxnorm import aot  # noqa: E402

_AOT = aot.available("gpu") or aot.available("tpu")
if _AOT:
  aot.setup_environment()

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_collection_modifyitems(config, items):
  del config
  backend = jax.default_backend()
  for item in items:
    for marker in ("gpu", "tpu"):
      if item.get_closest_marker(marker) and backend != marker:
        item.add_marker(pytest.mark.skip(reason=f"needs a {marker} backend"))
    if item.get_closest_marker("aot") and not _AOT:
      item.add_marker(
        pytest.mark.skip(reason=f"needs the aot extra: {aot.INSTALL}")
      )


@pytest.fixture
def key():
  """A fixed PRNG key; tests split it rather than seeding ad hoc."""
  return jax.random.key(0)
