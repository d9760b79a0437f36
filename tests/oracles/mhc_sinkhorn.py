"""Golden Sinkhorn-Knopp outputs from ``hyper-connections`` (mHC).

Run from the repository root (needs ``torch`` and ``hyper-connections``
0.4.11, neither a jaxnorm dependency):

  python -m tests.oracles.mhc_sinkhorn

It writes ``tests/oracles/mhc_sinkhorn.npz`` with ``logits`` of shape
``SHAPE`` drawn from N(0, 2^2) (the spec's test scale) and the outputs of
``sinkhorn_knopps`` (``direct``) and ``log_domain_sinkhorn_knopps``
(``log_domain``) after ``ITERS`` iterations. Both normalize axis -2 and then
axis -1 of the matrix they are given, the same order as
`jaxnorm.residual.sinkhorn_knopp` (mHC Eq. 9, rows last).
"""

from __future__ import annotations

import pathlib

import numpy as np

SHAPE = (3, 4, 4)
ITERS = 20
OUT = pathlib.Path(__file__).with_name("mhc_sinkhorn.npz")


def compute() -> dict[str, np.ndarray]:
  """Runs the oracle and returns the arrays written to ``OUT``."""
  import torch
  from hyper_connections.manifold_constrained_hyper_connections import (
    log_domain_sinkhorn_knopps,
    sinkhorn_knopps,
  )

  gen = torch.Generator().manual_seed(7)
  logits = 2.0 * torch.randn(*SHAPE, generator=gen)
  return {
    "logits": logits.numpy(),
    "direct": sinkhorn_knopps(logits, iters=ITERS).numpy(),
    "log_domain": log_domain_sinkhorn_knopps(logits, iters=ITERS).numpy(),
  }


def main() -> None:
  """Writes the golden file."""
  np.savez_compressed(OUT, **compute())
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
