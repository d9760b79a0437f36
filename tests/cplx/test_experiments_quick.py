"""Each complex experiment's ``--quick`` mode runs in-process and reports.

The whole pipeline (data, training, evaluation, verdict, Markdown, JSON and
plot) at toy scale; the numbers are not checked, the artifacts are. Each
quick run is compile-bound (tens of seconds on the shared 2-core machine), so
all are end-to-end cases of the slow set.
"""

import json

import pytest

from experiments import (
  complex_e1_cvcnn,
  complex_e2_cnet,
  complex_e3_fairy2i,
  complex_e4_complexformer,
  complex_e5_pct,
)
from experiments.complex_common import VERDICTS

pytestmark = pytest.mark.slow

CASES = [
  (complex_e1_cvcnn, "e1_cvcnn"),
  (complex_e2_cnet, "e2_cnet"),
  (complex_e3_fairy2i, "e3_fairy2i"),
  (complex_e4_complexformer, "e4_complexformer"),
  (complex_e5_pct, "e5_pct"),
]


@pytest.mark.parametrize(("module", "name"), CASES)
def test_quick(module, name, tmp_path):
  record = module.main(["--quick", "--out", str(tmp_path)])
  assert record["seeds"] == 1
  md = (tmp_path / f"complex_{name}.md").read_text()
  assert "**Verdict" in md and any(v in md for v in VERDICTS)
  assert "±" in md
  assert (tmp_path / f"complex_{name}.png").stat().st_size > 0
  saved = json.loads((tmp_path / f"complex_{name}.json").read_text())
  assert saved["seeds"] == 1
