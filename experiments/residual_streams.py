"""Multi-stream residuals: HC, mHC, oHC and iHC against Pre-Norm.

The multi-stream schemes of `jaxnorm.nn.residual.RESIDUALS` (4 streams,
read out by their mean) and the single-stream Pre-Norm residual (the
papers' "RC") train as the runner's byte LM (Shakespeare bytes) at a depth
``D`` = 8 layers (default; ``--full`` 32), HC also at ``S`` = 2 (``--full``
8). After training, one held-out batch goes through the model of the run's
final checkpoint (`experiments._harness.runs.trained_line`) and, for the
stream schemes, gives the composite stream mixing of the whole network,
``P = H_res^(K) ... H_res^(1)`` over all ``K = 2 L`` sublayers (rows are
target streams; the maps are per token, from each step's ``maps`` on the
stream state the network really computes), at initialization and after
training, and its gains, each the worst over the batch's tokens:

* ``amax``: the mHC paper's "Amax gain magnitude", the larger of the
  largest absolute row sum (forward gain) and column sum (backward gain);
  ``log_amax`` its log;
* ``sigma_max`` / ``sigma_min``: the largest / smallest singular value;
  ``log_distortion = max(log sigma_max, -log sigma_min)``, 0 for an
  isometry (every singular value 1), the distance from one on the log
  scale;
* the spread of the final streams (0 when they are identical: then any
  mixing with unit row sums acts as the identity).

Claims (each fixed before running; paired by seed; gain metrics are log
ratios with margin `claims.MARGINS["log_ratio"]` = log 1.1; loss: validation
loss in nats per byte, lower is better, margin
`claims.MARGINS["nats_per_byte"]` = 0.01):

* Regime (mHC, Xie et al., "mHC: Manifold-Constrained Hyper-Connections",
  arXiv:2512.24880, on HC): HC's unconstrained mixing lets the composite
  gain grow with depth (to about 3000 in their 27B model): HC's
  ``log_amax`` at ``D`` is ``superior`` (higher) to that at ``S`` by more
  than log 1.1. Where it is not, the instability mHC fixes is absent and
  the next claim is ``not testable at this scale``.
* mHC (same paper): its doubly stochastic mixing keeps the composite gain
  near 1 where HC's grows (about 1.6 vs 3000): at equal depth ``D``, mHC's
  ``log_amax`` is ``superior`` (lower) to HC's by more than log 1.1 (the
  paper's own contrast, HC against mHC at the same depth).
* oHC (Guo et al., "oHC: Orthogonal Hyper-Connections on SO(4) via
  Quaternions", arXiv:2609.02672): ``H_res`` in SO(4) keeps every singular
  value of the composite mixing at 1 (no amplification, no attenuation):
  after training, oHC's ``log_distortion`` at ``D`` is ``equivalent``,
  within log 1.1, to its value at initialization (0: the initial mixing is
  a rotation).
* oHC (same paper, as `shared/specs/residual_optim.md` has it from digests
  of the full text): mHC's doubly stochastic mixing contracts, making the
  streams alike with depth, where oHC's does not: oHC's ``log_distortion``
  is ``superior`` (lower) to mHC's at ``D`` by more than log 1.1.
* oHC's headline: it lowers the loss of its baselines, the single-stream
  residual RC (reported: training loss 2.063% and bits per byte 3.89%
  lower, a 3.9B-total MoE on 73B tokens), mHC and iHC (mHC with ``H_res =
  I``): three ``superior`` claims on the validation loss at ``D``, margin
  0.01.
* HC (Zhu et al., "Hyper-Connections", arXiv:2409.19606) and mHC: each
  lowers the Pre-Norm baseline's loss at ``D`` (``superior``, margin
  0.01).

A loss claim's baseline counts as trained when its mean validation loss is
below the unigram entropy of the validation bytes.

Fair comparison: every arm at ``D`` trains at its own learning rate, the
best of a geometric sweep (1e-3, 3e-3, 1e-2, extended while the best is at
an end) on seed 0 chosen by the final training loss
(`experiments._harness.grid.tuned_grid`), then every seed at that rate;
HC at ``S`` trains at HC's rate at ``D``, so that only the depth differs.
Parameter counts: the stream maps' projections (``n C x (2n + n^2)`` per
sublayer for mHC, ``n C x (2n + 8)`` for oHC, ``n C x 2n`` for iHC) are a
third of a width-32 layer, so every arm's MLP width is set so that its
count matches oHC's (at MLP width ``4 x width``) within 2% (`mlp_widths`;
default: Pre-Norm 193, HC 185, mHC 96, oHC 128, iHC 160; the records'
settings give the counts and MLP widths); HC at ``S`` keeps HC's MLP
width (its record compares depths, so its counts differ).

Regime: width 32, 2 heads, 64-byte windows, batch 16,
`experiments.residual_depth.DEFAULT_STEPS` AdamW steps (cosine, 10 warm-up
steps, weight decay 0.1, clip 1.0), 3 seeds; ``--full``: `tiers.FULL_LM`
(width 256), depths 32 and 8, 2000 steps, 5 seeds; ``--quick`` (the
tests): toy LM, depths 2 and 1, one seed, no sweep.

Deviations: the papers' models are 1B-27B parameters trained on billions
of tokens; the gains here are of a 0.3M-parameter byte LM after a few
hundred steps, so they test the mechanism (what the mixing does to the
composite gain), not the scale at which HC's gain reaches 3000. oHC's
paper could not be read (its parameterization follows the spec's
proposal: a unit-quaternion pair from an mHC-style head, identity at
init). The models focus the read of sublayer ``k`` on stream ``k mod n``
(`jaxnorm.residual.mhc_static_init`): with a uniform initial read mHC's and
oHC's streams never separate.

  python -m experiments.residual_streams [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from experiments import residual_depth as rd
from experiments._harness import grid, report, runs, tiers
from jaxnorm import residual
from jaxnorm.nn import models
from jaxnorm.training import build, claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "residual_streams"
MARGIN = claims.MARGINS["nats_per_byte"]
RATIO = claims.MARGINS["log_ratio"]
# (deep D, shallow S) per tier.
DEPTHS = {"quick": (2, 1), "default": (8, 2), "full": (32, 8)}
STREAMS = ("hc", "mhc", "ohc", "ihc")
SCHEMES = ("prenorm", *STREAMS)
# The arm whose parameter count (at MLP width 4 x width) the others match.
REFERENCE = "ohc"
PARAM_TOLERANCE = 0.02
LEARNING_RATES = rd.LEARNING_RATES
INIT = " at init"
# Streams count as identical below this spread (`stream_mixing`).
SPREAD_FLOOR = 0.01

MHC = ("mHC", "2512.24880")
OHC = ("oHC", "2609.02672")
GAINS = (
  "amax",
  "log_amax",
  "forward",
  "backward",
  "sigma_max",
  "sigma_min",
  "log_distortion",
)


def variant(scheme: str, depth: int) -> str:
  """The grid's name of one (scheme, depth) arm."""
  return f"{scheme}-L{depth}"


