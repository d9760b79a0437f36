"""NumPy float64 transcription of FakeLN (spec ``norms.md`` section 10).

Written from the spec's equations, not from jaxnorm: the per-token loop of
the divisor choice, and the bias-corrected running average as its closed
form (a weighted sum over every recorded batch mean), not as a recursion.
Positions are on axis -2, features last.
"""

import numpy as np


def f64(x):
  return np.asarray(x, np.float64)


def fake_layer_norm(x, scale, bias, std):
  """``(x - mean_d x) / s * scale + bias`` with a given divisor ``s``."""
  x = f64(x)
  xc = x - x.mean(-1, keepdims=True)
  s = np.broadcast_to(f64(std), x.shape[:-1])[..., None]
  y = xc / s
  if scale is not None:
    y = y * f64(scale)
  if bias is not None:
    y = y + f64(bias)
  return y


def token_std(x, eps):
  """``sqrt(var_d(x) + eps)`` per token, ``(..., T)``."""
  x = f64(x)
  return np.sqrt(((x - x.mean(-1, keepdims=True)) ** 2).mean(-1) + eps)


def corrected_average(means, m):
  """``(1 - m) sum_j m^(k-j) b_j / (1 - m^k)`` of the recorded means."""
  k = len(means)
  weights = [(1 - m) * m ** (k - 1 - j) for j in range(k)]
  return sum(w * b for w, b in zip(weights, means)) / (1 - m**k)


class FakeLN:
  """A scheduled FakeLN, one call at a time (training calls update it)."""

  def __init__(self, *, remove_at, bos_off_at, momentum, eps):
    self.remove_at, self.bos_off_at = remove_at, bos_off_at
    self.m, self.eps = momentum, eps
    self.step = 0
    self.shared, self.first = [], []  # recorded batch means

  @property
  def std(self):
    return corrected_average(self.shared, self.m) if self.shared else 1.0

  @property
  def bos_std(self):
    return corrected_average(self.first, self.m) if self.first else 1.0

  def __call__(self, x, scale, bias, training=True):
    x = f64(x)
    sigma = token_std(x, self.eps)
    n = self.step
    fake = n >= self.remove_at
    bos_on = n < self.bos_off_at
    num_pos = x.shape[-2]
    if training:
      if not fake or not self.shared:
        if bos_on and num_pos > 1:
          self.shared.append(sigma[..., 1:].mean())
        else:
          self.shared.append(sigma.mean())
        self.first.append(sigma[..., 0].mean())
      self.step += 1
    s = np.empty_like(sigma)
    for t in range(num_pos):
      if not fake:
        s[..., t] = sigma[..., t]
      elif t == 0 and bos_on:
        s[..., t] = self.bos_std
      else:
        s[..., t] = self.std
    return fake_layer_norm(x, scale, bias, s)
