import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm import sharding
from jaxnorm.nn import attention as nn_attn
from tests import helpers

D, N, K, H = 16, 4, 2, 4


def _x(key, t=6):
  return jax.random.normal(key, (2, t, D))


def _proj(m, x):
  q = jnp.einsum("btd,dnh->btnh", x, m.q_kernel[...])
  k = (
    None
    if m.k_kernel is None
    else jnp.einsum("btd,dnh->btnh", x, m.k_kernel[...])
  )
  v = jnp.einsum("btd,dnh->btnh", x, m.v_kernel[...])
  return q, k, v


def _out(m, y):
  return jnp.einsum("btnh,nhd->btd", y, m.out_kernel[...])


def test_softmax_module_matches_function(key):
  m = nn_attn.MultiHeadAttention(
    D, N, num_kv_heads=K, is_causal=True, rngs=nnx.Rngs(0)
  )
  x = _x(key)
  q, k, v = _proj(m, x)
  want = _out(m, attn.dot_product_attention(q, k, v, is_causal=True))
  helpers.assert_close(m(x), want, atol=1e-5)
  assert m.k_kernel.shape == (D, K, H)
  helpers.assert_jit_matches_eager(lambda x: m(x), x, atol=1e-5)


def test_rope_and_qk_norm(key):
  m = nn_attn.MultiHeadAttention(
    D, N, use_rope=True, qk_norm="rmsnorm", use_bias=True, rngs=nnx.Rngs(1)
  )
  x = _x(key)
  q, k, v = _proj(m, x)
  from jaxnorm import norms

  q = attn.rope(norms.rms_norm(q, m.q_norm.scale[...], eps=m.q_norm.eps))
  k = attn.rope(norms.rms_norm(k, m.k_norm.scale[...], eps=m.k_norm.eps))
  want = _out(m, attn.dot_product_attention(q, k, v))
  helpers.assert_close(m(x), want, atol=1e-5)
  ln = nn_attn.MultiHeadAttention(D, N, qk_norm="layernorm", rngs=nnx.Rngs(1))
  assert helpers.all_finite(ln(x))


@pytest.mark.parametrize("name", nn_attn.ATTENTION_NAMES)
def test_every_variant_builds_runs_and_is_finite(key, name):
  kv = N if name == "soft" else K
  kw = {"lina_max_len": 8} if name == "lina" else {}
  m = nn_attn.make_attention(
    name, D, N, num_kv_heads=kv, rngs=nnx.Rngs(0), **kw
  )
  x = _x(key)
  call = nnx.jit(lambda m, x: m(x))
  y = call(m, x)
  assert y.shape == x.shape and helpers.all_finite(y)
  yb = call(m, x.astype(jnp.bfloat16))
  assert yb.dtype == jnp.bfloat16 and helpers.all_finite(yb)
  y1 = call(m, x[:, :2] if name == "soft" else x[:, :1])
  assert helpers.all_finite(y1)
  g = nnx.jit(nnx.grad(lambda m: m(x).sum()))(m)
  assert helpers.all_finite(g)


def test_variant_modules_match_functions(key):
  x = _x(key)
  s = nn_attn.make_attention("sink", D, N, rngs=nnx.Rngs(0))
  s.sinks[...] = jnp.arange(N, dtype=jnp.float32)
  q, k, v = _proj(s, x)
  helpers.assert_close(
    s(x),
    _out(
      s, attn.sink_attention(q, k, v, sinks=jnp.arange(N, dtype=jnp.float32))
    ),
    atol=1e-5,
  )
  g = nn_attn.make_attention(
    "gated", D, N, gate_headwise=True, rngs=nnx.Rngs(0)
  )
  assert g.gate_kernel.shape == (D, N, 1)
  q, k, v = _proj(g, x)
  gl = jnp.einsum("btd,dnh->btnh", x, g.gate_kernel[...])
  want = _out(
    g, attn.gated_attention_output(attn.dot_product_attention(q, k, v), gl)
  )
  helpers.assert_close(g(x), want, atol=1e-5)
  mx = nn_attn.make_attention(
    "mxfp4",
    D,
    N,
    rngs=nnx.Rngs(0),
    attention_kwargs={"p_quant": "direct", "hadamard": "plain"},
  )
  q, k, v = _proj(mx, x)
  helpers.assert_close(
    mx(x),
    _out(mx, attn.mxfp4_attention(q, k, v, p_quant="direct", hadamard="plain")),
    atol=1e-5,
  )


