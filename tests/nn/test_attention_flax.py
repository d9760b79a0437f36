"""Drop-in for flax users: cross-attention, flax weights, ``attention_fn``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers

D, DKV, N, K, H = 16, 8, 4, 2, 4
T, S = 5, 7
_RUN_OPTIONS = {"lina": {"max_len": 8}}


def _inputs(key):
  kq, kk, kv = jax.random.split(key, 3)
  return (
    jax.random.normal(kq, (2, T, D)),
    jax.random.normal(kk, (2, S, DKV)),
    jax.random.normal(kv, (2, S, DKV)),
  )


def _softmax_oracle(m, xq, xk, xv):
  """NumPy float64 cross-attention with GQA (query head n reads n // 2)."""
  p = {k: helpers.as_float64(getattr(m, k)[...]) for k in ("q_kernel",)}
  for k in ("k_kernel", "v_kernel", "out_kernel"):
    p[k] = helpers.as_float64(getattr(m, k)[...])
  xq, xk, xv = map(helpers.as_float64, (xq, xk, xv))
  q = np.einsum("btd,dnh->btnh", xq, p["q_kernel"])
  k = np.repeat(np.einsum("bsd,dkh->bskh", xk, p["k_kernel"]), N // K, 2)
  v = np.repeat(np.einsum("bsd,dkh->bskh", xv, p["v_kernel"]), N // K, 2)
  logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  y = np.einsum("bnts,bsnh->btnh", w, v)
  return np.einsum("btnh,nhd->btd", y, p["out_kernel"])


def _build(name, **kw):
  ties = nn_attn.ATTENTIONS[name].core.ties_keys
  return nn_attn.make_attention(
    name,
    D,
    N,
    num_kv_heads=N if ties else K,
    rngs=nnx.Rngs(0),
    **{**_RUN_OPTIONS.get(name, {}), **_kind_kwargs(name), **kw},
  )


def _kind_kwargs(name):
  """A complex core runs in a complex MultiHeadAttention."""
  if nn_attn.ATTENTIONS[name].dtype_kind == "complex":
    return {"param_dtype": jnp.complex64}
  return {}


def test_softmax_cross_attention_matches_numpy(key):
  m = nn_attn.MultiHeadAttention(
    D, N, num_kv_heads=K, in_kv_features=DKV, rngs=nnx.Rngs(0)
  )
  assert m.k_kernel.shape == (DKV, K, H) and m.v_kernel.shape == (DKV, K, H)
  xq, xk, xv = _inputs(key)
  helpers.assert_close(m(xq, xk, xv), _softmax_oracle(m, xq, xk, xv), atol=1e-5)
  # inputs_v defaults to inputs_k (flax's rule).
  helpers.assert_close(m(xq, xk), _softmax_oracle(m, xq, xk, xk), atol=1e-5)


@pytest.mark.parametrize("name", nn_attn.TOKEN_ATTENTIONS)
def test_every_core_cross_attends_or_refuses(key, name):
  """Registry walk: cross inputs reach k/v, or a named refusal."""
  m = _build(name)
  kind = nn_attn.ATTENTIONS[name].dtype_kind
  x = helpers.as_dtype_kind(jax.random.normal(key, (2, 6, D)), kind)
  refusal = m.core.cross_refusal()
  if refusal is not None:
    with pytest.raises(
      ValueError,
      match=rf"the '{name}' core \({type(m.core).__name__}\) takes no "
      r"inputs_k/inputs_v",
    ):
      m(x, x)
    return
  m.eval()  # Affine-scaled: no state update between the calls.
  xk = helpers.as_dtype_kind(
    jax.random.normal(jax.random.key(1), (2, 8, D)), kind
  )
  xv = helpers.as_dtype_kind(
    jax.random.normal(jax.random.key(2), (2, 8, D)), kind
  )

  @nnx.jit
  def outputs(m, x, xk, xv):
    moved = xv.at[:, 3].add(1.0)
    # The core on the projections of inputs_k and inputs_v.
    q = jnp.einsum("btd,dnh->btnh", x, m.q_kernel[...])
    k = jnp.einsum("bsd,dkh->bskh", xk, m.k_kernel[...])
    v = jnp.einsum("bsd,dkh->bskh", xv, m.v_kernel[...])
    want = jnp.einsum("btnh,nhd->btd", m.core(x, q, k, v), m.out_kernel[...])
    return m(x), m(x, x), m(x, xk, xv), m(x, xk, moved), want

  y_self, y_same, y, y_moved, want = outputs(m, x, xk, xv)
  # Passing the queries' input as inputs_k is self-attention.
  helpers.assert_close(y_same, y_self, atol=1e-5)
  assert y.shape == x.shape and helpers.all_finite(y)
  helpers.assert_close(y, want, atol=1e-5)
  assert float(jnp.abs(y_moved - y).max()) > 1e-4


def test_map_form_refuses_cross_inputs(key):
  m = nn_attn.make_attention("nala", D, N, grid_shape=(2, 3), rngs=nnx.Rngs(0))
  x = jax.random.normal(key, (2, 6, D))
  with pytest.raises(ValueError, match=r"'nala' core \(NaLaAttention\).*map"):
    m(x, x)


def test_cross_input_errors(key):
  m = nn_attn.MultiHeadAttention(D, N, in_kv_features=DKV, rngs=nnx.Rngs(0))
  xq, xk, xv = _inputs(key)
  with pytest.raises(ValueError, match=r"inputs_k cannot be None if inputs_v"):
    m(xq, None, xv)
  with pytest.raises(ValueError, match=r"inputs_k must have in_kv_features=8"):
    m(xq, xq)
  with pytest.raises(ValueError, match=r"inputs_v must have the batch size"):
    m(xq, xk, xv[:1])
  with pytest.raises(ValueError, match=r"inputs_v must have the length"):
    m(xq, xk, xv[:, :3])
  with pytest.raises(ValueError, match=r"inputs_q must have num_features=16"):
    m(xk)
  with pytest.raises(ValueError, match=r"inputs_k must have rank 3"):
    m(xq, xk[0])
  with pytest.raises(
    ValueError, match=r"in_kv_features=8 differs.*'soft' core takes no"
  ):
    nn_attn.make_attention("soft", D, N, in_kv_features=DKV, rngs=nnx.Rngs(0))
  lina = _build("lina")
  with pytest.raises(ValueError, match=r"key/value length 9 exceeds max_len"):
    lina(xq, jnp.ones((2, 9, D)))


@pytest.fixture(scope="module")
def flax_pair():
  f = nnx.MultiHeadAttention(
    N,
    D,
    qkv_features=N * H,
    num_kv_heads=K,
    in_kv_features=DKV,
    normalize_qk=True,
    decode=False,
    rngs=nnx.Rngs(3),
  )
  return f, nn_attn.from_flax_attention(f)


def test_from_flax_attention_matches_flax(key, flax_pair):
  f, m = flax_pair
  assert m.q_norm is not None and m.q_norm.bias is None
  xq, xk, xv = _inputs(key)
  call = nnx.jit(lambda m, *a, mask=None: m(*a, mask=mask))
  helpers.assert_close(call(m, xq, xk, xv), call(f, xq, xk, xv), atol=1e-5)
  self_f = nnx.MultiHeadAttention(N, D, decode=False, rngs=nnx.Rngs(4))
  self_m = nn_attn.from_flax_attention(self_f)
  np.testing.assert_array_equal(self_m.out_bias[...], self_f.out.bias[...])
  helpers.assert_close(call(self_m, xq), call(self_f, xq), atol=1e-5)
  causal = nn_attn.from_flax_attention(self_f, is_causal=True)
  mask = nnx.make_causal_mask(jnp.ones((2, T)))
  helpers.assert_close(call(causal, xq), call(self_f, xq, mask=mask), atol=1e-5)


def test_from_flax_attention_errors():
  wide = nnx.MultiHeadAttention(
    N, D, out_features=8, decode=False, rngs=nnx.Rngs(0)
  )
  with pytest.raises(ValueError, match=r"out_features must equal in_feat"):
    nn_attn.from_flax_attention(wide)
  with pytest.raises(ValueError, match=r"must be a flax.nnx.MultiHeadAtt"):
    nn_attn.from_flax_attention(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))


@pytest.mark.parametrize(
  "fn", [attn.dot_product_attention, attn.sink_attention]
)
def test_attention_fn_needs_the_adapter(key, fn):
  """A bare jaxnorm function as flax's attention_fn names the adapter."""
  xq, _, _ = _inputs(key)
  bare = nnx.MultiHeadAttention(
    N, D, attention_fn=fn, decode=False, rngs=nnx.Rngs(0)
  )
  name = fn.__name__
  with pytest.raises(
    TypeError,
    match=rf"{name}: got flax attention_fn keyword\(s\) .*dropout_rng.*"
    rf"as_flax_attention_fn\({name}\)",
  ):
    bare(xq)
  wrapped = nnx.MultiHeadAttention(
    N,
    D,
    attention_fn=attn.as_flax_attention_fn(fn),
    decode=False,
    rngs=nnx.Rngs(0),
  )
  ref = nnx.MultiHeadAttention(N, D, decode=False, rngs=nnx.Rngs(0))
  y = wrapped(xq)
  if fn is attn.dot_product_attention:
    helpers.assert_close(y, ref(xq), atol=1e-5)
  else:  # A zero sink is one extra zero-valued key with logit 0.
    assert helpers.all_finite(y) and y.shape == xq.shape
