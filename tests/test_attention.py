import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention as attn
from tests import helpers

ORACLES = pathlib.Path(__file__).parent / "oracles"


def _qkv(key, b=2, t=5, s=6, n=4, k=2, h=8, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(key, 3)
  q = jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype)
  kk_ = jax.random.normal(kk, (b, s, k, h), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (b, s, k, h), jnp.float32).astype(dtype)
  return q, kk_, v


# --- dot_product_attention vs jax.nn -----------------------------------------


CASES = {
  "mha": dict(n=4, k=4),
  "gqa": dict(n=4, k=2),
  "mqa": dict(n=4, k=1),
}


@pytest.mark.parametrize("heads", list(CASES))
@pytest.mark.parametrize("extras", ["plain", "mask", "causal", "bias", "all"])
def test_sdpa_matches_jax(key, heads, extras):
  q, k, v = _qkv(key, **CASES[heads])
  b, t, n, _ = q.shape
  s = k.shape[1]
  kw = {}
  if extras in ("mask", "all"):
    kw["mask"] = jax.random.bernoulli(jax.random.key(1), 0.7, (b, 1, t, s))
  if extras in ("bias", "all"):
    kw["bias"] = jax.random.normal(jax.random.key(2), (1, n, t, s))
  if extras in ("causal", "all"):
    kw["is_causal"] = True

  def ours(q, k, v):
    return attn.dot_product_attention(q, k, v, **kw)

  def ref(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)

  helpers.assert_vjp_matches(
    ours, ref, (q, k, v), key=jax.random.key(3), atol=2e-5
  )


def test_sdpa_bias_gradient_and_scale(key):
  q, k, v = _qkv(key)
  bias = jax.random.normal(jax.random.key(4), (2, 4, 5, 6))
  f = lambda bb: attn.dot_product_attention(q, k, v, bias=bb, scale=0.3)  # noqa
  g = lambda bb: jax.nn.dot_product_attention(q, k, v, bias=bb, scale=0.3)  # noqa
  helpers.assert_vjp_matches(f, g, (bias,), key=jax.random.key(5), atol=2e-5)


def test_sdpa_unbatched_and_jit(key):
  q, k, v = _qkv(key, b=1)
  out = attn.dot_product_attention(q[0], k[0], v[0], is_causal=True)
  want = attn.dot_product_attention(q, k, v, is_causal=True)[0]
  helpers.assert_close(out, want, atol=1e-6)
  helpers.assert_jit_matches_eager(
    attn.dot_product_attention, q, k, v, is_causal=True
  )


def test_sdpa_fully_masked_row_is_mean_of_v(key):
  q, k, v = _qkv(key, n=2, k=2)
  mask = jnp.ones((2, 1, 5, 6), bool).at[:, :, 2, :].set(False)
  out = attn.dot_product_attention(q, k, v, mask=mask)
  helpers.assert_close(out[:, 2], v.mean(axis=1), atol=1e-6)
  assert helpers.all_finite(
    jax.grad(lambda q: attn.dot_product_attention(q, k, v, mask=mask).sum())(q)
  )


def test_sdpa_length_one_and_bfloat16(key):
  q, k, v = _qkv(key, t=1, s=1)
  out = attn.dot_product_attention(q, k, v, is_causal=True)
  helpers.assert_close(out, jnp.repeat(v, 2, axis=2), atol=1e-6)
  qb, kb, vb = _qkv(key, dtype=jnp.bfloat16)
  ob = attn.dot_product_attention(qb, kb, vb, is_causal=True)
  assert ob.dtype == jnp.bfloat16 and helpers.all_finite(ob)
  of = attn.dot_product_attention(
    *(x.astype(jnp.float32) for x in (qb, kb, vb)), is_causal=True
  )
  helpers.assert_close(ob, of, atol=2e-2)


