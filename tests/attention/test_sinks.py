"""Off-by-one, learnable sinks and gated output."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm.nn import attention as nn_attn
from tests import helpers
from tests.attention import _common
from tests.attention._common import D, N

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = _common.qkv


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


# ---------------------------------------------------------------------------
# The module (jaxnorm.nn.attention.sinks).


def test_sink_module_matches_function(key):
  x = _common.tokens(key)
  s = nn_attn.make_attention("sink", D, N, rngs=nnx.Rngs(0))
  sinks = jnp.arange(N, dtype=jnp.float32)
  s.core.sinks[...] = sinks
  q, k, v = _common.project_qkv(s, x)
  helpers.assert_close(
    s(x),
    _common.project_out(s, attn.sink_attention(q, k, v, sinks=sinks)),
    atol=1e-5,
  )


def test_gated_module_matches_function(key):
  x = _common.tokens(key)
  g = nn_attn.make_attention("gated", D, N, headwise=True, rngs=nnx.Rngs(0))
  assert g.core.gate_kernel.shape == (D, N, 1)
  q, k, v = _common.project_qkv(g, x)
  gl = jnp.einsum("btd,dnh->btnh", x, g.core.gate_kernel[...])
  want = _common.project_out(
    g, attn.gated_attention_output(attn.dot_product_attention(q, k, v), gl)
  )
  helpers.assert_close(g(x), want, atol=1e-5)
