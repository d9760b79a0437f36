"""DepthBench at CPU scale: who turns extra depth into lower loss.

DepthBench (Wang et al., "DepthBench: Measuring How Residual Connections
Enable More Computational Depth", arXiv:2609.32534; code
``keyu-wang-2002/DepthBench``) trains Llama-style LMs of one size at
several aspect ratios and asks which residual schemes turn extra, narrower
layers into lower loss. Here each scheme trains as the runner's byte LM
(`jaxnorm.nn.models.DecoderLM` on Shakespeare bytes: RMSNorm, GELU MLP of
width ``4 d``, learned positions, tied head) at two shapes of equal
backbone size, a shallow-wide ``(L_s, d_s)`` and a deep-narrow ``(L_d,
d_d)`` with ``L_s d_s^2 = L_d d_d^2`` (`SHAPES`; a layer holds ``12 d^2``
weights). A scheme's depth benefit, per seed, is

  ``benefit = val_loss(L_s, d_s) - val_loss(L_d, d_d)``

(positive: the deeper, narrower model is better), in nats per byte.

Claims (each fixed before running; paired by seed; margin
`claims.MARGINS["nats_per_byte"]` = 0.01):

* Regime (DepthBench): Pre-LN gains little or gets worse when the same
  budget goes to more, narrower layers (read off their Figure 1(a), 400M
  tier: 2.759 at 16 layers, 2.782 at 32): Pre-LN's shallow model is
  ``non_inferior`` to its deep one (at most 0.01 worse). Where it is not,
  Pre-LN uses the extra depth at this scale, DepthBench's contrast is
  absent and the two claims below are ``not testable at this scale``.
* HC (Zhu et al., arXiv:2409.19606) keeps improving with depth where
  Pre-LN does not (Figure 1(a): 2.729 to 2.699): HC's depth benefit is
  ``superior`` (higher) to Pre-LN's by more than 0.01, the difference of
  the two per-seed benefits (a difference in differences: what both lose
  or gain from the shapes alone cancels).
* Full AttnRes (Kimi Team, arXiv:2603.15031; 2.751 to 2.718) likewise:
  its depth benefit is ``superior`` to Pre-LN's by more than 0.01.
* Full AttnRes (same paper, its Table 4: 1.737 vs 1.766 for PreNorm at 16
  layers): lower loss than Pre-LN at the deep shape (``superior``, margin
  0.01; not gated: it compares equal shapes). It runs here rather than in
  `experiments.residual_depth`, whose 16 layers make AttnRes's O(L^2)
  step cost 10x Pre-Norm's (1.1 s per step on 2 cores).
* ``--full`` adds DepthBench's other schemes (Sandwich/Peri-LN, LNS,
  DeepNorm, KEEL, mHC, Block AttnRes) and its extra baselines depth-muP
  and CompleteP, each "gains little or loses with depth" as the Pre-LN
  regime claim, except mHC and Block AttnRes (cells only: DepthBench
  reports their best depth inside the grid, not a trend).

A claim's baseline counts as trained when Pre-LN's validation loss at
both shapes is below the unigram entropy of the validation bytes in every
seed (`experiments._harness.runs.untrained`).

Fair comparison: as DepthBench reports each architecture at its best
learning rate (swept over {5e-4, 1e-3, 2e-3, 5e-3}), every scheme trains
at its own rate, the best of a geometric sweep (1e-3, 3e-3, 1e-2, extended
while the best is at an end) at the deep shape, where the schemes differ,
on seed 0 chosen by the final training loss
(`experiments._harness.grid.tuned_grid`); both shapes then train every
seed at that rate.
Parameters: the two shapes' backbones are equal (``12 L d^2``); the
embeddings (``256 d`` bytes and ``seq_len x d`` positions) make the
shallow-wide model's total larger (default: 252,384 vs 237,360 for
Pre-LN, +6.3%), alike for every scheme, so the relative claims compare
equal shapes; HC adds its maps (+2.4% over Pre-LN at the deep shape, +1.1%
at the shallow one), AttnRes its queries and key norms (+0.7%, +0.4%);
each record's setting gives every cell's count.

Regime: shapes (2, 96) and (8, 48) (aspect ratio 48 and 6), 4 heads,
64-byte windows, batch 8, `DEFAULT_STEPS` AdamW steps (cosine, 10% warm-up,
weight decay 0.1, clip 1.0), 3 seeds. ``--full``: DepthBench's 16 and 32
layers, ``(16, 360)`` and ``(32, 256)`` (backbones within 1.1%), 8 heads,
256-byte windows, batch 32, 2000 steps, 5 seeds. ``--quick`` (the tests):
shapes (1, 16) and (4, 8), one seed, no sweep.

Deviations: DepthBench's models have about 405M parameters (16-32 layers,
widths 1216-896) trained on 8B tokens of FineWeb-Edu; here a 0.2M
parameter byte LM trains on 0.15M bytes, and the default shapes (2 vs 8
layers) are far shallower. Depth-muP and CompleteP follow DepthBench's
recipe (`jaxnorm.residual.BASE_DEPTH` = 24 and its AdamW rule by depth,
`jaxnorm.training.optimizers.depth_adam_rule`, which the runner applies to
these schemes): at CPU depths ``m = L / 24 < 1`` (2/24 and 8/24), a range
DepthBench never ran, so they run only in ``--full`` (``m`` = 2/3 and
4/3), where their records say so.

  python -m experiments.depthbench [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import residual_depth as rd
from experiments._harness import grid, report, runs, tiers
from jaxnorm import residual
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib

NAME = "depthbench"
MARGIN = claims.MARGINS["nats_per_byte"]
DEFAULT_STEPS = 300
# (shallow-wide, deep-narrow) (layers, width) per tier: equal 12 L d^2.
SHAPES = {
  "quick": ((1, 16), (4, 8)),
  "default": ((2, 96), (8, 48)),
  "full": ((16, 360), (32, 256)),
}
# Schemes claimed to turn depth into lower loss, against Pre-LN.
IMPROVE = ("hc", "attnres")
DEFAULT_SCHEMES = ("prenorm", *IMPROVE)
# DepthBench's "little or no gain" schemes and extra baselines (--full).
FLAT = ("sandwich", "lns", "deepnorm", "keel", "depth_mup", "completep")
FULL_SCHEMES = (*DEFAULT_SCHEMES, *FLAT, "mhc", "block_attnres")
LEARNING_RATES = rd.LEARNING_RATES

PAPER = ("DepthBench", "2609.32534")
# The claims that need Pre-LN's flat depth (the regime).
GATED = tuple(f"{s}_benefit" for s in IMPROVE)


def cell(scheme: str, shape: tuple[int, int]) -> str:
  """The grid's name of one (scheme, shape) cell."""
  return f"{scheme}-L{shape[0]}d{shape[1]}"


