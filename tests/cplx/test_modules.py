"""Tests of `jaxnorm.nn.cplx`: each module equals its pure function with
its parameters, the real-pairs forms equal the complex forms on split
halves, the registry specs are consistent, every causal model is causal,
and the models train a step with the complex Adam."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import cplx
from jaxnorm.nn import _common, _norm_keys, registry
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import cplx as ncplx
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn.attention import _base
from jaxnorm.optim import complex as copt
from tests.cplx import _common as c

RNG = np.random.default_rng(4)


def _z(shape):
  return jnp.asarray(c.np_cnormal(RNG, shape), jnp.complex64)


def test_dense_conv_match_functions():
  dense = ncplx.ComplexDense(4, 3, rngs=nnx.Rngs(0))
  x = _z((2, 4))
  c.close(dense(x), cplx.complex_dense(x, dense.kernel[...]), atol=1e-6)
  w = dense.kernel[...]
  assert w.dtype == jnp.complex64
  conv = ncplx.ComplexConv(2, 5, (3, 3), strides=2, rngs=nnx.Rngs(1))
  img = _z((1, 6, 6, 2))
  want = cplx.complex_conv(img, conv.kernel[...], strides=2)
  c.close(conv(img), want, atol=1e-6)
  # Complex He: E|w|^2 = 2 / fan_in.
  big = ncplx.complex_he(jax.random.key(0), (3, 3, 64, 64))
  np.testing.assert_allclose(
    float(jnp.mean(jnp.abs(big) ** 2)), 2 / (9 * 64), rtol=0.05
  )


def test_norm_modules_match_functions_and_real_pairs():
  x = _z((3, 5, 4))
  ln = ncplx.ComplexLayerNorm(4, rngs=nnx.Rngs(0))
  c.close(
    ln(x), cplx.complex_layer_norm(x, ln.scale[...], ln.bias[...]), atol=0
  )
  rms = ncplx.ComplexRMSNorm(4, rngs=nnx.Rngs(0))
  c.close(rms(x), cplx.complex_rms_norm(x, rms.scale[...]), atol=0)
  for cls in (ncplx.ComplexLayerNorm, ncplx.ComplexRMSNorm):
    pairs = cls(8, real_pairs=True, rngs=nnx.Rngs(0))
    native = cls(4, rngs=nnx.Rngs(0))
    real = cplx.to_real(x)
    c.close(pairs(real), cplx.to_real(native(x)), atol=0)
  with pytest.raises(ValueError, match=r"ComplexRMSNorm: real_pairs=True"):
    ncplx.ComplexRMSNorm(5, real_pairs=True, rngs=nnx.Rngs(0))
  act = ncplx.ModReLU(4, power=2, rngs=nnx.Rngs(0))
  c.close(act(x), cplx.modrelu(x, jnp.zeros(4), power=2), atol=0)


def test_batch_norm_module_train_eval():
  bn = ncplx.ComplexBatchNorm(3, rngs=nnx.Rngs(0))
  x = _z((16, 3)) + 2.0
  state = cplx.init_complex_batch_norm_state(3)
  want, new = cplx.complex_batch_norm(
    x, bn.scale[...], bn.bias[...], state, training=True
  )
  c.close(bn(x), want, atol=0)
  c.close(bn.mean[...], new.mean, atol=0)
  c.close(bn.cov[...], new.cov, atol=0)
  bn.eval()
  before = np.asarray(bn.mean[...])
  y = bn(x)
  want, _ = cplx.complex_batch_norm(
    x, bn.scale[...], bn.bias[...], new, training=False
  )
  c.close(y, want, atol=0)
  np.testing.assert_array_equal(bn.mean[...], before)


def test_registry_specs_are_consistent():
  """The registry forms take complex inputs (norms: complex widths; the
  complex cores: complex heads of a complex-``param_dtype``
  `MultiHeadAttention`); ComplexFormer is a real core."""
  x = _z((2, 5, 8))
  for name, spec in ncplx.NORM_SPECS.items():
    assert isinstance(spec, registry.NormSpec) and spec.paper
    assert spec.module.dtype_kind == "complex"
    m = spec.module(8, rngs=nnx.Rngs(0), **spec.defaults(8, "tokens"))
    y = m(x)
    assert y.shape == x.shape and y.dtype == jnp.complex64, name
    assert not hasattr(m, "implementation")
    for p in spec.decay:
      assert getattr(m, p) is not None
  kinds = {
    name: getattr(spec.core, "dtype_kind", "real")
    for name, spec in ncplx.ATTENTION_SPECS.items()
  }
  assert kinds == {
    "born": "complex",
    "complex_softmax": "complex",
    "complexformer": "real",
    "pct": "complex",
  }
  for spec in ncplx.ATTENTION_SPECS.values():
    assert issubclass(spec.core, _base.AttentionCore) and spec.paper


def test_norms_follow_the_norm_family_conventions():
  """Each complex norm draws the family's two keys (swapping norms keeps
  later layers' init); ComplexBatchNorm follows ``nnx.view``."""
  for spec in ncplx.NORM_SPECS.values():
    rngs = nnx.Rngs(0)
    spec.module(4, rngs=rngs)
    assert int(rngs.default.count[...]) == _norm_keys.NUM_KEYS
  model = nnx.Sequential(ncplx.ComplexBatchNorm(3, rngs=nnx.Rngs(0)))
  x = _z((8, 3)) + 1.0
  bn = model.layers[0]
  frozen = nnx.view(model, use_running_average=True)
  before = np.asarray(bn.mean[...])
  want, _ = cplx.complex_batch_norm(
    x,
    bn.scale[...],
    bn.bias[...],
    cplx.init_complex_batch_norm_state(3),
    training=False,
  )
  c.close(frozen(x), want, atol=0)
  np.testing.assert_array_equal(bn.mean[...], before)
  model(x)  # Training mode: the running mean moves.
  assert not np.array_equal(bn.mean[...], before)


