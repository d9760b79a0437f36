"""What jaxnorm's kernels compile to on GPUs and TPUs this machine lacks.

Run from the repository root (Python >= 3.12 with the aot extra,
``pip install -e ".[aot]"``):

  python -m benchmarks.aot_report [--chips h100,h200,a100,v5e,v5p,v6e]
                                  [--no-write] [--with-conda]

Every case is compiled deviceless (`jaxnorm.aot`: the real XLA:GPU with
Mosaic GPU and ptxas, the real XLA:TPU with Mosaic TPU) for one chip of each
kind; nothing runs. Three Markdown tables are printed and written into
``benchmarks/README.md`` between `BEGIN` and `END` (replaced on every run):

* kernels: RMSNorm, LayerNorm, fused add+RMSNorm, DyT and SeeDNorm
  forward+backward at ``(8192, 4096)`` bfloat16, causal flash attention
  forward+backward (B=1, T=4096, N=8, H=128, bfloat16) and chunked causal
  linear attention forward, each with ``implementation="pallas"``: whether
  it compiles, ptxas registers and spills and the shared memory of each
  Mosaic GPU kernel (from ``MOSAIC_GPU_DUMP_TO``; a100 gets the Triton
  lowering, which reports neither), the scoped VMEM each Mosaic TPU kernel
  uses (``used_scoped_memory_configs`` of the compiled program), bytes and
  flops per call, and a time predicted from the chip's datasheet bandwidth
  and peak (`predicted_seconds`: a model, not a measurement);
* the compiled programs' bytes accessed of jaxnorm's RMSNorm/LayerNorm
  forward+backward (``implementation=None``) against autodiff through
  ``flax.nnx`` and against the XLA reference;
* bytes accessed of one optimizer step on the 12-layer d=512 LM tree of
  `benchmarks.optim`, on the TPUs, relative to ``optax.adamw``.

Bytes and flops: on TPU ``compiled.cost_analysis()``, which counts a Pallas
kernel through its ``pl.CostEstimate``. On GPU that returns ``None`` (and
``Lowered.cost_analysis()`` needs a PjRt backend of the target), so the
report adds the kernels' cost estimates (read from the jaxpr) to XLA's
``HloCostAnalysis`` of the compiled GPU module, run by the CPU client, which
counts custom calls as -1 and everything else as XLA does.

The GPU cases of one chip compile in a subprocess (a crash costs that
chip's remaining cases only), each case with its own ``MOSAIC_GPU_DUMP_TO``
directory, so every ptxas report belongs to its case. With that directory
set Mosaic GPU writes the report ``MOSAIC_GPU_DUMP_PTXAS=1`` would print on
stdout to ``NAME.ptxas`` there instead, next to ``NAME.resources.txt``, the
only place that states the kernel's shared memory (``smem_scratch_bytes``;
ptxas sees the dynamic shared memory as 0 bytes).

Conda's step compiles only with ``--with-conda``: the 72 SVDs of its basis
refresh (in a ``lax.cond``) take XLA:TPU about 11 minutes per chip on 2
cores, against under 10 minutes for the rest of the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm import aot

BEGIN = "<!-- aot_report:begin -->"
END = "<!-- aot_report:end -->"
README = pathlib.Path(__file__).with_name("README.md")
_START = time.perf_counter()
TOPOLOGIES = {
  "h100": "h100:1",
  "h200": "h200:1",
  "a100": "a100:1",
  "v5e": "v5e:1x1",
  "v5p": "v5p:1x1x1",
  "v6e": "v6e:1x1",
}
ROWS, FEATURES = 8192, 4096
BATCH, SEQ, HEADS, HEAD_DIM = 1, 4096, 8, 128
KERNEL_CASES = (
  "RMSNorm fwd+bwd",
  "LayerNorm fwd+bwd",
  "add+RMSNorm fwd+bwd",
  "DyT fwd+bwd",
  "SeeDNorm fwd+bwd",
  "flash attention fwd+bwd",
  "linear attention fwd",
)
COMPARED = ("RMSNorm", "LayerNorm")
OPTIMIZERS = (
  "optax.adamw",
  "optax.contrib.muon",
  "jaxnorm adamp",
  "jaxnorm sgdp",
  "jaxnorm conda",
  "jaxnorm rmnp",
)


# ---------------------------------------------------------------------------
# Parsing and formatting (pure: no compiler needed).


def parse_smem(text: str) -> int | None:
  """``smem_scratch_bytes`` of a Mosaic GPU ``NAME.resources.txt`` dump."""
  m = re.search(r"smem_scratch_bytes=(\d+)", text)
  return int(m.group(1)) if m else None


def parse_scoped_vmem(hlo: str) -> dict[str, int]:
  """Scoped VMEM of each Mosaic TPU kernel of a compiled TPU HLO module.

  Reads the ``used_scoped_memory_configs`` of every ``tpu_custom_call`` and
  names it by the ``jaxnorm_*`` kernel name in its ``op_name``.
  """
  vmem = {}
  for line in hlo.splitlines():
    if 'custom_call_target="tpu_custom_call"' not in line:
      continue
    name = re.search(r'op_name="[^"]*?(jaxnorm_\w+)', line)
    used = re.search(r'"used_scoped_memory_configs":\[([^\]]*)\]', line)
    if name and used:
      sizes = re.findall(r'"size":"(\d+)"', used.group(1))
      vmem[name.group(1)] = sum(int(s) for s in sizes)
  return vmem


def label(name: str) -> str:
  """Short name of a kernel: ``jaxnorm_rms_norm_bwd_mosaic_gpu_kernel``: bwd."""
  for suffix in ("_mosaic_gpu_kernel", "_mgpu"):
    name = name.removesuffix(suffix)
  return name.rsplit("_", 1)[-1]


def predicted_seconds(
  nbytes: float, flops: float, chip: Any
) -> tuple[float, str]:
  """Roofline time at datasheet rates: ``(max(bytes/bw, flops/peak), bound)``.

  A model, not a measurement: no launch overhead, caches or overlap limits.

  Args:
    nbytes: bytes moved to and from HBM.
    flops: floating-point operations.
    chip: a `jaxnorm.aot.Chip` (``hbm_bandwidth``, ``peak_flops``).

  Returns:
    The seconds and ``"HBM"`` or ``"compute"``, whichever bounds them.
  """
  memory, compute = nbytes / chip.hbm_bandwidth, flops / chip.peak_flops
  return (memory, "HBM") if memory >= compute else (compute, "compute")


def si(value: float | None, unit: str) -> str:
  """``337.6 MB``, ``160.4 GFLOP``: three significant digits, SI prefix."""
  if value is None:
    return "n/a"
  for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(value) >= scale:
      return f"{value / scale:.4g} {prefix}{unit}"
  return f"{value:.4g} {unit}"


def kib(value: int) -> str:
  """``512 B``, ``2 KiB``, ``5.05 MiB``."""
  if value >= 1 << 20:
    return f"{value / (1 << 20):.3g} MiB"
  if value >= 1 << 10:
    return f"{value / (1 << 10):.3g} KiB"
  return f"{value} B"


def per_kernel(values: dict[str, str]) -> str:
  """``fwd 96 · bwd 214`` from ``{kernel name: cell}``; ``-`` when empty."""
  if not values:
    return "-"
  return " · ".join(f"{label(k)} {v}" for k, v in values.items())


def first_line(error: BaseException | str) -> str:
  """The first non-empty line of an error, fit for a table cell."""
  text = str(error).strip() or type(error).__name__
  line = text.splitlines()[0]
  return line.replace("|", "\\|")[:240]


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
  """A Markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def replace_section(text: str, body: str) -> str:
  """``text`` with ``body`` between `BEGIN` and `END` (appended if absent)."""
  block = f"{BEGIN}\n{body.strip()}\n{END}"
  start, end = text.find(BEGIN), text.find(END)
  if start < 0 or end < start:
    return text.rstrip("\n") + "\n\n" + block + "\n"
  return text[:start] + block + text[end + len(END) :]