def schemes_of(args: argparse.Namespace) -> tuple[str, ...]:
  """The tier's schemes."""
  return FULL_SCHEMES if tiers.tier(args) == "full" else DEFAULT_SCHEMES


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier (shape set per cell)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=48,
      depth=8,
      num_heads=4,
      seq_len=64,
      batch_size=8,
      steps=DEFAULT_STEPS,
      eval_every=100,
      eval_batches=8,
      warmup_steps=DEFAULT_STEPS // 10,
    ),
    full_steps=2000,
    full_eval_every=250,
  )


def make_claims(
  schemes: Sequence[str], shallow: str, deep: str
) -> dict[str, claims.Claim]:
  """The claims over ``schemes`` (module docstring).

  ``shallow`` and ``deep`` name the shapes in the claims' text.
  """

  def flat(scheme: str) -> claims.Claim:
    return claims.Claim(
      paper=PAPER[0],
      arxiv=PAPER[1],
      claim=f"{scheme} gains little or gets worse when the same budget "
      f"goes to more, narrower layers ({shallow} vs {deep})",
      metric="val_loss",
      direction="lower",
      kind="non_inferior",
      margin=MARGIN,
      a=cell_of[scheme][0],
      b=cell_of[scheme][1],
    )

  cell_of = {s: (f"{s}@shallow", f"{s}@deep") for s in schemes}
  out = {"prenorm_flat": flat("prenorm")}
  for s in IMPROVE:
    out[f"{s}_benefit"] = claims.Claim(
      paper=PAPER[0],
      arxiv=PAPER[1],
      claim=f"{s} turns extra depth into lower loss where Pre-LN does not: "
      f"its depth benefit (loss at {shallow} minus loss at {deep}) exceeds "
      "Pre-LN's",
      metric="depth_benefit",
      direction="higher",
      kind="superior",
      margin=MARGIN,
      a=s,
      b="prenorm",
    )
  out["attnres_loss"] = claims.Claim(
    paper="Attention Residuals",
    arxiv="2603.15031",
    claim=f"Full AttnRes lowers Pre-Norm's loss (Table 4, 16 layers: 1.737 "
    f"vs 1.766), at {deep}",
    metric="val_loss",
    direction="lower",
    kind="superior",
    margin=MARGIN,
    a="attnres@deep",
    b="prenorm@deep",
  )
  for s in FLAT:
    if s in schemes:
      out[f"{s}_flat"] = flat(s)
  return out


