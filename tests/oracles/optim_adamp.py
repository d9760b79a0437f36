"""Golden AdamP / SGDP trajectories from the official torch code.

Run from the repository root (needs ``torch``, ``adamp`` and
``pytorch_optimizer``; none is a jaxnorm dependency):

  python -m tests.oracles.optim_adamp

It writes ``tests/oracles/adamp_golden.npz``. For every case and parameter it
stores the initial weight (torch layout), the 10 gradients fed in and the
weight after each step, from ``adamp`` 0.3.0 (the official clovaai package),
plus the same run of ``pytorch_optimizer`` under the key prefix ``po/``.

Gradients depend on the current weight so that both projection views fire:
``linear`` gets a gradient orthogonal to every output row (channel view),
``conv`` one orthogonal to the whole tensor only (layer view), ``wide`` and
``bias`` random gradients (no projection, or plain Adam for 1-D).
"""

from __future__ import annotations

import pathlib

import numpy as np

STEPS = 10
SHAPES = {"linear": (8, 5), "wide": (4, 16), "conv": (6, 3, 3, 3), "bias": (7,)}
KINDS = {
  "linear": "channel",
  "wide": "random",
  "conv": "layer",
  "bias": "random",
}
CASES = {
  "adamp_plain": ("adamp", dict(lr=1e-2)),
  "adamp_wd": ("adamp", dict(lr=1e-2, weight_decay=0.5, wd_ratio=0.2)),
  "adamp_nesterov_wd": (
    "adamp",
    dict(lr=1e-2, weight_decay=0.1, nesterov=True, betas=(0.8, 0.99)),
  ),
  "sgdp_plain": ("sgdp", dict(lr=0.1)),
  "sgdp_momentum_wd": (
    "sgdp",
    dict(lr=0.1, momentum=0.9, weight_decay=0.1, dampening=0.1),
  ),
  "sgdp_nesterov_wd": (
    "sgdp",
    dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
  ),
}
OUT = pathlib.Path(__file__).with_name("adamp_golden.npz")


def initial_params(seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.RandomState(seed)
  return {k: rng.randn(*s).astype(np.float32) for k, s in SHAPES.items()}


def make_grad(kind: str, p: np.ndarray, h: np.ndarray) -> np.ndarray:
  """A gradient of the requested kind, computed in float64, cast to f32."""
  p64, h64 = p.astype(np.float64), h.astype(np.float64)
  if kind == "channel":
    pr, hr = p64.reshape(p.shape[0], -1), h64.reshape(p.shape[0], -1)
    hr = hr - pr * (
      np.sum(pr * hr, 1, keepdims=True) / np.sum(pr * pr, 1, keepdims=True)
    )
    return hr.reshape(p.shape).astype(np.float32)
  if kind == "layer":
    out = h64 - p64 * np.sum(p64 * h64) / np.sum(p64 * p64)
    # Make some rows strongly aligned with p so the channel view fails.
    out = out + 0.0
    out[0] = out[0] + 3.0 * p64[0]
    out[1] = (
      out[1] - 3.0 * np.sum(p64[0] * p64[0]) / np.sum(p64[1] * p64[1]) * p64[1]
    )
    return out.astype(np.float32)
  return h.astype(np.float32)


def run(
  case: str, package: str = "adamp", seed: int = 0
) -> dict[str, np.ndarray]:
  """Runs one case with the torch oracle; returns p0, grads and params."""
  import torch

  if package == "adamp":
    import adamp as lib
  else:
    import pytorch_optimizer as lib
  opt_name, kwargs = CASES[case]
  cls = lib.AdamP if opt_name == "adamp" else lib.SGDP
  p0 = initial_params(seed)
  params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in p0.items()}
  opt = cls(list(params.values()), **kwargs)
  rng = np.random.RandomState(seed + 1)
  out: dict[str, np.ndarray] = {}
  for k, v in p0.items():
    out[f"{k}/p0"] = v
  grads = {k: [] for k in params}
  traj = {k: [] for k in params}
  for _ in range(STEPS):
    for k, p in params.items():
      h = rng.randn(*p.shape).astype(np.float32)
      g = make_grad(KINDS[k], p.detach().numpy().copy(), h)
      p.grad = torch.tensor(g)
      grads[k].append(g)
    opt.step()
    for k, p in params.items():
      traj[k].append(p.detach().numpy().copy())
  for k in params:
    out[f"{k}/grads"] = np.stack(grads[k])
    out[f"{k}/params"] = np.stack(traj[k])
  return out


def main() -> None:
  arrays = {}
  for case in CASES:
    ref = run(case, "adamp")
    alt = run(case, "pytorch_optimizer")
    for k, v in ref.items():
      arrays[f"{case}/{k}"] = v
    for k, v in alt.items():
      arrays[f"po/{case}/{k}"] = v
    worst = max(
      float(np.max(np.abs(ref[k] - alt[k]) / (np.abs(ref[k]) + 1e-3)))
      for k in ref
      if k.endswith("/params")
    )
    print(f"{case}: adamp vs pytorch_optimizer max rel diff {worst:.2e}")
  np.savez_compressed(OUT, **arrays)
  print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
  main()
