"""Fuzz builders of the smaller families (table: tests/fuzz/_builders.py).

`jaxnorm.residual`, `rl`, `quant`, `looped`, `analysis`, `graph` and
`depth_metrics`.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxnorm import fused_norms, norms
from tests.fuzz import _cases
from tests.fuzz._cases import case, first

# ---------------------------------------------------------------------------
# jaxnorm.residual


def _branch(h):
  """A sublayer: ``tanh``, shape and dtype preserving."""
  return jax.numpy.tanh(h)


def _stream(d, f, *, n=4):
  """A stream state ``(..., n, d)``, one stream if ``d.one``."""
  shape = d.shape()
  return f.data(
    shape[:-2] + (1 if d.one else n, shape[-1])
    if d.rank > 1
    else (n, shape[-1])
  )


def _wiring(kind):
  def build(d, f):
    x = f.data(d.shape())
    args = {
      "pre": (_branch, norms.rms_norm),
      "post": (_branch, norms.rms_norm),
      "sandwich": (_branch, norms.rms_norm, norms.rms_norm),
      "scaled_post": (_branch, norms.rms_norm),
    }[kind]
    kwargs = {"alpha": 2.0} if kind == "scaled_post" else {}
    if kind in ("pre", "sandwich"):
      kwargs["layer_index"] = d.rank
    return case(x, *args, **kwargs, expect=(x.shape, d.out))

  return build


def _scaled_residual(d, f):
  x = f.data(d.shape())
  return case(
    x,
    _branch,
    f.param(x.shape[-1:]),
    norm=norms.rms_norm,
    expect=(x.shape, d.out),
  )


def _fused_pre_norm(d, f):
  x = f.data(d.shape())
  return case(
    x,
    [_branch, _branch],
    norms.rms_norm,
    [fused_norms.add_rms_norm],
    expect=(x.shape, d.out),
  )


def _attn_res(weights):
  def build(d, f):
    src = f.data(d.shape())
    m, c = src.shape[0], src.shape[-1]
    shape = src.shape[:-1] if weights else src.shape[1:]
    return case(
      src,
      f.normal((c,)),
      key_scale=f.param((c,)),
      mask=np.arange(m) < max(m - 1, 1),
      expect=(shape, d.compute if weights else d.out),
    )

  return build


def _expand_streams(d, f):
  x = f.data(d.shape())
  return case(
    x, 3, expect=(x.shape[:-1] + (3, x.shape[-1]), _cases.canonical(d.dtype))
  )


def _reduce_streams(d, f):
  h = _stream(d, f)
  return case(
    h,
    readout="mean" if d.rank % 2 else "sum",
    expect=(h.shape[:-2] + h.shape[-1:], d.out),
  )


def _hyper_connection(d, f):
  h = _stream(d, f)
  n = h.shape[-2]
  return case(
    h,
    _branch,
    h_pre=f.param((n,)),
    h_post=f.param((n,)),
    h_res=f.param((n, n)),
    expect=(h.shape, d.out),
  )


def _hc_maps(d, f):
  h = _stream(d, f)
  n, c = h.shape[-2:]
  return case(
    h,
    static_alpha=f.param((n, n + 1)),
    static_beta=f.param((n,)),
    dynamic_alpha=0.1 * f.normal((c, n + 1)),
    dynamic_beta=0.1 * f.normal((c,)),
    norm_scale=f.param((c,)),
    expect=(h.shape[:-1], d.compute),
    pick=first,
  )


def _mhc_maps(d, f):
  h = _stream(d, f)
  n, c = h.shape[-2:]
  residual = "quaternion" if n == 4 and d.rank % 2 else "sinkhorn"
  res = 8 if residual == "quaternion" else n * n
  return case(
    h,
    phi_pre=0.1 * f.normal((n * c, n)),
    phi_post=0.1 * f.normal((n * c, n)),
    phi_res=0.1 * f.normal((n * c, res)),
    b_pre=f.normal((n,)),
    b_post=f.normal((n,)),
    b_res=f.normal((8,) if residual == "quaternion" else (n, n)),
    residual=residual,
    num_iters=4,
    expect=(h.shape[:-1], d.compute),
    pick=first,
  )


def _quaternion_rotation(d, f):
  p = f.data(d.shape()[:-1] + (4,))
  return case(p, f.normal(p.shape, d.dtype), expect=(p.shape + (4,), d.compute))


def _sinkhorn_knopp(d, f):
  n = 1 if d.one else 3
  x = f.data(d.shape()[:-2] + (n, n) if d.rank > 2 else (n, n))
  direct = d.rank % 2 == 1
  # The direct form needs its eps guard: exp of logits 1e4 apart underflows
  # whole rows to 0, and 0 / 0 is the documented reason for eps.
  return case(
    x,
    num_iters=4,
    log_domain=not direct,
    eps=1e-9 if direct else 0.0,
    expect=(x.shape, d.out),
  )


RESIDUAL = {
  "residual.attn_res": _cases.Spec(_attn_res(False), ranks=(2, 3, 4)),
  "residual.attn_res_weights": _cases.Spec(_attn_res(True), ranks=(2, 3, 4)),
  "residual.deepnorm_alpha": _cases.Spec(_cases.scalars(12), **_cases.STATIC),
  "residual.deepnorm_beta": _cases.Spec(_cases.scalars(12), **_cases.STATIC),
  "residual.depth_scale": _cases.Spec(
    _cases.scalars(24, 12, 0.5), **_cases.STATIC
  ),
  "residual.depth_adam_scales": _cases.Spec(
    _cases.scalars(48, 24, 0.5, pick=_cases.first), **_cases.STATIC
  ),
  "residual.keel_alpha": _cases.Spec(_cases.scalars(12), **_cases.STATIC),
  "residual.residual_scale": _cases.Spec(
    _cases.scalars(4, "1/sqrt(n)"), **_cases.STATIC
  ),
  "residual.hc_static_init": _cases.Spec(
    _cases.scalars(4, 2, expect=((4, 5), np.float32), pick=first),
    **_cases.STATIC,
  ),
  "residual.mhc_static_init": _cases.Spec(
    _cases.scalars(4, layer_index=1, expect=((4,), np.float32), pick=first),
    **_cases.STATIC,
  ),
  "residual.expand_streams": _cases.Spec(_expand_streams),
  "residual.reduce_streams": _cases.Spec(_reduce_streams, ranks=(2, 3, 4)),
  "residual.pre_norm": _cases.Spec(_wiring("pre")),
  "residual.post_norm": _cases.Spec(_wiring("post")),
  "residual.sandwich_norm": _cases.Spec(_wiring("sandwich")),
  "residual.scaled_post_norm": _cases.Spec(_wiring("scaled_post")),
  "residual.scaled_residual": _cases.Spec(_scaled_residual),
  "residual.fused_pre_norm": _cases.Spec(_fused_pre_norm),
  "residual.hyper_connection": _cases.Spec(_hyper_connection, ranks=(2, 3, 4)),
  "residual.hc_maps": _cases.Spec(
    _hc_maps, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "residual.mhc_maps": _cases.Spec(
    _mhc_maps, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "residual.quaternion_rotation": _cases.Spec(
    _quaternion_rotation, kinds=_cases.SQUARABLE
  ),
  "residual.sinkhorn_knopp": _cases.Spec(_sinkhorn_knopp, ranks=(2, 3, 4)),
}

# ---------------------------------------------------------------------------
# jaxnorm.rl


def _log_probs(f, shape, dtype=None):
  """Log-probabilities (``<= 0``) of the kind."""
  return -np.abs(f.data(shape, dtype))


def _grpo_advantages(d, f):
  r = f.data(d.shape())
  return case(r, expect=(r.shape, d.compute))


def _components(d, f):
  """Rewards ``(..., G, K)`` with ``K = 2`` components, ``G = 1`` if one."""
  shape = d.shape()
  g = 1 if d.one else shape[-1]
  return f.data(shape[:-1] + (g, 2) if d.rank > 1 else (g, 2))


def _corrgrpo_advantages(d, f):
  r = _components(d, f)
  return case(r, f.param((2,)), expect=(r.shape[:-1], d.compute))


def _gdpo_advantages(d, f):
  r = _components(d, f)
  return case(
    r,
    f.param((2,)),
    lengths=np.round(f.uniform(r.shape[:-1], 0.0, 4.0)).astype(np.float32),
    batch_normalization="correlation" if d.rank % 2 else "std",
    expect=(r.shape[:-1], d.compute),
  )


def _grpo_process_advantages(d, f):
  shape = d.shape()
  rewards = f.data(shape)
  steps = rewards.shape[-1]
  index = np.broadcast_to(np.arange(steps, dtype=np.int32) * 2, shape)
  return case(
    rewards,
    f.mask(shape),
    index,
    num_tokens=2 * steps,
    expect=(shape[:-1] + (2 * steps,), d.compute),
  )


def _grpo_policy_loss(d, f):
  t = 1 if d.one else 3
  logp = _log_probs(f, (2, t))
  return case(
    logp,
    _log_probs(f, (2, t), d.dtype),
    _log_probs(f, (2, t), d.dtype),
    f.data((2,) if d.rank % 2 else (2, t)),
    f.mask((2, t)) | (t == 1),
    expect=((), d.compute),
  )


def _kl_k3(d, f):
  logp = _log_probs(f, d.shape())
  return case(
    logp, _log_probs(f, logp.shape, d.dtype), expect=(logp.shape, d.compute)
  )


def _token_entropy(d, f):
  x = f.data(d.shape())
  return case(x, f.mask(x.shape[:-1]), expect=(x.shape[:-1], d.compute))


RL = {
  "rl.grpo_advantages": _cases.Spec(_grpo_advantages, kinds=_cases.SQUARABLE),
  "rl.corrgrpo_advantages": _cases.Spec(
    _corrgrpo_advantages, kinds=_cases.SQUARABLE
  ),
  "rl.gdpo_advantages": _cases.Spec(_gdpo_advantages, kinds=_cases.SQUARABLE),
  "rl.grpo_process_advantages": _cases.Spec(
    _grpo_process_advantages, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "rl.grpo_policy_loss": _cases.Spec(
    _grpo_policy_loss, ranks=(2, 3), kinds=_cases.BOUNDED
  ),
  "rl.kl_k3": _cases.Spec(_kl_k3, kinds=_cases.BOUNDED),
  "rl.token_entropy": _cases.Spec(_token_entropy),
}

# ---------------------------------------------------------------------------
# jaxnorm.quant


def _matmul(d, f):
  x = f.data(d.shape())
  return case(
    x, 0.1 * f.normal((x.shape[-1], 3)), expect=(x.shape[:-1] + (3,), d.out)
  )


def _absmax_quantize(d, f):
  x, _ = _cases.x_axis(d, f)
  return case(x, axis=d.axis, expect=(x.shape, np.int8), pick=first)


def _absmax_dequantize(d, f):
  shape = d.shape()
  q = np.round(f.uniform(shape, -127, 127)).astype(np.int8)
  absmax = np.abs(f.data(shape[:-1] + (1,)))
  return case(q, absmax, expect=(shape, d.out))


def _outlier_columns(d, f):
  x = f.data(d.shape())
  return case(x, expect=(x.shape[-1:], np.bool_))


QUANT = {
  "quant.absmax_quantize": _cases.Spec(_absmax_quantize, axis=True),
  "quant.absmax_dequantize": _cases.Spec(_absmax_dequantize),
  "quant.int8_vectorwise_matmul": _cases.Spec(_matmul),
  "quant.int8_mixed_matmul": _cases.Spec(_matmul),
  "quant.outlier_columns": _cases.Spec(_outlier_columns),
}

# ---------------------------------------------------------------------------
# jaxnorm.looped


def _linear_self_attention(d, f):
  z = f.data(d.shape()[:-2] + (4, 3) if d.rank > 2 else (4, 3))
  return case(
    z,
    0.3 * f.normal((4, 4)),
    0.3 * f.normal((4, 4)),
    n=2,
    expect=(z.shape, d.compute),
  )


def _looped_lsa(d, f):
  shape = d.shape()
  x = f.data(shape[:-2] + (3, 2) if d.rank > 2 else (3, 2))
  return case(
    x,
    f.normal(x.shape[:-2] + (2,), d.dtype),
    0.5 * f.normal((4, 4)),
    0.5 * f.normal((4, 4)),
    num_loops=2,
    residual=d.rank % 2 == 1,
    expect=(x.shape[:-2] + (2, 2), d.compute),
  )


def _power_iteration(d, f):
  s = f.data(d.shape()[:-2] + (3, 3) if d.rank > 2 else (3, 3))
  return case(
    s,
    f.normal(s.shape[:-1], d.dtype),
    2,
    expect=(s.shape[:-2] + (2, 3), d.compute),
  )


LOOPED = {
  "looped.linear_self_attention": _cases.Spec(
    _linear_self_attention, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "looped.looped_lsa": _cases.Spec(
    _looped_lsa, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "looped.power_iteration": _cases.Spec(
    _power_iteration, ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "looped.power_construction": _cases.Spec(
    _cases.scalars(2, expect=((4, 4), np.float32), pick=first), **_cases.STATIC
  ),
}

# ---------------------------------------------------------------------------
# jaxnorm.analysis


def _centered_row_normalize(d, f):
  h = f.data(d.shape())
  return case(h, eps=1e-6, expect=(h.shape, d.compute))


def _matrix_score(**kwargs):
  def build(d, f):
    h = f.data(d.shape())
    return case(h, eps=1e-6, **kwargs, expect=(h.shape[:-2], d.compute))

  return build


def _dual_encoder_gauge_fix(d, f):
  x = f.data((1 if d.one else 4, 3))
  return case(
    x,
    f.normal((5, 3), d.dtype),
    balance=d.rank % 2 == 1,
    expect=(x.shape, d.compute),
    pick=first,
  )


ANALYSIS = {
  "analysis.centered_row_normalize": _cases.Spec(
    _centered_row_normalize, ranks=(2, 3, 4)
  ),
  "analysis.matrix_nuclear_norm": _cases.Spec(
    _matrix_score(), ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "analysis.matrix_entropy": _cases.Spec(
    _matrix_score(), ranks=(2, 3, 4), kinds=_cases.SQUARABLE
  ),
  "analysis.dual_encoder_gauge_fix": _cases.Spec(
    _dual_encoder_gauge_fix, ranks=(2,), kinds=_cases.SQUARABLE
  ),
}

# ---------------------------------------------------------------------------
# jaxnorm.graph


def _adjacency(f, b=2, n=3):
  a = f.uniform((b, n, n)) > 0.4
  return a | np.eye(n, dtype=bool)


def _laplacian_pe(d, f):
  # The documented domain: a symmetric 0/1 adjacency (boolean if d.one,
  # else numeric in the drawn dtype); the value kind sets the edges.
  z = np.abs(f.data(d.shape()[:-2] + (4, 4) if d.rank > 2 else (4, 4)))
  edges = np.maximum(z, np.swapaxes(z, -1, -2)) > 0.5
  a = edges if d.one else edges.astype(z.dtype)
  return case(a, 2, expect=(a.shape[:-1] + (2,), d.compute))


def _random_sign_flip(d, f):
  pe = f.data(d.shape())
  return case(pe, jax.random.key(0), per_graph=d.one, expect=(pe.shape, d.out))


def _graph_attention(d, f):
  q, k, v = (f.data((2, 3, 2, 4)) for _ in range(3))
  edge = f.data((2, 3, 3, 2, 4)) if d.one else None
  return case(
    q,
    k,
    v,
    _adjacency(f),
    edge=edge,
    expect=(q.shape, d.out),
    pick=first if d.one else None,
  )


def _class_balanced_weights(d, f):
  shape = d.shape()
  return case(
    _cases.labels(f, shape),
    3,
    node_mask=f.mask(shape),
    expect=((3,), np.float32),
  )


def _classification(expect, **kwargs):
  def build(d, f):
    logits = f.data(d.shape()[:-1] + (3,))
    labels = _cases.labels(f, logits.shape[:-1])
    return case(
      logits,
      labels,
      node_mask=f.mask(labels.shape),
      **kwargs,
      expect=expect,
    )

  return build


def _weighted_accuracy_from_confusion(d, f):
  c = np.abs(f.data(d.shape()[:-2] + (3, 3) if d.rank > 2 else (3, 3)))
  return case(c, expect=(c.shape[:-2], np.float32))


GRAPH = {
  "graph.laplacian_pe": _cases.Spec(_laplacian_pe, ranks=(2, 3)),
  "graph.random_sign_flip": _cases.Spec(_random_sign_flip, ranks=(2, 3, 4)),
  "graph.graph_attention": _cases.Spec(
    _graph_attention, ranks=(4,), kinds=_cases.BOUNDED
  ),
  "graph.class_balanced_weights": _cases.Spec(
    _class_balanced_weights, dtypes=("int32",), kinds=("normal",)
  ),
  "graph.class_balanced_cross_entropy": _cases.Spec(
    _classification(((), np.float32)), ranks=(2, 3, 4)
  ),
  "graph.confusion_matrix": _cases.Spec(
    _classification(((3, 3), np.float32)), ranks=(2, 3, 4)
  ),
  "graph.weighted_class_accuracy": _cases.Spec(
    _classification(((), np.float32)), ranks=(2, 3, 4)
  ),
  "graph.weighted_accuracy_from_confusion": _cases.Spec(
    _weighted_accuracy_from_confusion, ranks=(2, 3, 4)
  ),
}

# ---------------------------------------------------------------------------
# jaxnorm.depth_metrics


def _states(d, f):
  """Hidden states ``(L + 1, *tokens, d)``: 4 depths, ``d.rank - 1`` axes."""
  shape = d.shape()
  return f.data((4,) + shape[1:])


def _angular_distance_matrix(d, f):
  hs = _states(d, f)
  return case(hs, mask=f.mask(hs.shape[1:-1]), expect=((4, 4), d.compute))


def _causal_effect(d, f):
  hs = _states(d, f)
  return case(
    hs,
    f.normal(hs.shape, d.dtype),
    1,
    mask=f.mask(hs.shape[1:-1]),
    expect=((3,), d.compute),
  )


def _fit_linear_layer(d, f):
  x = f.data(d.shape())
  return case(
    x,
    f.normal(x.shape[:-1] + (3,), d.dtype),
    mask=f.mask(x.shape[:-1]) | (x.ndim == 1),
    expect=((x.shape[-1], 3), d.compute),
    pick=first,
  )


def _permutation_score(d, f):
  n = 1 if d.one else 3
  swapped = _cases.positive(f, (n, n))
  return case(
    _cases.positive(f, ()),
    swapped,
    expect=((n, n), d.compute),
    pick=first,
  )


def _linear_usefulness(d, f):
  n = 1 if d.one else 3
  return case(
    _cases.positive(f, ()),
    _cases.positive(f, (n,)),
    expect=((n,), d.compute),
    pick=first,
  )


DEPTH_METRICS = {
  "depth_metrics.angular_distance_matrix": _cases.Spec(
    _angular_distance_matrix, ranks=(3, 4), kinds=_cases.SQUARABLE
  ),
  "depth_metrics.causal_effect": _cases.Spec(
    _causal_effect, ranks=(3, 4), kinds=_cases.SQUARABLE
  ),
  "depth_metrics.fit_linear_layer": _cases.Spec(
    _fit_linear_layer, ranks=(2, 3), kinds=_cases.SQUARABLE
  ),
  "depth_metrics.permutation_score": _cases.Spec(
    _permutation_score, ranks=(2,)
  ),
  "depth_metrics.linear_usefulness": _cases.Spec(
    _linear_usefulness, ranks=(2,)
  ),
}
