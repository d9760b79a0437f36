"""NumPy complex128 transcriptions of the official CNet and PCT code.

Independent of `jaxnorm`: loops and sums written as the official code
writes them, used by tests/cplx/test_cnet.py and tests/cplx/test_official.py.

Sources (read through the stored snapshots; no code copied, equations
carried over):

* CNet, ``crasmarum/CNet`` (C++/CUDA):
  ``impl/pad.h`` and ``impl/pool.h`` at
  ``866b8d1a2ad0f793f76ba96795e24b2f9a18acea``; ``impl/ft.h``
  (``FourierTrans``: ``FastFourierTransform::transform`` then ``/sqrt(N)``,
  ``UnityRoots`` with ``exp(-2 pi i v / N)``), ``impl/hadamard.h`` and
  ``impl/utils.h`` (``inverseTransform(len, re, im) = transform(len, im,
  re)``) at ``6e292693bb8cce4d5c96cd618e98be006f7db18a``;
  ``InverseFourierTrans`` as ``tests/gputests.h`` describes it
  (``inverseTransform`` then ``1/sqrt(N)``); the LM's ``buildLM`` in
  ``examples/gollm.cpp`` / ``examples/dp_shakespeare.cpp`` at
  ``07748ae17fc9d09ce35208a251946cb4c1ab2435`` with ``impl/tokennorm.h``,
  ``impl/tokenwise.h``, ``impl/rotary.h``, ``impl/bornattn.h``,
  ``impl/seqcrossent.h`` and ``CGelu`` (``impl/relu.h``).
* Phase-Coherent Transformer, ``leohio/phase-coherent-transformer-r-d`` at
  ``aa228b76c47f10697f964a9b2782e367a32774e5``:
  ``code/complex_nn_experiment/transformer.py`` (``TransformerCell`` with
  ``cell="complex_sigmoid"``, ``ComplexMultiHeadSigmoidAttention``),
  ``baselines/lucidrains_cvt/complex_valued_transformer.py``
  (``ComplexRMSNorm``, ``ModReLU``, ``ComplexFeedForward``,
  ``RotaryEmbedding``), ``screening.py`` (``complex_l2_normalize``).

CNet's backward passes use its convention: a layer receives ``(gO, gOb) =
(dL/dy, dL/dy*)`` and returns ``(dL/dx, dL/dx*)``.
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------
# CNet: FourierTrans, InverseFourierTrans, Hadamard, Pad, MeanPool.


def unity_roots(n):
  """``UnityRoots(N)``: ``root(v) = exp(-2 pi i v / N)``, index mod N."""
  v = np.arange(n)
  return np.cos(-2 * v * np.pi / n) + 1j * np.sin(-2 * v * np.pi / n)


def _dft(x):
  """``FastFourierTransform::transform``: ``X_p = sum_q x_q root(p q)``."""
  n = x.shape[-1]
  roots = unity_roots(n)
  out = np.zeros_like(x, dtype=np.complex128)
  for p in range(n):
    for q in range(n):
      out[..., p] += x[..., q] * roots[(p * q) % n]
  return out


def fourier_trans(x):
  """``FourierTrans::forward``: the DFT divided by ``sqrt(N)``."""
  return _dft(x) / math.sqrt(x.shape[-1])


def inverse_fourier_trans(x):
  """``inverseTransform(len, re, im) = transform(len, im, re)``, ``/sqrt N``.

  Swapping the real and imaginary arrays before and after the forward
  transform (``transform`` works in place on the swapped pair).
  """
  swapped = x.imag + 1j * x.real
  y = _dft(swapped)
  return (y.imag + 1j * y.real) / math.sqrt(x.shape[-1])


def hadamard(u, v):
  """``Hadamard::forward``: ``out_p = u_p v_p``."""
  return u * v


def pad_forward(taps, kernel_index, size):
  """``Pad::forward``: zeros of length ``size``, ``re[idx[k]] = in[k]``."""
  out = np.zeros((*taps.shape[:-1], size), np.complex128)
  for k in range(taps.shape[-1]):
    out[..., kernel_index[k]] = taps[..., k]
  return out


def pad_backward(g_o, g_ob, kernel_index):
  """``Pad::backward``: ``(dz, dz_star)`` of the taps: gathered at ``idx``."""
  idx = np.asarray(kernel_index)
  return g_o[..., idx], g_ob[..., idx]


def mean_pool_forward(x, out_size):
  """``MeanPool::forward``: ``out_p = sum_j x[p w + j] / w``, ``w = L/P``."""
  width = x.shape[-1] // out_size
  out = np.zeros((*x.shape[:-1], out_size), np.complex128)
  for p in range(out_size):
    acc = 0
    for j in range(width):
      acc = acc + x[..., p * width + j]
    out[..., p] = acc / width
  return out


def mean_pool_backward(g_o, g_ob, in_size):
  """``MeanPool::backward``: ``dz_i = dLdz(i // w) / w`` (and ``dz_star``)."""
  out_size = g_o.shape[-1]
  width = in_size // out_size
  dz = np.zeros((*g_o.shape[:-1], in_size), np.complex128)
  dzs = np.zeros_like(dz)
  for i in range(in_size):
    dz[..., i] = g_o[..., i // width] / width
    dzs[..., i] = g_ob[..., i // width] / width
  return dz, dzs


def circular_conv(x, k):
  """Direct circular convolution ``sum_m x_m k_{(n - m) mod N}``."""
  n = x.shape[-1]
  out = np.zeros(np.broadcast_shapes(x.shape, k.shape), np.complex128)
  for i in range(n):
    for m in range(n):
      out[..., i] += x[..., m] * k[..., (i - m) % n]
  return out


# ---------------------------------------------------------------------------
# CNet language model (buildLM with -born -rope -token_norm), one sequence.

GELU_SCALING_FACTOR = math.sqrt(2.0 / math.pi)


def cgelu(z):
  """``CGelu``: the tanh GELU on the real and imaginary parts."""

  def gelu(t):
    return (
      0.5 * t * (1.0 + np.tanh(GELU_SCALING_FACTOR * (t + 0.044715 * t**3)))
    )

  return gelu(z.real) + 1j * gelu(z.imag)


def token_norm(x, eps=1e-5):
  """``TokenNorm(N, d)``: ``x / sqrt(sum |x|^2 / d + eps)`` per token."""
  d = x.shape[-1]
  s = (x.real**2 + x.imag**2).sum(-1, keepdims=True)
  return x / np.sqrt(s / d + eps)


def tokenwise_linear(x, w):
  """``TokenwiseLinear``: ``out(t, r) = sum_c x(t, c) W(r, c)``, W (out, in)."""
  return np.einsum("tc,rc->tr", x, w)


def rotary_embed(x, base=10000.0):
  """``RotaryEmbed(N, d)``: ``x[t, dd] exp(i base^(-dd/d) t)``."""
  n, d = x.shape
  t = np.arange(n)[:, None]
  theta = base ** (-np.arange(d)[None, :] / d)
  return x * np.exp(1j * theta * t)


def born_attention(q, k, v, causal=True):
  """``BornAttention`` forward, single head ``(N, d)``."""
  n = q.shape[0]
  out = np.zeros_like(v, dtype=np.complex128)
  for i in range(n):
    mhi = i if causal else n - 1
    c = np.array([np.sum(q[i] * np.conj(k[m])) for m in range(mhi + 1)])
    s = c.real**2 + c.imag**2
    total = s.sum()
    a = s / total if total > 0 else np.zeros_like(s)
    out[i] = (a[:, None] * v[: mhi + 1]).sum(0)
  return out


def cnet_lm_amplitudes(tokens, params):
  """``buildLM`` (born, rope, token_norm) on ``tokens (N,)``: ``(N, V)``.

  ``params``: ``emb (V, E)``, ``pos (N, E)``, ``blocks`` (a list of dicts
  ``wq, wk, wv (dh, E)``, ``wo (E, dh)``, ``w1 (4E, E)``, ``w2 (E, 4E)``,
  CNet's ``W(r, c)`` layout: output row ``r``, input column ``c``) and
  ``head (V, E)``.
  """
  x = params["emb"][tokens] + params["pos"][: len(tokens)]
  for b in params["blocks"]:
    pre = cgelu(token_norm(x))
    q = rotary_embed(tokenwise_linear(pre, b["wq"]))
    k = rotary_embed(tokenwise_linear(pre, b["wk"]))
    v = tokenwise_linear(pre, b["wv"])
    mix = tokenwise_linear(born_attention(q, k, v), b["wo"])
    n0 = cgelu(x + mix)
    f2 = tokenwise_linear(
      cgelu(tokenwise_linear(token_norm(n0), b["w1"])), b["w2"]
    )
    x = cgelu(n0 + f2)
  return tokenwise_linear(token_norm(x), params["head"])


def sequence_cross_entropy(z, targets):
  """``SequenceCrossEntropy::loss``: mean of ``-log |z_t|^2 / ||z||^2``."""
  sq = (z.real**2 + z.imag**2).sum(-1)
  sq = np.where(sq <= 1e-15, 1e-15, sq)
  p = (np.abs(z[np.arange(len(targets)), targets]) ** 2) / sq
  return float(np.mean(-np.log(np.maximum(p, 1e-15))))


# ---------------------------------------------------------------------------
# Phase-Coherent Transformer: TransformerCell(cell="complex_sigmoid").


def pct_rms_norm(x, gamma):
  """The repository's ``ComplexRMSNorm``: ``x / ||x|| * gamma * d^-1/2``."""
  d = x.shape[-1]
  denom = np.sqrt(
    np.maximum((np.conj(x) * x).real.sum(-1, keepdims=True), 1e-12)
  )
  return (x / denom) * gamma * d**-0.5


def complex_l2_normalize(x, eps=1e-8):
  """``screening.complex_l2_normalize``: ``x / sqrt(sum |x|^2 + eps)``."""
  return x / np.sqrt((np.conj(x) * x).real.sum(-1, keepdims=True) + eps)


def mod_relu(x, bias, power=2):
  """The PCT's ``ModReLU``: ``relu(|x| + b)^p exp(i angle(x))``, scalar b."""
  return np.maximum(np.abs(x) + bias, 0.0) ** power * np.exp(1j * np.angle(x))


def pct_lm_logits(tokens, params, *, heads, dim_head, causal=True):
  """``TransformerCell.forward`` on ``tokens (N,)``: real ``(N, V)``.

  ``params`` in PyTorch layout (``nn.Linear.weight`` is ``(out, in)``,
  ``y = x W^T + b``): ``embed (V, D)``; ``layers``: dicts ``attn_gamma``,
  ``to_qkv (3 h d, D)``, ``attn_bias`` (scalar), ``to_out (D, h d)``,
  ``ffn_gamma``, ``ff1_w (4D, D)``, ``ff1_b``, ``modrelu_b`` (scalar),
  ``ff2_w (D, 4D)``, ``ff2_b``; ``final_gamma``; ``logits_w (V, 2D)``,
  ``logits_b``.
  """
  x = params["embed"][tokens]
  n = len(tokens)
  inv_freq = 1.0 / (10000.0 ** (np.arange(dim_head) / dim_head))
  rope = np.exp(1j * np.einsum("i,j->ij", np.arange(n, dtype=float), inv_freq))
  for layer in params["layers"]:
    normed = pct_rms_norm(x, layer["attn_gamma"])
    qkv = normed @ layer["to_qkv"].T
    q, k, v = np.split(qkv, 3, axis=-1)
    # "b n (h d) -> b h n d"
    q, k, v = (
      t.reshape(n, heads, dim_head).transpose(1, 0, 2) for t in (q, k, v)
    )
    q, k = q * rope, k * rope
    qb, kb = complex_l2_normalize(q), complex_l2_normalize(k)
    sim = np.einsum("hid,hjd->hij", np.conj(qb), kb).real * dim_head**0.5
    if causal:
      sim = np.where(np.triu(np.ones((n, n), bool), 1), -1e9, sim)
    attn = 0.5 * (1.0 + np.tanh(0.5 * (sim + layer["attn_bias"])))  # sigmoid
    out = np.einsum("hij,hjd->hid", attn, v).transpose(1, 0, 2).reshape(n, -1)
    x = x + out @ layer["to_out"].T
    h = pct_rms_norm(x, layer["ffn_gamma"]) @ layer["ff1_w"].T + layer["ff1_b"]
    h = mod_relu(h, layer["modrelu_b"])
    x = x + h @ layer["ff2_w"].T + layer["ff2_b"]
  x = pct_rms_norm(x, params["final_gamma"])
  x_real = np.concatenate([x.real, x.imag], axis=-1)
  return x_real @ params["logits_w"].T + params["logits_b"]