def test_sdpa_shape_errors(key):
  q, k, v = _qkv(key)
  f = attn.dot_product_attention
  with pytest.raises(ValueError, match=r"query must have rank 4"):
    f(q[0, 0], k, v)
  with pytest.raises(ValueError, match=r"key must have the same rank"):
    f(q, k[0], v)
  with pytest.raises(ValueError, match=r"key batch size must equal"):
    f(q, k[:1], v[:1])
  with pytest.raises(ValueError, match=r"key head_dim must equal"):
    f(q, k[..., :4], v)
  with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple"):
    f(
      q,
      jnp.concatenate([k, k[:, :, :1]], 2),
      jnp.concatenate([v, v[:, :, :1]], 2),
    )
  with pytest.raises(ValueError, match=r"value must match key"):
    f(q, k, v[:, :3])
  with pytest.raises(ValueError, match=r"mask must be broadcastable"):
    f(q, k, v, mask=jnp.ones((2, 4, 5, 7), bool))
  with pytest.raises(ValueError, match=r"bias must be broadcastable"):
    f(q, k, v, bias=jnp.ones((5, 6)))
  with pytest.raises(TypeError, match=r"mask must be boolean"):
    f(q, k, v, mask=jnp.ones((2, 4, 5, 6)))
  with pytest.raises(TypeError, match=r"bias must have a floating dtype"):
    f(q, k, v, bias=jnp.ones((2, 4, 5, 6), jnp.int32))
  with pytest.raises(TypeError, match=r"value must have a floating dtype"):
    f(q, k, v.astype(jnp.int32))


def test_attention_weights_rows(key):
  q, k, _ = _qkv(key)
  w = attn.attention_weights(q, k, is_causal=True)
  helpers.assert_close(w.sum(-1), np.ones((2, 4, 5)), atol=1e-6)
  assert float(jnp.abs(w[..., 0, 1:]).max()) == 0.0


# --- sinks and gates ---


def test_softmax_off_by_one_closed_form():
  x = jnp.array([[1.0, 2.0, -1.0], [-jnp.inf, -jnp.inf, -jnp.inf]])
  w = attn.softmax_off_by_one(x)
  e = np.exp([1.0, 2.0, -1.0])
  helpers.assert_close(w[0], e / (1 + e.sum()), atol=1e-7)
  helpers.assert_close(w[1], np.zeros(3), atol=0)
  w2 = attn.softmax_off_by_one(x[:1], sink=1.5)
  helpers.assert_close(w2[0], e / (np.exp(1.5) + e.sum()), atol=1e-7)
  # Large logits stay finite.
  assert helpers.all_finite(attn.softmax_off_by_one(x[:1] * 1e4))


def test_sink_equals_extra_zero_key(key):
  q, k, v = _qkv(key, n=4, k=4)
  sinks = jnp.array([0.0, 1.5, -2.0, 0.3])
  out = attn.sink_attention(q, k, v, sinks=sinks, is_causal=True)
  # Closed form via one appended key with zero value and bias column s_h.
  kz = jnp.concatenate([k, jnp.zeros_like(k[:, :1])], axis=1)
  vz = jnp.concatenate([v, jnp.zeros_like(v[:, :1])], axis=1)
  causal = jnp.tril(jnp.ones((5, 6), bool))
  mask = jnp.concatenate([causal, jnp.ones((5, 1), bool)], 1)[None, None]
  bias = jnp.concatenate(
    [
      jnp.zeros((1, 4, 5, 6)),
      jnp.broadcast_to(sinks.reshape(1, 4, 1, 1), (1, 4, 5, 1)),
    ],
    axis=-1,
  )
  want = jax.nn.dot_product_attention(q, kz, vz, bias=bias, mask=mask)
  helpers.assert_close(out, want, atol=1e-6)


def test_sink_fully_masked_row_is_zero_and_length_one(key):
  q, k, v = _qkv(key, t=1, s=1)
  out = attn.sink_attention(q, k, v, mask=jnp.zeros((1, 1, 1, 1), bool))
  helpers.assert_close(out, np.zeros(out.shape), atol=0)
  qb, kb, vb = _qkv(key, dtype=jnp.bfloat16)
  ob = attn.sink_attention(qb, kb, vb, sinks=jnp.ones((4,)), is_causal=True)
  assert ob.dtype == jnp.bfloat16 and helpers.all_finite(ob)
  with pytest.raises(ValueError, match=r"sinks must have shape \(4,\)"):
    attn.sink_attention(q, k, v, sinks=jnp.ones((2,)))


