"""Deep Pre-Norm and the single-stream schemes that claim to fix it.

Every arm is the runner's byte LM (`jaxnorm.nn.models.DecoderLM` on
Shakespeare bytes) with one residual scheme of
`jaxnorm.nn.residual.RESIDUALS`, at a deep setting ``D`` = 16 layers
(default; ``--full`` 32) and, where a claim is about depth itself, a
shallow one ``S`` = 4 (``--full`` 8). After training, one held-out batch
goes through the model of the run's final checkpoint (restored by the
runner, `experiments._harness.runs.trained`) and gives the RMS of the
residual stream after the embedding and after every layer, its growth
``g = log(RMS(h_L) / RMS(h_0))`` (``log_rms_growth``) and the gradient
norm of each layer's attention and MLP weights.

Claims (each fixed before running; paired by seed; loss metric: validation
loss in nats per byte, lower is better, margin
`claims.MARGINS["nats_per_byte"]` = 0.01; growth metric: ``g``, a log
ratio, margin `claims.MARGINS["log_ratio"]` = log 1.1):

* Regime (LayerNorm Scaling, Sun et al., "The Curse of Depth in Large
  Language Models", arXiv:2502.05795): in Pre-LN the output variance grows
  with depth, so the deep layers' Jacobians approach the identity. Pre-Norm
  at ``D`` has a larger ``g`` than at ``S`` (``superior``, higher, margin
  log 1.1). Where this is not reproduced, the curse is not shown at this
  scale and the three claims that answer it (the next two and the 1/n
  one) are ``not testable at this scale``.
* LNS (same paper): scaling each layer's norm output by ``1/sqrt(l)``
  lowers Pre-LN's loss (``superior``, margin 0.01) and damps the variance
  growth (smaller ``g`` than Pre-Norm at ``D``, ``superior``, margin
  log 1.1). The curse needs depth: LNS runs at ``D`` >= 16 (the paper's
  models have 12 to 32+ layers), never at depth 4.
* Depth-scaled residual (Dherin & Munn, "On residual network depth",
  arXiv:2510.03470, ``scaled`` with ``lam = 1/n``): the output stays
  bounded independent of depth (total path weight ``(1 + 1/n)^n <= e``):
  ``g`` at ``D`` is ``non_inferior`` to ``g`` at ``S`` (at most log 1.1
  larger). Gated by the regime (without growth in the standard residual
  there is nothing to bound).
* SkipInit (De & Smith, arXiv:2002.10444): a residual branch gated by a
  scalar initialized to 0, no normalization, trains a deep network as well
  as a normalized one: ``non_inferior`` to Pre-Norm at ``D``, margin 0.01.
* ReZero (Bachlechner et al., arXiv:2003.04887): the same gate (one per
  layer, the official code) converges faster than Pre-LN: lower loss after
  the same steps, ``superior``, margin 0.01.
* LayerScale (Touvron et al., CaiT, arXiv:2103.17239): a per-channel gate
  initialized small (CaiT's 0.1 / 1e-5 / 1e-6 by depth) lets deeper
  networks train better: ``superior`` to Pre-Norm at ``D``, margin 0.01.

Each claim's baseline counts as trained when its mean validation loss is
below the unigram entropy of the validation bytes (the best context-free
model); a baseline that is not cannot support ``reproduced``.

Fair comparison: every arm at ``D`` trains at its own learning rate, the
best of a geometric sweep (1e-3, 3e-3, 1e-2, extended while the best is at
an end) on seed 0 chosen by the final training loss, a split other than
the reported validation loss (`experiments._harness.grid.tuned_grid`);
then every seed at that rate. The shallow arms (Pre-Norm and 1/n at ``S``)
train at their deep arm's rate, so that only the depth differs. Parameter
counts at ``D``: the schemes differ only by norms' scales and gates
(SkipInit and ReZero drop the norms, LayerScale adds vectors), within
0.5% of Pre-Norm; each record's setting gives both counts.

Regime: width 32, 2 heads, 64-byte windows, batch 16, `DEFAULT_STEPS`
AdamW steps (cosine, 10 warm-up steps, weight decay 0.1, clip 1.0), 3
seeds. The seeds of a run share one compilation (a persistent XLA cache
under ``--runs``, `compilation_cache`). ``--full``: `tiers.FULL_LM` (width
256, 8 heads, 256-byte windows, batch 32), depths 32 and 8, 2000 steps, 5
seeds. ``--quick`` (the tests): toy LM, depths 2 and 1, one seed, no
sweep.

Deviations: the papers train 100M-7B models for billions of tokens; here
a 0.2M-parameter byte LM trains on 0.1M bytes (100 steps), so each
verdict says what holds at this scale. Every scheme keeps its spec
defaults (`jaxnorm.nn.residual.RESIDUALS`). The multi-stream schemes (HC,
mHC, oHC, iHC) are `experiments.residual_streams`; DepthBench's depth
comparison at a fixed budget (and depth-muP / CompleteP) is
`experiments.depthbench`, which also holds Full AttnRes against Pre-Norm
(Attention Residuals, arXiv:2603.15031, Table 4): at 16 layers AttnRes's
O(L^2) aggregation makes a step cost 10x Pre-Norm's on 2 cores (1.1 s), so
its sweep alone would take this script's budget.

  python -m experiments.residual_depth [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from experiments._harness import grid, report, runs, tiers
from jaxnorm.training import claims
from jaxnorm.training import config as config_lib
from jaxnorm.training import data as data_lib

NAME = "residual_depth"
MARGIN = claims.MARGINS["nats_per_byte"]
RATIO = claims.MARGINS["log_ratio"]
DEFAULT_STEPS = 100
# (deep D, shallow S) per tier.
DEPTHS = {"quick": (2, 1), "default": (16, 4), "full": (32, 8)}
# The schemes trained at D, each at its own learning rate.
DEEP = (
  "prenorm",
  "lns",
  "scaled",
  "skipinit",
  "rezero",
  "layerscale",
)
# The schemes also trained at S, at their deep arm's learning rate.
SHALLOW = ("prenorm", "scaled")
LEARNING_RATES = (1e-3, 3e-3, 1e-2)

LNS = ("LayerNorm Scaling (The Curse of Depth)", "2502.05795")


def variant(scheme: str, depth: int) -> str:
  """The grid's name of one (scheme, depth) arm."""
  return f"{scheme}-L{depth}"


