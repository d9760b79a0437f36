"""Decode cache of `MultiHeadAttention`: decoding equals the full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers

D, N, K, H = 16, 4, 2, 4
B, T = 2, 7
CACHE_CORES = [
  n
  for n in nn_attn.TOKEN_ATTENTIONS
  if nn_attn.ATTENTIONS[n].core.supports_cache
]
NO_CACHE_CORES = [n for n in nn_attn.TOKEN_ATTENTIONS if n not in CACHE_CORES]


def _x(seed=0, t=T):
  return jax.random.normal(jax.random.key(seed), (B, t, D))


def _module(name, **kw):
  """A causal GQA module with RoPE, QK-norm and non-trivial core state."""
  m = nn_attn.make_attention(
    name,
    D,
    N,
    num_kv_heads=K,
    is_causal=True,
    use_rope=True,
    qk_norm="rmsnorm",
    rngs=nnx.Rngs(0),
    **kw,
  )
  if name == "sink":
    m.core.sinks[...] = jnp.linspace(-1.0, 1.0, N)
  if name == "affine_scaled":
    m.core.alpha_ma[...] = jnp.linspace(0.5, 1.2, N)
    m.eval()
  return m


@nnx.jit
def _full(m, x, mask=None):
  return m(x, mask=mask)


@nnx.jit
def _step(m, x, mask=None, positions=None):
  return m(x, mask=mask, positions=positions, decode=True)


def _decode(m, x, chunks, max_length=T + 2, **init):
  """Feeds ``x`` in chunks of the given sizes; returns the outputs."""
  m.init_cache((B, max_length, D), **init)
  outs, i = [], 0
  for c in chunks:
    outs.append(_step(m, x[:, i : i + c]))
    i += c
  return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize("name", CACHE_CORES)
def test_decoding_equals_the_full_causal_forward(name):
  m = _module(name)
  x = _x()
  want = _full(m, x)
  helpers.assert_close(_decode(m, x, [1] * T), want, atol=2e-6)
  assert m.cached_key.shape == (B, T + 2, K, H)
  assert int(m.cache_index[...]) == T
  helpers.assert_close(_decode(m, x, [3, 1, 2, 1]), want, atol=2e-6)
  if name == "affine_scaled":  # Eval mode keeps the running estimate.
    helpers.assert_close(
      m.core.alpha_ma[...], jnp.linspace(0.5, 1.2, N), atol=0
    )


def test_decoding_with_a_local_window_and_soft_cap():
  m = _module("softmax", local_window_size=(2, 0), logits_soft_cap=5.0)
  x = _x(1)
  want = _full(m, x)
  helpers.assert_close(_decode(m, x, [1] * T), want, atol=2e-6)
  helpers.assert_close(_decode(m, x, [4, 3]), want, atol=2e-6)
  wide = _module("softmax")  # The window changes the result.
  assert float(jnp.abs(_full(wide, x) - want).max()) > 1e-3


def test_cache_mask_positions_and_dtype():
  m = _module("softmax")
  x = _x(2)
  # Explicit positions (the default ones) give the default result.
  m.init_cache((B, T, D))
  first = _step(m, x[:, :3], positions=jnp.arange(3))
  helpers.assert_close(first, _full(m, x)[:, :3], atol=2e-6)
  # A user mask hiding key 0 from every query, in cache coordinates.
  m.init_cache((B, T, D))
  hide = jnp.arange(T)[None, None, None, :] > 0
  got = jnp.concatenate(
    [_step(m, x[:, i : i + 1], mask=hide) for i in range(T)], axis=1
  )
  full_hide = jnp.broadcast_to(hide, (1, 1, T, T))
  want = _full(m, x, mask=full_hide)
  helpers.assert_close(got[:, 1:], want[:, 1:], atol=2e-6)
  # A bfloat16 cache stores bfloat16 and still decodes.
  m.init_cache((B, T, D), jnp.bfloat16)
  y = _step(m, x[:, :2])
  assert m.cached_key[...].dtype == jnp.bfloat16 and helpers.all_finite(y)


def test_decode_matches_flax_decode():
  """flax's own decode loop and the loaded jaxnorm module agree."""
  f = nnx.MultiHeadAttention(
    N, D, num_kv_heads=K, decode=True, rngs=nnx.Rngs(5)
  )
  m = nn_attn.from_flax_attention(f)
  x = _x(3)
  f.init_cache(x.shape)
  flax_step = nnx.jit(lambda f, x: f(x))
  theirs = jnp.concatenate(
    [flax_step(f, x[:, i : i + 1]) for i in range(T)], axis=1
  )
  ours = _decode(m, x, [1] * T, max_length=T)
  helpers.assert_close(ours, theirs, atol=2e-6)
  causal = nnx.make_causal_mask(jnp.ones((B, T)))
  helpers.assert_close(ours, f(x, mask=causal, decode=False), atol=2e-6)