def benefit_lines(
  lines: Sequence[Mapping[str, Any]],
  schemes: Sequence[str],
  shapes: tuple[tuple[int, int], tuple[int, int]],
) -> list[dict[str, Any]]:
  """Per scheme and seed: the depth benefit, and the cells as aliases.

  Returns lines ``{"variant": scheme, "seed", "depth_benefit"}`` (seeds
  with both shapes) and each cell's lines again under
  ``<scheme>@shallow`` / ``<scheme>@deep`` (the claims' arm names).
  """
  shallow, deep = shapes
  out = []
  for s in schemes:
    by_seed = {}
    for which, shape in (("shallow", shallow), ("deep", deep)):
      for ln in lines:
        if ln["variant"] == cell(s, shape):
          out.append({**ln, "variant": f"{s}@{which}"})
          by_seed.setdefault(ln["seed"], {})[which] = ln["val_loss"]
    for seed, v in sorted(by_seed.items()):
      if len(v) == 2 and None not in v.values():
        out.append(
          {
            "variant": s,
            "seed": seed,
            "depth_benefit": v["shallow"] - v["deep"],
          }
        )
  return out


def _m_note(scheme: str, shapes) -> str | None:
  """depth-muP / CompleteP: their depth multiplier ``m = L / 24``."""
  if scheme not in residual.DEPTH_EXPONENTS:
    return None
  ms = ", ".join(f"{L}/{residual.BASE_DEPTH}" for L, _ in shapes)
  return (
    f"DepthBench's base depth {residual.BASE_DEPTH} and AdamW rule by "
    f"depth; m = L/{residual.BASE_DEPTH} = {ms}"
  )


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  the_claims: Mapping[str, claims.Claim],
  schemes: Sequence[str],
  shapes: tuple[tuple[int, int], tuple[int, int]],
  unigram: float,
) -> list[dict[str, Any]]:
  """The claims' records; Pre-LN's flat depth gates the relative claims."""
  derived = benefit_lines(lines, schemes, shapes)
  cells_of = {
    s: {"shallow": cell(s, shapes[0]), "deep": cell(s, shapes[1])}
    for s in schemes
  }
  misses = [
    runs.untrained(lines, c, unigram, what="the unigram entropy")
    for c in cells_of["prenorm"].values()
  ]
  untrained = "; ".join(m for m in misses if m) or None
  trained = untrained is None
  cfg = config_lib.to_json(config_lib.resolve(base))

  def arm(name: str) -> tuple[dict, dict]:
    """An arm's config and setting: a cell, or a scheme's two cells."""
    scheme, _, which = name.partition("@")
    names = [cells_of[scheme][which]] if which else cells_of[scheme].values()
    settings = {
      n: {**grid.setting(lines, base, variants, n), "cell": n} for n in names
    }
    if which:
      (only,) = settings.values()
      return dict(variants[only["cell"]]), only
    deep = settings[cells_of[scheme]["deep"]]
    setting = {
      **deep,
      "learning_rate": None,
      "cells": list(settings.values()),
    }
    return {n: dict(variants[n]) for n in names}, setting

  out = {}
  for key, claim in the_claims.items():
    (cfg_a, set_a), (cfg_b, set_b) = arm(claim.a), arm(claim.b)
    testable, reason = True, untrained
    note = _m_note(claim.a.split("@")[0], shapes)
    if key in GATED and out["prenorm_flat"]["verdict"] != "reproduced":
      testable = False
      reason = (
        "DepthBench's regime is not shown at this scale: Pre-LN's shallow "
        "model is not shown to be within the margin of its deep one "
        f"({out['prenorm_flat']['why']})"
      )
    if note:
      reason = note if reason is None else f"{reason}; {note}"
    out[key] = grid.claim_record(
      [*lines, *derived],
      claim,
      baseline_trained=trained,
      config={"base": cfg, "a": cfg_a, "b": cfg_b},
      setting={"a": set_a, "b": set_b},
      testable=testable,
      reason=reason,
    )
  return list(out.values())


