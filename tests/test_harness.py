"""The experiments harness: tuned grids, settings, records, RESULTS.md.

The runner is replaced by a synthetic one whose training loss is a known
function of the learning rate, so the sweep's choice and extensions are
checked exactly; RESULTS.md is rendered from hand-made records. `runs`
(restoring a run's model, probe caches, "did the baseline train") is
checked on the same fake runner and, in the slow set, on a tiny real run.
"""

import argparse
import dataclasses
import json
import math

import jax
import numpy as np
import pytest
from flax import nnx

from experiments import _lm
from experiments._harness import grid, report, results, runs, tiers
from jaxnorm.training import build, claims, tasks
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


def test_second_look_lists_the_straddling_claims_below_five_seeds():
  # A gain of about 0.5 with a wide interval straddles margin 0.5; a clear
  # gain of 0.5 over margin 0 does not. Five seeds take a claim off the list.
  wide = _record([1.0, 2.0, 3.0], [1.2, 2.9, 3.4], margin=0.5, name="Wide")
  clear = _record([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], name="Clear")
  assert claims.straddles(wide) and not claims.straddles(clear)
  text = "\n".join(results.second_look_lines([("w", wide), ("c", clear)]))
  assert ": 1, in 1 of the scripts, listed below." in text
  assert "- [w](results/w.md): wide vs base (val_loss)" in text
  assert "[c]" not in text
  five = {**wide, "n": tiers.FULL_SEEDS}
  text = "\n".join(results.second_look_lines([("w", five), ("c", clear)]))
  assert text.startswith(
    f"No claim judged on fewer than {tiers.FULL_SEEDS} seeds"
  )
  assert "- [" not in text


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


# ---------------------------------------------------------------------------
# Arms at fixed rates, and `runs`.


def test_fixed_rate_grid_names_runs_by_rate_and_reuses_tuned_runs(
  tmp_path, fake_runner
):
  table = tmp_path / "t.jsonl"
  lines, _ = grid.tuned_grid(
    table, BASE, {"ln": {"norm": "layernorm"}}, (0, 1), {"ln": [3e-3, 1e-2]}
  )
  assert {ln["run"] for ln in lines} == {"ln@lr=0.01"}
  n = len(fake_runner)
  built = []

  def model(name, seed):
    built.append((name, seed))

  arms = {
    "ln": {"norm": "layernorm", "learning_rate": 1e-2},
    "rms": {"norm": "rmsnorm"},
  }
  fixed = grid.fixed_rate_grid(table, BASE, arms, (0, 1, 2), model=model)
  # ln at 1e-2 is the tuned grid's run: only its seed 2 trains; an arm
  # without a rate runs under its own name.
  assert len(fake_runner) == n + 4
  assert sorted(built) == [("ln", 2), ("rms", 0), ("rms", 1), ("rms", 2)]
  assert sorted((ln["variant"], ln["run"], ln["seed"]) for ln in fixed) == [
    ("ln", "ln@lr=0.01", s) for s in range(3)
  ] + [("rms", "rms", s) for s in range(3)]  # fmt: skip
  assert grid.fixed_rate_grid(table, BASE, arms, (1,)) == [
    ln for ln in fixed if ln["seed"] == 1
  ]


def _lines(values, metric="val_loss"):
  return [
    {"variant": v, "seed": s, metric: x}
    for v, xs in values.items()
    for s, x in enumerate(xs)
  ]


def test_untrained_needs_every_seed_past_the_bar():
  lines = _lines({"a": [2.0, 3.5], "b": [2.0, 2.9], "c": [2.0, None]})
  assert runs.untrained(lines, "b", 3.0) is None
  why = runs.untrained(lines, "a", 3.0, what="the unigram entropy")
  assert why == (
    "a did not train: val_loss 2.000, 3.500 not below the unigram entropy "
    "(3.000) in every seed"
  )
  assert "missing" in runs.untrained(lines, "c", 3.0)
  assert runs.untrained(_lines({"d": [math.nan]}), "d", 3.0) is not None
  assert runs.untrained(lines, "e", 3.0) == "e did not train: it has no line"
  acc = _lines({"a": [0.5, 0.15]}, "val_accuracy")
  assert runs.untrained(acc, "a", 0.1, metric="val_accuracy", higher=True) is (
    None
  )
  why = runs.untrained(acc, "a", 0.2, metric="val_accuracy", higher=True)
  assert "val_accuracy 0.500, 0.150 not above chance (0.200)" in why


