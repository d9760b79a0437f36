"""NumPy float64 forward of the jaxnorm decoder LM, written from the spec.

Independent of `jaxnorm.nn.models`: it reads the pure parameter tree
(`jaxnorm.nn.convert.lm_params`) and an `LMConfig`, and implements learned
positions, causal softmax attention (scale ``1/sqrt(H)``), the exact-GELU
MLP, and the norms LayerNorm, RMSNorm (eps inside the sqrt), CRMSNorm
(denominator ``d = width + 1``) and none, following
``../shared/specs/norms.md`` sections 1 and 2.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special


def _f64(x):
  return np.asarray(x, np.float64)


def _norm(x, tree, config):
  kw = dict(config.norm_kwargs)
  eps = kw.get("eps", 1e-6)
  if config.norm == "none":
    return x
  if config.norm == "layernorm":
    xc = x - x.mean(-1, keepdims=True)
    y = xc / np.sqrt((xc**2).mean(-1, keepdims=True) + eps)
  elif config.norm == "rmsnorm":
    y = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
  elif config.norm == "crmsnorm":
    d = x.shape[-1] + 1
    ms = ((x**2).sum(-1, keepdims=True) + x.sum(-1, keepdims=True) ** 2) / d
    y = x / np.sqrt(ms + eps)
  else:
    raise NotImplementedError(config.norm)
  if "scale" in tree:
    y = y * (_f64(tree["scale"]) + kw.get("scale_offset", 0.0))
  if "bias" in tree:
    y = y + _f64(tree["bias"])
  return y


def _center(x):
  return x - x.mean(-1, keepdims=True)


def _attention(x, p):
  q = np.einsum("btd,dnh->btnh", x, _f64(p["q_kernel"]))
  k = np.einsum("btd,dnh->btnh", x, _f64(p["k_kernel"]))
  v = np.einsum("btd,dnh->btnh", x, _f64(p["v_kernel"]))
  if "q_bias" in p:
    q, k, v = (
      q + _f64(p["q_bias"]),
      k + _f64(p["k_bias"]),
      v + _f64(p["v_bias"]),
    )
  t, h = x.shape[1], q.shape[-1]
  logits = np.einsum("bqnh,bknh->bnqk", q, k) / math.sqrt(h)
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  o = np.einsum("bnqk,bknh->bqnh", w, v)
  y = np.einsum("btnh,nhd->btd", o, _f64(p["out_kernel"]))
  if "out_bias" in p:
    y = y + _f64(p["out_bias"])
  return y


def _dense(x, p):
  y = x @ _f64(p["kernel"])
  return y + _f64(p["bias"]) if "bias" in p else y


def _mlp(x, p):
  h = _dense(x, p["up"])
  h = 0.5 * h * (1.0 + special.erf(h / math.sqrt(2.0)))
  return _dense(h, p["down"])


def lm_logits(params, config, tokens):
  """Logits ``(B, T, V)`` in float64 (gelu, softmax, learned/no positions)."""
  assert config.activation == "gelu" and config.attention == "softmax"
  assert config.positional in ("learned", "none")
  tokens = np.asarray(tokens)
  x = _f64(params["embed"])[tokens]
  if config.positional == "learned":
    x = x + _f64(params["pos"])[None, : tokens.shape[1]]
  if config.zero_mean_writers:
    x = _center(x)
  net = params["net"]
  for j in range(2 * config.depth):
    block = net["blocks"][j]
    if config.zero_mean_writers:
      block = block["sublayer"]
    norm = net.get("steps", {}).get(j, {}).get("norm", {})
    h = _norm(x, norm, config)
    f = _attention(h, block) if j % 2 == 0 else _mlp(h, block)
    x = x + (_center(f) if config.zero_mean_writers else f)
  h = _norm(x, params.get("final_norm", {}), config)
  if config.tie_embeddings:
    return h @ _f64(params["embed"]).T
  return _dense(h, params["head"])


def stream_means(params, config, tokens):
  """Max |mean_d(x)| of the stream after the embedding and every sublayer."""
  tokens = np.asarray(tokens)
  x = _f64(params["embed"])[tokens]
  if config.positional == "learned":
    x = x + _f64(params["pos"])[None, : tokens.shape[1]]
  worst = [np.abs(x.mean(-1)).max()]
  net = params["net"]
  for j in range(2 * config.depth):
    block = net["blocks"][j]
    h = _norm(x, net.get("steps", {}).get(j, {}).get("norm", {}), config)
    x = x + (_attention(h, block) if j % 2 == 0 else _mlp(h, block))
    worst.append(np.abs(x.mean(-1)).max())
  return float(max(worst))
