"""docs/API.md is generated from the docstrings and must stay current.

Its "Deviations from flax and optax" section names every norm that refuses
a flax keyword and the optimizers' `mu_dtype`; every refusal it lists
raises an error naming the keyword.
"""

import importlib.util
import inspect
import pathlib

import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm.nn import _param
from jaxnorm.nn.norms import _common as norm_common

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


# ---------------------------------------------------------------------------
# The deliberate deviations from flax and optax.

_SECTION = "## Deviations from flax and optax"

# A refused value for each spelling the docs list (docs/make_api.py reads
# the spellings from `paper_affine` and `flax_spelling`).
_AFFINE_TRIGGERS = {
  "use_scale=False": ("use_scale", {"use_scale": False}),
  "use_bias=True": ("use_bias", {"use_bias": True}),
  "use_bias=False": ("use_bias", {"use_bias": False}),
  "scale_init": ("scale_init", {"scale_init": nnx.initializers.ones}),
  "bias_init": ("bias_init", {"bias_init": nnx.initializers.zeros}),
  "promote_dtype (not None)": (
    "promote_dtype",
    {"promote_dtype": nnx.nn.dtypes.promote_dtype},
  ),
}
_SPELLING_TRIGGERS = {
  "reduction_axes / feature_axes / axis other than -1": (
    ValueError,
    "feature_axes must be -1",
    {"feature_axes": 0},
  ),
  "use_fast_variance=True": (
    ValueError,
    "use_fast_variance=True is not available",
    {"use_fast_variance": True},
  ),
  "scale_metadata / bias_metadata": (
    TypeError,
    "scale_metadata is flax's spelling",
    {"scale_metadata": ()},
  ),
}


def _deviations() -> str:
  text = _make_api().render()
  assert _SECTION in text
  start = text.index(_SECTION)
  return text[start : text.index("\n## ", start + len(_SECTION))]


def _spelled(cls) -> bool:
  return bool(getattr(cls.__init__, norm_common.FLAX_SPELLING_ATTR, None))


def test_deviations_name_the_optimizers_and_the_refusing_norms():
  section = _deviations()
  assert "`mu_dtype`" in section and "float32" in section
  for name in ("adamp", "sgdp", "conda", "rmnp", "nap_project"):
    assert f"`{name}`" in section, name
  refusing = 0
  for name, spec in jnn.NORMS.items():
    cls = spec.module
    refusals = _param.affine_refusals(cls)
    if refusals or _spelled(cls):
      refusing += 1
      assert f"`{cls.__name__}`" in section, name
    for refused in refusals:
      if refused != "promote_dtype (not None)":
        assert f"| `{name}` | `{cls.__name__}` | `{refused}` |" in section
    # Every norm takes flax's promote_dtype or refuses it by name.
    takes = "promote_dtype" in inspect.signature(cls.__init__).parameters
    assert takes != ("promote_dtype (not None)" in refusals), name
  assert refusing > 5
  for refused in norm_common.FLAX_SPELLING_REFUSALS:
    assert f"`{refused}`" in section
  assert "`PowerNorm`, `UnifiedNorm`" in section  # backward-pass state


@pytest.mark.parametrize("name", sorted(jnn.NORMS))
def test_every_documented_norm_refusal_raises(name):
  cls = jnn.NORMS[name].module
  refusals = _param.affine_refusals(cls)
  assert set(refusals) <= set(_AFFINE_TRIGGERS), "add a trigger above"
  for refused in refusals:
    keyword, kwargs = _AFFINE_TRIGGERS[refused]
    with pytest.raises(ValueError, match=f"{cls.__name__}: {keyword}") as e:
      jnn.make_norm(name, 8, rngs=nnx.Rngs(0), **kwargs)
    assert "is not available: " in str(e.value)
  if not _spelled(cls):
    return
  assert set(norm_common.FLAX_SPELLING_REFUSALS) == set(_SPELLING_TRIGGERS)
  for error, message, kwargs in _SPELLING_TRIGGERS.values():
    with pytest.raises(error, match=f"{cls.__name__}: {message}"):
      jnn.make_norm(name, 8, rngs=nnx.Rngs(0), **kwargs)
