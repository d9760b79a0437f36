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


def _psa_weights(key, c, zero_out=False, zero_spatial_value=False):
  ks = jax.random.split(key, 5)
  cp = c // 2
  w = dict(
    channel_query=jax.random.normal(ks[0], (c, 1)),
    channel_value=jax.random.normal(ks[1], (c, cp)) / np.sqrt(c),
    channel_out=jax.random.normal(ks[2], (cp, c)) / np.sqrt(cp),
    norm_scale=jnp.ones(c),
    norm_bias=jnp.zeros(c),
    spatial_query=jax.random.normal(ks[3], (c, cp)) / np.sqrt(c),
    spatial_value=jax.random.normal(ks[4], (c, cp)) / np.sqrt(c),
  )
  if zero_out:
    w["channel_out"] = jnp.zeros((cp, c))
  if zero_spatial_value:
    w["spatial_value"] = jnp.zeros((c, cp))
  return w


def test_psa_identities(key):
  x = jax.random.normal(key, (2, 5, 4, 8))
  w = _psa_weights(key, 8, zero_out=True, zero_spatial_value=True)
  ch = vision.psa_channel(
    x,
    w["channel_query"],
    w["channel_value"],
    w["channel_out"],
    w["norm_scale"],
    w["norm_bias"],
  )
  helpers.assert_close(ch, x / 2, atol=1e-6)
  y = vision.polarized_self_attention(x, **w)
  helpers.assert_close(y, x, atol=1e-6)
  # Constant W_q x -> uniform softmax -> z is the spatial mean of W_v x.
  wq = jnp.zeros((8, 1))
  z_ch = vision.psa_channel(
    x, wq, w["channel_value"], jnp.eye(4, 8), jnp.ones(8), jnp.zeros(8), eps=0.0
  )
  z = (x @ w["channel_value"]).mean(axis=(1, 2))
  zz = jnp.concatenate([z, jnp.zeros((2, 4))], -1)
  zn = (zz - zz.mean(-1, keepdims=True)) / zz.std(-1, keepdims=True)
  helpers.assert_close(
    z_ch, x * jax.nn.sigmoid(zn)[:, None, None, :], atol=1e-5
  )


def test_psa_spatial_closed_form_and_order(key):
  x = jax.random.normal(key, (2, 3, 4, 8))
  w = _psa_weights(jax.random.key(5), 8)
  q = jax.nn.softmax((x @ w["spatial_query"]).mean(axis=(1, 2)), -1)
  a = jax.nn.sigmoid(jnp.einsum("bhwc,bc->bhw", x @ w["spatial_value"], q))
  helpers.assert_close(
    vision.psa_spatial(x, w["spatial_query"], w["spatial_value"]),
    x * a[..., None],
    atol=1e-6,
  )
  seq = vision.polarized_self_attention(x, layout="sequential", **w)
  rev = vision.psa_channel(
    vision.psa_spatial(x, w["spatial_query"], w["spatial_value"]),
    w["channel_query"],
    w["channel_value"],
    w["channel_out"],
    w["norm_scale"],
    w["norm_bias"],
  )
  assert seq.shape == x.shape and not np.allclose(seq, rev, atol=1e-4)


def test_psa_errors(key):
  x = jnp.ones((1, 2, 2, 8))
  w = _psa_weights(key, 8)
  with pytest.raises(ValueError, match=r"layout must be one of"):
    vision.polarized_self_attention(x, layout="mixed", **w)
  with pytest.raises(ValueError, match=r"psa_channel: query must have shape"):
    vision.psa_channel(
      x,
      jnp.ones((8, 2)),
      w["channel_value"],
      w["channel_out"],
      w["norm_scale"],
      w["norm_bias"],
    )
  with pytest.raises(ValueError, match=r"psa_spatial: value must have shape"):
    vision.psa_spatial(x, w["spatial_query"], jnp.ones((8, 3)))


def test_modules_match_functions(key):
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
  p = nn_vision.PolarizedSelfAttention(
    32, layout="sequential", rngs=nnx.Rngs(0)
  )
  y = p(x)
  w = {
    n: getattr(p, n)[...]
    for n in (
      "channel_query",
      "channel_value",
      "channel_out",
      "norm_scale",
      "norm_bias",
      "spatial_query",
      "spatial_value",
    )
  }
  helpers.assert_close(
    y, vision.polarized_self_attention(x, layout="sequential", **w), atol=0
  )
  with pytest.raises(ValueError, match=r"channels=9 must be divisible by 2"):
    nn_vision.PolarizedSelfAttention(9, rngs=nnx.Rngs(0))