def test_untrained_can_also_need_accuracy_above_chance():
  chance = math.log(10)
  good = {"variant": "a", "seed": 0, "val_loss": 1.0, "val_accuracy": 0.6}
  bad = {"variant": "a", "seed": 1, "val_loss": 2.0, "val_accuracy": 0.09}
  assert runs.untrained([good], "a", chance, accuracy=0.1) is None
  # Its loss beats chance; its accuracy does not.
  assert runs.untrained([good, bad], "a", chance) is None
  why = runs.untrained([good, bad], "a", chance, accuracy=0.1)
  assert why == (
    "a did not train: val_accuracy 0.600, 0.090 not above chance (0.100) "
    "in every seed"
  )


def test_runner_records_judge_each_claims_baseline(tmp_path, fake_runner):
  variants = {"ln": {"norm": "layernorm"}, "rms": {"norm": "rmsnorm"}}
  lines = grid.run_grid(tmp_path / "t.jsonl", BASE, variants, (0, 1, 2))
  claim = claims.Claim(
    paper="RMSNorm",
    arxiv="1910.07467",
    claim="RMSNorm is better than LayerNorm",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=0.0,
    a="rms",
    b="ln",
  )
  bar = max(ln["val_loss"] for ln in lines if ln["variant"] == "ln")
  (ok,) = runs.runner_records(lines, [claim], BASE, variants, bar + 0.01)
  (bad,) = runs.runner_records(lines, [claim], BASE, variants, bar, what="x")
  claims.check_records([ok, bad])
  assert ok["baseline_trained"] and ok["setting"]["b"]["params"] == 1000
  assert not bad["baseline_trained"] and bad["verdict"] != "reproduced"
  assert "ln did not train: val_loss" in bad["why"] and "below x" in bad["why"]


def test_chance_loss_is_the_runners_trivial_predictor():
  text = dataclasses.replace(BASE, eval_batches=1)
  assert runs.chance_loss(text) == pytest.approx(
    tasks.make_task(text).baseline, rel=1e-12
  )
  assert 2.0 < runs.chance_loss(text) < math.log(256)
  images = dataclasses.replace(BASE, model="cnn", data="digits")
  assert runs.chance_loss(images) == pytest.approx(math.log(10))
  assert runs.chance_loss(images) == pytest.approx(
    tasks.make_task(images).baseline
  )
  graphs = dataclasses.replace(BASE, model="graph", data="cluster")
  assert runs.chance_loss(graphs) == pytest.approx(math.log(6))


def test_probed_measures_each_run_once(tmp_path):
  path = tmp_path / "cache" / "probes.jsonl"
  lines = [
    {"variant": "a", "run": "a@lr=0.01", "seed": 0, "val_loss": 1.0},
    {"variant": "a", "run": "a@lr=0.01", "seed": 1, "val_loss": 1.1},
    {"variant": "b", "seed": 0, "val_loss": 2.0},
  ]
  calls = []

  def probe(ln):
    calls.append((grid.run_name(ln), ln["seed"]))
    return {"rms": [1.0, 2.0 + ln["seed"]]}

  out = runs.probed(lines, path, probe)
  assert calls == [("a@lr=0.01", 0), ("a@lr=0.01", 1), ("b", 0)]
  assert [ln["rms"] for ln in out] == [[1.0, 2.0], [1.0, 3.0], [1.0, 2.0]]
  assert all(ln.items() <= o.items() for ln, o in zip(lines, out))
  # A rerun reads the cache; only a new run is probed.
  new = {"variant": "b", "seed": 1, "val_loss": 2.1}
  again = runs.probed([*lines, new], path, probe)
  assert calls[3:] == [("b", 1)] and again[:3] == out
  assert len(grid.read_table(path)) == 4


def test_trained_resumes_a_finished_run_without_training(tmp_path, fake_runner):
  table = tmp_path / "t.jsonl"
  seen = []

  def make():
    seen.append("built")
    return "module"

  # No checkpoint yet: refused before the runner is called.
  with pytest.raises(ValueError, match=r"checkpoint at step None of 10"):
    runs.trained(table, BASE, {"norm": "rmsnorm"}, "rms", 0, model=make)
  assert fake_runner == [] and seen == []
  out_dir = grid.run_dir(tmp_path, "rms@lr=0.01", 1)
  (out_dir / "checkpoints" / "5").mkdir(parents=True)
  variants = {"rms": {"norm": "rmsnorm", "learning_rate": 1e-2}}
  line = {"variant": "rms", "run": "rms@lr=0.01", "seed": 1}
  with pytest.raises(ValueError, match=r"step 5 of 10; rerun the grid"):
    runs.trained_line(table, BASE, variants, line)
  (out_dir / "checkpoints" / "10").mkdir()
  factory = []

  def grid_model(variant, seed):
    factory.append((variant, seed))
    return "module"

  got = runs.trained_line(table, BASE, variants, line, model=grid_model)
  assert got == "module" and factory == [("rms", 1)]
  assert fake_runner == [(str(out_dir), 1e-2, 1)]