# ---------------------------------------------------------------------------
# Cases and compiles.


def _fwd_bwd(fn: Callable[..., Any], num_diff: int) -> Callable[..., Any]:
  """``(*args, cotangent) -> (y, grads of the first num_diff args)``."""

  def run(*args):
    *args, dy = args
    diff, rest = args[:num_diff], args[num_diff:]
    y, pull = jax.vjp(lambda *d: fn(*d, *rest), *diff)
    return y, pull(dy)

  return run


def kernel_case(case: str) -> tuple[Callable[..., Any], list[Any]]:
  """``(function, abstract arguments)`` of one kernel case."""
  from jaxnorm import attention, fused_norms, norms

  x = jax.ShapeDtypeStruct((ROWS, FEATURES), jnp.bfloat16)
  p = jax.ShapeDtypeStruct((FEATURES,), jnp.bfloat16)
  a = jax.ShapeDtypeStruct((), jnp.bfloat16)
  qkv = jax.ShapeDtypeStruct((BATCH, SEQ, HEADS, HEAD_DIM), jnp.bfloat16)
  impl = {"implementation": "pallas"}
  if case == "RMSNorm fwd+bwd":
    return _fwd_bwd(lambda x, s: norms.rms_norm(x, s, **impl), 2), [x, p, x]
  if case == "LayerNorm fwd+bwd":
    fn = lambda x, s, b: norms.layer_norm(x, s, b, **impl)  # noqa: E731
    return _fwd_bwd(fn, 3), [x, p, p, x]
  if case == "add+RMSNorm fwd+bwd":
    fn = lambda x, r, s: fused_norms.add_rms_norm(x, r, s, **impl)  # noqa: E731
    return _fwd_bwd(fn, 3), [x, x, p, (x, x)]
  if case == "DyT fwd+bwd":
    fn = lambda x, al, s, b: norms.dyt(x, al, s, b, **impl)  # noqa: E731
    return _fwd_bwd(fn, 4), [x, a, p, p, x]
  if case == "SeeDNorm fwd+bwd":
    fn = lambda x, s, ds, dp: norms.seed_norm(x, s, ds, dp, **impl)  # noqa: E731
    return _fwd_bwd(fn, 4), [x, p, p, p, x]
  if case == "flash attention fwd+bwd":
    fn = lambda q, k, v: attention.dot_product_attention(  # noqa: E731
      q, k, v, is_causal=True, **impl
    )
    return _fwd_bwd(fn, 3), [qkv, qkv, qkv, qkv]
  if case == "linear attention fwd":
    fn = lambda q, k, v: attention.causal_linear_attention(q, k, v, **impl)  # noqa: E731
    return fn, [qkv, qkv, qkv]
  raise ValueError(f"kernel_case: unknown case {case!r}")


