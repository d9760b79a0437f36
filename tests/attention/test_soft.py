"""SOFT: Gaussian kernel, Newton inverse, soft_attention, the module."""

import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import GRID, D
from tests.attention._common import GRID_H as H
from tests.attention._common import GRID_N as N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
# N heads of size H: the map layer's (`_common.grid_mha`).
_qkv = functools.partial(_common.qkv, t=6)


def _landmark_kernel(key, m=49, d=32, scale=0.25):
  x = np.asarray(jax.random.normal(key, (m, d)), np.float64) * scale
  sq = (x * x).sum(-1)
  return np.exp(-0.5 * np.maximum(sq[:, None] + sq[None] - 2 * x @ x.T, 0))


def test_gaussian_kernel_properties(key):
  a = jax.random.normal(key, (2, 7, 5))
  k2 = attn.gaussian_kernel(a, a)
  helpers.assert_close(
    jnp.diagonal(k2, axis1=-2, axis2=-1), np.ones((2, 7)), atol=1e-6
  )
  helpers.assert_close(k2, jnp.swapaxes(k2, -1, -2), atol=1e-7)
  assert bool(jnp.all(k2 > 0))
  with pytest.raises(ValueError, match="gaussian_kernel: a and b must"):
    attn.gaussian_kernel(a, a[..., :4])


def test_newton_inverse_converges_on_well_conditioned(key):
  a = _landmark_kernel(key, scale=0.25)
  want = np.linalg.inv(a + 0.01 * np.eye(49))
  got = attn.newton_inverse(jnp.asarray(a, jnp.float32), num_iters=20)
  np.testing.assert_allclose(
    np.asarray(got, np.float64) @ (a + 0.01 * np.eye(49)), np.eye(49), atol=1e-3
  )
  assert np.abs(np.asarray(got) - want).max() / np.abs(want).max() < 1e-4
  # Documented failure: cond ~1e3 does not converge in 20 steps, does in 40.
  bad = jnp.asarray(_landmark_kernel(key, scale=0.1), jnp.float32)
  ref = np.linalg.inv(np.asarray(bad, np.float64) + 0.01 * np.eye(49))
  err = lambda v: np.abs(np.asarray(v) - ref).max() / np.abs(ref).max()  # noqa
  assert err(attn.newton_inverse(bad, num_iters=20)) > 1e-2
  assert err(attn.newton_inverse(bad, num_iters=40)) < 1e-3


def test_newton_inverse_negative_entries_and_backtrack(key):
  m = np.asarray(jax.random.normal(key, (16, 16)), np.float64)
  spd = m @ m.T / 32 + 0.5 * np.eye(16)
  assert spd.min() < 0
  got = attn.newton_inverse(
    jnp.asarray(spd, jnp.float32), num_iters=30, reg=0.0
  )
  np.testing.assert_allclose(got, np.linalg.inv(spd), atol=1e-4)
  a = jnp.asarray(_landmark_kernel(key, m=16, scale=0.5), jnp.float32)
  bt = attn.newton_inverse(a, num_iters=30, reg=0.0, init="backtrack")
  np.testing.assert_allclose(
    np.asarray(bt) @ np.asarray(a), np.eye(16), atol=1e-3
  )


def test_newton_custom_vjp_matches_exact_inverse(key):
  a = jnp.asarray(_landmark_kernel(key, m=8, d=4, scale=0.5), jnp.float32)
  eye = jnp.eye(8)
  cot = jax.random.normal(jax.random.key(9), (8, 8))
  f = lambda x: jnp.sum(attn.newton_inverse(x, num_iters=30) * cot)  # noqa
  g = lambda x: jnp.sum(jnp.linalg.inv(x + 0.01 * eye) * cot)  # noqa
  helpers.assert_close(jax.grad(f)(a), jax.grad(g)(a), atol=1e-3)
  u = lambda x: jnp.sum(  # noqa
    attn.newton_inverse(x, num_iters=30, grad="unrolled") * cot
  )
  helpers.assert_close(jax.grad(u)(a), jax.grad(g)(a), atol=1e-2)


