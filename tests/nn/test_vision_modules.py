"""The paper layers of SOFT and NaLaFormer on a token map, and the ViT.

Oracles are NumPy float64 transcriptions of the official layers
(``fudan-zvg/SOFT models/softmax_free_transformer.py``
``SoftmaxFreeAttention`` + ``SOFT/kernel/inverse.py``; ``ZacharyMeng/
NaLaFormer NaLaformer/NALA.py`` ``NormAwareLinearAttn`` + ``RoPE``), fed with
the module's parameters in torch layouts. With ``num_prefix=1`` the oracle
adds jaxnorm's documented prefix convention (the [CLS] joins the attention,
takes no conv term or rotation; SOFT's local branch passes its value).
"""

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import attention
from jaxnorm.nn import attention as nn_attn
from jaxnorm.nn import models
from tests import helpers
from tests.attention import test_soft  # The NumPy ``newton_inv``.

N, H = 2, 8
D = N * H
GRID = (4, 3)
_erf = np.vectorize(math.erf)


def _np(a):
  return np.asarray(a, np.float64)


def _dwconv_np(img, w, b=None):
  """torch depthwise ``Conv2d(C, C, k, padding=k // 2, groups=C)``.

  ``img (B, C, h, w)``, ``w (C, 1, k, k)``.
  """
  _, c, gh, gw = img.shape
  k = w.shape[-1]
  p = np.pad(img, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2)))
  out = np.zeros_like(img)
  for i in range(k):
    for j in range(k):
      out += p[:, :, i : i + gh, j : j + gw] * w[None, :, 0, i, j, None, None]
  return out if b is None else out + b[None, :, None, None]


