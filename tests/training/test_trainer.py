"""The experiment engine: training, meshes, processes, CLI failures."""

import dataclasses
import json
import logging
import math
import pathlib
import subprocess

import jax
import numpy as np
import pytest
from flax import nnx

from jaxnorm.training import (
  build,
  cli,
  config,
  data,
  flags,
  metrics,
  optimizers,
  trainer,
)
from tests.training import runs


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  cfg = runs.tiny(tmp_path_factory.mktemp("lm") / "run", log_every=1)
  return cfg, trainer.train(cfg)


def test_lm_run_writes_metrics_plot_and_summary(lm_run):
  cfg, summary = lm_run
  out = pathlib.Path(cfg.out_dir)
  assert (out / "loss.png").stat().st_size > 10_000
  saved = json.loads((out / "summary.json").read_text())
  assert saved["steps"] == 8 and saved["params"] == summary["params"]
  train, val = runs.losses(out)
  assert sorted(train) == list(range(1, 9)) and sorted(val) == [4, 8]
  assert train[8] < train[1] - 0.2
  assert summary["stop_reason"] is None and not summary["stopped_early"]


def test_logged_learning_rate_is_the_schedule(lm_run):
  cfg, _ = lm_run
  schedule = optimizers.make_schedule(
    cfg.schedule, cfg.learning_rate, cfg.warmup_steps, cfg.steps
  )
  recs = [r for r in runs.records(cfg.out_dir) if "lr" in r]
  np.testing.assert_allclose(
    [r["lr"] for r in recs],
    [float(schedule(r["step"] - 1)) for r in recs],
    rtol=1e-6,
  )


