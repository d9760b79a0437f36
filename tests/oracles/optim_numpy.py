"""NumPy float64 transcriptions of the official Conda and RMNP steps.

Both work on torch-layout weights ``(out, in)`` (RMNP: ``(out, ...)`` viewed
as ``(out, -1)``), exactly as the reference code, so the tests exercise the
layout conversion too.

* `conda_reference`: ``jie040109/Conda`` ``conda_torch/conda.py`` with
  ``projector.py``: first moment updated, then the basis refreshed from its
  SVD when ``t % gap == 0`` (0-based ``t``; with ``offset=1`` the
  ``pytorch_optimizer`` schedule ``(t + 1) % gap == 0``), gradient and moment
  projected, the second moment in projected coordinates, bias-corrected step,
  decay after the step. ``proj_type`` is the projector's ``'std'``,
  ``'reverse_std'``, ``'right'`` (``Vh``: ``X Vh^T``, back ``Y Vh``) or
  ``'left'`` (``U``: ``U^T X``, back ``U Y``); ``None`` is the official
  class's unprojected group. For the non-square low-rank cases the official
  code fails (``exp_avg_sq`` allocated in the parameter's shape, and
  ``reverse_std``'s back-projection side read from the square projected
  shape); this transcription keeps the second moment in projected
  coordinates and back-projects on the side it projected.
* `rmnp_reference`: ``Dominator-Index/RMNP`` ``rmnp/rmnp.py``: plain-sum
  momentum, Nesterov, ``F.normalize(dim=-1)``, ``sqrt(max(1, m/n))``, optional
  bf16 rounding of the direction, ``W (1 - lr wd) - lr R``.
"""

from __future__ import annotations

import numpy as np


def conda_reference(
  w0,
  grads,
  *,
  lr,
  b1=0.9,
  b2=0.999,
  eps=1e-8,
  wd=0.0,
  gap=2000,
  scale=1.0,
  offset=0,
  proj_type="std",
):
  """Returns ``(params, bases)``: the weight after each step and the basis."""
  w = np.asarray(w0, np.float64).copy()
  m = np.zeros_like(w)
  v = None
  q = None
  params, bases = [], []
  tall = proj_type is not None and w.shape[0] >= w.shape[1]
  kind = {
    "std": "right" if tall else "left",
    "reverse_std": "left" if tall else "right",
    "right": "right",
    "left": "left",
    None: None,
  }[proj_type]
  for t, g in enumerate(grads):
    g = np.asarray(g, np.float64)
    m = b1 * m + (1 - b1) * g
    if kind is None:
      gp, mp = g, m
    else:
      if q is None or (t + offset) % gap == 0:
        u, _, vh = np.linalg.svd(m, full_matrices=False)
        q = vh if kind == "right" else u
      if kind == "right":
        gp, mp = g @ q.T, m @ q.T
      else:
        gp, mp = q.T @ g, q.T @ m
    v = (1 - b2) * gp * gp if v is None else b2 * v + (1 - b2) * gp * gp
    n = mp / (np.sqrt(v) + eps)
    if kind is None:
      back = n
    else:
      back = scale * (n @ q if kind == "right" else q @ n)
    step = lr * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
    w = w - step * back
    w = w * (1 - lr * wd)
    params.append(w.copy())
    bases.append(None if q is None else q.copy())
  return np.stack(params), bases


def _bf16_round(x: np.ndarray) -> np.ndarray:
  """Round-to-nearest-even to bfloat16, back to float64."""
  b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
  return b.astype(np.uint32).view(np.float32).astype(np.float64)


def rmnp_direction(u: np.ndarray) -> np.ndarray:
  """Row-normalized direction (torch ``F.normalize(u, dim=-1)``), unscaled."""
  u2 = u.reshape(u.shape[0], -1)
  norm = np.maximum(np.linalg.norm(u2, axis=1, keepdims=True), 1e-12)
  return (u2 / norm).reshape(u.shape)


def rmnp_reference(
  w0, grads, *, lr, momentum=0.95, nesterov=True, wd=0.0, bf16=False
):
  """Returns the weight after each step (torch layout, float64)."""
  w = np.asarray(w0, np.float64).copy()
  buf = np.zeros_like(w)
  m = w.shape[0]
  n = w.size // m
  factor = np.sqrt(max(1.0, m / n))
  params = []
  for g in grads:
    g = np.asarray(g, np.float64)
    buf = momentum * buf + g
    u = g + momentum * buf if nesterov else buf
    r = rmnp_direction(u) * factor
    if bf16:
      r = _bf16_round(r)
    w = w * (1 - lr * wd) - lr * r
    params.append(w.copy())
  return np.stack(params)