def test_newton_errors():
  with pytest.raises(ValueError, match="newton_inverse: a must be square"):
    attn.newton_inverse(jnp.ones((3, 4)))
  with pytest.raises(ValueError, match="newton_inverse: grad must be one of"):
    attn.newton_inverse(jnp.eye(3), grad="exact")


@pytest.mark.parametrize("symmetric", [False, True])
def test_soft_attention_matches_explicit_inverse(key, symmetric):
  # 4 landmarks: with 2, every K2 has equal row sums, so SOFT-Norm's step
  # 2 / max(row sum)^2 sits exactly on the divergence boundary (see
  # test_soft_norm_two_landmarks_boundary).
  q, _, _ = _qkv(key, t=16, n=2, k=2, h=4)
  v = jax.random.normal(jax.random.key(2), (2, 16, 2, 3))
  lm = attn.soft_landmarks(q, 4)
  out = attn.soft_attention(q, v, lm, num_iters=40, symmetric_norm=symmetric)
  qs = np.asarray(q, np.float64).transpose(0, 2, 1, 3) * 4**-0.25
  lms = np.asarray(lm, np.float64).transpose(0, 2, 1, 3)

  def kern(a, b):
    d2 = ((a[..., :, None, :] - b[..., None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d2)

  k1, k2 = kern(qs, lms), kern(lms, lms)
  # SOFT inverts K2 + 0.01 I; SOFT-Norm (symmetric) inverts K2 (reg 0).
  inv = np.linalg.inv(k2 + (0.0 if symmetric else 0.01) * np.eye(4))
  if symmetric:
    dv = 1 / np.sqrt(k2.sum(-1))
    inv = dv[..., :, None] * inv * dv[..., None, :]
  want = (
    k1
    @ inv
    @ (
      np.swapaxes(k1, -1, -2) @ np.asarray(v, np.float64).transpose(0, 2, 1, 3)
    )
  )
  helpers.assert_close(out, want.transpose(0, 2, 1, 3), atol=1e-4)
  # A landmark equal to a query gives a kernel row containing 1.
  k1row = attn.gaussian_kernel(
    jnp.asarray(lms[..., :1, :], jnp.float32), jnp.asarray(lms, jnp.float32)
  )
  helpers.assert_close(k1row[..., 0, 0], np.ones((2, 2)), atol=1e-6)


def test_soft_errors(key):
  q, _, _ = _qkv(key, t=8)
  with pytest.raises(ValueError, match=r"soft_attention: value must be"):
    attn.soft_attention(q, q[:, :4], attn.soft_landmarks(q, 2))
  with pytest.raises(ValueError, match=r"soft_attention: landmarks must"):
    attn.soft_attention(q, q, q[:, :2, :2])
  with pytest.raises(ValueError, match=r"query.shape\[1\]=8 must be divisible"):
    attn.soft_landmarks(q, 3)


def _official_soft_newton(mat, iters):
  """NumPy transcription of SOFT/kernel/inverse.py ``newton_inv``."""
  alpha = 0.9 * 2 / np.max(mat.sum(-1), -1) ** 2
  p = mat + 0.01 * np.eye(mat.shape[-1])
  v = alpha[..., None, None] * p
  for _ in range(iters):
    v = 2 * v - v @ p @ v
  return v


def _official_norm_halvings(mat):
  """Halvings of SOFT-Norm's ``newton_inv`` backtracking (global max)."""
  eye = np.eye(mat.shape[-1])
  alpha = 2 / np.max(mat.sum(-1)) ** 2
  count = 0
  while np.max(np.abs(eye - mat @ (alpha * mat)).sum(-2)) > 1.01 and count < 10:
    alpha *= 0.5
    count += 1
  return count


def _norm_newton_jnp(mat, iters, halvings):
  """``SoftmaxFreeNormAttentionKernel.newton_inv`` with autograd throughout."""
  v = 2 / jnp.max(mat.sum(-1)) ** 2 * 0.5**halvings * mat
  for _ in range(iters):
    v = 2 * v - v @ mat @ v
  return v


def _landmark_batch(key):
  # Two kernels of different spread, so per-matrix and global maxima differ.
  k1, k2 = jax.random.split(key)
  return np.stack(
    [_landmark_kernel(k1, m=12, scale=0.3), _landmark_kernel(k2, m=12, scale=1)]
  )


@pytest.mark.parametrize("iters", [0, 3])
def test_newton_soft_start_is_computed_on_a(key, iters):
  a = _landmark_batch(key)
  got = attn.newton_inverse(jnp.asarray(a, jnp.float32), num_iters=iters)
  want = _official_soft_newton(a, iters)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_soft_norm_is_the_official_newton(key):
  a = _landmark_batch(key)
  halvings = _official_norm_halvings(a)
  a32 = jnp.asarray(a, jnp.float32)
  f = lambda x: attn.newton_inverse(  # noqa: E731
    x, num_iters=4, reg=0.0, init="backtrack", grad="unrolled"
  )
  np.testing.assert_allclose(
    f(a32), _norm_newton_jnp(a32, 4, halvings), rtol=1e-5, atol=1e-6
  )
  cot = jax.random.normal(jax.random.key(3), a.shape)
  g = jax.grad(lambda x: jnp.sum(f(x) * cot))(a32)
  g_ref = jax.grad(lambda x: jnp.sum(_norm_newton_jnp(x, 4, halvings) * cot))(
    a32
  )
  # V_0 = alpha P^T (jaxnorm) vs alpha P (official) agree on symmetric A and
  # in every gradient that flows into a symmetric A (e.g. from landmarks):
  # compare the symmetric parts.
  sym = lambda x: (x + jnp.swapaxes(x, -1, -2)) / 2  # noqa: E731
  helpers.assert_close(sym(g), sym(g_ref), atol=1e-4, rtol=1e-4)


def test_symmetric_norm_defaults_to_soft_norm(key):
  q, _, _ = _qkv(key, t=8, n=2, k=2, h=4)
  v = jax.random.normal(jax.random.key(2), (2, 8, 2, 3))
  lm = attn.soft_landmarks(q, 4)
  norm = attn.soft_attention(q, v, lm, symmetric_norm=True)
  explicit = attn.soft_attention(
    q, v, lm, symmetric_norm=True, reg=0.0, init="backtrack", grad="unrolled"
  )
  helpers.assert_close(norm, explicit, atol=0)
  ridge = attn.soft_attention(q, v, lm, symmetric_norm=True, reg=0.01)
  assert float(jnp.abs(norm - ridge).max()) > 1e-4
  soft = attn.soft_attention(q, v, lm)
  soft_explicit = attn.soft_attention(
    q, v, lm, reg=0.01, init="row_sum", grad="implicit"
  )
  helpers.assert_close(soft, soft_explicit, atol=0)


def test_soft_norm_two_landmarks_boundary():
  # SOFT-Norm's step (official code too) sits on the divergence boundary for
  # a matrix whose top eigenvalue equals its largest row sum (every 2 x 2
  # kernel): alpha * lambda_max^2 = 2 and ||I - A V_0||_1 = 1 <= 1.01, so
  # backtracking keeps alpha and float rounding decides convergence.
  k = np.array([[1.0, 0.6], [0.6, 1.0]])
  assert _official_norm_halvings(k) == 0
  alpha = 2 / k.sum(-1).max() ** 2
  np.testing.assert_allclose(alpha * np.linalg.eigvalsh(k).max() ** 2, 2.0)
  residual = np.eye(2) - k @ (alpha * k)
  np.testing.assert_allclose(np.abs(residual).sum(-2).max(), 1.0)


# ---------------------------------------------------------------------------
# The layer on a token map (`soft_conv_landmarks`, `soft_local_conv`); the
# module's official transcription is below.


def test_grid_errors():
  h, grid = 8, (4, 3)
  q = jnp.ones((1, 13, 2, h))
  lm = (jnp.ones((2, 2, h, h)), jnp.ones(h), jnp.zeros(h))
  with pytest.raises(ValueError, match=r"must hold num_prefix \+ h \* w"):
    attn.soft_conv_landmarks(q, *lm, grid_shape=(4, 4), num_prefix=1)
  with pytest.raises(
    ValueError, match=r"kernel must have shape \(k, k, 8, 8\)"
  ):
    attn.soft_conv_landmarks(
      q, jnp.ones((2, 3, h, h)), *lm[1:], grid_shape=grid, num_prefix=1
    )
  with pytest.raises(ValueError, match=r"window r=4 must fit the grid"):
    attn.soft_conv_landmarks(
      q, jnp.ones((4, 4, h, h)), *lm[1:], grid_shape=grid, num_prefix=1
    )
  with pytest.raises(ValueError, match=r"norm_scale must have shape \(8,\)"):
    attn.soft_conv_landmarks(
      q, lm[0], jnp.ones(3), lm[2], grid_shape=grid, num_prefix=1
    )
  with pytest.raises(ValueError, match=r"with odd k"):
    attn.soft_local_conv(q, jnp.ones((2, 2, 2)), grid_shape=grid, num_prefix=1)


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.soft).

# The map layer against a NumPy float64 transcription of the official one
# (``fudan-zvg/SOFT models/softmax_free_transformer.py``
# ``SoftmaxFreeAttention`` + ``SOFT/kernel/inverse.py``; see _common).

_erf = np.vectorize(math.erf)


def _soft_np(m, x, prefix):
  """``SoftmaxFreeAttention.forward`` (ratio > 1 path, ``use_conv``)."""
  core = m.core
  b, t, _ = x.shape
  q = _common.linear_np(x, m.q_kernel, m.q_bias)
  q = q.reshape(b, t, N, H).transpose(0, 2, 1, 3)
  v = _common.linear_np(x, m.v_kernel, m.v_bias)
  v = v.reshape(b, t, N, H).transpose(0, 2, 1, 3)
  q = q / math.sqrt(math.sqrt(H))
  # Qlandmark_op: Conv2d(H, H, r, stride=r, bias=False), torch weight
  # (out, in, r, r) is our (r, r, in, out) transposed.
  w = _common.np64(core.landmark_kernel[...]).transpose(3, 2, 0, 1)
  r = w.shape[-1]
  img = q[:, :, prefix:].reshape(b * N, *GRID, H).transpose(0, 3, 1, 2)
  mh, mw = GRID[0] // r, GRID[1] // r
  lm = np.zeros((b * N, H, mh, mw))
  for i in range(mh):
    for j in range(mw):
      patch = img[:, :, i * r : (i + 1) * r, j * r : (j + 1) * r]
      lm[:, :, i, j] = np.einsum("bcuv,ocuv->bo", patch, w)
  lm = lm.reshape(b * N, H, -1).transpose(0, 2, 1).reshape(b, N, -1, H)
  lm = _common.layer_norm_np(
    lm,
    _common.np64(core.landmark_scale[...]),
    _common.np64(core.landmark_bias[...]),
    1e-5,
  )
  lm = 0.5 * lm * (1 + _erf(lm / math.sqrt(2)))  # nn.GELU(): exact.

  def kernel(a, c):
    sq = (a**2).sum(-1)[..., :, None] + (c**2).sum(-1)[..., None, :]
    return np.exp(-(sq - 2 * a @ np.swapaxes(c, -1, -2)) / 2)

  k1, k2 = kernel(q, lm), kernel(lm, lm)
  out = (k1 @ _official_soft_newton(k2, 20)) @ (np.swapaxes(k1, -1, -2) @ v)
  # self.conv: Conv2d(N, N, k, groups=N, bias=False) on each value channel.
  wl = _common.np64(core.local_kernel[...]).transpose(2, 0, 1)[:, None]
  vimg = v[:, :, prefix:].reshape(b, N, *GRID, H).transpose(0, 4, 1, 2, 3)
  loc = _common.dwconv_np(vimg.reshape(b * H, N, *GRID), wl)
  loc = loc.reshape(b, H, N, -1).transpose(0, 2, 3, 1)
  out[:, :, prefix:] += loc
  out[:, :, :prefix] += v[:, :, :prefix]  # Prefix convention: passthrough.
  return _common.out_np(m, out.transpose(0, 2, 1, 3).reshape(b, t, D))


@pytest.mark.parametrize("prefix", [0, 1])
def test_soft_layer_matches_official_transcription(prefix):
  m = _common.grid_mha("soft", prefix, ratio=2, conv_size=3)
  _common.randomize(m, 0)
  x = _common.grid_tokens_np(1, prefix)
  y = nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x, jnp.float32))
  helpers.assert_close(y, _soft_np(m, x, prefix), atol=1e-5, rtol=1e-5)


