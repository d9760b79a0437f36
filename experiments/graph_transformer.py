"""Graph Transformer ablations on PATTERN (Dwivedi & Bresson), CPU scale.

Five arms of `jaxnorm.nn.graph.GraphTransformer` on an offline PATTERN
(`jaxnorm.training.graph_data`, the Benchmarking-GNNs SBM recipe), each
trained with Adam on the class-balanced cross-entropy and scored by the
weighted (class-averaged) accuracy of `jaxnorm.graph`; chance is 50:

1. sparse + BN + LapPE (the paper's model)
2. sparse + LN + LapPE
3. full + BN + LapPE (attention over every node)
4. sparse + BN, no PE
5. sparse + BN + LapPE + edge features (edge input 1 on every edge)

Laplacian encodings (k=2) get random sign flips at every training step
(one sign per column for the batch, as the official code). Attention logits
are clamped to [-5, 5] as in the official code. Seeds are trained together
(``jax.vmap``), each with its own initialization and data order.

Scales (the default fits about 10 minutes on 2 busy CPU cores):

* default: PATTERN with smaller blocks (clusters and patterns of 5-11
  nodes, about 48 nodes per graph), 20 patterns x (40/8/8) graphs,
  L=4, d=32, 4 heads, batch 32, Adam 1e-3, 5 epochs, 3 seeds; the edge arm
  (10x the cost: an edge stream of N^2 d-vectors) runs one seed.
* ``--full``: the spec's PATTERN-small, 100 patterns x (20/4/4) with the
  benchmark's block sizes (5-34, about 117 nodes), L=4, d=64, 15 epochs,
  3 seeds for every arm.
* ``--quick``: toy sizes for the tests.

  python -m experiments.graph_transformer            # default run
  python -m experiments.graph_transformer --quick    # seconds, for the tests

Writes ``<out>/graph_transformer.{md,json,png}`` and caches the generated
graphs and encodings in ``--cache`` (default ``runs/graph_data``, ignored by
git).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments._harness import report as _report
from jaxnorm import graph
from jaxnorm.nn import graph as nn_graph
from jaxnorm.training import graph_data

ARMS: dict[str, dict] = {
  "sparse+BN+LapPE": {},
  "sparse+LN+LapPE": {"norm": "layernorm"},
  "full+BN+LapPE": {"graph": "full"},
  "sparse+BN+noPE": {"pe": "none"},
  "sparse+BN+LapPE+edges": {"edge_features": True},
}
MAIN = "sparse+BN+LapPE"
EDGE = "sparse+BN+LapPE+edges"


@dataclasses.dataclass(frozen=True)
class Scale:
  """Data and model sizes of one run."""

  patterns: int
  sizes: tuple[int, int, int]
  size_min: int
  size_max: int
  width: int
  depth: int
  heads: int
  batch: int
  epochs: int
  seeds: int
  edge_seeds: int


SCALES = {
  "quick": Scale(4, (16, 8, 8), 3, 6, 8, 1, 2, 8, 2, 2, 1),
  "default": Scale(20, (640, 160, 160), 5, 10, 32, 4, 4, 32, 6, 3, 1),
  "full": Scale(100, (2000, 400, 400), 5, 35, 64, 4, 4, 32, 15, 3, 3),
}


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _models(cfg, seeds):
  """Graph definitions (train, eval) and the seeds' stacked states."""
  models = [nn_graph.GraphTransformer(cfg, rngs=nnx.Rngs(s)) for s in seeds]
  states = [nnx.split(m, nnx.Param, ...)[1:] for m in models]
  models[0].train()
  train_def = nnx.graphdef(models[0])
  models[0].eval()
  eval_def = nnx.graphdef(models[0])
  params = _stack([p for p, _ in states])
  rest = _stack([r for _, r in states])
  return train_def, eval_def, params, rest


def _inputs(cfg, batch):
  pe = batch["pe"] if cfg.pe == "lap" else None
  return (batch["features"], batch["adjacency"], batch["node_mask"], pe)