def depths(args: argparse.Namespace) -> tuple[int, int]:
  """The tier's deep and shallow depths."""
  return DEPTHS[tiers.tier(args)]


def make_claims(deep: int, shallow: int) -> dict[str, claims.Claim]:
  """The claims at depths ``deep`` and ``shallow`` (module docstring)."""
  pre, pre_s = variant("prenorm", deep), variant("prenorm", shallow)

  def loss(key, paper, arxiv, text, scheme, kind="superior"):
    return key, claims.Claim(
      paper=paper,
      arxiv=arxiv,
      claim=text,
      metric="val_loss",
      direction="lower",
      kind=kind,
      margin=MARGIN,
      a=variant(scheme, deep),
      b=pre,
    )

  def growth(key, paper, arxiv, text, a, b, direction, kind):
    return key, claims.Claim(
      paper=paper,
      arxiv=arxiv,
      claim=text,
      metric="log_rms_growth",
      direction=direction,
      kind=kind,
      margin=RATIO,
      a=a,
      b=b,
    )

  return dict(
    [
      growth(
        "curse",
        *LNS,
        f"in Pre-LN the activation variance grows with depth (the curse "
        f"of depth): RMS growth at {deep} layers above that at {shallow}",
        pre,
        pre_s,
        "higher",
        "superior",
      ),
      loss(
        "lns_loss",
        *LNS,
        "LayerNorm Scaling (norm output x 1/sqrt(layer)) lowers Pre-LN's loss",
        "lns",
      ),
      growth(
        "lns_growth",
        *LNS,
        "LayerNorm Scaling damps Pre-LN's activation growth with depth",
        variant("lns", deep),
        pre,
        "lower",
        "superior",
      ),
      growth(
        "scaled",
        "On residual network depth",
        "2510.03470",
        f"with every branch scaled by 1/n the output stays bounded "
        f"independent of depth: RMS growth at {deep} layers at most that "
        f"at {shallow}",
        variant("scaled", deep),
        variant("scaled", shallow),
        "lower",
        "non_inferior",
      ),
      loss(
        "skipinit",
        "SkipInit",
        "2002.10444",
        "a zero-initialized scalar gate on each branch trains a deep "
        "network without normalization as well as a normalized one",
        "skipinit",
        kind="non_inferior",
      ),
      loss(
        "rezero",
        "ReZero",
        "2003.04887",
        "ReZero (x + alpha F(x), alpha = 0 at init, no norm) converges "
        "faster than Pre-LN: lower loss after the same steps",
        "rezero",
      ),
      loss(
        "layerscale",
        "LayerScale (CaiT)",
        "2103.17239",
        "LayerScale (a per-channel branch gate initialized small) improves "
        "the training of deep networks",
        "layerscale",
      ),
    ]
  )


