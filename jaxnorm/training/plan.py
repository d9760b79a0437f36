"""Compile-only planning: a run's training step compiled for chips not here.

``jaxnorm-train --compile-only --topology v5e:4x4 --mesh 1,16,1 ...`` builds
the step `trainer` would run (the same `trainer.make_train_step`, optimizer,
state layout and logical sharding rules, with every kernel lowered for the
named chip) and compiles it on this machine with that chip's compiler,
deviceless (`jaxnorm.aot`). Nothing is allocated: the model is built with
`nnx.eval_shape`, the state and the batch are `jax.ShapeDtypeStruct`s with
their shardings on the topology's mesh, and no data is read (the language
models' vocabulary is ``--vocab-size`` where token data sets it, else the
byte vocabulary of the bundled corpora and text files).

`compile_plan` returns a `Plan`: per device, the parameters and optimizer
state (summed from the abstract shapes and shardings), the rest of the
arguments, the compiler's temporaries and generated code
(``compiled.memory_analysis()``), against the chip's HBM; flops and bytes
per step (``compiled.cost_analysis()``, which XLA:GPU does not give without
a device); and a model count of ``6 * params * tokens`` flops from which the
step time at `MFU` and tokens per second are predicted. `format_plan`
renders it and `verdict` says why it does not fit. A TPU compile that runs
out of HBM (``RESOURCE_EXHAUSTED``) is a plan that does not fit, with the
compiler's count of what it needed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxnorm import aot, sharding
from jaxnorm import nn as jaxnorm_nn
from jaxnorm.nn import model_registry
from jaxnorm.training import build, trainer
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

# The model flops utilization the step time and tokens/s are predicted at.
MFU = 0.4
# Chips per host (VM) of v5e, v6e and v5p pods, as the deviceless TPU
# topologies number their processes; a GPU topology is one host's GPUs.
TPU_CHIPS_PER_HOST = 4
# Models planned without their data: the text models (byte vocabulary).
PLANNED_MODELS: tuple[str, ...] = tuple(
  name for name, s in model_registry.MODELS.items() if s.data == "text"
)
NO_GPU_COST = "n/a (XLA:GPU reports no cost analysis without a device)"


@dataclasses.dataclass(frozen=True)
class Plan:
  """A compiled (or refused) training step: per-device memory and compute.

  Byte counts are per device. After an out-of-memory error (``oom``)
  ``temp_bytes`` is the compiler's count of the temporaries it needed
  (``None`` if its message gave none), and ``code_bytes`` and
  ``unaliased_out_bytes`` are ``None``.

  Attributes:
    topology: the topology name (``"v5e:4x4"``).
    chip: its `jaxnorm.aot.Chip`.
    mesh: devices along ``data``, ``fsdp`` and ``tensor``.
    hosts: hosts the devices are spread over.
    model: the runner's model name.
    num_params: parameters of the model.
    param_dtype: their storage dtype.
    batch_size: rows per step (all hosts).
    tokens: tokens per step (all hosts).
    params_bytes: the parameters' bytes on one device.
    opt_bytes: the optimizer state's bytes on one device.
    other_bytes: the step's other arguments on one device (counters, EMA,
      model state, the batch), with the compiler's tiling padding.
    temp_bytes: the compiler's temporaries (activations kept for the
      backward pass, gradients, gathered weights, workspace).
    code_bytes: generated code.
    unaliased_out_bytes: outputs that do not reuse a donated argument's
      buffer (the metrics).
    flops: XLA's flops of one step on one device, ``None`` if not given.
    bytes_accessed: XLA's memory traffic of one step on one device.
    compile_seconds: building, lowering and compiling on this machine.
    oom: the compiler ran out of HBM (``RESOURCE_EXHAUSTED``).
    remat: the run's ``--remat`` (what the temporaries keep).
  """

  topology: str
  chip: aot.Chip
  mesh: tuple[int, int, int]
  hosts: int
  model: str
  num_params: int
  param_dtype: str
  batch_size: int
  tokens: int
  params_bytes: int
  opt_bytes: int
  other_bytes: int
  temp_bytes: int | None
  code_bytes: int | None
  unaliased_out_bytes: int | None
  flops: float | None
  bytes_accessed: float | None
  compile_seconds: float
  oom: bool = False
  remat: str = "none"

  @property
  def devices(self) -> int:
    """Devices of the mesh (all of the topology's)."""
    return math.prod(self.mesh)

  @property
  def total_bytes(self) -> int:
    """Bytes per device the step needs (a lower bound after an OOM)."""
    parts = (self.temp_bytes, self.code_bytes, self.unaliased_out_bytes)
    known = self.params_bytes + self.opt_bytes + self.other_bytes
    return known + sum(p or 0 for p in parts)

  @property
  def fits(self) -> bool:
    """Whether the step fits in one device's HBM."""
    return not self.oom and self.total_bytes <= self.chip.hbm_bytes

  @property
  def model_flops(self) -> float:
    """The model count of one step's flops, ``6 * params * tokens``."""
    return 6.0 * self.num_params * self.tokens


def _on_mesh(state: Any, mesh: jax.sharding.Mesh) -> Any:
  """Abstract ``state`` sharded as its logical names say under the rules."""
  return jax.tree.map(
    lambda s, spec: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=NamedSharding(mesh, spec)
    ),
    state,
    nnx.get_partition_spec(state),
    is_leaf=lambda x: isinstance(x, P),
  )