def _train_fns(cfg, train_def, eval_def, tx):
  """Jitted, seed-vmapped train and evaluation steps."""

  def train_one(params, rest, opt_state, batch, key):
    def loss_fn(model):
      logits = model(*_inputs(cfg, batch), rngs=key)
      return graph.class_balanced_cross_entropy(
        logits, batch["labels"], node_mask=batch["node_mask"]
      )

    model = nnx.merge(train_def, params, rest)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    new_rest = nnx.state(model, nnx.Not(nnx.Param))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_rest, opt_state, loss

  def eval_one(params, rest, batch):
    model = nnx.merge(eval_def, params, rest)
    logits = model(*_inputs(cfg, batch))
    mask = batch["node_mask"]
    loss = graph.class_balanced_cross_entropy(
      logits, batch["labels"], node_mask=mask
    )
    return graph.confusion_matrix(logits, batch["labels"], node_mask=mask), loss

  train = jax.jit(jax.vmap(train_one), donate_argnums=(0, 1, 2))
  evaluate = jax.jit(jax.vmap(eval_one, in_axes=(0, 0, None)))
  return train, evaluate


def _accuracy(evaluate, params, rest, batches) -> np.ndarray:
  """Weighted accuracy per seed over a whole split."""
  total = sum(evaluate(params, rest, b)[0] for b in batches)
  return np.asarray(graph.weighted_accuracy_from_confusion(total))


def run_arm(name, scale, sources, lr, log) -> dict:
  """Trains one arm for every seed; per-epoch curves and final scores."""
  train_src, val_src, test_src = sources
  n_seeds = scale.edge_seeds if name == EDGE else scale.seeds
  seeds = list(range(n_seeds))
  cfg = nn_graph.GraphTransformerConfig(
    num_classes=2,
    vocab_size=graph_data.VOCAB_SIZE["pattern"],
    width=scale.width,
    depth=scale.depth,
    num_heads=scale.heads,
    pe_dim=2,
    logit_clip=5.0,
    **ARMS[name],
  )
  train_def, eval_def, params, rest = _models(cfg, seeds)
  tx = optax.adam(lr)
  opt_state = jax.vmap(tx.init)(params)
  train, evaluate = _train_fns(cfg, train_def, eval_def, tx)
  streams = [
    iter(
      graph_data.graph_batches(
        train_src, batch_size=scale.batch, seed=s
      ).to_iter_dataset()
    )
    for s in seeds
  ]
  val = graph_data.eval_batches(val_src, batch_size=scale.batch)
  test = graph_data.eval_batches(test_src, batch_size=scale.batch)
  steps = len(train_src) // scale.batch
  keys = jax.random.split(jax.random.key(1000), (scale.epochs, steps, n_seeds))
  losses, val_acc = [], []
  for epoch in range(scale.epochs):
    epoch_loss = []
    for step in range(steps):
      batch = _stack([next(s) for s in streams])
      params, rest, opt_state, loss = train(
        params, rest, opt_state, batch, keys[epoch, step]
      )
      epoch_loss.append(loss)
    losses.append(np.mean(np.stack(epoch_loss), 0))
    val_acc.append(_accuracy(evaluate, params, rest, val))
    log(f"{name} epoch {epoch + 1}: val {np.round(val_acc[-1], 1)}")
  test_acc = _accuracy(evaluate, params, rest, test)
  val_acc = np.stack(val_acc, 1)  # (seeds, epochs)
  reach = [
    int(np.argmax(v >= 0.9 * v.max())) + 1 for v in val_acc
  ]  # first epoch at 90% of the best
  return {
    "seeds": n_seeds,
    "test_acc": test_acc.tolist(),
    "final_val_acc": val_acc[:, -1].tolist(),
    "val_curve": val_acc.tolist(),
    "train_loss": np.stack(losses, 1).tolist(),
    "epoch_90": reach,
    "params": int(
      sum(x.size for x in jax.tree.leaves(params)) // max(n_seeds, 1)
    ),
  }


