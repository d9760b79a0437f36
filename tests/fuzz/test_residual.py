"""Fuzzing `jaxnorm.residual` (property: tests/fuzz/_property.py)."""

import hypothesis
import pytest

from tests.fuzz import _builders, _property


@pytest.mark.parametrize("name", sorted(_property.public_functions("residual")))
@_property.SETTINGS
@hypothesis.given(data=hypothesis.strategies.data())
def test_fuzz(name, data):
  spec = _builders.BUILDERS[name]
  _property.check_function(name, data.draw(_property.draws(spec, name)))
