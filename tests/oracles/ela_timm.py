"""Golden vectors for ELA from timm's ``EfficientLocalAttn`` (timm 1.0.31).

Run ``python tests/oracles/ela_timm.py`` (needs torch and timm) to rewrite
``ela_timm.npz``. timm's layer is not the paper form by default (separate
``conv_h``/``conv_w``, GroupNorm with 1 group, SiLU before the sigmoid), so it
is configured as the paper: ``act_layer=nn.Identity``, ``GroupNorm(groups)``,
``conv_w`` = ``conv_h`` transposed and ``norm_w`` = ``norm_h`` (one shared conv
and norm). Only the depthwise presets (ELA-T, ELA-B) exist in timm.

``import timm`` fails with the PyPI torchvision that does not match torch
2.13, so this script loads ``timm.layers.coord_attn`` through empty package
stubs for ``timm`` and ``timm.layers`` (a test-only shim; nothing else of
timm is executed).
"""

import functools
import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch
from torch import nn

OUT = pathlib.Path(__file__).with_suffix(".npz")


def _load_ela():
  if "timm.layers.coord_attn" not in sys.modules:
    root = pathlib.Path(importlib.util.find_spec("timm").origin).parent
    for name, path in (("timm", root), ("timm.layers", root / "layers")):
      if name not in sys.modules:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules[name] = mod
  from timm.layers.coord_attn import EfficientLocalAttn

  return EfficientLocalAttn


def generate() -> dict[str, np.ndarray]:
  ela_cls = _load_ela()
  torch.manual_seed(0)
  res = {}
  for name, channels, k, groups in (("B", 32, 7, 16), ("T", 64, 5, 32)):
    layer = ela_cls(
      channels,
      kernel_size=k,
      act_layer=nn.Identity,
      norm_layer=functools.partial(nn.GroupNorm, groups),
    )
    with torch.no_grad():
      layer.conv_h.weight.copy_(torch.randn_like(layer.conv_h.weight) * 0.5)
      layer.norm_h.weight.copy_(1 + 0.3 * torch.randn(channels))
      layer.norm_h.bias.copy_(0.3 * torch.randn(channels))
      layer.conv_w.weight.copy_(layer.conv_h.weight.transpose(-1, -2))
      layer.norm_w.load_state_dict(layer.norm_h.state_dict())
      x = torch.randn(2, channels, 6, 5)
      y = layer(x)
    w = layer.conv_h.weight.detach().numpy()  # (C, 1, k, 1)
    res[f"{name}_x"] = x.numpy().transpose(0, 2, 3, 1)
    res[f"{name}_y"] = y.numpy().transpose(0, 2, 3, 1)
    res[f"{name}_kernel"] = w[:, :, :, 0].transpose(2, 1, 0)  # (k, 1, C)
    res[f"{name}_scale"] = layer.norm_h.weight.detach().numpy()
    res[f"{name}_bias"] = layer.norm_h.bias.detach().numpy()
    res[f"{name}_groups"] = np.asarray(groups)
  return {k: np.asarray(v) for k, v in res.items()}


if __name__ == "__main__":
  np.savez(OUT, **generate())
  print(f"wrote {OUT}")