def verdicts(res: dict) -> dict:
  """Each claim of the abstract against the measured test accuracies.

  A difference counts when the mean gap exceeds the larger seed spread
  (sample std) and 1 point; otherwise inconclusive. Accuracy claims use the
  final test accuracy; the speed claim uses the area under the validation
  curve (mean validation accuracy over the epochs), since the spec's
  epoch-90% (first epoch at 90% of the best validation accuracy) is
  degenerate when the best is a few points above chance: every arm gets
  there in one or two epochs. Both are reported.
  """
  arms = res["arms"]

  def stats(name, key="test_acc"):
    return _report.mean_spread(arms[name][key])

  def compare(a, b, claim, key="test_acc"):
    (ma, sa), (mb, sb) = stats(a, key), stats(b, key)
    margin = max(sa, sb, 1.0)
    if ma - mb > margin:
      verdict = "reproduced"
    elif mb - ma > margin:
      verdict = "not reproduced at this scale"
    else:
      verdict = "inconclusive"
    return {
      "claim": claim,
      "a": a,
      "b": b,
      "metric": key,
      "gap": ma - mb,
      "margin": margin,
      "verdict": verdict,
    }

  for r in arms.values():
    r["val_auc"] = _val_auc(r)
  out = {
    "sparse_vs_full": compare(
      MAIN, "full+BN+LapPE", "neighbour-restricted attention beats full"
    ),
    "lappe": compare(MAIN, "sparse+BN+noPE", "Laplacian PE helps"),
    "bn_vs_ln": compare(
      MAIN, "sparse+LN+LapPE", "BatchNorm generalises better than LayerNorm"
    ),
    "bn_faster": compare(
      MAIN,
      "sparse+LN+LapPE",
      "BatchNorm trains faster than LayerNorm",
      key="val_auc",
    ),
  }
  out["bn_faster"]["epoch_90"] = [
    float(np.mean(arms[n]["epoch_90"])) for n in (MAIN, "sparse+LN+LapPE")
  ]
  return out


def _val_auc(arm: dict) -> list[float]:
  """Per seed: validation accuracy averaged over the epochs (curve area)."""
  return np.asarray(arm["val_curve"]).mean(1).tolist()


