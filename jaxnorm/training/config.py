"""Run configuration: one frozen dataclass, a typed CLI, fail-fast checks.

Every field of `TrainConfig` is a command-line flag of ``jaxnorm-train``
(``--norm seednorm``, ``--mesh 2,1,4``, ``--no-resume``). `validate` checks
names, shapes and the mesh against the registries and the visible devices
before anything is built or compiled, and every message lists the valid
choices.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any

import jax

from jaxnorm.training import data as data_lib

MODELS: tuple[str, ...] = ("lm", "vit", "cnn", "mlp")
MODEL_DATA: types.MappingProxyType = types.MappingProxyType(
  {
    "lm": data_lib.TEXT_CORPORA,
    "vit": data_lib.IMAGE_DATASETS,
    "cnn": data_lib.IMAGE_DATASETS,
    "mlp": data_lib.IMAGE_DATASETS,
  }
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run. Defaults: a byte-level LM on Shakespeare (~2 min CPU).

  Attributes:
    model: ``lm`` (decoder LM), ``vit``, ``cnn`` (ResNet-style) or ``mlp``
      (self-normalizing MLP).
    data: ``shakespeare`` or ``kjv`` for ``lm``; ``fashion_mnist`` or
      ``digits`` for the image models.
    norm: a name of `jaxnorm.nn.NORMS`.
    attention: an attention variant name (LM and ViT).
    residual: a residual scheme name.
    activation: an activation name.
    positional: ``learned``, ``rope`` or ``none`` (LM).
    optimizer: an optimizer name of `jaxnorm.training.optimizers`.
    learning_rate: peak learning rate (linear warmup, cosine decay).
    weight_decay: decoupled weight decay on matrices.
    warmup_steps: linear warmup length.
    width: model width (embedding / channels).
    depth: number of blocks.
    num_heads: attention heads.
    seq_len: tokens per training window (LM).
    batch_size: global batch size.
    steps: training steps.
    eval_every: steps between evaluations (and at the end).
    eval_batches: evaluation batches.
    checkpoint_every: steps between checkpoints (and at the end).
    keep_checkpoints: checkpoints kept on disk.
    log_every: steps between metric records.
    seed: seeds parameters, data order and dropout.
    mesh: devices along the ``data``, ``fsdp`` and ``tensor`` mesh axes.
    out_dir: run directory (metrics, plots, checkpoints).
    resume: continue from the latest checkpoint in ``out_dir`` if any.
    progress: show a progress bar.
    dtype: compute dtype (``float32`` or ``bfloat16``); params stay f32.
  """

  model: str = "lm"
  data: str = "shakespeare"
  norm: str = "rmsnorm"
  attention: str = "softmax"
  residual: str = "prenorm"
  activation: str = "gelu"
  positional: str = "learned"
  optimizer: str = "adamw"
  learning_rate: float = 3e-3
  weight_decay: float = 0.1
  warmup_steps: int = 50
  width: int = 128
  depth: int = 4
  num_heads: int = 4
  seq_len: int = 128
  batch_size: int = 16
  steps: int = 500
  eval_every: int = 100
  eval_batches: int = 8
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  log_every: int = 10
  seed: int = 0
  mesh: tuple[int, int, int] = (1, 1, 1)
  out_dir: str = "runs/default"
  resume: bool = True
  progress: bool = True
  dtype: str = "float32"


POSITIONAL: tuple[str, ...] = ("learned", "rope", "none")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")


