"""Fuzz builders of `jaxnorm.attention` (table: tests/fuzz/_builders.py)."""

from __future__ import annotations

import numpy as np

from jaxnorm import attention
from tests.fuzz import _cases
from tests.fuzz._cases import case, first

# ---------------------------------------------------------------------------
# jaxnorm.attention


def _sdpa(**kwargs):
  def build(d, f):
    q, k, v = _cases.qkv(d, f)
    return case(q, k, v, **kwargs, expect=_cases.attention_out(q, v, d))

  return build


def _sink_attention(d, f):
  q, k, v = _cases.qkv(d, f)
  return case(
    q, k, v, sinks=f.normal((2,)), expect=_cases.attention_out(q, v, d)
  )


def _attention_weights(d, f):
  q, k, _ = _cases.qkv(d, f)
  lead = q.shape[:-3]
  return case(
    q, k, is_causal=True, expect=(lead + (2, 3, k.shape[-3]), d.compute)
  )


def _affine_scaled_attention(d, f):
  q, k, v = _cases.qkv(d, f)
  return case(
    q,
    k,
    v,
    alpha=f.param(q.shape[:-1]),
    alpha_ma=f.param((2,)),
    training=True,
    expect=_cases.attention_out(q, v, d),
    pick=first,
  )


def _as_flax_attention_fn(d, f):
  q, k, v = (f.normal((2, 3, 2, 4)) for _ in range(3))
  return case(
    attention.dot_product_attention,
    then=(q, k, v),
    expect=(q.shape, np.float32),
  )


def _causal_linear_attention(d, f):
  # Self-attention: as many keys as queries (one of each if d.one).
  q, k, v = _cases.qkv(d, f, t=1 if d.one else 3, k=2)
  return case(q, k, v, chunk_size=2, expect=_cases.attention_out(q, v, d))


def _logits(d, f):
  t = 1 if d.one else 3
  return f.data(d.shape()[:-2] + (t, t) if d.rank > 2 else (t, t))


def _sinkhorn_weights(d, f):
  x = _logits(d, f)
  return case(x, f.mask(x.shape), num_iters=3, expect=(x.shape, d.compute))


def _decode_mask(d, f):
  del f
  return case(
    d.rank, 2, 6, local_window_size=(2, 0), expect=((1, 1, 2, 6), np.bool_)
  )


def _grid(d):
  """A ``(h, w)`` token grid and one prefix token: ``T = 1 + h * w``."""
  return ((1, 2) if d.one else (2, 2)), 1


def _image(d, f, c=4):
  """An NHWC map ``(2, H, W, c)``, one row if ``d.one``."""
  return f.data((2, 1 if d.one else 3, 2, c))


def _efficient_local_attention(d, f):
  x = _image(d, f)
  return case(
    x,
    0.5 * f.normal((3, 1, 4)),
    f.param((4,)),
    f.normal((4,)),
    norm_groups=2,
    expect=(x.shape, d.out),
  )


def _gated_attention_output(d, f):
  out = f.data(d.shape())
  gate = f.normal(out.shape[:-1] + (1 if d.one else out.shape[-1],))
  return case(out, gate, expect=(out.shape, d.out))


def _lina_depthwise_conv(d, f):
  grid, prefix = _grid(d)
  x = f.data((2, prefix + grid[0] * grid[1], 4))
  return case(
    x,
    0.3 * f.normal((3, 3, 4)),
    f.normal((4,)),
    grid_shape=grid,
    num_prefix=prefix,
    expect=(x.shape, d.out),
  )


def _mxfp4_quantize(d, f):
  x = f.data(d.shape())
  return case(x, axis=d.axis, block_size=2, expect=(x.shape, d.out))


def _nala_grid_attention(d, f):
  grid, prefix = _grid(d)
  t = prefix + grid[0] * grid[1]
  q, k, v = (f.data((2, t, 2, 4)) for _ in range(3))
  return case(
    q,
    k,
    v,
    f.normal(q.shape, d.dtype),
    lepe_kernel=0.3 * f.normal((3, 3, 8)),
    lepe_bias=f.normal((8,)),
    norm_scale=f.param((8,)),
    norm_bias=f.normal((8,)),
    grid_shape=grid,
    num_prefix=prefix,
    expect=(q.shape, d.out),
  )


def _newton_inverse(d, f):
  m = 1 if d.one else 3
  z = f.data(d.shape()[:-2] + (m, m) if d.rank > 2 else (m, m))
  a = (z + np.swapaxes(z, -1, -2)) / 2 if d.dtype != "int32" else z
  return case(a, num_iters=8, expect=(a.shape, d.compute))


def _psa_weights(f, c=4, sequential=False):
  cp = c // 2
  w = {
    "channel_query": 0.5 * f.normal((c, 1)),
    "channel_value": 0.5 * f.normal((c, cp)),
    "spatial_query": 0.5 * f.normal((c, cp)),
    "spatial_value": 0.5 * f.normal((c, cp)),
  }
  if not sequential:
    w["channel_up"] = 0.5 * f.normal((cp, c))
    return w
  return w | {
    "channel_down": 0.5 * f.normal((cp, 1)),
    "channel_down_bias": f.normal((1,)),
    "channel_norm_scale": f.param((1,)),
    "channel_norm_bias": f.normal((1,)),
    "channel_up": 0.5 * f.normal((1, c)),
    "channel_up_bias": f.normal((c,)),
  }


