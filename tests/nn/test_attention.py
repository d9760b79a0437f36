"""The registry-driven attention module tests, and MultiHeadAttention's own.

Each paper's module tests are in tests/attention/test_<paper>.py.
"""

import inspect
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import attention as attn
from jaxnorm import norms, sharding
from jaxnorm.nn import attention as nn_attn
from jaxnorm.nn import registry
from tests import helpers
from tests.attention import _common
from tests.attention._common import D, H, K, N

# Options each core needs to run on a length-6 sequence.
_RUN_OPTIONS = {"lina": {"max_len": 8}}


def _kind_kwargs(name):
  """A complex core runs in a complex MultiHeadAttention."""
  if nn_attn.ATTENTIONS[name].dtype_kind == "complex":
    return {"param_dtype": jnp.complex64}
  return {}


def test_literal_equals_registry():
  assert typing.get_args(nn_attn.AttentionName) == tuple(nn_attn.ATTENTIONS)
  assert nn_attn.ATTENTION_NAMES == tuple(nn_attn.ATTENTIONS)
  by_layout = nn_attn.TOKEN_ATTENTIONS + nn_attn.IMAGE_ATTENTIONS
  assert sorted(by_layout) == sorted(nn_attn.ATTENTION_NAMES)
  for spec in nn_attn.ATTENTIONS.values():
    assert isinstance(spec, registry.AttentionSpec)
  for name in nn_attn.TOKEN_ATTENTIONS:  # Images specs hold whole layers.
    assert issubclass(nn_attn.ATTENTIONS[name].core, nn_attn.AttentionCore)
  cores = [spec.core for spec in nn_attn.ATTENTIONS.values()]
  assert len(set(cores)) == len(cores)  # One core class per paper.


def test_rope_and_qk_norm(key):
  m = nn_attn.MultiHeadAttention(
    D, N, use_rope=True, qk_norm="rmsnorm", use_bias=True, rngs=nnx.Rngs(1)
  )
  x = _common.tokens(key)
  q, k, v = _common.project_qkv(m, x)
  q = attn.rope(norms.rms_norm(q, m.q_norm.scale[...], eps=m.q_norm.eps))
  k = attn.rope(norms.rms_norm(k, m.k_norm.scale[...], eps=m.k_norm.eps))
  want = _common.project_out(m, attn.dot_product_attention(q, k, v))
  helpers.assert_close(m(x), want, atol=1e-5)
  ln = nn_attn.MultiHeadAttention(D, N, qk_norm="layernorm", rngs=nnx.Rngs(1))
  assert helpers.all_finite(ln(x))


@pytest.mark.parametrize("name", nn_attn.TOKEN_ATTENTIONS)
def test_every_core_builds_runs_and_is_finite(key, name):
  ties = nn_attn.ATTENTIONS[name].core.ties_keys  # SOFT: K == N.
  kv = N if ties else K
  m = nn_attn.make_attention(
    name,
    D,
    N,
    num_kv_heads=kv,
    rngs=nnx.Rngs(0),
    **_RUN_OPTIONS.get(name, {}),
    **_kind_kwargs(name),
  )
  x = _common.tokens(key, name=name)
  call = nnx.jit(lambda m, x: m(x))
  y = call(m, x)
  assert y.shape == x.shape and helpers.all_finite(y)
  if not jnp.iscomplexobj(x):  # No complex half precision.
    yb = call(m, x.astype(jnp.bfloat16))
    assert yb.dtype == jnp.bfloat16 and helpers.all_finite(yb)
  short = 2 if ties else 1  # SOFT's landmark windows are 2 tokens.
  assert helpers.all_finite(call(m, x[:, :short]))
  g = nnx.jit(nnx.grad(lambda m: helpers.real_readout(m(x)).sum()))(m)
  assert helpers.all_finite(g)