def make_claims(deep: int, shallow: int) -> dict[str, claims.Claim]:
  """The claims at depths ``deep`` and ``shallow`` (module docstring)."""
  v = {s: variant(s, deep) for s in SCHEMES}

  def claim(paper, text, metric, a, b, *, kind="superior", direction="lower"):
    margin = MARGIN if metric == "val_loss" else RATIO
    return claims.Claim(
      paper=paper[0],
      arxiv=paper[1],
      claim=text,
      metric=metric,
      direction=direction,
      kind=kind,
      margin=margin,
      a=a,
      b=b,
    )

  return {
    "hc_gain_grows": claim(
      MHC,
      f"HC's unconstrained stream mixing lets the composite Amax gain grow "
      f"with depth ({deep} vs {shallow} layers)",
      "log_amax",
      v["hc"],
      variant("hc", shallow),
      direction="higher",
    ),
    "mhc_gain": claim(
      MHC,
      "mHC's doubly stochastic mixing keeps the composite Amax gain near 1 "
      "where HC's grows (about 1.6 vs 3000 at 27B), at equal depth",
      "log_amax",
      v["mhc"],
      v["hc"],
    ),
    "ohc_isometry": claim(
      OHC,
      "H_res in SO(4) keeps every singular value of the composite mixing "
      "at 1 (no amplification, no attenuation) through training",
      "log_distortion",
      v["ohc"],
      v["ohc"] + INIT,
      kind="equivalent",
    ),
    "ohc_vs_mhc_mixing": claim(
      OHC,
      "mHC's doubly stochastic mixing contracts (the streams grow alike "
      "with depth) where oHC's orthogonal mixing does not",
      "log_distortion",
      v["ohc"],
      v["mhc"],
    ),
    "ohc_vs_rc": claim(
      OHC,
      "oHC lowers the loss of the single-stream residual RC (training "
      "loss 2.063%, bits per byte 3.89% lower)",
      "val_loss",
      v["ohc"],
      v["prenorm"],
    ),
    "ohc_vs_mhc": claim(
      OHC,
      "oHC lowers mHC's loss (orthogonal instead of doubly stochastic mixing)",
      "val_loss",
      v["ohc"],
      v["mhc"],
    ),
    "ohc_vs_ihc": claim(
      OHC,
      "oHC lowers iHC's loss (iHC: H_res fixed to the identity, no "
      "cross-stream mixing)",
      "val_loss",
      v["ohc"],
      v["ihc"],
    ),
    "hc_loss": claim(
      ("Hyper-Connections", "2409.19606"),
      "Hyper-connections lower the loss of the Pre-Norm residual",
      "val_loss",
      v["hc"],
      v["prenorm"],
    ),
    "mhc_loss": claim(
      MHC,
      "mHC lowers the loss of the Pre-Norm baseline",
      "val_loss",
      v["mhc"],
      v["prenorm"],
    ),
  }


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier: `experiments.residual_depth`'s."""
  return rd.base_config(args)


