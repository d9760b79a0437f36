"""Optimizers: AdamW, AdamP, SGDP, Conda, RMNP, Muon, each at its best lr.

Claims checked (each optimizer at the best of its learning-rate grid, the
grid picked by the mean validation loss over seeds):

* Conda (Wang et al., "Conda: Column-Normalized Adam for Training Large
  Language Models Faster", arXiv:2509.24218): Conda converges faster than
  AdamW: it reaches AdamW's final validation loss in fewer steps, and ends
  lower.
* RMNP (Deng et al., "RMNP: Row-Momentum Normalized Preconditioning for
  Scalable Matrix-Based Optimization", arXiv:2603.20527): Muon-level quality
  (validation loss not worse than Muon's) at a lower step cost (fewer
  milliseconds per step than Muon's Newton-Schulz).
* AdamP / SGDP (Heo et al., "AdamP: Slowing Down the Slowdown for Momentum
  Optimizers on Scale-invariant Weights", arXiv:2006.08217): on
  scale-invariant weights the weight norm grows less than under Adam / SGD
  (so the effective step size ``lr / ||w||^2`` is kept), and the loss is
  lower.

Setting: the runner's decoder LM on byte-level Shakespeare for every
optimizer (Muon is ``optax.contrib.muon``); steps to a target are read from
the validation curve of each run's ``metrics.jsonl`` (a run that never
reaches it counts as one evaluation interval past its last step, a
censored value; the table gives how many reached it) and the step cost from
the runner's median tokens/s. The AdamP claim runs on the runner's CNN with
BatchNorm on Fashion-MNIST, wired ``sandwich`` (``x + BN(conv2(relu(conv1(
BN(x)))))``), so every block's ``conv2`` kernel (no bias) feeds a BatchNorm
directly and is scale-invariant per output channel; its norm is read from
the final checkpoint and compared with the same seed's initialization.
AdamW and AdamP (SGD and SGDP) share one learning rate there, as the paper
swaps them in, and weight decay is off so the norm growth is the
optimizer's alone (Adam's decoupled decay would shrink it). Step time is
measured on a shared machine: its verdict is only as steady as the load.
Verdicts compare means with the standard error of their difference
(`experiments._grid.verdict`); 3 seeds.

  python -m experiments.optimizers_claims [--quick] [--full]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm.training import build, metrics
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "optimizers_claims"

# Per optimizer: the learning rates tried on the byte LM (a factor ~3
# apart, centred on the papers' recipes scaled to this model), extended
# until the best one is inside the grid (a best at an edge is not a best).
LR_GRID: Mapping[str, tuple[float, ...]] = {
  "adamw": (1e-3, 3e-3, 1e-2, 3e-2),
  "adamp": (1e-3, 3e-3, 1e-2, 3e-2),
  "conda": (1e-3, 3e-3, 1e-2, 3e-2),
  "sgdp": (1e-2, 3e-2, 1e-1, 3e-1),
  "rmnp": (3e-3, 1e-2, 3e-2),
  "muon": (3e-3, 1e-2, 3e-2, 1e-1),
}
QUICK_OPTIMIZERS = ("adamw", "rmnp", "muon")
# The CNN comparison: optimizer -> learning rate (pairs share one).
CNN_LR: Mapping[str, float] = {
  "adamw": 2e-3,
  "adamp": 2e-3,
  "sgd": 0.1,
  "sgdp": 0.1,
}
# Nats within which RMNP counts as matching Muon's loss.
MATCH_TOLERANCE = 0.02


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The byte LM: width 64, depth 2, 64-byte windows (quick: toy)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=64,
      depth=2,
      num_heads=4,
      seq_len=64,
      batch_size=16,
      steps=200,
      eval_every=20,
      eval_batches=4,
      warmup_steps=20,
    ),
    full_steps=4000,
    full_eval_every=100,
    keep_checkpoints=1,
  )


def cnn_config(quick: bool, full: bool) -> config_lib.TrainConfig:
  """The CNN with BatchNorm, sandwich residuals, no weight decay."""
  if quick:
    size = dict(data="digits", width=8, depth=1, batch_size=8)
    steps = dict(steps=4, eval_every=2, eval_batches=1, warmup_steps=1)
  elif full:
    size = dict(data="fashion_mnist", width=64, depth=4, batch_size=128)
    steps = dict(steps=4000, eval_every=500, eval_batches=16, warmup_steps=200)
  else:
    size = dict(data="fashion_mnist", width=16, depth=2, batch_size=64)
    steps = dict(steps=200, eval_every=50, eval_batches=16, warmup_steps=20)
  return config_lib.TrainConfig(
    model="cnn",
    norm="batchnorm",
    residual="sandwich",
    activation="relu",
    **size,
    **steps,
    log_every=steps["eval_every"],
    checkpoint_every=10**9,
    keep_checkpoints=1,
    weight_decay=0.0,
  )


def lr_name(optimizer: str, lr: float) -> str:
  """The grid variant of ``optimizer`` at ``lr``."""
  return f"{optimizer}@{lr:g}"


def finite_cells(
  lines: Sequence[Mapping[str, Any]], metric: str
) -> dict[str, dict[str, Any]]:
  """`_grid.cells` over the runs that did not diverge.

  A run diverged when ``metric`` is not finite or it stopped early on a
  non-finite step (its last evaluation is then stale). ``diverged`` counts
  them; a variant with any diverged run gets mean ``inf``, so `best_lr`
  never picks a learning rate that diverged for some seed.
  """
  ok = [ln for ln in lines if not _diverged(ln, metric)]
  grid = _grid.cells(ok, metric)
  out = {}
  for ln in lines:
    name = ln["variant"]
    if name in out:
      continue
    bad = sum(1 for x in lines if x["variant"] == name and _diverged(x, metric))
    cell = grid.get(name, {"mean": math.inf, "std": 0.0, "n": 0, "values": []})
    out[name] = {**cell, "diverged": bad}
    if bad:
      out[name]["mean"] = math.inf
  return out


def _diverged(line: Mapping[str, Any], metric: str) -> bool:
  x = line.get(metric)
  return bool(line.get("stopped_early")) or x is None or not math.isfinite(x)


def best_lr(
  grid: Mapping[str, Mapping[str, Any]], optimizers: Sequence[str]
) -> dict[str, str]:
  """Per optimizer, the variant of its grid with the lowest mean loss."""
  return {
    opt: min(
      (name for name in grid if name.split("@")[0] == opt),
      key=lambda name: grid[name]["mean"],
    )
    for opt in optimizers
  }


def val_curve(run_dir: pathlib.Path) -> list[tuple[int, float]]:
  """``(step, val_loss)`` of a run, from its ``metrics.jsonl``."""
  log = metrics.read_log(run_dir / "metrics.jsonl")
  return [(r["step"], r["val_loss"]) for r in log if r.get("val_loss")]


def steps_to(
  curve: Sequence[tuple[int, float]], target: float, censor: int
) -> tuple[int, bool]:
  """The first evaluated step at or below ``target``, and whether reached.

  A curve that never reaches it gives ``censor`` (the run's length plus one
  evaluation interval) and False.
  """
  for step, loss in curve:
    if loss <= target:
      return step, True
  return censor, False


def final_state(run_dir: pathlib.Path) -> dict[str, Any]:
  """The train state of a run's newest checkpoint as nested dicts.

  Leaves are NumPy arrays under their `nnx.Variable` key ``value``; the top
  level holds ``params``, ``rest`` (e.g. running statistics), ``backward``,
  ``opt_state`` and the counters, as `jaxnorm.training.trainer` saves them.
  """
  manager = ocp.CheckpointManager(
    pathlib.Path(run_dir).absolute() / "checkpoints"
  )
  try:
    restored = manager.restore(
      manager.latest_step(),
      args=ocp.args.Composite(state=ocp.args.StandardRestore()),
    )
  finally:
    manager.close()
  return restored["state"]


def conv_feeding_bn(params: Mapping[str, Any]) -> list[np.ndarray]:
  """The sandwich CNN's ``conv2`` kernels, each followed by a BatchNorm."""
  blocks = params["net"]["blocks"]
  return [
    np.asarray(_value(blocks[key]["conv2"]["kernel"]))
    for key in sorted(blocks, key=int)
  ]


