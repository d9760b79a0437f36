"""Residual schemes at depth: loss, activation RMS, gradients, stream gain.

Every residual scheme of `jaxnorm.nn.residual.RESIDUALS` that the decoder
LM accepts (all of them) trains at several depths at one fixed width, on
the runner's byte LM (Shakespeare), 3 seeds each (`experiments._grid`).
After training, one held-out batch goes through the model restored from
its final checkpoint and gives:

* the validation loss (nats per byte, the runner's evaluation);
* the RMS of the residual stream after the embedding and after every layer
  (`DecoderLM` ``return_hidden``: multi-stream schemes give their read-out,
  AttnRes its aggregated state), and its growth ``RMS(h_L) / RMS(h_0)``;
* the gradient norm of each layer's attention and MLP weights (the
  sublayers, not the residual steps' own parameters) on that batch;
* for HC, mHC and oHC, the composite stream mixing of the whole network,
  ``P = H_res^(K) ... H_res^(1)`` over all ``K = 2 L`` sublayers (rows are
  target streams; the maps are per token, from each step's ``maps`` on the
  stream state the network really computes), and its gains: the mHC
  paper's "Amax gain magnitude", the largest absolute row sum (forward
  gain) and column sum (backward gain) of ``P``, and its largest and
  smallest singular values; each is the worst (max; min for the smallest
  singular value) over the batch's tokens, at initialization and after
  training, also per layer (the product up to that layer); and the spread
  of the final streams (0 when they are identical: then any mixing with
  unit row sums acts as the identity; with a uniform initial read, mHC's
  and oHC's streams never separate, which is why the models focus the read
  of sublayer ``k`` on stream ``k mod n``, `jaxnorm.residual.mhc_static_init`).

Claims (papers as stated in ``shared/specs/residual_optim.md``; ``D`` is
the deepest depth at which both compared schemes ran):

* mHC (Xie et al., arXiv:2512.24880): the composite Amax gain of HC grows
  with depth while mHC's stays near 1 (about 3000 vs near 1 at 27B).
  Reproduced when mHC's gain (max of forward and backward) stays within
  `GAIN_TOLERANCE` of 1 at every depth, HC's is significantly larger at
  the deepest than at the shallowest depth (`_grid.verdict` on the log
  gain) and exceeds that bound at the deepest.
* mHC, HC: lower the loss of Pre-Norm at depth ``D``.
* oHC (Guo et al., arXiv:2609.02672): ``H_res`` in SO(4) keeps every
  singular value of the composite mixing at 1 (no amplification, no
  attenuation, checked within `ORTHO_TOLERANCE`) whereas mHC's doubly
  stochastic mixing contracts with depth (its smallest singular value
  lower at the deepest than at the shallowest depth; the spec has this
  from digests of the paper, which it could not read); and oHC lowers the
  loss of the single-stream residual (Pre-Norm) at depth ``D``.
* Attention Residuals (Kimi Team, arXiv:2603.15031): Full AttnRes lowers
  Pre-Norm's loss (their Table 4: 1.737 vs 1.766) at depth ``D``.
* LayerNorm Scaling (Sun et al., "The Curse of Depth", arXiv:2502.05795):
  lowers Pre-LN's loss at depth ``D``, and damps the growth of the
  activation RMS with depth that makes Pre-LN's deep layers near-identity
  (lower RMS growth than Pre-Norm at ``D``).
* Depth-scaled residual (Dherin & Munn, arXiv:2510.03470, ``scaled`` with
  ``lam = 1/n``): the output stays bounded independent of depth, i.e. the
  RMS growth at the deepest depth equals that at the shallowest within a
  factor `FLAT_FACTOR`.
* SkipInit (De & Smith, arXiv:2002.10444) and ReZero (Bachlechner et al.,
  arXiv:2003.04887; the spec's section 6 has both from memory): train a
  deep network without normalization in the residual branches as well as
  Pre-LN (loss not worse than Pre-Norm's within `TOLERANCE` nats at depth
  ``D``); ReZero also converges faster (lower loss than Pre-Norm after
  the same steps).
* LayerScale (Touvron et al., CaiT, arXiv:2103.17239): lowers the loss of
  the deep Pre-Norm network at depth ``D``.

Verdicts compare seed means with the standard error of their difference
(`experiments._grid.verdict`; "not worse" is
`experiments.optimizers_claims.not_worse`); a claim with several parts is
reproduced when all are, not reproduced when one is not.

Scales:

* default (width 32, 2 heads, 64-byte windows, batch 16, 100 AdamW
  steps; sized for about 13 minutes on 2 free cores): `DEFAULT_SCHEMES`,
  Pre-Norm at depths 4, 8, 16, 32, HC at 4, 8, 32, mHC, oHC and Full
  AttnRes at 4 and 8, LNS and the 1/n-scaled residual at 4 and 32,
  SkipInit, ReZero and LayerScale at 32. The deep multi-stream and AttnRes
  cells are the expensive ones: measured on this machine under load, a
  depth-32 step costs about 2x (HC), 3x (oHC), 9x (mHC, whose 20 Sinkhorn
  iterations per sublayer run in a loop) and 15x (AttnRes, O(L^2) sources)
  a Pre-Norm step, so mHC, oHC and AttnRes stop at depth 8 here. Left out
  of the default for time, and run by ``--full``: those deeper cells, HC at
  16, and ``postnorm``, ``sandwich``, ``deepnorm``, ``keel``, ``depth_mup``,
  ``completep`` (no depth claim is checked for them here;
  `experiments.depthbench` compares them), ``ihc`` (oHC's identity-mixing
  baseline) and ``block_attnres`` (with 8 blocks it equals Full AttnRes at
  depth 4). The seeds of a cell share one compilation (a persistent XLA
  cache under ``--runs``, `compilation_cache`);
* ``--full`` (GPU-sized, `experiments.tiers.FULL_LM` at width 256): every
  scheme of `RESIDUALS` at depths 4, 8, 16 and 32;
* ``--quick`` (the tests): toy model, one seed, HC at depths 1 and 2,
  Pre-Norm and mHC at depth 1.

  python -m experiments.residual_depth [--quick] [--full]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from experiments import attention_claims as attn_claims
from experiments import optimizers_claims as opt_claims
from experiments._harness import grid as _grid
from experiments._harness import report as _report
from experiments._harness import tiers
from jaxnorm import residual
from jaxnorm.nn import residual as nn_residual
from jaxnorm.training import build
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "residual_depth"
STREAM_SCHEMES = ("hc", "mhc", "ohc")
ALL_DEPTHS = (4, 8, 16, 32)
# scheme -> depths, per scale.
QUICK_SCHEMES = {"prenorm": (1,), "hc": (1, 2), "mhc": (1,)}
DEFAULT_SCHEMES = {
  "prenorm": ALL_DEPTHS,
  "hc": (4, 8, 32),
  "mhc": (4, 8),
  "ohc": (4, 8),
  "attnres": (4, 8),
  "lns": (4, 32),
  "scaled": (4, 32),
  "skipinit": (32,),
  "rezero": (32,),
  "layerscale": (32,),
}
FULL_SCHEMES = {s: ALL_DEPTHS for s in nn_residual.RESIDUALS}
# Nats within which a loss counts as "not worse".
TOLERANCE = 0.02
# mHC's composite gain counts as "near 1" up to 1 + GAIN_TOLERANCE.
GAIN_TOLERANCE = 0.1
# oHC's composite singular values count as 1 within ORTHO_TOLERANCE.
ORTHO_TOLERANCE = 1e-3
# Streams count as identical below this spread (`stream_mixing`).
SPREAD_FLOOR = 0.01
# "Flat" RMS growth: deepest within this factor of the shallowest.
FLAT_FACTOR = 1.5
NOT = "not reproduced at this scale"


def schemes_of(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
  """The scale's scheme -> depths."""
  if args.quick:
    return dict(QUICK_SCHEMES)
  return dict(FULL_SCHEMES if args.full else DEFAULT_SCHEMES)