# Claims that answer the curse of depth: not testable where it is absent.
GATED = ("lns_loss", "lns_growth", "scaled")


def base_config(args: argparse.Namespace) -> config_lib.TrainConfig:
  """The shared run of each tier (depth set per arm)."""
  return tiers.byte_lm_config(
    args,
    dict(
      width=32,
      depth=4,
      num_heads=2,
      seq_len=64,
      batch_size=16,
      steps=DEFAULT_STEPS,
      eval_every=50,
      eval_batches=4,
      warmup_steps=10,
    ),
    full_steps=2000,
    full_eval_every=250,
    keep_checkpoints=1,
  )


@contextlib.contextmanager
def compilation_cache(folder: pathlib.Path):
  """A persistent XLA cache in ``folder`` unless one is configured already.

  Every `trainer.train` call builds fresh jitted closures; the seeds of a
  run lower to the same programs (parameters and data are arguments), so
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
# The shallow arms' rate and the probes' batch.


def learning_rate(
  tuned: Mapping[str, Mapping[str, Any]],
  name: str,
  base: config_lib.TrainConfig,
) -> float:
  """The rate ``name`` trained at (the base rate where nothing was swept)."""
  return float(tuned[name].get("learning_rate", base.learning_rate))


def probe_batch(base: config_lib.TrainConfig) -> jax.Array:
  """The first held-out evaluation batch (``batch_size`` windows)."""
  text = data_lib.load_text(base.data)
  return jnp.asarray(
    data_lib.eval_windows(
      text.val, base.seq_len, batch_size=base.batch_size, max_batches=1
    )[0]
  )


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
  after layer ``l`` (``l = 0``: the embedding; multi-stream schemes give
  their read-out, AttnRes its aggregated state); ``grad_norm[l]`` the norm
  of the loss gradient over the attention and MLP weights of layer ``l``
  (sublayers ``2 l`` and ``2 l + 1``, not the residual steps' own
  parameters); ``log_rms_growth`` is ``log(rms[-1] / rms[0])``;
  ``embedding`` the embedded batch (``hidden[0]``).
  """
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_fn(p):
    return _loss_and_hidden(nnx.merge(graphdef, p, rest), batch)

  (loss, hidden), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  h = hidden.astype(jnp.float32)
  rms = np.asarray(jnp.sqrt(jnp.mean(jnp.square(h), axis=(1, 2, 3))))
  blocks = grads["net"]["blocks"]
  layers = len(rms) - 1
  grad_norm = [
    float(optax.tree.norm([blocks[2 * i], blocks[2 * i + 1]]))
    for i in range(layers)
  ]
  return {
    "probe_loss": float(loss),
    "rms": rms.tolist(),
    "log_rms_growth": float(np.log(rms[-1] / rms[0])),
    "grad_norm": grad_norm,
    "embedding": hidden[0],
  }