def test_gated_output(key):
  q, k, v = _qkv(key)
  y = attn.dot_product_attention(q, k, v)
  big = jnp.full(y.shape, 50.0)
  helpers.assert_close(attn.gated_attention_output(y, big), y, atol=1e-6)
  hw = attn.gated_attention_output(y, jnp.zeros(y.shape[:-1] + (1,)))
  helpers.assert_close(hw, y / 2, atol=1e-7)
  with pytest.raises(ValueError, match=r"gate_logits must have shape"):
    attn.gated_attention_output(y, jnp.zeros(y.shape[:-1] + (2,)))


def _oracle(name):
  return dict(np.load(ORACLES / f"{name}.npz"))


def test_sinks_and_gates_match_x_transformers_golden():
  g = _oracle("attention_sinks_xtransformers")
  q, k, v = (jnp.asarray(g[n]).transpose(0, 2, 1, 3) for n in "qkv")
  mask = jnp.asarray(g["mask"])[:, None, None, :]
  zero = attn.sink_attention(q, k, v, mask=mask)
  helpers.assert_close(zero, g["out_zero_kv"].transpose(0, 2, 1, 3), atol=1e-5)
  sink = attn.sink_attention(q, k, v, mask=mask, sinks=jnp.asarray(g["sinks"]))
  helpers.assert_close(
    sink, g["out_learned_sink"].transpose(0, 2, 1, 3), atol=1e-5
  )
  for mode in ("dimwise", "headwise"):
    x = jnp.asarray(g[f"gate_{mode}_x"])
    b, t, _ = x.shape
    heads, dh = int(g["gate_heads"]), int(g["gate_dim_head"])
    proj = lambda w: (x @ jnp.asarray(w).T).reshape(b, t, heads, -1)  # noqa
    qg, kg, vg = (proj(g[f"gate_{mode}_w{n}"]) for n in "qkv")
    y = attn.dot_product_attention(qg, kg, vg, is_causal=True)
    gl = proj(g[f"gate_{mode}_wgate"])
    y = attn.gated_attention_output(y, gl).reshape(b, t, heads * dh)
    out = y @ jnp.asarray(g[f"gate_{mode}_wout"]).T
    helpers.assert_close(out, g[f"gate_{mode}_out"], atol=1e-5)


def test_sinks_and_gates_live_x_transformers():
  pytest.importorskip("torch")
  pytest.importorskip("x_transformers")
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "oracle", ORACLES / "attention_sinks_xtransformers.py"
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  live = mod.generate()
  stored = _oracle("attention_sinks_xtransformers")
  for name, value in live.items():
    np.testing.assert_allclose(value, stored[name], atol=1e-6, err_msg=name)


# --- affine-scaled attention ---


def test_linear_clipping():
  x = jnp.array([-6.0, -5.0, 0.0, 2.0, 5.0, 9.0])
  helpers.assert_close(
    attn.linear_clipping(x), np.array([0, 0, 0.5, 0.7, 1, 1.0]), atol=1e-7
  )


def test_affine_unit_scale_zero_bias_is_softmax(key):
  q, k, v = _qkv(key)
  ones = jnp.ones((2, 5, 4))
  for kw in (
    {},
    {"is_causal": True},
    {"mask": jax.random.bernoulli(key, 0.8, (2, 1, 5, 6))},
  ):
    out, ma = attn.affine_scaled_attention(
      q, k, v, alpha=ones, alpha_ma=jnp.ones((4,)), **kw
    )
    want = attn.dot_product_attention(q, k, v, **kw)
    rows = (
      jnp.ones((2, 5), bool) if "mask" not in kw else kw["mask"].any(-1)[:, 0]
    )
    helpers.assert_close(
      jnp.where(rows[..., None, None], out, 0.0),
      jnp.where(rows[..., None, None], want, 0.0),
      atol=1e-6,
    )
    helpers.assert_close(ma, np.ones(4), atol=0)


def _explicit_affine(q, k, v, alpha, ama, causal):
  p = np.asarray(attn.attention_weights(q, k, is_causal=causal), np.float64)
  b, n, t, s = p.shape
  allowed = np.tril(np.ones((t, s), bool)) if causal else np.ones((t, s), bool)
  cnt = allowed.sum(-1)[None, None, :, None]
  a = np.asarray(alpha, np.float64).transpose(0, 2, 1)[..., None]
  w = np.where(allowed, a * p + (ama - a) / cnt, 0.0)
  return w


