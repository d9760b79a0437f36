"""LLM.int8() on a tiny byte LM with simulated emergent outliers.

Trains a pre-RMSNorm byte LM on Shakespeare (`experiments._bytelm`), then
injects function-preserving outlier features: for every pre-norm, the gain
of 3 feature dims is multiplied by ``c`` (40) and rows of the following
Q/K/V or MLP-in kernels are divided by ``c`` (the float32 loss is unchanged,
checked). Validation loss with the Q/K/V and MLP (up, down) matmuls replaced
by tensor-wise int8, vector-wise int8 and LLM.int8() (threshold 6, outlier
columns in float32), with and without injection, over several seeds; plus
the fraction of activation values routed to high precision.

  python -m experiments.llm_int8            # default run (a few minutes)
  python -m experiments.llm_int8 --quick    # seconds, for the tests

Writes ``<out>/llm_int8.{md,json,png}``.
"""

from __future__ import annotations

import argparse
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import _bytelm
from experiments._harness import report as _report
from jaxnorm import quant, sharding
from jaxnorm.nn import layers
from jaxnorm.nn import quant as nn_quant
from jaxnorm.nn.attention import multihead

MODES = ("none", "tensor", "vector", "mixed")
LABELS = {
  "none": "fp32",
  "tensor": "int8 tensor-wise",
  "vector": "int8 vector-wise",
  "mixed": "LLM.int8() (t=6)",
}


def _sow_fraction(module: nnx.Module, x: jax.Array) -> None:
  if module.quant_mode == "mixed":
    cols = quant.outlier_columns(x, threshold=module.threshold)
    module.sow(nnx.Intermediate, "outlier_fraction", jnp.mean(cols))


class _Int8Dense(nn_quant.Int8Dense):
  """`Int8Dense` that records the fraction of outlier columns."""

  def __call__(self, x):
    """As `Int8Dense`, sowing ``outlier_fraction``."""
    _sow_fraction(self, x)
    return super().__call__(x)


class _Int8Attention(multihead.MultiHeadAttention):
  """Attention whose Q/K/V projections run through `quantized_matmul`.

  Overrides the private ``_project`` of `MultiHeadAttention` (an experiment
  device; the output projection stays float32).
  """

  def _project(self, x, kernel, bias, names):
    _sow_fraction(self, x)
    k = kernel[...].astype(x.dtype)
    d, n, h = k.shape
    y = nn_quant.quantized_matmul(
      x,
      k.reshape(d, n * h),
      quant_mode=self.quant_mode,
      threshold=self.threshold,
    ).reshape(x.shape[:-1] + (n, h))
    if bias is not None:
      y = y + bias[...].astype(x.dtype).reshape((1, 1) + bias.shape)
    return sharding.constrain(y, names)


def quantized(model: nnx.Module, mode: str, threshold: float) -> nnx.Module:
  """A copy of ``model`` with its Q/K/V and MLP matmuls in ``mode``."""
  m = nnx.clone(model)
  nn_quant.swap_dense(m, cls=_Int8Dense, quant_mode=mode, threshold=threshold)
  for _, mod in list(nnx.iter_modules(m)):
    if isinstance(mod, multihead.MultiHeadAttention):
      mod.__class__ = _Int8Attention
      mod.quant_mode, mod.threshold = mode, threshold
  return m


def inject_outliers(
  model: nnx.Module, dims: np.ndarray, c: float
) -> nnx.Module:
  """A copy with gains of ``dims`` times ``c`` and reader rows over ``c``."""
  m = nnx.clone(model)
  for step, block in zip(m.net.steps, m.net.blocks):
    norm = step.norm
    off = norm.scale_offset
    g = norm.scale[...]
    norm.scale[...] = g.at[dims].set((g[dims] + off) * c - off)
    if isinstance(block, layers.MLP):
      kernels = [block.up.kernel]
    else:
      kernels = [
        k
        for k in (block.q_kernel, block.k_kernel, block.v_kernel)
        if k is not None
      ]
    for k in kernels:
      k[...] = k[...].at[dims].divide(c)
  return m


