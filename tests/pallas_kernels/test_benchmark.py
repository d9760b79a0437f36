"""benchmarks/kernels.py runs end to end on CPU (interpreted smoke check)."""

from __future__ import annotations

import importlib.util
import pathlib

import jax

from pallas_kernels import _rows

_PATH = pathlib.Path(__file__).parents[2] / "benchmarks" / "kernels.py"


def test_cpu_smoke_reports_no_accelerator(capsys):
  spec = importlib.util.spec_from_file_location("bench_kernels", _PATH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  assert jax.default_backend() == "cpu"
  out = mod.run_cpu_smoke(1)
  text = capsys.readouterr().out
  assert "No accelerator present (backend=cpu)" in text
  cases = {row["case"]: row for row in out["cpu_smoke"]}
  want = {"xla", "interpret-mosaic_gpu", "interpret-mosaic_tpu"}
  if _rows.triton_available():
    want.add("interpret-triton")
  assert set(cases) == {f"rms fwd+bwd {w}" for w in want}
  for row in cases.values():
    assert row["ms"] > 0 and row["max_err"] < 1e-4
