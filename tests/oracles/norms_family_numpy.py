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
