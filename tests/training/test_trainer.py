"""The experiment engine: training, resume, meshes, CLI failures."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxnorm.training import cli, metrics, trainer
from jaxnorm.training.config import TrainConfig, validate

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def standard_promotion():
  # optax's bias corrections mix int counts with floats, which strict
  # promotion (tests/conftest.py) rejects; the engine runs user-side code.
  with jax.numpy_dtype_promotion("standard"):
    yield


def tiny(tmp_path, **changes):
  base = TrainConfig(
    width=32,
    depth=1,
    num_heads=2,
    seq_len=32,
    batch_size=8,
    steps=20,
    eval_every=10,
    eval_batches=2,
    checkpoint_every=10,
    log_every=5,
    warmup_steps=2,
    out_dir=str(tmp_path / "run"),
    progress=False,
  )
  return dataclasses.replace(base, **changes)


def losses(run_dir):
  records = metrics.read_log(pathlib.Path(run_dir) / "metrics.jsonl")
  return {r["step"]: r["loss"] for r in records if "loss" in r}, {
    r["step"]: r["val_loss"] for r in records if "val_loss" in r
  }


def test_lm_run_writes_metrics_plot_and_summary(tmp_path):
  cfg = tiny(tmp_path, steps=30, learning_rate=1e-2)
  summary = trainer.train(cfg)
  out = pathlib.Path(cfg.out_dir)
  assert (out / "loss.png").stat().st_size > 10_000
  saved = json.loads((out / "summary.json").read_text())
  assert saved["steps"] == 30 and saved["params"] == summary["params"]
  train, val = losses(out)
  assert sorted(train) == [5, 10, 15, 20, 25, 30] and sorted(val) == [
    10,
    20,
    30,
  ]
  assert train[30] < train[5] - 0.5
  assert summary["val_loss"] < summary["baseline"] + 0.5
  table = metrics.summary_table([("tiny", summary)])
  assert "| tiny |" in table and "b/B" in table


@pytest.mark.parametrize(
  "model,data,norm,residual,activation",
  [
    ("vit", "digits", "layernorm", "prenorm", "gelu"),
    ("cnn", "digits", "batchnorm", "prenorm", "relu"),
    ("cnn", "digits", "groupnorm", "postnorm", "relu"),
    ("mlp", "digits", "rmsnorm", "prenorm", "selu"),
  ],
)
def test_image_models_learn(tmp_path, model, data, norm, residual, activation):
  cfg = tiny(
    tmp_path,
    model=model,
    data=data,
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
  )
  summary = trainer.train(cfg)
  assert summary["val_accuracy"] > 0.5, summary


def _cli(cfg, *extra):
  args = [sys.executable, "-m", "jaxnorm.training.cli"]
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    flag = "--" + field.name.replace("_", "-")
    if isinstance(value, bool):
      args.append(flag if value else "--no-" + flag[2:])
    elif isinstance(value, tuple):
      args += [flag, ",".join(map(str, value))]
    else:
      args += [flag, str(value)]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  return args + list(extra), env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_resume_after_signal_is_exact(tmp_path, sig):
  cfg = tiny(
    tmp_path,
    out_dir=str(tmp_path / "full"),
    steps=160,
    checkpoint_every=20,
    log_every=10,
    eval_every=80,
  )
  args, env = _cli(cfg)
  subprocess.run(args, env=env, check=True, capture_output=True, cwd=REPO)
  part = dataclasses.replace(cfg, out_dir=str(tmp_path / "part"))
  args, env = _cli(part)
  proc = subprocess.Popen(
    args,
    env=env,
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  ckpts = pathlib.Path(part.out_dir) / "checkpoints"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    done = (
      [p for p in ckpts.glob("*") if p.name.isdigit()]
      if (ckpts.exists())
      else []
    )
    if done:
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the run finished before it could be killed"
  proc.send_signal(sig)
  code = proc.wait()
  assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
  assert max(losses(part.out_dir)[0]) < 160
  subprocess.run(args, env=env, check=True, capture_output=True, cwd=REPO)
  assert losses(part.out_dir) == losses(cfg.out_dir)


def test_two_processes_equal_one(tmp_path):
  portpicker = pytest.importorskip("portpicker")
  cfg = tiny(
    tmp_path,
    out_dir=str(tmp_path / "single"),
    steps=6,
    eval_every=6,
    checkpoint_every=6,
    log_every=1,
    mesh=(4, 1, 1),
  )
  args, env = _cli(cfg)
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  subprocess.run(args, env=env, check=True, capture_output=True, cwd=REPO)
  multi = dataclasses.replace(cfg, out_dir=str(tmp_path / "multi"))
  args, env = _cli(multi)
  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  procs = [
    subprocess.Popen(
      args,
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      env=dict(
        env,
        JAX_COORDINATOR_ADDRESS=address,
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID=str(i),
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
      ),
    )
    for i in range(2)
  ]
  outputs = [p.communicate(timeout=600)[0].decode() for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outputs
  assert "| lm/rmsnorm/prenorm/adamw |" in outputs[0]
  assert "| lm/" not in outputs[1]
  train1, val1 = losses(cfg.out_dir)
  train2, val2 = losses(multi.out_dir)
  np.testing.assert_allclose(
    [train2[k] for k in sorted(train2)],
    [train1[k] for k in sorted(train1)],
    rtol=2e-5,
  )
  np.testing.assert_allclose(val2[6], val1[6], rtol=2e-5)
  other = metrics.read_log(
    pathlib.Path(multi.out_dir) / "metrics.process1.jsonl"
  )
  assert [r["loss"] for r in other if "loss" in r] == [
    train2[k] for k in sorted(train2)
  ]


def test_one_device_equals_eight(tmp_path):
  one = tiny(
    tmp_path,
    out_dir=str(tmp_path / "one"),
    steps=10,
    eval_every=10,
    checkpoint_every=10,
    log_every=1,
    num_heads=4,
    mesh=(1, 1, 1),
  )
  eight = dataclasses.replace(
    one, out_dir=str(tmp_path / "eight"), mesh=(4, 1, 2)
  )
  s1, s8 = trainer.train(one), trainer.train(eight)
  train1, val1 = losses(one.out_dir)
  train8, val8 = losses(eight.out_dir)
  np.testing.assert_allclose(
    [train8[k] for k in sorted(train8)],
    [train1[k] for k in sorted(train1)],
    rtol=2e-5,
  )
  np.testing.assert_allclose(val8[10], val1[10], rtol=2e-5)
  assert s1["params"] == s8["params"]


class TestFailFast:
  @pytest.mark.parametrize(
    "change,match",
    [
      (
        {"norm": "lnorm"},
        r"--norm 'lnorm' is not valid; choose one of "
        r".*layernorm.*rmsnorm",
      ),
      ({"attention": "flash"}, r"--attention 'flash' is not valid"),
      (
        {"residual": "densenet"},
        r"--residual 'densenet' is not valid; "
        r"choose one of .*mhc.*prenorm",
      ),
      ({"activation": "tanhh"}, r"--activation 'tanhh' is not valid"),
      (
        {"optimizer": "adam2"},
        r"--optimizer 'adam2' is not valid; choose "
        r"one of adamp, adamw",
      ),
      (
        {"model": "rnn"},
        r"--model 'rnn' is not valid; choose one of lm, "
        r"vit, cnn, mlp",
      ),
      (
        {"data": "digits"},
        r"--data 'digits' is not valid; choose one of "
        r"shakespeare, kjv",
      ),
      ({"positional": "alibi"}, r"--positional 'alibi' is not valid"),
      ({"dtype": "int8"}, r"--dtype 'int8' is not valid"),
      (
        {"width": 30, "num_heads": 4},
        r"--num-heads 4 must divide --width "
        r"30 .* valid head counts for this width: 1, 2, 3, 5, 6, 10, 15, 30",
      ),
      (
        {"mesh": (4, 4, 1)},
        r"--mesh 4,4,1 needs 16 devices but 8 are "
        r"available",
      ),
      ({"mesh": (1, 0, 1)}, r"--mesh must be three positive integers"),
      (
        {"mesh": (3, 1, 1)},
        r"--batch-size 8 must be divisible by "
        r"data\*fsdp = 3",
      ),
      (
        {"mesh": (1, 1, 8), "num_heads": 4},
        r"tensor mesh axis \(8\) must "
        r"divide --num-heads 4",
      ),
      ({"steps": 0}, r"--steps must be a positive integer, got 0"),
      ({"warmup_steps": -1}, r"--warmup-steps must be >= 0"),
    ],
  )
  def test_validate(self, tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
      cfg = tiny(tmp_path, **change)
      validate(cfg, trainer.registries(cfg.model))

  def test_cli_error_before_compilation(self, tmp_path, capsys):
    code = cli.train_main(["--norm", "lnorm", "--out-dir", str(tmp_path / "x")])
    assert code == 2
    assert "--norm 'lnorm' is not valid" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

  def test_sweep_errors(self, capsys):
    assert cli.sweep_main(["--vary", "nrom=a,b"]) == 2
    assert "--vary takes FIELD=V1,V2" in capsys.readouterr().err
    assert cli.sweep_main(["--vary", "norm=rmsnorm,lnorm"]) == 2
    assert "--norm 'lnorm' is not valid" in capsys.readouterr().err


def test_sweep_writes_table_and_plot(tmp_path, capsys):
  code = cli.sweep_main(
    [
      "--vary",
      "norm=rmsnorm,layernorm",
      "--width",
      "32",
      "--depth",
      "1",
      "--num-heads",
      "2",
      "--seq-len",
      "32",
      "--batch-size",
      "8",
      "--steps",
      "6",
      "--eval-every",
      "6",
      "--eval-batches",
      "1",
      "--log-every",
      "3",
      "--checkpoint-every",
      "6",
      "--no-progress",
      "--out-dir",
      str(tmp_path / "sweep"),
    ]
  )
  assert code == 0
  table = (tmp_path / "sweep" / "sweep.md").read_text()
  assert "| rmsnorm |" in table and "| layernorm |" in table
  assert (tmp_path / "sweep" / "sweep.png").exists()
  assert "| rmsnorm |" in capsys.readouterr().out