def kernel_estimates(jaxpr: Any) -> dict[str, Any]:
  """``{kernel name: pl.CostEstimate or None}`` of every Pallas call."""
  found: dict[str, Any] = {}

  def walk(j):
    for eqn in j.eqns:
      params = eqn.params
      if "cost_estimate" in params:
        name = getattr(params.get("name_and_src_info"), "name", None)
        name = name or params.get("name") or eqn.primitive.name
        found[name] = params["cost_estimate"]
      for value in params.values():
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns"):
          walk(inner)

  walk(jaxpr.jaxpr)
  return found


def _xla_gpu_cost(compiled: Any) -> tuple[float, float]:
  """``(flops, bytes)`` of a compiled GPU program's XLA ops (not its calls).

  ``HloCostAnalysis`` (by the CPU client: the GPU target has no PjRt
  backend here) counts each custom call as -1 flop and -1 byte; those are
  added back, so the result covers the XLA ops only.
  """
  from jax._src.lib import _jax

  cpu = jax.devices("cpu")[0].client
  flops = nbytes = 0.0
  for module in compiled.runtime_executable().hlo_modules():
    cost = _jax.hlo_module_cost_analysis(cpu, module)
    calls = len(re.findall(r"\bcustom-call\(", module.to_string()))
    flops += cost.get("flops", 0.0) + calls
    nbytes += cost.get("bytes accessed", 0.0) + calls
  return flops, nbytes


