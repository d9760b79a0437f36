"""DepthBench at CPU scale: residual schemes across a width-depth sweep.

DepthBench (``keyu-wang-2002/DepthBench``) trains Llama-style LMs of one
size at several aspect ratios and asks which residual schemes turn extra
layers into lower loss. Here: byte-level Shakespeare, backbones of about
0.2M parameters at ``(L, d)`` = (2, 96), (4, 64), (8, 48) (the MLP width is
tuned so the backbones agree within 2%), 400 AdamW steps (lr 3e-3, cosine,
10% warmup), three seeds trained together (``jax.vmap``), every scheme built
by name
through `jaxnorm.nn.models.DecoderLM` (RMSNorm, GELU MLP, learned
positions, tied head).

Reported per scheme and shape: validation loss (mean and sample std over
seeds), the depth benefit ``loss(L=2) - loss(L=8)`` (positive: the deeper,
narrower model is better), and for L=8 the mean angular distance between
consecutive layers' hidden states (`jaxnorm.depth_metrics`, from the LM's
``return_hidden``): how much each layer moves the stream.

Claims checked (DepthBench abstract): Pre-LN and most norm/scale variants
gain little or lose as models get deeper and narrower; HC and Full AttnRes
improve consistently.

Scales:

* default (sized for about 10 minutes on 2 free cores: a step of the three
  seeds at 8 x 64 bytes takes roughly 0.1 s for Pre-LN, 2-3x that for HC):
  prenorm, hc, attnres, keel, batches of 8 x 64 bytes;
* ``--full``: all ten DepthBench schemes (adds lns, deepnorm, depth_mup,
  completep, sandwich (Peri-LN), mhc) at the spec's 16 x 128 bytes;
* ``--schemes a,b,...``: any registered schemes at the chosen scale;
* ``--quick``: two tiny shapes, 4 steps, one seed, KEEL only (the tests;
  model building and compiling dominate).

  python -m experiments.depthbench            # default run
  python -m experiments.depthbench --quick    # seconds, for the tests
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import _bytelm
from experiments._harness import report as _report
from jaxnorm import depth_metrics
from jaxnorm.nn import models
from jaxnorm.nn import residual as nn_residual
from jaxnorm.training import data

DEFAULT_SCHEMES = ("prenorm", "hc", "attnres", "keel")
FULL_SCHEMES = DEFAULT_SCHEMES + (
  "lns",
  "deepnorm",
  "depth_mup",
  "completep",
  "sandwich",
  "mhc",
)
# DepthBench's claims: schemes expected to gain from depth, and the rest.
IMPROVE = ("hc", "attnres")


@dataclasses.dataclass(frozen=True)
class Scale:
  """Shapes, schedule and seeds of one run."""

  shapes: tuple[tuple[int, int], ...]
  num_heads: int
  seq_len: int
  batch: int
  steps: int
  seeds: int
  eval_batches: int
  schemes: tuple[str, ...]


SCALES = {
  "quick": Scale(((1, 16), (2, 12)), 2, 16, 4, 4, 1, 1, ("keel",)),
  "default": Scale(
    ((2, 96), (4, 64), (8, 48)), 4, 64, 8, 400, 3, 8, DEFAULT_SCHEMES
  ),
  "full": Scale(
    ((2, 96), (4, 64), (8, 48)), 4, 128, 16, 400, 3, 8, FULL_SCHEMES
  ),
}


def _config(scale: Scale, depth: int, width: int, mlp_hidden: int, scheme):
  return models.LMConfig(
    vocab_size=256,
    width=width,
    depth=depth,
    num_heads=scale.num_heads,
    mlp_hidden=mlp_hidden,
    max_len=scale.seq_len,
    residual=scheme,
  )


def backbone_params(cfg: models.LMConfig) -> int:
  """Parameters of the residual network (blocks and their steps)."""
  model = nnx.eval_shape(lambda: models.DecoderLM(cfg, rngs=nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(model.net, nnx.Param))
  return int(sum(np.prod(p.shape) for p in leaves))


def mlp_widths(scale: Scale) -> list[int]:
  """MLP widths that match every shape's backbone to the first one's.

  The first shape uses ``4 d``; the others solve ``4 d^2 + 2 d h`` per
  layer (bias-free attention and MLP) for the first shape's total.
  """
  (depth0, width0), *_ = scale.shapes
  target = depth0 * (4 * width0**2 + 2 * width0 * 4 * width0)
  return [
    max(1, round((target / depth - 4 * width**2) / (2 * width)))
    for depth, width in scale.shapes
  ]


def _run(scale: Scale, lr: float) -> _bytelm.LMRun:
  """The schedule of `_bytelm` (AdamW, warmup then cosine) for ``scale``."""
  return _bytelm.LMRun(steps=scale.steps, learning_rate=lr)


@functools.cache
def _fns(graphdef, scale: Scale, lr: float):
  """`_bytelm`'s train step and a loss with hidden states, seed-vmapped."""
  run = _run(scale, lr)

  def evaluate(params, rest, batch):
    model = nnx.merge(graphdef, params, rest)
    _, hidden = model(batch[:, :-1], return_hidden=True)
    return _bytelm._loss(model, batch), hidden

  return (
    _bytelm._optimizer(run),
    jax.jit(jax.vmap(_bytelm._step_fn(graphdef, run)), donate_argnums=(0, 2)),
    jax.jit(jax.vmap(evaluate, in_axes=(0, 0, None))),
  )


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _layer_angles(hidden: jax.Array) -> np.ndarray:
  """Mean angular distance between consecutive depths, per seed."""
  out = []
  for hs in hidden:  # (L + 1, batch, seq, d) per seed.
    matrix = depth_metrics.angular_distance_matrix(hs)
    out.append(np.mean(np.diagonal(np.asarray(matrix), offset=1)))
  return np.asarray(out)