# ---------------------------------------------------------------------------
# Records and report.


def records(
  lines: Sequence[Mapping[str, Any]],
  base: config_lib.TrainConfig,
  variants: Mapping[str, Mapping[str, Any]],
  the_claims: Mapping[str, claims.Claim],
  unigram: float,
) -> list[dict[str, Any]]:
  """The claims' records; the curse of depth gates `GATED`."""
  out = {}
  for key, claim in the_claims.items():
    why = runs.untrained(lines, claim.b, unigram, what="the unigram entropy")
    trained = why is None
    testable, reason = True, why
    if key in GATED:
      curse = out["curse"]
      if curse["verdict"] != "reproduced":
        testable = False
        reason = (
          "the curse of depth is not shown here: Pre-Norm's activation "
          f"growth is not shown to increase with depth ({curse['why']})"
        )
    out[key] = grid.runner_record(
      lines,
      claim,
      base,
      variants,
      baseline_trained=trained,
      testable=testable,
      reason=reason,
    )
  return list(out.values())


def _mean_curve(
  lines: Sequence[Mapping[str, Any]], name: str, key: str
) -> np.ndarray | None:
  rows = [ln[key] for ln in lines if ln["variant"] == name and key in ln]
  return np.mean(np.asarray(rows), axis=0) if rows else None


def probe_rows(lines: Sequence[Mapping[str, Any]], names: Sequence[str]):
  """Per-layer RMS (mean over seeds) and the last/first gradient ratio."""
  rows = [
    "| variant | RMS after embedding, layer 1, ... | grad norm last / "
    "first layer |",
    "|---|---|---|",
  ]
  for name in names:
    rms = _mean_curve(lines, name, "rms")
    grad = _mean_curve(lines, name, "grad_norm")
    if rms is not None:
      rows.append(
        f"| {name} | {' '.join(f'{r:.2g}' for r in rms)} | "
        f"{grad[-1] / grad[0]:.3g} |"
      )
  return rows