def figure_depth(ax: Any, result: Mapping[str, Any], shapes) -> None:
  """Validation loss at the two shapes, one line per scheme (mean, std)."""
  cells = result["val_loss"]
  xs = [L for L, _ in shapes]
  for scheme in result["schemes"]:
    stats = [cells.get(cell(scheme, s)) for s in shapes]
    if None in stats:
      continue
    ax.errorbar(
      xs,
      [c["mean"] for c in stats],
      yerr=[c["std"] for c in stats],
      marker="o",
      capsize=3,
      label=scheme,
    )
  ax.set_xscale("log", base=2)
  ax.set_xticks(xs, [f"L={L}, d={d}" for L, d in shapes])
  ax.set_xlabel("shape (equal backbone size)")
  ax.set_ylabel("validation loss (nats/byte)")
  ax.set_title("loss against depth at a fixed budget (mean ± std)")
  ax.legend(fontsize=7)


def figure_benefit(ax: Any, result: Mapping[str, Any]) -> None:
  """Each scheme's depth benefit (mean ± std over seeds), from 0."""
  report.cells_bars(ax, result["depth_benefit"])
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set_ylabel("depth benefit: loss(shallow) - loss(deep) (nats/byte)")
  ax.set_title("depth benefit per scheme (mean ± std; > 0: deeper is better)")


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the tuned grid (skipping finished runs) and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  schemes = schemes_of(args)
  shapes = SHAPES[tiers.tier(args)]
  shallow, deep = (f"{L} layers x {d}" for L, d in shapes)
  the_claims = make_claims(schemes, shallow, deep)
  deep_cells = {
    cell(s, shapes[1]): {
      "residual": s,
      "depth": shapes[1][0],
      "width": shapes[1][1],
    }
    for s in schemes
  }
  folder = pathlib.Path(args.runs)
  table = folder / "grid.jsonl"
  rates = (
    {}
    if tiers.tier(args) == "quick"
    else {name: LEARNING_RATES for name in deep_cells}
  )
  unigram = runs.chance_loss(base)

  def compute() -> dict:
    with rd.compilation_cache(folder / "xla_cache"):
      lines, tuned = grid.tuned_grid(table, base, deep_cells, seeds, rates)
      variants = dict(tuned["variants"])
      shallow_cells = {
        cell(s, shapes[0]): {
          "residual": s,
          "depth": shapes[0][0],
          "width": shapes[0][1],
          "learning_rate": rd.learning_rate(variants, cell(s, shapes[1]), base),
        }
        for s in schemes
      }
      variants.update(shallow_cells)
      lines += grid.fixed_rate_grid(table, base, shallow_cells, seeds)
    derived = benefit_lines(lines, schemes, shapes)
    return {
      "schemes": list(schemes),
      "shapes": [list(s) for s in shapes],
      "unigram_entropy": unigram,
      "claims": records(
        lines, base, variants, the_claims, schemes, shapes, unigram
      ),
      "sweeps": tuned["sweeps"],
      "variants": variants,
      "lines": lines,
      "val_loss": grid.cells(lines, "val_loss"),
      "params": grid.cells(lines, "params"),
      "depth_benefit": grid.cells(
        [ln for ln in derived if "depth_benefit" in ln], "depth_benefit"
      ),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.5))
    figure_depth(axes[0], result, shapes)
    figure_benefit(axes[1], result)
    report.claims_axes(axes[2], result["claims"])
    fig.suptitle(
      f"DepthBench at CPU scale: {shallow} vs {deep}, {base.steps} steps "
      f"({len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    params = result["params"]
    out = [
      f"Runner config: shapes {shallow} and {deep} (MLP 4 d), "
      f"{base.num_heads} heads, {base.seq_len}-byte windows, batch "
      f"{base.batch_size}, {base.steps} AdamW steps (cosine, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}, clip "
      f"{base.clip_norm}), seeds {list(seeds)}. Validation loss in nats "
      f"per byte over {base.eval_batches} held-out batches (unigram "
      f"entropy {result['unigram_entropy']:.3f}); mean ± sample std "
      "(ddof=1) over seeds.",
      "",
      f"## Learning rates (swept at {deep}; seed 0, final training loss)",
      "",
      *report.sweep_rows(result["sweeps"]),
      "",
      f"The {shallow} cells train at their scheme's rate.",
      "",
      "## Validation loss and depth benefit",
      "",
      "| scheme | "
      + " | ".join(f"L={L} d={d} (params)" for L, d in shapes)
      + " | depth benefit |",
      "|---|" + "---|" * (len(shapes) + 1),
    ]
    for scheme in result["schemes"]:
      row = []
      for shape in shapes:
        name = cell(scheme, shape)
        c = result["val_loss"].get(name)
        row.append(
          "" if c is None else f"{grid.fmt(c)} ({int(params[name]['mean']):,})"
        )
      b = result["depth_benefit"].get(scheme)
      row.append("" if b is None else grid.fmt(b))
      out.append(f"| {scheme} | " + " | ".join(row) + " |")
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