@pytest.mark.slow  # Trains a tiny LM through the runner.
def test_trained_restores_the_run_the_runner_trained(tmp_path):
  base = dataclasses.replace(
    BASE,
    steps=4,
    eval_every=4,
    log_every=4,
    eval_batches=2,
    warmup_steps=1,
    checkpoint_every=10**9,
  )
  table = tmp_path / "t.jsonl"
  variants = {"ln": {"norm": "layernorm"}}
  (line,) = grid.run_grid(table, base, variants, (3,))
  log = grid.run_dir(tmp_path, "ln", 3) / "metrics.jsonl"
  before = log.read_text()
  model = runs.trained_line(table, base, variants, line)
  # The runner's own evaluation of the restored model: its val_loss.
  loss, _ = _lm.evaluate(model, _lm.val_batches(base))
  np.testing.assert_allclose(loss, line["val_loss"], rtol=1e-5)
  cfg = dataclasses.replace(base, seed=3, **variants["ln"])
  fresh = build.build_model(
    cfg, tasks.make_task(cfg).model_kwargs, rngs=nnx.Rngs(3)
  )
  leaves = [jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (model, fresh)]
  assert any(not np.allclose(a, b) for a, b in zip(*leaves, strict=True))
  # A config that asks for more steps is refused: nothing trains.
  with pytest.raises(ValueError, match="step 4 of 8"):
    runs.trained_line(table, dataclasses.replace(base, steps=8), variants, line)
  assert log.read_text() == before


def test_trained_runs_read_every_table_under_runs(tmp_path, fake_runner):
  table = tmp_path / "t.jsonl"
  lines = grid.run_grid(table, BASE, {"ln": {}}, range(5))
  assert {ln["commit"]["sha"] for ln in lines} == {claims.commit()["sha"]}
  # Seed s took 10 (s + 1) seconds; the default tier trains seeds 0-2.
  assert tiers.DEFAULT_SEEDS == 3
  timed = [
    {**json.loads(text), "seconds": 10.0 * (json.loads(text)["seed"] + 1)}
    for text in table.read_text().splitlines()
  ]
  table.write_text("".join(json.dumps(ln) + "\n" for ln in timed))
  # A table from before lines recorded their time and commit, one level
  # down, and a run's own log inside a run directory (not a table).
  old = {"variant": "old", "seed": 0, "changes": {}, "val_loss": 1.0}
  (tmp_path / "parents").mkdir()
  (tmp_path / "parents" / "p.jsonl").write_text(json.dumps(old) + "\n")
  log = grid.run_dir(tmp_path, "ln", 0) / "metrics.jsonl"
  log.parent.mkdir(parents=True, exist_ok=True)
  log.write_text(json.dumps({**old, "step": 1}) + "\n")
  trained = report.trained_runs(tmp_path)
  assert trained == {
    "runs": 6,
    "seconds": 150.0,
    "default_seconds": 60.0,
    "untimed": 1,
    "commits": sorted({claims.commit()["sha"], "unrecorded"}),
  }
  assert report.trained_text(trained).startswith(
    "6 runs, 2 min of training (1 of them the default tier's), 1 untimed, "
  )


def test_a_table_line_of_another_config_is_refused(tmp_path, fake_runner):
  table = tmp_path / "t.jsonl"
  (line,) = grid.run_grid(table, BASE, {"ln": {}}, (0,))
  assert "config" not in line and "config" in json.loads(table.read_text())
  assert grid.run_grid(table, BASE, {"ln": {}}, (0,)) == [line]
  longer = dataclasses.replace(BASE, steps=BASE.steps + 1)
  with pytest.raises(ValueError, match="seed 0 trained with another config"):
    grid.run_grid(table, longer, {"ln": {}}, (0,))
  with pytest.raises(ValueError, match="--width 16 -> 32"):
    grid.run_grid(table, BASE, {"ln": {"width": 32}}, (0,))


