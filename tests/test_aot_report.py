"""`benchmarks.aot_report`: its pure helpers (no compiler, no aot extra), and
the script end to end for one GPU and one TPU (marker ``aot``)."""

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from benchmarks import aot_report as report
from jaxnorm import aot

# ptxas -v output as Mosaic GPU dumps it (jax 0.12, sm_90a): a spill warning
# precedes its kernel's entry and repeats the spill counts.
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'jaxnorm_rms_norm_fwd_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for jaxnorm_rms_norm_fwd_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 2 barriers, 1 bytes smem
ptxas info    : Compile time = 50.904 ms

ptxas warning : Registers are spilled to local memory in function 'jaxnorm_flash_attention_dkv_mgpu_mosaic_gpu_kernel', 356 bytes spill stores, 336 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'jaxnorm_flash_attention_dkv_mgpu_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for jaxnorm_flash_attention_dkv_mgpu_mosaic_gpu_kernel
    184 bytes stack frame, 356 bytes spill stores, 336 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 184 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 264.181 ms
"""  # noqa: E501 (verbatim ptxas lines)

RESOURCES = (
  "Resources(smem_scratch_bytes=182272, tmem_scratch_cols=0, "
  "tmem_collective_scratch_cols=0, barrier_counts=Counter(), "
  "scoped_gmem_semaphores={})"
)

TPU_HLO = (
  "  %fusion.3 = f32[4096]{0} fusion(%p), kind=kLoop\n"
  '  %fwd.1 = bf16[8192,4096]{1,0} custom-call(%x, %s), custom_call_target="'
  'tpu_custom_call", metadata={op_name="jit(f)/jvp(jaxnorm_rms_norm_fwd)/'
  'pallas_call" stack_frame_id=12}, backend_config={"flag_configs":[],'
  '"scoped_memory_configs":[],"used_scoped_memory_configs":[{"memory_space":'
  '"1","offset":"0","size":"3194880"}]}\n'
  '  %bwd.1 = bf16[8192,4096]{1,0} custom-call(%x, %dy), custom_call_target="'
  'tpu_custom_call", metadata={op_name="jit(f)/transpose(jaxnorm_rms_norm_'
  'bwd)/pallas_call"}, backend_config={"used_scoped_memory_configs":[{'
  '"memory_space":"1","offset":"0","size":"4096"},{"memory_space":"1",'
  '"offset":"4096","size":"1024"}]}\n'
)


def test_parse_ptxas_one_entry_per_kernel():
  kernels = aot.parse_ptxas(PTXAS + PTXAS)  # repeats count once
  assert kernels == [
    aot.PtxasKernel("jaxnorm_rms_norm_fwd_mosaic_gpu_kernel", 96, 0, 0),
    aot.PtxasKernel(
      "jaxnorm_flash_attention_dkv_mgpu_mosaic_gpu_kernel", 255, 356, 336
    ),
  ]
  assert aot.parse_ptxas("") == []


def test_parse_smem_and_scoped_vmem():
  assert report.parse_smem(RESOURCES) == 182272
  assert report.parse_smem("nothing here") is None
  assert report.parse_scoped_vmem(TPU_HLO) == {
    "jaxnorm_rms_norm_fwd": 3194880,
    "jaxnorm_rms_norm_bwd": 5120,
  }


def test_label():
  assert report.label("jaxnorm_rms_norm_bwd_mosaic_gpu_kernel") == "bwd"
  assert report.label("jaxnorm_flash_attention_dkv_mgpu") == "dkv"
  assert report.label("jaxnorm_add_rms_norm_fwd") == "fwd"


def test_predicted_seconds_takes_the_binding_limit():
  h100 = aot.CHIPS["h100"]
  seconds, bound = report.predicted_seconds(3.35e12, 1.0, h100)
  assert (seconds, bound) == (pytest.approx(1.0), "HBM")
  seconds, bound = report.predicted_seconds(1.0, 2 * 989e12, h100)
  assert (seconds, bound) == (pytest.approx(2.0), "compute")
  chip = dataclasses.replace(h100, hbm_bandwidth=1e9, peak_flops=1e12)
  assert report.predicted_seconds(5e8, 1e12, chip) == (1.0, "compute")


def test_formatting():
  assert report.si(469.8e6, "B") == "469.8 MB"
  assert report.si(1.576e11, "FLOP") == "157.6 GFLOP"
  assert report.si(12, "B") == "12 B"
  assert report.si(None, "B") == "n/a"
  assert report.kib(2048) == "2 KiB"
  assert report.kib(5292032) == "5.05 MiB"
  assert report.kib(0) == "0 B"
  assert report.per_kernel({}) == "-"
  cell = report.per_kernel({"jaxnorm_x_fwd": "96", "jaxnorm_x_bwd": "214"})
  assert cell == "fwd 96 · bwd 214"
  assert report.first_line(ValueError("a | b\nmore")) == "a \\| b"
  assert report.first_line(ValueError()) == "ValueError"
  assert report.table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---|\n| 1 | 2 |"


def test_replace_section_appends_then_replaces():
  text = "# Benchmarks\n\nintro\n"
  once = report.replace_section(text, "table 1")
  assert once == (
    f"# Benchmarks\n\nintro\n\n{report.BEGIN}\ntable 1\n{report.END}\n"
  )
  twice = report.replace_section(once + "\n## Later\n", "table 2\n")
  assert twice == (
    f"# Benchmarks\n\nintro\n\n{report.BEGIN}\ntable 2\n{report.END}\n"
    "\n## Later\n"
  )


def test_kernel_row():
  failed = report.kernel_row("DyT fwd+bwd", "h100", {"error": "no lowering"})
  assert failed == ["DyT fwd+bwd", "h100", "no lowering"] + ["-"] * 7
  tpu = {
    "error": None,
    "kernels": ["jaxnorm_rms_norm_fwd", "jaxnorm_rms_norm_bwd"],
    "flops": 5.05e8,
    "bytes": 8.19e8,
    "source": "XLA cost analysis",
    "vmem": {"jaxnorm_rms_norm_bwd": 6 << 20, "jaxnorm_rms_norm_fwd": 2048},
  }
  row = report.kernel_row("RMSNorm fwd+bwd", "v5e", tpu)
  assert row[3:8] == [
    "n/a (TPU)",
    "n/a (TPU)",
    "fwd 2 KiB · bwd 6 MiB",
    "819 MB",
    "505 MFLOP",
  ]
  assert row[9] == "1000 (HBM)"  # 819 MB at 819 GB/s
  gpu = dict(
    tpu,
    ptxas=[
      {
        "name": "jaxnorm_rms_norm_bwd_mosaic_gpu_kernel",
        "registers": 214,
        "spill_stores": 8,
        "spill_loads": 4,
      },
      {
        "name": "jaxnorm_rms_norm_fwd_mosaic_gpu_kernel",
        "registers": 96,
        "spill_stores": 0,
        "spill_loads": 0,
      },
    ],
    smem={"jaxnorm_rms_norm_fwd": 2048, "jaxnorm_rms_norm_bwd": 2048},
  )
  row = report.kernel_row("RMSNorm fwd+bwd", "h100", gpu)
  assert row[3:6] == [
    "fwd 96 · bwd 214",
    "fwd 0/0 · bwd 8/4",
    "fwd 2 KiB · bwd 2 KiB",
  ]


@pytest.mark.aot
def test_report_runs_for_one_gpu_and_one_tpu():
  root = pathlib.Path(__file__).resolve().parents[1]
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.aot_report", "--chips", "h100,v5e"]
    + ["--no-write"],
    cwd=root,
    capture_output=True,
    text=True,
    timeout=1200,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  cells = [
    [c.strip() for c in ln.strip("|").split("|")]
    for ln in proc.stdout.splitlines()
    if ln.startswith("| ")
  ]
  # The kernel table comes first; later tables reuse (case, chip) keys.
  status = {}
  for c in cells:
    if len(c) > 2:
      status.setdefault((c[0], c[1]), c[2])
  for case in report.KERNEL_CASES:
    for chip in ("h100", "v5e"):
      # A kernel either compiles or the row carries its refusal (DyT and
      # SeeDNorm at 4096 features exceed the Mosaic GPU block budget).
      got = status[case, chip]
      assert got == "yes" or "implementation='pallas'" in got, got
  for case in report.KERNEL_CASES:
    if not case.startswith(("DyT", "SeeDNorm")):
      assert status[case, "h100"] == status[case, "v5e"] == "yes", case
