"""Shared sublayers and norms of the residual function and module tests."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import norms
from jaxnorm.nn import residual as nn_res


def rms(x):
  """RMSNorm without a gain."""
  return norms.rms_norm(x, None)


def linear(w):
  """The linear sublayer ``x @ w`` in the dtype of ``x``."""
  return lambda x: x @ jnp.asarray(w, x.dtype)


class MLP(nnx.Module):
  """GELU MLP with std 1/sqrt(fan_in) weights."""

  def __init__(self, d, *, rngs):
    self.w1 = nnx.Param(jax.random.normal(rngs.params(), (d, 4 * d)) / d**0.5)
    self.w2 = nnx.Param(jax.random.normal(rngs.params(), (4 * d, d)) / (2 * d))

  def __call__(self, x):
    h = jax.nn.gelu(x @ self.w1[...].astype(x.dtype))
    return h @ self.w2[...].astype(x.dtype)


class CausalAttention(nnx.Module):
  """Single-head causal softmax attention over axis -2."""

  def __init__(self, d, *, rngs):
    self.wqkv = nnx.Param(jax.random.normal(rngs.params(), (d, 3 * d)) / d**0.5)
    self.wo = nnx.Param(jax.random.normal(rngs.params(), (d, d)) / d**0.5)

  def __call__(self, x):
    q, k, v = jnp.split(x @ self.wqkv[...].astype(x.dtype), 3, axis=-1)
    s = jnp.einsum("...qd,...kd->...qk", q, k).astype(jnp.float32)
    s = s / math.sqrt(x.shape[-1])
    t = x.shape[-2]
    mask = jnp.tril(jnp.ones((t, t), bool)).reshape(
      (1,) * (s.ndim - 2) + (t, t)
    )
    p = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1).astype(x.dtype)
    return jnp.einsum("...qk,...kd->...qd", p, v) @ self.wo[...].astype(x.dtype)


class Linear(nnx.Module):
  """Bias-free linear branch ``x @ w``."""

  def __init__(self, w):
    self.w = nnx.Param(jnp.asarray(w))

  def __call__(self, x):
    return x @ self.w[...].astype(x.dtype)


def transformer(num_layers, d, seed=0):
  rngs = nnx.Rngs(seed)
  return [
    f(d, rngs=rngs) for _ in range(num_layers) for f in (CausalAttention, MLP)
  ]


# Post-norm schemes default to LayerNorm (their papers); the depth table
# uses RMSNorm everywhere.
POST_NORM = ("postnorm", "deepnorm", "keel")


def _kwargs(name, **extra):
  kw = dict(extra)
  if name in POST_NORM:
    kw.setdefault("norm", "rmsnorm")
  return kw


def _net(name, num_layers, d, seed=0, **extra):
  return nn_res.make_residual(
    name,
    transformer(num_layers, d, seed),
    num_features=d,
    rngs=nnx.Rngs(seed + 1),
    **_kwargs(name, **extra),
  )
