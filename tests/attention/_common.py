"""Shared inputs, contexts and module helpers of the attention tests."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxnorm.nn import attention as nn_attn
from jaxnorm.nn import models
from tests import helpers
from tests.pallas_kernels import _common as pallas_common


def qkv(key, b=2, t=5, s=6, n=4, k=2, h=8, dtype=jnp.float32):
  """Gaussian ``q (b, t, n, h)``, ``k, v (b, s, k, h)`` in ``dtype``."""
  kq, kk, kv = jax.random.split(key, 3)
  q = jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype)
  k_ = jax.random.normal(kk, (b, s, k, h), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (b, s, k, h), jnp.float32).astype(dtype)
  return q, k_, v


def lowering_context(platform: str):
  """For a cross-lowering to ``platform``: on ``"cuda"`` the Triton target
  device and JAX's Triton deprecation warning (where it warns)."""
  if platform != "cuda":
    return contextlib.nullcontext()
  stack = contextlib.ExitStack()
  stack.enter_context(pallas_common.triton_target())
  stack.enter_context(pallas_common.expect_triton_deprecation())
  return stack


# ---------------------------------------------------------------------------
# The module tests (each paper's, and the registry-driven ones in
# tests/nn/test_attention.py): a MultiHeadAttention of width D with N query
# heads and K key/value heads of size H, on `tokens`.

D, N, K, H = 16, 4, 2, 4


def tokens(key, t=6, name="softmax"):
  """Gaussian ``(2, t, D)`` tokens of the dtype kind of core ``name``."""
  x = jax.random.normal(key, (2, t, D))
  return helpers.as_dtype_kind(x, nn_attn.ATTENTIONS[name].dtype_kind)


def project_qkv(m, x):
  """The bias-free q, k, v projections of MultiHeadAttention ``m``."""
  q = jnp.einsum("btd,dnh->btnh", x, m.q_kernel[...])
  k = (
    None
    if m.k_kernel is None
    else jnp.einsum("btd,dnh->btnh", x, m.k_kernel[...])
  )
  v = jnp.einsum("btd,dnh->btnh", x, m.v_kernel[...])
  return q, k, v


def project_out(m, y):
  """The bias-free output projection of MultiHeadAttention ``m``."""
  return jnp.einsum("btnh,nhd->btd", y, m.out_kernel[...])


# ---------------------------------------------------------------------------
# The map layers of SOFT and NaLaFormer (tests/attention/test_soft.py,
# test_nala.py): GRID_N heads of size GRID_H (GRID_N * GRID_H == D) on a GRID
# token map, checked against NumPy float64 transcriptions of the official
# layers fed with the module's parameters in torch layouts. With
# ``num_prefix=1`` the oracles add jaxnorm's documented prefix convention (the
# [CLS] joins the attention, takes no conv term or rotation; SOFT's local
# branch passes its value).

GRID_N, GRID_H = 2, 8
GRID = (4, 3)


def np64(a):
  return np.asarray(a, np.float64)


def dwconv_np(img, w, b=None):
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


def layer_norm_np(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def grid_mha(name, prefix, **kw):
  """Map-layer core ``name`` in a biased MultiHeadAttention on GRID."""
  return nn_attn.make_attention(
    name,
    D,
    GRID_N,
    use_bias=True,
    grid_shape=GRID,
    num_prefix=prefix,
    rngs=nnx.Rngs(3),
    **kw,
  )


def randomize(m, seed):
  """Non-trivial values for every parameter (biases, norms included)."""
  rng = np.random.default_rng(seed)
  for _, var in nnx.iter_graph(m):
    if isinstance(var, nnx.Param):
      v = np.asarray(var[...])
      var[...] = jnp.asarray(v + 0.3 * rng.normal(size=v.shape), v.dtype)


def linear_np(x, kernel, bias):
  """The MHA projection ``x @ kernel + bias`` as ``(B, T, N * H)``."""
  w = np64(kernel[...]).reshape(D, -1)
  return x @ w + np64(bias[...]).reshape(-1)


def out_np(m, y):
  """The biased output projection of ``m`` on ``(B, T, D)`` heads."""
  w = np64(m.out_kernel[...]).reshape(-1, D)
  return y @ w + np64(m.out_bias[...])


def grid_tokens_np(seed, prefix):
  """Gaussian float64 ``(2, prefix + h * w, D)`` tokens."""
  t = prefix + GRID[0] * GRID[1]
  return np.random.default_rng(seed).normal(size=(2, t, D))


def project_qkv_biased(m, x):
  """The biased q, k, v projections of MultiHeadAttention ``m``."""

  def proj(kernel, bias):
    y = jnp.einsum("btd,dnh->btnh", x, kernel[...])
    return y + bias[...][None, None]

  k = None if m.k_kernel is None else proj(m.k_kernel, m.k_bias)
  return proj(m.q_kernel, m.q_bias), k, proj(m.v_kernel, m.v_bias)


# Depth 2: the map-only branches (local conv, LePE) of the first block reach
# the [CLS] head through the second block's attention.
IMAGES = dict(num_classes=3, image_shape=(8, 6, 1), width=D, depth=2)


def check_vit_builds_the_map_layer_and_trains(name):
  """A ViT with core ``name`` builds it on the patch grid; one SGD step
  gives every core parameter a non-zero gradient and moves it."""
  cfg = models.ViTConfig(
    **IMAGES, patch_size=2, num_heads=GRID_N, attention=name
  )
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
