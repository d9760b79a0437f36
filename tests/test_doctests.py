"""The docstring examples of the public API run and stay true.

Every module of the families below (each package walked with `pkgutil`):
the pure functions, the nnx modules (`jaxnorm.nn`), the optimizers, the
linen wrappers, sharding and the deviceless targets. Each module's doctests
run as one test, under the suite's strict dtype and rank promotion
(tests/conftest.py), with ``NORMALIZE_WHITESPACE`` and ``ELLIPSIS``; they
compile many small programs, so they run with the slow tests (``-m slow``).
Each family's own docstring shows the imports; an example runs in its
module's namespace with ``jax``, ``jnp`` (`jax.numpy`), ``np`` (`numpy`),
``nnx`` (`flax.nnx`), ``optax`` and the families as ``from jaxnorm import
<family>`` binds them (the pure families' examples use only those; the
module layer's also call their module's own names). Printed values go
through NumPy (``np.asarray(y).round(4)``) or Python floats, whose format
does not change with the jax version.

A second check keeps the public surface documented: every function named in
a family's ``__all__`` has an ``Examples:`` section with a ``>>>`` line, and
so does the docstring of the family itself, so a new public function fails
here until it has one. A third keeps one name per concept: a name public in
two families is one object.
"""

import doctest
import importlib
import inspect
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

FAMILIES = (
  "norms",
  "fused_norms",
  "activations",
  "attention",
  "residual",
  "rl",
  "quant",
  "looped",
  "analysis",
  "graph",
  "depth_metrics",
  "cplx",
  "nn",
  "optim",
  "linen",
  "sharding",
  "aot",
)
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _modules() -> list[str]:
  """Every module of the families: the family, then its submodules."""
  names = []
  for family in FAMILIES:
    module = importlib.import_module(f"jaxnorm.{family}")
    names.append(module.__name__)
    if hasattr(module, "__path__"):
      names.extend(
        info.name
        for info in pkgutil.walk_packages(
          module.__path__, prefix=f"{module.__name__}."
        )
      )
  return names


def _globs() -> dict[str, object]:
  """The namespace every example runs in (copied for each docstring)."""
  names = {"jax": jax, "jnp": jnp, "np": np, "nnx": nnx, "optax": optax}
  for family in FAMILIES:
    names[family] = importlib.import_module(f"jaxnorm.{family}")
  return names


def _has_examples(obj) -> bool:
  """An ``Examples:`` section with a ``>>>`` line among its lines."""
  lines = (inspect.getdoc(obj) or "").splitlines()
  for i, line in enumerate(lines):
    if line.strip() != "Examples:":
      continue
    indent = len(line) - len(line.lstrip())
    for body in lines[i + 1 :]:
      if body.strip() and len(body) - len(body.lstrip()) <= indent:
        break  # the next section or the end of this one
      if body.lstrip().startswith(">>>"):
        return True
  return False


@pytest.mark.slow
@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
  module = importlib.import_module(name)
  tests = doctest.DocTestFinder(exclude_empty=True).find(
    module, name, globs={**_globs(), **vars(module)}
  )
  report = []
  runner = doctest.DocTestRunner(optionflags=FLAGS)
  for test in tests:
    runner.run(test, out=report.append)
  result = runner.summarize(verbose=False)
  assert result.failed == 0, "".join(report)


def test_every_public_function_has_examples():
  missing = []
  for family in FAMILIES:
    module = importlib.import_module(f"jaxnorm.{family}")
    assert hasattr(module, "__all__"), f"jaxnorm.{family} has no __all__"
    if not _has_examples(module):
      missing.append(f"jaxnorm.{family} (module docstring)")
    for name in module.__all__:
      obj = getattr(module, name)
      if inspect.isfunction(inspect.unwrap(obj)) and not _has_examples(obj):
        missing.append(f"jaxnorm.{family}.{name}")
  assert not missing, "no Examples: section in\n" + "\n".join(missing)


# The linen wrappers mirror flax.linen: their names are those of the nnx
# modules (and of the attention function they adapt) by design, as
# `flax.linen.LayerNorm` and `flax.nnx.LayerNorm`.
_MIRRORS = ("linen",)


def test_one_name_per_concept():
  """A name public in two families (a pure family and `jaxnorm.nn`, say)
  is the same object in both, never two things that share a spelling."""
  seen: dict[str, tuple[str, object]] = {}
  clashes = []
  for family in FAMILIES:
    if family in _MIRRORS:
      continue
    module = importlib.import_module(f"jaxnorm.{family}")
    for name in module.__all__:
      obj = getattr(module, name)
      first = seen.setdefault(name, (family, obj))
      if first[1] is not obj:
        clashes.append(f"jaxnorm.{first[0]}.{name} != jaxnorm.{family}.{name}")
  assert not clashes, "one name, two objects:\n" + "\n".join(clashes)
  # The pure families and the modules are both checked, nnx included.
  assert {"norms", "nn", "optim"} <= set(FAMILIES) - set(_MIRRORS)


def test_the_check_reads_sections():
  def documented():
    """Summary.

    Examples:
      >>> 1 + 1
      2
    """

  def introduced():
    """Summary.

    Examples:
      With ``x = 1``:

      >>> 1 + 1
      2
    """

  def mentions():
    """Summary; see the examples in the module (Examples: below)."""

  def elsewhere():
    """Summary.

    Examples:
      None here.

    Note:
      >>> 1 + 1
      2
    """

  assert _has_examples(documented)
  assert _has_examples(introduced)
  assert not _has_examples(mentions)
  assert not _has_examples(elsewhere)