def program_cost(compiled: Any, estimates: dict[str, Any], platform: str):
  """``(flops, bytes, source)`` of a compiled program (see module doc)."""
  if platform == "tpu":
    cost = compiled.cost_analysis()
    return cost.get("flops"), cost.get("bytes accessed"), "XLA cost analysis"
  flops, nbytes = _xla_gpu_cost(compiled)
  if any(e is None for e in estimates.values()):
    return None, None, "a kernel has no cost estimate"
  flops += sum(e.flops for e in estimates.values())
  nbytes += sum(e.bytes_accessed for e in estimates.values())
  source = "kernel estimates + XLA HLO" if estimates else "XLA HLO"
  return flops, nbytes, source


def compile_program(
  fn: Callable[..., Any], args: Sequence[Any], chip: str
) -> dict[str, Any]:
  """Compiles ``fn`` for one chip; a JSON-ready summary or the error."""
  platform = aot.CHIPS[chip].platform
  mesh = aot.topology(TOPOLOGIES[chip])
  try:
    with jax.set_mesh(mesh):
      estimates = kernel_estimates(jax.make_jaxpr(fn)(*args))
      compiled = jax.jit(fn).lower(*args).compile()
  except Exception as e:  # noqa: BLE001 - the error is the report's cell
    return {"error": first_line(e)}
  flops, nbytes, source = program_cost(compiled, estimates, platform)
  vmem = parse_scoped_vmem(compiled.as_text()) if platform == "tpu" else {}
  return {
    "error": None,
    "kernels": list(estimates),
    "flops": flops,
    "bytes": nbytes,
    "source": source,
    "vmem": vmem,
  }


def _dump_facts(dump: pathlib.Path) -> dict[str, Any]:
  """The ptxas reports and shared memory of a case's Mosaic GPU dump."""
  files = sorted(dump.iterdir()) if dump.is_dir() else []
  reports = "".join(p.read_text() for p in files if p.suffix == ".ptxas")
  smem = {}
  for p in files:
    if p.name.endswith(".resources.txt"):
      name = re.sub(r"_\d+\.resources\.txt$", "", p.name)
      smem[name] = parse_smem(p.read_text())
  return {
    "ptxas": [dataclasses.asdict(k) for k in aot.parse_ptxas(reports)],
    "smem": smem,
  }


def gpu_kernel_cases(chip: str) -> dict[str, dict[str, Any]]:
  """Compiles every kernel case for a GPU in a subprocess; adds ptxas facts.

  The worker (`_worker`) compiles the cases one after the other, each with
  its own ``MOSAIC_GPU_DUMP_TO`` directory, and writes its results after
  each; a case it did not reach (a crash) gets the worker's last error line.
  """
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out.json")
    proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.aot_report", "--worker", chip]
      + ["--out", out, "--dump", tmp],
      capture_output=True,
      text=True,
      check=False,
    )
    results = {}
    if os.path.exists(out):
      with open(out) as f:
        results = json.load(f)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    for i, case in enumerate(KERNEL_CASES):
      if case not in results:
        results[case] = {
          "error": f"worker exit {proc.returncode}: {first_line(tail)}"
        }
      elif not results[case]["error"]:
        results[case].update(_dump_facts(pathlib.Path(tmp, f"case{i}")))
  return results