def _soft_pair(s, x):
  """The SOFT core's output and the pure function's, same parameters."""
  q, _, v = _common.project_qkv_biased(s, x)
  c = s.core
  want = attn.soft_grid_attention(
    q,
    v,
    landmark_kernel=c.landmark_kernel[...],
    landmark_scale=c.landmark_scale[...],
    landmark_bias=c.landmark_bias[...],
    local_kernel=c.local_kernel[...],
    grid_shape=GRID,
    num_prefix=1,
    num_iters=12,
  )
  return c(x, q, None, v), want


def test_soft_core_calls_the_pure_function(key):
  x = jax.random.normal(key, (2, 13, D))
  s = _common.grid_mha("soft", 1, num_iters=12)
  got, want = nnx.jit(_soft_pair)(s, x)
  helpers.assert_close(got, want, atol=0)


def test_soft_grid_init_and_token_form():
  s = _common.grid_mha("soft", 1, ratio=2, conv_size=5).core
  assert s.landmark_kernel.shape == (2, 2, H, H)
  assert s.local_kernel.shape == (5, 5, N)
  bound = 1 / math.sqrt(H * 4)
  assert 0.5 * bound < np.abs(s.landmark_kernel[...]).max() <= bound
  assert 0.5 / 5 < np.abs(s.local_kernel[...]).max() <= 1 / 5
  assert _common.grid_mha("soft", 0, conv_size=0).core.local_kernel is None
  # Token form: no parameters, the bare kernel.
  tok = nn_attn.make_attention("soft", D, N, rngs=nnx.Rngs(0))
  assert tok.core.grid_shape is None
  assert not nnx.state(tok.core, nnx.Param)


