"""NumPy float64 / complex128 oracles of the complex-valued primitives.

Independent transcriptions of the papers' equations and of the official
code paths the spec (``specs/complex.md``) cites: Trabelsi et al.'s
``complex_standardization``, CNet's hand-written backward passes (TokenNorm,
Born attention) and Born cross-entropy gradient, the direct causal DFT sum,
ComplexFormer's official forward, the PCT's ``ComplexMultiHeadSigmoidAttention``
forward and Fairy2i's ``PhaseQuantSTE``. Running this file writes
``complex_golden.npz`` (PhaseQuant golden vectors) next to it.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

# ---------------------------------------------------------------------------
# Deep Complex Networks.


def complex_standardization(x, eps=1e-4, axes=None):
  """Port of ``complex_standardization`` (Keras, Trabelsi et al.).

  ``x`` complex128 ``(..., C)``; statistics over ``axes`` (default all but
  the last).
  """
  axes = tuple(range(x.ndim - 1)) if axes is None else axes
  xc = x - x.mean(axis=axes, keepdims=True)
  re, im = xc.real, xc.imag
  vrr = (re * re).mean(axis=axes, keepdims=True) + eps
  vii = (im * im).mean(axis=axes, keepdims=True) + eps
  vri = (re * im).mean(axis=axes, keepdims=True)
  tau = vrr + vii
  delta = vrr * vii - vri**2
  s = np.sqrt(delta)
  t = np.sqrt(tau + 2 * s)
  inv = 1.0 / (s * t)
  wrr, wii, wri = (vii + s) * inv, (vrr + s) * inv, -vri * inv
  return (wrr * re + wri * im) + 1j * (wri * re + wii * im)


# ---------------------------------------------------------------------------
# CNet hand-written backward passes, in CNet's (dz, dz_star) convention.


def token_norm_backward(x, g_o, g_ob, eps):
  """CNet TokenNorm over the last axis: returns ``dL/dx`` (= conj dL/dx̄).

  ``dL/dx = gO/r - x̄ T / (2 d r^3)``, ``T = Σ (gO x + gOb x̄)``.
  """
  d = x.shape[-1]
  r = np.sqrt((np.abs(x) ** 2).mean(axis=-1, keepdims=True) + eps)
  t = (g_o * x + g_ob * np.conj(x)).sum(axis=-1, keepdims=True)
  return g_o / r - np.conj(x) * t / (2 * d * r**3)


def born_attention_forward(q, k, v, causal):
  """Single-head Born attention ``(T, H)`` inputs; returns ``(O, A, c)``."""
  c = q @ np.conj(k).T
  s = np.abs(c) ** 2
  if causal:
    s = np.tril(s)
  a = s / s.sum(axis=-1, keepdims=True)
  return a @ v, a, c


def born_attention_backward(q, k, v, g_o, causal):
  """CNet's Born-attention backward for a holomorphic-in-V cotangent.

  With ``gO = dL/dO`` (``dL/dŌ = conj(gO)`` for a real loss) returns
  ``(dL/dQ̄, dL/dK̄, dL/dV̄)``: ``a_m = Re<gO_k, V_m>``-type terms,
  ``b_km = (a_km - ā_k)/S_k``, ``dL/dQ̄_k += b_km c_km K_m``,
  ``dL/dK̄_m += b_km conj(c_km) Q_k``.
  """
  _, a, c = born_attention_forward(q, k, v, causal)
  s_all = np.abs(c) ** 2
  if causal:
    s_all = np.tril(s_all)
  total = s_all.sum(axis=-1, keepdims=True)
  # dL/dA_km (real weights): 2 Re(gO_k . V_m) with the (dz, dz*) pairing.
  da = 2 * np.real(g_o @ v.T)
  abar = (da * a).sum(axis=-1, keepdims=True)
  b = (da - abar) / total
  if causal:
    b = np.tril(b)
  dq_bar = (b * c) @ k
  dk_bar = (b * np.conj(c)).T @ q
  dv_bar = a.T @ np.conj(g_o)
  return dq_bar, dk_bar, dv_bar


def born_ce_grad(z, labels, smoothing=0.0):
  """Closed-form ``dL/dz̄`` of the mean Born cross-entropy."""
  s = np.abs(z) ** 2
  total = s.sum(axis=-1, keepdims=True)
  v = z.shape[-1]
  onehot = np.eye(v)[labels]
  sy = (s * onehot).sum(axis=-1, keepdims=True)
  g = z / (total + v * smoothing) - onehot * z / (sy + smoothing)
  return g / labels.size


def born_ce(z, labels, smoothing=0.0):
  s = np.abs(z) ** 2
  total = s.sum(axis=-1)
  sy = np.take_along_axis(s, labels[..., None], axis=-1)[..., 0]
  return np.mean(-np.log((sy + smoothing) / (total + z.shape[-1] * smoothing)))


def causal_fourier_direct(h):
  """``N^{-1/2} Σ_{j<=k} h_j ω^{jk}`` along the last axis, complex128."""
  n = h.shape[-1]
  j = np.arange(n)
  table = np.exp(-2j * np.pi * np.outer(j, j) / n) * np.tril(np.ones((n, n)))
  return h @ table.T / math.sqrt(n)


# ---------------------------------------------------------------------------
# ComplexFormer: transcription of the official forward (one head, float64).


def complexformer_logits(q, k, delta, phase_bias, base=10000.0, eps=1e-9):
  """``(T, H)`` real q, k of one head; returns ``(T, S)`` logits.

  Follows ``complex_attention.py``: split halves, modulus and atan2 phase,
  ``Adapt = delta * (θq_m - θk_n) + b``, ``ΔP = (m - n) g``.
  """
  h = q.shape[-1] // 2
  rq = np.sqrt(q[:, :h] ** 2 + q[:, h:] ** 2 + eps)
  rk = np.sqrt(k[:, :h] ** 2 + k[:, h:] ** 2 + eps)
  tq = np.arctan2(q[:, h:], q[:, :h])
  tk = np.arctan2(k[:, h:], k[:, :h])
  g = base ** (-2.0 * np.arange(h) / q.shape[-1])
  m = np.arange(q.shape[0])[:, None, None]
  n = np.arange(k.shape[0])[None, :, None]
  adapt = delta * (tq[:, None] - tk[None]) + phase_bias
  return np.sum(rq[:, None] * rk[None] * np.cos(adapt + (m - n) * g), axis=-1)


# ---------------------------------------------------------------------------
# Phase-Coherent Transformer: ``ComplexMultiHeadSigmoidAttention`` forward.


def pct_attention(q, k, v, gate_bias, causal, eps=1e-8):
  """One head: ``(T, H)`` complex q, k, v; sigmoid gate, masked s = -1e9."""
  qn = q / np.sqrt((np.abs(q) ** 2).sum(-1, keepdims=True) + eps)
  kn = k / np.sqrt((np.abs(k) ** 2).sum(-1, keepdims=True) + eps)
  sim = np.real(np.conj(qn) @ kn.T) * math.sqrt(q.shape[-1])
  if causal:
    sim = np.where(np.tril(np.ones(sim.shape, bool)), sim, -1e9)
  a = 0.5 * (1.0 + np.tanh(0.5 * (sim + gate_bias)))  # Overflow-free.
  return a @ v


# ---------------------------------------------------------------------------
# Fairy2i PhaseQuantSTE (forward).


def phase_quant(w):
  """One stage of ``PhaseQuantSTE.forward`` on a complex128 tensor."""
  phase = np.angle(w)
  q = math.pi / 4
  real_pos = (phase >= -q) & (phase < q)
  real_neg = (phase >= 3 * q) | (phase < -3 * q)
  imag_pos = (phase >= q) & (phase < 3 * q)
  imag_neg = (phase >= -3 * q) & (phase < -q)
  mask_real, mask_imag = real_pos | real_neg, imag_pos | imag_neg
  s_re = np.abs(w.real[mask_real]).mean() if mask_real.any() else 0.0
  s_im = np.abs(w.imag[mask_imag]).mean() if mask_imag.any() else 0.0
  s_re, s_im = max(s_re, 1e-6), max(s_im, 1e-6)
  qr = np.zeros(w.shape)
  qi = np.zeros(w.shape)
  qr[real_pos], qr[real_neg] = 1.0, -1.0
  qi[imag_pos], qi[imag_neg] = 1.0, -1.0
  return qr * s_re + 1j * qi * s_im


def phase_quant_stages(w, stages):
  """``PhaseQuantSTE_V{stages}``: residual stages."""
  total = np.zeros_like(w)
  for _ in range(stages):
    total = total + phase_quant(w - total)
  return total


def _golden() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(20251202)
  w = rng.normal(size=(6, 10)) + 1j * rng.normal(size=(6, 10))
  return {
    "w": w,
    "w1": phase_quant_stages(w, 1),
    "w2": phase_quant_stages(w, 2),
    "w3": phase_quant_stages(w, 3),
  }


if __name__ == "__main__":
  out = pathlib.Path(__file__).with_name("complex_golden.npz")
  np.savez(out, **_golden())
  print(f"wrote {out}")
