"""Norms in the byte LM: DyT, SeeDNorm, scale vectors, LNS, L1 vs LN/RMSNorm.

Claims checked (each against its reference, same runner, data and seeds):

* DyT (Zhu et al., "Transformers without Normalization", arXiv:2503.10622):
  replacing LayerNorm by DyT matches its loss.
* SeeDNorm (arXiv:2510.22777): SeeDNorm lowers the loss of RMSNorm.
* Scale vectors ("Negligible in Size, Significant in Effect",
  arXiv:2605.26895): removing the norms' scale vectors raises the loss; the
  paper's magnitude-direction reparameterization (`scalevectornorm` with
  ``reparam=True``) lowers it.
* LayerNorm Scaling ("The Curse of Depth", arXiv:2502.05795): scaling block
  ``l``'s norms by ``1/sqrt(l)`` lowers the loss of Pre-RMSNorm.
* L1 layer norm (sub-8-bit training paper): matches LayerNorm.
* CRMSNorm (Jiang et al., "Pre-RMSNorm and Pre-CRMSNorm Transformers",
  arXiv:2305.14858): the same function class as Pre-LN, so its loss
  matches LayerNorm's (`experiments.convert_prenorm` checks the exact
  conversion; this grid checks training from scratch).
* The norm-free stack (``norm="none"``: ``x + f(x)`` with no norm at all),
  the baseline the DyT paper starts from: removing every norm raises the
  loss.

Setting: the runner's decoder LM on byte-level Shakespeare, and the
LN / RMSNorm / DyT / SeeDNorm subset on the KJV Bible as a second corpus;
3 seeds each. Verdicts compare means with the standard error of their
difference (`experiments._grid.verdict`).

  python -m experiments.norms_bytelm [--quick] [--full]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Sequence

from flax import nnx

from experiments import _grid, _report
from jaxnorm.nn import models
from jaxnorm.nn import residual as nn_residual
from jaxnorm.training import build
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "norms_bytelm"

SHAKESPEARE = {
  "layernorm": {"norm": "layernorm"},
  "rmsnorm": {"norm": "rmsnorm"},
  "crmsnorm": {"norm": "crmsnorm"},
  "dyt": {"norm": "dyt"},
  "seednorm": {"norm": "seednorm"},
  "l1layernorm": {"norm": "l1layernorm"},
  "rmsnorm-no-scale": {
    "norm": "rmsnorm",
    "norm_kwargs": (("use_scale", False),),
  },
  # Defaults of scalevectornorm are plain RMSNorm; the paper's
  # magnitude-direction reparameterization is the switch under test.
  "scalevector-reparam": {
    "norm": "scalevectornorm",
    "norm_kwargs": (("reparam", True),),
  },
  "rmsnorm-lns": {"norm": "rmsnorm", "residual": "lns"},
}
# The norm-free stack: Pre-LN's x + f(x) with no norm anywhere (no final
# norm either), the baseline DyT's paper starts from. The runner's --norm
# names norm layers, so this variant is built here (`norm_free_lm`).
NORM_FREE = "norm-free"
KJV = ("layernorm", "rmsnorm", "dyt", "seednorm")

# (variant, reference, claim, tolerance in nats for "equal", label)
CLAIMS = (
  ("dyt", "layernorm", "equal", 0.01, "DyT matches LayerNorm"),
  ("seednorm", "rmsnorm", "lower", 0.0, "SeeDNorm beats RMSNorm"),
  ("rmsnorm", "rmsnorm-no-scale", "lower", 0.0, "scale vectors help"),
  (
    "scalevector-reparam",
    "rmsnorm",
    "lower",
    0.0,
    "magnitude-direction scale vectors beat RMSNorm's",
  ),
  ("rmsnorm-lns", "rmsnorm", "lower", 0.0, "LNS beats Pre-RMSNorm"),
  ("l1layernorm", "layernorm", "equal", 0.01, "L1 norm matches LayerNorm"),
  ("crmsnorm", "layernorm", "equal", 0.01, "CRMSNorm matches LayerNorm"),
  ("layernorm", NORM_FREE, "lower", 0.0, "removing every norm hurts"),
)


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run: width 64, depth 4, 64-byte windows (quick: toy)."""
  return _grid.byte_lm_config(
    args,
    dict(
      width=64,
      depth=4,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=300,
      eval_every=50,
      eval_batches=8,
      warmup_steps=30,
    ),
    learning_rate=3e-3,
  )


def norm_free_lm(base: config_lib.TrainConfig):
  """``(variant, seed) -> DecoderLM`` of ``base`` with no norm at all."""
  vocab = data_lib.load_text(base.data).vocab_size
  lm = dataclasses.replace(
    build.model_config(base, {"vocab_size": vocab, "max_len": base.seq_len}),
    norm=nn_residual.NORM_FREE,
  )
  return lambda variant, seed: models.DecoderLM(lm, rngs=nnx.Rngs(seed))


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grids (skipping finished runs) and writes the report."""
  p = _grid.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args)
  seeds = _grid.seeds(args)
  shakespeare = (
    {k: SHAKESPEARE[k] for k in ("layernorm", "dyt")}
    if args.quick
    else SHAKESPEARE
  )
  kjv = KJV[:1] if args.quick else KJV
  runs = pathlib.Path(args.runs)
  tables = {
    "shakespeare": runs / "shakespeare.jsonl",
    # Its own folder: a table's run directories live beside it.
    "kjv": runs / "kjv" / "kjv.jsonl",
  }

  def compute() -> dict:
    if not args.quick:  # Into the Shakespeare table, read back below.
      _grid.run_grid(
        tables["shakespeare"],
        base,
        {NORM_FREE: {}},
        seeds,
        model=norm_free_lm(base),
      )
    lines = {
      "shakespeare": _grid.run_grid(
        tables["shakespeare"], base, shakespeare, seeds
      ),
      "kjv": _grid.run_grid(
        tables["kjv"],
        dataclasses.replace(base, data="kjv"),
        {k: SHAKESPEARE[k] for k in kjv},
        seeds,
      ),
    }
    cells = {c: _grid.cells(ls, "val_loss") for c, ls in lines.items()}
    verdicts = []
    for variant, ref, claim, tol, label in CLAIMS:
      for corpus, grid in cells.items():
        if variant in grid and ref in grid:
          v, why = _grid.verdict(grid, variant, ref, claim, tol)
          verdicts.append(
            {"claim": label, "corpus": corpus, "verdict": v, "why": why}
          )
    return {"lines": lines, "cells": cells, "verdicts": verdicts}

  def figure(result: dict, path: pathlib.Path) -> None:
    _grid.figure(
      tables["shakespeare"],
      result["lines"]["shakespeare"],
      "val_loss",
      path,
      "byte LM on Shakespeare: validation loss by norm (3 seeds)",
    )

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner config: width {base.width}, depth {base.depth}, "
      f"{base.num_heads} heads, {base.seq_len}-byte windows, batch "
      f"{base.batch_size}, {base.steps} AdamW steps (lr "
      f"{base.learning_rate}, cosine, warm-up {base.warmup_steps}, weight "
      f"decay {base.weight_decay}), seeds {list(seeds)}. Validation loss "
      f"in nats per byte over {base.eval_batches} held-out batches; mean ± "
      "sample std (ddof=1) over seeds.",
      "",
    ]
    for corpus, grid in result["cells"].items():
      lines += [f"## {corpus}", ""]
      lines += _grid.markdown_table(grid, "val loss", "layernorm")
      lines.append("")
    lines += ["## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"], ("corpus",))
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