def test_soft_all_zero_rows_have_finite_gradients():
  m = _common.grid_mha("soft", 1)
  x = jnp.zeros((1, 13, D)).at[0, 5].set(1.0)
  g = nnx.jit(nnx.grad(lambda m: m(x).sum()))(m)
  assert helpers.all_finite(g)


def test_soft_core_errors():
  with pytest.raises(ValueError, match=r"ratio=4 must fit the grid \(4, 3\)"):
    _common.grid_mha("soft", 1, ratio=4)
  with pytest.raises(
    ValueError, match=r"conv_size must be odd, got conv_size=4"
  ):
    _common.grid_mha("soft", 1, conv_size=4)
  with pytest.raises(ValueError, match=r"SoftAttention: grid_shape must be"):
    nn_attn.make_attention("soft", D, N, grid_shape=(4,), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_vit_builds_the_soft_layer_and_trains():
  _common.check_vit_builds_the_map_layer_and_trains("soft")


# The token form in the module tests' MultiHeadAttention (`_common.tokens`).


def test_soft_module_ties_keys_and_matches_function(key):
  x = _common.tokens(key)
  s = nn_attn.make_attention("soft", D, _common.N, rngs=nnx.Rngs(0))
  assert s.k_kernel is None and s.k_norm is None
  q, _, v = _common.project_qkv(s, x)
  want = attn.soft_attention(q, v, attn.soft_landmarks(q, 2))
  helpers.assert_close(s(x), _common.project_out(s, want), atol=1e-5)
