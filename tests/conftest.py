"""Test-wide JAX configuration: fake CPU devices, strict numerics, markers.

The device count must be set before JAX initializes a backend, so this module
sets ``XLA_FLAGS`` before anything imports jax.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " " + _DEVICE_FLAG
  ).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_collection_modifyitems(config, items):
  del config
  backend = jax.default_backend()
  for item in items:
    for marker in ("gpu", "tpu"):
      if item.get_closest_marker(marker) and backend != marker:
        item.add_marker(pytest.mark.skip(reason=f"needs a {marker} backend"))


@pytest.fixture
def key():
  """A fixed PRNG key; tests split it rather than seeding ad hoc."""
  return jax.random.key(0)
