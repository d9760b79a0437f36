"""Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm on a trained LM.

Trains a Pre-LN byte-level LM on Shakespeare with the experiment engine,
converts it both ways with `jaxnorm.nn.convert` and reports, on the validation
batches, the maximum absolute logit difference of each variant to the
Pre-LN model and the validation loss of all three. Writes
``<out>/convert_prenorm.json`` and ``<out>/convert_prenorm.md``.

  python -m experiments.convert_prenorm --out runs/convert_prenorm
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import jax
import numpy as np

from experiments import _lm
from jaxnorm.nn import convert


def main(argv: list[str] | None = None) -> dict:
  """Runs the experiment; returns the results dict."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  _lm.add_model_flags(parser)
  args = parser.parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  start = time.time()
  parent = _lm.train_parent(args)
  cfg = parent.config
  params = convert.lm_params(parent)
  batches = _lm.val_batches(args)
  variants = {
    "Pre-LN": (params, cfg),
    "Pre-RMSNorm": convert.to_pre_rmsnorm(params, cfg),
    "Pre-CRMSNorm": convert.to_pre_crmsnorm(params, cfg),
  }
  rows, ref = {}, None
  for name, (p, c) in variants.items():
    loss, logits = _lm.evaluate(convert.load_lm(c, p), batches)
    logits = np.concatenate(logits)
    ref = logits if ref is None else ref
    rows[name] = {
      "val_loss": loss,
      "max_abs_logit_diff": float(np.max(np.abs(logits - ref))),
      "width": c.width,
      "norm": c.norm,
      "params": int(sum(np.size(x) for x in jax.tree.leaves(p))),
    }
  result = {
    "config": {k: getattr(args, k) for k in vars(args)},
    "max_abs_logit": float(np.max(np.abs(ref))),
    "variants": rows,
    "seconds": time.time() - start,
    "machine": f"{platform.machine()} {jax.devices()[0].platform}",
  }
  (out / "convert_prenorm.json").write_text(json.dumps(result, indent=2))
  lines = [
    "| model | norm | width | val loss | max abs logit diff |",
    "|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    lines.append(
      f"| {name} | {r['norm']} | {r['width']} | "
      f"{r['val_loss']:.4f} | {r['max_abs_logit_diff']:.2e} |"
    )
  table = "\n".join(lines)
  (out / "convert_prenorm.md").write_text(table + "\n")
  print(table)
  print(f"max |logit| {result['max_abs_logit']:.2f}; {result['seconds']:.0f} s")
  return result


if __name__ == "__main__":
  main()
