"""Golden Hyper-Connection vectors from ``hyper-connections``.

Run from the repository root (needs ``torch`` and ``hyper-connections``
0.4.11, neither a jaxnorm dependency):

  python -m tests.oracles.hc_golden

It writes ``tests/oracles/hc_golden.npz``:

* ``hc/<case>/...``: a two-sublayer HC network
  ``reduce(hc1(hc0(expand(x))))`` (``n = 4`` streams, ``d = 16``, bias-free
  linear branches) from ``hyper_connections.HyperConnections``; per case the
  input ``x``, the branch weights ``w0``, ``w1`` (torch layout
  ``(out, in)``), every HC parameter ``p<k>/<name>`` and the output ``y``.
  Cases: ``init`` (fresh modules), ``static`` (random static parameters,
  dynamic weights zero), ``dynamic`` and ``dynamic_notanh`` (all parameters
  random).
"""

from __future__ import annotations

import pathlib

import numpy as np

N, D, BATCH, SEQ = 4, 16, 2, 3
CASES = ("init", "static", "dynamic", "dynamic_notanh")
PARAMS = (
  "static_alpha",
  "static_beta",
  "dynamic_alpha_fn",
  "dynamic_alpha_scale",
  "dynamic_beta_fn",
  "dynamic_beta_scale",
  "norm.gamma",
)
OUT = pathlib.Path(__file__).with_name("hc_golden.npz")


def compute() -> dict[str, np.ndarray]:
  """Runs the oracle and returns the arrays written to ``OUT``."""
  import torch
  from hyper_connections import get_init_and_expand_reduce_stream_functions

  torch.manual_seed(0)
  out: dict[str, np.ndarray] = {}
  for c, case in enumerate(CASES):
    gen = torch.Generator().manual_seed(100 + c)
    init_hc, expand, reduce = get_init_and_expand_reduce_stream_functions(
      N, dim=D
    )
    branches = [torch.nn.Linear(D, D, bias=False) for _ in range(2)]
    hcs = [
      init_hc(branch=b, layer_index=k, tanh=case != "dynamic_notanh")
      for k, b in enumerate(branches)
    ]
    with torch.no_grad():
      for k, (b, hc) in enumerate(zip(branches, hcs)):
        b.weight.copy_(torch.randn(D, D, generator=gen) / D**0.5)
        params = dict(hc.named_parameters())
        if case != "init":
          for name in PARAMS:
            p = params[name]
            if case == "static" and name.startswith("dynamic"):
              continue
            p.copy_(
              torch.randn(p.shape, generator=gen) * (0.5 if p.ndim else 0.3)
            )
        out[f"hc/{case}/w{k}"] = b.weight.numpy().copy()
        for name in PARAMS:
          out[f"hc/{case}/p{k}/{name}"] = params[name].detach().numpy().copy()
      x = torch.randn(BATCH, SEQ, D, generator=gen)
      y = reduce(hcs[1](hcs[0](expand(x))))
    out[f"hc/{case}/x"] = x.numpy()
    out[f"hc/{case}/y"] = y.numpy()
  return out


def main() -> None:
  """Writes the golden file."""
  np.savez_compressed(OUT, **compute())
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