def _core_inputs(h=4, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(1), 3)
  if dtype == jnp.complex64:
    return [c.cnormal(k, (2, 6, 2, h)) for k in keys]
  return [jax.random.normal(k, (2, 6, 2, h)) for k in keys]


def test_attention_cores_match_functions():
  dims = _base.HeadDims(8, 2, 2, 4)
  q, k, v = _core_inputs()
  born = ncplx.BornAttention(
    dims, is_causal=True, real_pairs=True, rngs=nnx.Rngs(0)
  )
  want = cplx.born_attention(
    cplx.to_complex(q), cplx.to_complex(k), cplx.to_complex(v), is_causal=True
  )
  c.close(born(None, q, k, v), cplx.to_real(want), atol=0)
  pct = ncplx.PCTAttention(
    dims, is_causal=True, real_pairs=True, gate="tanh1", rngs=nnx.Rngs(0)
  )
  want = cplx.pct_attention(
    cplx.to_complex(q),
    cplx.to_complex(k),
    cplx.to_complex(v),
    jnp.float32(-np.log(64.0)),
    is_causal=True,
    gate="tanh1",
  )
  c.close(pct(None, q, k, v), cplx.to_real(want), atol=1e-7)
  soft = ncplx.ComplexSoftmaxAttention(
    dims, is_causal=True, real_pairs=True, rngs=nnx.Rngs(0)
  )
  want = cplx.complex_softmax_attention(
    cplx.to_complex(q), cplx.to_complex(k), cplx.to_complex(v), is_causal=True
  )
  c.close(soft(None, q, k, v), cplx.to_real(want), atol=0)
  cf = ncplx.ComplexFormerAttention(dims, is_causal=True, rngs=nnx.Rngs(0))
  assert cf.delta.shape == (2, 2)
  want = cplx.complexformer_attention(
    q, k, v, cf.delta[...], cf.phase_bias[...], is_causal=True
  )
  c.close(cf(None, q, k, v), want, atol=0)
  with pytest.raises(ValueError, match=r"BornAttention: Born attention has"):
    born(None, q, k, v, bias=jnp.zeros((1, 1, 6, 6)))
  with pytest.raises(ValueError, match=r"PCTAttention: the head dim must be"):
    ncplx.PCTAttention(
      _base.HeadDims(6, 2, 2, 3), real_pairs=True, rngs=nnx.Rngs(0)
    )
  with pytest.raises(ValueError, match=r"unknown option\(s\) 'scale'"):
    ncplx.BornAttention(dims, scale=1.0, rngs=nnx.Rngs(0))
  with pytest.raises(
    ValueError, match=r"ComplexSoftmaxAttention: the head dim must be"
  ):
    ncplx.ComplexSoftmaxAttention(
      _base.HeadDims(6, 2, 2, 3), real_pairs=True, rngs=nnx.Rngs(0)
    )


