import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import vision
from jaxnorm.nn import vision as nn_vision
from tests import helpers

ORACLES = pathlib.Path(__file__).parent / "oracles"


def _ela_np(x, kernel, scale, bias, norm_groups, eps=1e-5):
  """NumPy float64 transcription of ELA (any conv groups)."""
  x = np.asarray(x, np.float64)
  k, per, c = kernel.shape
  groups = c // per

  def gate(z):  # (B, L, C)
    b, length, _ = z.shape
    zp = np.pad(z, ((0, 0), (k // 2, k // 2), (0, 0)))
    y = np.zeros((b, length, c))
    for o in range(c):
      g = o // (c // groups)
      for i in range(per):
        for t in range(k):
          y[:, :, o] += zp[:, t : t + length, g * per + i] * kernel[t, i, o]
    yg = y.reshape(b, length, norm_groups, -1)
    mu = yg.mean(axis=(1, 3), keepdims=True)
    var = yg.var(axis=(1, 3), keepdims=True)
    yn = ((yg - mu) / np.sqrt(var + eps)).reshape(b, length, c)
    return 1 / (1 + np.exp(-(yn * scale + bias)))

  a_h = gate(x.mean(axis=2))
  a_w = gate(x.mean(axis=1))
  return x * a_h[:, :, None, :] * a_w[:, None, :, :]


def _load(name):
  return dict(np.load(ORACLES / f"{name}.npz"))


@pytest.mark.parametrize("variant", ["B", "T"])
def test_ela_matches_timm_golden(variant):
  g = _load("ela_timm")
  args = [
    jnp.asarray(g[f"{variant}_{n}"]) for n in ("x", "kernel", "scale", "bias")
  ]
  y = vision.efficient_local_attention(
    *args, norm_groups=int(g[f"{variant}_groups"])
  )
  helpers.assert_close(y, g[f"{variant}_y"], atol=1e-5)


def test_ela_live_timm():
  pytest.importorskip("torch")
  if importlib.util.find_spec("timm") is None:  # plain import needs a
    pytest.skip("timm is not installed")  # matching torchvision; see script
  spec = importlib.util.spec_from_file_location(
    "ela_oracle", ORACLES / "ela_timm.py"
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  live, stored = mod.generate(), _load("ela_timm")
  for name, value in live.items():
    np.testing.assert_allclose(value, stored[name], atol=1e-6, err_msg=name)


@pytest.mark.parametrize("variant", ["S", "L"])
def test_ela_grouped_presets_match_numpy(key, variant):
  c = 32
  k, groups, ng = vision.ela_config(variant, c)
  assert groups == c // 8
  kx, kk = jax.random.split(key)
  x = jax.random.normal(kx, (2, 5, 4, c))
  kern = jax.random.normal(kk, (k, c // groups, c)) * 0.3
  scale, bias = jnp.linspace(0.5, 1.5, c), jnp.linspace(-0.2, 0.2, c)
  y = vision.efficient_local_attention(x, kern, scale, bias, norm_groups=ng)
  want = _ela_np(
    x, np.asarray(kern, np.float64), np.asarray(scale), np.asarray(bias), ng
  )
  helpers.assert_close(y, want, atol=1e-5)


def test_ela_zero_conv_is_quarter_and_batch_invariance(key):
  x = jax.random.normal(key, (3, 6, 5, 32))
  zeros = jnp.zeros((7, 1, 32))
  y = vision.efficient_local_attention(
    x, zeros, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  helpers.assert_close(y, x / 4, atol=1e-6)
  kern = jax.random.normal(key, (7, 1, 32))
  full = vision.efficient_local_attention(
    x, kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  one = vision.efficient_local_attention(
    x[1:2], kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  helpers.assert_close(full[1:2], one, atol=1e-6)
  yb = vision.efficient_local_attention(
    x.astype(jnp.bfloat16), kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  assert yb.dtype == jnp.bfloat16 and helpers.all_finite(yb)


def test_ela_errors(key):
  x = jnp.ones((1, 4, 4, 32))
  ok = (jnp.ones(32), jnp.zeros(32))
  with pytest.raises(ValueError, match=r"conv_kernel must have shape"):
    vision.efficient_local_attention(
      x, jnp.ones((6, 1, 32)), *ok, norm_groups=16
    )
  with pytest.raises(ValueError, match=r"norm_scale must have shape"):
    vision.efficient_local_attention(
      x, jnp.ones((7, 1, 32)), jnp.ones(3), ok[1], norm_groups=16
    )
  with pytest.raises(
    ValueError,
    match=r"channels=32 must be divisible by "
    r"norm_groups=5",
  ):
    vision.efficient_local_attention(
      x, jnp.ones((7, 1, 32)), *ok, norm_groups=5
    )
  with pytest.raises(ValueError, match=r"x must have rank 4"):
    vision.efficient_local_attention(
      x[0], jnp.ones((7, 1, 32)), *ok, norm_groups=16
    )
  with pytest.raises(ValueError, match=r"variant must be one of"):
    vision.ela_config("XL", 32)
  with pytest.raises(ValueError, match=r"divisible by 8 \(ELA-S/L\)"):
    vision.ela_config("S", 36)


# ---------------------------------------------------------------------------
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
_PSA_P = jax.jit(vision.psa_parallel)
_PSA_S = jax.jit(vision.psa_sequential)
_PSA_PAPER = jax.jit(vision.psa_paper_form, static_argnames="layout")


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
    lambda x: vision.psa_sequential(x, **w), x, atol=1e-6
  )


def test_psa_errors(key):
  x = jnp.ones((1, 2, 2, 8))
  p = _ours(_torch_psa_weights(0, 8, "parallel"))
  s = _ours(_torch_psa_weights(0, 8, "sequential"))
  with pytest.raises(ValueError, match=r"psa_parallel: x must have rank 4"):
    vision.psa_parallel(x[0], **p)
  with pytest.raises(TypeError, match=r"psa_parallel: x must have a floating"):
    vision.psa_parallel(x.astype(jnp.int32), **p)
  with pytest.raises(
    ValueError, match=r"channel_query must have shape \(8, 1\)"
  ):
    vision.psa_parallel(x, **dict(p, channel_query=jnp.ones((8, 2))))
  with pytest.raises(
    ValueError, match=r"channel_value must have shape \(8, C'\)"
  ):
    vision.psa_parallel(x, **dict(p, channel_value=jnp.ones((3, 4))))
  with pytest.raises(
    ValueError, match=r"spatial_value must have shape \(8, 4\)"
  ):
    vision.psa_parallel(x, **dict(p, spatial_value=jnp.ones((8, 3))))
  with pytest.raises(ValueError, match=r"psa_parallel: channel_up must have"):
    vision.psa_parallel(x, **dict(p, channel_up=jnp.ones((8, 4))))
  with pytest.raises(
    ValueError, match=r"channel_down must have shape \(4, C_b\)"
  ):
    vision.psa_sequential(x, **dict(s, channel_down=jnp.ones((3, 1))))
  with pytest.raises(ValueError, match=r"channel_norm_bias must have shape"):
    vision.psa_sequential(x, **dict(s, channel_norm_bias=jnp.ones(2)))
  with pytest.raises(ValueError, match=r"psa_sequential: channel_up must have"):
    vision.psa_sequential(x, **dict(s, channel_up=jnp.ones((2, 8))))
  with pytest.raises(ValueError, match=r"channel_up_bias must have shape"):
    vision.psa_sequential(x, **dict(s, channel_up_bias=jnp.ones(4)))
  paper = dict(p, norm_scale=jnp.ones(8), norm_bias=jnp.zeros(8))
  with pytest.raises(ValueError, match=r"layout must be one of"):
    vision.psa_paper_form(x, layout="mixed", **paper)
  with pytest.raises(ValueError, match=r"psa_paper_form: channel_up must"):
    vision.psa_paper_form(x, **dict(paper, channel_up=jnp.ones((8, 8))))
  with pytest.raises(ValueError, match=r"norm_scale must have shape"):
    vision.psa_paper_form(x, **dict(paper, norm_scale=jnp.ones(4)))


def test_ela_module_matches_function(key):
  x = jax.random.normal(key, (2, 6, 5, 32))
  m = nn_vision.ELA(32, variant="S", rngs=nnx.Rngs(0))
  assert m.conv_kernel.shape == (5, 8, 32)
  helpers.assert_close(
    m(x),
    vision.efficient_local_attention(
      x, m.conv_kernel[...], m.norm_scale[...], m.norm_bias[...], norm_groups=16
    ),
    atol=0,
  )


_PSA_FN = {"parallel": _PSA_P, "sequential": _PSA_S}


@pytest.mark.parametrize("variant", nn_vision.PSA_VARIANTS)
def test_psa_module_matches_function(key, variant):
  x = jax.random.normal(key, (2, 6, 5, 32))
  m = nn_vision.PolarizedSelfAttention(32, variant=variant, rngs=nnx.Rngs(0))
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
  m = nn_vision.PolarizedSelfAttention(
    c, variant="sequential", rngs=nnx.Rngs(0)
  )
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
    nn_vision.PolarizedSelfAttention(8, variant="p", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"'sequential' needs channels >= 8"):
    nn_vision.PolarizedSelfAttention(6, variant="sequential", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"'parallel' needs channels >= 2"):
    nn_vision.PolarizedSelfAttention(1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"channels must be a positive integer"):
    nn_vision.PolarizedSelfAttention(0, rngs=nnx.Rngs(0))
