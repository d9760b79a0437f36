"""Run configuration: one frozen dataclass and its checks.

Every field of `TrainConfig` is a command-line flag of ``jaxnorm-train``
(``--norm seednorm``, ``--mesh 2,1,4``, ``--no-resume``) and a key of a
config file (``--config run.toml``, TOML or JSON). The file may be flat or
grouped in the sections of `GROUPS` (``[model]``, ``[data]``, ``[optim]``,
``[run]``); flags given on the command line override the file (the
parsing is `jaxnorm.training.flags`). `validate`
checks names, numbers, shapes and the mesh against the registries and the
visible devices (or, for a compile-only plan, the topology's) before anything
is built or compiled, and every message lists the valid choices. `drift`
compares a resumed run's config with the one saved beside its checkpoints.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import pathlib
import types
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from jaxnorm import aot
from jaxnorm.nn import layers, model_registry
from jaxnorm.nn import residual as nn_residual
from jaxnorm.training import corpora, graph_data
from jaxnorm.training import data as data_lib

MODELS: tuple[str, ...] = model_registry.MODEL_NAMES
# The datasets of each data kind a model takes (`ModelSpec.data`).
DATASETS: types.MappingProxyType = types.MappingProxyType(
  {
    "text": data_lib.TEXT_CORPORA,
    "images": data_lib.IMAGE_DATASETS,
    "graphs": graph_data.GRAPH_DATASETS,
  }
)
MODEL_DATA: types.MappingProxyType = types.MappingProxyType(
  {name: DATASETS[s.data] for name, s in model_registry.MODELS.items()}
)
# The positional encodings each model takes, its own default first; models
# not listed have none and ignore the field.
MODEL_POSITIONAL: types.MappingProxyType = types.MappingProxyType(
  {
    name: s.positional
    for name, s in model_registry.MODELS.items()
    if s.positional
  }
)
POSITIONAL: tuple[str, ...] = (
  "auto",
  *dict.fromkeys(p for ps in MODEL_POSITIONAL.values() for p in ps),
)
GRAPHS: tuple[str, ...] = ("sparse", "full")
# Models whose layers can be scanned (their config has ``scan_layers``).
SCANNED_MODELS: tuple[str, ...] = tuple(
  n
  for n, s in model_registry.MODELS.items()
  if "scan_layers" in {f.name for f in dataclasses.fields(s.config)}
)
# Models with attention heads (width and the tensor mesh axis must suit
# them).
_HEADED = tuple(n for n, s in model_registry.MODELS.items() if s.heads)
DTYPES: tuple[str, ...] = ("float32", "bfloat16")
SCHEDULES: tuple[str, ...] = ("cosine", "wsd", "constant")
NONFINITE: tuple[str, ...] = ("stop", "skip")

Kwargs = tuple[tuple[str, Any], ...]
# The fields of keyword arguments, a JSON object each on the command line.
KWARGS_FIELDS: tuple[str, ...] = (
  "norm_kwargs",
  "attention_kwargs",
  "optimizer_kwargs",
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run. Defaults: a byte-level LM on Shakespeare (~2 min CPU).

  Attributes:
    model: ``lm`` (decoder LM), ``vit``, ``cnn`` (ResNet-style), ``mlp``
      (self-normalizing MLP), ``graph`` (Graph Transformer, node
      classification), ``clm`` (complex LM, `jaxnorm.nn.cplx.ComplexLM`)
      or ``cvcnn`` (complex CNN, `jaxnorm.nn.cplx.CVCNN`): the names of
      `jaxnorm.nn.model_registry.MODELS` (a real part name such as
      ``rmsnorm`` stands for its complex counterpart, the spec's
      ``counterparts``).
    data: ``shakespeare`` or ``kjv`` for ``lm`` and ``clm``, or the PATH
      of your own text: a text file or folder of text files (bytes), or a
      folder of token shards train*.bin and val*.bin (nanoGPT's layout) or
      of ArrayRecord files train*.array_record and val*.array_record, with
      ``vocab_size`` (`jaxnorm.training.corpora`); ``fashion_mnist`` or
      ``digits`` for the image models and ``cvcnn``; ``pattern`` or
      ``cluster`` (SBM graphs generated offline and cached in
      ``out_dir/data``) for ``graph``.
    norm: a name of `jaxnorm.nn.NORMS`.
    attention: an attention variant name (LM and ViT).
    residual: a residual scheme name.
    activation: an activation name.
    positional: ``auto`` (the model's own: ``learned`` for the LM, ``lap``
      for the graph model), ``learned``, ``rope`` or ``none`` (LM); ``lap``
      (Laplacian eigenvectors with random sign flips) or ``none`` (graph).
    norm_kwargs: extra keyword arguments of every norm, ``(name, value)``
      pairs (a JSON object on the command line).
    attention_kwargs: extra keyword arguments of every attention layer.
    allow_batch_stats: admit norms that take batch statistics in training
      mode (BatchNorm, PowerNorm, ...) in the causal LM, where position t
      then sees later tokens of the batch.
    width: model width (embedding / channels).
    depth: number of blocks.
    num_heads: attention heads.
    graph: graph model attention: ``sparse`` (neighbours) or ``full``
      (every other node of the graph).
    pe_dim: Laplacian encodings of the graph model; 0 takes the official
      config's (PATTERN 2, CLUSTER 10).
    edge_features: the graph model's edge stream (edge input 1).
    logit_clip: clamp of the graph attention logits (official code 5);
      None for none.
    graph_sizes: train, val and test graph counts of the graph data; empty
      for the benchmark's (10000, 2000, 2000 for PATTERN; 10000, 1000,
      1000 for CLUSTER). PATTERN draws ``min(100, gcd(sizes))`` patterns.
    graph_blocks: ``size_min,size_max`` of the SBM blocks and patterns
      (exclusive maximum); empty for the benchmark's 5,35.
    dtype: compute dtype (``float32`` or ``bfloat16``).
    param_dtype: storage dtype of the parameters (cast to ``dtype`` at use).
    remat: the `jax.checkpoint` policy every layer runs under
      (`jaxnorm.nn.layers.REMAT_CHOICES`): ``none`` keeps every
      activation for the backward pass, ``full`` recomputes each layer,
      ``dots`` / ``dots_no_batch`` keep the matrix products (those without
      batch dimensions). Same parameters and results (to float32
      rounding) for every value; a resume may change it.
    scan_layers: stack the layers on a leading ``layers`` axis and run them
      with ``nnx.scan`` (``lm`` and ``vit``): compile time flat in depth.
      A resume may change it (the checkpoint's layout is converted).
    seq_len: tokens per training window (LM).
    vocab_size: vocabulary of token-shard or ArrayRecord data (the model's
      vocabulary follows it); 0 for text, read as bytes (256).
    token_dtype: how token ids are stored: ``uint16``, ``uint32`` or
      ``auto`` (uint16 when ``vocab_size`` <= 65536, else uint32).
    data_workers: grain worker processes that read and batch the training
      data; 0 reads in the training process (with prefetch threads).
    batch_size: batch size of one step (global, over all devices).
    seed: seeds parameters, data order and dropout.
    optimizer: an optimizer name of `jaxnorm.training.optimizers`.
    learning_rate: peak learning rate.
    schedule: ``cosine`` (linear warmup, cosine decay to 10%), ``wsd``
      (warmup, stable, linear decay to 0 over the last 20% of updates) or
      ``constant`` (warmup, then constant).
    warmup_steps: linear warmup length, in optimizer updates.
    weight_decay: decoupled weight decay (on matrices; see the README's
      decay table).
    clip_norm: global gradient-norm clipping threshold; 0 turns it off.
    b1: first-moment (momentum) coefficient; None keeps the optimizer's.
    b2: second-moment coefficient; None keeps the optimizer's.
    optimizer_kwargs: further keyword arguments of the optimizer (e.g.
      Conda's ``update_proj_gap``), the names of
      `jaxnorm.training.optimizers.options`.
    grad_accum: batches accumulated into one update (`optax.MultiSteps`);
      ``steps`` counts batches, so a run makes ``steps / grad_accum``
      updates and the schedule runs over updates.
    ema_decay: keep an exponential moving average of the weights with this
      decay and evaluate with it; 0 turns it off.
    nonfinite: on a non-finite loss or gradient, ``stop`` the run (the
      state and checkpoints stay those of the last good step) or ``skip``
      the step (no update; counted in ``skipped``).
    steps: training steps (batches).
    eval_every: steps between evaluations (and at the end).
    eval_batches: evaluation batches.
    log_every: steps between metric records.
    checkpoint_every: steps between checkpoints (and at the end).
    keep_checkpoints: checkpoints kept on disk.
    mesh: devices along the ``data``, ``fsdp`` and ``tensor`` mesh axes;
      a run may resume on another mesh.
    out_dir: run directory (metrics, plots, checkpoints).
    resume: continue from the latest checkpoint in ``out_dir`` if any;
      ``False`` moves an earlier run aside to ``out_dir/previous-N``.
    allow_change: fields a resumed run may change from the saved config.
    progress: show a progress bar.
    profile_steps: ``(first, last)`` steps to trace with `jax.profiler`
      into ``out_dir/profile``; empty for none.
    tensorboard: also write TensorBoard scalars to ``out_dir/tensorboard``
      (needs the ``tensorboardX`` package).
    process_logs: every process also writes its own metrics to
      ``out_dir/metrics.processN.jsonl`` (process 0 always writes
      ``metrics.jsonl``, the run's log).
  """

  model: str = "lm"
  data: str = "shakespeare"
  norm: str = "rmsnorm"
  attention: str = "softmax"
  residual: str = "prenorm"
  activation: str = "gelu"
  positional: str = "auto"
  norm_kwargs: Kwargs = ()
  attention_kwargs: Kwargs = ()
  allow_batch_stats: bool = False
  width: int = 128
  depth: int = 4
  num_heads: int = 4
  graph: str = "sparse"
  pe_dim: int = 0
  edge_features: bool = False
  logit_clip: float | None = None
  graph_sizes: tuple[int, ...] = ()
  graph_blocks: tuple[int, ...] = ()
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = False
  seq_len: int = 128
  vocab_size: int = 0
  token_dtype: str = "auto"
  data_workers: int = 0
  batch_size: int = 16
  seed: int = 0
  optimizer: str = "adamw"
  learning_rate: float = 3e-3
  schedule: str = "cosine"
  warmup_steps: int = 50
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  b1: float | None = None
  b2: float | None = None
  optimizer_kwargs: Kwargs = ()
  grad_accum: int = 1
  ema_decay: float = 0.0
  nonfinite: str = "stop"
  steps: int = 500
  eval_every: int = 100
  eval_batches: int = 8
  log_every: int = 10
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  mesh: tuple[int, int, int] = (1, 1, 1)
  out_dir: str = "runs/default"
  resume: bool = True
  allow_change: tuple[str, ...] = ()
  progress: bool = True
  profile_steps: tuple[int, ...] = ()
  tensorboard: bool = False
  process_logs: bool = False


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig))

