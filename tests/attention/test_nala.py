"""NaLaFormer norm-aware linear attention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.attention import nala
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import GRID, D
from tests.attention._common import GRID_H as H
from tests.attention._common import GRID_N as N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
# N heads of size H: the map layer's (`_common.grid_mha`).
_qkv = functools.partial(_common.qkv, t=6)


def test_nala_feature_properties(key):
  x = jax.random.normal(key, (10, 8))
  split = nala._sign_split(x)
  helpers.assert_close(
    jnp.linalg.norm(split, axis=-1), jnp.linalg.norm(x, axis=-1), atol=1e-6
  )
  y = jax.random.normal(jax.random.key(1), (10, 8))
  same = jnp.sum(jnp.where(x * y > 0, x * y, 0.0), -1)
  helpers.assert_close(
    jnp.sum(split * nala._sign_split(y), -1), same, atol=1e-6
  )
  r = jnp.linspace(0, 10, 50)
  p = 3 * (0.5 + jnp.tanh(r))
  assert bool(jnp.all(jnp.diff(p) >= 0)) and float(p[0]) == 1.5
  # Scaling q changes phi_q only through the exponent p(c r).
  fq = attn.nala_query_feature(x)
  f2 = attn.nala_query_feature(2 * x)
  nr = jnp.linalg.norm(x, axis=-1, keepdims=True)
  dirn = nala._sign_split(x / nr)
  p2 = 3 * (0.5 + jnp.tanh(2 * nr))
  helpers.assert_close(
    f2,
    jnp.where(dirn > 0, jnp.where(dirn > 0, dirn, 1.0) ** p2, 0.0),
    atol=1e-6,
  )
  assert not np.allclose(fq, f2)
  g = jax.grad(lambda q: attn.nala_query_feature(q).sum())(x)
  assert helpers.all_finite(g)


def test_nala_weights_nonnegative_and_normalized(key):
  q, k, v = _qkv(key)
  out = attn.nala_attention(q, k, v)
  kk, vv = jnp.repeat(k, 2, 2), jnp.repeat(v, 2, 2)
  w = jnp.einsum(
    "btnf,bsnf->bnts", attn.nala_query_feature(q), attn.nala_key_feature(kk)
  )
  assert float(w.min()) >= 0
  total = w.sum(-1, keepdims=True)
  wn = w / (total + 6e-6)  # mean-normalizer + eps, times S = 6
  assert float(wn.sum(-1).max()) <= 1.0
  big = total[..., 0] > 1e-2  # where eps is negligible rows sum to 1
  helpers.assert_close(
    jnp.where(big, wn.sum(-1), 1.0), np.ones(wn.shape[:-1]), atol=1e-3
  )
  helpers.assert_close(out, jnp.einsum("bnts,bsnh->btnh", wn, vv), atol=1e-4)
  zeros, ones = jnp.zeros((6, 16)), jnp.ones((6, 16))
  helpers.assert_close(
    attn.nala_attention(q, k, v, rope_sin_cos=(zeros, ones)), out, atol=1e-6
  )
  sin = jnp.sin(jnp.arange(6.0)[:, None] * jnp.ones((1, 16)))
  cos = jnp.cos(jnp.arange(6.0)[:, None] * jnp.ones((1, 16)))
  rot = attn.nala_attention(q, k, v, rope_sin_cos=(sin, cos))
  assert helpers.all_finite(rot) and not np.allclose(rot, out)
  with pytest.raises(ValueError, match=r"rope_sin_cos sin must have shape"):
    attn.nala_attention(q, k, v, rope_sin_cos=(zeros[:, :4], ones))


# ---------------------------------------------------------------------------
# The layer on a token map (`grid_rope_tables`, `nala_grid_attention`); the
# module's official transcription is below.


def _rope_np_for(grid, h, prefix):
  angle = np.repeat(1.0 / 10000 ** np.linspace(0, 1, h // 4), 2)
  rows = []
  for i in range(grid[0]):
    for j in range(grid[1]):
      rows.append(np.concatenate([i * angle, j * angle]))
  theta = np.concatenate([np.zeros((prefix, h)), np.array(rows)])
  return np.sin(theta), np.cos(theta)


def test_grid_rope_tables():
  sin, cos = attn.grid_rope_tables((2, 3), 8, num_prefix=1)
  want_sin, want_cos = _rope_np_for((2, 3), 8, 1)
  helpers.assert_close((sin, cos), (want_sin, want_cos), atol=1e-6)
  np.testing.assert_array_equal(sin[0], np.zeros(8))
  np.testing.assert_array_equal(cos[0], np.ones(8))


def test_grid_errors():
  with pytest.raises(ValueError, match=r"grid_shape must be a tuple of two"):
    attn.grid_tokens([4, 3])
  with pytest.raises(ValueError, match=r"grid_shape must be a tuple of two"):
    attn.grid_tokens((4, 0))
  with pytest.raises(ValueError, match=r"num_prefix must be a non-negative"):
    attn.grid_tokens((4, 3), True)
  with pytest.raises(ValueError, match=r"num_prefix must be >= 0"):
    attn.grid_tokens((4, 3), -1)
  with pytest.raises(ValueError, match=r"head_dim=6 must be divisible by 4"):
    attn.grid_rope_tables((2, 2), 6)
  q = jnp.ones((1, 13, 2, 8))
  c = 16
  ok = dict(
    lepe_kernel=jnp.ones((5, 5, c)),
    lepe_bias=jnp.ones(c),
    norm_scale=jnp.ones(c),
    norm_bias=jnp.ones(c),
    grid_shape=(4, 3),
    num_prefix=1,
  )
  with pytest.raises(ValueError, match=r"key must have shape \(1, 13, 2, 8\)"):
    attn.nala_grid_attention(q, q[:, :, :1], q, q, **ok)
  with pytest.raises(ValueError, match=r"lepe_bias must have shape \(16,\)"):
    attn.nala_grid_attention(q, q, q, q, **dict(ok, lepe_bias=jnp.ones(3)))
  with pytest.raises(TypeError, match=r"gate must have a floating dtype"):
    attn.nala_grid_attention(q, q, q, q.astype(jnp.int32), **ok)
  q6, c6 = jnp.ones((1, 13, 2, 6)), jnp.ones(12)
  ok6 = dict(ok, lepe_kernel=jnp.ones((5, 5, 12)), lepe_bias=c6)
  ok6.update(norm_scale=c6, norm_bias=c6)
  with pytest.raises(ValueError, match=r"head_dim=6 must be divisible by 4"):
    attn.nala_grid_attention(q6, q6, q6, q6, **ok6)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.nala).

# The map layer against a NumPy float64 transcription of the official one
# (``ZacharyMeng/NaLaFormer NaLaformer/NALA.py`` ``NormAwareLinearAttn`` +
# ``RoPE``; see _common).


def _grid_part(a, prefix):
  """``(B, T, C)`` -> the map as NCHW ``(B, C, h, w)``."""
  b, _, c = a.shape
  return a[:, prefix:].reshape(b, *GRID, c).transpose(0, 3, 1, 2)


def _from_grid(img):
  b, c = img.shape[:2]
  return img.reshape(b, c, -1).transpose(0, 2, 1)


def _rope_np(prefix):
  """``RoPE.forward((h, w))`` of NALA.py, plus the unrotated prefix rows."""
  angle = 1.0 / 10000 ** np.linspace(0, 1, H // 4)
  angle = np.repeat(angle, 2)
  ih, iw = np.arange(GRID[0]), np.arange(GRID[1])
  th = np.broadcast_to((ih[:, None] * angle)[:, None], (*GRID, H // 2))
  tw = np.broadcast_to((iw[:, None] * angle)[None], (*GRID, H // 2))
  theta = np.concatenate([th, tw], -1).reshape(-1, H)
  theta = np.concatenate([np.zeros((prefix, H)), theta])
  return np.sin(theta), np.cos(theta)


def _theta_shift(x, sin, cos):
  rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
  return x * cos + rot * sin


def _nala_np(m, x, prefix):
  """``NormAwareLinearAttn.forward`` (qkvg = our q/k/v/gate projections)."""
  core = m.core
  b, t, _ = x.shape

  def heads(a):
    return a.reshape(b, t, N, H).transpose(0, 2, 1, 3)

  q = heads(_common.linear_np(x, m.q_kernel, m.q_bias))
  k = heads(_common.linear_np(x, m.k_kernel, m.k_bias))
  v_tok = _common.linear_np(x, m.v_kernel, m.v_bias)
  v = heads(v_tok)
  g = _common.linear_np(x, core.gate_kernel, core.gate_bias)
  # self.lepe: Conv2d(C, C, 5, 1, 2, groups=C) with bias, on v.
  wl = _common.np64(core.lepe_kernel[...]).transpose(2, 0, 1)[:, None]
  lepe = _from_grid(
    _common.dwconv_np(
      _grid_part(v_tok, prefix), wl, _common.np64(core.lepe_bias[...])
    )
  )
  lepe = np.concatenate([np.zeros((b, prefix, D)), lepe], 1)
  k = k**3
  q1, q2, k1, k2 = (np.maximum(a, 0) for a in (q, -q, k, -k))
  qn = np.linalg.norm(q, axis=-1, keepdims=True)
  power = 3 * (0.5 + np.tanh(qn))
  q1, q2 = (q1 / qn) ** power, (q2 / qn) ** power
  sin, cos = _rope_np(prefix)
  q_ = np.concatenate([_theta_shift(a, sin, cos) for a in (q1, q2)], -1)
  k_ = np.concatenate([_theta_shift(a, sin, cos) for a in (k1, k2)], -1)
  qf, kf = np.concatenate([q1, q2], -1), np.concatenate([k1, k2], -1)
  z = 1 / (qf @ np.swapaxes(kf.mean(-2, keepdims=True), -1, -2) + 1e-6)
  kv = (np.swapaxes(k_, -1, -2) * t**-0.5) @ (v * t**-0.5)
  o = (q_ @ kv * z).transpose(0, 2, 1, 3).reshape(b, t, D)
  o = _common.layer_norm_np(
    o + lepe,
    _common.np64(core.norm_scale[...]),
    _common.np64(core.norm_bias[...]),
    1e-5,
  )
  return _common.out_np(m, o * g / (1 + np.exp(-g)))


@pytest.mark.parametrize("prefix", [0, 1])
def test_nala_layer_matches_official_transcription(prefix):
  m = _common.grid_mha("nala", prefix)
  _common.randomize(m, 2)
  x = _common.grid_tokens_np(3, prefix)
  y = nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x, jnp.float32))
  helpers.assert_close(y, _nala_np(m, x, prefix), atol=1e-5, rtol=1e-5)


def _nala_pair(n, x):
  """The NaLa core's output and the pure function's, same parameters."""
  q, k, v = _common.project_qkv_biased(n, x)
  c = n.core
  gate = jnp.einsum("btd,dnh->btnh", x, c.gate_kernel[...])
  gate = gate + c.gate_bias[...].reshape(1, 1, N, H)
  want = attn.nala_grid_attention(
    q,
    k,
    v,
    gate,
    lepe_kernel=c.lepe_kernel[...],
    lepe_bias=c.lepe_bias[...],
    norm_scale=c.norm_scale[...],
    norm_bias=c.norm_bias[...],
    grid_shape=GRID,
    num_prefix=1,
    power_scale=2.0,
  )
  return c(x, q, k, v), want


def test_nala_core_calls_the_pure_function(key):
  x = jax.random.normal(key, (2, 13, D))
  n = _common.grid_mha("nala", 1, power_scale=2.0)
  got, want = nnx.jit(_nala_pair)(n, x)
  helpers.assert_close(got, want, atol=0)


def test_nala_grid_init_and_token_form():
  n = _common.grid_mha("nala", 1).core
  assert n.lepe_kernel.shape == (5, 5, D) and n.gate_kernel.shape == (D, N, H)
  lepe = np.asarray(n.lepe_kernel[...])
  assert 0.017 < lepe.std() < 0.023
  assert np.abs(lepe).max() > 0.045  # Not truncated at 2 std.
  np.testing.assert_array_equal(n.norm_scale[...], np.ones(D))
  # Token form: no parameters, the bare kernel.
  tok = nn_attn.make_attention("nala", D, N, rngs=nnx.Rngs(0))
  assert tok.core.grid_shape is None
  assert not nnx.state(tok.core, nnx.Param)


def test_nala_all_zero_rows_have_finite_gradients():
  m = _common.grid_mha("nala", 1)
  x = jnp.zeros((1, 13, D)).at[0, 5].set(1.0)
  g = nnx.jit(nnx.grad(lambda m: m(x).sum()))(m)
  assert helpers.all_finite(g)


def test_nala_core_errors():
  with pytest.raises(ValueError, match=r"lepe_size must be odd"):
    _common.grid_mha("nala", 1, lepe_size=2)
  with pytest.raises(
    ValueError, match=r"NaLaAttention: the LePE conv and gate"
  ):
    nn_attn.make_attention(
      "nala", D, N, num_kv_heads=1, grid_shape=GRID, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match=r"head_dim=6 must be divisible by 4"):
    nn_attn.make_attention("nala", 12, 2, grid_shape=GRID, rngs=nnx.Rngs(0))
  m = _common.grid_mha("nala", 1)
  with pytest.raises(ValueError, match=r"must hold num_prefix \+ h \* w"):
    m(jnp.ones((1, 12, D)))


@pytest.mark.slow
def test_vit_builds_the_nala_layer_and_trains():
  _common.check_vit_builds_the_map_layer_and_trains("nala")
