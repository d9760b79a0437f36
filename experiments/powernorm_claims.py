"""PowerNorm and Unified Norm vs LayerNorm and BatchNorm in the ViT.

Claims checked (same runner, data and seeds; batch statistics allowed):

* PowerNorm (Shen et al., "PowerNorm: Rethinking Batch Normalization in
  Transformers", arXiv:2003.07845): naive BatchNorm hurts a Transformer,
  and PowerNorm (quadratic-mean statistics, running statistics in the
  forward pass, a backward-pass correction) beats both BatchNorm and
  LayerNorm.
* Unified Norm (Yang et al., "Unified Normalization for Accelerating and
  Stabilizing Transformers", arXiv:2208.01313): UN matches LayerNorm's
  accuracy, and at inference it folds into the adjacent linear layer, so
  the norm costs nothing (faster than LayerNorm + linear).

Setting: the runner's ViT (pre-norm, patch 4) on Fashion-MNIST, 3 seeds;
PowerNorm's and UN's warm-up (batch statistics before the running ones
take over) is a tenth of the run, as the papers' ratio, not their absolute
4000/10000 iterations. Verdicts compare mean validation losses with the
standard error of their difference (`experiments._grid.verdict`).
Inference speed: one norm + linear layer on the ViT's token tensor, timed
as LayerNorm + linear, UN (inference mode) + linear, and the folded linear
layer (`UnifiedNorm.fold`), the fold checked against the unfolded output.

  python -m experiments.powernorm_claims [--quick] [--full]
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.nn import norms as nn_norms
from jaxnorm.training import config as config_lib

NAME = "powernorm_claims"

# (variant, reference, claim, tolerance in nats for "equal", label)
CLAIMS = (
  ("powernorm", "batchnorm", "lower", 0.0, "PowerNorm beats BatchNorm"),
  ("powernorm", "layernorm", "lower", 0.0, "PowerNorm beats LayerNorm"),
  ("layernorm", "batchnorm", "lower", 0.0, "BatchNorm hurts the ViT"),
  ("unifiednorm", "layernorm", "equal", 0.02, "UN matches LayerNorm"),
)


def base_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """The shared run: ViT width 64, depth 4, batch 64, 500 steps (quick: toy)."""
  if quick:
    size = dict(data="digits", width=16, depth=1, num_heads=2, batch_size=8)
    steps = dict(steps=4, eval_every=2, eval_batches=1, warmup_steps=1)
  elif full:
    size = dict(width=192, depth=8, num_heads=6, batch_size=128)
    steps = dict(steps=6000, eval_every=500, eval_batches=40, warmup_steps=300)
  else:
    size = dict(width=64, depth=4, num_heads=4, batch_size=64)
    steps = dict(steps=500, eval_every=100, eval_batches=16, warmup_steps=50)
  return config_lib.TrainConfig(
    **{"model": "vit", "data": "fashion_mnist", **size},
    **steps,
    log_every=steps["eval_every"],
    checkpoint_every=10**9,
    learning_rate=2e-3,
  )


def norm_warmup(base: config_lib.TrainConfig) -> int:
  """PowerNorm's and UN's ``warmup_iters``: a tenth of the run."""
  return max(1, base.steps // 10)


def variants(base: config_lib.TrainConfig) -> dict[str, dict]:
  """Norm variants; PN and UN warm up over `norm_warmup` steps.

  BatchNorm's running statistics take PN's and UN's momentum (0.9; flax's
  0.99 lags the weights of a short run).
  """
  warm = (("warmup_iters", norm_warmup(base)),)
  return {
    "layernorm": {"norm": "layernorm"},
    "batchnorm": {"norm": "batchnorm", "norm_kwargs": (("momentum", 0.9),)},
    "powernorm": {"norm": "powernorm", "norm_kwargs": warm},
    "unifiednorm": {"norm": "unifiednorm", "norm_kwargs": warm},
  }


def folding(
  shape: tuple[int, int, int], repeats: int, reps: int, seed: int = 0
) -> dict:
  """Times norm + linear on ``(batch, tokens, width)`` three ways.

  The UN layer has random (positive) running statistics and affine
  parameters, as after training; the folded layer must reproduce UN +
  linear (``max_abs_error``). Each of ``repeats`` rounds times every form
  (median of ``reps`` calls), interleaved so that load drifts hit all.
  """
  d = shape[-1]
  rngs = nnx.Rngs(seed)
  key = jax.random.key(seed)
  k = jax.random.split(key, 6)
  x = jax.random.normal(k[0], shape, jnp.float32)
  kernel = jax.random.normal(k[1], (d, d), jnp.float32) / np.sqrt(d)
  kbias = 0.1 * jax.random.normal(k[2], (d,), jnp.float32)
  row = (1,) * (len(shape) - 1) + (d,)
  ln = nn_norms.make_norm("layernorm", d, rngs=rngs, layout="tokens")
  un = nn_norms.make_norm("unifiednorm", d, rngs=rngs, layout="tokens")
  un.running_var[...] = jnp.exp(jax.random.normal(k[3], (d,)))
  un.scale[...] = 1 + 0.1 * jax.random.normal(k[4], (d,))
  un.bias[...] = 0.1 * jax.random.normal(k[5], (d,))
  un.eval()
  folded_w, folded_b = un.fold(kernel, kbias, position="next")

  norm_linear = nnx.jit(lambda m, t: m(t) @ kernel + kbias.reshape(row))
  calls = {
    "layernorm + linear": lambda t: norm_linear(ln, t),
    "UN (inference) + linear": lambda t: norm_linear(un, t),
    "UN folded (linear only)": jax.jit(
      lambda t: t @ folded_w + folded_b.reshape(row)
    ),
  }
  error = float(
    jnp.max(
      jnp.abs(
        calls["UN folded (linear only)"](x)
        - calls["UN (inference) + linear"](x)
      )
    )
  )
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      times[name].append(_report.median_ms(fn, x, reps))
  return {"shape": list(shape), "max_abs_error": error, "ms": times}


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), the timing, and the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  grid_variants = variants(base)
  table = pathlib.Path(args.runs) / "vit.jsonl"
  token_shapes = (
    [(base.batch_size, 17, base.width)]
    if args.quick
    else [(base.batch_size, 50, base.width), (base.batch_size, 50, 512)]
  )
  repeats, reps = (2, 3) if args.quick else (5, 50)

  def compute() -> dict:
    lines = _grid.run_grid(table, base, grid_variants, seeds)
    loss = _grid.cells(lines, "val_loss")
    accuracy = _grid.cells(lines, "val_accuracy")
    verdicts = []
    for variant, ref, claim, tol, label in CLAIMS:
      v, why = _grid.verdict(loss, variant, ref, claim, tol)
      verdicts.append({"claim": label, "verdict": v, "why": why})
    timing = [folding(s, repeats, reps) for s in token_shapes]
    for t in timing:
      ms = {
        name: {"mean": m, "std": s, "n": len(vs), "values": vs}
        for name, vs in t["ms"].items()
        for m, s in [_report.mean_spread(vs)]
      }
      t["cells"] = ms
      v, why = _grid.verdict(
        ms, "UN folded (linear only)", "layernorm + linear", "lower"
      )
      verdicts.append(
        {
          "claim": f"folded UN is faster than LN + linear, tokens {t['shape']}",
          "verdict": v,
          "why": why + " ms",
        }
      )
    return {
      "lines": lines,
      "val_loss": loss,
      "val_accuracy": accuracy,
      "timing": timing,
      "verdicts": verdicts,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    _grid.figure(
      table,
      result["lines"],
      "val_accuracy",
      path,
      f"ViT on {base.data}: validation loss and accuracy by norm "
      f"({len(seeds)} seeds)",
    )

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner config: ViT on {base.data}, width {base.width}, depth "
      f"{base.depth}, {base.num_heads} heads, batch {base.batch_size}, "
      f"{base.steps} AdamW steps (lr {base.learning_rate}, cosine, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}), seeds "
      f"{list(seeds)}; PowerNorm/UN `warmup_iters` = {norm_warmup(base)}. "
      f"Validation over {base.eval_batches} batches of {base.batch_size} "
      "test images (eval mode: running statistics); mean ± sample std "
      "(ddof=1) over seeds.",
      "",
      "## Validation loss (nats)",
      "",
    ]
    lines += _grid.markdown_table(result["val_loss"], "val loss", "layernorm")
    lines += ["", "## Validation accuracy", ""]
    lines += _grid.markdown_table(
      result["val_accuracy"], "val accuracy", "layernorm"
    )
    lines += ["", "## Inference: norm + linear layer (ms per call)", ""]
    for t in result["timing"]:
      lines += [
        f"Tokens {t['shape']} (median of {reps} calls per round, mean ± "
        f"std over {repeats} rounds); folded vs unfolded UN max abs "
        f"difference {t['max_abs_error']:.2e}.",
        "",
      ]
      lines += _grid.markdown_table(t["cells"], "ms", "layernorm + linear")
      lines.append("")
    lines += ["## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"])
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