def _layer_norm_np(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _mha(name, prefix, **kw):
  return nn_attn.make_attention(
    name,
    D,
    N,
    use_bias=True,
    grid_shape=GRID,
    num_prefix=prefix,
    rngs=nnx.Rngs(3),
    **kw,
  )


def _randomize(m, seed):
  """Non-trivial values for every parameter (biases, norms included)."""
  rng = np.random.default_rng(seed)
  for _, var in nnx.iter_graph(m):
    if isinstance(var, nnx.Param):
      v = np.asarray(var[...])
      var[...] = jnp.asarray(v + 0.3 * rng.normal(size=v.shape), v.dtype)


def _linear(x, kernel, bias):
  """The MHA projection ``x @ kernel + bias`` as ``(B, T, N * H)``."""
  w = _np(kernel[...]).reshape(D, -1)
  return x @ w + _np(bias[...]).reshape(-1)


def _out(m, y):
  w = _np(m.out_kernel[...]).reshape(-1, D)
  return y @ w + _np(m.out_bias[...])


def _tokens(seed, prefix):
  t = prefix + GRID[0] * GRID[1]
  return np.random.default_rng(seed).normal(size=(2, t, D))


def _grid_part(a, prefix):
  """``(B, T, C)`` -> the map as NCHW ``(B, C, h, w)``."""
  b, _, c = a.shape
  return a[:, prefix:].reshape(b, *GRID, c).transpose(0, 3, 1, 2)


def _from_grid(img):
  b, c = img.shape[:2]
  return img.reshape(b, c, -1).transpose(0, 2, 1)


# ---------------------------------------------------------------------------
# SOFT.


def _soft_np(m, x, prefix):
  """``SoftmaxFreeAttention.forward`` (ratio > 1 path, ``use_conv``)."""
  core = m.core
  b, t, _ = x.shape
  q = _linear(x, m.q_kernel, m.q_bias).reshape(b, t, N, H).transpose(0, 2, 1, 3)
  v = _linear(x, m.v_kernel, m.v_bias).reshape(b, t, N, H).transpose(0, 2, 1, 3)
  q = q / math.sqrt(math.sqrt(H))
  # Qlandmark_op: Conv2d(H, H, r, stride=r, bias=False), torch weight
  # (out, in, r, r) is our (r, r, in, out) transposed.
  w = _np(core.landmark_kernel[...]).transpose(3, 2, 0, 1)
  r = w.shape[-1]
  img = q[:, :, prefix:].reshape(b * N, *GRID, H).transpose(0, 3, 1, 2)
  mh, mw = GRID[0] // r, GRID[1] // r
  lm = np.zeros((b * N, H, mh, mw))
  for i in range(mh):
    for j in range(mw):
      patch = img[:, :, i * r : (i + 1) * r, j * r : (j + 1) * r]
      lm[:, :, i, j] = np.einsum("bcuv,ocuv->bo", patch, w)
  lm = lm.reshape(b * N, H, -1).transpose(0, 2, 1).reshape(b, N, -1, H)
  lm = _layer_norm_np(
    lm, _np(core.landmark_scale[...]), _np(core.landmark_bias[...]), 1e-5
  )
  lm = 0.5 * lm * (1 + _erf(lm / math.sqrt(2)))  # nn.GELU(): exact.

  def kernel(a, c):
    sq = (a**2).sum(-1)[..., :, None] + (c**2).sum(-1)[..., None, :]
    return np.exp(-(sq - 2 * a @ np.swapaxes(c, -1, -2)) / 2)

  k1, k2 = kernel(q, lm), kernel(lm, lm)
  out = (k1 @ test_soft._official_soft_newton(k2, 20)) @ (
    np.swapaxes(k1, -1, -2) @ v
  )
  # self.conv: Conv2d(N, N, k, groups=N, bias=False) on each value channel.
  wl = _np(core.local_kernel[...]).transpose(2, 0, 1)[:, None]  # (N,1,k,k)
  vimg = v[:, :, prefix:].reshape(b, N, *GRID, H).transpose(0, 4, 1, 2, 3)
  loc = _dwconv_np(vimg.reshape(b * H, N, *GRID), wl)
  loc = loc.reshape(b, H, N, -1).transpose(0, 2, 3, 1)
  out[:, :, prefix:] += loc
  out[:, :, :prefix] += v[:, :, :prefix]  # Prefix convention: passthrough.
  return _out(m, out.transpose(0, 2, 1, 3).reshape(b, t, D))


@pytest.mark.parametrize("prefix", [0, 1])
def test_soft_layer_matches_official_transcription(prefix):
  m = _mha("soft", prefix, ratio=2, conv_size=3)
  _randomize(m, 0)
  x = _tokens(1, prefix)
  y = nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x, jnp.float32))
  helpers.assert_close(y, _soft_np(m, x, prefix), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------
# NaLaFormer.


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

  q = heads(_linear(x, m.q_kernel, m.q_bias))
  k = heads(_linear(x, m.k_kernel, m.k_bias))
  v_tok = _linear(x, m.v_kernel, m.v_bias)
  v = heads(v_tok)
  g = _linear(x, core.gate_kernel, core.gate_bias)
  # self.lepe: Conv2d(C, C, 5, 1, 2, groups=C) with bias, on v.
  wl = _np(core.lepe_kernel[...]).transpose(2, 0, 1)[:, None]
  lepe = _from_grid(
    _dwconv_np(_grid_part(v_tok, prefix), wl, _np(core.lepe_bias[...]))
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
  o = _layer_norm_np(
    o + lepe, _np(core.norm_scale[...]), _np(core.norm_bias[...]), 1e-5
  )
  return _out(m, o * g / (1 + np.exp(-g)))


@pytest.mark.parametrize("prefix", [0, 1])
def test_nala_layer_matches_official_transcription(prefix):
  m = _mha("nala", prefix)
  _randomize(m, 2)
  x = _tokens(3, prefix)
  y = nnx.jit(lambda m, x: m(x))(m, jnp.asarray(x, jnp.float32))
  helpers.assert_close(y, _nala_np(m, x, prefix), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------
# Module == pure function; the token forms; init; errors.


def _qkv(m, x):
  def proj(kernel, bias):
    y = jnp.einsum("btd,dnh->btnh", x, kernel[...])
    return y + bias[...][None, None]

  k = None if m.k_kernel is None else proj(m.k_kernel, m.k_bias)
  return proj(m.q_kernel, m.q_bias), k, proj(m.v_kernel, m.v_bias)


def _soft_pair(s, x):
  """The SOFT core's output and the pure function's, same parameters."""
  q, _, v = _qkv(s, x)
  c = s.core
  want = attention.soft_grid_attention(
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


def _nala_pair(n, x):
  """The NaLa core's output and the pure function's, same parameters."""
  q, k, v = _qkv(n, x)
  c = n.core
  gate = jnp.einsum("btd,dnh->btnh", x, c.gate_kernel[...])
  gate = gate + c.gate_bias[...].reshape(1, 1, N, H)
  want = attention.nala_grid_attention(
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


def test_cores_call_the_pure_functions(key):
  x = jax.random.normal(key, (2, 13, D))
  s, n = _mha("soft", 1, num_iters=12), _mha("nala", 1, power_scale=2.0)
  pairs = nnx.jit(lambda s, n, x: (_soft_pair(s, x), _nala_pair(n, x)))
  for got, want in pairs(s, n, x):
    helpers.assert_close(got, want, atol=0)


def test_grid_init_and_token_forms(key):
  s = _mha("soft", 1, ratio=2, conv_size=5).core
  assert s.landmark_kernel.shape == (2, 2, H, H)
  assert s.local_kernel.shape == (5, 5, N)
  bound = 1 / math.sqrt(H * 4)
  assert 0.5 * bound < np.abs(s.landmark_kernel[...]).max() <= bound
  assert 0.5 / 5 < np.abs(s.local_kernel[...]).max() <= 1 / 5
  assert _mha("soft", 0, conv_size=0).core.local_kernel is None
  n = _mha("nala", 1).core
  assert n.lepe_kernel.shape == (5, 5, D) and n.gate_kernel.shape == (D, N, H)
  lepe = np.asarray(n.lepe_kernel[...])
  assert 0.017 < lepe.std() < 0.023
  assert np.abs(lepe).max() > 0.045  # Not truncated at 2 std.
  np.testing.assert_array_equal(n.norm_scale[...], np.ones(D))
  # Token forms: no parameters, the bare kernels.
  for name in ("soft", "nala"):
    tok = nn_attn.make_attention(name, D, N, rngs=nnx.Rngs(0))
    assert tok.core.grid_shape is None
    assert not nnx.state(tok.core, nnx.Param)


def test_all_zero_rows_have_finite_gradients():
  for name in ("soft", "nala"):
    m = _mha(name, 1)
    x = jnp.zeros((1, 13, D)).at[0, 5].set(1.0)
    g = nnx.jit(nnx.grad(lambda m: m(x).sum()))(m)
    assert helpers.all_finite(g), name


def test_core_errors():
  with pytest.raises(ValueError, match=r"ratio=4 must fit the grid \(4, 3\)"):
    _mha("soft", 1, ratio=4)
  with pytest.raises(
    ValueError, match=r"conv_size must be odd, got conv_size=4"
  ):
    _mha("soft", 1, conv_size=4)
  with pytest.raises(ValueError, match=r"lepe_size must be odd"):
    _mha("nala", 1, lepe_size=2)
  with pytest.raises(
    ValueError, match=r"NaLaAttention: the LePE conv and gate"
  ):
    nn_attn.make_attention(
      "nala", D, N, num_kv_heads=1, grid_shape=GRID, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match=r"head_dim=6 must be divisible by 4"):
    nn_attn.make_attention("nala", 12, 2, grid_shape=GRID, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"SoftAttention: grid_shape must be"):
    nn_attn.make_attention("soft", D, N, grid_shape=(4,), rngs=nnx.Rngs(0))
  m = _mha("nala", 1)
  with pytest.raises(ValueError, match=r"must hold num_prefix \+ h \* w"):
    m(jnp.ones((1, 12, D)))


# ---------------------------------------------------------------------------
# Specs and the ViT.


@pytest.mark.parametrize("name", nn_attn.ATTENTION_NAMES)
def test_needs_grid_flag_is_consistent(name):
  spec = nn_attn.ATTENTIONS[name]
  assert spec.needs_grid is bool(getattr(spec.core, "needs_grid", False))
  params = inspect.signature(spec.core.__init__).parameters
  assert ({"grid_shape", "num_prefix"} <= set(params)) == spec.needs_grid


# Depth 2: the map-only branches (local conv, LePE) of the first block reach
# the [CLS] head through the second block's attention.
IMAGES = dict(num_classes=3, image_shape=(8, 6, 1), width=D, depth=2)


@pytest.mark.parametrize("name", ["soft", "nala"])
def test_vit_builds_the_map_layer_and_trains(name):
  cfg = models.ViTConfig(**IMAGES, patch_size=2, num_heads=N, attention=name)
  vit = models.ViT(cfg, rngs=nnx.Rngs(0))
  core = vit.net.blocks[0].core
  assert core.grid_shape == GRID and core.num_prefix == 1
  images = jax.random.uniform(jax.random.key(1), (2, 8, 6, 1))
  labels = jnp.array([0, 2])
  opt = nnx.Optimizer(vit, optax.sgd(0.1), wrt=nnx.Param)

  def loss_fn(m):
    logits = m(images)
    return optax.softmax_cross_entropy_with_integer_labels(
      logits, labels
    ).mean()

  @nnx.jit
  def step(m, opt):
    loss, grads = nnx.value_and_grad(loss_fn)(m)
    opt.update(m, grads)
    return loss, grads

  before = jax.tree.map(jnp.copy, nnx.state(core, nnx.Param))
  loss, grads = step(vit, opt)
  assert np.isfinite(loss)
  core_grads = grads["net"]["blocks"][0]["core"]
  for path, g in jax.tree_util.tree_leaves_with_path(core_grads):
    assert np.abs(np.asarray(g)).max() > 0, path
  after = nnx.state(core, nnx.Param)
  changed = jax.tree.map(lambda a, b: bool(np.any(a != b)), before, after)
  assert all(jax.tree.leaves(changed))