def test_complex_cores_on_complex_heads():
  """Complex-native cores (odd head dims allowed) equal the functions;
  PCT's gate bias stays real under a complex ``param_dtype``."""
  dims = _base.HeadDims(6, 2, 2, 3)
  q, k, v = _core_inputs(3, jnp.complex64)
  mask = jnp.tril(jnp.ones((6, 6), bool))[None, None]
  born = ncplx.BornAttention(dims, rngs=nnx.Rngs(0))
  want = cplx.born_attention(q, k, v, mask)
  c.close(born(None, q, k, v, mask=mask), want, atol=0)
  pct = ncplx.PCTAttention(
    dims, is_causal=True, param_dtype=jnp.complex64, rngs=nnx.Rngs(0)
  )
  assert pct.gate_bias[...].dtype == jnp.float32
  want = cplx.pct_attention(q, k, v, jnp.float32(-np.log(64.0)), is_causal=True)
  c.close(pct(None, q, k, v), want, atol=1e-7)
  soft = ncplx.ComplexSoftmaxAttention(dims, rngs=nnx.Rngs(0))
  bias = jax.random.normal(jax.random.key(2), (1, 2, 6, 6))
  want = cplx.complex_softmax_attention(q, k, v, bias, mask)
  c.close(soft(None, q, k, v, mask=mask, bias=bias), want, atol=0)


TINY = dict(vocab_size=17, width=8, depth=1, num_heads=2, max_len=8)


@pytest.fixture(scope="module")
def tokens():
  return jax.random.randint(jax.random.key(0), (2, 8), 0, 17)


@nnx.jit
def _logits_pair(model, a, b):
  return model(a), model(b)


@pytest.mark.parametrize(
  "parts",
  [
    {"attention": "born"},
    {
      "attention": "pct",
      "attention_kwargs": (("gate", "tanh1"),),
      "activation": "modrelu",
      "readout": "real",
    },
    {
      "attention": "complex_softmax",
      "norm": "complexlayernorm",
      "cnet_gelu": False,
    },
    {"attention": "fourier", "embed_init": "cnet"},
  ],
  ids=["born", "pct", "complex_softmax", "fourier"],
)
def test_complex_lm_is_causal(parts, tokens):
  model = ncplx.ComplexLM(
    ncplx.ComplexLMConfig(**TINY, **parts), rngs=nnx.Rngs(0)
  )
  changed = tokens.at[:, -1].set((tokens[:, -1] + 1) % 17)
  x, y = _logits_pair(model, tokens, changed)
  assert x.shape == (2, 8, 17) and c.finite(x)
  # Bluestein FFT rounding for the Fourier mixer; exact masks otherwise, up
  # to float32 round-off on logits ~ 4 (the two calls fuse differently).
  atol = 1e-4 if parts["attention"] == "fourier" else 1e-6
  # The two programs fuse their reductions differently: float32 round-off
  # (measured 6e-6 on logits ~4); a leak of the last token is >= 1e-4.
  c.close(y[:, :-1], x[:, :-1], atol=atol, rtol=1e-5)
  assert not np.allclose(y[:, -1], x[:, -1], atol=1e-4)


@pytest.mark.slow
def test_complex_lm_born_logits_and_training_step(tokens):
  model = ncplx.ComplexLM(ncplx.ComplexLMConfig(**TINY), rngs=nnx.Rngs(0))
  z = model.amplitudes(tokens)
  logp = jax.nn.log_softmax(model(tokens))
  c.close(jnp.exp(logp), cplx.born_probs(z), atol=1e-5)
  tx = copt.complex_adam(3e-3)
  graphdef, params = nnx.split(model)  # Parameters only.
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    def loss(p):
      m = nnx.merge(graphdef, p)
      amp = m.amplitudes(tokens[:, :-1])
      return cplx.born_cross_entropy(amp, tokens[:, 1:], target_floor=1e-3)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  losses = []
  for _ in range(5):
    params, opt_state, value = step(params, opt_state)
    losses.append(float(value))
  assert losses[-1] < losses[0]
  with pytest.raises(ValueError, match=r"ComplexLM.amplitudes: needs"):
    ncplx.ComplexLM(
      ncplx.ComplexLMConfig(**TINY, readout="real"), rngs=nnx.Rngs(0)
    ).amplitudes(tokens)
  with pytest.raises(ValueError, match=r"ComplexLM: tokens must have shape"):
    model(jnp.zeros((2, 9), jnp.int32))
  with pytest.raises(ValueError, match=r"ComplexLM: unknown attention 'x'"):
    ncplx.ComplexLM(
      ncplx.ComplexLMConfig(**TINY, attention="x"), rngs=nnx.Rngs(0)
    )


