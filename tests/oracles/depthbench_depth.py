"""NumPy float64 transcription of DepthBench's depth-muP, CompleteP and KEEL.

Sources, read (not run) in the official code, equations carried over:

* ``keyu-wang-2002/DepthBench`` (an OLMo-core fork):

  - ``examples/pretrain_preln_mup.py`` at commit
    aba1f65206d65db12d5a86df6b9f6f88fdb657c3: ``PARAMETERIZATION_TO_ALPHA``
    (``depth_mup`` 0.5, ``completep`` 1.0), ``--base-depth`` (default 24)
    and ``apply_depth_only_scaling``: ``m = n_layers / base_depth``; unless
    both factors are 1 (``math.isclose``, ``abs_tol=1e-12``), one
    ``OptimGroupOverride(params=["blocks.*"], opts={"lr": lr * m ** (alpha
    - 1), "eps": eps * m ** -alpha})``; every other parameter keeps the
    optimizer's ``lr`` and ``eps``;
  - ``pretrain/OLMo-core/src/olmo_core/nn/transformer/config.py`` at commit
    2a9d668a26497c51892f76723168561d391fe019: ``TransformerBlockConfig
    .build`` (``DepthScaledTransformerBlock`` with
    ``residual_scaling_alpha`` 0.5 / 1.0) and ``TransformerConfig
    .llama_like`` (one ``layer_norm = LayerNormConfig(name=rms,
    eps=layer_norm_eps, bias=False)`` for every block norm and the LM
    head's norm);
  - ``pretrain/OLMo-core/src/olmo_core/nn/transformer/block.py``:
    ``DepthScaledTransformerBlock`` (``(n_layers / base_depth) **
    -alpha`` as the ``alpha`` of both residual streams; version stored with
    the config.py above) and ``KeelTransformerBlock`` (commit
    183c4d1fa3a44abfcd9e097223d4466521a4f60d: every norm is
    ``layer_norm.build(d_model)``; block 0's attention is ``x + attn(
    norm(x))``, its FFN ``post_norm(h + ffn(norm(h)))``; later sublayers
    ``post_norm(2 n_layers x + F(norm(x)))``);
  - OLMo-core ``nn/residual_stream.py`` ``ResidualStream.forward``:
    ``torch.add(residual, dropout(x), alpha=alpha)``;
  - ``configs/llama_350M_24l_keel.json``: ``rms_norm_eps`` 1e-6 (the
    ``layer_norm_eps`` of the KEEL runs).

* CompleteP's official minimal code, ``EleutherAI/nanoGPT-mup`` (branch
  ``completep``), ``model.py`` at commit
  3904404337aba284322696123bbed0c378c43774: ``Block.residual_scaling =
  1 / depth_multiplier ** depth_alpha_exp`` and ``configure_optimizers``'
  groups (embeddings and final LayerNorm: ``lr_scale`` 1, eps times the
  width factor; hidden LayerNorms, weights and biases: ``lr_scale``
  ``depth_multiplier ** (depth_alpha_exp - 1)`` times the width factor of
  weights, eps times ``depth_multiplier ** -depth_alpha_exp``). At fixed
  width (``mup_width_multiplier = 1``) it is DepthBench's depth-only rule.

The optimizer step is PyTorch's ``torch.optim.AdamW`` (decay ``p -= lr *
wd * p`` first, then ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 -
b2^t) + eps)``), with each group's ``lr`` the group's ``initial_lr`` times
the schedule's factor: OLMo-core's scheduler sets ``group["lr"] =
get_lr(group["initial_lr"], step, max_steps)``, linear in ``initial_lr``
for warmup from 0 (``warmup_min_lr=0.0`` in DepthBench's
``pretrain_llama_base.py``).
"""

from __future__ import annotations

import fnmatch
import math

import numpy as np

PARAMETERIZATION_TO_ALPHA = {"depth_mup": 0.5, "completep": 1.0}
BASE_DEPTH = 24  # --base-depth default.
ADAMW_EPS = 1e-8  # AdamWConfig(eps=1e-8) in pretrain_llama_base.py.
RMS_NORM_EPS = 1e-6  # rms_norm_eps of the DepthBench model configs.


def residual_scale(n_layers, base_depth=BASE_DEPTH, alpha=0.5):
  """``DepthScaledTransformerBlock``'s alpha of both residual streams."""
  if base_depth <= 0:
    raise ValueError(base_depth)
  return (n_layers / base_depth) ** (-alpha)


def residual_stream(residual, x, alpha):
  """``ResidualStream.forward`` without dropout."""
  return np.asarray(residual, np.float64) + alpha * np.asarray(x, np.float64)


def rms_norm(x, weight=None, eps=RMS_NORM_EPS):
  """OLMo-core's ``RMSNorm`` (``bias=False``): ``x rsqrt(mean x^2 + eps) w``."""
  x = np.asarray(x, np.float64)
  y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
  return y if weight is None else y * np.asarray(weight, np.float64)


