"""Polarized self-attention: NumPy float64 transcriptions, the module."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from jaxnorm.nn.attention import psa as nn_psa
from tests import helpers

# PSA: NumPy float64 transcriptions of the official PSA_p / PSA_s (NCHW,
# torch weight layouts), as in DeLightCMU/PSA network/PSA.py.


def _conv1x1(x, w, b=None):
  """torch ``Conv2d(k=1)`` on NCHW, weight ``(out, in, 1, 1)``."""
  y = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
  return y if b is None else y + b[None, :, None, None]


def _softmax(a, axis):
  e = np.exp(a - a.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _sigmoid(a):
  return 1 / (1 + np.exp(-a))


def _spatial_pool_np(x, t, conv_up):
  """``spatial_pool`` (the channel branch) of both official classes."""
  v = _conv1x1(x, t["conv_v_right"])
  b, ic, h, w = v.shape
  mask = _softmax(_conv1x1(x, t["conv_q_right"]).reshape(b, 1, h * w), 2)
  context = (v.reshape(b, ic, h * w) @ mask.transpose(0, 2, 1))[..., None]
  return x * _sigmoid(conv_up(context))


def _channel_pool_np(x, t, softmax_theta):
  """``channel_pool`` (the spatial branch): PSA_s softmaxes theta."""
  g = _conv1x1(x, t["conv_q_left"])
  b, ic, h, w = g.shape
  avg = g.mean(axis=(2, 3)).reshape(b, ic, 1).transpose(0, 2, 1)
  theta = _conv1x1(x, t["conv_v_left"]).reshape(b, ic, h * w)
  if softmax_theta:
    context = avg @ _softmax(theta, 2)
  else:
    context = _softmax(avg @ theta, 2)
  return x * _sigmoid(context.reshape(b, 1, h, w))


def _psa_p_np(x, t):
  up = lambda c: _conv1x1(c, t["conv_up"])  # noqa: E731
  return _channel_pool_np(x, t, False) + _spatial_pool_np(x, t, up)


def _psa_s_np(x, t, eps=1e-5):
  def up(c):
    h = _conv1x1(c, t["up0_w"], t["up0_b"])  # (N, Cb, 1, 1)
    mu = h.mean(axis=(1, 2, 3), keepdims=True)
    var = h.var(axis=(1, 2, 3), keepdims=True)
    h = (h - mu) / np.sqrt(var + eps) * t["ln_w"] + t["ln_b"]
    return _conv1x1(np.maximum(h, 0), t["up3_w"], t["up3_b"])

  return _channel_pool_np(_spatial_pool_np(x, t, up), t, True)


def _torch_psa_weights(seed, c, variant):
  """Random torch-layout weights of PSA_p / PSA_s (float64)."""
  rng = np.random.default_rng(seed)
  cp = c // 2

  def conv(o, i):
    return rng.normal(size=(o, i, 1, 1)) * np.sqrt(2.0 / i)

  t = {
    "conv_q_right": conv(1, c),
    "conv_v_right": conv(cp, c),
    "conv_q_left": conv(cp, c),
    "conv_v_left": conv(cp, c),
  }
  if variant == "parallel":
    t["conv_up"] = conv(c, cp)
  else:
    cb = cp // 4
    t.update(
      up0_w=conv(cb, cp),
      up0_b=rng.normal(size=cb) * 0.3,
      ln_w=(1 + 0.2 * rng.normal(size=cb)).reshape(cb, 1, 1),
      ln_b=(0.2 * rng.normal(size=cb)).reshape(cb, 1, 1),
      up3_w=conv(c, cb),
      up3_b=rng.normal(size=c) * 0.3,
    )
  return t


def _ours(t):
  """The torch weights as the keyword weights of the pure functions."""

  def mat(w):  # (out, in, 1, 1) -> (in, out)
    return jnp.asarray(w[:, :, 0, 0].T, jnp.float32)

  w = {
    "channel_query": mat(t["conv_q_right"]),
    "channel_value": mat(t["conv_v_right"]),
    "spatial_query": mat(t["conv_q_left"]),
    "spatial_value": mat(t["conv_v_left"]),
  }
  if "conv_up" in t:
    w["channel_up"] = mat(t["conv_up"])
    return w
  f32 = lambda a: jnp.asarray(a.reshape(-1), jnp.float32)  # noqa: E731
  w.update(
    channel_down=mat(t["up0_w"]),
    channel_down_bias=f32(t["up0_b"]),
    channel_norm_scale=f32(t["ln_w"]),
    channel_norm_bias=f32(t["ln_b"]),
    channel_up=mat(t["up3_w"]),
    channel_up_bias=f32(t["up3_b"]),
  )
  return w


# Jitted once for the whole module (eager PSA dispatches dozens of ops).
_PSA_P = jax.jit(attn.psa_parallel)
_PSA_S = jax.jit(attn.psa_sequential)
_PSA_PAPER = jax.jit(attn.psa_paper_form, static_argnames="layout")


@pytest.mark.parametrize(
  ("variant", "fn", "oracle"),
  [
    ("parallel", _PSA_P, _psa_p_np),
    ("sequential", _PSA_S, _psa_s_np),
  ],
)
def test_psa_official_matches_numpy_transcription(variant, fn, oracle):
  c = 16
  t = _torch_psa_weights(0, c, variant)
  x = np.random.default_rng(1).normal(size=(2, c, 5, 3))  # NCHW
  want = oracle(x, t).transpose(0, 2, 3, 1)
  y = fn(jnp.asarray(x.transpose(0, 2, 3, 1), jnp.float32), **_ours(t))
  helpers.assert_close(y, want, atol=1e-5)
  # The order matters in PSA_s, and the two official layers differ.
  other = _psa_p_np if variant == "sequential" else _psa_s_np
  t2 = _torch_psa_weights(
    0, c, "sequential" if variant == "parallel" else "parallel"
  )
  t2.update(
    {
      k: t[k]
      for k in ("conv_q_right", "conv_v_right", "conv_q_left", "conv_v_left")
    }
  )
  assert not np.allclose(other(x, t2).transpose(0, 2, 3, 1), want, atol=1e-3)


def test_psa_closed_forms(key):
  """Zero up conv: A_ch = 1/2; zero theta: uniform spatial softmax."""
  x = jax.random.normal(key, (2, 5, 4, 8))
  w = _ours(_torch_psa_weights(2, 8, "parallel"))
  w["channel_up"] = jnp.zeros((4, 8))
  w["spatial_value"] = jnp.zeros((8, 4))
  # PSA_p: softmax over HW of zero logits is 1/HW, then the sigmoid.
  want = x / 2 + x * jax.nn.sigmoid(1 / 20)
  helpers.assert_close(_PSA_P(x, **w), want, atol=1e-6)
  # PSA_s: softmax_HW(theta = 0) = 1/HW per channel, <g, 1/HW> = sum(g)/HW.
  s = _ours(_torch_psa_weights(3, 8, "sequential"))
  s["channel_up"], s["channel_up_bias"] = jnp.zeros((1, 8)), jnp.zeros(8)
  s["spatial_value"] = jnp.zeros((8, 4))
  half = x / 2
  g = (half @ s["spatial_query"]).mean(axis=(1, 2)).sum(-1) / 20
  want = half * jax.nn.sigmoid(g)[:, None, None, None]
  helpers.assert_close(_PSA_S(x, **s), want, atol=1e-6)
  # Paper form: LN(0) = bias = 0, and theta = 0 gives sigmoid(0) as well.
  p = dict(w, norm_scale=jnp.ones(8), norm_bias=jnp.zeros(8))
  helpers.assert_close(_PSA_PAPER(x, **p), x, atol=1e-6)
  helpers.assert_close(
    _PSA_PAPER(x, layout="sequential", **p), x / 4, atol=1e-6
  )


def test_psa_paper_form_matches_numpy(key):
  x = np.random.default_rng(4).normal(size=(2, 3, 4, 8))
  t = _torch_psa_weights(5, 8, "parallel")
  w = _ours(t)
  scale, bias = np.linspace(0.5, 1.5, 8), np.linspace(-0.3, 0.3, 8)
  f64 = {n: np.asarray(a, np.float64) for n, a in w.items()}

  def channel(x):
    q = _softmax((x @ f64["channel_query"]).reshape(2, -1), 1)
    z = np.einsum("bp,bpc->bc", q, (x @ f64["channel_value"]).reshape(2, -1, 4))
    y = z @ f64["channel_up"]
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(
      y.var(-1, keepdims=True) + 1e-5
    )
    return x * _sigmoid(y * scale + bias)[:, None, None, :]

  def spatial(x):
    g = _softmax((x @ f64["spatial_query"]).mean(axis=(1, 2)), 1)
    s = np.einsum("bhwc,bc->bhw", x @ f64["spatial_value"], g)
    return x * _sigmoid(s)[..., None]

  p = dict(
    w,
    norm_scale=jnp.asarray(scale, jnp.float32),
    norm_bias=jnp.asarray(bias, jnp.float32),
  )
  xj = jnp.asarray(x, jnp.float32)
  helpers.assert_close(_PSA_PAPER(xj, **p), channel(x) + spatial(x), atol=1e-5)
  helpers.assert_close(
    _PSA_PAPER(xj, layout="sequential", **p),
    spatial(channel(x)),
    atol=1e-5,
  )


def test_psa_dtypes_and_jit(key):
  x = jax.random.normal(key, (2, 4, 4, 16))
  w = _ours(_torch_psa_weights(6, 16, "sequential"))
  yb = _PSA_S(x.astype(jnp.bfloat16), **w)
  assert yb.dtype == jnp.bfloat16 and helpers.all_finite(yb)
  helpers.assert_jit_matches_eager(
    lambda x: attn.psa_sequential(x, **w), x, atol=1e-6
  )


def test_psa_errors(key):
  x = jnp.ones((1, 2, 2, 8))
  p = _ours(_torch_psa_weights(0, 8, "parallel"))
  s = _ours(_torch_psa_weights(0, 8, "sequential"))
  with pytest.raises(ValueError, match=r"psa_parallel: x must have rank 4"):
    attn.psa_parallel(x[0], **p)
  with pytest.raises(TypeError, match=r"psa_parallel: x must have a floating"):
    attn.psa_parallel(x.astype(jnp.int32), **p)
  with pytest.raises(
    ValueError, match=r"channel_query must have shape \(8, 1\)"
  ):
    attn.psa_parallel(x, **dict(p, channel_query=jnp.ones((8, 2))))
  with pytest.raises(
    ValueError, match=r"channel_value must have shape \(8, C'\)"
  ):
    attn.psa_parallel(x, **dict(p, channel_value=jnp.ones((3, 4))))
  with pytest.raises(
    ValueError, match=r"spatial_value must have shape \(8, 4\)"
  ):
    attn.psa_parallel(x, **dict(p, spatial_value=jnp.ones((8, 3))))
  with pytest.raises(ValueError, match=r"psa_parallel: channel_up must have"):
    attn.psa_parallel(x, **dict(p, channel_up=jnp.ones((8, 4))))
  with pytest.raises(
    ValueError, match=r"channel_down must have shape \(4, C_b\)"
  ):
    attn.psa_sequential(x, **dict(s, channel_down=jnp.ones((3, 1))))
  with pytest.raises(ValueError, match=r"channel_norm_bias must have shape"):
    attn.psa_sequential(x, **dict(s, channel_norm_bias=jnp.ones(2)))
  with pytest.raises(ValueError, match=r"psa_sequential: channel_up must have"):
    attn.psa_sequential(x, **dict(s, channel_up=jnp.ones((2, 8))))
  with pytest.raises(ValueError, match=r"channel_up_bias must have shape"):
    attn.psa_sequential(x, **dict(s, channel_up_bias=jnp.ones(4)))
  paper = dict(p, norm_scale=jnp.ones(8), norm_bias=jnp.zeros(8))
  with pytest.raises(ValueError, match=r"layout must be one of"):
    attn.psa_paper_form(x, layout="mixed", **paper)
  with pytest.raises(ValueError, match=r"psa_paper_form: channel_up must"):
    attn.psa_paper_form(x, **dict(paper, channel_up=jnp.ones((8, 8))))
  with pytest.raises(ValueError, match=r"norm_scale must have shape"):
    attn.psa_paper_form(x, **dict(paper, norm_scale=jnp.ones(4)))


_PSA_FN = {"parallel": _PSA_P, "sequential": _PSA_S}


@pytest.mark.parametrize("variant", nn_psa.PSA_VARIANTS)
def test_psa_module_matches_function(key, variant):
  x = jax.random.normal(key, (2, 6, 5, 32))
  m = nn_attn.PolarizedSelfAttention(32, variant=variant, rngs=nnx.Rngs(0))
  w = m.weights()
  if variant in _PSA_FN:
    want = _PSA_FN[variant](x, **w)
  else:
    layout = variant.removeprefix("paper_")
    want = _PSA_PAPER(x, layout=layout, **w)
  helpers.assert_close(nnx.jit(lambda m, x: m(x))(m, x), want, atol=0)
  shapes = {n: a.shape for n, a in w.items()}
  assert shapes["channel_value"] == (32, 16)
  if variant == "sequential":
    assert shapes["channel_down"] == (16, 4) and shapes["channel_up"] == (4, 32)
  else:
    assert shapes["channel_up"] == (16, 32)


def test_psa_module_init_is_the_official_one():
  """q/v convs: untruncated Kaiming normal (fan-in); up convs: torch default."""
  c = 64
  m = nn_attn.PolarizedSelfAttention(c, variant="sequential", rngs=nnx.Rngs(0))
  std = np.sqrt(2 / c)
  kaiming = np.concatenate(
    [
      np.ravel(getattr(m, n)[...])
      for n in ("channel_value", "spatial_query", "spatial_value")
    ]
  )
  assert abs(kaiming.std() / std - 1) < 0.05
  assert np.abs(kaiming).max() > 2.5 * std  # Not truncated at 2 std.
  for name, fan_in in (
    ("channel_down", 32),
    ("channel_down_bias", 32),
    ("channel_up", 8),
    ("channel_up_bias", 8),
  ):
    a = np.asarray(getattr(m, name)[...])
    bound = 1 / np.sqrt(fan_in)
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.5 * bound, name
  np.testing.assert_array_equal(m.channel_norm_scale[...], np.ones(8))
  np.testing.assert_array_equal(m.channel_norm_bias[...], np.zeros(8))


def test_psa_module_errors():
  with pytest.raises(ValueError, match=r"variant must be one of 'parallel'"):
    nn_attn.PolarizedSelfAttention(8, variant="p", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"'sequential' needs channels >= 8"):
    nn_attn.PolarizedSelfAttention(6, variant="sequential", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"'parallel' needs channels >= 2"):
    nn_attn.PolarizedSelfAttention(1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"channels must be a positive integer"):
    nn_attn.PolarizedSelfAttention(0, rngs=nnx.Rngs(0))
