"""``jaxnorm-train --compile-only``: training steps planned for chips not here.

The argument checks, the mesh rule and the table run everywhere, without the
compilers. The plans themselves compile the exact training step for
deviceless TPUs and GPUs with the aot extra (marker ``aot``); on 2 CPU cores
the 1B plan compiles in about 150 s for v5e:4x4 and 70 s for h100:8, the
refused 206B model stops out of memory after about 90 s, and each tiny
registry model takes about 10 s.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from jaxnorm import aot
from jaxnorm.training import build, cli, config, plan

_MIB = 1 << 20


def _plan(**changes) -> plan.Plan:
  """A v5e:4x4 plan of the 1B LM with made-up compiler numbers."""
  base = plan.Plan(
    topology="v5e:4x4",
    chip=aot.CHIPS["v5e"],
    mesh=(1, 16, 1),
    hosts=4,
    model="lm",
    num_params=810_092_544,
    param_dtype="bfloat16",
    batch_size=16,
    tokens=16 * 2048,
    params_bytes=101 * _MIB,
    opt_bytes=202 * _MIB,
    other_bytes=1,
    temp_bytes=3000 * _MIB,
    code_bytes=270 * _MIB,
    unaliased_out_bytes=5000,
    flops=8.8e12,
    bytes_accessed=6.7e10,
    compile_seconds=150.0,
  )
  return dataclasses.replace(base, **changes)


def _train(capsys, *argv: str) -> tuple[int, str, str]:
  code = cli.train_main(list(argv))
  out, err = capsys.readouterr()
  return code, out, err


# --------------------------------------------------------------------------
# Without the compilers.


def test_topology_without_compile_only_is_an_error(capsys):
  code, _, err = _train(capsys, "--topology", "v5e:2x2")
  assert code == 2
  assert "--topology v5e:2x2 is only read with --compile-only" in err


def test_compile_only_needs_a_topology(capsys):
  code, _, err = _train(capsys, "--compile-only")
  assert code == 2
  assert "--compile-only needs --topology NAME" in err


def test_unknown_topology_lists_the_valid_forms(capsys):
  code, _, err = _train(capsys, "--compile-only", "--topology", "b200:8")
  assert code == 2
  assert "unknown topology 'b200:8'" in err and "'v5e:2x2'" in err


def test_missing_extra_exits_2_with_the_install_command(monkeypatch, capsys):
  monkeypatch.setattr(aot, "available", lambda platform: False)
  code, _, err = _train(capsys, "--compile-only", "--topology", "v5e:2x2")
  assert code == 2
  assert aot.INSTALL in err and "aot extra" in err


def test_mesh_counts_the_topologys_devices():
  registries = build.registries("lm")
  cfg = config.TrainConfig(mesh=(1, 8, 1), batch_size=16, width=256)
  with pytest.raises(ValueError) as e:
    config.validate(cfg, registries, topology="v5e:4x4")
  msg = str(e.value)
  assert "\n" not in msg
  assert "--mesh 1,8,1 uses 8 devices but --topology v5e:4x4 has 16" in msg
  assert "valid meshes over all 16 devices of v5e:4x4" in msg
  assert "1,16,1" in msg
  # 16 devices: more than this process has (8 fake CPUs), right for v5e:4x4.
  good = dataclasses.replace(cfg, mesh=(1, 16, 1))
  config.validate(good, registries, topology="v5e:4x4")
  with pytest.raises(ValueError, match="needs 16 devices but 8 are"):
    config.validate(good, registries)


def test_only_token_models_are_planned():
  cfg = config.TrainConfig(model="vit", data="digits", mesh=(1, 4, 1))
  with pytest.raises(ValueError, match="plans the models lm, clm"):
    plan.compile_plan(cfg, "v5e:2x2")


def test_table_reports_memory_flops_speed_and_rows_per_host():
  p = _plan()
  text = plan.format_plan(p)
  for words in (
    "memory per device",
    "parameters",
    "optimizer state",
    "temporaries (activations, grads; --remat none)",
    "generated code",
    "GiB",
    "MiB",
    "of 16.00 GiB: fits",
    "flops (XLA, all devices)",
    "model flops (6 x params x tokens)",
    "step time at peak",
    "step time at 40% MFU",
    "tokens/s at 40% MFU",
  ):
    assert words in text, words
  assert "rows each host loads" in text and "4 hosts of 4 chips" in text
  # 6 * 810M params * 32768 tokens over 16 chips at 40% of 197 Tflop/s.
  assert "126.3 ms" in text
  assert plan.verdict(p) is None and p.fits


def test_gpu_table_says_why_flops_are_missing():
  p = _plan(
    topology="h100:8",
    chip=aot.CHIPS["h100"],
    mesh=(1, 8, 1),
    hosts=1,
    flops=None,
    bytes_accessed=None,
  )
  text = plan.format_plan(p)
  assert plan.NO_GPU_COST in text
  assert "model flops, 989 Tflop/s per chip" in text
  assert "one host" in text


def test_refusal_is_one_line_naming_the_memory():
  p = _plan(temp_bytes=41 * 1024 * _MIB, batch_size=32)
  line = plan.verdict(p)
  assert "\n" not in line
  assert line.startswith(
    "does not fit: needs 41.56 GiB of HBM per device, v5e has 16.00 GiB; try"
  )
  assert line.endswith(
    "try --remat full, a smaller --batch-size, a smaller --seq-len, a "
    "smaller model or a topology with more chips"
  )
  # Already rematerialized: only the other fixes are named.
  assert "--remat" not in plan.verdict(
    _plan(temp_bytes=41 * 1024 * _MIB, batch_size=32, remat="full")
  )
  assert "of 16.00 GiB: does not fit" in plan.format_plan(p)
  # Weights alone over HBM: only fewer or smaller weights per chip help.
  big = plan.verdict(_plan(params_bytes=20 << 30, mesh=(2, 8, 1)))
  assert big.endswith(
    "try a larger fsdp axis of --mesh, a smaller model or a topology with "
    "more chips"
  )


def test_out_of_memory_compile_is_a_refusal():
  message = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on "
    "HBM, the total memory required for HLO temporaries (456.10G) exceeds "
    "available HBM (15.75G). HLO module: jit_train_step."
  )
  temps = plan._oom_temporaries(message)
  assert temps == int(456.10 * (1 << 30))
  p = _plan(
    temp_bytes=temps, code_bytes=None, unaliased_out_bytes=None, oom=True
  )
  assert not p.fits
  assert "total (at least)" in plan.format_plan(p)
  assert plan.verdict(p).startswith("does not fit: needs 456.40 GiB of HBM")
  unknown = plan.verdict(dataclasses.replace(p, temp_bytes=None))
  assert "ran out of HBM (RESOURCE_EXHAUSTED)" in unknown


def test_cli_exit_status_follows_the_verdict(monkeypatch, capsys):
  monkeypatch.setattr(aot, "available", lambda platform: True)
  monkeypatch.setattr(aot, "setup_environment", lambda: None)
  argv = ("--compile-only", "--topology", "v5e:4x4", "--mesh", "1,16,1")
  for plan_, expected in ((_plan(), 0), (_plan(temp_bytes=1 << 40), 1)):
    monkeypatch.setattr(plan, "compile_plan", lambda cfg, topo, p=plan_: p)
    code, out, err = _train(capsys, *argv)
    assert code == expected
    assert "memory per device" in out
    assert ("does not fit: needs" in err) == (expected == 1)


# One tiny LM per residual scheme, cycling through the norms and attentions,
# so each registered part compiles once (18 compiles instead of 43).
_PARTS = build.registries("lm", allow_batch_stats=True)
_SMOKE = [
  (residual, norm, attention)
  for residual, norm, attention in zip(
    _PARTS["residual"],
    itertools.cycle(_PARTS["norm"]),
    itertools.cycle(_PARTS["attention"]),
  )
]


def test_smoke_cycle_covers_every_registered_part():
  assert len(_PARTS["residual"]) >= max(
    len(_PARTS["norm"]), len(_PARTS["attention"])
  )
  for i, field in enumerate(("residual", "norm", "attention")):
    assert {row[i] for row in _SMOKE} == set(_PARTS[field])


# --------------------------------------------------------------------------
# With the deviceless compilers (the aot extra).


def _hand_count(topology: str, devices: int, rows_per_device: int) -> float:
  """Bytes per device of the 1B LM's step, counted by hand.

  * Parameters: N bf16 values, sharded over the fsdp axis (FSDP shards every
    matrix; the replicated norm vectors are 0.01% of N): 2 N / devices.
  * Optimizer state: AdamW's two moments, in the parameters' dtype.
  * Activations JAX's autodiff keeps for the backward pass (no remat), per
    layer and row, in units U of one (seq, width) bfloat16 tensor: the two
    norms' inputs and outputs (4 U), attention's q, k, v and output (4 U;
    flash attention keeps no (seq, seq) scores), the MLP's up-projection
    output, the erfc term of the exact GELU and the GELU output (3 x 4 U):
    20 U. That is Korthikanti et al.'s 34 s b h bytes (arXiv:2205.05198)
    less the two dropout masks, plus the GELU's erfc term.
  * On TPU, flash attention's two float32 softmax statistics per head,
    (batch, heads, seq, 1), whose unit minor axis Mosaic pads to 128 lanes:
    2 x heads x seq x 128 x 4 bytes per layer and row.
  * On GPU, each layer's FSDP-gathered weights (12 width^2 bf16), which
    XLA:GPU keeps from the forward to the backward pass (its buffer
    assignment shows them live at the peak); XLA:TPU gathers them again.
  """
  n, width, depth, heads, seq = 810_092_544, 2048, 16, 16, 2048
  params = 2 * n / devices
  optimizer = 2 * params
  unit = seq * width * 2
  per_layer = 20 * unit * rows_per_device
  if topology.startswith("v5e"):
    per_layer += 2 * heads * seq * 128 * 4 * rows_per_device
  else:
    per_layer += 12 * width**2 * 2
  return params + optimizer + depth * per_layer


@pytest.mark.aot
@pytest.mark.parametrize(
  "topology,mesh", [("v5e:4x4", (1, 16, 1)), ("h100:8", (1, 8, 1))]
)
def test_1b_plan_memory_matches_a_hand_count(topology, mesh):
  devices = mesh[1]
  cfg = config.TrainConfig(
    width=2048,
    depth=16,
    num_heads=16,
    seq_len=2048,
    dtype="bfloat16",
    param_dtype="bfloat16",
    mesh=mesh,
    batch_size=devices,  # One row per device.
  )
  p = plan.compile_plan(cfg, topology)
  assert p.fits and p.num_params == 810_092_544
  # The compiler's count without its generated code (the program itself).
  measured = p.total_bytes - p.code_bytes
  expected = _hand_count(topology, devices, rows_per_device=1)
  assert measured == pytest.approx(expected, rel=0.10)
  assert p.params_bytes == pytest.approx(2 * p.num_params / devices, rel=0.01)
  assert p.opt_bytes == pytest.approx(2 * p.params_bytes, rel=0.01)
  text = plan.format_plan(p)
  assert "fits" in text and "GiB" in text
  if topology == "h100:8":
    assert p.flops is None and plan.NO_GPU_COST in text
  else:
    assert p.flops > 0 and "4 hosts of 4 chips" in text


@pytest.mark.aot
def test_a_206b_model_on_v5e_2x2_is_refused_naming_memory(capsys):
  code, out, err = _train(
    capsys,
    "--compile-only", "--topology", "v5e:2x2", "--mesh", "1,4,1",
    "--width", "16384", "--depth", "64", "--num-heads", "128",
    "--seq-len", "128", "--batch-size", "4",
    "--dtype", "bfloat16", "--param-dtype", "bfloat16",
  )  # fmt: skip
  assert code == 1
  assert "memory per device" in out and "does not fit" in out
  lines = err.strip().splitlines()
  assert len(lines) == 1
  assert "does not fit: needs" in lines[0]
  assert "GiB of HBM per device, v5e has 16.00 GiB" in lines[0]


@pytest.mark.aot
@pytest.mark.parametrize("residual,norm,attention", _SMOKE)
def test_every_registered_part_compiles_for_v5e(residual, norm, attention):
  cfg = config.TrainConfig(
    norm=norm,
    attention=attention,
    residual=residual,
    allow_batch_stats=True,
    width=128,
    depth=2,
    num_heads=4,
    seq_len=128,
    batch_size=8,
    mesh=(1, 4, 1),
  )
  p = plan.compile_plan(cfg, "v5e:2x2")
  assert p.fits and p.temp_bytes > 0 and p.flops > 0


@pytest.mark.aot
def test_remat_and_scan_show_in_the_plans_memory():
  # A 4-layer LM of width 512 over 1024 tokens on v5e:2x2: activations
  # dominate the temporaries, so rematerializing every layer shrinks them;
  # the scanned stack computes the same step.
  cfg = config.TrainConfig(
    width=512,
    depth=4,
    num_heads=8,
    seq_len=1024,
    batch_size=8,
    mesh=(1, 4, 1),
    dtype="bfloat16",
  )
  plans = {
    (remat, scan): plan.compile_plan(
      dataclasses.replace(cfg, remat=remat, scan_layers=scan), "v5e:2x2"
    )
    for remat in ("none", "full")
    for scan in (False, True)
  }
  for scan in (False, True):
    none, full = plans["none", scan], plans["full", scan]
    assert full.temp_bytes < 0.5 * none.temp_bytes, (scan, none, full)
    assert none.params_bytes == full.params_bytes
    assert "--remat full" in plan.format_plan(full)
  assert plans["none", True].num_params == plans["none", False].num_params