def kernel_row(case: str, chip: str, r: dict[str, Any]) -> list[str]:
  """The kernels table's row of one compiled case (`compile_program`)."""
  spec = aot.CHIPS[chip]
  if r["error"]:
    return [case, chip, r["error"]] + ["-"] * 7
  order = [label(k) for k in r["kernels"]]

  def cells(values: dict[str, str]) -> str:
    key = lambda n: order.index(label(n)) if label(n) in order else len(order)  # noqa: E731
    return per_kernel({n: values[n] for n in sorted(values, key=key)})

  if spec.platform == "gpu" and r["ptxas"]:
    ptx = {k["name"]: k for k in r["ptxas"]}
    regs = cells({n: str(k["registers"]) for n, k in ptx.items()})
    spill = cells(
      {n: f"{k['spill_stores']}/{k['spill_loads']}" for n, k in ptx.items()}
    )
    mem = cells({n: kib(b) for n, b in r["smem"].items() if b is not None})
  elif spec.platform == "gpu":
    regs = spill = mem = "n/a (Triton)"
  else:
    regs = spill = "n/a (TPU)"
    mem = cells({n: kib(b) for n, b in r["vmem"].items()})
  model = "n/a"
  if r["bytes"] is not None:
    seconds, bound = predicted_seconds(r["bytes"], r["flops"], spec)
    model = f"{seconds * 1e6:.4g} ({bound})"
  return [case, chip, "yes", regs, spill, mem, si(r["bytes"], "B")] + [
    si(r["flops"], "FLOP"),
    r["source"],
    model,
  ]


def kernel_rows(chips: Sequence[str]) -> list[list[str]]:
  """One table row per kernel case and chip."""
  results = {}
  for chip in chips:
    if aot.CHIPS[chip].platform == "gpu":
      got = gpu_kernel_cases(chip)
    else:
      got = {c: compile_program(*kernel_case(c), chip) for c in KERNEL_CASES}
    for case, r in got.items():
      results[case, chip] = r
      _log(f"{case} / {chip}: {r['error'] or 'ok'}")
  return [
    kernel_row(case, chip, results[case, chip])
    for case in KERNEL_CASES
    for chip in chips
  ]


def _flax_norm(kind: str) -> tuple[Callable[..., Any], Any]:
  """Forward+backward of ``nnx.RMSNorm``/``nnx.LayerNorm`` and its state."""
  from flax import nnx

  cls = nnx.RMSNorm if kind == "RMSNorm" else nnx.LayerNorm
  module = cls(
    FEATURES, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
  )
  graph, state = nnx.split(module)
  abstract = jax.tree.map(
    lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), state
  )
  return _fwd_bwd(lambda x, st: nnx.merge(graph, st)(x), 2), abstract


def comparison_rows(chips: Sequence[str]) -> list[list[str]]:
  """Bytes accessed: jaxnorm (``None``) vs flax autodiff vs the reference."""
  from jaxnorm import norms

  x = jax.ShapeDtypeStruct((ROWS, FEATURES), jnp.bfloat16)
  p = jax.ShapeDtypeStruct((FEATURES,), jnp.bfloat16)
  rows = []
  for kind in COMPARED:
    flax_fn, flax_state = _flax_norm(kind)
    for chip in chips:
      got = {}
      for impl in (None, "xla"):
        if kind == "RMSNorm":
          fn = lambda x, s, i=impl: norms.rms_norm(x, s, implementation=i)  # noqa: E731
          got[impl] = compile_program(_fwd_bwd(fn, 2), [x, p, x], chip)
        else:
          fn = lambda x, s, b, i=impl: norms.layer_norm(  # noqa: E731
            x, s, b, implementation=i
          )
          got[impl] = compile_program(_fwd_bwd(fn, 3), [x, p, p, x], chip)
      got["flax"] = compile_program(flax_fn, [x, flax_state, x], chip)
      cells = [
        got[k]["error"] or si(got[k]["bytes"], "B")
        for k in (None, "flax", "xla")
      ]
      ours = got[None].get("bytes")
      ratios = [
        f"{ours / got[k]['bytes']:.2f}" if ours and got[k].get("bytes") else "-"
        for k in ("flax", "xla")
      ]
      rows.append([f"{kind} fwd+bwd", chip, *cells, *ratios])
      _log(f"compare {kind} / {chip}")
  return rows


