"""Sub-8-bit integer training, its quantized side: fully quantized L1 layers.

Claims (Guo, Liu, Xie, Li, Meng, Ning, Zeng, Wang, Lei & Fang, "Towards
Accurate and Efficient Sub-8-Bit Integer Training", arXiv:2411.10948),
fixed before running:

* "The proposed fully-quantized L1 normalization layers achieve more than
  35.54% improvement in throughput on CPU compared to traditional L2
  normalization layers": the L1 layer's training throughput (forward and
  backward) over LayerNorm's is ``superior`` by the paper's own margin,
  ``log(1.3554)`` on the log ratio. **Not testable**: the claim is about
  the paper's *fully quantized* (integer) layers, whose formulas are in
  its section 4, which could not be read (abstract only, no code; spec
  `norms.md` section 13), and jaxnorm has no integer normalization layer.
  The script measures what jaxnorm has, the floating-point L1 layer norm
  (`jaxnorm.norms.l1_layer_norm`, mean absolute deviation) against
  `jaxnorm.norms.layer_norm` under XLA on this CPU, and records that ratio
  with the verdict ``not testable at this scale`` and the reason.

Claims of the paper not recorded, for want of an implementation (the
harness records a claim from measured values; there are none): ShiftQuant's
accuracy ("negligible accuracy loss ... 0.61% on 6-bit Transformers",
0.92% on 4-bit ResNets) and speed ("more than 1.85x / 15.3% performance
improvement on CPU/GPU compared to its FP16 counterparts"). ShiftQuant,
the paper's gradient quantizer (group quantization without memory
rearrangement), is not in jaxnorm: its section 3 could not be read either.
The float L1 norm's accuracy claim ("matches LayerNorm") is
`experiments.norms_bytelm`'s.

Measurement: rows of a transformer activation, ``(rows, d)`` float32
(default 4,096 x 768; ``--quick`` 64 x 32; ``--full`` 16,384 x 4,096),
both layers with a learned scale and bias, jitted forward plus VJP with a
random cotangent; throughput is rows per second from the median of 20
calls (`report.median_ms`). Each round (3 by default, ``--seeds``) times
both layers back to back, so load drifts hit both; the claim pairs the
rounds.

  python -m experiments.shiftquant_claims [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments._harness import grid, report, tiers
from jaxnorm import norms
from jaxnorm.training import claims

NAME = "shiftquant_claims"
SHAPES = {"quick": (64, 32), "default": (4096, 768), "full": (16384, 4096)}
REPS = {"quick": 3, "default": 20, "full": 50}
ARMS = ("l1layernorm (float)", "layernorm (float)")
PAPER_GAIN = 0.3554

CLAIMS = (
  claims.Claim(
    paper="Sub-8-bit training (L1 LayerNorm)",
    arxiv="2411.10948",
    claim="fully quantized L1 normalization layers achieve more than "
    "35.54% higher throughput on CPU than L2 normalization layers",
    metric="log_rows_per_sec",
    direction="higher",
    kind="superior",
    margin=math.log1p(PAPER_GAIN),
    a=ARMS[0],
    b=ARMS[1],
  ),
)
NOT_TESTABLE = (
  "the claim is about the paper's fully quantized (integer) L1 and L2 "
  "layers (its section 4, not readable; no code), which jaxnorm does not "
  "implement; the values are jaxnorm's floating-point layers under XLA on "
  "this CPU"
)


def _step(fn):
  """Jitted forward + VJP of ``fn(x, scale, bias)`` with cotangent ``g``."""

  @jax.jit
  def step(args):
    x, scale, bias, g = args
    y, vjp = jax.vjp(fn, x, scale, bias)
    return y, vjp(g)

  return step


LAYERS = {
  ARMS[0]: lambda x, s, b: norms.l1_layer_norm(x, s, b),
  ARMS[1]: lambda x, s, b: norms.layer_norm(x, s, b),
}


def measure(shape: tuple[int, int], reps: int, rounds: int) -> list[dict]:
  """One line per (arm, round): rows per second and its log."""
  rows, d = shape
  keys = jax.random.split(jax.random.key(0), 4)
  args = (
    jax.random.normal(keys[0], shape, jnp.float32),
    1.0 + 0.1 * jax.random.normal(keys[1], (d,), jnp.float32),
    0.1 * jax.random.normal(keys[2], (d,), jnp.float32),
    jax.random.normal(keys[3], shape, jnp.float32),
  )
  steps = {arm: _step(fn) for arm, fn in LAYERS.items()}
  lines = []
  for r in range(rounds):
    for arm in ARMS:
      ms = report.median_ms(steps[arm], args, reps)
      speed = rows / (ms / 1e3)
      lines.append(
        {
          "variant": arm,
          "seed": r,
          "ms": ms,
          "rows_per_sec": speed,
          "log_rows_per_sec": math.log(speed),
        }
      )
  return lines


def main(argv: Sequence[str] | None = None) -> dict:
  """Times both layers in interleaved rounds and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  tier = tiers.tier(args)
  shape, reps = SHAPES[tier], REPS[tier]
  rounds = tiers.seeds(args)

  def compute() -> dict:
    lines = measure(shape, reps, len(rounds))
    arm = {
      "params": 2 * shape[1],
      "steps": None,
      "examples": None,
      "unit": "rows",
      "optimizer": None,
      "learning_rate": None,
      "data": f"random float32 rows {shape[0]} x {shape[1]}, forward + VJP",
    }
    rec = grid.claim_record(
      lines,
      CLAIMS[0],
      baseline_trained=True,
      config={
        "shape": list(shape),
        "reps": reps,
        "backend": jax.default_backend(),
      },
      setting={"a": arm, "b": arm},
      testable=False,
      reason=NOT_TESTABLE,
    )
    return {
      "claims": [rec],
      "lines": lines,
      "ms": grid.cells(lines, "ms"),
      "shape": list(shape),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    report.cells_bars(axes[0], result["ms"], rotation=0)
    axes[0].set_ylim(bottom=0)
    axes[0].set_ylabel("forward + VJP, median ms (mean ± std over rounds)")
    axes[0].set_title(f"float layers, rows {shape[0]} x {shape[1]}")
    report.claims_axes(axes[1], result["claims"])
    fig.suptitle(
      "L1 vs L2 (LayerNorm) throughput on CPU: float layers only; the "
      "paper's claim is about integer layers (not testable)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    out = []
    ratio = np.exp(
      np.mean(
        [
          ln["log_rows_per_sec"]
          for ln in result["lines"]
          if ln["variant"] == ARMS[0]
        ]
      )
      - np.mean(
        [
          ln["log_rows_per_sec"]
          for ln in result["lines"]
          if ln["variant"] == ARMS[1]
        ]
      )
    )
    out += [
      f"Float32 rows {shape[0]} x {shape[1]}, forward + VJP, median of "
      f"{reps} calls per round, {len(rounds)} interleaved rounds on "
      f"`{jax.default_backend()}`. L1 / L2 throughput: {ratio:.3f}x "
      f"(the paper: more than {1 + PAPER_GAIN:.4f}x for its integer "
      "layers).",
      "",
      "## Step time (ms)",
      "",
    ]
    out += grid.markdown_table(result["ms"], "ms", ARMS[1])
    out += [
      "",
      "## Not recorded (no implementation)",
      "",
      "- ShiftQuant's accuracy: negligible loss at 4 bits (ResNets, "
      "0.92%) and 6 bits (Transformers, 0.61%).",
      "- ShiftQuant's speed: more than 1.85x (CPU) / 15.3% (GPU) over FP16.",
    ]
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
