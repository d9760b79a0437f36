"""Looped linear attention with LayerNorm and the power method (CPU scale).

Trains `jaxnorm.looped.looped_lsa` (``w_kq``, ``w_pv`` shared across loops,
initialized N(0, 0.01^2), Adam with cosine decay) on in-context
top-eigenvector problems: ``d = 8``, ``n = 32`` rows ``X ~ N(0, Sigma)``
with ``Sigma = U diag(lam) U^T``, ``lam = (3, 1.5, 1, 0.8, ..., 0.3)``, a
fresh random rotation ``U`` and start vector ``v0`` per problem; the target
is the top eigenvector ``u1`` of the sample covariance ``X^T X / n`` and
``p_t`` the power iterates from ``v0``. This is not a runner task: the one
small training loop is `train` (jitted, vmapped over seeds).

Claims (Wu, Zhang & Cao, "Looped Transformers with LayerNorm Provably Learn
the Power Method", arXiv:2606.00605; only the abstract could be read),
fixed before running, each for two norm arms: ``layernorm`` (LayerNorm as
`looped_lsa` computes it: centred, then RMS, no affine) and ``l2`` (the
uncentred normalization ``v / |v|`` under which this project's token layout
makes one loop exactly one power step); paired by seed over 3 seeds:

* E1, implicit bias (trained on the final direction only, ``1 - <v_T /
  |v_T|, u1>^2`` with ``T = 4`` loops): the trained loops are power
  iterations, so (a) run for more loops they keep converging: the error
  ``1 - cos^2(v_T', u1)`` at ``T' = 16`` is ``superior`` (lower, margin 0)
  to the error at ``T' = 4``; and (b) at ``T' = 16`` the error is
  ``non_inferior`` to the power method's on the same problems. Metric:
  the log of the mean error over 512 held-out problems; margin
  `claims.MARGINS["log_ratio"]` (at most 10% above the power method's).
* E2, the normalization gap (layerwise supervision ``sum_t |v_t - p_t|^2``
  with unit-norm targets): with the norm the per-loop power iterates are
  learnable, without it (``none``) they are not: the log of the layerwise
  loss on 512 held-out problems is ``superior`` (lower, margin 0) to the
  norm-free model's.

Deviations: the token layout, the query-only update, the re-injected data
slot and the norm placement are this project's construction [I] (the
paper's are unread); LayerNorm's output has RMS 1 (norm ``sqrt(d)``), so in
E2 its gain is fixed at ``1/sqrt(d)`` to give the targets' unit norm
(E1's loss and errors use directions and need no gain); Adam instead of the
paper's gradient descent. The centring LayerNorm cannot represent the
power iterates exactly (a centred vector is not ``p_t`` unless ``p_t`` has
zero mean), the ``l2`` form can; ``none`` computes the same direction as
``l2`` for the same weights (each loop is linear in ``v``), so it differs
from ``l2`` only where the norm of the iterate matters (E2).

Fair comparison: every arm of each experiment trains at its own learning
rate, the best of a geometric sweep on a selection seed (1000, not a
reported seed) by the final training loss, extended until the best rate
lies inside the grid. ``--full`` is the same setting with
`tiers.FULL_SEEDS` seeds: nothing here needs an accelerator.

  python -m experiments.looped_power [--quick | --full] [--seeds N]
"""

from __future__ import annotations

import functools
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments._harness import grid, report, tiers
from jaxnorm import looped
from jaxnorm.training import claims

NAME = "looped_power"
D, N, T = 8, 32, 4
LAM = np.r_[3.0, 1.5, 1.0, np.linspace(0.8, 0.3, D - 3)]
NORMS = ("layernorm", "l2", "none")
CLAIM_NORMS = ("layernorm", "l2")
EVAL_LOOPS = (4, 8, 16)
EVAL_PROBLEMS = 512
STEPS, BATCH = 4000, 64
LEARNING_RATES = (3e-3, 1e-2, 3e-2)
SELECT_SEED = 1000
RATIO = claims.MARGINS["log_ratio"]

