"""Golden vectors for EvoNorm-B0/S0/S0a from timm's ``layers/evo_norm.py``.

Run ``python -m tests.oracles.evonorm_timm`` (needs torch and timm 1.0.31)
to rewrite ``evonorm_timm.npz``. The tests load the ``.npz`` always and call
`generate` live when torch and timm are importable.

timm's package ``__init__`` imports torchvision, whose PyPI wheel is a CUDA
build that does not load next to a CPU torch. `load_evo_norm` therefore
imports only ``timm.layers.evo_norm`` (and its small relative imports) from
the installed timm, through empty package shells for ``timm`` and
``timm.layers``; no timm code is copied.

timm is NCHW; every array stored here is NHWC (jaxnorm's layout). ``b0_*``:
a training step (output and updated ``running_var``) then an inference step
on a second batch; ``s0_*``/``s0a_*``: the stateless layers.
"""

import importlib
import importlib.util
import pathlib
import sys
import types

import numpy as np
import torch

OUT = pathlib.Path(__file__).with_suffix(".npz")


def load_evo_norm() -> types.ModuleType:
  """Imports ``timm.layers.evo_norm`` without running timm's ``__init__``."""
  if "timm.layers.evo_norm" in sys.modules:
    return sys.modules["timm.layers.evo_norm"]
  spec = importlib.util.find_spec("timm")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError("timm is not installed")
  root = pathlib.Path(list(spec.submodule_search_locations)[0])
  if "timm" not in sys.modules:
    pkg = types.ModuleType("timm")
    pkg.__path__ = [str(root)]
    sys.modules["timm"] = pkg
  if "timm.layers" not in sys.modules:
    layers = types.ModuleType("timm.layers")
    layers.__path__ = [str(root / "layers")]
    sys.modules["timm.layers"] = layers
  return importlib.import_module("timm.layers.evo_norm")


def _nhwc(t: torch.Tensor) -> np.ndarray:
  return t.detach().permute(0, 2, 3, 1).numpy()


def generate() -> dict[str, np.ndarray]:
  """Runs the timm layers on fixed random inputs; returns NHWC arrays."""
  evo = load_evo_norm()
  torch.manual_seed(0)
  c = 8
  res = {}
  x1 = torch.randn(3, c, 4, 5) * 2.0 + 0.5
  x2 = torch.randn(2, c, 4, 5) * 1.5 - 0.3
  res["x1"], res["x2"] = _nhwc(x1), _nhwc(x2)
  with torch.no_grad():
    b0 = evo.EvoNorm2dB0(c)
    b0.weight.copy_(1.0 + 0.3 * torch.randn(c))
    b0.bias.copy_(0.3 * torch.randn(c))
    b0.v.copy_(1.0 + 0.5 * torch.randn(c))
    b0.running_var.copy_(1.0 + 0.5 * torch.rand(c))
    res["b0_scale"], res["b0_bias"] = (
      b0.weight.numpy().copy(),
      (b0.bias.numpy().copy()),
    )
    res["b0_v"] = b0.v.numpy().copy()
    res["b0_running_var0"] = b0.running_var.numpy().copy()
    b0.train()
    res["b0_train_y"] = _nhwc(b0(x1))
    res["b0_running_var1"] = b0.running_var.numpy().copy()
    b0.eval()
    res["b0_eval_y"] = _nhwc(b0(x2))
    for name, cls in (("s0", evo.EvoNorm2dS0), ("s0a", evo.EvoNorm2dS0a)):
      layer = cls(c, groups=2)
      layer.weight.copy_(1.0 + 0.3 * torch.randn(c))
      layer.bias.copy_(0.3 * torch.randn(c))
      layer.v.copy_(1.0 + 0.5 * torch.randn(c))
      res[f"{name}_scale"] = layer.weight.numpy().copy()
      res[f"{name}_bias"] = layer.bias.numpy().copy()
      res[f"{name}_v"] = layer.v.numpy().copy()
      res[f"{name}_y"] = _nhwc(layer(x1))
  return {k: np.asarray(v, np.float32) for k, v in res.items()}


if __name__ == "__main__":
  np.savez_compressed(OUT, **generate())
  print(f"wrote {OUT}")
