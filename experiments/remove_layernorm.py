"""LayerNorm removal by fine-tuning (FakeLN) on trained Pre-LN byte LMs.

Claims (Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim,
"Transformers Don't Need LayerNorm at Inference Time", arXiv:2507.02559),
fixed before running; metric: validation loss in nats per byte, lower is
better:

* the regime: LayerNorm matters in the trained parent, i.e. removing it
  without fine-tuning (every LayerNorm frozen to its running-average std on
  the removal schedule, no weight update, then folded away) raises the
  loss: the parent is ``superior`` (margin 0) to that LN-free model. Where
  it is not, removal is trivial here and the two claims below are ``not
  testable at this scale``;
* all LayerNorms can be removed by fine-tuning "with only a small increase
  in validation loss" (the paper: +0.03 nats per token for GPT-2 XL, about
  0.007 nats per byte at GPT-2's ~4 bytes per token): the LN-free model is
  ``non_inferior`` to the same fine-tune with LayerNorm kept (the paper's
  comparison), margin `claims.MARGINS["nats_per_byte"]` (0.01, of the
  paper's size per byte);
* and ``non_inferior`` to the parent, same margin.

Method (`jaxnorm.nn.fakeln`, `jaxnorm.nn.convert`): every LayerNorm of the
parent becomes a FakeLN, real until its step of the removal schedule
(`convert.removal_steps`, start 20, gap 2: the last event, position 0's
own std off, at step 100 for 4 layers), then dividing by its frozen
running-average std; after fine-tuning the model is exported without any
norm (``norm="none"``, `convert.remove_fake_ln`) and evaluated. Runs:

* the parents (`experiments.convert_prenorm`'s: Pre-LN, untied head,
  biases, width 64, depth 4, 400 AdamW steps of 16 x 64 bytes of
  Shakespeare), 3 seeds, trained by the runner;
* the fine-tunes of each parent, 200 steps through the runner
  (``trainer.train(cfg, model=...)``): ``ln-kept`` (LayerNorm real) and
  ``fakeln`` (the removal schedule), each at its own learning rate, the
  best of a sweep on seed 0 by the final training loss, inside the grid
  (`experiments._harness.grid.tuned_grid`);
* ``ln-free-no-ft``: the regime's baseline, the same schedule run by
  training-mode forward passes on the training data without any update.

Every arm is evaluated on the runner's validation batches of the parent's
config and paired by the parent's seed. The LN-free export has the
parent's parameters less the LayerNorms' (the norms fold into their
readers).

  python -m experiments.remove_layernorm [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import _lm, convert_prenorm
from experiments._harness import grid, report, runs, tiers
from jaxnorm.nn import convert, fakeln
from jaxnorm.training import claims, metrics
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "remove_layernorm"
MARGIN = claims.MARGINS["nats_per_byte"]
PARENT, KEPT, FAKE = "parent", "ln-kept", "fakeln"
FREE, NO_FT = "ln-free", "ln-free-no-ft"
FINETUNES: dict[str, dict[str, Any]] = {KEPT: {}, FAKE: {}}
LEARNING_RATES = {name: (3e-4, 1e-3, 3e-3) for name in FINETUNES}
# The removal schedule per tier: (start, gap).
SCHEDULE = {"quick": (1, 1), "default": (20, 2), "full": (20, 2)}

_claim = functools.partial(
  claims.Claim,
  paper="LayerNorm removal (FakeLN)",
  arxiv="2507.02559",
  metric="val_loss",
  direction="lower",
)

REGIME = _claim(
  claim="LayerNorm matters: removing it without fine-tuning raises the loss",
  kind="superior",
  margin=0.0,
  a=PARENT,
  b=NO_FT,
)
CLAIMS = (
  _claim(
    claim="every LayerNorm can be removed by fine-tuning with only a small "
    "increase in validation loss (vs the same fine-tune with LayerNorm)",
    kind="non_inferior",
    margin=MARGIN,
    a=FREE,
    b=KEPT,
  ),
  _claim(
    claim="every LayerNorm can be removed by fine-tuning with only a small "
    "increase in validation loss (vs the parent)",
    kind="non_inferior",
    margin=MARGIN,
    a=FREE,
    b=PARENT,
  ),
)


def schedule(args: argparse.Namespace, depth: int) -> dict:
  """`convert.removal_steps` of the tier: ``{(event, layer): step}``."""
  start, gap = SCHEDULE[tiers.tier(args)]
  return convert.removal_steps(depth, start=start, gap=gap)


def finetune_config(
  args: argparse.Namespace, base: config_lib.TrainConfig
) -> config_lib.TrainConfig:
  """The fine-tunes' run: twice the schedule's end (once in --quick)."""
  end = schedule(args, base.depth)[("bos_off", None)]
  steps = end + 1 if tiers.tier(args) == "quick" else 2 * end
  return dataclasses.replace(
    base,
    steps=steps,
    eval_every=max(steps // 4, 1),
    log_every=max(steps // 20, 1),
    warmup_steps=min(10, steps // 10),
  )


def calibrate(model: nnx.Module, cfg: config_lib.TrainConfig, steps: int):
  """Runs ``steps`` training-mode forward passes of training batches.

  No parameter changes: only the FakeLN state (running stds, step
  counters) moves, so the removal schedule runs without fine-tuning.
  """
  model.train()
  graphdef, state = nnx.split(model)

  @jax.jit
  def call(state, x):
    m = nnx.merge(graphdef, state)
    m(x)
    return nnx.state(m)

  text = data_lib.load_text(cfg.data)
  it = iter(
    data_lib.text_windows(
      text.train, cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed
    )
  )
  for _ in range(steps):
    state = call(state, jnp.asarray(next(it))[:, :-1])
  nnx.update(model, state)
  model.eval()


def _params(model: nnx.Module) -> int:
  return int(sum(np.size(x) for x in jax.tree.leaves(nnx.state(model))))


def main(argv: Sequence[str] | None = None) -> dict:
  """Trains parents and fine-tunes (skipping finished runs), reports."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = convert_prenorm.base_config(args)
  ft_base = finetune_config(args, base)
  seeds = tiers.seeds(args)
  folder = pathlib.Path(args.runs)
  parents_table = folder / "parents.jsonl"
  ft_table = folder / "finetune.jsonl"
  events = schedule(args, base.depth)
  start, gap = SCHEDULE[tiers.tier(args)]
  rates = {} if tiers.tier(args) == "quick" else LEARNING_RATES
  parents: dict[int, convert.Params] = {}
  parent_config = _lm.pre_ln(base, 0).config

  def parent(seed: int) -> nnx.Module:
    if seed not in parents:
      model = runs.trained(
        parents_table,
        base,
        {},
        PARENT,
        seed,
        model=lambda: _lm.pre_ln(base, seed),
      )
      parents[seed] = convert.lm_params(model)
    return convert.load_lm(parent_config, parents[seed])

  def finetuned(variant: str, seed: int) -> nnx.Module:
    model = parent(seed)
    if variant != KEPT:
      fakeln.install_fake_ln(model, start=start, gap=gap)
    return model

  def compute() -> dict:
    parent_lines = grid.run_grid(
      parents_table,
      base,
      {PARENT: {}},
      seeds,
      model=lambda _, s: _lm.pre_ln(base, s),
    )
    ft_lines, tuned = grid.tuned_grid(
      ft_table, ft_base, FINETUNES, seeds, rates, model=finetuned
    )
    batches = _lm.val_batches(base)
    lines, export_diff, params = [], [], {}
    for seed in seeds:
      p = parent(seed)
      params[PARENT] = _params(p)
      loss, _ = _lm.evaluate(p, batches)
      lines.append({"variant": PARENT, "seed": seed, "val_loss": loss})
      ft = {
        ln["variant"]: ln for ln in ft_lines if ln["seed"] == seed
      }  # fmt: skip
      lines.append(
        {"variant": KEPT, "seed": seed, "val_loss": ft[KEPT]["val_loss"]}
      )
      fake = runs.trained(
        ft_table,
        ft_base,
        tuned["variants"][FAKE],
        ft[FAKE]["run"],
        seed,
        model=lambda s=seed: finetuned(FAKE, s),
      )
      fake_loss, fake_logits = _lm.evaluate(fake, batches)
      lines.append({"variant": FAKE, "seed": seed, "val_loss": fake_loss})
      free_p, free_c = convert.remove_fake_ln(
        convert.lm_params(fake), fake.config
      )
      free = convert.load_lm(free_c, free_p)
      params[FREE] = _params(free)
      free_loss, free_logits = _lm.evaluate(free, batches)
      export_diff.append(
        max(
          float(np.max(np.abs(a - b))) for a, b in zip(fake_logits, free_logits)
        )
      )
      lines.append({"variant": FREE, "seed": seed, "val_loss": free_loss})
      raw = finetuned(NO_FT, seed)
      calibrate(raw, dataclasses.replace(ft_base, seed=seed), ft_base.steps)
      nf_p, nf_c = convert.remove_fake_ln(convert.lm_params(raw), raw.config)
      loss, _ = _lm.evaluate(convert.load_lm(nf_c, nf_p), batches)
      lines.append({"variant": NO_FT, "seed": seed, "val_loss": loss})
    parent_setting = grid.setting(parent_lines, base, {PARENT: {}}, PARENT)

    def after(variant: str, **extra) -> dict[str, Any]:
      s = grid.setting(ft_lines, ft_base, tuned["variants"], variant)
      total = parent_setting["steps"] + s["steps"]
      return {
        **s,
        "steps": total,
        "examples": total * base.batch_size * base.seq_len,
        "fine_tune_steps": s["steps"],
        **extra,
      }

    settings = {
      PARENT: parent_setting,
      KEPT: after(KEPT),
      FREE: after(FAKE, params=params[FREE], norm="none (exported)"),
      NO_FT: {
        **parent_setting,
        "params": params[FREE],
        "norm": "none (exported)",
        "calibration": f"{ft_base.steps} training-mode forward passes, no "
        "update",
      },
    }
    config = {
      "parent": config_lib.to_json(config_lib.resolve(base)),
      "fine_tune": config_lib.to_json(config_lib.resolve(ft_base)),
      "fine_tune_learning_rates": {
        k: v.get("learning_rate") for k, v in tuned["variants"].items()
      },
      "schedule": {"start": start, "gap": gap},
    }

    def rec(claim, **kw):
      return grid.claim_record(
        lines,
        claim,
        baseline_trained=True,
        config=config,
        setting={"a": settings[claim.a], "b": settings[claim.b]},
        **kw,
      )

    regime = rec(REGIME)
    present = regime["verdict"] == "reproduced"
    why = (
      None
      if present
      else "LayerNorm does not matter in this parent: removing it without "
      f"fine-tuning does not raise the loss ({regime['why']})"
    )
    return {
      "claims": [regime]
      + [rec(c, testable=present, reason=why) for c in CLAIMS],
      "sweeps": tuned["sweeps"],
      "lines": lines,
      "parents": parent_lines,
      "finetunes": ft_lines,
      "val_loss": grid.cells(lines, "val_loss"),
      "export_vs_fake_max_abs_logit_diff": max(export_diff),
      "schedule": {
        f"{e}{'' if i is None else f'[{i}]'}": s for (e, i), s in events.items()
      },
      "fine_tune_steps": ft_base.steps,
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.6))
    ax = axes[0]
    for variant, color in ((KEPT, "tab:blue"), (FAKE, "tab:red")):
      label = "LayerNorm kept" if variant == KEPT else "FakeLN removal"
      for ln in result["finetunes"]:
        if ln["variant"] != variant:
          continue
        log = metrics.read_log(
          grid.run_dir(ft_table.parent, ln["run"], ln["seed"]) / "metrics.jsonl"
        )
        rows = [r for r in log if r.get("loss") is not None]
        first = ln["seed"] == seeds[0]
        ax.plot(
          [r["step"] for r in rows],
          [r["loss"] for r in rows],
          color=color,
          alpha=0.6,
          label=f"{label} (train)" if first else None,
        )
    colors = {"ln_2": "tab:green", "ln_1v": "tab:purple", "ln_f": "black",
              "bos_off": "tab:orange"}  # fmt: skip
    seen = set()
    for (event, _), step in sorted(events.items(), key=lambda kv: kv[1]):
      if event not in colors:
        continue  # ln_1 goes at its V-path step; bytes have no EOT token.
      name = "position-0 std off" if event == "bos_off" else f"{event} removed"
      ax.axvline(step + 1, color=colors[event], lw=0.8, ls="--",
                 label=None if event in seen else name)  # fmt: skip
      seen.add(event)
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_ylim(bottom=0)
    ax.set_title("fine-tuning over the removal schedule")
    ax.legend(fontsize=7)
    report.cells_bars(axes[1], result["val_loss"], rotation=30)
    axes[1].set_ylim(bottom=0)
    axes[1].set_ylabel("validation loss (nats/byte), mean ± std")
    axes[1].set_title("every arm, paired by the parent's seed")
    report.claims_axes(axes[2], result["claims"])
    fig.suptitle(
      f"LayerNorm removal: {base.width}x{base.depth} Pre-LN byte LM, "
      f"{ft_base.steps} fine-tuning steps, {len(seeds)} seeds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    out = ["Parents:", ""] + report.runner_lines(base, seeds)
    out += [
      f"Fine-tunes: {ft_base.steps} steps from each parent, warm-up "
      f"{ft_base.warmup_steps}, the removal schedule of "
      f"`convert.removal_steps({base.depth}, start={start}, gap={gap})`: "
      + ", ".join(f"{k} {v}" for k, v in result["schedule"].items())
      + ".",
      "",
    ]
    out += report.sweep_lines(result["sweeps"]) if result["sweeps"] else []
    out += ["## Validation loss", ""]
    out += grid.markdown_table(result["val_loss"], "val loss", PARENT)
    out += [
      "",
      "The LN-free export computes the FakeLN model's logits to "
      f"{result['export_vs_fake_max_abs_logit_diff']:.1e} (largest absolute "
      "difference over the validation batches and seeds).",
    ]
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
