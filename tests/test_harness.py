"""The experiments harness: tuned grids, settings, records, RESULTS.md.

The runner is replaced by a synthetic one whose training loss is a known
function of the learning rate, so the sweep's choice and extensions are
checked exactly; RESULTS.md is rendered from hand-made records.
"""

import argparse
import json
import math

import pytest

from experiments._harness import grid, report, results, tiers
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

BASE = config_lib.TrainConfig(
  width=16, depth=1, num_heads=2, seq_len=8, batch_size=4, steps=10
)


@pytest.fixture
def fake_runner(monkeypatch):
  """``trainer.train`` whose train loss is ``(log10 lr - log10 best)^2``."""
  calls = []

  def train(cfg, model=None):
    del model
    calls.append((cfg.out_dir, cfg.learning_rate, cfg.seed))
    best = 1e-2 if cfg.norm == "layernorm" else 1e-3
    loss = (math.log10(cfg.learning_rate) - math.log10(best)) ** 2
    return {
      "train_loss": loss,
      "val_loss": loss + 0.1 * cfg.seed,
      "params": 1000 if cfg.norm == "layernorm" else 1010,
      "steps": cfg.steps,
    }

  monkeypatch.setattr(grid.trainer, "train", train)
  return calls


def test_tuned_grid_extends_to_an_inside_minimum(tmp_path, fake_runner):
  variants = {"ln": {"norm": "layernorm"}, "rms": {"norm": "rmsnorm"}}
  grids = {"ln": [1e-3, 3e-3], "rms": [1e-3, 3e-3, 1e-2]}
  lines, tuned = grid.tuned_grid(
    tmp_path / "t.jsonl", BASE, variants, (0, 1, 2), grids
  )
  sweeps = tuned["sweeps"]
  # ln's best (1e-2) lies above its grid: two extensions by x3 reach it.
  assert sweeps["ln"]["learning_rate"] == pytest.approx(9e-3)
  assert sweeps["ln"]["inside"] and len(sweeps["ln"]["grid"]) == 4
  # rms's best (1e-3) is its grid's lower end: one extension below.
  assert sweeps["rms"]["learning_rate"] == pytest.approx(1e-3)
  assert min(map(float, sweeps["rms"]["grid"])) == pytest.approx(1e-3 / 3)
  assert tuned["variants"]["rms"] == {
    "norm": "rmsnorm",
    "learning_rate": pytest.approx(1e-3),
  }
  # Every seed at the chosen rate, named by the variant; seed 0 reused.
  assert sorted((ln["variant"], ln["seed"]) for ln in lines) == [
    (v, s) for v in ("ln", "rms") for s in (0, 1, 2)
  ]
  assert all(ln["changes"]["learning_rate"] in (
    sweeps[ln["variant"]]["learning_rate"],
  ) for ln in lines)  # fmt: skip
  runs = len(fake_runner)
  # A rerun trains nothing: the table resumes.
  again, _ = grid.tuned_grid(
    tmp_path / "t.jsonl", BASE, variants, (0, 1, 2), grids
  )
  assert len(fake_runner) == runs and again == lines


def test_tuned_grid_refusals(tmp_path):
  with pytest.raises(ValueError, match="sets learning_rate"):
    grid.tuned_grid(
      tmp_path / "t.jsonl", BASE, {"a": {"learning_rate": 1.0}}, (0,), {}
    )
  with pytest.raises(ValueError, match="two or more, increasing"):
    grid.tuned_grid(tmp_path / "t.jsonl", BASE, {"a": {}}, (0,), {"a": [1.0]})


def test_runner_record_states_each_arms_setting(tmp_path, fake_runner):
  variants = {"ln": {"norm": "layernorm"}, "rms": {"norm": "rmsnorm"}}
  lines, tuned = grid.tuned_grid(
    tmp_path / "t.jsonl", BASE, variants, (0, 1, 2), {"ln": [3e-3, 1e-2, 3e-2]}
  )
  claim = claims.Claim(
    paper="RMSNorm",
    arxiv="1910.07467",
    claim="RMSNorm matches LayerNorm",
    metric="val_loss",
    direction="lower",
    kind="equivalent",
    margin=0.01,
    a="rms",
    b="ln",
  )
  rec = grid.runner_record(
    lines, claim, BASE, tuned["variants"], baseline_trained=True
  )
  claims.check_records([rec])
  assert rec["setting"]["a"] == {
    "params": 1010,
    "steps": 10,
    "examples": 10 * 4 * 8,
    "unit": "tokens",
    "optimizer": "adamw",
    "learning_rate": BASE.learning_rate,
    "data": "shakespeare",
  }
  assert rec["setting"]["b"]["learning_rate"] == pytest.approx(1e-2)
  assert rec["config"]["b"] == {"norm": "layernorm", "learning_rate": 1e-2}
  assert rec["config"]["base"]["width"] == 16


def test_tiers_seeds_and_flags():
  p = tiers.parser("doc", "x")
  assert tiers.seeds(p.parse_args([])) == (0, 1, 2)
  assert tiers.seeds(p.parse_args(["--full"])) == (0, 1, 2, 3, 4)
  assert tiers.seeds(p.parse_args(["--seeds", "5"])) == (0, 1, 2, 3, 4)
  assert tiers.seeds(p.parse_args(["--quick"])) == (0,)
  with pytest.raises(ValueError, match="--quick runs one seed"):
    tiers.seeds(p.parse_args(["--quick", "--seeds", "3"]))
  with pytest.raises(SystemExit):
    p.parse_args(["--quick", "--full"])