def test_affine_scaled_state_updates_and_eval(key):
  m = nn_attn.make_attention("affine_scaled", D, N, rngs=nnx.Rngs(0))
  x = _x(key)
  assert float(jnp.abs(m.alpha_ma[...]).max()) == 0.0
  m(x)
  alpha = attn.linear_clipping(
    jnp.einsum("btd,dn->btn", x, m.alpha_kernel[...])
  )
  helpers.assert_close(
    m.alpha_ma[...], 0.1 * alpha.mean(axis=(0, 1)), atol=1e-6
  )
  before = m.alpha_ma[...]
  m.eval()
  m(x)
  helpers.assert_close(m.alpha_ma[...], before, atol=0)
  layer = nn_attn.make_attention(
    "affine_scaled", D, N, ema_axes="per_layer", rngs=nnx.Rngs(0)
  )
  assert layer.alpha_ma.shape == ()
  assert isinstance(m.alpha_ma, nn_attn.AffineScaleEMA)


def test_lina_gates_and_soft(key):
  m = nn_attn.make_attention(
    "lina", D, N, num_kv_heads=K, lina_max_len=8, rngs=nnx.Rngs(0)
  )
  x = _x(key)
  q, k, v = _proj(m, x)
  helpers.assert_close(m(x), _out(m, attn.lina_attention(q, k, v)), atol=1e-5)
  with pytest.raises(ValueError, match="exceeds lina_max_len=8"):
    m(_x(key, t=9))
  s = nn_attn.make_attention("soft", D, N, rngs=nnx.Rngs(0))
  assert s.k_kernel is None
  q, _, v = _proj(s, x)
  want = attn.soft_attention(q, v, attn.soft_landmarks(q, 2))
  helpers.assert_close(s(x), _out(s, want), atol=1e-5)


def test_module_errors(key):
  with pytest.raises(
    ValueError,
    match=r"make_attention: unknown attention "
    r"'flash'; valid names are softmax, off_by_one",
  ):
    nn_attn.make_attention("flash", D, N, rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError,
    match=r"num_heads=4 must be divisible by "
    r"num_kv_heads=3",
  ):
    nn_attn.MultiHeadAttention(D, N, num_kv_heads=3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"ties keys to queries"):
    nn_attn.make_attention("soft", D, N, num_kv_heads=2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"has no causal form"):
    nn_attn.make_attention("nala", D, N, is_causal=True, rngs=nnx.Rngs(0))
  m = nn_attn.make_attention("nala", D, N, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"takes no mask or bias"):
    m(_x(key), mask=jnp.ones((1, 1, 6, 6), bool))
  with pytest.raises(ValueError, match=r"x must have num_features=16"):
    m(jnp.ones((2, 6, 8)))
  with pytest.raises(ValueError, match=r"make_norm: unknown norm"):
    nn_attn.MultiHeadAttention(D, N, qk_norm="nonorm", rngs=nnx.Rngs(0))


def test_partition_specs_and_sharded_output(key):
  mesh = sharding.make_mesh((2, 1, 4))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    m = nn_attn.MultiHeadAttention(D, N, num_kv_heads=N, rngs=nnx.Rngs(0))
    spec = nnx.get_partition_spec(nnx.state(m, nnx.Param))
    assert tuple(spec["q_kernel"].get_value()) == ("fsdp", "tensor", None)
    assert tuple(spec["out_kernel"].get_value()) == ("tensor", None, "fsdp")
    x = _x(key)
    y = jax.jit(lambda x: m(x))(x)
  ref = nn_attn.MultiHeadAttention(D, N, num_kv_heads=N, rngs=nnx.Rngs(0))
  helpers.assert_close(y, ref(x), atol=1e-5)
  np.testing.assert_equal(
    np.asarray(m.q_kernel[...]), np.asarray(ref.q_kernel[...])
  )