# Config-file sections and --help groups; every field is in exactly one.
GROUPS: types.MappingProxyType = types.MappingProxyType(
  {
    "model": (
      "model",
      "norm",
      "attention",
      "residual",
      "activation",
      "positional",
      "norm_kwargs",
      "attention_kwargs",
      "allow_batch_stats",
      "width",
      "depth",
      "num_heads",
      "graph",
      "pe_dim",
      "edge_features",
      "logit_clip",
      "dtype",
      "param_dtype",
      "remat",
      "scan_layers",
    ),
    "data": (
      "data",
      "seq_len",
      "vocab_size",
      "token_dtype",
      "data_workers",
      "batch_size",
      "seed",
      "graph_sizes",
      "graph_blocks",
    ),
    "optim": (
      "optimizer",
      "learning_rate",
      "schedule",
      "warmup_steps",
      "weight_decay",
      "clip_norm",
      "b1",
      "b2",
      "optimizer_kwargs",
      "grad_accum",
      "ema_decay",
      "nonfinite",
    ),
    "run": (
      "steps",
      "eval_every",
      "eval_batches",
      "log_every",
      "checkpoint_every",
      "keep_checkpoints",
      "mesh",
      "out_dir",
      "resume",
      "allow_change",
      "progress",
      "profile_steps",
      "tensorboard",
      "process_logs",
    ),
  }
)