# ---------------------------------------------------------------------------
# Models with matched parameter counts.


def build_lm(
  cfg: config_lib.TrainConfig, mlp_hidden: int, seed: int
) -> nnx.Module:
  """The runner's LM of ``cfg`` with MLP width ``mlp_hidden``."""
  shape = {"vocab_size": data_lib.BYTE_VOCAB, "max_len": cfg.seq_len}
  lm = dataclasses.replace(
    build.model_config(cfg, shape), mlp_hidden=mlp_hidden
  )
  return models.DecoderLM(lm, rngs=nnx.Rngs(seed))


def count(cfg: config_lib.TrainConfig, mlp_hidden: int) -> int:
  """Parameters of `build_lm` (abstract, nothing allocated)."""
  model = nnx.eval_shape(lambda: build_lm(cfg, mlp_hidden, 0))
  return int(
    sum(np.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  )


def mlp_widths(base: config_lib.TrainConfig, depth: int) -> dict[str, int]:
  """Per scheme, the MLP width whose count matches `REFERENCE`'s at ``depth``.

  The count is affine in the MLP width; the width is the nearest integer
  (at least 1) to the solution.

  Raises:
    ValueError: a scheme cannot come within `PARAM_TOLERANCE`.
  """
  four = 4 * base.width
  cfgs = {
    s: dataclasses.replace(base, residual=s, depth=depth) for s in SCHEMES
  }
  target = count(cfgs[REFERENCE], four)
  out = {}
  for s, cfg in cfgs.items():
    at, slope = count(cfg, four), count(cfg, four + 1) - count(cfg, four)
    h = max(1, round(four + (target - at) / slope))
    gap = count(cfg, h) / target - 1
    if abs(gap) > PARAM_TOLERANCE:
      raise ValueError(
        f"mlp_widths: {s} at depth {depth} cannot match {REFERENCE}'s "
        f"{target} parameters within {PARAM_TOLERANCE:.0%} (MLP width {h} "
        f"gives {gap:+.1%})"
      )
    out[s] = h
  return out


# ---------------------------------------------------------------------------
# Stream mixing probes.


def stream_mixing(
  model: nnx.Module, x: jax.Array
) -> tuple[list[np.ndarray], float]:
  """Each sublayer's ``H_res`` ``(batch, seq, n, n)`` on embeddings ``x``.

  Runs the network's stream steps as `StreamStack` does and reads each
  step's maps on the state it sees. Also returns the spread of the final
  streams, ``sqrt(mean_var_over_streams) / RMS``: 0 when the streams are
  identical, where any mixing with unit row sums acts as the identity.
  """
  net = model.net
  h = residual.expand_streams(x, net.num_streams)
  mats = []
  for block, step in zip(net.blocks, net.steps):
    mats.append(np.asarray(step.maps(h)[2], np.float64))
    h = step(h, block)
  h = np.asarray(h, np.float64)
  spread = np.sqrt(np.mean(np.var(h, axis=-2)) / np.mean(np.square(h)))
  return mats, float(spread)


def gains(p: np.ndarray) -> dict[str, float]:
  """Gains of composite mixing matrices ``p`` ``(..., n, n)``, rows targets.

  ``forward``: the largest absolute row sum, ``backward``: the largest
  absolute column sum (the mHC paper's Amax gain magnitudes), ``amax``
  their maximum and ``log_amax`` its log; ``sigma_max`` / ``sigma_min``:
  the largest / smallest singular value, ``log_distortion`` the larger of
  ``log sigma_max`` and ``-log sigma_min`` (0 for an isometry). Worst case
  over the leading (token) axes.
  """
  a = np.abs(p)
  s = np.linalg.svd(p, compute_uv=False)
  forward = float(a.sum(-1).max())
  backward = float(a.sum(-2).max())
  smax, smin = float(s[..., 0].max()), float(s[..., -1].min())
  amax = max(forward, backward)
  return {
    "forward": forward,
    "backward": backward,
    "amax": amax,
    "log_amax": float(np.log(amax)),
    "sigma_max": smax,
    "sigma_min": smin,
    "log_distortion": float(max(np.log(smax), -np.log(smin))),
  }


def composite_gains(
  mats: Sequence[np.ndarray], per_layer: int = 2
) -> dict[str, Any]:
  """`gains` of ``H_res^(k) ... H_res^(1)``: after each layer, and overall."""
  p = np.broadcast_to(np.eye(mats[0].shape[-1]), mats[0].shape)
  curve = []
  for k, m in enumerate(mats):
    p = m @ p
    if (k + 1) % per_layer == 0 or k + 1 == len(mats):
      curve.append(gains(p))
  return {**curve[-1], "per_layer": curve}


def stream_probes(
  trained: nnx.Module, initial: nnx.Module, batch: jax.Array
) -> dict[str, Any]:
  """`layer_probes` and, for stream schemes, the composite mixing gains.

  ``initial`` is the same model before training (the run's seed).
  """
  found = rd.layer_probes(trained, batch)
  x = found.pop("embedding")
  if not hasattr(trained.net, "num_streams"):
    return found
  mats, found["stream_spread"] = stream_mixing(trained, x)
  after = composite_gains(mats)
  x0 = initial(batch[:, :-1], return_hidden=True)[1][0]
  before = composite_gains(stream_mixing(initial, x0)[0])
  found["gain_curve"] = after.pop("per_layer")
  found["gain_curve_init"] = before.pop("per_layer")
  found.update(after)
  found.update({f"{k}_init": v for k, v in before.items()})
  return found


# ---------------------------------------------------------------------------
# Records and report.


def _with_mlp(rec: dict[str, Any], mlp: Mapping[str, int]) -> dict[str, Any]:
  """Adds each arm's MLP width to the record's config and setting."""
  for arm in ("a", "b"):
    width = mlp.get(rec[arm].removesuffix(INIT))
    if width is not None:
      rec["config"][arm]["mlp_hidden"] = width
      rec["setting"][arm]["mlp_hidden"] = width
  return rec


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  mlp: Mapping[str, int],
  the_claims: Mapping[str, claims.Claim],
  unigram: float,
) -> list[dict[str, Any]]:
  """The claims' records; HC's gain growth gates mHC's gain claim."""
  init_lines = [
    {
      "variant": ln["variant"] + INIT,
      "seed": ln["seed"],
      "log_distortion": ln["log_distortion_init"],
    }
    for ln in lines
    if "log_distortion_init" in ln
  ]
  out = {}
  for key, claim in the_claims.items():
    if claim.b.endswith(INIT):
      rec = grid.claim_record(
        [*lines, *init_lines],
        claim,
        baseline_trained=True,
        config={
          "base": config_lib.to_json(config_lib.resolve(base)),
          "a": dict(variants[claim.a]),
          "b": {**variants[claim.a], "steps": 0},
        },
        setting={
          "a": grid.setting(lines, base, variants, claim.a),
          "b": {
            **grid.setting(lines, base, variants, claim.a),
            "steps": 0,
            "examples": 0,
          },
        },
        reason="b is the same model before training (its initial mixing)",
      )
      out[key] = _with_mlp(rec, mlp)
      continue
    reason = None
    if claim.metric == "val_loss":
      reason = runs.untrained(
        lines, claim.b, unigram, what="the unigram entropy"
      )
    trained = reason is None
    testable = True
    if key == "mhc_gain" and out["hc_gain_grows"]["verdict"] != "reproduced":
      testable = False
      reason = (
        "HC's composite gain is not shown to grow with depth here, so there "
        f"is no instability for mHC to remove ({out['hc_gain_grows']['why']})"
      )
    rec = grid.runner_record(
      lines,
      claim,
      base,
      variants,
      baseline_trained=trained,
      testable=testable,
      reason=reason,
    )
    out[key] = _with_mlp(rec, mlp)
  return list(out.values())