@pytest.mark.parametrize("name", nn_attn.TOKEN_ATTENTIONS)
def test_spec_capabilities_match_the_core(key, name):
  """``causal``, ``takes_mask``, ``takes_bias``: what the core does."""
  spec = nn_attn.ATTENTIONS[name]
  kw = {**_RUN_OPTIONS.get(name, {}), **_kind_kwargs(name)}
  if spec.causal:
    m = nn_attn.make_attention(
      name, D, N, is_causal=True, rngs=nnx.Rngs(0), **_kind_kwargs(name)
    )
    x = _common.tokens(key, name=name)
    y = nnx.clone(m)(x)  # Each call from the same state.
    y2 = nnx.clone(m)(x.at[:, -1].add(1.0))
    helpers.assert_close(y2[:, :-1], y[:, :-1], atol=1e-6)
  else:
    with pytest.raises(ValueError, match=r"has no causal form"):
      nn_attn.make_attention(name, D, N, is_causal=True, rngs=nnx.Rngs(0))
  m = nn_attn.make_attention(name, D, N, rngs=nnx.Rngs(0), **kw)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  x = _common.tokens(key, name=name)
  if spec.takes_mask:
    assert helpers.all_finite(m(x, mask=mask))
  else:
    with pytest.raises(ValueError, match=r"takes no mask or bias"):
      m(x, mask=mask)
  bias = jnp.zeros((1, 1, 6, 6))
  if spec.takes_bias:
    want = nnx.clone(m)(x)  # Each call from the same state.
    helpers.assert_close(nnx.clone(m)(x, bias=bias), want, atol=1e-6)
  else:
    with pytest.raises(ValueError, match=r"no mask or bias|no additive bias"):
      m(x, bias=bias)


@pytest.mark.parametrize("name", nn_attn.TOKEN_ATTENTIONS)
def test_spec_kernel_means_implementation_option(key, name):
  """``kernel`` specs take ``implementation=``; "xla" is the default path."""
  kw = {**_RUN_OPTIONS.get(name, {}), "implementation": "xla"}
  if not nn_attn.ATTENTIONS[name].kernel:
    with pytest.raises(
      ValueError, match=r"unknown option\(s\) 'implementation'"
    ):
      nn_attn.make_attention(name, D, N, rngs=nnx.Rngs(0), **kw)
    return
  m = nn_attn.make_attention(name, D, N, rngs=nnx.Rngs(0), **kw)
  ref = nn_attn.make_attention(
    name, D, N, rngs=nnx.Rngs(0), **_RUN_OPTIONS.get(name, {})
  )
  x = _common.tokens(key)
  helpers.assert_close(m(x), ref(x), atol=1e-6)


@pytest.mark.parametrize("name", nn_attn.ATTENTION_NAMES)
def test_needs_grid_flag_is_consistent(name):
  spec = nn_attn.ATTENTIONS[name]
  assert spec.needs_grid is bool(getattr(spec.core, "needs_grid", False))
  params = inspect.signature(spec.core.__init__).parameters
  assert ({"grid_shape", "num_prefix"} <= set(params)) == spec.needs_grid


def test_parameter_paths():
  paths = {
    name: sorted(
      ".".join(map(str, p))
      for p, _ in nnx.to_flat_state(
        nnx.state(
          nn_attn.make_attention(
            name, D, N, rngs=nnx.Rngs(0), **_RUN_OPTIONS.get(name, {})
          )
        )
      )
    )
    for name in ("softmax", "sink", "affine_scaled", "soft", "lina")
  }
  proj = ["k_kernel", "out_kernel", "q_kernel", "v_kernel"]
  assert paths["softmax"] == proj
  assert paths["sink"] == ["core.sinks", *proj]
  assert paths["affine_scaled"] == ["core.alpha_kernel", "core.alpha_ma", *proj]
  assert paths["soft"] == ["out_kernel", "q_kernel", "v_kernel"]
  assert paths["lina"] == ["core.key_gate", "core.value_gate", *proj]


def test_projections_do_not_depend_on_the_core():
  """The core is built last, so swapping it keeps the projections' init."""
  a = nn_attn.make_attention("softmax", D, N, rngs=nnx.Rngs(0))
  for name in ("sink", "gated", "affine_scaled"):
    b = nn_attn.make_attention(name, D, N, rngs=nnx.Rngs(0))
    for p in ("q_kernel", "k_kernel", "v_kernel", "out_kernel"):
      np.testing.assert_array_equal(getattr(a, p)[...], getattr(b, p)[...])