_claim = functools.partial(
  claims.Claim,
  paper="Looped LN power method",
  arxiv="2606.00605",
  direction="lower",
)


def e1(norm: str, loops: int) -> str:
  """The name of an E1 evaluation, e.g. ``e1/layernorm@16``."""
  return f"e1/{norm}@{loops}"


CLAIMS = tuple(
  c
  for norm in CLAIM_NORMS
  for c in (
    _claim(
      claim=f"E1 ({norm}): trained with {T} loops on the final direction, "
      "the loops keep converging when run longer (power iterations)",
      metric="log_err",
      kind="superior",
      margin=0.0,
      a=e1(norm, EVAL_LOOPS[-1]),
      b=e1(norm, EVAL_LOOPS[0]),
    ),
    _claim(
      claim=f"E1 ({norm}): the trained loops match the power method at "
      f"{EVAL_LOOPS[-1]} loops",
      metric="log_err",
      kind="non_inferior",
      margin=RATIO,
      a=e1(norm, EVAL_LOOPS[-1]),
      b=e1("power", EVAL_LOOPS[-1]),
    ),
  )
) + tuple(
  _claim(
    claim=f"E2 ({norm}): with the norm the per-loop power iterates are "
    "learnable, without it they are not",
    metric="log_layerwise",
    kind="superior",
    margin=0.0,
    a=f"e2/{norm}",
    b="e2/none",
  )
  for norm in CLAIM_NORMS
)


def problems(key, batch):
  """``x (B, n, d)``, ``v0 (B, d)``, ``S (B, d, d)``, ``u1 (B, d)``."""
  k_u, k_x, k_v = jax.random.split(key, 3)
  u, _ = jnp.linalg.qr(jax.random.normal(k_u, (batch, D, D)))
  z = jax.random.normal(k_x, (batch, N, D)) * jnp.sqrt(LAM).reshape(1, 1, D)
  x = jnp.einsum("bne,bde->bnd", z, u)
  v0 = jax.random.normal(k_v, (batch, D))
  v0 = v0 / jnp.linalg.norm(v0, axis=-1, keepdims=True)
  s = jnp.einsum("bnd,bne->bde", x, x) / N
  u1 = jnp.linalg.eigh(s)[1][..., -1]
  return x, v0, s, u1


def _unit(v):
  """``v/|v|``; an iterate that under- or overflowed becomes 0 (error 1)."""
  n = jnp.linalg.norm(v, axis=-1, keepdims=True)
  ok = jnp.isfinite(n) & (n > 0)
  return jnp.where(ok, v / jnp.where(ok, n, 1.0), 0.0)


def _gain(norm: str) -> float:
  """E2's fixed output gain: unit-norm iterates for every norm."""
  return 1.0 / math.sqrt(D) if norm in ("layernorm", "rms") else 1.0


def _losses(params, x, v0, s, u1, *, norm, loops):
  """Final-direction (E1) and layerwise (E2) losses of ``loops`` loops."""
  vs = looped.looped_lsa(x, v0, *params, num_loops=loops, norm=norm)
  cos = jnp.sum(_unit(vs[:, -1]) * u1, -1)
  final = jnp.mean(1.0 - cos**2)
  p = looped.power_iteration(s, v0, loops)
  layerwise = jnp.mean(jnp.sum((_gain(norm) * vs - p) ** 2, axis=(-2, -1)))
  return final, layerwise