# Fields that change where and how a run is executed or watched, not what
# it computes: a resume may change them freely (another mesh reshards, a
# scanned run converts the checkpoint's layer layout).
RUN_CONTROL: frozenset[str] = (
  frozenset(GROUPS["run"]) - {"steps", "eval_batches", "log_every"}
) | {"data_workers", "remat", "scan_layers"}

# Fields that shape the saved state (model, data sizes, optimizer state): a
# resume cannot change them.
STRUCTURAL: frozenset[str] = (
  frozenset(GROUPS["model"]) - {"dtype", "allow_batch_stats"} - RUN_CONTROL
) | {
  "data",
  "seq_len",
  "vocab_size",
  "token_dtype",
  "optimizer",
  "optimizer_kwargs",
  "grad_accum",
  "ema_decay",
  "graph_sizes",
  "graph_blocks",
}

_POSITIVE_INTS = (
  "width",
  "depth",
  "num_heads",
  "seq_len",
  "batch_size",
  "steps",
  "eval_every",
  "eval_batches",
  "checkpoint_every",
  "keep_checkpoints",
  "log_every",
  "grad_accum",
)


def flag(field: str) -> str:
  """The command-line flag of ``field`` (``--learning-rate``)."""
  return "--" + field.replace("_", "-")


def _choice(field: str, value: str, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ValueError(
      f"TrainConfig: {flag(field)} {value!r} is not valid; choose one of "
      f"{', '.join(choices)}"
    )


def _number(field: str, value: Any, low: float, high: float, closed: bool):
  """Checks ``low <= value < high`` (``<= high`` when ``closed``)."""
  ok = (
    isinstance(value, int | float)
    and not isinstance(value, bool)
    and math.isfinite(value)
    and low <= value
    and (value <= high if closed else value < high)
  )
  if not ok:
    bound = "]" if closed else ")"
    raise ValueError(
      f"TrainConfig: {flag(field)} must be a finite number in "
      f"[{low:g}, {high:g}{bound}, got {value!r}"
    )


def valid_meshes(cfg: TrainConfig, devices: int) -> list[tuple[int, int, int]]:
  """Meshes over all ``devices`` that this config's sizes can use."""
  out = []
  for d, f in itertools.product(range(1, devices + 1), repeat=2):
    t, rest = divmod(devices, d * f)
    if rest or t < 1 or cfg.batch_size % (d * f) or cfg.width % t:
      continue
    if cfg.model in _HEADED and cfg.num_heads % t:
      continue
    out.append((d, f, t))
  return out


def _mesh_error(
  cfg: TrainConfig, problem: str, devices: int, topology: str | None
) -> ValueError:
  meshes = valid_meshes(cfg, devices)
  where = f"all {devices} devices" + (f" of {topology}" if topology else "")
  fallback = (
    "change --batch-size, --width or --num-heads" if topology else "use 1,1,1"
  )
  hint = (
    f"valid meshes over {where} for this model: "
    + ", ".join(",".join(map(str, m)) for m in meshes[:6])
    if meshes
    else f"no mesh over {where} fits this model; {fallback}"
  )
  return ValueError(f"TrainConfig: {problem}; {hint}")


def resolve(cfg: TrainConfig) -> TrainConfig:
  """``cfg`` with ``positional="auto"`` replaced by its model's default.

  The LM's default is ``learned``, the graph model's ``lap``; models without
  positional encodings keep ``auto`` (they ignore the field).
  """
  if cfg.positional != "auto" or cfg.model not in MODEL_POSITIONAL:
    return cfg
  return dataclasses.replace(cfg, positional=MODEL_POSITIONAL[cfg.model][0])


def _validate_graph(cfg: TrainConfig) -> None:
  """The graph model's fields (other models ignore them)."""
  _choice("graph", cfg.graph, GRAPHS)
  if not isinstance(cfg.pe_dim, int) or cfg.pe_dim < 0:
    raise ValueError(
      f"TrainConfig: --pe-dim must be >= 0 (0: the dataset's official "
      f"size), got {cfg.pe_dim!r}"
    )
  if cfg.logit_clip is not None:
    _number("logit_clip", cfg.logit_clip, 0.0, math.inf, False)
    if cfg.logit_clip == 0:
      raise ValueError("TrainConfig: --logit-clip must be > 0 or none, got 0")
  sizes, blocks = cfg.graph_sizes, cfg.graph_blocks
  if sizes and (len(sizes) != 3 or min(sizes) <= 0):
    raise ValueError(
      f"TrainConfig: --graph-sizes takes three positive graph counts "
      f"TRAIN,VAL,TEST (or nothing for the benchmark's), got {sizes}"
    )
  if blocks and (len(blocks) != 2 or not 0 < blocks[0] < blocks[1]):
    raise ValueError(
      f"TrainConfig: --graph-blocks takes SIZE_MIN,SIZE_MAX with 0 < "
      f"SIZE_MIN < SIZE_MAX (or nothing for the benchmark's 5,35), got "
      f"{blocks}"
    )


def _validate_data(cfg: TrainConfig) -> None:
  """``--data``: a dataset name, or for text models a PATH (`corpora`)."""
  for field in ("vocab_size", "data_workers"):
    value = getattr(cfg, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ValueError(
        f"TrainConfig: {flag(field)} must be an integer >= 0, got {value!r}"
      )
  _choice("token_dtype", cfg.token_dtype, corpora.TOKEN_DTYPES)
  names = MODEL_DATA[cfg.model]
  text = model_registry.MODELS[cfg.model].data == "text"
  if not text or cfg.data in names:
    _choice("data", cfg.data, names)
    if cfg.vocab_size:
      raise ValueError(
        f"TrainConfig: --vocab-size {cfg.vocab_size} is only for token data "
        f"(--data PATH of token shards or ArrayRecord files); --data "
        f"{cfg.data} decides its own vocabulary: drop --vocab-size"
      )
    return
  if not pathlib.Path(cfg.data).exists():
    raise ValueError(
      f"TrainConfig: {flag('data')} {cfg.data!r} is not valid; choose one of "
      f"{', '.join(names)}, or the PATH of your own data (a text file or "
      f"folder, or a folder of train*.bin/val*.bin token shards); no file "
      f"or folder {cfg.data} exists"
    )
  corpora.check(cfg.data, vocab_size=cfg.vocab_size, dtype_name=cfg.token_dtype)


def check_model(cfg: TrainConfig) -> None:
  """Refuses an unknown ``--model``, listing the valid ones."""
  _choice("model", cfg.model, MODELS)


def validate(
  cfg: TrainConfig,
  registries: Mapping[str, Sequence[str]],
  *,
  topology: str | None = None,
) -> None:
  """Checks a config before anything is built.

  Args:
    cfg: the run configuration.
    registries: valid names for ``norm``, ``attention``, ``residual``,
      ``activation`` and ``optimizer`` (from the model and optimizer
      registries).
    topology: a `jaxnorm.aot` topology name (``"v5e:4x4"``) when the run is
      compiled for it instead of run: the mesh must then use all of its
      devices, whatever this machine has.

  Raises:
    ValueError: for unknown names, bad numbers or sizes, an unknown
      topology, or an impossible mesh.
  """
  check_model(cfg)
  _validate_data(cfg)
  cfg = resolve(cfg)
  for field, names in registries.items():
    _choice(field, getattr(cfg, field), sorted(names))
  _choice("positional", cfg.positional, POSITIONAL)
  if cfg.model in MODEL_POSITIONAL and (
    cfg.positional not in MODEL_POSITIONAL[cfg.model]
  ):
    raise ValueError(
      f"TrainConfig: --positional {cfg.positional!r} is not valid for "
      f"--model {cfg.model}; choose one of "
      f"{', '.join(('auto', *MODEL_POSITIONAL[cfg.model]))}"
    )
  if cfg.model == "graph":
    _validate_graph(cfg)
  _choice("dtype", cfg.dtype, DTYPES)
  _choice("param_dtype", cfg.param_dtype, DTYPES)
  _choice("remat", cfg.remat, layers.REMAT_CHOICES)
  if cfg.scan_layers:
    _validate_scan(cfg)
  _choice("schedule", cfg.schedule, SCHEDULES)
  _choice("nonfinite", cfg.nonfinite, NONFINITE)
  for field in _POSITIVE_INTS:
    value = getattr(cfg, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(
        f"TrainConfig: {flag(field)} must be a positive integer, got {value!r}"
      )
  if not isinstance(cfg.warmup_steps, int) or cfg.warmup_steps < 0:
    raise ValueError(
      f"TrainConfig: --warmup-steps must be >= 0, got {cfg.warmup_steps}"
    )
  _number("learning_rate", cfg.learning_rate, 0.0, math.inf, False)
  if cfg.learning_rate == 0:
    raise ValueError("TrainConfig: --learning-rate must be > 0, got 0")
  _number("weight_decay", cfg.weight_decay, 0.0, math.inf, False)
  _number("clip_norm", cfg.clip_norm, 0.0, math.inf, False)
  _number("ema_decay", cfg.ema_decay, 0.0, 1.0, False)
  for field in ("b1", "b2"):
    if getattr(cfg, field) is not None:
      _number(field, getattr(cfg, field), 0.0, 1.0, False)
  if cfg.steps % cfg.grad_accum:
    raise ValueError(
      f"TrainConfig: --steps {cfg.steps} must be a multiple of "
      f"--grad-accum {cfg.grad_accum} (each update takes {cfg.grad_accum} "
      f"batches)"
    )
  for field in KWARGS_FIELDS:
    for name, _ in getattr(cfg, field):
      if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
          f"TrainConfig: {flag(field)} keys must be argument names, got "
          f"{name!r}"
        )
  unknown = sorted(set(cfg.allow_change) - set(FIELDS))
  if unknown:
    raise ValueError(
      f"TrainConfig: --allow-change names unknown fields {unknown}; valid "
      f"fields: {', '.join(sorted(set(FIELDS) - RUN_CONTROL))}"
    )
  fixed = sorted(set(cfg.allow_change) & STRUCTURAL)
  if fixed:
    raise ValueError(
      f"TrainConfig: --allow-change {','.join(fixed)}: these fields shape "
      f"the saved state and cannot change on resume; fields that can: "
      f"{', '.join(sorted(set(FIELDS) - STRUCTURAL - RUN_CONTROL))}"
    )
  if cfg.profile_steps and (
    len(cfg.profile_steps) != 2
    or not 1 <= cfg.profile_steps[0] <= cfg.profile_steps[1] <= cfg.steps
  ):
    raise ValueError(
      f"TrainConfig: --profile-steps takes FIRST,LAST with 1 <= FIRST <= "
      f"LAST <= --steps {cfg.steps}, got {cfg.profile_steps}"
    )
  if cfg.tensorboard and importlib.util.find_spec("tensorboardX") is None:
    raise ValueError(
      "TrainConfig: --tensorboard needs the tensorboardX package: pip "
      "install tensorboardX"
    )
  if cfg.model in _HEADED and cfg.width % cfg.num_heads:
    raise ValueError(
      f"TrainConfig: --num-heads {cfg.num_heads} must divide "
      f"--width {cfg.width} (head_dim = width / num_heads); "
      f"valid head counts for this width: "
      f"{', '.join(str(h) for h in _divisors(cfg.width))}"
    )
  _validate_mesh(cfg, topology)


def _validate_scan(cfg: TrainConfig) -> None:
  """``--scan-layers``: a model with a scanned stack, a scannable scheme."""
  if cfg.model not in SCANNED_MODELS:
    raise ValueError(
      f"TrainConfig: --scan-layers is supported by --model "
      f"{', '.join(SCANNED_MODELS)}, not {cfg.model!r}; drop --scan-layers"
    )
  spec = nn_residual.RESIDUALS.get(cfg.residual)
  if spec is not None and not spec.scannable:
    raise ValueError(
      f"TrainConfig: --residual {cfg.residual} cannot be scanned "
      f"({spec.scan_refusal}); drop --scan-layers or choose one of "
      f"{', '.join(nn_residual.SCAN_RESIDUALS)}"
    )


def _validate_mesh(cfg: TrainConfig, topology: str | None) -> None:
  if len(cfg.mesh) != 3 or any(
    not isinstance(m, int) or m <= 0 for m in cfg.mesh
  ):
    raise ValueError(
      f"TrainConfig: --mesh must be three positive integers "
      f"data,fsdp,tensor, got {cfg.mesh}"
    )
  size = math.prod(cfg.mesh)
  mesh = ",".join(map(str, cfg.mesh))
  if topology is None:
    devices = jax.device_count()
    if size > devices:
      raise _mesh_error(
        cfg,
        f"--mesh {mesh} needs {size} devices but {devices} are available "
        f"(simulate CPU devices with "
        f"XLA_FLAGS=--xla_force_host_platform_device_count=N)",
        devices,
        topology,
      )
  else:
    devices = math.prod(aot.parse(topology)[1])
    if size != devices:
      raise _mesh_error(
        cfg,
        f"--mesh {mesh} uses {size} devices but --topology {topology} has "
        f"{devices}; a plan uses them all",
        devices,
        topology,
      )
  batch_shards = cfg.mesh[0] * cfg.mesh[1]
  if cfg.batch_size % batch_shards:
    raise _mesh_error(
      cfg,
      f"--batch-size {cfg.batch_size} must be divisible by data*fsdp = "
      f"{batch_shards}",
      devices,
      topology,
    )
  tensor = cfg.mesh[2]
  if cfg.model in _HEADED and cfg.num_heads % tensor:
    raise _mesh_error(
      cfg,
      f"the tensor mesh axis ({tensor}) must divide --num-heads "
      f"{cfg.num_heads}",
      devices,
      topology,
    )
  if cfg.width % tensor:
    raise _mesh_error(
      cfg,
      f"the tensor mesh axis ({tensor}) must divide --width {cfg.width}",
      devices,
      topology,
    )


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def to_json(cfg: TrainConfig) -> dict[str, Any]:
  """The config as plain JSON values (tuples become lists)."""
  return json.loads(json.dumps(dataclasses.asdict(cfg)))


def drift(saved: Mapping[str, Any], cfg: TrainConfig) -> list[str]:
  """Fields of ``cfg`` that differ from a ``saved`` `to_json` dict.

  Fields in `RUN_CONTROL` and in ``cfg.allow_change`` are not compared; a
  field missing from ``saved`` (an older runner) counts as its default.
  ``positional="auto"`` compares as the model's default (`resolve`).

  Returns:
    One ``--field old -> new`` entry per differing field.
  """
  current = to_json(resolve(cfg))
  default = to_json(resolve(TrainConfig(model=cfg.model)))
  out = []
  for field in FIELDS:
    if field in RUN_CONTROL or field in cfg.allow_change:
      continue
    old = saved.get(field, default[field])
    if old != current[field]:
      out.append(
        f"{flag(field)} {json.dumps(old)} -> {json.dumps(current[field])}"
      )
  return out