def figure_gains(ax: Any, result: Mapping[str, Any]) -> None:
  """Composite Amax gain and singular values after each layer (mean)."""
  for name in result["gains"]["amax"]:
    curves = [
      ln["gain_curve"] for ln in result["lines"] if ln["variant"] == name
    ]
    if not curves:
      continue
    layers = range(1, len(curves[0]) + 1)
    amax = np.mean([[g["amax"] for g in c] for c in curves], axis=0)
    smin = np.mean([[g["sigma_min"] for g in c] for c in curves], axis=0)
    (line,) = ax.plot(layers, amax, marker="o", label=f"{name} Amax")
    ax.plot(
      layers,
      smin,
      ls="--",
      color=line.get_color(),
      label=f"{name} sigma_min",
    )
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_yscale("log")
  ax.set_xlabel("layer l (product of H_res up to layer l)")
  ax.set_ylabel("composite mixing gain (log)")
  ax.set_title("trained: Amax gain (solid), smallest singular value (dashed)")
  ax.legend(fontsize=7)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), probes and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  deep, shallow = DEPTHS[tiers.tier(args)]
  the_claims = make_claims(deep, shallow)
  mlp_by_scheme = mlp_widths(base, deep)
  deep_arms = {
    variant(s, deep): {"residual": s, "depth": deep} for s in SCHEMES
  }
  mlp = {variant(s, deep): mlp_by_scheme[s] for s in SCHEMES}
  mlp[variant("hc", shallow)] = mlp_by_scheme["hc"]
  folder = pathlib.Path(args.runs)
  table = folder / "grid.jsonl"
  rates = (
    {}
    if tiers.tier(args) == "quick"
    else {name: LEARNING_RATES for name in deep_arms}
  )
  unigram = runs.chance_loss(base)

  arms: dict[str, Mapping[str, Any]] = dict(deep_arms)

  def model(name: str, seed: int) -> nnx.Module:
    return build_lm(dataclasses.replace(base, **arms[name]), mlp[name], seed)

  def compute() -> dict:
    with rd.compilation_cache(folder / "xla_cache"):
      lines, tuned = grid.tuned_grid(
        table, base, deep_arms, seeds, rates, model=model
      )
      variants = dict(tuned["variants"])
      hc_shallow = {
        variant("hc", shallow): {
          "residual": "hc",
          "depth": shallow,
          "learning_rate": rd.learning_rate(
            variants, variant("hc", deep), base
          ),
        }
      }
      arms.update(hc_shallow)
      variants.update(hc_shallow)
      lines += grid.fixed_rate_grid(table, base, hc_shallow, seeds, model=model)
      batch = rd.probe_batch(base)

      def probe(ln: Mapping[str, Any]) -> dict[str, Any]:
        trained = runs.trained_line(table, base, variants, ln, model=model)
        initial = model(ln["variant"], ln["seed"])
        initial.eval()
        return stream_probes(trained, initial, batch)

      lines = runs.probed(lines, folder / "probes.jsonl", probe)
    stream_lines = [ln for ln in lines if "amax" in ln]
    return {
      "depths": {"deep": deep, "shallow": shallow},
      "mlp_hidden": mlp,
      "unigram_entropy": unigram,
      "claims": records(lines, base, variants, mlp, the_claims, unigram),
      "sweeps": tuned["sweeps"],
      "variants": variants,
      "lines": lines,
      "val_loss": grid.cells(lines, "val_loss"),
      "params": grid.cells(lines, "params"),
      "gains": {
        k: grid.cells(stream_lines, k)
        for k in (
          *GAINS,
          *(f"{g}_init" for g in GAINS),
          "stream_spread",
        )
      },
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.5))
    report.cells_bars(axes[0], result["val_loss"])
    axes[0].set_ylim(bottom=0)
    axes[0].set_ylabel("final validation loss (nats/byte)")
    axes[0].set_title("final validation loss (mean ± std)")
    figure_gains(axes[1], result)
    report.claims_axes(axes[2], result["claims"])
    fig.suptitle(
      f"byte LM, width {base.width}, {deep} layers (HC also {shallow}), "
      f"{base.steps} steps: multi-stream residuals ({len(seeds)} seeds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    params = result["params"]
    lines = [
      f"Runner config: width {base.width}, {base.num_heads} heads, "
      f"{base.seq_len}-byte windows, batch {base.batch_size}, {base.steps} "
      f"AdamW steps (cosine, warm-up {base.warmup_steps}, weight decay "
      f"{base.weight_decay}, clip {base.clip_norm}), seeds {list(seeds)}; "
      "4 streams read out by their mean. Validation loss in nats per byte "
      f"over {base.eval_batches} held-out batches (unigram entropy "
      f"{result['unigram_entropy']:.3f}); gains on one held-out batch, the "
      "worst token; mean ± sample std (ddof=1) over seeds.",
      "",
      "## Parameters (MLP width matched to oHC's count)",
      "",
      "| variant | MLP width | parameters |",
      "|---|---|---|",
      *(
        f"| {name} | {width} | {int(params[name]['mean']):,} |"
        for name, width in result["mlp_hidden"].items()
        if name in params
      ),
      "",
      "## Learning rates (seed 0, final training loss)",
      "",
      *report.sweep_rows(result["sweeps"]),
      "",
      f"{variant('hc', shallow)} trains at {variant('hc', deep)}'s rate, "
      f"{result['variants'][variant('hc', shallow)]['learning_rate']:g}.",
      "",
      "## Validation loss",
      "",
      *grid.markdown_table(
        result["val_loss"], "val loss", variant("prenorm", deep)
      ),
      "",
      "## Composite stream mixing prod H_res (worst token of the batch)",
      "",
      "| variant | Amax at init | forward | backward | sigma_max | "
      "sigma_min | log distortion | stream spread |",
      "|---|---|---|---|---|---|---|---|",
    ]
    g = result["gains"]
    for name in g["amax"]:
      row = [
        grid.fmt(g[m][name], 4)
        for m in (
          "amax_init",
          "forward",
          "backward",
          "sigma_max",
          "sigma_min",
          "log_distortion",
          "stream_spread",
        )
      ]
      lines.append(f"| {name} | " + " | ".join(row) + " |")
    inert = [
      name
      for name, c in g["stream_spread"].items()
      if max(c["values"]) < SPREAD_FLOOR
    ]
    if inert:
      lines += [
        "",
        f"Stream spread below {SPREAD_FLOOR:g} in {', '.join(inert)}: the "
        "streams stay (nearly) identical, so any mixing with unit row "
        "sums acts as the identity and gets (almost) no gradient.",
      ]
    lines += [
      "",
      "## Per-layer activation RMS and gradient norms (trained, mean)",
      "",
      *rd.probe_rows(result["lines"], list(result["val_loss"])),
    ]
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
