"""Golden vectors for attention sinks and gated attention from x-transformers.

Run ``python tests/oracles/attention_sinks_xtransformers.py`` (needs torch and
x-transformers 2.31.10) to rewrite ``attention_sinks_xtransformers.npz``. The
tests load the ``.npz`` and, when torch imports, also call `generate` live.

* ``Attend(add_zero_kv=True)``: softmax-off-by-one (zero key, zero value).
* ``Attend(head_learned_sink=True)`` with random per-head sink logits.
* ``Attention(gate_values=True)`` (elementwise and head-wise), causal, with
  random weights: output = to_out(sdpa(x) * sigmoid(to_v_gate(x))).

Layouts are x-transformers' (batch, heads, seq, dim_head); the tests
transpose to jaxnorm's (batch, seq, heads, dim_head).
"""

import pathlib

import numpy as np
import torch
from x_transformers.attend import Attend
from x_transformers.x_transformers import Attention

OUT = pathlib.Path(__file__).with_suffix(".npz")


def generate() -> dict[str, np.ndarray]:
  torch.manual_seed(0)
  b, h, n, d = 2, 3, 5, 8
  q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
  mask = torch.ones(b, n, dtype=torch.bool)
  mask[1, 3:] = False  # key padding on the second sample
  res = {"q": q, "k": k, "v": v, "mask": mask}
  with torch.no_grad():
    zero = Attend(add_zero_kv=True, flash=False)
    res["out_zero_kv"] = zero(q, k, v, mask=mask)[0]
    sink = Attend(heads=h, head_learned_sink=True, flash=False)
    sink.head_attn_sink.copy_(torch.randn(h) * 1.5)
    res["sinks"] = sink.head_attn_sink.clone()
    res["out_learned_sink"] = sink(q, k, v, mask=mask)[0]
    dim, heads, dh = 12, 3, 4
    res["gate_heads"] = torch.tensor(heads)
    res["gate_dim_head"] = torch.tensor(dh)
    for mode, headwise in (("dimwise", False), ("headwise", True)):
      layer = Attention(
        dim,
        heads=heads,
        dim_head=dh,
        causal=True,
        gate_values=True,
        gate_values_headwise=headwise,
      )
      for p in layer.parameters():
        p.copy_(torch.randn_like(p) * 0.4)
      x = torch.randn(2, 6, dim)
      res[f"gate_{mode}_x"] = x
      res[f"gate_{mode}_out"] = layer(x)
      for name, mod in (
        ("wq", layer.to_q),
        ("wk", layer.to_k),
        ("wv", layer.to_v),
        ("wgate", layer.to_v_gate),
        ("wout", layer.to_out),
      ):
        res[f"gate_{mode}_{name}"] = mod.weight
  return {k: np.asarray(t.detach().numpy()) for k, t in res.items()}


if __name__ == "__main__":
  np.savez(OUT, **generate())
  print(f"wrote {OUT}")
