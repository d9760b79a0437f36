"""E2: CNet language-model claims at CPU scale.

Claims (CNet paper / README): (1) Born-rule attention trains about as well
as softmax attention; (2) a complex causal-Fourier (FNet-style) model
reaches a real causal FNet's loss in at most half the steps.

Runs at roughly matched real-parameter counts on bundled Shakespeare bytes:
(a) jaxnorm ``DecoderLM`` width 64, depth 2, softmax; (b) CNet Born stack,
complex width 32, 2 blocks, Born cross-entropy with ``target_floor=1e-3``,
``emb_gauss`` init; (c) the same with CNet's causal Fourier mixing instead
of attention; (d) a real causal FNet: the ``DecoderLM`` of (a) with each
attention core replaced by ``Re(causal DFT)`` of its values along tokens.
CNet's schedule: Adam, lr 1e-3, linear warmup, cosine to 1e-4. A run is a
"saddle" when its validation loss stays within 0.05 nats of the unigram
entropy for >= 300 steps.

    python -m experiments.complex_e2_cnet [--quick] [--seeds 3]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import complex_common as cc
from jaxnorm import cplx
from jaxnorm.nn import cplx as ncplx
from jaxnorm.nn.attention import _base
from jaxnorm.optim import complex as copt

FULL = dict(
  seq=64,
  batch=16,
  steps=600,
  eval_every=50,
  eval_batches=8,
  warmup=100,
  width=64,
  cwidth=32,
  depth=2,
  heads=4,
)
QUICK = dict(
  seq=16,
  batch=4,
  steps=4,
  eval_every=2,
  eval_batches=1,
  warmup=2,
  width=16,
  cwidth=8,
  depth=1,
  heads=2,
)
RUNS = ("a_softmax", "b_born", "c_complex_fnet", "d_real_fnet")


class RealCausalFourier(_base.AttentionCore):
  """Real causal FNet core: ``Re(causal_fourier_mix(v))`` along tokens."""

  def __init__(self, mha: Any):
    """No parameters (``mha`` is the attention it serves)."""
    del mha

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: the real part of the causal DFT of ``v``."""
    del x, q, k, mask, bias
    z = jax.lax.complex(v.astype(jnp.float32), jnp.zeros(v.shape, jnp.float32))
    return jnp.real(cplx.causal_fourier_mix(z, axis=1)).astype(v.dtype)


def build(run: str, c: dict, seed: int) -> tuple[nnx.Module, Any]:
  """The model and its training loss for one run."""
  if run in ("a_softmax", "d_real_fnet"):
    model = cc.real_lm(c["width"], c["depth"], c["heads"], c["seq"], seed)
    if run == "d_real_fnet":
      cc.replace_cores(model, RealCausalFourier, rope=False)
    return model, cc.softmax_lm_loss
  attention = "born" if run == "b_born" else ncplx.FOURIER
  model = ncplx.ComplexLM(
    ncplx.ComplexLMConfig(
      vocab_size=256,
      width=c["cwidth"],
      depth=c["depth"],
      num_heads=1,
      max_len=c["seq"],
      attention=attention,
      embed_init="gauss",
    ),
    rngs=nnx.Rngs(seed),
  )
  return model, born_loss


def born_loss(model: nnx.Module, batch: jax.Array) -> jax.Array:
  """CNet's Born cross-entropy with ``ce_eps = target_floor = 1e-3``."""
  amp = model.amplitudes(batch[:, :-1])
  return cplx.born_cross_entropy(amp, batch[:, 1:], target_floor=1e-3)


def train_run(
  run: str, c: dict, seed: int, splits, evaluate, tx
) -> dict[str, Any]:
  """One run: the eval curve, final loss and parameter count."""
  model, loss = build(run, c, seed)
  hist = cc.fit(
    model,
    loss,
    tx,
    cc.text_batches(splits.train, c["seq"], c["batch"], seed),
    c["steps"],
    evaluate=evaluate,
    eval_every=c["eval_every"],
  )
  return {**hist, "params": cc.count_params(model), "model": model}


def saddle(steps: list[int], evals: list[float], unigram: float) -> bool:
  """Within 0.05 nats of the unigram entropy for >= 300 steps."""
  start = None
  for s, e in zip(steps, evals):
    if abs(e - unigram) < 0.05:
      start = s if start is None else start
      if s - start >= 300:
        return True
    else:
      start = None
  return False