def _attention_functions():
  """name -> (core options, the core's maths on the rotated heads)."""
  gate_bias = jnp.float32(-np.log(64.0))
  return {
    "born": ({}, lambda q, k, v: cplx.born_attention(q, k, v, is_causal=True)),
    "pct": (
      {"gate": "tanh1"},
      lambda q, k, v: cplx.pct_attention(
        q, k, v, gate_bias, is_causal=True, gate="tanh1"
      ),
    ),
    "complex_softmax": (
      {},
      lambda q, k, v: cplx.complex_softmax_attention(q, k, v, is_causal=True),
    ),
  }


@pytest.mark.parametrize("name", sorted(_attention_functions()))
def test_complex_multihead_attention_matches_functions(name):
  """Complex projections, complex RoPE, the registry core's function (as
  the model computed before its cores came from the registry); the core's
  parameters sit under ``core``."""
  kwargs, fn = _attention_functions()[name]
  m = ncplx.ComplexMultiHeadAttention(
    8, 2, attention=name, attention_kwargs=kwargs, rngs=nnx.Rngs(0)
  )
  assert isinstance(m.core, nn_attention.ATTENTIONS[name].core)
  assert m.core.is_causal
  x = _z((2, 6, 8))

  def proj(kernel):
    return jnp.einsum("btd,dnh->btnh", x, kernel[...])

  q, k = (
    cplx.complex_rope(proj(m.q_kernel)),
    cplx.complex_rope(proj(m.k_kernel)),
  )
  want = jnp.einsum("btnh,nhd->btd", fn(q, k, proj(m.v_kernel)), m.out_kernel)
  c.close(m(x), want, atol=1e-6)
  paths = {p for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))}
  core = {p for p in paths if p[0] == "core"}
  assert core == ({("core", "gate_bias")} if name == "pct" else set())


def test_complex_lm_builds_registry_parts():
  model = ncplx.ComplexLM(ncplx.ComplexLMConfig(**TINY), rngs=nnx.Rngs(0))
  block = model.blocks[0]
  assert isinstance(block.norm1, ncplx.ComplexRMSNorm)
  assert isinstance(model.final_norm, ncplx.ComplexRMSNorm)
  assert isinstance(block.attn.core, ncplx.BornAttention)
  cfg = ncplx.ComplexLMConfig(
    **TINY,
    attention="pct",
    attention_kwargs=(("gate", "relu"),),
    norm="complexlayernorm",
    norm_kwargs=(("eps", 1e-3),),
  )
  block = ncplx.ComplexLM(cfg, rngs=nnx.Rngs(0)).blocks[0]
  assert isinstance(block.norm2, ncplx.ComplexLayerNorm)
  assert block.norm2.eps == 1e-3
  assert dict(block.attn.core.options) == {"gate": "relu"}
  fourier = ncplx.ComplexLMConfig(**TINY, attention=ncplx.FOURIER)
  assert ncplx.ComplexLM(fourier, rngs=nnx.Rngs(0)).blocks[0].attn is None


def test_valid_parts_by_model_kind():
  """``dtype_kind="complex"`` admits the complex parts only; "real" (the
  default) keeps the real ones."""
  norms = _common.valid_norms("tokens", True, False, dtype_kind="complex")
  assert {"complexlayernorm", "complexrmsnorm"} <= set(norms)
  assert "complexbatchnorm" not in norms  # Batch statistics.
  assert "complexbatchnorm" in _common.valid_norms(
    "tokens", True, True, dtype_kind="complex"
  )
  atts = _common.valid_attentions("tokens", True, dtype_kind="complex")
  assert {"born", "complex_softmax", "pct"} <= set(atts)
  for kind in ("real", "complex"):
    valid = _common.valid_norms("tokens", True, True, dtype_kind=kind)
    assert {nn_norms.NORMS[n].dtype_kind for n in valid} == {kind}
    valid = _common.valid_attentions("tokens", True, dtype_kind=kind)
    assert {nn_attention.ATTENTIONS[n].dtype_kind for n in valid} == {kind}
  assert _common.valid_norms("tokens", True, False) == _common.valid_norms(
    "tokens", True, False, dtype_kind="real"
  )
  assert _common.valid_attentions("tokens", True) == (
    _common.valid_attentions("tokens", True, dtype_kind="real")
  )