def test_decode_mask_matches_loops():
  got = np.asarray(attn.decode_mask(3, 4, 9, local_window_size=(2, 5)))
  want = np.zeros((1, 1, 4, 9), bool)
  for i in range(4):
    for j in range(9):
      want[0, 0, i, j] = 3 + i - 2 <= j <= 3 + i
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match=r"decode_mask: q_len must be"):
    attn.decode_mask(0, 0, 4)
  with pytest.raises(ValueError, match=r"decode_mask: local_window_size"):
    attn.decode_mask(0, 1, 4, local_window_size=-1)


@pytest.mark.parametrize("name", NO_CACHE_CORES)
def test_cores_without_a_cache_refuse(name):
  kw = {"max_len": 8} if name == "lina" else {}
  kv = N if nn_attn.ATTENTIONS[name].core.ties_keys else K
  m = nn_attn.make_attention(
    name, D, N, num_kv_heads=kv, rngs=nnx.Rngs(0), **kw
  )
  core = type(m.core).__name__
  with pytest.raises(
    ValueError,
    match=rf"init_cache: the '{name}' core \({core}\) has no decode cache; "
    r"cores with one: softmax, off_by_one, sink, gated, affine_scaled",
  ):
    m.init_cache((B, T, D))
  with pytest.raises(
    ValueError, match=rf"the '{name}' core \({core}\) cannot decode"
  ):
    m(_x(t=2), decode=True)


def test_decode_errors():
  m = _module("softmax")
  x = _x()
  with pytest.raises(ValueError, match=r"decode=True needs a cache"):
    m(x[:, :1], decode=True)
  m.init_cache((B, 4, D))
  with pytest.raises(ValueError, match=r"takes no inputs_k/inputs_v"):
    m(x[:, :1], x[:, :1], decode=True)
  with pytest.raises(ValueError, match=r"5 tokens do not fit the cache of"):
    m(x[:, :5], decode=True)
  with pytest.raises(ValueError, match=r"the cache was built for batch 2"):
    m(x[:1, :1], decode=True)
  with pytest.raises(TypeError, match=r"mask must be boolean"):
    m(x[:, :1], mask=jnp.ones((1, 1, 1, 4)), decode=True)
  with pytest.raises(ValueError, match=r"input_shape must be \(batch, max_"):
    m.init_cache((B, D))
  with pytest.raises(ValueError, match=r"max_length must be a positive"):
    m.init_cache((B, 0, D))
  with pytest.raises(ValueError, match=r"policy must be one of"):
    m.init_cache((B, 4, D), policy="ring")
  affine = nn_attn.make_attention(
    "affine_scaled", D, N, is_causal=True, rngs=nnx.Rngs(0)
  )
  affine.init_cache((B, 4, D))
  with pytest.raises(ValueError, match=r"training mode every call updates"):
    affine(x[:, :1], decode=True)


def test_decode_flag_and_view():
  """flax's module-level flag: at construction or through ``nnx.view``."""
  x = _x()
  flag = nn_attn.MultiHeadAttention(D, N, decode=True, rngs=nnx.Rngs(0))
  flag.init_cache((B, 4, D))
  flag(x[:, :1])
  assert int(flag.cache_index[...]) == 1
  m = _module("gated")
  view = nnx.view(m, decode=True)
  assert view.decode and not m.decode
  view.init_cache((B, T, D))
  got = jnp.concatenate([_full(view, x[:, i : i + 1]) for i in range(T)], 1)
  helpers.assert_close(got, _full(m, x), atol=2e-6)