def test_each_tier_has_its_own_runs_folder():
  p = tiers.parser("Doc.", "x")
  assert p.parse_args([]).runs == "runs/claims/x"
  assert p.parse_args(["--quick"]).runs == "runs/claims/x-quick"
  assert p.parse_args(["--full"]).runs == "runs/claims/x-full"
  assert p.parse_args(["--quick", "--runs", "r"]).runs == "r"


@pytest.mark.parametrize("steps", [1, grid.EXTEND - 1, grid.EXTEND])
@pytest.mark.parametrize("higher", [False, True])
def test_sweep_extends_at_most_extend_steps(steps, higher):
  # The score's best lies `steps` x3 steps above the grid's top (or below
  # its bottom). Up to EXTEND - 1 steps the sweep finds it with a worse
  # rate beyond it ("inside"); at EXTEND it stops on it, at the grid's end.
  rates = (1e-3, 3e-3, 9e-3)
  for best in (9e-3 * 3.0**steps, 1e-3 / 3.0**steps):
    scored = []

    def score(lr, best=best, scored=scored):
      scored.append(lr)
      loss = (math.log(lr) - math.log(best)) ** 2
      return -loss if higher else loss

    out = grid.sweep(score, rates, higher=higher)
    assert out["learning_rate"] == pytest.approx(best)
    assert out["inside"] is (steps < grid.EXTEND)
    assert len(scored) == len(rates) + min(steps + 1, grid.EXTEND)


def test_host_cpu_names_model_vector_extensions_and_cache():
  info = (
    "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu sse4_2 avx "
    "avx2 fma avx512f\ncache size\t: 4096 KB\n\nprocessor\t: 1\n"
    "model name\t: Other\nflags\t\t: fpu\n"
  )
  assert report.host_cpu(info) == (
    "Some Xeon; sse4_2 avx avx2 fma avx512f; cache 4096 KB"
  )
  assert report.host_cpu("model name : Old\nflags : fpu sse2\n") == (
    "Old; no SSE4.2 or AVX"
  )
  run = {"machine": "x86_64", "cpus": 2, "cpu": "Some Xeon; avx2"}
  assert report.machine_text(run) == "x86_64 (Some Xeon; avx2) with 2 CPUs"
  assert report.machine_text({"machine": "x86_64", "cpus": 2}) == (
    "x86_64 with 2 CPUs"
  )


def test_limits_list_the_records_over_the_default_target(tmp_path):
  rec = _record([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
  limit = tiers.DEFAULT_MINUTES * 60
  for name in ("fast", "slow", "second_look"):
    _write(tmp_path, name, [rec])
  # "slow": a command over the target, without its runs' times.
  slow = json.loads((tmp_path / "slow.json").read_text())
  slow["run"] |= {"seconds": limit + 60.0, "load_average": 3.5}
  slow["run"].pop("cpu")
  (tmp_path / "slow.json").write_text(json.dumps(slow))
  # "second_look": a --seeds 5 command over the target whose default
  # tier's runs were within it (it is judged on those), and "fast" the
  # other way round.
  look = json.loads((tmp_path / "second_look.json").read_text())
  look["run"] |= {
    "seconds": limit + 600.0,
    "trained": {"seconds": limit + 590.0, "default_seconds": limit - 60.0},
  }
  (tmp_path / "second_look.json").write_text(json.dumps(look))
  fast = json.loads((tmp_path / "fast.json").read_text())
  fast["run"] |= {"trained": {"seconds": 1.0, "default_seconds": limit + 1}}
  (tmp_path / "fast.json").write_text(json.dumps(fast))
  on_records, _ = results.collect(tmp_path)
  (line,) = results.over_budget_lines(on_records)
  assert "2 of the 3 records took longer" in line
  assert "[slow](results/slow.md) 21 min (the command; 3 seeds, load 3.5)" in (
    line
  )
  assert "[fast](results/fast.md) 20 min (its runs; 3 seeds" in line
  assert "[second_look]" not in line
  (line,) = results.over_budget_lines(
    [r for r in on_records if r[0] == "second_look"]
  )
  assert line.endswith("Every record's default tier finished within it.")
  (line,) = results.reproducibility_lines(on_records)
  assert line.endswith(
    "2 of the 3 records name the CPU they ran on (`report.host_cpu`; "
    "records made before it existed do not)."
  )
