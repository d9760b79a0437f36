"""Config values from text: flags, sweep values and config files.

`parse_value` converts a flag's text (or a config file's value) to its
`TrainConfig` field's type, `load_file` reads a TOML or JSON config file
(flat, or grouped in the sections of `config.GROUPS`), and `add_arguments`
/ `from_args` give every field a typed ``jaxnorm-train`` flag whose help
comes from the `TrainConfig` docstring and lists the valid choices.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import tomllib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from jaxnorm.nn import layers
from jaxnorm.training import config, corpora
from jaxnorm.training.config import FIELDS, GROUPS, TrainConfig


def _ints(field: str, text: str) -> tuple[int, ...]:
  """``"2,1,4"`` (or ``"2x1x4"``, for sweeps) as integers; ``""`` is ()."""
  try:
    return tuple(int(p) for p in re.split(r"[,x]", text)) if text else ()
  except ValueError as e:
    raise ValueError(
      f"{config.flag(field)} takes comma-separated integers such as 2,1,4; got "
      f"{text!r}"
    ) from e


def _kwargs(field: str, value: Any) -> config.Kwargs:
  if isinstance(value, str):
    try:
      value = json.loads(value or "{}")
    except json.JSONDecodeError as e:
      raise ValueError(
        f"{config.flag(field)} takes a JSON object such as "
        f"'{{\"eps\": 1e-5}}'; got {value!r} ({e.msg})"
      ) from e
  if isinstance(value, Sequence) and not isinstance(value, str):
    value = dict(value)
  if not isinstance(value, Mapping):
    raise ValueError(f"{config.flag(field)} takes a JSON object, got {value!r}")
  return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))


def _frozen(value: Any) -> Any:
  """JSON lists as tuples, so a config stays hashable."""
  if isinstance(value, list):
    return tuple(_frozen(v) for v in value)
  return value


def parse_value(field: str, value: Any) -> Any:
  """Converts a flag's text (or a config file's value) to ``field``'s type.

  Raises:
    ValueError: if the field is unknown or the value does not parse.
  """
  if field not in FIELDS:
    raise ValueError(
      f"TrainConfig: unknown field {field!r}; valid fields: {', '.join(FIELDS)}"
    )
  kind = typing.get_type_hints(TrainConfig)[field]
  if field in config.KWARGS_FIELDS:
    return _kwargs(field, value)
  if value is None or not isinstance(value, str):
    if isinstance(value, list):
      return tuple(value)
    numeric = isinstance(value, int) and not isinstance(value, bool)
    return float(value) if numeric and kind in (float, float | None) else value
  if kind is bool:
    if value.lower() not in ("true", "false"):
      raise ValueError(
        f"{config.flag(field)}: use true or false, got {value!r}"
      )
    return value.lower() == "true"
  if field == "allow_change":
    return tuple(p.replace("-", "_") for p in value.split(",") if p)
  if kind in (tuple[int, int, int], tuple[int, ...]):
    return _ints(field, value)
  if kind == float | None:
    return None if value.lower() == "none" else float(value)
  try:
    return kind(value)
  except ValueError as e:
    raise ValueError(
      f"{config.flag(field)} takes {kind.__name__}, got {value!r}"
    ) from e


def load_file(path: str | pathlib.Path) -> dict[str, Any]:
  """Reads a TOML or JSON config file into ``{field: value}``.

  Keys are field names (``learning_rate`` or ``learning-rate``), at the top
  level or inside the sections of `GROUPS`.

  Raises:
    ValueError: for an unreadable file, an unknown section or field, or a
      value of the wrong type.
  """
  path = pathlib.Path(path)
  try:
    text = path.read_text()
    raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
  except (OSError, ValueError) as e:
    raise ValueError(f"--config {path}: cannot read it ({e})") from e
  flat: dict[str, Any] = {}
  for key, value in raw.items():
    key = key.replace("-", "_")
    if key in GROUPS and isinstance(value, Mapping):
      for name, item in value.items():
        name = name.replace("-", "_")
        if name not in GROUPS[key]:
          raise ValueError(
            f"--config {path}: [{key}] has no field {name!r}; its fields: "
            f"{', '.join(GROUPS[key])}"
          )
        flat[name] = parse_value(name, item)
    elif key in FIELDS:
      flat[key] = parse_value(key, value)
    else:
      raise ValueError(
        f"--config {path}: unknown key {key!r}; use sections "
        f"{', '.join(GROUPS)} or the fields {', '.join(FIELDS)}"
      )
  return flat


# ---------------------------------------------------------------------------
# The command line.


def field_docs() -> dict[str, str]:
  """Each field's description, from the `TrainConfig` docstring."""
  docs: dict[str, str] = {}
  lines = (TrainConfig.__doc__ or "").split("Attributes:")[1].splitlines()
  name = None
  for line in lines:
    head, sep, text = line.strip().partition(": ")
    if (
      sep
      and head in FIELDS
      and line.startswith("    ")
      and not (line.startswith("      "))
    ):
      name = head
      docs[name] = text
    elif name and line.strip():
      docs[name] += " " + line.strip()
  return docs


def _help(
  field: str, doc: str, default: Any, choices: Sequence[str] | None
) -> str:
  shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
  if field in config.KWARGS_FIELDS:
    shown = json.dumps(dict(default))
  doc = doc.replace("`", "").rstrip(".")
  text = f"{doc} (default {shown})".replace("%", "%%")
  if choices:
    text += f"; one of: {', '.join(choices)}"
  return text


def add_arguments(
  parser: argparse.ArgumentParser,
  defaults: TrainConfig = TrainConfig(),
  choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
  """Adds one typed flag per `TrainConfig` field, grouped as `GROUPS`.

  Args:
    parser: the parser to extend.
    defaults: the default values shown and used.
    choices: valid names per field, listed in ``--help``.
  """
  hints = typing.get_type_hints(TrainConfig)
  docs = field_docs()
  names = {
    "model": config.MODELS,
    "data": sorted({d for ds in config.MODEL_DATA.values() for d in ds}),
    "positional": config.POSITIONAL,
    "graph": config.GRAPHS,
    "dtype": config.DTYPES,
    "param_dtype": config.DTYPES,
    "schedule": config.SCHEDULES,
    "nonfinite": config.NONFINITE,
    "token_dtype": corpora.TOKEN_DTYPES,
    "remat": layers.REMAT_CHOICES,
    **(choices or {}),
  }
  for group, fields in GROUPS.items():
    section = parser.add_argument_group(f"{group} (config file [{group}])")
    for field in fields:
      default = getattr(defaults, field)
      help_text = _help(field, docs[field], default, names.get(field))
      if hints[field] is bool:
        section.add_argument(
          config.flag(field),
          action=argparse.BooleanOptionalAction,
          default=default,
          help=help_text,
        )
        continue

      def convert(text: str, field: str = field) -> Any:
        try:
          return parse_value(field, text)
        except ValueError as e:
          raise argparse.ArgumentTypeError(str(e)) from e

      convert.__name__ = field
      section.add_argument(
        config.flag(field), type=convert, default=default, help=help_text
      )


def from_args(args: argparse.Namespace) -> TrainConfig:
  """Builds a `TrainConfig` from parsed flags."""
  return TrainConfig(**{field: getattr(args, field) for field in FIELDS})