def _optimizers() -> dict[str, Any]:
  import optax

  from benchmarks import optim as bench
  from jaxnorm import optim

  lr, wd = 1e-3, 0.01
  return {
    "optax.adamw": optax.adamw(lr, weight_decay=wd),
    "optax.contrib.muon": optax.contrib.muon(
      lr, muon_weight_dimension_numbers=bench.muon_dims
    ),
    "jaxnorm adamp": optim.adamp(lr, weight_decay=wd),
    "jaxnorm sgdp": optim.sgdp(lr, momentum=0.9, weight_decay=wd),
    "jaxnorm conda": optim.conda(
      lr, weight_decay=wd, update_proj_gap=2000, axes=bench.hidden_axes
    ),
    "jaxnorm rmnp": optim.rmnp(lr, weight_decay=wd, axes=bench.hidden_axes),
  }


def optimizer_rows(chips: Sequence[str], with_conda: bool) -> list[list[str]]:
  """Bytes accessed per optimizer step on the TPUs, and ratios to adamw.

  Conda's step is compiled only ``with_conda``: its 72 SVDs (the basis
  refresh) take XLA:TPU about 11 minutes per chip on 2 cores.
  """
  import optax

  from benchmarks import optim as bench

  tpus = [c for c in chips if aot.CHIPS[c].platform == "tpu"]
  params = jax.eval_shape(
    lambda: bench.lm_params(12, 512, 32000, jax.random.key(0))
  )
  got: dict[str, dict[str, Any]] = {}
  for name, tx in _optimizers().items():
    if name == "jaxnorm conda" and not with_conda:
      for chip in tpus:
        got[name, chip] = {"error": "skipped (--with-conda)"}
      continue
    state = jax.eval_shape(tx.init, params)

    def step(p, s, g, tx=tx):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    for chip in tpus:
      got[name, chip] = compile_program(step, [params, state, params], chip)
      _log(f"{name} / {chip}: {got[name, chip]['error'] or 'ok'}")
  rows = []
  for name in OPTIMIZERS:
    cells = []
    for chip in tpus:
      r, base = got[name, chip], got["optax.adamw", chip]
      if r["error"]:
        cells += [r["error"], "-"]
        continue
      ratio = r["bytes"] / base["bytes"] if base.get("bytes") else None
      cells += [si(r["bytes"], "B"), "-" if ratio is None else f"{ratio:.2f}"]
    rows.append([name, *cells])
  return rows