def train_shape(scale, splits, scheme, depth, width, mlp_hidden, lr, log):
  """Trains every seed of one (scheme, shape); validation numbers."""
  cfg = _config(scale, depth, width, mlp_hidden, scheme)
  built = [models.DecoderLM(cfg, rngs=nnx.Rngs(s)) for s in range(scale.seeds)]
  graphdef, _, _ = nnx.split(built[0], nnx.Param, ...)
  params = _stack([nnx.split(m, nnx.Param, ...)[1] for m in built])
  rest = _stack([nnx.split(m, nnx.Param, ...)[2] for m in built])
  tx, step, evaluate = _fns(graphdef, scale, lr)
  opt = jax.vmap(tx.init)(params)
  streams = [
    iter(
      data.text_windows(
        splits.train, scale.seq_len, batch_size=scale.batch, seed=s
      )
    )
    for s in range(scale.seeds)
  ]
  for _ in range(scale.steps):
    batch = jnp.asarray(np.stack([next(s) for s in streams]))
    params, opt, loss = step(params, rest, opt, batch)
  losses, hidden = [], None
  val = _bytelm.val_batches(
    splits, scale.seq_len, batch_size=scale.batch, num=scale.eval_batches
  )
  for b in val:
    loss, h = evaluate(params, rest, jnp.asarray(b))
    losses.append(np.asarray(loss))
    hidden = h if hidden is None else hidden
  val_loss = np.mean(losses, axis=0)
  log(f"{scheme} L={depth} d={width}: val {np.round(val_loss, 3)}")
  return {
    "val_loss": val_loss.tolist(),
    "train_loss_last": np.asarray(loss).tolist(),
    "layer_angle": _layer_angles(hidden).tolist(),
  }


def compute(scale: Scale, lr: float, log=print) -> dict:
  """Every scheme at every shape; see the module docstring."""
  splits = _bytelm.text()
  widths = mlp_widths(scale)
  sizes = [
    backbone_params(_config(scale, depth, width, h, "prenorm"))
    for (depth, width), h in zip(scale.shapes, widths)
  ]
  result = {
    "shapes": [list(s) for s in scale.shapes],
    "mlp_hidden": widths,
    "backbone_params": sizes,
    "steps": scale.steps,
    "seeds": scale.seeds,
    "schemes": {},
  }
  for scheme in scale.schemes:
    runs = [
      train_shape(scale, splits, scheme, depth, width, h, lr, log)
      for (depth, width), h in zip(scale.shapes, widths)
    ]
    shallow = np.asarray(runs[0]["val_loss"])
    deep = np.asarray(runs[-1]["val_loss"])
    result["schemes"][scheme] = {
      "runs": runs,
      "depth_benefit": (shallow - deep).tolist(),
    }
  result["verdicts"] = verdicts(result)
  return result