def _psa(sequential=False, paper=False):
  def build(d, f):
    x = _image(d, f)
    w = _psa_weights(f, sequential=sequential)
    if paper:
      w |= {"norm_scale": f.param((4,)), "norm_bias": f.normal((4,))}
      w["layout"] = "sequential" if d.rank % 2 else "parallel"
    return case(x, **w, expect=(x.shape, d.out))

  return build


def _rope(d, f):
  x = f.data((2, 1 if d.one else 3, 2, 4))
  return case(x, expect=(x.shape, d.out))


def _soft_attention(d, f):
  q = f.data((2, 4, 2, 4))
  return case(
    q,
    f.data((2, 4, 2, 3)),
    f.data((2, 1 if d.one else 2, 2, 4)),
    num_iters=4,
    symmetric_norm=d.rank % 2 == 1,
    expect=(q.shape[:-1] + (3,), d.out),
  )


def _soft_grid_attention(d, f):
  grid, prefix = _grid(d)
  t = prefix + grid[0] * grid[1]
  q = f.data((2, t, 2, 4))
  return case(
    q,
    f.data((2, t, 2, 3)),
    landmark_kernel=0.3 * f.normal((1, 1, 4, 4)),
    landmark_scale=f.param((4,)),
    landmark_bias=f.normal((4,)),
    local_kernel=0.3 * f.normal((3, 3, 2)),
    grid_shape=grid,
    num_prefix=prefix,
    num_iters=4,
    expect=(q.shape[:-1] + (3,), d.out),
  )


def _soft_landmarks(d, f):
  q = f.data((2, 2 if d.one else 4, 2, 4))
  return case(q, 2, expect=((2, q.shape[1] // 2, 2, 4), d.out))


def _softmax_off_by_one(d, f):
  x = f.data(d.shape(), axis=d.axis)
  sink_shape = list(x.shape)
  sink_shape[d.axis] = 1
  return case(
    x,
    axis=d.axis,
    sink=f.normal(tuple(sink_shape)),
    expect=(x.shape, d.compute),
  )


def _streaming_cache_update(d, f):
  cached = f.data((2, 6, 1, 4))
  new = f.data((2, 1 if d.one else 2, 1, 4))
  return case(
    cached,
    new,
    d.rank + 4,
    num_sink_tokens=2,
    expect=(cached.shape, _cases.canonical(d.dtype)),
    pick=first,
  )


def _linear_clipping(d, f):
  x = f.data(d.shape())
  return case(x, expect=(x.shape, d.out))


ATTENTION = {
  "attention.dot_product_attention": _cases.Spec(
    _sdpa(is_causal=True), ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.attention_weights": _cases.Spec(
    _attention_weights, ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.sink_attention": _cases.Spec(
    _sink_attention, ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.sinkhorn_attention": _cases.Spec(
    _sdpa(num_iters=3), ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.mxfp4_attention": _cases.Spec(
    _sdpa(block_size=4), ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.lina_attention": _cases.Spec(
    _sdpa(), ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.nala_attention": _cases.Spec(
    _sdpa(), ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.affine_scaled_attention": _cases.Spec(
    _affine_scaled_attention, ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.as_flax_attention_fn": _cases.Spec(
    _as_flax_attention_fn, **_cases.STATIC
  ),
  "attention.causal_linear_attention": _cases.Spec(
    _causal_linear_attention, ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.sinkhorn_weights": _cases.Spec(_sinkhorn_weights, ranks=(2, 3, 4)),
  "attention.causal_sinkhorn_weights": _cases.Spec(
    _sinkhorn_weights, ranks=(2, 3, 4)
  ),
  "attention.decode_mask": _cases.Spec(_decode_mask, **_cases.STATIC),
  "attention.efficient_local_attention": _cases.Spec(
    _efficient_local_attention, ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.ela_config": _cases.Spec(_cases.scalars("S", 32), **_cases.STATIC),
  "attention.gated_attention_output": _cases.Spec(
    _gated_attention_output, ranks=(2, 3, 4)
  ),
  "attention.grid_rope_tables": _cases.Spec(
    _cases.scalars(
      (2, 2), 8, num_prefix=1, expect=((5, 8), np.float32), pick=first
    ),
    **_cases.STATIC,
  ),
  "attention.lina_depthwise_conv": _cases.Spec(
    _lina_depthwise_conv, ranks=(3,)
  ),
  "attention.linear_clipping": _cases.Spec(_linear_clipping),
  "attention.mxfp4_quantize": _cases.Spec(_mxfp4_quantize, axis=True),
  "attention.nala_grid_attention": _cases.Spec(
    _nala_grid_attention, ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.newton_inverse": _cases.Spec(_newton_inverse, ranks=(2, 3, 4)),
  "attention.psa_parallel": _cases.Spec(
    _psa(), ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.psa_sequential": _cases.Spec(
    _psa(sequential=True), ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.psa_paper_form": _cases.Spec(
    _psa(paper=True), ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.rope": _cases.Spec(_rope, ranks=(4,)),
  "attention.soft_attention": _cases.Spec(
    _soft_attention, ranks=(4, 3), kinds=_cases.SQUARABLE
  ),
  "attention.soft_grid_attention": _cases.Spec(
    _soft_grid_attention, ranks=(4,), kinds=_cases.SQUARABLE
  ),
  "attention.soft_landmarks": _cases.Spec(_soft_landmarks, ranks=(4,)),
  "attention.softmax_off_by_one": _cases.Spec(_softmax_off_by_one, axis=True),
  "attention.streaming_cache_update": _cases.Spec(
    _streaming_cache_update, ranks=(4,)
  ),
}