def run_seed(args: argparse.Namespace, seed: int, splits) -> dict:
  """Trains one LM and evaluates every mode with and without injection."""
  run = _bytelm.LMRun(
    width=args.width,
    depth=args.depth,
    steps=args.steps,
    seq_len=args.seq_len,
    seed=seed,
  )
  model, secs = _bytelm.train_lm(run, splits)
  batches = _bytelm.val_batches(
    splits, args.seq_len, batch_size=16, num=args.eval_batches
  )
  dims = np.random.default_rng(seed).choice(args.width, 3, replace=False)
  variants = {
    "clean": model,
    "outliers": inject_outliers(model, dims, args.c),
  }
  out = {"seed": seed, "train_seconds": secs, "outlier_dims": dims.tolist()}
  for name, base in variants.items():
    for mode in MODES:
      loss, sown = _bytelm.evaluate(
        quantized(base, mode, args.threshold), batches
      )
      out[f"{name}/{mode}"] = loss
      if mode == "mixed":
        fr = [
          float(v)
          for s in sown
          for v in jax.tree.leaves(s)
          if np.ndim(v) == 0 or np.size(v) == 1
        ]
        out[f"{name}/routed_fraction"] = float(np.mean(fr)) if fr else 0.0
  change = abs(out["outliers/none"] - out["clean/none"])
  out["injection_changes_fp32_loss_by"] = change
  if change > 1e-4 * out["clean/none"]:
    raise RuntimeError(
      f"llm_int8: the outlier injection must preserve the float32 loss, "
      f"but it changed by {change:.2e}"
    )
  return out


def summarize(per_seed: list[dict]) -> dict:
  """Mean and spread of every loss gap to fp32."""
  table = {}
  for variant in ("clean", "outliers"):
    for mode in MODES:
      gaps = [s[f"{variant}/{mode}"] - s[f"{variant}/none"] for s in per_seed]
      losses = [s[f"{variant}/{mode}"] for s in per_seed]
      table[f"{variant}/{mode}"] = {
        "loss": _report.mean_spread(losses),
        "gap": _report.mean_spread(gaps),
      }
    table[f"{variant}/routed_fraction"] = _report.mean_spread(
      [s[f"{variant}/routed_fraction"] for s in per_seed]
    )
  return table


def verdict(table: dict) -> tuple[str, str]:
  """Checks the paper's claim against the table.

  Claim: int8 matches fp32 without outliers; with outliers vector-wise int8
  degrades (here: a gap above 3 spreads and 10x its clean gap) while
  LLM.int8() stays within 0.01 nats.
  """
  clean_ok = all(abs(table[f"clean/{m}"]["gap"][0]) < 0.01 for m in MODES)
  vec, vec_sd = table["outliers/vector"]["gap"]
  vec_clean = abs(table["clean/vector"]["gap"][0])
  mixed = table["outliers/mixed"]["gap"][0]
  degrades = vec > 3 * vec_sd and vec > 10 * vec_clean
  why = (
    f"clean int8 gaps all < 0.01 nats: {clean_ok}; with outliers "
    f"vector-wise gap {vec:+.4f} ± {vec_sd:.4f} (clean {vec_clean:.4f}), "
    f"LLM.int8() gap {mixed:+.4f} nats"
  )
  if clean_ok and degrades and abs(mixed) <= 0.01:
    return "reproduced", why
  if clean_ok and not degrades and abs(mixed) <= 0.01:
    return "inconclusive", why
  return "not reproduced at this scale", why


