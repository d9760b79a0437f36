"""Fairy2i quantization-aware fine-tuning of a byte LM, on the runner.

Claims (Wang et al., "Fairy2i: Training Complex LLMs from Real LLMs with
All Parameters in {±1, ±i}", arXiv:2512.02901, abstract; fixed before
running; metric: validation loss in nats per byte of Shakespeare after
quantization-aware fine-tuning, through the quantized weights, lower is
better):

* Fairy2i at an effective 2 bits (two residual stages of the
  widely-linear form quantized to {±1, ±i}, ``w2``) "significantly
  outperforms" real binary and ternary quantization: ``w2`` is
  ``superior`` to ``binary`` and to ``ternary`` (margin 0);
* one stage (``w1``, 1 bit per real weight) is at least as good as real
  binary: ``w1`` is ``non_inferior`` to ``binary`` by
  `claims.MARGINS["nats_per_byte"]` (0.01).
* Regime, deciding whether the three are testable: quantizing to 1 bit
  costs loss at this scale (the premise of the comparison): the
  full-precision fine-tune ``fp`` is ``superior`` to ``binary`` (margin
  0); where it is not, the others are ``not testable at this scale``.

Procedure, all in the runner's loop (`jaxnorm.training.trainer.train`):
a parent, the real decoder LM with an untied head (so the head is a
quantized linear layer while the embedding stays full precision), trains
per seed (`parent` grid). Each arm then fine-tunes its seed's parent
(restored from the parent's final checkpoint) with every linear kernel
fake-quantized in the forward pass and straight-through gradients
(`FakeQuantLM`): ``fp`` (no quantizer: the control), ``w1``, ``w2``
(`jaxnorm.cplx.fairy2i_quantize_kernel`, 1 and 2 stages), ``binary``
(mean-centred sign times mean ``|w|``, the Fairy2i repository's BitNet
baseline) and ``ternary`` (BitNet b1.58). Attention kernels ``(D, N, H)``
are quantized as ``(D, N H)`` matrices. The validation loss is that of the
quantized model (the runner evaluates `FakeQuantLM`). A fine-tune reads
the training stream of its seed from the start again (the parent's first
batches), the same for every arm.

Fair comparison: every fine-tuning arm runs at its own learning rate, the
best of a geometric sweep on seed 0 chosen by the final training loss,
extended until it lies inside the grid (`experiments._harness.grid.
tuned_grid`); then 3 seeds paired by seed (the same parent). The parent
trains at the runner's default rate (it is shared by every arm).
Parameter counts are equal; the bits per weight differ (w2 2, w1 and
binary 1, ternary 1.58), as in the paper's comparison.

Regime: width 64, 2 layers, 4 heads, 64-byte windows, batch 16; the parent
600 steps, each fine-tune 200 steps. The paper fine-tunes LLaMA-2 7B on
30B tokens.

  python -m experiments.complex_e3_fairy2i [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from experiments import complex_common as cc
from experiments._harness import grid, report, runs, tiers
from jaxnorm import cplx
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "complex_e3_fairy2i"
PARENT = "parent"
QUANTIZERS: dict[str, Callable[[jax.Array], jax.Array] | None] = {
  "fp": None,
  "w1": lambda k: cplx.fairy2i_quantize_kernel(k, num_stages=1),
  "w2": lambda k: cplx.fairy2i_quantize_kernel(k, num_stages=2),
  "binary": cplx.binary_quantize_kernel,
  "ternary": cplx.ternary_quantize_kernel,
}
VARIANTS: dict[str, dict[str, Any]] = {name: {} for name in QUANTIZERS}
LEARNING_RATES = dict.fromkeys(VARIANTS, (1e-4, 3e-4, 1e-3))
_FULL_PRECISION = ("embed", "pos")


_claim = functools.partial(
  claims.Claim,
  paper="Fairy2i",
  arxiv="2512.02901",
  metric="val_loss",
  direction="lower",
)

REGIME = _claim(
  claim="regime: 1-bit quantization costs loss here (full-precision "
  "fine-tuning beats binary quantization-aware fine-tuning)",
  kind="superior",
  margin=0.0,
  a="fp",
  b="binary",
)
CLAIMS = (
  _claim(
    claim="Fairy2i at 2 bits (two residual {±1, ±i} stages) significantly "
    "outperforms real binary quantization",
    kind="superior",
    margin=0.0,
    a="w2",
    b="binary",
  ),
  _claim(
    claim="Fairy2i at 2 bits significantly outperforms real ternary "
    "quantization",
    kind="superior",
    margin=0.0,
    a="w2",
    b="ternary",
  ),
  _claim(
    claim="one Fairy2i stage (1 bit per real weight) is at least as good as "
    "real binary quantization",
    kind="non_inferior",
    margin=claims.MARGINS["nats_per_byte"],
    a="w1",
    b="binary",
  ),
)


def _as_matrix(name: str, k: jax.Array) -> tuple[int, int]:
  """The ``(in, out)`` matrix shape of a kernel (attention kernels flat)."""
  if name == "out_kernel":
    return math.prod(k.shape[:-1]), k.shape[-1]
  return k.shape[0], math.prod(k.shape[1:])


def quantize_params(params: Any, quant: Callable | None) -> Any:
  """Fake-quantizes every linear kernel of an nnx ``Param`` state."""
  if quant is None:
    return params
  flat = []
  for path, var in nnx.to_flat_state(params):
    name = str(path[-1])
    v = var[...]
    if v.ndim >= 2 and name not in _FULL_PRECISION:
      v = quant(v.reshape(_as_matrix(name, v))).reshape(v.shape)
    flat.append((path, var.replace(v)))
  return nnx.from_flat_state(flat)


class FakeQuantLM(nnx.Module):
  """An LM whose linear kernels are fake-quantized at every call (STE).

  Holds the full-precision LM (``lm``, what the optimizer updates); each
  call runs a copy whose kernels went through ``QUANTIZERS[quantizer]``.
  """

  def __init__(self, lm: nnx.Module, quantizer: str):
    """Wraps ``lm``."""
    self.lm = lm
    self.quantizer = quantizer

  def __call__(self, tokens: jax.Array, *, rngs: Any = None) -> jax.Array:
    """Logits of the quantized copy."""
    graphdef, params, rest = nnx.split(self.lm, nnx.Param, ...)
    quant = QUANTIZERS[self.quantizer]
    model = nnx.merge(graphdef, quantize_params(params, quant), rest)
    return model(tokens, rngs=rngs)


def parent_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The parent's run of each tier (the runner's default optimizer)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=2,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=600,
      eval_every=100,
      eval_batches=8,
      warmup_steps=60,
    ),
  )


def qat_config(parent: config_lib.TrainConfig) -> config_lib.TrainConfig:
  """The fine-tuning run: a third of the parent's steps."""
  steps = max(parent.steps // 3, 2)
  return dataclasses.replace(
    parent,
    steps=steps,
    eval_every=max(steps // 4, 1),
    log_every=max(steps // 4, 1),
    warmup_steps=max(steps // 10, 1),
  )


class Models:
  """The parents and the fake-quantized fine-tunes, per seed."""

  def __init__(self, parent: config_lib.TrainConfig, parents: pathlib.Path):
    """``parents``: the parent grid's table (its runs beside it)."""
    self.parent = parent
    self.parents = parents
    self.vocab = data_lib.load_text(parent.data).vocab_size

  def lm(self, seed: int) -> nnx.Module:
    """The real decoder LM with an untied head."""
    p = self.parent
    return cc.in_mesh(
      p,
      lambda: cc.real_lm(
        p.width, p.depth, p.num_heads, p.seq_len, seed, self.vocab
      ),
    )

  def build_parent(self, variant: str, seed: int) -> nnx.Module:
    """A fresh parent."""
    del variant
    return self.lm(seed)

  def build(self, variant: str, seed: int) -> nnx.Module:
    """The seed's trained parent, fake-quantized by ``variant``."""
    lm = runs.trained(
      self.parents, self.parent, {}, PARENT, seed, model=lambda: self.lm(seed)
    )
    lm.train()
    return cc.in_mesh(self.parent, lambda: FakeQuantLM(lm, variant))


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains the parents, then the tuned fine-tuning grid; the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  parent = parent_config(args)
  base = qat_config(parent)
  seeds = tiers.seeds(args)
  folder = pathlib.Path(args.runs)
  table = folder / "grid.jsonl"
  models = Models(parent, folder / "parents" / "grid.jsonl")
  # --quick checks the pipeline at the base rate.
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES

  def compute() -> dict:
    parents = grid.run_grid(
      models.parents, parent, {PARENT: {}}, seeds, model=models.build_parent
    )
    lines, tuned = grid.tuned_grid(
      table, base, VARIANTS, seeds, rates, model=models.build
    )
    unigram = runs.chance_loss(parent)
    description = {
      v: {"module": f"FakeQuantLM({v}) of the seed's parent", "parent":
          config_lib.to_json(config_lib.resolve(parent))}
      for v in VARIANTS
    }  # fmt: skip
    record = cc.recorder(lines, base, tuned["variants"], description)
    baselines = {v: runs.untrained(lines, v, unigram) is None for v in VARIANTS}
    records = cc.gated(
      REGIME,
      CLAIMS,
      record,
      baselines=baselines,
      absent="1-bit quantization costs no loss at this scale",
    )
    return {
      "claims": records,
      "sweeps": tuned["sweeps"],
      "variants": tuned["variants"],
      "lines": lines,
      "parents": parents,
      "unigram": unigram,
      "val_loss": grid.cells(lines, "val_loss"),
      "parent_val_loss": grid.cells(parents, "val_loss"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    grid.figure(
      table,
      result["lines"],
      "val_loss",
      path,
      f"Fairy2i QAT of a {parent.depth}-layer width-{parent.width} byte LM "
      f"({parent.steps} + {base.steps} steps, {len(seeds)} seeds)",
      result["claims"],
    )

  def markdown(result: dict) -> list[str]:
    lines = report.runner_lines(parent, seeds)
    p = result["parent_val_loss"][PARENT]
    lines += [
      f"Parents (the config above, untied head): validation loss "
      f"{grid.fmt(p)} nats/byte (unigram {result['unigram']:.3f}). Each "
      f"arm then fine-tunes its seed's parent for {base.steps} steps "
      f"(warm-up {base.warmup_steps}, cosine) through fake-quantized "
      "kernels; the validation loss is the quantized model's.",
      "",
    ]
    lines += cc.setting_lines(result, list(VARIANTS))
    lines += report.sweep_lines(result["sweeps"])
    lines += ["## Validation loss after quantization-aware fine-tuning", ""]
    lines += grid.markdown_table(result["val_loss"], "val loss", "fp")
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
