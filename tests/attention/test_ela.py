"""ELA: timm golden vectors, a NumPy float64 oracle, the module."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"


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
  y = attn.efficient_local_attention(
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
  k, groups, ng = attn.ela_config(variant, c)
  assert groups == c // 8
  kx, kk = jax.random.split(key)
  x = jax.random.normal(kx, (2, 5, 4, c))
  kern = jax.random.normal(kk, (k, c // groups, c)) * 0.3
  scale, bias = jnp.linspace(0.5, 1.5, c), jnp.linspace(-0.2, 0.2, c)
  y = attn.efficient_local_attention(x, kern, scale, bias, norm_groups=ng)
  want = _ela_np(
    x, np.asarray(kern, np.float64), np.asarray(scale), np.asarray(bias), ng
  )
  helpers.assert_close(y, want, atol=1e-5)


def test_ela_zero_conv_is_quarter_and_batch_invariance(key):
  x = jax.random.normal(key, (3, 6, 5, 32))
  zeros = jnp.zeros((7, 1, 32))
  y = attn.efficient_local_attention(
    x, zeros, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  helpers.assert_close(y, x / 4, atol=1e-6)
  kern = jax.random.normal(key, (7, 1, 32))
  full = attn.efficient_local_attention(
    x, kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  one = attn.efficient_local_attention(
    x[1:2], kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  helpers.assert_close(full[1:2], one, atol=1e-6)
  yb = attn.efficient_local_attention(
    x.astype(jnp.bfloat16), kern, jnp.ones(32), jnp.zeros(32), norm_groups=16
  )
  assert yb.dtype == jnp.bfloat16 and helpers.all_finite(yb)


def test_ela_errors(key):
  x = jnp.ones((1, 4, 4, 32))
  ok = (jnp.ones(32), jnp.zeros(32))
  with pytest.raises(ValueError, match=r"conv_kernel must have shape"):
    attn.efficient_local_attention(x, jnp.ones((6, 1, 32)), *ok, norm_groups=16)
  with pytest.raises(ValueError, match=r"norm_scale must have shape"):
    attn.efficient_local_attention(
      x, jnp.ones((7, 1, 32)), jnp.ones(3), ok[1], norm_groups=16
    )
  with pytest.raises(
    ValueError,
    match=r"channels=32 must be divisible by "
    r"norm_groups=5",
  ):
    attn.efficient_local_attention(x, jnp.ones((7, 1, 32)), *ok, norm_groups=5)
  with pytest.raises(ValueError, match=r"x must have rank 4"):
    attn.efficient_local_attention(
      x[0], jnp.ones((7, 1, 32)), *ok, norm_groups=16
    )
  with pytest.raises(ValueError, match=r"variant must be one of"):
    attn.ela_config("XL", 32)
  with pytest.raises(ValueError, match=r"divisible by 8 \(ELA-S/L\)"):
    attn.ela_config("S", 36)


def test_ela_module_matches_function(key):
  x = jax.random.normal(key, (2, 6, 5, 32))
  m = nn_attn.ELA(32, variant="S", rngs=nnx.Rngs(0))
  assert m.conv_kernel.shape == (5, 8, 32)
  helpers.assert_close(
    m(x),
    attn.efficient_local_attention(
      x, m.conv_kernel[...], m.norm_scale[...], m.norm_bias[...], norm_groups=16
    ),
    atol=0,
  )