def depth_scaled_block(x, attention, feed_forward, norms, scale):
  """``TransformerBlock.forward`` with both residual alphas ``scale``."""
  attention_norm, feed_forward_norm = norms
  h = residual_stream(x, attention(attention_norm(x)), scale)
  return residual_stream(h, feed_forward(feed_forward_norm(h)), scale)


def keel_block(x, attention, feed_forward, norms, *, block_idx, n_layers):
  """``KeelTransformerBlock.forward`` (dropout off).

  ``norms`` are ``(attention_norm, post_attention_norm, feed_forward_norm,
  post_feed_forward_norm)``; block 0 has no ``post_attention_norm``.
  """
  attention_norm, post_attention_norm, ff_norm, post_ff_norm = norms
  alpha = float(2 * n_layers)
  attn_out = attention(attention_norm(x))
  if block_idx == 0:
    h = x + attn_out
  else:
    h = post_attention_norm(alpha * x + attn_out)
  mlp_out = feed_forward(ff_norm(h))
  if block_idx == 0:
    return post_ff_norm(h + mlp_out)
  return post_ff_norm(alpha * h + mlp_out)


def depth_only_group_overrides(
  n_layers, *, alpha, base_depth=BASE_DEPTH, lr, eps=ADAMW_EPS
):
  """``apply_depth_only_scaling``: ``[(patterns, opts)]``, empty at base."""
  depth_multiplier = n_layers / base_depth
  block_lr_scale = depth_multiplier ** (alpha - 1.0)
  block_eps_scale = depth_multiplier ** (-alpha)
  if math.isclose(
    block_lr_scale, 1.0, rel_tol=0.0, abs_tol=1e-12
  ) and math.isclose(block_eps_scale, 1.0, rel_tol=0.0, abs_tol=1e-12):
    return []
  return [
    (["blocks.*"], {"lr": lr * block_lr_scale, "eps": eps * block_eps_scale})
  ]


def param_group_options(names, overrides, *, lr, eps=ADAMW_EPS):
  """Each parameter's ``(lr, eps)``: the first override whose glob matches.

  OLMo-core's ``OptimConfig.build_groups`` matches ``fnmatch`` patterns
  against parameter names; unmatched parameters form the default group.
  """
  out = {}
  for name in names:
    opts = {"lr": lr, "eps": eps}
    for patterns, override in overrides:
      if any(fnmatch.fnmatch(name, p) for p in patterns):
        opts = {**opts, **override}
        break
    out[name] = (opts["lr"], opts["eps"])
  return out


def nanogpt_completep_options(
  names, *, depth_multiplier, depth_alpha_exp, lr, eps=ADAMW_EPS
):
  """``GPT.configure_optimizers`` with CompleteP on, at width multiplier 1.

  Returns each parameter's ``(lr, eps)``; ``lr`` is ``learning_rate *
  lr_scale`` (nanoGPT-mup's ``train.py`` multiplies each group's
  scheduled rate by its ``lr_scale``).
  """
  depth_lr_scaling = depth_multiplier ** (depth_alpha_exp - 1)
  width_lr_scaling = 1.0
  emb_unemb_adam_eps = eps * (1 / 1.0)
  hidden_adam_eps = eps * (1 / 1.0) * depth_multiplier ** (-depth_alpha_exp)
  out = {}
  for n in names:
    if n in ("transformer.wte.weight", "transformer.wpe.weight"):
      out[n] = (lr * 1.0, emb_unemb_adam_eps)
    elif ".ln_" in n and ".ln_f." not in n:
      out[n] = (lr * depth_lr_scaling, hidden_adam_eps)
    elif n.endswith(("c_attn.weight", "c_fc.weight", "c_proj.weight")):
      out[n] = (lr * width_lr_scaling * depth_lr_scaling, hidden_adam_eps)
    elif n.endswith(("c_attn.bias", "c_fc.bias", "c_proj.bias")):
      out[n] = (lr * depth_lr_scaling, hidden_adam_eps)
    elif ".ln_f." in n:
      out[n] = (lr * 1.0, emb_unemb_adam_eps)
    else:
      raise ValueError(f"Unhandled parameter {n}")
  return out


def adamw_step(p, g, m, v, t, *, lr, eps, wd, b1=0.9, b2=0.95):
  """One ``torch.optim.AdamW`` step (``t`` counts from 1), float64.

  Returns ``(p, m, v)``.
  """
  p, g = np.asarray(p, np.float64), np.asarray(g, np.float64)
  p = p * (1.0 - lr * wd)
  m = b1 * m + (1.0 - b1) * g
  v = b2 * v + (1.0 - b2) * g * g
  bias_correction1 = 1.0 - b1**t
  bias_correction2 = 1.0 - b2**t
  step_size = lr / bias_correction1
  denom = np.sqrt(v) / math.sqrt(bias_correction2) + eps
  return p - step_size * m / denom, m, v