def _choice(field: str, value: str, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ValueError(
      f"TrainConfig: --{field.replace('_', '-')} {value!r} is "
      f"not valid; choose one of {', '.join(choices)}"
    )


def validate(cfg: TrainConfig, registries: dict[str, Sequence[str]]) -> None:
  """Checks a config before anything is built.

  Args:
    cfg: the run configuration.
    registries: valid names for ``norm``, ``attention``, ``residual``,
      ``activation`` and ``optimizer`` (from the model and optimizer
      registries).

  Raises:
    ValueError: for unknown names, bad sizes or an impossible mesh.
  """
  _choice("model", cfg.model, MODELS)
  _choice("data", cfg.data, MODEL_DATA[cfg.model])
  for field, names in registries.items():
    _choice(field, getattr(cfg, field), sorted(names))
  _choice("positional", cfg.positional, POSITIONAL)
  _choice("dtype", cfg.dtype, DTYPES)
  for field in (
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
  ):
    value = getattr(cfg, field)
    if not isinstance(value, int) or value <= 0:
      raise ValueError(
        f"TrainConfig: --{field.replace('_', '-')} must be a "
        f"positive integer, got {value!r}"
      )
  if cfg.warmup_steps < 0:
    raise ValueError(
      f"TrainConfig: --warmup-steps must be >= 0, got {cfg.warmup_steps}"
    )
  if cfg.model in ("lm", "vit") and cfg.width % cfg.num_heads:
    raise ValueError(
      f"TrainConfig: --num-heads {cfg.num_heads} must divide "
      f"--width {cfg.width} (head_dim = width / num_heads); "
      f"valid head counts for this width: "
      f"{', '.join(str(h) for h in _divisors(cfg.width))}"
    )
  if len(cfg.mesh) != 3 or any(
    not isinstance(m, int) or m <= 0 for m in cfg.mesh
  ):
    raise ValueError(
      f"TrainConfig: --mesh must be three positive integers "
      f"data,fsdp,tensor, got {cfg.mesh}"
    )
  devices = jax.device_count()
  size = math.prod(cfg.mesh)
  if size > devices:
    raise ValueError(
      f"TrainConfig: --mesh {','.join(map(str, cfg.mesh))} needs {size} "
      f"devices but {devices} are available; valid meshes multiply to at "
      f"most {devices}, e.g. {devices},1,1 or 1,1,{devices} (simulate CPU "
      f"devices with XLA_FLAGS=--xla_force_host_platform_device_count=N)"
    )
  batch_shards = cfg.mesh[0] * cfg.mesh[1]
  if cfg.batch_size % batch_shards:
    raise ValueError(
      f"TrainConfig: --batch-size {cfg.batch_size} must be "
      f"divisible by data*fsdp = {batch_shards}"
    )
  tensor = cfg.mesh[2]
  if cfg.model in ("lm", "vit") and cfg.num_heads % tensor:
    raise ValueError(
      f"TrainConfig: the tensor mesh axis ({tensor}) must "
      f"divide --num-heads {cfg.num_heads}"
    )
  if cfg.width % tensor:
    raise ValueError(
      f"TrainConfig: the tensor mesh axis ({tensor}) must "
      f"divide --width {cfg.width}"
    )


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _parse_mesh(text: str) -> tuple[int, ...]:
  try:
    return tuple(int(p) for p in text.split(","))
  except ValueError as e:
    raise argparse.ArgumentTypeError(
      f"--mesh takes data,fsdp,tensor integers such as 2,1,4; got {text!r}"
    ) from e


def add_arguments(
  parser: argparse.ArgumentParser, defaults: TrainConfig = TrainConfig()
) -> None:
  """Adds one typed flag per `TrainConfig` field to ``parser``."""
  hints = typing.get_type_hints(TrainConfig)
  for field in dataclasses.fields(TrainConfig):
    flag = "--" + field.name.replace("_", "-")
    default = getattr(defaults, field.name)
    kind = hints[field.name]
    if kind is bool:
      parser.add_argument(
        flag, action=argparse.BooleanOptionalAction, default=default
      )
    elif field.name == "mesh":
      parser.add_argument(
        flag,
        type=_parse_mesh,
        default=default,
        help="devices on data,fsdp,tensor (default "
        f"{','.join(map(str, default))})",
      )
    else:
      parser.add_argument(
        flag, type=kind, default=default, help=f"(default {default})"
      )


def from_args(args: argparse.Namespace) -> TrainConfig:
  """Builds a `TrainConfig` from parsed flags."""
  values: dict[str, Any] = {
    f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
  }
  return TrainConfig(**values)
