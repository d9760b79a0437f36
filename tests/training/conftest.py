"""Fixtures of the runner's tests: promotion mode and a compilation cache.

Every `trainer.train` call builds fresh jitted closures, so without a cache
each run recompiles the same programs; the persistent cache (one folder per
test session) turns every repeat of an identical program into a cache hit.
"""

import os

import jax
import pytest
from jax._src import compilation_cache

_CACHE_OPTIONS = (
  "jax_compilation_cache_dir",
  "jax_persistent_cache_min_compile_time_secs",
  "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture(scope="session", autouse=True)
def compilation_cache_dir(tmp_path_factory):
  before = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
  # xdist workers share the session's root folder, and so the cache.
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  path = root / "jax-cache"
  path.mkdir(exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  compilation_cache.reset_cache()
  yield path
  for name, value in before.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


@pytest.fixture(autouse=True)
def standard_promotion():
  # optax's bias corrections mix int counts with floats, which strict
  # promotion (tests/conftest.py) rejects; the engine runs user-side code.
  with jax.numpy_dtype_promotion("standard"):
    yield