@functools.partial(jax.jit, static_argnames=("norm", "steps", "batch"))
def train(seeds, lr, layerwise, *, norm, steps, batch):
  """Final params and loss curves, vmapped over ``seeds``.

  The task's only training loop (synthetic regression, not a runner task).
  ``lr`` and ``layerwise`` (E2's loss instead of E1's) are traced, so every
  sweep and both experiments share one compilation per norm.
  """
  tx = optax.adam(optax.cosine_decay_schedule(lr, steps))

  def one(seed):
    key = jax.random.key(seed)
    k1, k2, key = jax.random.split(key, 3)
    params = (
      0.01 * jax.random.normal(k1, (2 * D, 2 * D)),
      0.01 * jax.random.normal(k2, (2 * D, 2 * D)),
    )

    def f(params, k):
      losses = _losses(params, *problems(k, batch), norm=norm, loops=T)
      return jnp.where(layerwise, losses[1], losses[0])

    def step(carry, k):
      params, opt = carry
      loss, g = jax.value_and_grad(f)(params, k)
      u, opt = tx.update(g, opt, params)
      return (optax.apply_updates(params, u), opt), loss

    (params, _), losses = jax.lax.scan(
      step, (params, tx.init(params)), jax.random.split(key, steps)
    )
    return params, losses

  return jax.vmap(one)(seeds)


@functools.partial(jax.jit, static_argnames="norm")
def evaluate(params, key, *, norm):
  """On held-out problems, per loop t = 1 .. max(`EVAL_LOOPS`).

  Returns the model's mean error ``1 - cos^2(v_t, u1)``, the power
  method's, the mean ``|cos(v_t, p_t)|`` and the E2 layerwise loss of
  ``T`` loops.
  """
  loops = max(EVAL_LOOPS)
  x, v0, s, u1 = problems(key, EVAL_PROBLEMS)
  vs = _unit(looped.looped_lsa(x, v0, *params, num_loops=loops, norm=norm))
  p = looped.power_iteration(s, v0, loops)
  err = 1.0 - jnp.sum(vs * u1[:, None], -1) ** 2
  err_power = 1.0 - jnp.sum(p * u1[:, None], -1) ** 2
  cos_p = jnp.abs(jnp.sum(vs * p, -1)).mean(0)
  _, layerwise = _losses(params, x, v0, s, u1, norm=norm, loops=T)
  return jnp.mean(err, 0), jnp.mean(err_power, 0), cos_p, layerwise


def identity_residual(m: np.ndarray) -> float:
  """``|M - cI|_F / |M|_F`` with the best ``c = tr(M)/d``."""
  c = np.trace(m) / m.shape[0]
  return float(np.linalg.norm(m - c * np.eye(m.shape[0])) / np.linalg.norm(m))