@pytest.mark.parametrize("causal", [False, True])
def test_affine_weights_rows_sum_to_alpha_ma(key, causal):
  q, k, v = _qkv(key, n=4, k=4, s=5)
  alpha = jax.random.uniform(jax.random.key(7), (2, 5, 4))
  w = _explicit_affine(q, k, v, alpha, 0.4, causal)
  np.testing.assert_allclose(w.sum(-1), 0.4, atol=1e-6)
  assert w.min() < 0  # Negative weights appear.
  out, _ = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.full((4,), 0.4), is_causal=causal
  )
  want = np.einsum("bnts,bsnh->btnh", w, np.asarray(v, np.float64))
  helpers.assert_close(out, want, atol=1e-5)
  if causal:  # Position 0 uses only v_0.
    helpers.assert_close(out[:, 0], 0.4 * v[:, 0], atol=1e-6)


def test_affine_two_key_example():
  # N=2, alpha=0.8, alpha_ma=0.4, P=(0.1, 0.9) -> A=(-0.12, 0.52).
  lg = np.log(np.array([0.1, 0.9]))
  q = jnp.ones((1, 1, 1, 1))
  k = jnp.asarray(lg, jnp.float32).reshape(1, 2, 1, 1)
  v = jnp.eye(2).reshape(1, 2, 1, 2)
  out, _ = attn.affine_scaled_attention(
    q,
    k,
    v,
    alpha=jnp.full((1, 1, 1), 0.8),
    alpha_ma=jnp.array([0.4]),
    scale=1.0,
  )
  helpers.assert_close(out[0, 0, 0], np.array([-0.12, 0.52]), atol=1e-6)


def test_affine_ema_update_and_eval(key):
  q, k, v = _qkv(key)
  alpha = jnp.full((2, 5, 4), 0.5)
  _, ma = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.zeros((4,)), training=True
  )
  helpers.assert_close(ma, np.full(4, 0.05), atol=1e-7)
  _, ma0 = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.zeros(()), training=True
  )
  assert ma0.shape == () and abs(float(ma0) - 0.05) < 1e-7
  out_tr, _ = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=jnp.zeros((4,)), training=True
  )
  out_ev, _ = attn.affine_scaled_attention(q, k, v, alpha=alpha, alpha_ma=ma)
  helpers.assert_close(out_tr, out_ev, atol=1e-6)


def test_affine_decomposition_and_masked_rows(key):
  q, k, v = _qkv(key, n=4, k=4)
  alpha = jax.random.uniform(jax.random.key(8), (2, 5, 4))
  mask = jnp.ones((2, 1, 5, 6), bool).at[0, 0, 3].set(False)
  out, _ = attn.affine_scaled_attention(
    q, k, v, mask=mask, alpha=alpha, alpha_ma=jnp.full((4,), 0.3)
  )
  sdpa = attn.dot_product_attention(q, k, v, mask=mask)
  a = alpha[..., None]
  want = a * sdpa + (0.3 - a) / 6 * v.sum(1, keepdims=True)
  helpers.assert_close(out[1], want[1], atol=1e-5)
  helpers.assert_close(out[0, 3], np.zeros((4, 8)), atol=0)
  assert helpers.all_finite(
    jax.grad(
      lambda q: attn.affine_scaled_attention(
        q, k, v, mask=mask, alpha=alpha, alpha_ma=jnp.zeros((4,))
      )[0].sum()
    )(q)
  )


def test_affine_errors(key):
  q, k, v = _qkv(key)
  f = functools.partial(attn.affine_scaled_attention, q, k, v)
  with pytest.raises(ValueError, match=r"alpha must have shape \(2, 5, 4\)"):
    f(alpha=jnp.ones((2, 5)), alpha_ma=jnp.zeros(4))
  with pytest.raises(ValueError, match=r"alpha_ma must have shape \(4,\)"):
    f(alpha=jnp.ones((2, 5, 4)), alpha_ma=jnp.zeros(3))
  with pytest.raises(ValueError, match=r"rho must be in \[0, 1\]"):
    f(alpha=jnp.ones((2, 5, 4)), alpha_ma=jnp.zeros(4), rho=2.0)
  with pytest.raises(ValueError, match=r"query must be batched"):
    attn.affine_scaled_attention(
      q[0], k[0], v[0], alpha=jnp.ones((5, 4)), alpha_ma=jnp.zeros(4)
    )
