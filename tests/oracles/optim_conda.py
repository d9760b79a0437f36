"""Golden Conda trajectories from ``pytorch_optimizer.Conda``.

Run from the repository root (needs ``torch`` and ``pytorch_optimizer``):

  python -m tests.oracles.optim_conda

Writes ``tests/oracles/conda_golden.npz``: for each case, each weight's
initial value (torch layout ``(out, in)``), the gradients fed in and the
weight after every step. ``pytorch_optimizer`` refreshes the basis at 1-based
steps 1, gap, 2 gap, ... (the official code at 1, gap+1, ...), so the case
``gap3`` is compared with ``refresh_offset=1`` and ``gap100`` (no refresh
after the first step within 12 steps) with the official schedule.
"""

from __future__ import annotations

import pathlib

import numpy as np

STEPS = 12
SHAPES = {"tall": (12, 6), "wide": (5, 9), "square": (6, 6)}
CASES = {
  "gap3": dict(
    lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, update_proj_gap=3, scale=0.25
  ),
  "gap100": dict(
    lr=1e-2, betas=(0.8, 0.95), weight_decay=0.0, update_proj_gap=100, scale=1.0
  ),
}
OUT = pathlib.Path(__file__).with_name("conda_golden.npz")


def inputs(seed: int = 0):
  """Initial weights and a fixed gradient sequence (independent of w)."""
  rng = np.random.RandomState(seed)
  p0 = {k: rng.randn(*s).astype(np.float32) for k, s in SHAPES.items()}
  grads = {
    k: rng.randn(STEPS, *s).astype(np.float32) for k, s in SHAPES.items()
  }
  return p0, grads


def run(case: str) -> dict[str, np.ndarray]:
  import pytorch_optimizer
  import torch

  p0, grads = inputs()
  params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in p0.items()}
  opt = pytorch_optimizer.Conda(
    list(params.values()), projection_type="std", **CASES[case]
  )
  traj = {k: [] for k in params}
  for t in range(STEPS):
    for k, p in params.items():
      p.grad = torch.tensor(grads[k][t])
    opt.step()
    for k, p in params.items():
      traj[k].append(p.detach().numpy().copy())
  out = {}
  for k in params:
    out[f"{k}/p0"] = p0[k]
    out[f"{k}/grads"] = grads[k]
    out[f"{k}/params"] = np.stack(traj[k])
  return out


def main() -> None:
  arrays = {}
  for case in CASES:
    for k, v in run(case).items():
      arrays[f"{case}/{k}"] = v
  np.savez_compressed(OUT, **arrays)
  print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
  main()