def _benefit(result: dict, scheme: str) -> tuple[float, float]:
  return _report.mean_spread(result["schemes"][scheme]["depth_benefit"])


def verdicts(result: dict) -> dict[str, str]:
  """The two claims against the measured depth benefits.

  "Gains from depth" means a mean benefit above one spread (seed std) and
  above zero; "little or none" a mean within one spread of zero or below.
  """
  schemes = result["schemes"]
  improve = [s for s in IMPROVE if s in schemes]
  flat = [s for s in schemes if s not in IMPROVE]
  out = {}
  if improve:
    gains = [_benefit(result, s) for s in improve]
    ok = all(m > max(sd, 0.0) for m, sd in gains)
    out["hc_attnres_improve"] = (
      "reproduced" if ok else "not reproduced at this scale"
    )
  if flat:
    little = [m <= sd for m, sd in (_benefit(result, s) for s in flat)]
    share = sum(little) / len(little)
    out["prenorm_family_flat"] = (
      "reproduced"
      if share > 0.5
      else "not reproduced at this scale"
      if share < 0.5
      else "inconclusive"
    )
  return out


def figure(result: dict, path) -> None:
  """Validation loss against depth, one line per scheme (mean +- std)."""
  plt = _report.pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  depths = [s[0] for s in result["shapes"]]
  for scheme, r in result["schemes"].items():
    stats = [_report.mean_spread(run["val_loss"]) for run in r["runs"]]
    mean = [m for m, _ in stats]
    ax.errorbar(depths, mean, yerr=[s for _, s in stats], label=scheme)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("layers L (equal backbone size)")
  ax.set_ylabel("validation loss (nats/byte)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def markdown(result: dict) -> list[str]:
  """The results table and the verdicts."""
  shapes = [f"L={d} d={w}" for d, w in result["shapes"]]
  lines = [
    "# DepthBench at CPU scale: residual schemes across aspect ratios",
    "",
    f"Backbone parameters per shape: {result['backbone_params']} (MLP "
    f"widths {result['mlp_hidden']}); {result['steps']} steps, "
    f"{result['seeds']} seeds, mean ± sample std.",
    "",
    "| scheme | "
    + " | ".join(shapes)
    + " | depth benefit | angle/layer (deepest) |",
    "|---" * (len(shapes) + 3) + "|",
  ]
  for scheme, r in result["schemes"].items():
    cells = [
      "{:.3f} ± {:.3f}".format(*_report.mean_spread(run["val_loss"]))
      for run in r["runs"]
    ]
    benefit = "{:+.3f} ± {:.3f}".format(*_benefit(result, scheme))
    angle = "{:.3f}".format(np.mean(r["runs"][-1]["layer_angle"]))
    lines.append(
      f"| {scheme} | " + " | ".join(cells) + f" | {benefit} | {angle} |"
    )
  lines += ["", "**Verdicts** (DepthBench abstract):", ""]
  claims = {
    "hc_attnres_improve": "HC and Full AttnRes gain from depth",
    "prenorm_family_flat": "Pre-LN and norm/scale variants gain little or "
    "lose with depth",
  }
  for key, verdict in result["verdicts"].items():
    lines.append(f"- {claims[key]}: **{verdict}**.")
  return lines


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the sweep at the chosen scale; writes the report files."""
  p = _report.parser(__doc__)
  p.add_argument("--full", action="store_true", help="all ten schemes")
  p.add_argument(
    "--schemes", default="", help="comma-separated residual schemes"
  )
  p.add_argument("--learning-rate", type=float, default=3e-3)
  args = p.parse_args(argv)
  name = "quick" if args.quick else "full" if args.full else "default"
  scale = SCALES[name]
  if args.schemes:
    chosen = tuple(args.schemes.split(","))
    unknown = sorted(set(chosen) - set(nn_residual.RESIDUALS))
    if unknown:
      p.error(
        f"--schemes: unknown {unknown}; valid names are "
        f"{', '.join(sorted(nn_residual.RESIDUALS))}"
      )
    scale = dataclasses.replace(scale, schemes=chosen)
  return _report.run(
    "depthbench",
    args,
    lambda: compute(scale, args.learning_rate),
    figure,
    markdown,
  )


if __name__ == "__main__":
  main()