def test_tokens_per_sec_excludes_the_compiling_step(lm_run):
  cfg, summary = lm_run
  train = [r for r in runs.records(cfg.out_dir) if "loss" in r]
  assert train[0]["tokens_per_sec"] is None  # Step 1 compiles: not timed.
  assert all(r["tokens_per_sec"] > 0 for r in train[1:])
  speeds = sorted(r["tokens_per_sec"] for r in train[1:])
  assert summary["tokens_per_sec"] == speeds[len(speeds) // 2]


def test_summary_states_units(lm_run):
  _, summary = lm_run
  table = metrics.summary_table([("tiny", summary)])
  head = table.splitlines()[0]
  assert "val loss (nats)" in head and "baseline loss (nats)" in head
  assert "val bits/byte (baseline)" in head
  row = table.splitlines()[2]
  bits = summary["val_bits_per_byte"]
  base_bits = summary["baseline"] / math.log(2)
  assert (
    f"| {summary['val_loss']:.3f} | {summary['baseline']:.3f} (unigram)"
    in (row)
  )
  assert f"{bits:.3f} ({base_bits:.3f} unigram)" in row
  assert summary["baseline_bits_per_byte"] == pytest.approx(base_bits)


def test_a_given_model_trains_as_the_built_one_with_one_compile(
  tmp_path, lm_run, caplog
):
  # Built outside the mesh, its state is placed as the rules say before
  # the first step, so the step compiles once (an unplaced first input
  # used to compile it twice) and trains exactly as the runner's model.
  cfg, _ = lm_run
  given = build.build_model(
    cfg, {"vocab_size": 256, "max_len": cfg.seq_len}, rngs=nnx.Rngs(cfg.seed)
  )
  run = dataclasses.replace(cfg, out_dir=str(tmp_path / "given"))
  with jax.log_compiles(True), caplog.at_level(logging.WARNING, "jax"):
    trainer.train(run, model=given)
  compiles = [
    r for r in caplog.records if "train_step" in r.getMessage()
    and "Finished XLA compilation" in r.getMessage()
  ]  # fmt: skip
  assert len(compiles) == 1, [r.getMessage() for r in compiles]
  assert runs.logged(run.out_dir) == runs.logged(cfg.out_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
  "model,data_name,norm,residual,activation",
  [
    ("vit", "digits", "layernorm", "prenorm", "gelu"),
    ("cnn", "digits", "batchnorm", "prenorm", "relu"),
    ("cnn", "digits", "groupnorm", "postnorm", "relu"),
    ("mlp", "digits", "rmsnorm", "prenorm", "selu"),
  ],
)
def test_image_models_learn(
  tmp_path, model, data_name, norm, residual, activation
):
  cfg = runs.tiny(
    tmp_path / "run",
    model=model,
    data=data_name,
    norm=norm,
    residual=residual,
    activation=activation,
    width=32,
    depth=2,
    batch_size=32,
    steps=80,
    eval_every=80,
    checkpoint_every=80,
    log_every=10,
    learning_rate=3e-3,
  )
  summary = trainer.train(cfg)
  assert summary["val_accuracy"] > 0.5, summary


def _assert_same_losses(run, reference):
  train1, val1 = runs.losses(reference)
  train2, val2 = runs.losses(run)
  assert sorted(train2) == sorted(train1) and sorted(val2) == sorted(val1)
  np.testing.assert_allclose(
    [train2[k] for k in sorted(train2)],
    [train1[k] for k in sorted(train1)],
    rtol=2e-5,
  )
  np.testing.assert_allclose(
    [val2[k] for k in sorted(val2)], [val1[k] for k in sorted(val1)], rtol=2e-5
  )


@pytest.mark.slow
def test_one_device_equals_eight(tmp_path, lm_run):
  one, s1 = lm_run
  eight = dataclasses.replace(one, out_dir=str(tmp_path / "8"), mesh=(4, 1, 2))
  s8 = trainer.train(eight)
  _assert_same_losses(eight.out_dir, one.out_dir)
  assert s1["params"] == s8["params"]


@pytest.mark.slow
def test_preemption_stops_every_process_at_one_step(
  tmp_path, lm_run, compilation_cache_dir
):
  # Process 1 alone gets SIGTERM after step 3; JAX's preemption sync point
  # stops both processes at the same step with one collective checkpoint.
  # The resumed two-process run then equals the one-process run.
  single, _ = lm_run
  multi = dataclasses.replace(
    single, out_dir=str(tmp_path / "multi"), mesh=(4, 1, 1), process_logs=True
  )
  outputs = runs.launch(multi, 2, compilation_cache_dir, fault="sigterm@3:1")
  out = pathlib.Path(multi.out_dir)
  steps = [
    max(r["step"] for r in metrics.read_log(out / name))
    for name in ("metrics.jsonl", "metrics.process1.jsonl")
  ]
  assert steps[0] == steps[1] and 3 <= steps[0] < 8, outputs
  assert f"stopped at step {steps[0]} (preemption notice)" in outputs[0]
  assert str(steps[0]) in [p.name for p in (out / "checkpoints").iterdir()]
  outputs = runs.launch(multi, 2, compilation_cache_dir)
  assert "| lm/rmsnorm/prenorm/adamw |" in outputs[0]
  assert "| lm/" not in outputs[1]
  _assert_same_losses(out, single.out_dir)


class TestFailFast:
  @pytest.mark.parametrize(
    "change,match",
    [
      (
        {"norm": "lnorm"},
        r"--norm 'lnorm' is not valid; choose one of .*layernorm.*rmsnorm",
      ),
      ({"attention": "flash"}, r"--attention 'flash' is not valid"),
      (
        {"residual": "densenet"},
        r"--residual 'densenet' is not valid; choose one of .*mhc.*prenorm",
      ),
      ({"activation": "tanhh"}, r"--activation 'tanhh' is not valid"),
      (
        {"optimizer": "adam2"},
        r"--optimizer 'adam2' is not valid; choose one of adamp, adamw",
      ),
      (
        {"model": "rnn"},
        r"--model 'rnn' is not valid; choose one of lm, vit, cnn, mlp",
      ),
      (
        {"data": "digits"},
        r"--data 'digits' is not valid; choose one of shakespeare, kjv",
      ),
      ({"positional": "alibi"}, r"--positional 'alibi' is not valid"),
      ({"dtype": "int8"}, r"--dtype 'int8' is not valid"),
      ({"param_dtype": "int8"}, r"--param-dtype 'int8' is not valid"),
      ({"schedule": "linear"}, r"--schedule 'linear' is not valid; .*wsd"),
      ({"nonfinite": "ignore"}, r"--nonfinite 'ignore' is not valid"),
      (
        {"width": 30, "num_heads": 4},
        r"--num-heads 4 must divide --width "
        r"30 .* valid head counts for this width: 1, 2, 3, 5, 6, 10, 15, 30",
      ),
      (
        {"mesh": (4, 4, 1)},
        r"--mesh 4,4,1 needs 16 devices but 8 are available",
      ),
      ({"mesh": (1, 0, 1)}, r"--mesh must be three positive integers"),
      (
        {"mesh": (3, 1, 1)},
        r"--batch-size 8 must be divisible by data\*fsdp = 3",
      ),
      (
        {"mesh": (1, 1, 8), "num_heads": 4, "width": 32},
        r"tensor mesh axis \(8\) must divide --num-heads 4",
      ),
      (
        {"mesh": (1, 1, 8), "model": "mlp", "data": "digits", "width": 12},
        r"tensor mesh axis \(8\) must divide --width 12",
      ),
      ({"steps": 0}, r"--steps must be a positive integer, got 0"),
      ({"grad_accum": 0}, r"--grad-accum must be a positive integer"),
      ({"grad_accum": 3}, r"--steps 8 must be a multiple of --grad-accum 3"),
      ({"warmup_steps": -1}, r"--warmup-steps must be >= 0"),
      ({"learning_rate": math.nan}, r"--learning-rate must be a finite"),
      ({"learning_rate": math.inf}, r"--learning-rate must be a finite"),
      ({"learning_rate": -1e-3}, r"--learning-rate must be a finite"),
      ({"learning_rate": 0.0}, r"--learning-rate must be > 0"),
      ({"weight_decay": -0.1}, r"--weight-decay must be a finite number"),
      ({"clip_norm": math.nan}, r"--clip-norm must be a finite number"),
      ({"b1": 1.0}, r"--b1 must be a finite number in \[0, 1\)"),
      ({"b2": -0.5}, r"--b2 must be a finite number in \[0, 1\)"),
      ({"ema_decay": 1.5}, r"--ema-decay must be a finite number"),
      ({"allow_change": ("stepz",)}, r"--allow-change names unknown fields"),
      (
        {"allow_change": ("width", "steps")},
        r"--allow-change width: these fields shape the saved state",
      ),
      ({"profile_steps": (3, 2)}, r"--profile-steps takes FIRST,LAST"),
      ({"profile_steps": (1, 9)}, r"--profile-steps takes FIRST,LAST"),
      (
        {"norm_kwargs": (("1x", 2),)},
        r"--norm-kwargs keys must be argument names",
      ),
    ],
  )
  def test_validate(self, tmp_path, change, match):
    cfg = runs.tiny(tmp_path, **change)
    with pytest.raises(ValueError, match=match):
      config.validate(cfg, build.registries_for(cfg))

  def test_mesh_error_suggests_only_valid_meshes(self, tmp_path):
    cfg = runs.tiny(tmp_path, mesh=(1, 1, 8), num_heads=2, batch_size=4)
    with pytest.raises(ValueError, match="valid meshes") as err:
      config.validate(cfg, build.registries_for(cfg))
    listed = str(err.value).split("for this model: ")[1].split(", ")
    assert listed and "1,1,8" not in listed
    for mesh in listed:  # Every suggestion passes the same checks.
      good = dataclasses.replace(cfg, mesh=tuple(map(int, mesh.split(","))))
      config.validate(good, build.registries_for(good))

  def test_tensorboard_needs_its_package(self, tmp_path, monkeypatch):
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda n: None)
    with pytest.raises(ValueError, match="pip install tensorboardX"):
      config.validate(
        runs.tiny(tmp_path, tensorboard=True), build.registries("lm")
      )

  def test_cli_error_before_compilation(self, tmp_path, capsys):
    code = cli.train_main(["--norm", "lnorm", "--out-dir", str(tmp_path / "x")])
    assert code == 2
    assert "--norm 'lnorm' is not valid" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

  def test_cli_rejects_bad_numbers(self, capsys):
    with pytest.raises(SystemExit):
      cli.train_main(["--mesh", "2,x"])
    assert "--mesh takes comma-separated integers" in capsys.readouterr().err
    assert cli.train_main(["--learning-rate", "nan"]) == 2
    assert "--learning-rate must be a finite" in capsys.readouterr().err

  def test_missing_fashion_mnist_is_one_line(
    self, tmp_path, monkeypatch, capsys
  ):
    def no_package(*args, **kwargs):
      raise subprocess.CalledProcessError(1, args[0])

    monkeypatch.setattr(data.subprocess, "run", no_package)
    code = cli.train_main(
      [
        "--model",
        "cnn",
        "--data",
        "fashion_mnist",
        "--norm",
        "batchnorm",
        "--out-dir",
        str(tmp_path / "fm"),
      ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "apt-get install -y dataset-fashion-mnist" in err

  def test_sweep_errors(self, capsys):
    assert cli.sweep_main(["--vary", "nrom=a,b"]) == 2
    assert "--vary takes FIELD=V1,V2" in capsys.readouterr().err
    assert cli.sweep_main(["--vary", "norm=rmsnorm,lnorm"]) == 2
    assert "--norm 'lnorm' is not valid" in capsys.readouterr().err


class TestCommandLine:
  def test_help_lists_valid_names(self, capsys):
    with pytest.raises(SystemExit):
      cli.train_main(["--help"])
    out = capsys.readouterr().out
    for name in ("seednorm", "mhc", "conda", "swiglu", "wsd", "shakespeare"):
      assert name in out
    assert "model (config file [model])" in out

  def test_list_prints_every_registry(self, capsys):
    assert cli.train_main(["--list"]) == 0
    out = capsys.readouterr().out
    for model in config.MODELS:
      assert f"\n{model} (data:" in f"\n{out}"
      for field, names in build.registries(model).items():
        assert f"  {field}: {', '.join(names)}" in out

  def test_config_file_then_flags(self, tmp_path, monkeypatch):
    path = tmp_path / "run.toml"
    path.write_text(
      '[model]\nnorm = "layernorm"\nwidth = 64\nnorm-kwargs = {eps = 1e-5}\n'
      "[optim]\nlearning_rate = 1\nb2 = 0.99\n[run]\nmesh = [2, 1, 1]\n"
      "steps = 40\n"
    )
    seen = {}

    def capture(cfg):
      seen["c"] = cfg
      raise ValueError("captured")

    monkeypatch.setattr(trainer, "train", capture)
    assert cli.train_main(["--config", str(path), "--width", "32"]) == 2
    cfg = seen["c"]
    assert (cfg.norm, cfg.width, cfg.steps, cfg.mesh) == (
      "layernorm",
      32,
      40,
      (2, 1, 1),
    )
    assert cfg.norm_kwargs == (("eps", 1e-5),) and cfg.b2 == 0.99
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)

  def test_config_file_errors(self, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"stepz": 3}}')
    with pytest.raises(ValueError, match=r"\[model\] has no field 'stepz'"):
      flags.load_file(bad)
    bad.write_text('{"colour": 3}')
    with pytest.raises(ValueError, match="unknown key 'colour'"):
      flags.load_file(bad)
    bad.write_text("{")
    with pytest.raises(ValueError, match="cannot read it"):
      flags.load_file(bad)
    with pytest.raises(ValueError, match="takes a JSON object"):
      flags.parse_value("norm_kwargs", "[1")
    with pytest.raises(ValueError, match="unknown field 'nrom'"):
      flags.parse_value("nrom", "x")
    with pytest.raises(ValueError, match="use true or false"):
      flags.parse_value("resume", "yes")
    with pytest.raises(ValueError, match="--width takes int"):
      flags.parse_value("width", "wide")

  def test_every_field_has_help(self):
    assert set(flags.field_docs()) == set(config.FIELDS)
    grouped = [f for fields in config.GROUPS.values() for f in fields]
    assert sorted(grouped) == sorted(config.FIELDS)


@pytest.mark.slow
def test_sweep_writes_table_and_plot(tmp_path, capsys):
  code = cli.sweep_main(
    [
      "--vary",
      "norm=rmsnorm,layernorm",
      *runs.cli_args(runs.tiny(tmp_path / "sweep", steps=4))[3:],
    ]
  )
  assert code == 0
  table = (tmp_path / "sweep" / "sweep.md").read_text()
  assert "| rmsnorm |" in table and "| layernorm |" in table
  assert (tmp_path / "sweep" / "sweep.png").exists()
  assert "| rmsnorm |" in capsys.readouterr().out
