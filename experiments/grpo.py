"""GRPO vs Dr.GRPO vs CorrGRPO vs GDPO on a tabular multi-reward task.

A verifiable-reward toy that runs on CPU in seconds (project spec
``graph_rl_misc.md`` section 2.6a): a tabular policy over 16 prompts, each
answering 8 positions with one of 4 symbols (independent per-position
logits), against a hidden target sequence per prompt. Three reward
components per response:

* ``r1 = 10 * match(positions 0-3)`` (large scale),
* ``r2 = 10 * match(positions 0-3) + N(0, 1)`` (large, correlated with r1),
* ``r3 = 1 * match(positions 4-7)`` (small scale, independent),

with ``match`` the fraction of matching positions. ``G = 8`` samples per
prompt, one on-policy update per batch with `jaxnorm.rl.grpo_policy_loss`
(clip 0.2, no KL), Adam, over several seeds. Advantages: GRPO and Dr.GRPO on
the summed reward, CorrGRPO and GDPO on the components (`jaxnorm.rl`).
The metric is the policy's exact expected match on positions 0-3 (r1/10)
and 4-7 (r3).

  python -m experiments.grpo            # default run
  python -m experiments.grpo --quick    # seconds, for the tests

Writes ``<out>/grpo.{md,json,png}``.
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments._harness import report as _report
from jaxnorm import rl

PROMPTS, POSITIONS, SYMBOLS = 16, 8, 4
ARMS = ("grpo", "drgrpo", "corrgrpo", "gdpo")


def rewards(tokens, target, key):
  """``(P, G, 3)`` reward components of sampled ``tokens (P, G, 8)``."""
  match = (tokens == target[:, None]).astype(jnp.float32)
  head = jnp.mean(match[..., :4], -1)
  tail = jnp.mean(match[..., 4:], -1)
  noise = jax.random.normal(key, head.shape)
  return jnp.stack([10.0 * head, 10.0 * head + noise, tail], -1)


def advantages(arm: str, r: jax.Array) -> jax.Array:
  """``(P, G)`` advantages of one arm."""
  if arm == "grpo":
    return rl.grpo_advantages(jnp.sum(r, -1))
  if arm == "drgrpo":
    return rl.grpo_advantages(jnp.sum(r, -1), scale_by_std=False)
  if arm == "corrgrpo":
    return rl.corrgrpo_advantages(r)
  # The paper's equation, as NVlabs' TRL implementation computes it: one
  # observation per response in the batch normalization.
  return rl.gdpo_advantages(r, batch_normalization="trl")


def expected_match(theta, target):
  """Exact expected match fractions of positions 0-3 and 4-7."""
  p = jax.nn.softmax(theta, -1)
  hit = jnp.take_along_axis(p, target[..., None], -1)[..., 0]
  return jnp.stack([jnp.mean(hit[:, :4]), jnp.mean(hit[:, 4:])])


@functools.partial(jax.jit, static_argnames=("arm", "steps", "group", "lr"))
def train(seeds, *, arm, steps, group, lr):
  """Curves ``(seeds, steps + 1, 2)`` of expected matches, vmapped."""
  tx = optax.adam(lr)

  def one(seed):
    key = jax.random.key(seed)
    key, k_t = jax.random.split(key)
    target = jax.random.randint(k_t, (PROMPTS, POSITIONS), 0, SYMBOLS)
    theta = jnp.zeros((PROMPTS, POSITIONS, SYMBOLS))
    opt = tx.init(theta)

    def loss_fn(theta, tokens, adv):
      logp = jax.nn.log_softmax(theta, -1)[:, None]
      lp = jnp.take_along_axis(
        jnp.broadcast_to(logp, tokens.shape + (SYMBOLS,)),
        tokens[..., None],
        -1,
      )[..., 0].reshape(PROMPTS * group, POSITIONS)
      mask = jnp.ones(lp.shape, bool)
      return rl.grpo_policy_loss(
        lp,
        jax.lax.stop_gradient(lp),
        None,
        adv.reshape(-1),
        mask,
        kl_coef=0.0,
      )

    def step(carry, key):
      theta, opt = carry
      k_s, k_r = jax.random.split(key)
      logits = jnp.broadcast_to(
        theta[:, None], (PROMPTS, group, POSITIONS, SYMBOLS)
      )
      tokens = jax.random.categorical(k_s, logits)
      adv = advantages(arm, rewards(tokens, target, k_r))
      g = jax.grad(loss_fn)(theta, tokens, adv)
      u, opt = tx.update(g, opt, theta)
      theta = optax.apply_updates(theta, u)
      return (theta, opt), expected_match(theta, target)

    first = expected_match(theta, target)
    _, curve = jax.lax.scan(step, (theta, opt), jax.random.split(key, steps))
    return jnp.concatenate([first[None], curve])

  return jax.vmap(one)(seeds)


def summarize(curves: dict) -> dict:
  """Final and mean-over-training matches, mean and standard error."""
  out = {}
  for arm, c in curves.items():
    c = np.asarray(c, np.float64)
    n = c.shape[0]
    for j, name in enumerate(("r1", "r3")):
      for stat, v in (("final", c[:, -1, j]), ("auc", c[:, 1:, j].mean(1))):
        se = v.std(ddof=1) / np.sqrt(n) if n > 1 else 0.0
        out[f"{arm}/{name}/{stat}"] = (float(v.mean()), float(se))
  return out


def verdict(s: dict) -> tuple[str, str]:
  """CorrGRPO's claim: higher r3 than GRPO at equal r1."""
  parts, wins, equal_r1 = [], [], True
  for stat in ("final", "auc"):
    c3, e3 = s[f"corrgrpo/r3/{stat}"]
    g3, f3 = s[f"grpo/r3/{stat}"]
    c1, e1 = s[f"corrgrpo/r1/{stat}"]
    g1, f1 = s[f"grpo/r1/{stat}"]
    se = np.hypot(e3, f3)
    wins.append(c3 - g3 > 2 * se)
    equal_r1 &= abs(c1 - g1) <= 2 * np.hypot(e1, f1) + 0.01
    parts.append(
      f"{stat}: r3 CorrGRPO - GRPO = {c3 - g3:+.4f} (2 SE {2 * se:.4f}), "
      f"r1 gap {c1 - g1:+.4f}"
    )
  why = "; ".join(parts)
  if all(wins) and equal_r1:
    return "reproduced", why
  if not equal_r1:
    return "inconclusive", why
  return "not reproduced at this scale", why