@pytest.mark.parametrize(
  "parts,match",
  [
    (
      {"attention": "softmax"},
      r"ComplexLM: attention 'softmax' is real-valued, and this model is "
      r"complex-valued .*; choose one of {attentions}$",
    ),
    (
      {"attention": "complexformer"},
      r"ComplexLM: attention 'complexformer' is real-valued.*; choose one "
      r"of {attentions}$",
    ),
    (
      {"attention": "toy_noncausal"},
      r"ComplexLM: attention 'toy_noncausal' has no causal form, so a "
      r"decoder would see future tokens; choose one of {attentions}$",
    ),
    (
      {"norm": "rmsnorm"},
      r"ComplexLM: norm 'rmsnorm' is real-valued, and this model is "
      r"complex-valued .*; choose one of {norms}$",
    ),
    (
      {"norm": "complexbatchnorm"},
      r"ComplexLM: norm 'complexbatchnorm' takes batch statistics in "
      r"training mode \(over batch and sequence, so position t sees later "
      r"tokens\); choose one of {norms}$",
    ),
    (
      {"norm": "toy_noncausal"},
      r"ComplexLM: norm 'toy_noncausal' is not causal in the tokens layout"
      r".*; choose one of {norms}$",
    ),
    ({"norm": "x"}, r"ComplexLM: unknown norm 'x'; valid names are {norms}$"),
    (
      {"norm": "none"},
      r"ComplexLM: norm 'none': this model has no norm-free form; choose "
      r"one of {norms}$",
    ),
  ],
)
def test_complex_lm_refuses_parts(parts, match, monkeypatch):
  """Real parts, parts without a causal per-token form and batch
  statistics are refused before anything is built, naming the field, the
  value and the valid names (a toy non-causal complex core and norm stand
  for ones the registries may gain)."""
  monkeypatch.setattr(
    nn_attention,
    "ATTENTIONS",
    {
      **nn_attention.ATTENTIONS,
      "toy_noncausal": registry.AttentionSpec(
        ncplx.BornAttention, "toy", causal=False
      ),
    },
  )
  monkeypatch.setattr(
    nn_norms,
    "NORMS",
    {
      **nn_norms.NORMS,
      "toy_noncausal": registry.NormSpec(
        ncplx.ComplexRMSNorm, "toy", causal=False
      ),
    },
  )
  attentions = _common.valid_attentions("tokens", True, dtype_kind="complex")
  norms = _common.valid_norms("tokens", True, False, dtype_kind="complex")
  match = match.format(
    attentions=", ".join(sorted((*attentions, ncplx.FOURIER))),
    norms=", ".join(norms),
  )
  with pytest.raises(ValueError, match=match):
    ncplx.ComplexLM(ncplx.ComplexLMConfig(**TINY, **parts), rngs=nnx.Rngs(0))
  if "attention" in parts:
    with pytest.raises(ValueError, match=r"^ComplexMultiHeadAttention: "):
      ncplx.ComplexMultiHeadAttention(
        8, 2, attention=parts["attention"], rngs=nnx.Rngs(0)
      )


def test_cvcnn_forward_and_counts():
  for inp, shape in (("real", (2, 8, 8, 1)), ("pairs", (2, 8, 8, 2))):
    cfg = ncplx.CVCNNConfig(
      num_classes=3, image_shape=shape[1:], widths=(4, 8), input=inp
    )
    model = ncplx.CVCNN(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), shape)
    y = model(x)
    assert y.shape == (2, 3) and c.finite(y)
  ch = shape[-1] // 2
  convs = 2 * (9 * ch * 4 + 4 + 9 * 4 * 8 + 8)
  norms = 3 * 4 + 2 * 4 + 3 * 8 + 2 * 8
  assert ncplx.count_real_parameters(model) == convs + norms + 8 * 3 + 3
  with pytest.raises(ValueError, match=r"CVCNN: input='pairs' needs an even"):
    ncplx.CVCNN(
      ncplx.CVCNNConfig(image_shape=(8, 8, 3), input="pairs"), rngs=nnx.Rngs(0)
    )