def plot(result: dict, path: pathlib.Path) -> None:
  """Loss gap to fp32 per mode, clean vs injected, with spreads."""
  plt = _report.pyplot()
  table = result["summary"]
  fig, ax = plt.subplots(figsize=(6, 3.2))
  x = np.arange(len(MODES) - 1)
  for i, variant in enumerate(("clean", "outliers")):
    mean = [table[f"{variant}/{m}"]["gap"][0] for m in MODES[1:]]
    sd = [table[f"{variant}/{m}"]["gap"][1] for m in MODES[1:]]
    ax.bar(x + (i - 0.5) * 0.38, mean, 0.38, yerr=sd, label=variant)
  ax.set_xticks(x, [LABELS[m] for m in MODES[1:]])
  ax.set_yscale("symlog", linthresh=1e-3)
  ax.set_ylabel("val loss - fp32 (nats)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def markdown(args, result: dict) -> list[str]:
  """The result file's lines."""
  per_seed, table = result["per_seed"], result["summary"]
  v = result["verdict"]
  lines = [
    "# LLM.int8() with simulated emergent outliers (`experiments.llm_int8`)",
    "",
    f"{len(per_seed)} seeds. Model: pre-RMSNorm `DecoderLM`, width "
    f"{args.width}, depth {args.depth}, 4 heads, tied head; {args.steps} "
    "AdamW steps on byte-level Shakespeare, batch 16 x "
    f"{args.seq_len}. Deviation from "
    "the spec (width 128, depth 4, 500 steps): scaled down to fit the "
    "time budget of a loaded 2-core machine.",
    f"Outliers: gains of 3 random dims x {args.c} in every pre-norm, rows "
    f"of the Q/K/V and MLP-in kernels / {args.c} (fp32 loss change "
    f"{max(s['injection_changes_fp32_loss_by'] for s in per_seed):.1e}). "
    "Quantized: Q/K/V and MLP up/down matmuls (attention output "
    "projection and tied head stay fp32). Validation: "
    f"{args.eval_batches} batches of 16 x {args.seq_len} held-out bytes.",
    "",
    "| activations | mode | val loss | gap to fp32 (nats) |",
    "|---|---|---|---|",
  ]
  for variant in ("clean", "outliers"):
    for m in MODES:
      loss, gap = (
        table[f"{variant}/{m}"]["loss"],
        table[f"{variant}/{m}"]["gap"],
      )
      lines.append(
        f"| {variant} | {LABELS[m]} | {loss[0]:.4f} ± {loss[1]:.4f} | "
        f"{gap[0]:+.4f} ± {gap[1]:.4f} |"
      )
  for variant in ("clean", "outliers"):
    fr = table[f"{variant}/routed_fraction"]
    lines.append("")
    lines.append(
      f"Fraction of activation values in high precision ({variant}): "
      f"{fr[0]:.2%} ± {fr[1]:.2%} of the quantized matmuls' inputs."
    )
  lines += [
    "",
    "The paper reports 99.9% of values staying in 8-bit at 6.7B scale "
    "(about 7 outlier dims of 4096); here 3 of "
    f"{args.width} dims are outliers by construction, so the routed "
    "fraction is 3/width on the inputs of Q/K/V and MLP-in (the MLP-down "
    "inputs have none).",
    "",
    "Spread: sample standard deviation over seeds.",
    "",
    f"**Verdict: {v[0]}** ({v[1]}). Paper claim (Dettmers et al., "
    "arXiv:2208.07339): vector-wise int8 degrades once outlier features "
    "emerge, while the mixed-precision decomposition keeps fp32 quality.",
    "",
    "![loss gaps](llm_int8.png)",
  ]
  return lines


def main(argv: list[str] | None = None) -> dict:
  """Runs the experiment; returns the result dict."""
  p = _report.parser(__doc__)
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--width", type=int, default=64)
  p.add_argument("--depth", type=int, default=2)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--seq-len", type=int, default=64)
  p.add_argument("--eval-batches", type=int, default=8)
  p.add_argument("--c", type=float, default=40.0)
  p.add_argument("--threshold", type=float, default=6.0)
  args = p.parse_args(argv)
  if args.quick:
    args.seeds, args.width, args.depth = 1, 16, 1
    args.steps, args.seq_len, args.eval_batches = 3, 16, 1

  def compute():
    splits = _bytelm.text()
    per_seed = [run_seed(args, s, splits) for s in range(args.seeds)]
    table = summarize(per_seed)
    return {"per_seed": per_seed, "summary": table, "verdict": verdict(table)}

  return _report.run(
    "llm_int8", args, compute, plot, functools.partial(markdown, args)
  )


if __name__ == "__main__":
  main()