def _record(a_values, b_values, *, kind="superior", margin=0.0, name="A"):
  claim = claims.Claim(
    paper=name,
    arxiv="2503.10622",
    claim=f"{name} beats its baseline",
    metric="val_loss",
    direction="lower",
    kind=kind,
    margin=margin,
    a=name.lower(),
    b="base",
  )
  rec = claims.record(
    claim,
    [0, 1, 2],
    a_values,
    b_values,
    baseline_trained=True,
    commit={"sha": "0" * 40, "dirty": False},
    config={},
  )
  rec["setting"] = {
    "a": {"params": 1000, "steps": 10, "examples": 320, "unit": "tokens",
          "learning_rate": 0.003, "data": "shakespeare"},
    "b": {"params": 1100, "steps": 10, "examples": 320, "unit": "tokens",
          "learning_rate": 0.001, "data": "shakespeare"},
  }  # fmt: skip
  return rec


def _write(tmp_path, name, records, command="python -m experiments.x"):
  args = argparse.Namespace(quick=False, full=False, seeds=None, elapsed=3.0)
  run = report.provenance(name, args)
  (tmp_path / f"{name}.json").write_text(
    json.dumps({"claims": records, "run": {**run, "command": command}})
  )


def test_results_are_made_from_the_records(tmp_path):
  # Three superiority claims, each reproduced alone (one-sided p 0 and
  # 0.037 twice); Holm over the three keeps the strong one (0 <= 0.05/3)
  # and demotes the weak ones (0.037 > 0.05/2).
  strong = _record([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], name="Strong")
  weak = _record([1.0, 2.0, 3.0], [1.05, 2.075, 3.025], name="Weak")
  other = _record([1.0, 2.0, 3.0], [1.05, 2.075, 3.025], name="Other")
  assert {r["verdict"] for r in (strong, weak, other)} == {"reproduced"}
  assert 0.025 < weak["p_value"] < 0.05
  _write(tmp_path, "one", [strong, other])
  _write(tmp_path, "two", [weak])
  (tmp_path / "old.json").write_text("{}")
  on_records, older = results.collect(tmp_path)
  assert [n for n, _ in on_records] == ["one", "two"] and older == ["old"]
  text = results.results_markdown(on_records, older)
  rows = [ln for ln in text.splitlines() if ln.startswith("| Strong")]
  assert "**reproduced**" in rows[0]
  weak_row = next(ln for ln in text.splitlines() if ln.startswith("| Weak"))
  assert "**inconclusive**" in weak_row
  # The setting states params (and that they differ by more than 2%),
  # steps, tokens and both learning rates.
  assert (
    "1,000 vs 1,100 params (-9.1%) (not matched); 10 steps; 320 tokens; "
    "lr 0.003 vs 0.001; shakespeare" in weak_row
  )
  assert "- [old](results/old.md)" in text
  assert "across the table's 3 superiority claims" in text
  table = results.headline(on_records)
  assert "| Weak (arXiv:2503.10622) | 1 | 1 inconclusive |" in table
  readme = f"intro\n{results.BEGIN}\nold table\n{results.END}\nrest\n"
  assert results.readme_with_headline(readme, table) == (
    f"intro\n{table}\nrest\n"
  )
  with pytest.raises(ValueError, match="no headline block"):
    results.readme_with_headline("no markers", table)


def test_a_record_that_does_not_follow_is_refused(tmp_path):
  rec = _record([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
  _write(tmp_path, "bad", [{**rec, "verdict": "contradicted"}])
  with pytest.raises(ValueError, match=r"bad.json: check_records"):
    results.collect(tmp_path)


def test_committed_results_follow_from_their_records():
  # Every committed record's verdict and numbers, RESULTS.md and the
  # README's headline table are what the records give.
  assert results.stale() == []


def test_tuned_grid_sweeps_a_loop_outside_the_runner(tmp_path):
  # train= replaces the runner: every field it returns goes into the line,
  # its variant name comes without @lr=, and the table resumes.
  calls = []

  def train_one(variant, cfg):
    calls.append((variant, cfg.learning_rate, cfg.seed))
    best = 1e-2 if variant == "a" else 1e-3
    loss = (math.log10(cfg.learning_rate) - math.log10(best)) ** 2
    return {"train_loss": loss, "psnr": 20.0 + cfg.seed}

  args = (
    tmp_path / "t.jsonl",
    BASE,
    {"a": {"norm": "batchnorm"}, "b": {"norm": "instancenorm"}},
    (0, 1),
    {"a": (1e-3, 3e-3), "b": (1e-3, 3e-3, 1e-2)},
  )
  lines, tuned = grid.tuned_grid(*args, train=train_one)
  sweeps = tuned["sweeps"]
  assert sweeps["a"]["learning_rate"] == pytest.approx(9e-3)
  assert sweeps["b"]["learning_rate"] == pytest.approx(1e-3)
  assert {v for v, _, _ in calls} == {"a", "b"}
  assert {ln["run"] for ln in lines} == {"a@lr=0.009", "b@lr=0.001"}
  assert sorted((ln["variant"], ln["seed"], ln["psnr"]) for ln in lines) == [
    ("a", 0, 20.0), ("a", 1, 21.0), ("b", 0, 20.0), ("b", 1, 21.0),
  ]  # fmt: skip
  n = len(calls)
  again, _ = grid.tuned_grid(*args, train=train_one)
  assert len(calls) == n and again == lines
  with pytest.raises(ValueError, match="model= or train=, not both"):
    grid.run_grid(
      args[0], BASE, {}, (0,), model=lambda *a: None, train=train_one
    )
