"""Every CPU benchmark script runs end to end at toy sizes and prints its table.

The numbers are not checked (benchmarks are run by hand; timing in tests
would be flaky); what is checked is that each script still imports, builds
its cases against the current API and prints a Markdown table of ratios.
`benchmarks/kernels.py` has its own check (tests/pallas_kernels), and
`benchmarks/aot_report.py`, which compiles for deviceless chips, has its own
(tests/test_aot_report.py).
"""

import pathlib
import subprocess
import sys

import pytest

# Each script is a separate process with its own compilations: CI runs them
# (-m slow).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY = {
  "norms.py": "--rows 64 --cols 128 --rounds 1 --warmup 1",
  "scan_compile.py": (
    "--width 16 --heads 2 --depths 1,2 --step-depth 1 --seq-len 8 "
    "--batch 2 --rounds 1 --steps-per-round 1"
  ),
  "train.py": (
    "--width 32 --depth 1 --heads 2 --seq-len 16 --batch 2 --rounds 1 "
    "--steps-per-round 1"
  ),
  "optim.py": (
    "--layers 1 --d-model 32 --vocab 64 --rounds 1 --warmup 1 "
    "--refresh-rounds 1"
  ),
  "convert.py": (
    "--width 32 --depth 1 --num-heads 2 --seq-len 16 --batch 2 --iters 1"
  ),
}


def test_every_benchmark_script_is_covered():
  scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
  assert scripts - {"kernels.py", "aot_report.py"} == set(TINY)


@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark_runs(script):
  proc = subprocess.run(
    [sys.executable, str(ROOT / "benchmarks" / script), *TINY[script].split()],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  table = [ln for ln in proc.stdout.splitlines() if ln.startswith("|")]
  assert len(table) >= 3, proc.stdout[-3000:]