def plot(res, path: pathlib.Path) -> None:
  """Validation curves (mean over seeds) and test accuracy per arm."""
  plt = _report.pyplot()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  names = list(res["arms"])
  for name in names:
    curve = np.asarray(res["arms"][name]["val_curve"])
    epochs = np.arange(1, curve.shape[1] + 1)
    ax1.plot(epochs, curve.mean(0), marker="o", label=name)
  ax1.axhline(50, color="grey", ls=":", label="chance")
  ax1.set_xlabel("epoch")
  ax1.set_ylabel("validation weighted accuracy (%)")
  ax1.legend(fontsize=7)
  stats = [_report.mean_spread(res["arms"][n]["test_acc"]) for n in names]
  ax2.bar(
    range(len(names)),
    [m for m, _ in stats],
    yerr=[s for _, s in stats],
    color="tab:blue",
  )
  ax2.axhline(50, color="grey", ls=":")
  ax2.set_xticks(range(len(names)))
  ax2.set_xticklabels(names, rotation=25, ha="right", fontsize=7)
  ax2.set_ylabel("test weighted accuracy (%)")
  ax2.set_ylim(45, max(m + s for m, s in stats) + 5)
  fig.suptitle("Graph Transformer ablations on PATTERN (CPU scale)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def markdown(args, res) -> list[str]:
  """The result file: setup, table, verdicts."""
  s = SCALES[res["scale"]]
  lines = [
    "# Graph Transformer ablations on PATTERN",
    "",
    f"Scale `{res['scale']}`: PATTERN from the Benchmarking-GNNs SBM recipe "
    f"with {s.patterns} patterns, {s.sizes[0]}/{s.sizes[1]}/{s.sizes[2]} "
    f"train/val/test graphs, block sizes {s.size_min}-{s.size_max - 1} "
    f"({res['mean_nodes']:.0f} nodes per graph on average, padded to "
    f"{res['num_nodes']}); L={s.depth}, d={s.width}, {s.heads} heads, "
    f"batch {s.batch}, Adam {args.lr:g}, {s.epochs} epochs, LapPE k=2 with "
    "random sign flips, logits clamped to [-5, 5]. Test weighted accuracy "
    "(mean per-class recall over the split, chance 50) after the last "
    "epoch; val AUC is the validation accuracy averaged over the epochs "
    "(training speed); epoch-90% is the first epoch whose validation "
    "accuracy reaches 90% of that seed's best (the spec's speed measure, "
    "degenerate at this scale: the best is a few points above chance).",
    "",
    "| arm | seeds | test acc (mean ± std) | final val acc | val AUC "
    "| epoch-90% | params |",
    "|---|---|---|---|---|---|---|",
  ]
  for name, r in res["arms"].items():
    m, sd = _report.mean_spread(r["test_acc"])
    v, _ = _report.mean_spread(r["final_val_acc"])
    e, _ = _report.mean_spread(r["epoch_90"])
    a, sa = _report.mean_spread(_val_auc(r))
    lines.append(
      f"| {name} | {r['seeds']} | {m:.1f} ± {sd:.1f} | {v:.1f} | "
      f"{a:.1f} ± {sa:.1f} | {e:.1f} | {r['params']:,} |"
    )
  lines += ["", "Claims of the abstract (arXiv:2012.09699):", ""]
  if not res["verdict"]:
    lines.append(
      "- Not every arm was run (`--arms`). **Verdict: inconclusive.**"
    )
  for v in res["verdict"].values():
    metric = "test acc" if v["metric"] == "test_acc" else "val AUC"
    extra = ""
    if "epoch_90" in v:
      bn, ln = v["epoch_90"]
      extra = f"; epoch-90% {bn:.1f} (BN) vs {ln:.1f} (LN)"
    lines.append(
      f"- {v['claim']}: {metric} of {v['a']} − {v['b']} = {v['gap']:+.1f} "
      f"points (margin {v['margin']:.1f}){extra}. "
      f"**Verdict: {v['verdict']}.**"
    )
  lines += [
    "",
    "A gap counts when it exceeds both arms' seed spread and 1 point. The "
    "paper's numbers (about 84.8 on the full PATTERN with L=10, d=80, "
    "recalled, not re-read) come from 10k graphs of about 117 nodes and "
    "hundreds of epochs; this CPU run checks the ordering only. The edge "
    "arm feeds an uninformative constant edge feature (SBMs have none), so "
    "it tests that the edge stream costs no accuracy, not that edge "
    "features help. The default run shrinks the SBM blocks (5-9 nodes "
    "instead of 5-34) so that five arms and three seeds fit the CPU budget; "
    "`--full` runs the spec's PATTERN-small. The speed criterion (val AUC) "
    "was chosen after the first default run, when epoch-90% proved "
    "degenerate; read that verdict as post hoc. Three seeds and a 1-point "
    "floor are a weak test: the verdicts are orderings at this scale, not "
    "the paper's effect sizes.",
  ]
  return lines


def main(argv: list[str] | None = None) -> dict:
  """Runs the five arms; returns the result dict."""
  p = _report.parser(__doc__)
  p.add_argument(
    "--full", action="store_true", help="the spec's PATTERN-small scale"
  )
  p.add_argument("--lr", type=float, default=1e-3)
  p.add_argument(
    "--cache",
    default="runs/graph_data",
    help="folder of the generated graphs and encodings (reused)",
  )
  p.add_argument(
    "--arms", default=",".join(ARMS), help="comma-separated arm names"
  )
  args = p.parse_args(argv)
  scale_name = "quick" if args.quick else "full" if args.full else "default"
  scale = SCALES[scale_name]
  arms = [a for a in ARMS if a in args.arms.split(",")]

  def compute():
    cache = pathlib.Path(args.cache)
    sources = graph_data.load_sources(
      "pattern",
      scale.sizes,
      seed=0,
      pe_dim=2,
      cache_dir=cache,
      patterns=scale.patterns,
      size_min=scale.size_min,
      size_max=scale.size_max,
    )
    res = {
      "scale": scale_name,
      "num_nodes": int(sources[0].features.shape[1]),
      "mean_nodes": float(sources[0].node_mask.sum(1).mean()),
      "arms": {
        name: run_arm(name, scale, sources, args.lr, print) for name in arms
      },
    }
    if MAIN in res["arms"] and len(res["arms"]) == len(ARMS):
      res["verdict"] = verdicts(res)
    else:
      res["verdict"] = {}
    return res

  return _report.run(
    "graph_transformer",
    args,
    compute,
    plot,
    functools.partial(markdown, args),
  )


if __name__ == "__main__":
  main()
