"""Every public pure function has a fuzz builder whose plain case works."""

import pytest

from tests.fuzz import _builders, _property

_ALL = _property.all_public_functions()


def test_every_public_function_has_a_builder():
  missing = sorted(set(_ALL) - set(_builders.BUILDERS))
  assert not missing, f"no fuzz builder in tests/fuzz/_builders.py: {missing}"


def test_every_builder_is_a_public_function():
  stale = sorted(set(_builders.BUILDERS) - set(_ALL))
  assert not stale, f"builders of no public function: {stale}"


@pytest.mark.parametrize("name", sorted(set(_ALL) & set(_builders.BUILDERS)))
def test_traced_cases(name):
  # The plain draw must be accepted (a builder whose every case is refused
  # would pass the fuzz vacuously); int32 and 64-bit NumPy inputs must give
  # the documented output or a well-formed error, and never a warning.
  spec = _builders.BUILDERS[name]
  plain, *others = _property.traced_dtypes(spec)
  assert _property.check_traced(name, plain), f"{name} refused its plain case"
  for dtype in others:
    _property.check_traced(name, dtype)
