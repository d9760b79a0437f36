"""Fuzz builders of `jaxnorm.norms`, `fused_norms` and `activations`.

The table is tests/fuzz/_builders.py.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxnorm import norms
from tests.fuzz import _cases
from tests.fuzz._cases import case, first

# ---------------------------------------------------------------------------
# jaxnorm.norms


def _layer_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x,
    f.param((c,)),
    f.normal((c,)),
    axis=d.axis,
    expect=(x.shape, d.out),
  )


def _rms_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(x, f.param((c,)), axis=d.axis, expect=(x.shape, d.out))


def _crms_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(x, f.param((c,)), axis=d.axis, expect=(x.shape, d.out))


def _scale_norm(d, f):
  x, _ = _cases.x_axis(d, f)
  return case(x, f.param(()), axis=d.axis, expect=(x.shape, d.out))


def _dyt(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x,
    f.param(()),
    f.param((c,)),
    f.normal((c,)),
    axis=d.axis,
    expect=(x.shape, d.out),
  )


def _l1_layer_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x, f.param((c,)), f.normal((c,)), axis=d.axis, expect=(x.shape, d.out)
  )


def _seed_norm(d, f):
  x, c = _cases.x_axis(d, f)
  return case(
    x,
    f.param((c,)),
    f.param((c,)),
    0.1 * f.normal((c,)),
    num_heads=2 if c % 2 == 0 else 1,
    axis=d.axis,
    expect=(x.shape, d.out),
  )


def _fake_layer_norm(d, f):
  x = f.data(d.shape())
  c = x.shape[-1]
  return case(
    x,
    f.param((c,)),
    f.normal((c,)),
    std=f.param(x.shape[:-1]),
    expect=(x.shape, d.out),
  )


def _channels(d, f):
  x = f.data(d.shape(), axis=d.axis)
  c = x.shape[-1]
  return x, c, f.param((c,)), f.normal((c,))


def _batch_norm(d, f):
  x, c = _cases.x_axis(d, f)
  state = norms.init_batch_norm_state(c)
  return case(
    x,
    f.param((c,)),
    f.normal((c,)),
    state,
    training=d.axis % 2 == 0,
    axis=d.axis,
    expect=(x.shape, d.out),
    pick=first,
  )


def _l1_batch_norm(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_l1_batch_norm_state(c)
  return case(
    x, s, b, state, training=True, expect=(x.shape, d.out), pick=first
  )


def _group_norm(d, f):
  x, c, s, b = _channels(d, f)
  return case(
    x,
    s,
    b,
    num_groups=2 if c % 2 == 0 else 1,
    reduction_axes=-1 if d.rank == 1 else None,
    expect=(x.shape, d.out),
  )


def _instance_norm(d, f):
  x, _, s, b = _channels(d, f)
  return case(x, s, b, expect=(x.shape, d.out))


def _evo_norm_b0(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_evo_norm_b0_state(c)
  return case(
    x,
    s,
    b,
    f.param((c,)),
    state,
    training=d.axis % 2 == 0,
    expect=(x.shape, d.out),
    pick=first,
  )


def _evo_norm_s0(d, f):
  x, c, s, b = _channels(d, f)
  return case(
    x,
    s,
    b,
    f.param((c,)),
    num_groups=2 if c % 2 == 0 else 1,
    expect=(x.shape, d.out),
  )


def _fake_ln(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_fake_ln_state(remove_at=1, bos_off_at=1)
  return case(x, s, b, state, expect=(x.shape, d.out), pick=first)


def _power_norm(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_power_norm_state(c)
  return case(
    x,
    s,
    b,
    state,
    training=d.axis % 2 == 0,
    num_groups=2 if c % 2 == 0 else 1,
    expect=(x.shape, d.out),
    pick=first,
  )


def _unified_norm(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_unified_norm_state(c)
  return case(
    x,
    s,
    b,
    state,
    training=d.axis % 2 == 0,
    warmup_iters=0,
    outlier_filtration=True,
    expect=(x.shape, d.out),
    pick=first,
  )


def _unmix_tns(d, f):
  x, c, s, b = _channels(d, f)
  state = norms.init_unmix_tns_state(
    np.zeros(c, np.float32),
    np.ones(c, np.float32),
    jax.random.key(0),
    num_components=4,
  )
  return case(x, s, b, state, expect=(x.shape, d.out), pick=first)


def _region_mask(f, x):
  return (f.uniform(x.shape[:-1] + (1,)) > 0.5).astype(np.float32)


def _region_norm(d, f):
  x, _, _, _ = _channels(d, f)
  return case(x, _region_mask(f, x), expect=(x.shape, d.out))


def _region_norm_b(d, f):
  x, c, s, b = _channels(d, f)
  return case(
    x,
    _region_mask(f, x),
    s,
    b,
    f.param((c,)),
    f.normal((c,)),
    expect=(x.shape, d.out),
  )


def _region_norm_l(d, f):
  x, _, _, _ = _channels(d, f)
  taps = 0.1 * f.normal((3, 3, 1, 1))
  return case(
    x,
    f.normal((3, 3, 2, 1)),
    taps,
    f.param((1,)),
    -taps,
    f.normal((1,)),
    threshold=0.5,
    expect=(x.shape, d.out),
  )


def _timestep_decay_norm(d, f):
  x, c, s, b = _channels(d, f)
  return case(x, s, b, num_groups=2, expect=(x.shape, d.out), pick=first)


def _branch_rms_norm(d, f):
  x, c, s, _ = _channels(d, f)
  return case(x, [s, 2 * s], expect=(x.shape, d.out), pick=lambda out: out[1])


def _dual_scaled_linear(d, f):
  x, c, s, _ = _channels(d, f)
  return case(
    x,
    0.1 * f.normal((c, 3)),
    s,
    f.param((3,)),
    dnp=d.axis % 2 == 0,
    expect=(x.shape[:-1] + (3,), d.out),
  )


def _magnitude_direction_scale(d, f):
  u = f.data((d.shape()[-1],))
  return case(f.param(()), u, expect=(u.shape, d.compute))


def _token_type(x):
  return norms.cls_token_type(x.shape[-2]) if x.ndim > 1 else np.int32(0)


def _specialized_layer_norm(d, f):
  x, c, s, b = _channels(d, f)
  return case(
    x,
    _token_type(x),
    s,
    b,
    f.param((c,)),
    f.normal((c,)),
    expect=(x.shape, d.out),
  )


def _specialized_linear(d, f):
  x, c, _, _ = _channels(d, f)
  return case(
    x,
    _token_type(x),
    0.1 * f.normal((c, 3)),
    0.1 * f.normal((c, 3)),
    f.normal((3,)),
    f.normal((3,)),
    expect=(x.shape[:-1] + (3,), d.out),
  )


def _fold_unified_norm(d, f):
  c = d.shape()[-1]
  position = "next" if d.axis % 2 else "previous"
  kernel = f.data((c, 3) if position == "next" else (3, c))
  out = 3 if position == "next" else c
  return case(
    f.param((c,)),
    f.normal((c,)),
    f.param((c,)),
    kernel,
    f.normal((out,)),
    position=position,
    expect=(kernel.shape, d.compute),
    pick=first,
  )


def _init_state(d, f):
  del f
  c = d.shape()[-1]
  return case(c, expect=((c,), np.float32), pick=_last_leaf)


def _last_leaf(state):
  return jax.tree.leaves(state)[-1]


def _init_fake_ln_state(d, f):
  del f
  return case(remove_at=d.rank, bos_off_at=d.rank - 1)


def _init_timestep_decay_norm_state(d, f):
  del f
  return case(d.rank, num_groups=2)


def _init_unified_norm_state(d, f):
  del f
  return case(d.shape()[-1], window_size=d.rank, expect=None)


def _init_unmix_tns_state(d, f):
  c = d.shape()[-1]
  return case(
    f.normal((c,)),
    f.param((c,)),
    jax.random.key(d.rank),
    num_components=4,
    expect=((4, c), np.float32),
    pick=first,
  )


def _cls_token_type(d, f):
  del f
  n = d.shape()[-1]
  return case(n, num_cls_tokens=1, num_registers=n - 1, expect=((n,), np.int32))


NORMS = {
  "norms.layer_norm": _cases.Spec(_layer_norm, axis=True),
  "norms.rms_norm": _cases.Spec(_rms_norm, axis=True),
  "norms.crms_norm": _cases.Spec(_crms_norm, axis=True),
  "norms.scale_norm": _cases.Spec(_scale_norm, axis=True),
  "norms.dyt": _cases.Spec(_dyt, axis=True),
  "norms.l1_layer_norm": _cases.Spec(_l1_layer_norm, axis=True),
  "norms.seed_norm": _cases.Spec(_seed_norm, axis=True),
  "norms.fake_layer_norm": _cases.Spec(_fake_layer_norm),
  "norms.batch_norm": _cases.Spec(
    _batch_norm, ranks=_cases.BATCHED, axis=True, kinds=_cases.SQUARABLE
  ),
  "norms.l1_batch_norm": _cases.Spec(
    _l1_batch_norm, ranks=_cases.BATCHED, kinds=_cases.SQUARABLE
  ),
  "norms.group_norm": _cases.Spec(_group_norm),
  "norms.instance_norm": _cases.Spec(_instance_norm, ranks=_cases.IMAGES),
  "norms.evo_norm_b0": _cases.Spec(
    _evo_norm_b0, ranks=_cases.IMAGES, axis=True, kinds=_cases.SQUARABLE
  ),
  "norms.evo_norm_s0": _cases.Spec(_evo_norm_s0, ranks=_cases.IMAGES),
  "norms.fake_ln": _cases.Spec(
    _fake_ln, ranks=_cases.BATCHED, kinds=_cases.SQUARABLE
  ),
  "norms.power_norm": _cases.Spec(
    _power_norm, ranks=_cases.BATCHED, axis=True, kinds=_cases.SQUARABLE
  ),
  "norms.unified_norm": _cases.Spec(
    _unified_norm, ranks=_cases.BATCHED, axis=True, kinds=_cases.SQUARABLE
  ),
  "norms.unmix_tns": _cases.Spec(
    _unmix_tns, ranks=_cases.IMAGES, kinds=_cases.SQUARABLE
  ),
  "norms.region_norm": _cases.Spec(_region_norm, ranks=_cases.IMAGES),
  "norms.region_norm_b": _cases.Spec(_region_norm_b, ranks=_cases.IMAGES),
  "norms.region_norm_l": _cases.Spec(_region_norm_l, ranks=(4,)),
  "norms.timestep_decay_norm": _cases.Spec(
    _timestep_decay_norm, ranks=(3,), kinds=_cases.SQUARABLE
  ),
  "norms.branch_rms_norm": _cases.Spec(_branch_rms_norm),
  "norms.dual_scaled_linear": _cases.Spec(_dual_scaled_linear, axis=True),
  "norms.magnitude_direction_scale": _cases.Spec(_magnitude_direction_scale),
  "norms.specialized_layer_norm": _cases.Spec(_specialized_layer_norm),
  "norms.specialized_linear": _cases.Spec(_specialized_linear),
  "norms.fold_unified_norm": _cases.Spec(_fold_unified_norm, axis=True),
  "norms.init_batch_norm_state": _cases.Spec(_init_state, **_cases.STATIC),
  "norms.init_evo_norm_b0_state": _cases.Spec(_init_state, **_cases.STATIC),
  "norms.init_l1_batch_norm_state": _cases.Spec(_init_state, **_cases.STATIC),
  "norms.init_power_norm_state": _cases.Spec(_init_state, **_cases.STATIC),
  "norms.init_fake_ln_state": _cases.Spec(_init_fake_ln_state, **_cases.STATIC),
  "norms.init_timestep_decay_norm_state": _cases.Spec(
    _init_timestep_decay_norm_state, **_cases.STATIC
  ),
  "norms.init_unified_norm_state": _cases.Spec(
    _init_unified_norm_state, **_cases.STATIC
  ),
  "norms.init_unmix_tns_state": _cases.Spec(_init_unmix_tns_state),
  "norms.cls_token_type": _cases.Spec(_cls_token_type, **_cases.STATIC),
  "norms.layer_norm_scaling": _cases.Spec(_cases.scalars(3), **_cases.STATIC),
  "norms.unmix_tns_momentum": _cases.Spec(_cases.scalars(8), **_cases.STATIC),
}

# ---------------------------------------------------------------------------
# jaxnorm.fused_norms


def _add_norm(with_bias):
  def build(d, f):
    x, c = _cases.x_axis(d, f)
    params = (f.param((c,)), f.normal((c,))) if with_bias else (f.param((c,)),)
    return case(
      x,
      f.normal(x.shape, d.dtype),
      *params,
      axis=d.axis,
      expect=(x.shape, d.out),
      pick=lambda out: out[1],
    )

  return build


FUSED_NORMS = {
  "fused_norms.add_rms_norm": _cases.Spec(_add_norm(False), axis=True),
  "fused_norms.add_layer_norm": _cases.Spec(_add_norm(True), axis=True),
}

# ---------------------------------------------------------------------------
# jaxnorm.activations


def _elementwise(**kwargs):
  """``fn(x, **kwargs)`` on any rank, output like ``x``."""

  def build(d, f):
    x = f.data(d.shape())
    return case(x, **kwargs, expect=(x.shape, d.out))

  return build


def _channelwise(*params, **kwargs):
  """``fn(x, *params(c), **kwargs)``, params from ``Fill`` method names."""

  def build(d, f):
    x = f.data(d.shape())
    c = x.shape[-1]
    args = [f.param((c,)) if p == "vector" else f.param(()) for p in params]
    return case(x, *args, **kwargs, expect=(x.shape, d.out))

  return build


def _alpha_dropout(d, f):
  x = f.data(d.shape())
  keep = f.uniform(x.shape) > 0.3 if d.one else None
  key = None if d.one else jax.random.key(d.rank)
  return case(x, 0.3, key=key, mask=keep, expect=(x.shape, d.out))


def _salu_maps(d, f):
  shape = d.shape()
  return case(
    _cases.positive(f, shape),
    _cases.positive(f, shape),
    expect=(shape, d.out),
    pick=first,
  )


def _lecun_normal(d, f):
  del f
  shape = (3, 4) if d.rank % 2 else (2, 3, 4)
  return case(
    "normal" if d.one else "truncated_normal",
    then=(jax.random.key(0), shape),
    expect=(shape, np.float32),
  )


ACTIVATIONS = {
  "activations.elu": _cases.Spec(_elementwise(alpha=0.5)),
  "activations.selu": _cases.Spec(_elementwise()),
  "activations.alpha_dropout": _cases.Spec(_alpha_dropout),
  "activations.lecun_normal": _cases.Spec(_lecun_normal, **_cases.STATIC),
  "activations.salu": _cases.Spec(_channelwise("vector", "scalar")),
  "activations.salu_sw": _cases.Spec(_channelwise("scalar", "vector")),
  "activations.salu_sw_from_ab": _cases.Spec(
    _salu_maps, kinds=_cases.RECIPROCAL
  ),
  "activations.salu_ab_from_sw": _cases.Spec(
    _salu_maps, kinds=_cases.RECIPROCAL
  ),
  "activations.swalu": _cases.Spec(_channelwise("vector", experimental=True)),
  "activations.galu": _cases.Spec(_channelwise("scalar", experimental=True)),
}