def _value(leaf: Any) -> Any:
  return leaf["value"] if isinstance(leaf, Mapping) else leaf


def norm_growth(cfg: config_lib.TrainConfig, run_dir: pathlib.Path) -> float:
  """``||W_T|| / ||W_0||`` over the scale-invariant kernels of one run."""
  images = data_lib.load_images(cfg.data)
  model = build.build_model(
    cfg,
    {
      "num_classes": images.num_classes,
      "image_shape": images.train_x.shape[1:],
    },
    rngs=nnx.Rngs(cfg.seed),
  )
  init = conv_feeding_bn(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  final = conv_feeding_bn(final_state(run_dir)["params"])
  return float(_norm(final) / _norm(init))


def _norm(kernels: Sequence[np.ndarray]) -> float:
  return math.sqrt(
    sum(float(np.sum(np.square(k, dtype=np.float64))) for k in kernels)
  )


def not_worse(
  grid: Mapping[str, Mapping[str, Any]],
  variant: str,
  reference: str,
  tolerance: float,
) -> tuple[str, str]:
  """The verdict on ``variant`` being lower than or equal to ``reference``.

  Reproduced when the ``lower`` or the ``equal`` verdict is; otherwise not
  reproduced at this scale.
  """
  lower, why = _grid.verdict(grid, variant, reference, "lower")
  if lower == "reproduced":
    return lower, why
  return _grid.verdict(grid, variant, reference, "equal", tolerance)


def both(*verdicts: tuple[str, str]) -> tuple[str, str]:
  """All parts of a claim: reproduced if all are, not if any is not."""
  names = [v for v, _ in verdicts]
  why = "; ".join(w for _, w in verdicts)
  if all(v == "reproduced" for v in names):
    return "reproduced", why
  if "not reproduced at this scale" in names:
    return "not reproduced at this scale", why
  return "inconclusive", why


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grids (skipping finished runs) and writes the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args)
  cnn = cnn_config(args.quick, args.full)
  seeds = tiers.seeds(args)
  optimizers = QUICK_OPTIMIZERS if args.quick else tuple(LR_GRID)
  grid_lrs = {
    o: LR_GRID[o][1:2] if args.quick else LR_GRID[o] for o in optimizers
  }
  cnn_optimizers = ("adamw", "adamp") if args.quick else tuple(CNN_LR)
  runs = pathlib.Path(args.runs)
  tables = {"lm": runs / "lm_lr_grid.jsonl", "cnn": runs / "cnn.jsonl"}
  tokens_ms = 1e3 * base.batch_size * base.seq_len  # tokens x ms/s

  def compute() -> dict:
    lm_lines = _grid.run_grid(
      tables["lm"],
      base,
      {
        lr_name(o, lr): {"optimizer": o, "learning_rate": lr}
        for o in optimizers
        for lr in grid_lrs[o]
      },
      seeds,
    )
    lr_grid = finite_cells(lm_lines, "val_loss")
    best = best_lr(lr_grid, optimizers)
    chosen = [
      {**ln, "variant": opt}
      for opt, name in best.items()
      for ln in lm_lines
      if ln["variant"] == name
    ]
    loss = finite_cells(chosen, "val_loss")
    target = loss["adamw"]["mean"]
    censor = base.steps + base.eval_every
    reach = []
    for ln in chosen:
      curve = val_curve(
        _grid.run_dir(tables["lm"].parent, best[ln["variant"]], ln["seed"])
      )
      step, reached = steps_to(curve, target, censor)
      speed = ln.get("tokens_per_sec") or math.nan
      reach.append(
        {
          **ln,
          "steps_to_target": step,
          "reached": reached,
          "ms_per_step": tokens_ms / speed,
        }
      )
    steps = _grid.cells(reach, "steps_to_target")
    for name, cell in steps.items():
      cell["reached"] = sum(r["reached"] for r in reach if r["variant"] == name)
    step_ms = finite_cells(reach, "ms_per_step")

    cnn_lines = _grid.run_grid(
      tables["cnn"],
      cnn,
      {o: {"optimizer": o, "learning_rate": CNN_LR[o]} for o in cnn_optimizers},
      seeds,
    )
    growth_lines = [
      {
        **ln,
        "norm_growth": norm_growth(
          dataclasses.replace(cnn, seed=ln["seed"]),
          _grid.run_dir(tables["cnn"].parent, ln["variant"], ln["seed"]),
        ),
      }
      for ln in cnn_lines
    ]
    growth = _grid.cells(growth_lines, "norm_growth")
    cnn_loss = finite_cells(cnn_lines, "val_loss")
    cnn_accuracy = finite_cells(cnn_lines, "val_accuracy")

    verdicts = []

    def add(label: str, setting: str, result: tuple[str, str]) -> None:
      verdicts.append(
        {
          "claim": label,
          "setting": setting,
          "verdict": result[0],
          "why": result[1],
        }
      )

    if "conda" in loss:
      add(
        "Conda reaches AdamW's final loss in fewer steps",
        "byte LM",
        _grid.verdict(steps, "conda", "adamw", "lower"),
      )
      add(
        "Conda ends at a lower loss than AdamW",
        "byte LM",
        _grid.verdict(loss, "conda", "adamw", "lower"),
      )
    if "rmnp" in loss and "muon" in loss:
      add(
        "RMNP matches Muon's loss at a lower step cost",
        "byte LM",
        both(
          not_worse(loss, "rmnp", "muon", MATCH_TOLERANCE),
          _grid.verdict(step_ms, "rmnp", "muon", "lower"),
        ),
      )
    for p_opt, ref in (("adamp", "adamw"), ("sgdp", "sgd")):
      if p_opt in growth and ref in growth:
        add(
          f"{p_opt}: the BN-fed conv weight norm grows less than under {ref}",
          "CNN + BatchNorm",
          _grid.verdict(growth, p_opt, ref, "lower"),
        )
        add(
          f"{p_opt} lowers {ref}'s validation loss",
          "CNN + BatchNorm",
          _grid.verdict(cnn_loss, p_opt, ref, "lower"),
        )
    return {
      "lm_lines": lm_lines,
      "lr_grid": lr_grid,
      "best_lr": best,
      "chosen": reach,
      "val_loss": loss,
      "target": target,
      "steps_to_target": steps,
      "ms_per_step": step_ms,
      "cnn_lines": growth_lines,
      "norm_growth": growth,
      "cnn_val_loss": cnn_loss,
      "cnn_val_accuracy": cnn_accuracy,
      "verdicts": verdicts,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    best = result["best_lr"]
    # _grid.figure reads run directories by variant name: the best grid
    # point's lines, under their grid names.
    lines = [
      {**ln, "variant": best[ln["variant"]]}
      for ln in result["chosen"]
      if not _diverged(ln, "val_loss")
    ]
    _grid.figure(
      tables["lm"],
      lines,
      "val_loss",
      path,
      f"byte LM: each optimizer at its best learning rate ({len(seeds)} seeds)",
    )
    _grid.figure(
      tables["cnn"],
      result["cnn_lines"],
      "norm_growth",
      path.with_name(f"{path.stem}_cnn.png"),
      f"CNN + BatchNorm on {cnn.data}: validation loss, and the growth of "
      "the BN-fed conv weight norm",
    )

  def markdown(result: dict) -> list[str]:
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Byte LM: width {base.width}, depth {base.depth}, {base.num_heads} "
      f"heads, {base.seq_len}-byte windows, batch {base.batch_size}, "
      f"{base.steps} steps (cosine, warm-up {base.warmup_steps}, weight "
      f"decay {base.weight_decay}, clip {base.clip_norm}), validation every "
      f"{base.eval_every} steps over {base.eval_batches} batches. CNN: "
      f"width {cnn.width}, depth {cnn.depth}, batch {cnn.batch_size}, "
      f"{cnn.steps} steps on {cnn.data}, no weight decay. Seeds "
      f"{list(seeds)}; mean ± sample std (ddof=1) over seeds. Figures: "
      f"`{NAME}.png` (LM), `{NAME}_cnn.png` (CNN).",
      "",
      "## Learning-rate grid (byte LM, validation loss)",
      "",
      "| optimizer @ lr | val loss | diverged runs |",
      "|---|---|---|",
    ]
    order = list(LR_GRID)

    def grid_order(item: tuple[str, Any]) -> tuple[int, float]:
      opt, lr = item[0].split("@")
      return (order.index(opt) if opt in order else len(order), float(lr))

    for name, cell in sorted(result["lr_grid"].items(), key=grid_order):
      mark = ""
      if name in result["best_lr"].values():
        opt, lr = name.split("@")
        grid = LR_GRID.get(opt, ())
        edge = float(lr) in (grid[0], grid[-1]) if len(grid) > 1 else False
        mark = " (best, at the grid's edge)" if edge else " (best)"
      lines.append(f"| {name}{mark} | {_grid.fmt(cell)} | {cell['diverged']} |")
    lines += ["", "## Each optimizer at its best learning rate", ""]
    lines += [
      "| optimizer | lr | val loss | steps to AdamW's final loss "
      f"({result['target']:.3f}) | runs reaching it | ms per step |",
      "|---|---|---|---|---|---|",
    ]
    for opt, name in result["best_lr"].items():
      steps = result["steps_to_target"][opt]
      lines.append(
        f"| {opt} | {name.split('@')[1]} | {_grid.fmt(result['val_loss'][opt])}"
        f" | {_grid.fmt(steps, 0)} | {steps['reached']}/{steps['n']} | "
        f"{_grid.fmt(result['ms_per_step'][opt], 1)} |"
      )
    lines += ["", "## CNN + BatchNorm: scale-invariant weights", ""]
    lines += [
      "| optimizer | lr | norm growth ‖W_T‖/‖W_0‖ | effective step "
      "(‖W_0‖/‖W_T‖)² | val loss | val accuracy |",
      "|---|---|---|---|---|---|",
    ]
    for opt, cell in result["norm_growth"].items():
      eff = _report.mean_spread([v**-2 for v in cell["values"]])
      lines.append(
        f"| {opt} | {CNN_LR[opt]:g} | {_grid.fmt(cell)} | "
        f"{eff[0]:.3f} ± {eff[1]:.3f} | "
        f"{_grid.fmt(result['cnn_val_loss'][opt])} | "
        f"{_grid.fmt(result['cnn_val_accuracy'][opt])} |"
      )
    lines += ["", "## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"], ("setting",))
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
