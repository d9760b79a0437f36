"""LayerNorm removal by fine-tuning (FakeLN) on a trained Pre-LN LM.

1. trains a Pre-LN byte-level LM on Shakespeare (the parent);
2. fine-tunes a copy with every LayerNorm real (the vanilla baseline);
3. fine-tunes another copy whose LayerNorms turn into FakeLNs (frozen
   running-average std) on the schedule of `jaxnorm.nn.convert.removal_steps`
   (`jaxnorm.nn.fakeln.install_fake_ln`), through the experiment engine
   (``trainer.train(cfg, model=...)``);
4. exports the result without any norm (`jaxnorm.nn.convert.remove_fake_ln`,
   ``norm="none"``) and checks it computes the fake-mode logits.

Reports the validation loss of the parent, the vanilla fine-tune, the FakeLN
model and the LN-free export; plots the fine-tuning losses over the removal
schedule. Writes ``<out>/remove_layernorm.{json,md,png}``.

  python -m experiments.remove_layernorm --out runs/remove_layernorm
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments import _lm  # noqa: E402
from jaxnorm.nn import (
  convert,  # noqa: E402
  fakeln,  # noqa: E402
)
from jaxnorm.training import metrics, trainer  # noqa: E402


def _curve(run_dir: pathlib.Path, key: str) -> tuple[list, list]:
  rows = [r for r in metrics.read_log(run_dir / "metrics.jsonl") if key in r]
  return [r["step"] for r in rows], [r[key] for r in rows]


def _plot(out: pathlib.Path, schedule: dict, result: dict) -> None:
  fig, ax = plt.subplots(figsize=(9, 5))
  for name, color in (
    ("finetune_ln", "tab:blue"),
    ("finetune_fakeln", "tab:red"),
  ):
    label = "LayerNorm kept" if name == "finetune_ln" else "FakeLN removal"
    steps, loss = _curve(out / name, "loss")
    ax.plot(steps, loss, color=color, alpha=0.6, label=f"{label} (train)")
    steps, loss = _curve(out / name, "val_loss")
    ax.plot(steps, loss, "o-", color=color, label=f"{label} (val)")
  colors = {
    "ln_2": "tab:green",
    "ln_1v": "tab:purple",
    "ln_f": "black",
    "bos_off": "tab:orange",
  }
  seen = set()
  for (event, layer), step in sorted(schedule.items(), key=lambda kv: kv[1]):
    if event not in colors:
      continue  # ln_1 is removed at its V-path step; no EOT token in bytes.
    # Events fire at the start of 0-based step s = engine step s + 1.
    ax.axvline(
      step + 1,
      color=colors[event],
      lw=0.8,
      ls="--",
      label=None
      if event in seen
      else f"{event} removed"
      if event != "bos_off"
      else "position-0 std off",
    )
    seen.add(event)
  ax.axhline(
    result["parent_val_loss"], color="gray", lw=1, label="parent val loss"
  )
  ax.set_xlabel("fine-tuning step")
  ax.set_ylabel("cross-entropy (nats/byte)")
  ax.set_title("LayerNorm removal by FakeLN fine-tuning")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "remove_layernorm.png", dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
  """Runs the experiment; returns the results dict."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  _lm.add_model_flags(parser)
  parser.add_argument(
    "--start",
    type=int,
    default=20,
    help="fine-tuning steps before the first removal",
  )
  parser.add_argument(
    "--gap",
    type=int,
    default=2,
    help="stretch of the removal schedule (1 = GPT-2's)",
  )
  parser.add_argument(
    "--finetune-steps",
    type=int,
    default=0,
    help="fine-tuning steps (0: 2x the schedule's end)",
  )
  parser.add_argument("--finetune-lr", type=float, default=1e-3)
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  start = time.time()
  parent = _lm.train_parent(args)
  cfg, params = parent.config, convert.lm_params(parent)
  batches = _lm.val_batches(args)
  parent_loss, _ = _lm.evaluate(parent, batches)
  schedule = convert.removal_steps(args.depth, start=args.start, gap=args.gap)
  steps = args.finetune_steps or 2 * schedule[("bos_off", None)]

  vanilla = convert.load_lm(cfg, params)
  trainer.train(
    _lm.run_config(args, "finetune_ln", steps, learning_rate=args.finetune_lr),
    model=vanilla,
  )
  vanilla_loss, _ = _lm.evaluate(vanilla, batches)

  fake = convert.load_lm(cfg, params)
  fakeln.install_fake_ln(fake, start=args.start, gap=args.gap)
  trainer.train(
    _lm.run_config(
      args, "finetune_fakeln", steps, learning_rate=args.finetune_lr
    ),
    model=fake,
  )
  fake_loss, fake_logits = _lm.evaluate(fake, batches)
  free_p, free_c = convert.remove_fake_ln(convert.lm_params(fake), cfg)
  free_loss, free_logits = _lm.evaluate(
    convert.load_lm(free_c, free_p), batches
  )
  diff = max(
    float(np.max(np.abs(a - b))) for a, b in zip(fake_logits, free_logits)
  )
  result = {
    "config": {k: getattr(args, k) for k in vars(args)},
    "finetune_steps": steps,
    "schedule": {
      f"{e}{'' if i is None else f'[{i}]'}": s for (e, i), s in schedule.items()
    },
    "parent_val_loss": parent_loss,
    "vanilla_finetune_val_loss": vanilla_loss,
    "fakeln_val_loss": fake_loss,
    "ln_free_val_loss": free_loss,
    "ln_free_minus_vanilla": free_loss - vanilla_loss,
    "ln_free_minus_parent": free_loss - parent_loss,
    "max_abs_logit_diff_export_vs_fake": diff,
    "seconds": time.time() - start,
    "machine": f"{platform.machine()} {jax.devices()[0].platform}",
  }
  (out / "remove_layernorm.json").write_text(json.dumps(result, indent=2))
  _plot(out, schedule, result)
  table = "\n".join(
    [
      "| model | val loss |",
      "|---|---|",
      f"| Pre-LN parent | {parent_loss:.4f} |",
      f"| fine-tuned, LayerNorm kept ({steps} steps) | {vanilla_loss:.4f} |",
      f"| fine-tuned, FakeLN (all removed) | {fake_loss:.4f} |",
      f"| LN-free export (norm='none') | {free_loss:.4f} |",
    ]
  )
  (out / "remove_layernorm.md").write_text(table + "\n")
  print(table)
  print(
    f"LN-free - vanilla: {free_loss - vanilla_loss:+.4f}; LN-free - "
    f"parent: {free_loss - parent_loss:+.4f}; export vs fake max logit "
    f"diff {diff:.2e}; {result['seconds']:.0f} s"
  )
  return result


if __name__ == "__main__":
  main()