def variant(scheme: str, depth: int) -> str:
  """The grid's name of one (scheme, depth) cell."""
  return f"{scheme}-L{depth}"


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run: width 32, 2 heads, 64-byte windows (quick: toy)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=32,
      depth=4,
      num_heads=2,
      seq_len=64,
      batch_size=16,
      steps=100,
      eval_every=50,
      eval_batches=4,
      warmup_steps=10,
    ),
    full_steps=2000,
    full_eval_every=250,
    keep_checkpoints=1,
    learning_rate=3e-3,
  )


@contextlib.contextmanager
def compilation_cache(folder: pathlib.Path):
  """A persistent XLA cache in ``folder`` unless one is configured already.

  Every `trainer.train` call builds fresh jitted closures; the seeds of a
  cell lower to the same programs (parameters and data are arguments), so
  with the cache only the first seed compiles. The previous setting is
  restored on exit.
  """
  if jax.config.jax_compilation_cache_dir is not None:
    yield
    return
  folder.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", None)
    jax_cache.reset_cache()


# ---------------------------------------------------------------------------
# Probes on one held-out batch.


def _loss_and_hidden(model: nnx.Module, batch: jax.Array):
  logits, hidden = model(batch[:, :-1], return_hidden=True)
  loss = jnp.mean(
    optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), batch[:, 1:]
    )
  )
  return loss, hidden


