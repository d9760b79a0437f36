"""NaLaFormer norm-aware linear attention."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention as attn
from jaxnorm.attention import nala
from tests import helpers
from tests.attention import _common

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
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
# module's official transcription is in tests/nn/test_vision_modules.py.


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
