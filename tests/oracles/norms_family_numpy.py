"""NumPy float64 transcriptions of the normalization-family equations.

Written from the papers (LayerNorm, RMSNorm, GroupNorm, SeeDNorm) and from
``shared/specs/norms.md`` (sections 5-9, 11, 13, 15b, 15c), not
from jaxnorm: loops and plain indexing where that keeps the equation
readable. Layouts are features-last, as in jaxnorm.
"""

import numpy as np


def f64(x):
  return np.asarray(x, np.float64)


# ---------------------------------------------------------------------------
# LayerNorm, RMSNorm, GroupNorm, SeeDNorm.


def layer_norm(x, scale, bias, eps=1e-6, axes=(-1,)):
  x = f64(x)
  mu = x.mean(axis=axes, keepdims=True)
  var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * f64(scale) + f64(bias)


def rms_norm(x, scale, eps=1e-6, eps_mode="inside"):
  x = f64(x)
  ms = (x**2).mean(-1, keepdims=True)
  denom = np.sqrt(ms + eps) if eps_mode == "inside" else np.sqrt(ms) + eps
  return x / denom * f64(scale)


def group_norm(x, scale, bias, groups, eps=1e-6, *, per_token=False):
  """Per example over all positions, or with ``per_token`` per position."""
  x = f64(x)
  c = x.shape[-1]
  rows = x.reshape(-1, 1, c) if per_token else x.reshape(x.shape[0], -1, c)
  y = np.empty_like(rows)
  for i, row in enumerate(rows):
    for g in range(groups):
      sl = slice(g * c // groups, (g + 1) * c // groups)
      block = row[:, sl]
      y[i][:, sl] = (block - block.mean()) / np.sqrt(block.var() + eps)
  return y.reshape(x.shape) * f64(scale) + f64(bias)


def seed_norm(x, gamma, alpha, beta, heads=1, eps=1e-6):
  x = f64(x)
  d = x.shape[-1]
  xh = x.reshape(*x.shape[:-1], heads, d // heads)
  dot = (xh * f64(beta).reshape(heads, -1)).sum(-1)
  t = np.repeat(np.tanh(dot), d // heads, axis=-1)
  s = f64(gamma) + f64(alpha) * t
  return s * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


# ---------------------------------------------------------------------------
# EvoNorm (section 5).


def evo_b0(x, scale, bias, v, running_var, *, training, momentum=0.9, eps=1e-3):
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


def evo_s0(x, scale, bias, v, *, groups, eps=1e-5, per_token=False):
  """Per example over all positions, or with ``per_token`` per position."""
  x = f64(x)
  c = x.shape[-1]
  rows = x.reshape(-1, 1, c) if per_token else x
  y = np.empty_like(rows)
  for i in range(rows.shape[0]):
    xi = rows[i].reshape(-1, c)
    std = np.empty(c)
    for g in range(groups):
      sl = slice(g * c // groups, (g + 1) * c // groups)
      std[sl] = np.sqrt(xi[:, sl].var() + eps)
    sig = 1.0 / (1.0 + np.exp(-f64(v) * xi))
    y[i] = (xi * sig / std * f64(scale) + f64(bias)).reshape(rows[i].shape)
  return y.reshape(x.shape)


# ---------------------------------------------------------------------------
# PowerNorm (section 6) and Unified Normalization (section 7): one training
# step forward and backward, the state as a dict of float64 arrays.


def group_scale(x, groups, eps=1e-5):
  x = f64(x)
  c = x.shape[-1]
  xg = x.reshape(*x.shape[:-1], groups, c // groups)
  ms = (xg**2).mean(-1, keepdims=True)
  return (xg / np.sqrt(ms + eps)).reshape(x.shape)


def quad_mean(x, pad_mask=None):
  flat = f64(x).reshape(-1, x.shape[-1])
  if pad_mask is not None:
    flat = flat[~np.asarray(pad_mask).reshape(-1)]
  return (flat**2).mean(0)


def power_norm_step(
  x,
  gamma,
  beta,
  st,
  gy,
  *,
  warmup,
  eps=1e-5,
  afwd=0.9,
  abkw=0.9,
  pad_mask=None,
  backward_stat="batch",
):
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
  return (y, dx, (gy * z).sum(red), gy.sum(red), {"t": t, "phi": phi, "nu": nu})


def unified_norm_step(
  x,
  gamma,
  beta,
  st,
  gy,
  *,
  warmup,
  eps=1e-5,
  m=0.9,
  filtration=False,
  pad_mask=None,
):
  """Training step; ``st`` has t, skips, phi, ema, bx (W_f, C), bg (W_b, C).

  Returns ``(y, dx, dgamma, dbeta, new_state)``.
  """
  x, gamma, beta, gy = f64(x), f64(gamma), f64(beta), f64(gy)
  st = {
    k: (np.array(v, np.float64) if k not in ("t", "skips") else v)
    for k, v in st.items()
  }
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
  r = np.ones(c) if (t <= max(1000, warmup) or skip) else np.clip(r, 0.2, 5)
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


# ---------------------------------------------------------------------------
# Region Normalization (section 8): the code's mechanism, not the closed form.


def region_norm_fill(x, mask, eps=1e-5):
  """Fill outside each region with its mean, BatchNorm the whole map,
  rescale by sqrt(S_R / N_tot), keep the region."""
  x = f64(x)
  m = np.broadcast_to(f64(mask), x.shape)
  red = tuple(range(x.ndim - 1))
  n_tot = np.prod(x.shape[:-1])
  y = np.zeros_like(x)
  for r in (m, 1 - m):
    s = np.maximum(r.sum(red), 1)
    mu = (x * r).sum(red) / s
    filled = x * r + mu * (1 - r)
    bn_mu = filled.mean(red)
    bn_var = filled.var(red)
    bn = (filled - bn_mu) / np.sqrt(bn_var + eps)
    y += r * bn * np.sqrt(s / n_tot)
  return y


# ---------------------------------------------------------------------------
# UnMix-TNS (section 11).


def unmix_tns(x, gamma, beta, mu_k, var_k, *, momentum, tau=0.07, eps=1e-5):
  """Returns ``(y, new_mu_k, new_var_k)``; ``x`` is ``(B, *spatial, C)``."""
  x = f64(x)
  b, c = x.shape[0], x.shape[-1]
  flat = x.reshape(b, -1, c)
  mu_t, var_t = flat.mean(1), flat.var(1)
  mu_k, var_k = f64(mu_k), f64(var_k)
  k = mu_k.shape[0]
  y = np.empty_like(flat)
  p_all = np.empty((b, k))
  for i in range(b):
    cos = np.array(
      [
        mu_t[i]
        @ mu_k[j]
        / max(np.linalg.norm(mu_t[i]) * np.linalg.norm(mu_k[j]), 1e-8)
        for j in range(k)
      ]
    )
    e = np.exp(cos / tau - (cos / tau).max())
    p = e / e.sum()
    p_all[i] = p
    m = np.array([(1 - p[j]) * mu_k[j] + p[j] * mu_t[i] for j in range(k)])
    v = np.array([(1 - p[j]) * var_k[j] + p[j] * var_t[i] for j in range(k)])
    mu_b = m.mean(0)
    var_b = v.mean(0) + (m**2).mean(0) - mu_b**2
    y[i] = f64(gamma) * (flat[i] - mu_b) / np.sqrt(var_b + eps) + f64(beta)
  new_mu = mu_k + momentum * np.mean(
    p_all[:, :, None] * (mu_t[:, None] - mu_k[None]), axis=0
  )
  new_var = var_k + momentum * np.mean(
    p_all[:, :, None] * (var_t[:, None] - var_k[None]), axis=0
  )
  return y.reshape(x.shape), new_mu, new_var


# ---------------------------------------------------------------------------
# L1 normalization (section 13).


def l1_layer_norm(x, gamma, beta, *, eps=1e-5, kappa=np.sqrt(np.pi / 2)):
  x = f64(x)
  mu = x.mean(-1, keepdims=True)
  s1 = np.abs(x - mu).mean(-1, keepdims=True)
  return f64(gamma) * (x - mu) / (kappa * s1 + eps) + f64(beta)


# ---------------------------------------------------------------------------
# Gecko timestep-decay normalization (section 15c): a plain loop.


def timestep_decay_norm(
  x,
  w,
  b,
  groups,
  *,
  beta1=0.999,
  beta2=0.9999,
  eps=1e-5,
  state=None,
  pad=None,
  bos=None,
):
  x = f64(x)
  bsz, length, d = x.shape
  if state is None:
    state = (np.zeros(bsz), np.zeros((bsz, groups)), np.zeros((bsz, groups)))
  n, m, v = (np.array(s, np.float64) for s in state)
  y = np.zeros_like(x)
  for i in range(bsz):
    for t in range(length):
      if pad is not None and pad[i, t]:
        continue
      if bos is not None and bos[i, t]:
        n[i], m[i], v[i] = 0, 0, 0
      xg = x[i, t].reshape(groups, -1)
      n[i] += 1
      m[i] = beta1 * m[i] + (1 - beta1) * xg.mean(-1)
      v[i] = beta2 * v[i] + (1 - beta2) * xg.var(-1)
      mu = m[i] / (1 - beta1 ** n[i])
      var = v[i] / (1 - beta2 ** n[i])
      yn = (xg - mu[:, None]) / np.sqrt(var[:, None] + eps)
      y[i, t] = yn.reshape(d) * (1 + f64(w)) + f64(b)
  return y, (n, m, v)