def layer_probes(model: nnx.Module, batch: jax.Array) -> dict[str, Any]:
  """Per-layer RMS of the stream and gradient norms of each layer's weights.

  ``rms[l]`` is the RMS over batch, positions and width of the hidden state
  after layer ``l`` (``l = 0``: the embedding); ``grad_norm[l]`` the norm
  of the loss gradient over the attention and MLP weights of layer ``l``
  (sublayers ``2 l`` and ``2 l + 1``).
  """
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_fn(p):
    return _loss_and_hidden(nnx.merge(graphdef, p, rest), batch)

  (loss, hidden), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  h = hidden.astype(jnp.float32)
  rms = jnp.sqrt(jnp.mean(jnp.square(h), axis=(1, 2, 3)))
  blocks = grads["net"]["blocks"]
  depth = len(rms) - 1
  grad_norm = [
    float(optax.tree.norm([blocks[2 * i], blocks[2 * i + 1]]))
    for i in range(depth)
  ]
  return {
    "probe_loss": float(loss),
    "rms": np.asarray(rms).tolist(),
    "grad_norm": grad_norm,
    "embedding": hidden[0],
  }


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
  their maximum; ``sigma_max`` / ``sigma_min``: the largest / smallest
  singular value. Worst case over the leading (token) axes.
  """
  a = np.abs(p)
  s = np.linalg.svd(p, compute_uv=False)
  forward = float(a.sum(-1).max())
  backward = float(a.sum(-2).max())
  return {
    "forward": forward,
    "backward": backward,
    "amax": max(forward, backward),
    "sigma_max": float(s[..., 0].max()),
    "sigma_min": float(s[..., -1].min()),
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


def probe_line(
  line: Mapping[str, Any],
  cfg: config_lib.TrainConfig,
  run_dir: pathlib.Path,
  batch: jax.Array,
  vocab_size: int,
) -> dict[str, Any]:
  """The probes of one finished run, added to its table line."""
  model = attn_claims.trained_model(cfg, run_dir, vocab_size)
  found = layer_probes(model, batch)
  x = found.pop("embedding")
  rms = found["rms"]
  out = {**line, **found, "log_rms_growth": float(np.log(rms[-1] / rms[0]))}
  if cfg.residual in STREAM_SCHEMES:
    mats, out["stream_spread"] = stream_mixing(model, x)
    trained = composite_gains(mats)
    init_model = build.build_model(
      cfg,
      {"vocab_size": vocab_size, "max_len": cfg.seq_len},
      rngs=nnx.Rngs(cfg.seed),
    )
    init_model.eval()
    x0 = _loss_and_hidden(init_model, batch)[1][0]
    init = composite_gains(stream_mixing(init_model, x0)[0])
    out["gain_curve"] = trained.pop("per_layer")
    out["gain_curve_init"] = init.pop("per_layer")
    out.update(trained)
    out.update({f"{k}_init": v for k, v in init.items()})
    out["log_amax"] = float(np.log(trained["amax"]))
  return out


# ---------------------------------------------------------------------------
# Verdicts.


def _deepest(schemes: Mapping[str, Sequence[int]], *names: str) -> int | None:
  common = set.intersection(*(set(schemes.get(n, ())) for n in names))
  return max(common) if common else None


def _bounded(
  grid: Mapping[str, Mapping[str, Any]],
  names: Sequence[str],
  low: float,
  high: float,
  label: str,
) -> tuple[str, str]:
  """Reproduced when every seed value of every cell lies in [low, high]."""
  values = [v for n in names for v in grid[n]["values"]]
  lo, hi = min(values), max(values)
  why = f"{label} over {', '.join(names)} in [{lo:.4g}, {hi:.4g}]"
  ok = low <= lo and hi <= high
  return ("reproduced" if ok else NOT), why


def _mean_above(
  grid: Mapping[str, Mapping[str, Any]], name: str, limit: float, label: str
) -> tuple[str, str]:
  mean = grid[name]["mean"]
  why = f"{label} {name} = {mean:.4g} (bound {limit:.4g})"
  return ("reproduced" if mean > limit else NOT), why


def verdicts(
  schemes: Mapping[str, Sequence[int]],
  cells: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> list[dict[str, Any]]:
  """Every claim whose schemes ran; see the module docstring."""
  out = []

  def add(label: str, depth: int, result: tuple[str, str]) -> None:
    out.append(
      {"claim": label, "depth": depth, "verdict": result[0], "why": result[1]}
    )

  loss = cells["val_loss"]
  gain = cells.get("amax", {})
  log_gain = cells.get("log_amax", {})
  growth = cells["log_rms_growth"]
  for name, label in (
    ("hc", "HC lowers Pre-Norm's loss"),
    ("mhc", "mHC lowers Pre-Norm's loss"),
    ("ohc", "oHC lowers the single-stream (Pre-Norm) loss"),
    ("attnres", "Full AttnRes lowers Pre-Norm's loss"),
    ("block_attnres", "Block AttnRes lowers Pre-Norm's loss"),
    ("lns", "LNS lowers Pre-LN's loss (curse of depth)"),
    ("rezero", "ReZero converges faster than Pre-LN (lower loss)"),
    ("layerscale", "LayerScale lowers deep Pre-Norm's loss"),
  ):
    d = _deepest(schemes, name, "prenorm")
    if d is not None:
      a, b = variant(name, d), variant("prenorm", d)
      add(label, d, _grid.verdict(loss, a, b, "lower"))
  for name, label in (
    ("skipinit", "SkipInit trains as well as Pre-LN without branch norms"),
    ("rezero", "ReZero trains as well as Pre-LN without branch norms"),
  ):
    d = _deepest(schemes, name, "prenorm")
    if d is not None:
      a, b = variant(name, d), variant("prenorm", d)
      add(label, d, opt_claims.not_worse(loss, a, b, TOLERANCE))
  d = _deepest(schemes, "lns", "prenorm")
  if d is not None:
    add(
      "LNS damps the activation RMS growth of Pre-LN",
      d,
      _grid.verdict(growth, variant("lns", d), variant("prenorm", d), "lower"),
    )
  if "scaled" in schemes and len(schemes["scaled"]) > 1:
    lo, hi = min(schemes["scaled"]), max(schemes["scaled"])
    add(
      f"1/n-scaled residual keeps the RMS growth flat in depth "
      f"(L={lo} vs L={hi}, within x{FLAT_FACTOR})",
      hi,
      _grid.verdict(
        growth,
        variant("scaled", hi),
        variant("scaled", lo),
        "equal",
        float(np.log(FLAT_FACTOR)),
      ),
    )
  if "hc" in schemes and "mhc" in schemes and len(schemes["hc"]) > 1:
    lo, hi = min(schemes["hc"]), max(schemes["hc"])
    mhc = [variant("mhc", d) for d in schemes["mhc"]]
    bound = 1.0 + GAIN_TOLERANCE
    add(
      "mHC's composite Amax gain stays near 1 where HC's grows with depth",
      hi,
      opt_claims.both(
        _bounded(gain, mhc, 0.0, bound, "mHC Amax gain"),
        _grid.verdict(log_gain, variant("hc", lo), variant("hc", hi), "lower"),
        _mean_above(gain, variant("hc", hi), bound, "HC Amax gain"),
      ),
    )
  if "ohc" in schemes:
    ohc = [variant("ohc", d) for d in schemes["ohc"]]
    parts = [
      _bounded(
        cells["sigma_max"],
        ohc,
        1 - ORTHO_TOLERANCE,
        1 + ORTHO_TOLERANCE,
        "oHC largest singular value",
      ),
      _bounded(
        cells["sigma_min"],
        ohc,
        1 - ORTHO_TOLERANCE,
        1 + ORTHO_TOLERANCE,
        "oHC smallest singular value",
      ),
    ]
    if "mhc" in schemes and len(schemes["mhc"]) > 1:
      lo, hi = min(schemes["mhc"]), max(schemes["mhc"])
      parts.append(
        _grid.verdict(
          cells["sigma_min"], variant("mhc", hi), variant("mhc", lo), "lower"
        )
      )
    add(
      "oHC's composite mixing keeps every singular value at 1 while "
      "mHC's contracts with depth",
      max(schemes["ohc"]),
      opt_claims.both(*parts),
    )
  return out


# ---------------------------------------------------------------------------
# Report.


def _by_scheme(
  grid: Mapping[str, Mapping[str, Any]], schemes: Mapping[str, Sequence[int]]
) -> dict[str, list[tuple[int, Mapping[str, Any]]]]:
  return {
    s: [(d, grid[variant(s, d)]) for d in ds if variant(s, d) in grid]
    for s, ds in schemes.items()
  }


def _mean_curve(
  lines: Sequence[Mapping[str, Any]], name: str, key: str
) -> np.ndarray | None:
  rows = [ln[key] for ln in lines if ln["variant"] == name]
  return np.mean(np.asarray(rows), axis=0) if rows else None


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), probes and writes the report."""
  p = tiers.parser(__doc__, NAME)
  args = p.parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  schemes = schemes_of(args)
  grid_variants = {
    variant(s, d): {"residual": s, "depth": d}
    for s, depths in schemes.items()
    for d in depths
  }
  table = pathlib.Path(args.runs) / "residual_depth.jsonl"

  def compute() -> dict:
    with compilation_cache(table.parent / "xla_cache"):
      return measure()

  def measure() -> dict:
    lines = _grid.run_grid(table, base, grid_variants, seeds)
    text = data_lib.load_text(base.data)
    batch = jnp.asarray(
      data_lib.eval_windows(
        text.val, base.seq_len, batch_size=base.batch_size, max_batches=1
      )[0]
    )
    probed = []
    for ln in lines:
      cfg = dataclasses.replace(
        base, seed=ln["seed"], **grid_variants[ln["variant"]]
      )
      run_dir = _grid.run_dir(table.parent, ln["variant"], ln["seed"])
      probed.append(probe_line(ln, cfg, run_dir, batch, text.vocab_size))
    cells = {
      metric: _grid.cells([ln for ln in probed if metric in ln], metric)
      for metric in (
        "val_loss",
        "log_rms_growth",
        "amax",
        "log_amax",
        "forward",
        "backward",
        "sigma_max",
        "sigma_min",
        "amax_init",
        "sigma_max_init",
        "stream_spread",
      )
    }
    return {
      "schemes": schemes,
      "lines": probed,
      "cells": cells,
      "verdicts": verdicts(schemes, cells),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    plt = _report.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    ax_loss, ax_rms, ax_grad, ax_gain = axes.ravel()
    sch = result["schemes"]
    for s, cells in _by_scheme(result["cells"]["val_loss"], sch).items():
      if not cells:
        continue
      depths = [d for d, _ in cells]
      values = [c["values"] for _, c in cells]
      (line,) = ax_loss.plot(
        depths, [np.mean(v) for v in values], marker="o", label=s
      )
      ax_loss.fill_between(
        depths,
        [min(v) for v in values],
        [max(v) for v in values],
        color=line.get_color(),
        alpha=0.15,
      )
    ax_loss.set_xscale("log", base=2)
    ax_loss.set_xlabel("layers L (width fixed)")
    ax_loss.set_ylabel("validation loss (nats/byte)")
    ax_loss.set_title("loss vs depth (mean, min-max over seeds)")
    for s, ds in sch.items():
      name = variant(s, max(ds))
      rms = _mean_curve(result["lines"], name, "rms")
      grad = _mean_curve(result["lines"], name, "grad_norm")
      if rms is not None:
        ax_rms.plot(range(len(rms)), rms, marker=".", label=name)
        ax_grad.plot(range(1, len(grad) + 1), grad, marker=".", label=name)
    ax_rms.set_yscale("log")
    ax_rms.set_xlabel("layer (0: embedding)")
    ax_rms.set_ylabel("RMS of the residual stream")
    ax_rms.set_title("per-layer activation RMS, deepest run (trained)")
    ax_grad.set_yscale("log")
    ax_grad.set_xlabel("layer")
    ax_grad.set_ylabel("gradient norm of the layer's weights")
    ax_grad.set_title("per-layer gradient norm, deepest run (trained)")
    for s, cells in _by_scheme(result["cells"]["amax"], sch).items():
      if not cells:
        continue
      depths = [d for d, _ in cells]
      color = None
      for metric, style, label in (
        ("amax", "-", "Amax"),
        ("sigma_max", "--", "sigma_max"),
        ("amax_init", ":", "Amax at init"),
      ):
        (line,) = ax_gain.plot(
          depths,
          [result["cells"][metric][variant(s, d)]["mean"] for d in depths],
          ls=style,
          marker="o",
          color=color,
          label=f"{s} {label}",
        )
        color = line.get_color()
    ax_gain.set_xscale("log", base=2)
    ax_gain.set_yscale("log")
    ax_gain.set_xlabel("layers L")
    ax_gain.set_ylabel("composite stream-mixing gain")
    ax_gain.set_title("HC / mHC / oHC: gain of prod H_res (worst token)")
    for ax in axes.ravel():
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(result: dict) -> list[str]:
    sch = result["schemes"]
    depths = sorted({d for ds in sch.values() for d in ds})
    cells = result["cells"]
    lines = [f"# {__doc__.splitlines()[0]}", ""]
    lines += [
      f"Runner config: width {base.width}, {base.num_heads} heads, "
      f"{base.seq_len}-byte windows, batch {base.batch_size}, {base.steps} "
      f"AdamW steps (lr {base.learning_rate}, cosine, warm-up "
      f"{base.warmup_steps}, weight decay {base.weight_decay}, clip "
      f"{base.clip_norm}), seeds {list(seeds)}; every scheme with its spec "
      "defaults. Validation loss in nats per byte over "
      f"{base.eval_batches} held-out batches; probes on one held-out batch "
      "of the model restored from its final checkpoint; mean ± sample std "
      "(ddof=1) over seeds; empty cells did not run at this scale.",
      "",
    ]

    def depth_table(metric: str, label: str, fmt) -> list[str]:
      rows = [
        f"| scheme | {' | '.join(f'L={d}' for d in depths)} |",
        "|---|" + "---|" * len(depths),
      ]
      for s in sch:
        row = []
        for d in depths:
          c = cells[metric].get(variant(s, d))
          row.append("" if c is None else fmt(c))
        if any(row):
          rows.append(f"| {s} | " + " | ".join(row) + " |")
      return [f"## {label}", "", *rows, ""]

    lines += depth_table("val_loss", "Validation loss", _grid.fmt)
    lines += depth_table(
      "log_rms_growth",
      "Activation RMS growth RMS(h_L) / RMS(h_0) (trained)",
      lambda c: "{:.2f} ± {:.2f}".format(
        *_report.mean_spread(np.exp(c["values"]))
      ),
    )
    lines += [
      "## Per-layer activation RMS and gradient norms (trained, mean)",
      "",
      "| variant | RMS after embedding, layer 1, ... | grad norm last / "
      "first layer |",
      "|---|---|---|",
    ]
    for s, ds in sch.items():
      for d in ds:
        name = variant(s, d)
        rms = _mean_curve(result["lines"], name, "rms")
        grad = _mean_curve(result["lines"], name, "grad_norm")
        if rms is not None:
          lines.append(
            f"| {name} | {' '.join(f'{r:.2g}' for r in rms)} | "
            f"{grad[-1] / grad[0]:.3g} |"
          )
    lines += [
      "",
      "## Composite stream mixing prod H_res (worst token of the batch)",
      "",
      "| variant | Amax at init | sigma_max at init | forward | backward | "
      "sigma_max | sigma_min | stream spread |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for name in cells["amax"]:
      row = [
        _grid.fmt(cells[m][name], 4)
        for m in (
          "amax_init",
          "sigma_max_init",
          "forward",
          "backward",
          "sigma_max",
          "sigma_min",
          "stream_spread",
        )
      ]
      lines.append(f"| {name} | " + " | ".join(row) + " |")
    inert = [
      name
      for name, c in cells["stream_spread"].items()
      if max(c["values"]) < SPREAD_FLOOR
    ]
    if inert:
      lines += [
        "",
        f"Stream spread below {SPREAD_FLOOR:g} in {', '.join(inert)}: the "
        "streams stay (nearly) identical, so any mixing with unit row "
        "sums acts as the identity and gets (almost) no gradient; these "
        "networks train as Pre-Norm with learned branch gains, and their "
        "mixing gains stay those of the initial H_res.",
      ]
    lines += ["", "## Verdicts", ""]
    lines += _grid.verdict_table(result["verdicts"], ("depth",))
    return lines

  return _report.run(NAME, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