def plot(result: dict, path: pathlib.Path) -> None:
  """Expected match on both position blocks, mean and spread per arm."""
  plt = _report.pyplot()
  curves = result["curves"]
  fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), sharey=True)
  for arm, c in curves.items():
    c = np.asarray(c)
    x = 5 * np.arange(c.shape[1])
    for j, ax in enumerate(axes):
      m, sd = c[:, :, j].mean(0), c[:, :, j].std(0)
      ax.plot(x, m, label=arm)
      ax.fill_between(x, m - sd, m + sd, alpha=0.2)
  axes[0].set_title("r1 / 10 (positions 0-3, large scale)")
  axes[1].set_title("r3 (positions 4-7, small scale)")
  for ax in axes:
    ax.set_xlabel("update")
  axes[0].set_ylabel("expected match")
  axes[1].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def markdown(args, result: dict) -> list[str]:
  """The result file's lines."""
  s, v = result["summary"], result["verdict"]
  lines = [
    "# GRPO vs Dr.GRPO vs CorrGRPO vs GDPO (`experiments.grpo`)",
    "",
    f"Tabular policy, {PROMPTS} prompts x {POSITIONS} positions x "
    f"{SYMBOLS} symbols, G={args.group}, Adam lr {args.lr}, "
    f"{args.steps} on-policy updates, clip 0.2, no KL, "
    f"{args.seeds} seeds. Rewards r1 = 10 match(0-3), r2 = r1 + N(0,1), "
    "r3 = match(4-7). Values: expected match (exact, from the policy), "
    "mean ± standard error over seeds; `auc` is the mean over all updates.",
    "",
    "| arm | r1/10 final | r3 final | r1/10 auc | r3 auc |",
    "|---|---|---|---|---|",
  ]
  for arm in ARMS:
    cells = [
      f"{s[f'{arm}/{r}/{st}'][0]:.4f} ± {s[f'{arm}/{r}/{st}'][1]:.4f}"
      for st in ("final", "auc")
      for r in ("r1", "r3")
    ]
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  lines += [
    "",
    f"**Verdict: {v[0]}** ({v[1]}). Claim (CorrGRPO README): dividing by "
    "the root of summed reward correlations instead of covariances lets a "
    "small independent reward (r3) improve more at equal r1. Note that "
    "CorrGRPO keeps GRPO's numerator (the centred sum), so within a group "
    "it only rescales GRPO's advantages; GDPO, which normalizes each "
    "component, is the arm that reweights r3.",
    "",
    "![curves](grpo.png)",
  ]
  return lines


def main(argv: list[str] | None = None) -> dict:
  """Runs the experiment; returns the result dict."""
  p = _report.parser(__doc__)
  p.add_argument("--seeds", type=int, default=5)
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--lr", type=float, default=0.05)
  args = p.parse_args(argv)
  if args.quick:
    args.seeds, args.steps = 3, 5

  def compute():
    seeds = jnp.arange(args.seeds)
    curves = {
      arm: np.asarray(
        train(seeds, arm=arm, steps=args.steps, group=args.group, lr=args.lr)
      )
      for arm in ARMS
    }
    s = summarize(curves)
    # Every 5th update is kept for the plot and the JSON file.
    coarse = {arm: c[:, ::5] for arm, c in curves.items()}
    return {"curves": coarse, "summary": s, "verdict": verdict(s)}

  return _report.run(
    "grpo", args, compute, plot, functools.partial(markdown, args)
  )


if __name__ == "__main__":
  main()