def _tail(losses: np.ndarray) -> np.ndarray:
  """Mean of the last 5% of each seed's training losses."""
  losses = np.asarray(losses)
  return losses[:, -max(losses.shape[1] // 20, 1) :].mean(1)


def tune(norm: str, layerwise: bool, steps: int) -> dict:
  """The arm's learning rate: lowest final training loss on `SELECT_SEED`."""

  def score(lr: float) -> float:
    _, losses = train(
      jnp.asarray([SELECT_SEED]), jnp.float32(lr), layerwise,
      norm=norm, steps=steps, batch=BATCH,
    )  # fmt: skip
    return float(_tail(losses)[0])

  return {
    **grid.sweep(score, LEARNING_RATES, who="looped_power"),
    "select": f"final training loss, seed {SELECT_SEED}",
  }


def _coarse(curve, points: int = 200) -> np.ndarray:
  """``(seeds, steps)`` losses averaged into at most ``points`` windows."""
  chunks = np.array_split(np.asarray(curve), min(points, curve.shape[1]), 1)
  return np.stack([c.mean(1) for c in chunks], 1)


def run(seeds: Sequence[int], steps: int, quick: bool) -> dict[str, Any]:
  """Both experiments: sweeps, training, held-out evaluation, lines."""
  out: dict[str, Any] = {"sweeps": {}, "curves": {}, "lines": [], "e1": {}}
  for exp, layerwise in (("e1", False), ("e2", True)):
    for norm in NORMS:
      name = f"{exp}/{norm}"
      sweep = None if quick else tune(norm, layerwise, steps)
      lr = LEARNING_RATES[1] if sweep is None else sweep["learning_rate"]
      if sweep is not None:
        out["sweeps"][name] = sweep
      params, losses = train(
        jnp.asarray(seeds), jnp.float32(lr), layerwise,
        norm=norm, steps=steps, batch=BATCH,
      )  # fmt: skip
      out["curves"][name] = _coarse(losses)
      tails = _tail(losses)
      for i, seed in enumerate(seeds):
        p_i = tuple(np.asarray(w[i]) for w in params)
        key = jax.random.fold_in(jax.random.key(1234), seed)
        err, err_power, cos_p, layer = evaluate(p_i, key, norm=norm)
        if exp == "e2":
          out["lines"].append(
            {
              "variant": name,
              "seed": seed,
              "train_loss": float(tails[i]),
              "layerwise": float(layer),
              "log_layerwise": float(np.log(layer)),
            }
          )
          continue
        a, b = p_i[0][:D, D:], p_i[1][D:, :D]
        out["e1"].setdefault(norm, []).append(
          {
            "seed": seed,
            "train_loss": float(tails[i]),
            "residual_BA": identity_residual(b @ a),
            "cos_to_power_iterates": np.asarray(cos_p).tolist(),
          }
        )
        for loops in EVAL_LOOPS:
          rows = ((norm, err), ("power", err_power))
          for who, e in rows if norm == NORMS[0] else rows[:1]:
            value = float(e[loops - 1])
            out["lines"].append(
              {
                "variant": e1(who, loops),
                "seed": seed,
                "err": value,
                "log_err": float(np.log(max(value, 1e-30))),
              }
            )
  return out


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs both experiments; writes the report."""
  args = tiers.parser(__doc__, NAME).parse_args(argv)
  seeds = tiers.seeds(args)
  quick = tiers.tier(args) == "quick"
  steps = 3 if quick else STEPS

  def compute() -> dict:
    res = run(seeds, steps, quick)
    rates = {
      k: v["learning_rate"] for k, v in res["sweeps"].items()
    }  # fmt: skip
    config = {
      "d": D,
      "n": N,
      "lambda": LAM.tolist(),
      "train_loops": T,
      "eval_loops": list(EVAL_LOOPS),
      "steps": steps,
      "batch": BATCH,
      "optimizer": "adam, cosine decay",
      "learning_rates": rates,
      "eval_problems": EVAL_PROBLEMS,
    }

    def setting(name: str) -> dict[str, Any]:
      arm = name.split("@")[0]
      if arm == "e1/power":
        return {"params": 0, "data": "the power method, no training"}
      return {
        "params": 2 * (2 * D) ** 2,
        "steps": steps,
        "examples": steps * BATCH,
        "unit": "problems",
        "optimizer": "adam",
        "learning_rate": rates.get(arm, LEARNING_RATES[1]),
        "data": f"top eigenvector, d={D}, n={N}, T={T} loops",
      }

    records = [
      grid.claim_record(
        res["lines"],
        c,
        baseline_trained=True,
        config=config,
        setting={"a": setting(c.a), "b": setting(c.b)},
      )
      for c in CLAIMS
    ]
    return {
      **res,
      "claims": records,
      "cells": {
        "err": grid.cells([ln for ln in res["lines"] if "err" in ln], "err"),
        "layerwise": grid.cells(
          [ln for ln in res["lines"] if "layerwise" in ln], "layerwise"
        ),
      },
      "steps": steps,
    }

  def figure(res: dict, path: pathlib.Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.4))
    for norm in NORMS:
      c = np.asarray(res["curves"][f"e2/{norm}"])
      x = np.linspace(0, res["steps"], c.shape[1])
      (line,) = axes[0].plot(x, c.mean(0), label=f"norm={norm}")
      axes[0].fill_between(x, c.min(0), c.max(0), color=line.get_color(),
                           alpha=0.2)  # fmt: skip
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("layerwise training loss (mean, min-max)")
    axes[0].set_title("E2: sum_t |v_t - p_t|^2")
    axes[0].legend()
    cells = res["cells"]["err"]
    for who in (*NORMS, "power"):
      name = [e1(who, t) for t in EVAL_LOOPS]
      if name[0] not in cells:
        continue
      axes[1].errorbar(
        EVAL_LOOPS,
        [cells[n]["mean"] for n in name],
        [cells[n]["std"] for n in name],
        marker="o",
        capsize=3,
        ls="--" if who == "power" else "-",
        label="power method" if who == "power" else who,
      )
    ratio = LAM[1] / LAM[0]
    axes[1].plot(EVAL_LOOPS, [ratio ** (2 * t) for t in EVAL_LOOPS], "k:",
                 label="(lambda2/lambda1)^(2T')")  # fmt: skip
    axes[1].set_yscale("log")
    axes[1].set_xlabel(f"loops T' at evaluation (trained with T={T})")
    axes[1].set_ylabel("1 - cos^2(v_T', u1), mean ± std")
    axes[1].set_title("E1: error by loops")
    axes[1].legend(fontsize=7)
    report.claims_axes(axes[2], res["claims"])
    fig.suptitle(f"Looped LSA and the power method ({len(seeds)} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

  def markdown(res: dict) -> list[str]:
    out = [
      f"d={D}, n={N}, lambda = {np.round(LAM, 3).tolist()}, fresh rotation "
      f"per problem; T={T} training loops, {res['steps']} Adam steps of "
      f"batch {BATCH} with cosine decay, init N(0, 0.01^2), seeds "
      f"{list(seeds)}. Held-out evaluation on {EVAL_PROBLEMS} fresh problems "
      "per seed. Cells are mean ± sample std (ddof=1) over seeds.",
      "",
    ]
    if res["sweeps"]:
      out += [
        f"## Learning rates (seed {SELECT_SEED}, by the final training loss)",
        "",
        "| arm | chosen | grid: final training loss |",
        "|---|---|---|",
      ]
      for name, s in res["sweeps"].items():
        scores = ", ".join(f"{lr}: {v:.3g}" for lr, v in s["grid"].items())
        inside = "" if s["inside"] else " (at the grid's end)"
        out.append(f"| {name} | {s['learning_rate']:g}{inside} | {scores} |")
      out.append("")
    out += ["## E1: error 1 - cos^2(v_T', u1) by loops", ""]
    out += grid.markdown_table(res["cells"]["err"], "error")
    out += ["", "| norm | train loss | |BA - cI|/|BA| | |cos(v_t, p_t)|, t = "
            "1..16 (mean over seeds) |", "|---|---|---|---|"]  # fmt: skip
    for norm, per_seed in res["e1"].items():
      tl = report.mean_spread([p["train_loss"] for p in per_seed])
      ba = report.mean_spread([p["residual_BA"] for p in per_seed])
      cos = np.mean([p["cos_to_power_iterates"] for p in per_seed], 0)
      out.append(
        f"| {norm} | {tl[0]:.2e} ± {tl[1]:.1e} | {ba[0]:.2f} ± {ba[1]:.2f} "
        f"| {', '.join(f'{c:.3f}' for c in cos)} |"
      )
    ratio = LAM[1] / LAM[0]
    out += [
      "",
      "Population rate (lambda2/lambda1)^(2T'): "
      + " / ".join(f"{ratio ** (2 * t):.1e}" for t in EVAL_LOOPS)
      + f" at T' = {'/'.join(map(str, EVAL_LOOPS))}.",
      "",
      "## E2: layerwise loss on held-out problems",
      "",
    ]
    out += grid.markdown_table(res["cells"]["layerwise"], "layerwise loss")
    return out

  return report.run(NAME, __doc__, args, compute, figure, markdown)


if __name__ == "__main__":
  main()