class _Mixed(nnx.Module):
  """A flax/jaxnorm model: nnx.Linear, nnx.BatchNorm, jaxnorm attention."""

  def __init__(self, rngs):
    self.inp = nnx.Linear(D, D, rngs=rngs)
    self.bn = nnx.BatchNorm(D, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.attn = nn_attn.make_attention(
      "affine_scaled", D, N, is_causal=True, rngs=rngs
    )

  def __call__(self, x):
    return self.attn(self.drop(self.bn(self.inp(x))))


def test_view_protocol_in_a_mixed_flax_model(key):
  model = _Mixed(nnx.Rngs(0, dropout=1))
  x = _common.tokens(key)
  model(x)  # Training: both running statistics move.
  bn_mean, alpha_ma = model.bn.mean[...], model.attn.core.alpha_ma[...]
  assert float(jnp.abs(alpha_ma).max()) > 0
  view = nnx.view(model, use_running_average=True, deterministic=True)
  assert view.attn.core.use_running_average and view.bn.use_running_average
  assert not model.attn.core.use_running_average  # The original is kept.
  y = view(x)
  np.testing.assert_array_equal(view.bn.mean[...], bn_mean)
  np.testing.assert_array_equal(view.attn.core.alpha_ma[...], alpha_ma)
  # Eval output: the pure function with the stored estimate.
  h = view.bn(view.inp(x))
  m = view.attn
  q, k, v = _common.project_qkv(m, h)
  alpha = attn.linear_clipping(
    jnp.einsum("btd,dn->btn", h, m.core.alpha_kernel[...])
  )
  want, _ = attn.affine_scaled_attention(
    q, k, v, alpha=alpha, alpha_ma=alpha_ma, is_causal=True, training=False
  )
  helpers.assert_close(y, _common.project_out(m, want), atol=1e-5)
  info = nnx.view_info(model)
  assert "AffineScaledAttention" in info and "use_running_average" in info


def test_spec_defaults():
  soft = nn_attn.ATTENTIONS["soft"].defaults
  lina = nn_attn.ATTENTIONS["lina"].defaults
  assert soft(N, H, 17) == {"ratio": 1} and soft(N, H, 16) == {"ratio": 2}
  assert soft(N, H, None) == {} and lina(N, H, None) == {}
  assert lina(N, H, 17) == {"max_len": 17}
  assert nn_attn.ATTENTIONS["softmax"].defaults(N, H, 17) == {}


def test_module_errors(key):
  with pytest.raises(
    ValueError,
    match=r"make_attention: unknown attention "
    r"'flash'; valid names are softmax, off_by_one",
  ):
    nn_attn.make_attention("flash", D, N, rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError, match=r"MultiHeadAttention: unknown attention"
  ):
    nn_attn.MultiHeadAttention(D, N, attention="flash", rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError,
    match=r"num_heads=4 must be divisible by "
    r"num_kv_heads=3",
  ):
    nn_attn.MultiHeadAttention(D, N, num_kv_heads=3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"SoftAttention: SOFT ties keys"):
    nn_attn.make_attention("soft", D, N, num_kv_heads=2, rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError,
    match=r"SinkAttention: unknown option\(s\) 'sinks', 'temperature' for "
    r"sink_attention; valid options are .*scale",
  ):
    nn_attn.make_attention(
      "sink", D, N, sinks=1.0, temperature=2.0, rngs=nnx.Rngs(0)
    )
  m = nn_attn.make_attention("nala", D, N, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"inputs_q must have num_features=16"):
    m(jnp.ones((2, 6, 8)))
  with pytest.raises(ValueError, match=r"make_norm: unknown norm"):
    nn_attn.MultiHeadAttention(D, N, qk_norm="nonorm", rngs=nnx.Rngs(0))


def test_partition_specs_and_sharded_output(key):
  mesh = sharding.make_mesh((2, 1, 4))
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
    m = nn_attn.MultiHeadAttention(
      D, N, num_kv_heads=N, attention="sink", rngs=nnx.Rngs(0)
    )
    spec = nnx.get_partition_spec(nnx.state(m, nnx.Param))
    assert tuple(spec["q_kernel"].get_value()) == ("fsdp", "tensor", None)
    assert tuple(spec["out_kernel"].get_value()) == ("tensor", None, "fsdp")
    assert tuple(spec["core"]["sinks"].get_value()) == ("tensor",)
    x = _common.tokens(key)
    y = jax.jit(lambda x: m(x))(x)
  ref = nn_attn.MultiHeadAttention(
    D, N, num_kv_heads=N, attention="sink", rngs=nnx.Rngs(0)
  )
  helpers.assert_close(y, ref(x), atol=1e-5)
  np.testing.assert_array_equal(
    np.asarray(m.q_kernel[...]), np.asarray(ref.q_kernel[...])
  )