def versions() -> str:
  """``jax X, jaxlib Y, libtpu Z, ...`` of the compilers used."""
  names = (
    "jax",
    "jaxlib",
    "libtpu",
    "jax-cuda12-plugin",
    "nvidia-cuda-nvcc-cu12",
  )
  parts = []
  for name in names:
    try:
      parts.append(f"{name} {importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
      parts.append(f"{name} (not installed)")
  return ", ".join(parts)


def _log(message: str) -> None:
  """Progress on stderr, with the seconds since the report started."""
  print(f"  [{time.perf_counter() - _START:6.0f} s] {message}", file=sys.stderr)


def report(chips: Sequence[str], with_conda: bool = False) -> str:
  """The whole Markdown section."""
  start = time.perf_counter()
  today = datetime.date.today().isoformat()
  kernels = kernel_rows(chips)
  compared = comparison_rows(chips)
  optimizers = optimizer_rows(chips, with_conda)
  tpus = [c for c in chips if aot.CHIPS[c].platform == "tpu"]
  elapsed = time.perf_counter() - start
  parts = [
    f"Generated {today} by `python -m benchmarks.aot_report` in "
    f"{elapsed:.0f} s on the 2-core CPU VM; {versions()}. Deviceless "
    "compiles: nothing ran on a GPU or TPU.",
    "### Kernels\n\n(8192, 4096) bf16 norms; attention B=1, T=4096, N=8, "
    "H=128 bf16, causal. Registers, spills (stores/loads, bytes) and SMEM "
    "per kernel of the program; VMEM: the scoped VMEM the compiled Mosaic "
    "TPU kernel uses (operands XLA itself places in VMEM, `S(1)` layouts, "
    "are not part of it). **Predicted µs is a model, not a measurement**: "
    "max(bytes / datasheet HBM bandwidth, flops / datasheet bf16 peak).\n\n"
    + table(
      [
        "case",
        "chip",
        "compiles",
        "registers",
        "spill B st/ld",
        "SMEM/VMEM per block",
        "bytes/call",
        "flops/call",
        "bytes/flops from",
        "predicted µs (model)",
      ],
      kernels,
    ),
    "### Bytes accessed: jaxnorm vs flax.nnx autodiff vs the XLA reference"
    "\n\nOne compiled forward+backward (y and all gradients for a given "
    "cotangent), (8192, 4096) bf16; jaxnorm with `implementation=None` (the "
    "kernel where dispatch picks it). Same cost sources as above.\n\n"
    + table(
      [
        "case",
        "chip",
        "jaxnorm",
        "flax.nnx",
        "XLA reference",
        "jaxnorm / flax",
        "jaxnorm / XLA",
      ],
      compared,
    ),
    "### Bytes accessed per optimizer step (TPU)\n\n12-layer d=512 LM tree "
    "of `benchmarks.optim` (54.1M float32 parameters), `update` + "
    "`apply_updates` in one program; `compiled.cost_analysis()`. Conda's "
    "basis refresh sits in a `lax.cond`, which XLA's cost analysis counts "
    "as its costlier branch; it compiles only with `--with-conda` (about 11 "
    "minutes per TPU on 2 cores).\n\n"
    + table(
      ["optimizer"] + [f"{c} {h}" for c in tpus for h in ("bytes", "/ adamw")],
      optimizers,
    ),
  ]
  return "\n\n".join(parts)


def _worker(chip: str, out: str, dump: str) -> None:
  """Compiles the kernel cases for a GPU, case ``i`` dumping to ``caseI``."""
  results = {}
  for i, case in enumerate(KERNEL_CASES):
    case_dump = os.path.join(dump, f"case{i}")
    os.mkdir(case_dump)
    os.environ["MOSAIC_GPU_DUMP_TO"] = case_dump  # read at each compile
    results[case] = compile_program(*kernel_case(case), chip)
    with open(out, "w") as f:
      json.dump(results, f)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--chips", default=",".join(TOPOLOGIES))
  ap.add_argument("--no-write", action="store_true")
  ap.add_argument(
    "--with-conda",
    action="store_true",
    help="also compile Conda's step (about 11 minutes per TPU on 2 cores)",
  )
  ap.add_argument("--worker", metavar="CHIP", help=argparse.SUPPRESS)
  ap.add_argument("--out", help=argparse.SUPPRESS)
  ap.add_argument("--dump", help=argparse.SUPPRESS)
  args = ap.parse_args()
  aot.setup_environment()
  if args.worker:
    _worker(args.worker, args.out, args.dump)
    return
  chips = [c for c in args.chips.split(",") if c]
  for chip in chips:
    if chip not in TOPOLOGIES:
      ap.error(f"unknown chip {chip!r}; choose from {tuple(TOPOLOGIES)}")
  section = report(chips, args.with_conda)
  print(section)
  if not args.no_write:
    README.write_text(replace_section(README.read_text(), section))


if __name__ == "__main__":
  main()
