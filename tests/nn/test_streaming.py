"""StreamingLLM cache policy: attention sinks plus a window of recent tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers

D, N, K, H = 16, 4, 2, 4
B = 2
L, S = 6, 2  # Cache length and sinks: a window of W = 4.
W = L - S


def _module(use_rope=True):
  return nn_attn.MultiHeadAttention(
    D, N, num_kv_heads=K, is_causal=True, use_rope=use_rope, rngs=nnx.Rngs(0)
  )


@nnx.jit
def _full(m, x, mask=None):
  return m(x, mask=mask)


@nnx.jit
def _step(m, x):
  return m(x, decode=True)


def _stream(m, x, chunks, length=L, policy="streaming"):
  m.init_cache((B, length, D), policy=policy, num_sink_tokens=S)
  outs, i = [], 0
  for c in chunks:
    outs.append(_step(m, x[:, i : i + c]))
    i += c
    assert m.cached_key.shape == (B, length, K, H)  # Constant size.
  assert int(m.cache_index[...]) == i
  return jnp.concatenate(outs, axis=1)


def _visible(chunks):
  """Oracle mask (T, T): who each query sees under the official policy.

  A call of ``t`` tokens after ``n`` evicts for space (keep the sinks and
  the last ``W - t`` old tokens), appends, and attends causally.
  """
  total = sum(chunks)
  mask = np.zeros((total, total), bool)
  n = 0
  for t in chunks:
    low = max(S, n - W + t)
    for p in range(n, n + t):
      for j in range(p + 1):
        mask[p, j] = j < S or j >= low
    n += t
  return mask


def test_cache_update_matches_a_list_oracle():
  chunks = [1, 3, 2, 1, 4, 1, 1, 2]
  cache = jnp.zeros((1, L, 1, 1))
  stream, n = [], 0
  for t in chunks:
    new = jnp.arange(n + 1, n + t + 1, dtype=jnp.float32)
    cache, start = attn.streaming_cache_update(
      cache, new.reshape(1, t, 1, 1), n, num_sink_tokens=S
    )
    stream += list(range(n + 1, n + t + 1))
    n += t
    kept = stream[:S] + stream[S:][-W:] if len(stream) > L else stream
    want = np.zeros(L)
    want[: len(kept)] = kept
    np.testing.assert_array_equal(np.asarray(cache[0, :, 0, 0]), want)
    assert int(start) == len(kept) - t  # The first new token's slot.


def test_cache_update_errors():
  c = jnp.zeros((1, L, 1, 1))
  with pytest.raises(
    ValueError, match=r"at most the window W = cache length 6 - num_sink_t"
  ):
    attn.streaming_cache_update(
      c, jnp.zeros((1, 5, 1, 1)), 0, num_sink_tokens=S
    )
  with pytest.raises(ValueError, match=r"below the cache length 6"):
    attn.streaming_cache_update(c, c[:, :1], 0, num_sink_tokens=6)
  with pytest.raises(ValueError, match=r"num_sink_tokens must be an int >= 0"):
    attn.streaming_cache_update(c, c[:, :1], 0, num_sink_tokens=-1)
  with pytest.raises(ValueError, match=r"new must match cached on every"):
    attn.streaming_cache_update(c, jnp.zeros((1, 1, 2, 1)), 0)
  with pytest.raises(ValueError, match=r"cached must have rank 4"):
    attn.streaming_cache_update(c[0], c[:, :1], 0)


def test_equals_plain_decoding_while_it_fits():
  m = _module()
  x = jax.random.normal(jax.random.key(0), (B, L, D))
  want = _full(m, x)
  helpers.assert_close(_stream(m, x, [1] * L), want, atol=2e-6)
  helpers.assert_close(_stream(m, x, [2, 3, 1]), want, atol=2e-6)
  plain = _stream(m, x, [1] * L, policy="full")
  helpers.assert_close(plain, want, atol=2e-6)


@pytest.mark.parametrize("chunks", [[1] * 14, [1, 3, 2, 4, 1, 3]])
def test_after_eviction_attends_to_sinks_and_window(chunks):
  """Without RoPE: the full forward with the explicit sinks+window mask."""
  m = _module(use_rope=False)
  x = jax.random.normal(jax.random.key(1), (B, sum(chunks), D))
  mask = jnp.asarray(_visible(chunks))[None, None]
  want = _full(m, x, mask)
  helpers.assert_close(_stream(m, x, chunks), want, atol=2e-6)
  # The eviction matters: plain causal attention differs late in the stream.
  assert float(jnp.abs(_full(m, x)[:, -1] - want[:, -1]).max()) > 1e-3


def _rope64(x, pos):
  half = x.shape[-1] // 2
  inv = 10000.0 ** (-np.arange(half) * 2.0 / x.shape[-1])
  ang = np.asarray(pos, np.float64)[:, None] * inv
  cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
  x1, x2 = x[..., :half], x[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _pos_shift_oracle(m, x, text_positions=False):
  """Token-by-token float64 decoding, RoPE at positions within the cache.

  ``text_positions=True`` rotates at the tokens' text positions instead (a
  wrong policy, to show the test can tell them apart).
  """
  p = {
    k: helpers.as_float64(getattr(m, k)[...])
    for k in ("q_kernel", "k_kernel", "v_kernel", "out_kernel")
  }
  x64 = helpers.as_float64(x)
  q = np.einsum("btd,dnh->btnh", x64, p["q_kernel"])
  k = np.einsum("btd,dkh->btkh", x64, p["k_kernel"])
  v = np.einsum("btd,dkh->btkh", x64, p["v_kernel"])
  out = np.zeros(x.shape)
  for t in range(x.shape[1]):
    kept = sorted(set(range(min(S, t + 1))) | set(range(t - W + 1, t + 1)))
    kept = [j for j in kept if j >= 0]
    ranks = kept if text_positions else np.arange(len(kept))
    kr = np.repeat(_rope64(k[:, kept], ranks), N // K, axis=2)
    vr = np.repeat(v[:, kept], N // K, axis=2)
    qr = _rope64(q[:, t : t + 1], [t if text_positions else len(kept) - 1])
    logits = np.einsum("bqnh,bsnh->bnqs", qr, kr) / np.sqrt(H)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum("bnqs,bsnh->bqnh", w, vr)
    out[:, t] = np.einsum("bqnh,nhd->bqd", y, p["out_kernel"])[:, 0]
  return out


def test_rope_positions_are_positions_within_the_cache():
  """The official pos-shift (keys rotated at their cache slots)."""
  m = _module()
  x = jax.random.normal(jax.random.key(2), (B, 13, D))
  got = _stream(m, x, [1] * 13)
  helpers.assert_close(got, _pos_shift_oracle(m, x), atol=2e-5)
  text = _pos_shift_oracle(m, x, text_positions=True)
  assert float(np.abs(np.asarray(got) - text).max()) > 1e-3


def test_streaming_errors():
  m = _module()
  x = jnp.ones((B, 5, D))
  with pytest.raises(ValueError, match=r"num_sink_tokens must be an int in"):
    m.init_cache((B, L, D), policy="streaming", num_sink_tokens=L)
  m.init_cache((B, L, D), policy="streaming", num_sink_tokens=S)
  with pytest.raises(ValueError, match=r"num_sink_tokens 2 = 4 tokens, got"):
    m(x, decode=True)
  with pytest.raises(ValueError, match=r"positions must be None"):
    m(x[:, :1], positions=jnp.zeros((1,)), decode=True)
  window = nn_attn.make_attention(
    "softmax", D, N, local_window_size=(3, 0), rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match=r"'streaming' is a window of its own"):
    window.init_cache((B, L, D), policy="streaming")
