"""The three tiers every claims script runs at: quick, default, full.

* ``--quick``: toy sizes and one seed, seconds; the tests run every script
  so (the pipeline, not the claim).
* default: the setting the committed results come from, `DEFAULT_SEEDS`
  seeds (``--seeds N`` for more, e.g. 5 where 3 leave an interval
  straddling the margin; the grid resumes, so that second look trains
  only the added seeds). Its target is `DEFAULT_MINUTES` minutes per
  script with `DEFAULT_SEEDS` seeds, alone on the project's 2-core CPU
  machine: a script sizes its runs to fit, and a claim whose regime (the
  smallest setting where its phenomenon is present) needs longer is
  ``not testable at this scale`` there. RESULTS.md lists every record over
  the target (`experiments._harness.results.over_budget_lines`).
* ``--full``: the setting that would test a claim the CPU cannot reach, on
  one accelerator (`FULL_LM`), `FULL_SEEDS` seeds.

Every script takes the same flags (`parser`): ``--out`` (the result files,
``experiments/results``), ``--runs`` (run directories and grid tables,
`runs_folder`: ``runs/claims/<name>``, ``-quick`` / ``-full`` at those
tiers), ``--quick`` / ``--full`` and ``--seeds``.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Mapping
from typing import Any

from jaxnorm.training import config as config_lib

TIERS: tuple[str, ...] = ("quick", "default", "full")
DEFAULT_SEEDS = 3
DEFAULT_MINUTES = 20
FULL_SEEDS = 5

# The claims scripts' byte LM at toy size (--quick) and accelerator size
# (--full).
QUICK_LM = types.MappingProxyType(
  dict(
    width=16,
    depth=1,
    num_heads=2,
    seq_len=16,
    batch_size=4,
    steps=4,
    eval_every=2,
    eval_batches=1,
    warmup_steps=1,
  )
)
FULL_LM = types.MappingProxyType(
  dict(
    width=256,
    depth=8,
    num_heads=8,
    seq_len=256,
    batch_size=32,
    eval_batches=16,
    warmup_steps=200,
  )
)


class _Parser(argparse.ArgumentParser):
  """`parser`'s parser: ``--runs`` defaults to the script's tier folder."""

  def __init__(self, name: str, **kwargs: Any):
    super().__init__(**kwargs)
    self.script = name

  def parse_args(self, args=None, namespace=None):
    """`argparse.ArgumentParser.parse_args`, then the default ``--runs``."""
    parsed = super().parse_args(args, namespace)
    if parsed.runs is None:
      parsed.runs = runs_folder(self.script, tier(parsed))
    return parsed


def runs_folder(name: str, tier_name: str) -> str:
  """The default ``--runs`` of a script at a tier.

  ``runs/claims/<name>`` for the default tier, ``runs/claims/<name>-quick``
  and ``-full`` for the others: a grid resumes from its table, so two
  tiers must not share one (`grid.run_grid` refuses a table whose lines
  trained another config).
  """
  suffix = "" if tier_name == "default" else f"-{tier_name}"
  return f"runs/claims/{name}{suffix}"


def parser(doc: str, name: str) -> argparse.ArgumentParser:
  """The flags of every claims script (module docstring)."""
  p = _Parser(name, description=doc.splitlines()[0])
  p.add_argument(
    "--out", default="experiments/results", help="folder of the result files"
  )
  tier_flag = p.add_mutually_exclusive_group()
  tier_flag.add_argument(
    "--quick", action="store_true", help="toy scale, one seed (the tests)"
  )
  tier_flag.add_argument(
    "--full", action="store_true", help="the accelerator-sized setting"
  )
  p.add_argument(
    "--seeds",
    type=int,
    default=None,
    help=f"seeds per variant (default {DEFAULT_SEEDS}, --full {FULL_SEEDS})",
  )
  p.add_argument(
    "--runs",
    default=None,
    help=f"folder of the run directories and the JSON-lines tables "
    f"(default {runs_folder(name, 'default')}, with -quick / -full at "
    "those tiers)",
  )
  return p


def tier(args: argparse.Namespace) -> str:
  """``"quick"``, ``"default"`` or ``"full"``."""
  if getattr(args, "quick", False):
    return "quick"
  return "full" if getattr(args, "full", False) else "default"


def seeds(args: argparse.Namespace) -> tuple[int, ...]:
  """``0 .. n-1``: one with ``--quick``, else ``--seeds`` or the tier's.

  Raises:
    ValueError: ``--seeds`` below 1, or above 1 with ``--quick``.
  """
  if args.seeds is not None and args.seeds < 1:
    raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
  if tier(args) == "quick":
    if args.seeds not in (None, 1):
      raise ValueError(f"--quick runs one seed, got --seeds {args.seeds}")
    return (0,)
  default = FULL_SEEDS if tier(args) == "full" else DEFAULT_SEEDS
  return tuple(range(args.seeds or default))


def byte_lm_config(
  args: argparse.Namespace,
  default: Mapping[str, Any],
  *,
  full_steps: int = 5000,
  full_eval_every: int = 250,
  **fields: Any,
) -> config_lib.TrainConfig:
  """The byte LM of a claims script: `QUICK_LM`, ``default`` or `FULL_LM`.

  ``default`` holds the size and step fields of the default run; ``fields``
  are set in every tier. Logs at every evaluation; no periodic
  checkpoints (the final one is written).
  """
  run = {
    "quick": dict(QUICK_LM),
    "default": dict(default),
    "full": {**FULL_LM, "steps": full_steps, "eval_every": full_eval_every},
  }[tier(args)]
  return config_lib.TrainConfig(
    **run, log_every=run["eval_every"], checkpoint_every=10**9, **fields
  )
