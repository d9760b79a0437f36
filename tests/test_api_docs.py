"""docs/API.md is generated from the docstrings and must stay current."""

import importlib.util
import pathlib

_SCRIPT = pathlib.Path(__file__).parents[1] / "docs" / "make_api.py"


def _make_api():
  spec = importlib.util.spec_from_file_location("make_api", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_api_reference_is_current():
  make_api = _make_api()
  assert make_api.main(["--check"]) == 0, (
    "docs/API.md is out of date: run python docs/make_api.py"
  )


def test_every_family_lists_its_public_names():
  text = _make_api().render()
  for name in ("rms_norm", "dot_product_attention", "adamp", "RMSNorm"):
    assert f"| `{name}` |" in text
