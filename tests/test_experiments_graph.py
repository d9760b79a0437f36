"""`experiments.graph_transformer`: the ablation arms and the quick run.

The arms are runner configs (`jaxnorm-train --model graph`); each must be
valid and differ from the paper's model in the one part its claim is
about. The ``--quick`` run (slow set) trains every arm through the runner
at toy scale and writes checked claim records, each with both arms'
setting; toy accuracies decide nothing.
"""

import dataclasses
import json

import pytest

from experiments import graph_transformer as gt
from experiments._harness import runs, tiers
from jaxnorm.training import build, claims
from jaxnorm.training import config as config_lib


@pytest.mark.parametrize("tier", ["--quick", None, "--full"])
def test_every_arm_is_a_valid_runner_config(tier):
  args = tiers.parser(gt.__doc__, gt.NAME).parse_args([tier] if tier else [])
  base = gt.base_config(args)
  for name, changes in gt.VARIANTS.items():
    cfg = dataclasses.replace(base, **changes)
    config_lib.validate(cfg, build.registries_for(cfg))
    resolved = config_lib.resolve(cfg)
    parts = (resolved.norm, resolved.graph, resolved.positional)
    assert (
      parts
      == {
        gt.MAIN: ("batchnorm", "sparse", "lap"),
        "sparse+LN+LapPE": ("layernorm", "sparse", "lap"),
        "full+BN+LapPE": ("batchnorm", "full", "lap"),
        "sparse+BN+noPE": ("batchnorm", "sparse", "none"),
      }[name]
    )


def test_claims_compare_the_main_arm_with_one_ablation_each():
  assert {c.a for c in gt.CLAIMS} == {gt.MAIN}
  assert {c.b for c in gt.CLAIMS} == set(gt.VARIANTS) - {gt.MAIN}
  assert all(
    c.kind == "superior" and c.arxiv == "2012.09699" for c in gt.CLAIMS
  )
  args = tiers.parser(gt.__doc__, gt.NAME).parse_args([])
  chance = runs.chance_loss(gt.base_config(args))
  assert chance == pytest.approx(0.693, abs=1e-3)  # ln 2: two classes.
  lines = [{"variant": "x", "val_loss": 0.6}, {"variant": "x", "val_loss": 0.7}]
  assert "0.700" in runs.untrained(lines, "x", chance)
  assert runs.untrained(lines[:1], "x", chance) is None


@pytest.mark.slow
def test_quick(tmp_path):
  argv = ["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]
  result = gt.main(argv)
  md = (tmp_path / "graph_transformer.md").read_text()
  assert "**Verdict" in md and "## Claims" in md
  assert (tmp_path / "graph_transformer.png").stat().st_size > 0
  saved = json.loads((tmp_path / "graph_transformer.json").read_text())
  claims.check_records(saved["claims"])
  assert len(saved["claims"]) == len(gt.CLAIMS)
  assert all(r["setting"]["a"]["unit"] == "graphs" for r in saved["claims"])
  assert saved["run"]["tier"] == "quick"
  assert {ln["variant"] for ln in result["lines"]} == set(gt.VARIANTS)