def _device_bytes(tree: Any) -> int:
  """Bytes of one device's shard of every leaf of an abstract tree."""
  return sum(
    math.prod(s.sharding.shard_shape(s.shape)) * np.dtype(s.dtype).itemsize
    for s in jax.tree.leaves(tree)
    if not jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key)
  )


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _oom_temporaries(message: str) -> int | None:
  """The temporaries an XLA:TPU out-of-memory message says it needed.

  The message reads "... the total memory required for HLO temporaries
  (456.10G) exceeds available HBM (15.75G) ..." (binary units).
  """
  m = re.search(r"HLO temporaries \(([\d.]+)([KMGT]?)\)", message)
  return None if m is None else int(float(m.group(1)) * _UNITS[m.group(2)])


def compile_plan(cfg: config_lib.TrainConfig, topology: str) -> Plan:
  """Builds and compiles ``cfg``'s training step for ``topology``.

  Call `jaxnorm.aot.setup_environment` before JAX starts a backend.

  Args:
    cfg: the run configuration; ``mesh`` must use all of the topology's
      devices and ``model`` be one of `PLANNED_MODELS`.
    topology: a `jaxnorm.aot.topology` name (``"v5e:4x4"``, ``"h100:8"``).

  Returns:
    The `Plan`.

  Raises:
    ValueError: for an invalid config, mesh or topology, or a model that
      is not planned.
    ModuleNotFoundError: when the aot extra is missing.
  """
  config_lib.validate(cfg, build.registries_for(cfg), topology=topology)
  if cfg.model not in PLANNED_MODELS:
    raise ValueError(
      f"plan: --compile-only plans the models {', '.join(PLANNED_MODELS)} "
      f"(their inputs need no data), got --model {cfg.model}"
    )
  cfg = config_lib.resolve(cfg)
  chip, _ = aot.parse(topology)
  devices = list(aot.topology(topology).devices.flat)
  mesh = sharding.make_mesh(cfg.mesh, devices=devices)
  vocab_size = cfg.vocab_size or data_lib.BYTE_VOCAB
  data = {"vocab_size": vocab_size, "max_len": cfg.seq_len}
  base_key = jax.random.key(cfg.seed)  # On the host, not on the topology.
  began = time.perf_counter()
  with (
    jax.set_mesh(mesh),
    nnx.logical_axis_rules(sharding.DEFAULT_RULES),
    jax.numpy_dtype_promotion("standard"),
  ):
    model = nnx.eval_shape(
      lambda: build.build_model(cfg, data, rngs=nnx.Rngs(cfg.seed))
    )
    graphdef, *parts = nnx.split(model, nnx.Param, jaxnorm_nn.BackwardStat, ...)
    params, backward, rest = (_on_mesh(p, mesh) for p in parts)
    tx = trainer.make_optimizer(cfg, model, params)
    state = trainer.init_state(cfg, params, backward, rest, tx, mesh)
    step = trainer.make_train_step(
      cfg,
      graphdef,
      tx,
      trainer.lr_schedule(cfg),
      base_key,
      "lm",
      jax.tree.map(lambda s: s.sharding, state),
    )
    batch = jax.ShapeDtypeStruct(
      (cfg.batch_size, cfg.seq_len + 1),
      jnp.int32,
      sharding=trainer.batch_sharding(mesh),
    )
    scale = jax.ShapeDtypeStruct(
      (), jnp.float32, sharding=NamedSharding(mesh, P())
    )
    lowered = step.lower(state, batch, scale)
    try:
      compiled, oom = lowered.compile(), None
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      compiled, oom = None, str(e)
  params_bytes = _device_bytes(state["params"])
  opt_bytes = _device_bytes(state["opt_state"])
  common = {
    "topology": topology,
    "chip": chip,
    "mesh": cfg.mesh,
    "hosts": (
      max(1, len(devices) // TPU_CHIPS_PER_HOST)
      if chip.platform == "tpu"
      else 1
    ),
    "model": cfg.model,
    "num_params": sum(math.prod(p.shape) for p in jax.tree.leaves(params)),
    "param_dtype": cfg.param_dtype,
    "remat": cfg.remat,
    "batch_size": cfg.batch_size,
    "tokens": cfg.batch_size * cfg.seq_len,
    "params_bytes": params_bytes,
    "opt_bytes": opt_bytes,
    "compile_seconds": time.perf_counter() - began,
  }
  if compiled is None:
    others = [v for k, v in state.items() if k not in ("params", "opt_state")]
    return Plan(
      **common,
      other_bytes=_device_bytes([others, batch, scale]),
      temp_bytes=_oom_temporaries(oom),
      code_bytes=None,
      unaliased_out_bytes=None,
      flops=None,
      bytes_accessed=None,
      oom=True,
    )
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  return Plan(
    **common,
    other_bytes=memory.argument_size_in_bytes - params_bytes - opt_bytes,
    temp_bytes=memory.temp_size_in_bytes,
    code_bytes=memory.generated_code_size_in_bytes,
    unaliased_out_bytes=(
      memory.output_size_in_bytes - memory.alias_size_in_bytes
    ),
    flops=cost.get("flops"),
    bytes_accessed=cost.get("bytes accessed"),
  )


def _bytes(n: float) -> str:
  """``"3.47 GiB"`` from 1 GiB up, else ``"96.7 MiB"``."""
  return (
    f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"
  )


def _time(seconds: float) -> str:
  if seconds >= 1:
    return f"{seconds:.2f} s"
  return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else "< 1 ms"


def _remedies(plan: Plan) -> str:
  """What would shrink the per-device footprint, for the refusal line.

  Smaller activations help only when the state alone fits; rematerializing
  every layer (``--remat full``) keeps the least of them.
  """
  fixes = []
  state = plan.params_bytes + plan.opt_bytes + plan.other_bytes
  if state < plan.chip.hbm_bytes and plan.remat != "full":
    fixes.append("--remat full")
  if plan.mesh[1] < plan.devices:
    fixes.append("a larger fsdp axis of --mesh")
  if state < plan.chip.hbm_bytes:
    if plan.batch_size > plan.mesh[0] * plan.mesh[1]:
      fixes.append("a smaller --batch-size")
    fixes.append("a smaller --seq-len")
  if plan.param_dtype == "float32":
    fixes.append("--param-dtype bfloat16")
  fixes += ["a smaller model", "a topology with more chips"]
  return ", ".join(fixes[:-1]) + " or " + fixes[-1]


def verdict(plan: Plan) -> str | None:
  """The one-line refusal of a plan that does not fit; ``None`` if it fits.

  Example: ``does not fit: needs 41.2 GiB of HBM per device, v5e has 16.00
  GiB; try a larger fsdp axis of --mesh or ...``.
  """
  if plan.fits:
    return None
  hbm = f"{plan.chip.name} has {_bytes(plan.chip.hbm_bytes)}"
  if plan.oom and plan.temp_bytes is None:
    need = (
      f"the {plan.chip.name} compiler ran out of HBM (RESOURCE_EXHAUSTED); "
      f"parameters and optimizer state alone need "
      f"{_bytes(plan.params_bytes + plan.opt_bytes)} per device, {hbm}"
    )
  else:
    need = f"needs {_bytes(plan.total_bytes)} of HBM per device, {hbm}"
  return f"does not fit: {need}; try {_remedies(plan)}"


def format_plan(plan: Plan) -> str:
  """The plan as a table: memory per device, compute per step, input.

  Memory rows give bytes per device and their share of the chip's HBM.
  Step times divide flops by the mesh's peak flops: at peak with XLA's
  count where the compiler gives one (else the model's), at `MFU` with the
  model count, as MFU is defined; tokens per second are at `MFU`. The last
  rows say how many batch rows each host loads per step.
  """
  chip, hbm = plan.chip, plan.chip.hbm_bytes
  stopped = "the compiler stopped out of memory"
  rows: list[tuple[str, str, str]] = [("memory per device", "", "of HBM")]

  def memory(label: str, n: int | None, note: str = "") -> None:
    if n is None:
      rows.append((f"  {label}", "n/a", f"({stopped})"))
    else:
      share = f"{100 * n / hbm:5.1f}%"
      rows.append((f"  {label}", _bytes(n), f"{share} {note}".rstrip()))

  memory("parameters", plan.params_bytes)
  memory("optimizer state", plan.opt_bytes)
  memory("other arguments (batch, counters, tiling)", plan.other_bytes)
  memory(
    f"temporaries (activations, grads; --remat {plan.remat})",
    plan.temp_bytes,
    "(the compiler's count when it stopped)" if plan.oom else "",
  )
  memory("generated code", plan.code_bytes)
  memory("outputs beyond the donated state", plan.unaliased_out_bytes)
  verdict_text = "fits" if plan.fits else "does not fit"
  memory(
    "total (at least)" if plan.oom else "total",
    plan.total_bytes,
    f"of {_bytes(hbm)}: {verdict_text}",
  )
  peak = plan.devices * chip.peak_flops
  model = plan.model_flops
  rows.append(("compute per step", "", ""))
  if plan.flops is None:
    if chip.platform == "gpu":
      rows.append(("  flops (XLA, all devices)", NO_GPU_COST, ""))
    else:
      rows.append(("  flops (XLA, all devices)", "n/a", f"({stopped})"))
    rows.append(("  bytes accessed (XLA, per device)", "n/a", ""))
    counted, source = model, "model flops"
  else:
    traffic = plan.bytes_accessed or 0.0
    rows.append(
      (
        "  flops (XLA, all devices)",
        f"{plan.flops * plan.devices:.3g}",
        f"{plan.flops:.3g} per device",
      )
    )
    rows.append(
      (
        "  bytes accessed (XLA, per device)",
        _bytes(traffic),
        f"{_time(traffic / chip.hbm_bandwidth)} at "
        f"{chip.hbm_bandwidth / 1e9:,.0f} GB/s",
      )
    )
    counted, source = plan.flops * plan.devices, "XLA flops"
  rows += [
    ("  model flops (6 x params x tokens)", f"{model:.3g}", "a model"),
    (
      "  step time at peak",
      _time(counted / peak),
      f"{source}, {chip.peak_flops / 1e12:,.0f} Tflop/s per chip",
    ),
    (f"  step time at {MFU:.0%} MFU", _time(model / (MFU * peak)), ""),
    (
      f"  tokens/s at {MFU:.0%} MFU",
      f"{plan.tokens * MFU * peak / model:,.0f}",
      "",
    ),
    ("input per step", "", ""),
    ("  tokens", f"{plan.tokens:,}", f"{plan.batch_size:,} rows"),
  ]
  if plan.hosts == 1:
    rows.append(("  rows each host loads", f"{plan.batch_size:,}", "one host"))
  elif plan.batch_size % plan.hosts:
    rows.append(
      (
        "  rows each host loads",
        "n/a",
        f"--batch-size {plan.batch_size} does not split over {plan.hosts} "
        f"hosts",
      )
    )
  else:
    rows.append(
      (
        "  rows each host loads",
        f"{plan.batch_size // plan.hosts:,}",
        f"{plan.hosts} hosts of {TPU_CHIPS_PER_HOST} chips (assumed)",
      )
    )
  mesh = ",".join(map(str, plan.mesh))
  done = "stopped out of memory" if plan.oom else "compiled"
  head = [
    f"compile-only plan: --model {plan.model}, {plan.num_params:,} "
    f"parameters ({plan.param_dtype}) on {plan.topology} ({plan.devices} x "
    f"{chip.device_kind}), --mesh {mesh} (data,fsdp,tensor)",
    f"{done} in {plan.compile_seconds:.1f} s on this machine, deviceless",
    "",
  ]
  label = max(len(r[0]) for r in rows)
  value = max(len(r[1]) for r in rows if r[1] != NO_GPU_COST)
  body = [f"{a:<{label}}  {b:>{value}}  {c}".rstrip() for a, b, c in rows]
  return "\n".join(head + body)
