"""NumPy float64 transcriptions of the normalization-family equations.

Written from ``shared/specs/norms.md`` (sections 5-9, 11, 13, 15b, 15c), not
from jaxnorm: loops and plain indexing where that keeps the equation
readable. Layouts are features-last, as in jaxnorm.
"""

import numpy as np


def f64(x):
  return np.asarray(x, np.float64)


# ---------------------------------------------------------------------------
# EvoNorm (section 5).


def evo_b0(x, scale, bias, v, running_var, *, training, momentum=0.9,
           eps=1e-3):
  """Returns ``(y, new_running_var)``; ``momentum`` weights the old value."""
  x = f64(x)
  c = x.shape[-1]
  flat = x.reshape(-1, c)
  if training:
    var_b = flat.var(axis=0)
    n = flat.shape[0]
    new_rv = momentum * f64(running_var) + (1 - momentum) * var_b * n / (n - 1)
  else:
    var_b = f64(running_var)
    new_rv = f64(running_var)
  y = np.empty_like(x)
  for i in range(x.shape[0]):
    xi = x[i].reshape(-1, c)
    var_i = xi.var(axis=0)
    den = np.maximum(np.sqrt(var_b + eps), f64(v) * xi + np.sqrt(var_i + eps))
    y[i] = (xi / den * f64(scale) + f64(bias)).reshape(x[i].shape)
  return y, new_rv


def evo_s0(x, scale, bias, v, *, groups, eps=1e-5):
  x = f64(x)
  c = x.shape[-1]
  y = np.empty_like(x)
  for i in range(x.shape[0]):
    xi = x[i].reshape(-1, c)
    std = np.empty(c)
    for g in range(groups):
      sl = slice(g * c // groups, (g + 1) * c // groups)
      std[sl] = np.sqrt(xi[:, sl].var() + eps)
    sig = 1.0 / (1.0 + np.exp(-f64(v) * xi))
    y[i] = (xi * sig / std * f64(scale) + f64(bias)).reshape(x[i].shape)
  return y


# ---------------------------------------------------------------------------
# PowerNorm (section 6) and Unified Normalization (section 7): one training
# step forward and backward, the state as a dict of float64 arrays.


def group_scale(x, groups, eps=1e-5):
  x = f64(x)
  c = x.shape[-1]
  xg = x.reshape(*x.shape[:-1], groups, c // groups)
  ms = (xg ** 2).mean(-1, keepdims=True)
  return (xg / np.sqrt(ms + eps)).reshape(x.shape)


def quad_mean(x, pad_mask=None):
  flat = f64(x).reshape(-1, x.shape[-1])
  if pad_mask is not None:
    flat = flat[~np.asarray(pad_mask).reshape(-1)]
  return (flat ** 2).mean(0)


def power_norm_step(x, gamma, beta, st, gy, *, warmup, eps=1e-5, afwd=0.9,
                    abkw=0.9, pad_mask=None, backward_stat="batch"):
  """Training step on already group-scaled ``x``.

  Returns ``(y, dx, dgamma, dbeta, new_state)``; ``st`` has ``t``, ``phi``,
  ``nu``.
  """
  x, gamma, beta, gy = f64(x), f64(gamma), f64(beta), f64(gy)
  t = st["t"] + 1
  phi, nu = f64(st["phi"]).copy(), f64(st["nu"]).copy()
  psi2 = quad_mean(x, pad_mask)
  var = psi2 if t <= warmup else phi
  z = x / np.sqrt(var + eps)
  y = gamma * z + beta
  denom = psi2 if backward_stat == "batch" else phi
  if t < warmup:
    phi = phi * (t - 1) / t + psi2 / t
  phi = afwd * phi + (1 - afwd) * psi2
  gz = gy * gamma
  gt = gz - (1 - abkw) * nu * z
  nu = nu + (gt * z).reshape(-1, x.shape[-1]).mean(0)
  dx = gt / np.sqrt(denom + eps)
  red = tuple(range(x.ndim - 1))
  return (y, dx, (gy * z).sum(red), gy.sum(red),
          {"t": t, "phi": phi, "nu": nu})


def unified_norm_step(x, gamma, beta, st, gy, *, warmup, eps=1e-5, m=0.9,
                      filtration=False, pad_mask=None):
  """Training step; ``st`` has t, skips, phi, ema, bx (W_f, C), bg (W_b, C).

  Returns ``(y, dx, dgamma, dbeta, new_state)``.
  """
  x, gamma, beta, gy = f64(x), f64(gamma), f64(beta), f64(gy)
  st = {k: (np.array(v, np.float64) if k not in ("t", "skips") else v)
        for k, v in st.items()}
  t = st["t"] + 1
  c = x.shape[-1]
  wf, wb = st["bx"].shape[0], st["bg"].shape[0]
  psi2 = quad_mean(x, pad_mask)
  r_var = np.sqrt(st["bx"]).reshape(-1).var(ddof=1)
  st["bx"][t % wf] = psi2
  skip = wf <= 1
  with np.errstate(divide="ignore"):
    if filtration and t >= warmup:
      am = st["bx"].mean(0)
      gm = np.exp(np.log(st["bx"]).mean(0))
      if np.any(am - gm > r_var * wf):
        st["bx"][t % wf] = st["phi"]
        skip = True
        st["skips"] += 1
    gm = np.exp(np.log(st["bx"]).mean(0))
  var = psi2 if (t <= wf or t < warmup or skip) else gm
  r = np.sqrt(var + eps) / np.sqrt(st["phi"] + eps)
  r = np.ones(c) if (t <= max(1000, warmup) or skip) else np.clip(r, .2, 5)
  z = x / np.sqrt(var + eps)
  y = gamma * z + beta
  st["phi"] = m * st["phi"] + (1 - m) * var
  g = gy * gamma * r
  gz = (g * z).reshape(-1, c).mean(0)
  st["bg"][t % wb] = st["ema"] if skip else gz
  mu = gz if (t <= wb or t < warmup or skip) else st["bg"].mean(0)
  st["ema"] = m * st["ema"] + (1 - m) * mu
  gt = g - (mu if skip else st["ema"]) * z
  dx = gt / np.sqrt(var + eps)
  red = tuple(range(x.ndim - 1))
  st["t"] = t
  return y, dx, (gy * r * z).sum(red), gy.sum(red), st
