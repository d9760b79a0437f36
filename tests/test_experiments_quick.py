"""Each experiment script's ``--quick`` mode runs in-process and reports.

These run the whole pipeline (training, evaluation, verdict, Markdown and
plot) at toy scale; the numbers are not checked, the artifacts are.
"""

import json

import pytest

from experiments import (
  adamp_claims,
  affine_scaled_claims,
  attention_claims,
  cls_norm_claims,
  cnn_attention_claims,
  convert_prenorm,
  depthbench,
  elu_claims,
  gauge_claims,
  gecko_claims,
  geometric_attention_claims,
  grpo,
  llm_int8,
  looped_power,
  mxattention_claims,
  nap_claims,
  norms_bytelm,
  nuclear_norm,
  optimizers_claims,
  powernorm_claims,
  regionnorm_claims,
  remove_layernorm,
  residual_depth,
  residual_streams,
  rmsnorm_variants,
  salunet_claims,
  salunet_vit_claims,
  shiftquant_claims,
  snn_claims,
  ttn_claims,
  unifiednorm_claims,
  vision_claims,
  vit_attention_claims,
)
from jaxnorm.training import claims

# Every claims script (each keeps its run directories under --runs).
CLAIMS = (
  grpo,
  looped_power,
  llm_int8,
  nuclear_norm,
  convert_prenorm,
  remove_layernorm,
  norms_bytelm,
  rmsnorm_variants,
  cnn_attention_claims,
  optimizers_claims,
  attention_claims,
  snn_claims,
  ttn_claims,
  powernorm_claims,
  regionnorm_claims,
  residual_depth,
  vision_claims,
  vit_attention_claims,
  unifiednorm_claims,
  affine_scaled_claims,
  geometric_attention_claims,
  mxattention_claims,
  adamp_claims,
  nap_claims,
  cls_norm_claims,
  gecko_claims,
  elu_claims,
  salunet_claims,
  salunet_vit_claims,
  shiftquant_claims,
  gauge_claims,
  residual_streams,
  depthbench,
)

# Each experiment script end to end in --quick mode: CI runs them (-m slow).
pytestmark = pytest.mark.slow


def _check(out, name):
  md = (out / f"{name}.md").read_text()
  assert "## Claims" in md and "**Verdict" in md
  assert (out / f"{name}.png").stat().st_size > 0
  result = json.loads((out / f"{name}.json").read_text())
  claims.check_records(result["claims"])
  assert result["claims"] and all("setting" in r for r in result["claims"])
  assert {r["verdict"] for r in result["claims"]} <= set(claims.VERDICTS)
  assert result["run"]["tier"] == "quick"


@pytest.mark.parametrize("module", CLAIMS, ids=lambda m: m.NAME)
def test_quick(module, tmp_path):
  argv = ["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]
  assert module.main(argv)
  _check(tmp_path, module.NAME)