def probe_figure(
  table: pathlib.Path,
  result: Mapping[str, Any],
  path: pathlib.Path,
  title: str,
  deep_names: Sequence[str],
) -> None:
  """Curves, final loss, per-layer RMS and gradients, claims' differences."""
  plt = report.pyplot()
  fig = plt.figure(figsize=(18, 9.5))
  spec = fig.add_gridspec(2, 3)
  ax_curve, ax_bar, ax_rms = (fig.add_subplot(spec[0, i]) for i in range(3))
  ax_grad = fig.add_subplot(spec[1, 0])
  ax_claims = fig.add_subplot(spec[1, 1:])
  lines = result["lines"]
  report.curves_axes(
    ax_curve, grid.val_curves(table, lines), "validation loss (nats/byte)"
  )
  report.cells_bars(ax_bar, result["val_loss"])
  ax_bar.set_ylim(bottom=0)
  ax_bar.set_ylabel("final validation loss (nats/byte)")
  ax_bar.set_title("final validation loss (mean ± std)")
  for name in deep_names:
    rms = _mean_curve(lines, name, "rms")
    grad = _mean_curve(lines, name, "grad_norm")
    if rms is not None:
      ax_rms.plot(range(len(rms)), rms, marker=".", label=name)
      ax_grad.plot(range(1, len(grad) + 1), grad, marker=".", label=name)
  ax_rms.set_yscale("log")
  ax_rms.set_xlabel("layer (0: embedding)")
  ax_rms.set_ylabel("RMS of the residual stream (log)")
  ax_rms.set_title("per-layer activation RMS (trained, mean over seeds)")
  ax_grad.set_yscale("log")
  ax_grad.set_xlabel("layer")
  ax_grad.set_ylabel("gradient norm of the layer's weights (log)")
  ax_grad.set_title("per-layer gradient norm (trained, mean over seeds)")
  for ax in (ax_rms, ax_grad):
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  report.claims_axes(ax_claims, result["claims"])
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the grid (skipping finished runs), probes and writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  base = base_config(args)
  seeds = tiers.seeds(args)
  deep, shallow = depths(args)
  the_claims = make_claims(deep, shallow)
  deep_arms = {variant(s, deep): {"residual": s, "depth": deep} for s in DEEP}
  folder = pathlib.Path(args.runs)
  table = folder / "grid.jsonl"
  rates = (
    {}
    if tiers.tier(args) == "quick"
    else {name: LEARNING_RATES for name in deep_arms}
  )
  unigram = runs.chance_loss(base)

  def compute() -> dict:
    with compilation_cache(folder / "xla_cache"):
      lines, tuned = grid.tuned_grid(table, base, deep_arms, seeds, rates)
      variants = dict(tuned["variants"])
      shallow_arms = {
        variant(s, shallow): {
          "residual": s,
          "depth": shallow,
          "learning_rate": learning_rate(variants, variant(s, deep), base),
        }
        for s in SHALLOW
      }
      variants.update(shallow_arms)
      lines += grid.fixed_rate_grid(table, base, shallow_arms, seeds)
      batch = probe_batch(base)

      def probe(ln: Mapping[str, Any]) -> dict[str, Any]:
        model = runs.trained_line(table, base, variants, ln)
        found = layer_probes(model, batch)
        found.pop("embedding")
        return found

      lines = runs.probed(lines, folder / "probes.jsonl", probe)
    return {
      "depths": {"deep": deep, "shallow": shallow},
      "unigram_entropy": unigram,
      "claims": records(lines, base, variants, the_claims, unigram),
      "sweeps": tuned["sweeps"],
      "variants": variants,
      "lines": lines,
      "val_loss": grid.cells(lines, "val_loss"),
      "log_rms_growth": grid.cells(lines, "log_rms_growth"),
    }

  def figure(result: dict, path: pathlib.Path) -> None:
    probe_figure(
      table,
      result,
      path,
      f"byte LM, width {base.width}, {deep} vs {shallow} layers, "
      f"{base.steps} steps: deep Pre-Norm and its fixes ({len(seeds)} "
      "seeds)",
      list(deep_arms),
    )

  def markdown(result: dict) -> list[str]:
    lines = [
      f"Runner config: width {base.width}, {base.num_heads} heads, "
      f"{base.seq_len}-byte windows, batch {base.batch_size}, {base.steps} "
      f"AdamW steps (cosine, warm-up {base.warmup_steps}, weight decay "
      f"{base.weight_decay}, clip {base.clip_norm}), depths {deep} and "
      f"{shallow}, seeds {list(seeds)}; every scheme with its spec "
      f"defaults. Validation loss in nats per byte over "
      f"{base.eval_batches} held-out batches (unigram entropy "
      f"{result['unigram_entropy']:.3f}); probes on one held-out batch of "
      "the model of the final checkpoint; mean ± sample std (ddof=1) over "
      "seeds.",
      "",
      "## Learning rates (seed 0, final training loss)",
      "",
      *report.sweep_rows(result["sweeps"]),
      "",
      "The shallow arms train at their deep arm's rate: "
      + ", ".join(
        f"{variant(s, shallow)} at "
        f"{result['variants'][variant(s, shallow)]['learning_rate']:g}"
        for s in SHALLOW
      )
      + ".",
      "",
      "## Validation loss",
      "",
      *grid.markdown_table(
        result["val_loss"], "val loss", variant("prenorm", deep)
      ),
      "",
      "## Activation RMS growth log(RMS(h_L) / RMS(h_0)) (trained)",
      "",
      *grid.markdown_table(result["log_rms_growth"], "log growth"),
      "",
      "## Per-layer activation RMS and gradient norms (trained, mean)",
      "",
      *probe_rows(result["lines"], list(result["val_loss"])),
    ]
    return lines

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