def steps_to_reach(steps: list[int], evals: list[float], target: float):
  """First evaluated step at which ``evals <= target`` (None if never)."""
  for s, e in zip(steps, evals):
    if e <= target:
      return s
  return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """Runs E2 and writes ``complex_e2_cnet.md``; returns the record."""
  args = cc.parser(__doc__.splitlines()[0]).parse_args(argv)
  c = QUICK if args.quick else FULL
  seeds = 1 if args.quick else args.seeds
  timer = cc.Timer()
  splits = cc.text_splits()
  unigram = splits.unigram_entropy()
  val = cc.eval_batches(splits.val, c["seq"], c["batch"], c["eval_batches"])
  evaluate = cc.lm_evaluator(val)
  tx = copt.complex_adam(cc.cnet_schedule(1e-3, c["steps"], c["warmup"], 1e-4))
  res: dict[str, list[dict]] = {r: [] for r in RUNS}
  for seed in range(seeds):
    for run in RUNS:
      print(f"E2 seed {seed} {run} t={timer():.0f}s", flush=True)
      out = train_run(run, c, seed, splits, evaluate, tx)
      out.pop("model")
      res[run].append(out)
  final = {r: [h["eval"][-1] for h in res[r]] for r in RUNS}
  saddles = {
    r: sum(saddle(h["eval_step"], h["eval"], unigram) for h in res[r])
    for r in RUNS
  }
  reach = [
    steps_to_reach(hc["eval_step"], hc["eval"], hd["eval"][-1])
    for hc, hd in zip(res["c_complex_fnet"], res["d_real_fnet"])
  ]
  verdicts = _verdicts(final, reach, c["steps"])
  record = {
    "config": c,
    "seeds": seeds,
    "unigram": unigram,
    "final": final,
    "saddles": saddles,
    "reach_steps": reach,
    "verdicts": verdicts,
    "params": {r: res[r][0]["params"] for r in RUNS},
    "curves": {r: [(h["eval_step"], h["eval"]) for h in res[r]] for r in RUNS},
    "seconds": timer(),
  }
  fig, (ax,) = cc.figure()
  for r in RUNS:
    steps = res[r][0]["eval_step"]
    mean = np.mean([h["eval"] for h in res[r]], axis=0)
    ax.plot(steps, mean, label=r)
  ax.axhline(unigram, color="gray", ls=":", label="unigram")
  ax.set(xlabel="step", ylabel="val nats/byte", title="E2: CNet LMs")
  ax.legend()
  rows = "\n".join(
    f"| {r} | {record['params'][r]} | {cc.fmt(final[r])} "
    f"| {saddles[r]}/{seeds} |"
    for r in RUNS
  )
  md = f"""# E2: CNet LM claims

Born ≈ softmax; complex FNet ≥ real FNet in ≤ ½ the steps.

Bundled Shakespeare bytes, T={c["seq"]}, batch {c["batch"]}, {c["steps"]} steps,
CNet schedule (Adam lr 1e-3, warmup {c["warmup"]}, cosine to 1e-4), {seeds}
seeds (mean ± std). Unigram entropy {unigram:.3f} nats/byte. Parameters in
reals (complex entries count twice). Run time {record["seconds"]:.0f} s.

| run | params | final val nats/byte | saddle runs |
|---|---|---|---|
{rows}

Steps for (c) complex FNet to reach (d) real FNet's final loss, per seed:
{reach} (None: never within {c["steps"]} steps).

- **Verdict, claim 1 (Born ≈ softmax, within 0.1 nats plus the seed
  spreads): {verdicts["born_vs_softmax"]}**
- **Verdict, claim 2 (the complex FNet reaches the real FNet's final loss
  in ≤ ½ the steps, every seed): {verdicts["complex_fnet"]}**

Parameter counts are matched only roughly: the real models carry an untied
256-row head and learned positions (kept so E3 can quantize the head).

Absolute numbers are not comparable with the paper (another Shakespeare
corpus, 1.52 nats/char there; widths and steps are CPU scale). Deviations:
the Born stack is a pre-norm block with CNet's extra split GELUs
(`ComplexLMConfig.cnet_gelu`), one head; (d)'s mixer acts on the value
projection of each head, then the output projection.
"""
  cc.write_result(args.out, "e2_cnet", md, record, fig)
  return record


def _verdicts(final, reach, steps) -> dict[str, str]:
  a_m, a_s = cc.mean_spread(final["a_softmax"])
  b_m, b_s = cc.mean_spread(final["b_born"])
  gap = b_m - a_m
  if abs(gap) <= 0.1 + a_s + b_s:
    born = "reproduced"
  elif gap > 0:
    born = "not reproduced at this scale"
  else:
    born = "inconclusive"
  fast = [r is not None and r <= steps // 2 for r in reach]
  if all(fast):
    fnet = "reproduced"
  elif not any(fast):
    fnet = "not reproduced at this scale"
  else:
    fnet = "inconclusive"
  return {"born_vs_softmax": born, "complex_fnet": fnet}


if __name__ == "__main__":
  main()
