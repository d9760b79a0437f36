"""The official CNet and PCT stacks: presets against the official code.

`ComplexLMConfig.cnet_official` and `ComplexLMConfig.pct_official` build
`ComplexLM`s whose forward passes equal NumPy transcriptions of the official
code (tests/oracles/cnet_pct_numpy.py: CNet's ``buildLM`` with Born
attention, RoPE and TokenNorm; the PCT's ``TransformerCell`` with
``cell="complex_sigmoid"``) on the same random parameters, whose parameter
counts equal the official graphs', and whose initializations follow the
official code. Also the modules added for them: `PCTRMSNorm`,
`FourierHadamardConv`, `ModReLU(per_feature=False)`, `ComplexDense`'s
initializers and `ComplexMultiHeadAttention`'s ``init``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import cplx
from jaxnorm.nn import cplx as ncplx
from tests.cplx import _common as c
from tests.oracles import cnet_pct_numpy as official

RNG = np.random.default_rng(7)


def _randomize(model: nnx.Module, rng: np.random.Generator, scale=0.7):
  """Replace every parameter by a random one of its shape and dtype."""
  for _, p in nnx.iter_graph(model):
    if isinstance(p, nnx.Param):
      v = p[...]
      if jnp.iscomplexobj(v):
        new = c.np_cnormal(rng, v.shape, scale)
      else:
        new = rng.normal(size=v.shape) * scale
      p[...] = jnp.asarray(new, v.dtype)


# ---------------------------------------------------------------------------
# CNet.


def _cnet_params(m: ncplx.ComplexLM) -> dict:
  """The model's parameters in CNet's layout (``W(r, c)``: out, in)."""

  def arr(p):
    return np.asarray(p[...]).astype(np.complex128)

  blocks = []
  for b in m.blocks:
    a = b.attn
    blocks.append(
      {
        "wq": arr(a.q_kernel)[:, 0, :].T,
        "wk": arr(a.k_kernel)[:, 0, :].T,
        "wv": arr(a.v_kernel)[:, 0, :].T,
        "wo": arr(a.out_kernel)[0].T,
        "w1": arr(b.up.kernel).T,
        "w2": arr(b.down.kernel).T,
      }
    )
  return {
    "emb": arr(m.embed),
    "pos": arr(m.pos_embed),
    "blocks": blocks,
    "head": arr(m.head.kernel).T,
  }


@pytest.mark.slow
def test_cnet_official_matches_build_lm():
  e, n, depth, vocab = 8, 6, 2, 11
  m = ncplx.ComplexLM(
    ncplx.ComplexLMConfig.cnet_official(vocab, width=e, depth=depth, max_len=n),
    rngs=nnx.Rngs(0),
  )
  _randomize(m, RNG)
  tokens = RNG.integers(0, vocab, size=n)
  want = official.cnet_lm_amplitudes(tokens, _cnet_params(m))
  got = m.amplitudes(jnp.asarray(tokens[None], jnp.int32))[0]
  np.testing.assert_allclose(
    got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max()
  )
  # The Born loss (ce_eps only touches the backward) and the logits.
  targets = RNG.integers(0, vocab, size=n)
  loss = cplx.born_cross_entropy(got[None], jnp.asarray(targets[None]))
  np.testing.assert_allclose(
    float(loss), official.sequence_cross_entropy(want, targets), rtol=1e-4
  )
  logits = m(jnp.asarray(tokens[None], jnp.int32))[0]
  probs = np.abs(want) ** 2 / (np.abs(want) ** 2).sum(-1, keepdims=True)
  np.testing.assert_allclose(jax.nn.softmax(logits), probs, atol=1e-5)


@pytest.mark.slow
def test_cnet_official_shapes_counts_and_init():
  vocab = 65
  cfg = ncplx.ComplexLMConfig.cnet_official(vocab)
  m = ncplx.ComplexLM(cfg, rngs=nnx.Rngs(0))
  e, n, depth, dh, h = 64, 64, 4, 32, 256
  assert (cfg.width, cfg.max_len, cfg.depth, cfg.head_dim) == (e, n, depth, dh)
  # CNet's graph: emb V*E, pos N*E, per block wQ, wK, wV E*dh, wO dh*E,
  # w1 E*4E, w2 4E*E, head E*V complex inputs (no biases, no norm gains).
  complex_entries = vocab * e + n * e + depth * (4 * e * dh + 2 * e * h)
  complex_entries += e * vocab
  assert ncplx.count_real_parameters(m) == 2 * complex_entries
  b = m.blocks[0]
  assert b.up.bias is None and b.down.bias is None
  assert b.norm1.scale is None and m.final_norm.scale is None
  assert b.attn.q_kernel[...].shape == (e, 1, dh)
  assert m.pos_embed[...].shape == (n, e)
  # CInput's init: positive imaginary parts, |w| <= 1/(element count).
  for p, count in (
    (m.pos_embed, n * e),
    (b.attn.q_kernel, e * dh),
    (b.up.kernel, e * h),
    (m.head.kernel, e * vocab),
  ):
    w = np.asarray(p[...])
    assert (w.imag > 0).all()
    np.testing.assert_allclose(np.abs(w) * count, 1.0, rtol=1e-5)
  # emb_gauss: Re, Im ~ U(-1, 1)/sqrt(E).
  emb = np.asarray(m.embed[...])
  assert np.abs(emb.real).max() <= 1 / math.sqrt(e)
  assert abs(emb.imag.mean()) < 0.01
  y = m(jnp.zeros((2, n), jnp.int32))
  assert y.shape == (2, n, vocab) and c.finite(y)
  over = ncplx.ComplexLMConfig.cnet_official(vocab, remat="full")
  assert over.remat == "full" and over.param_init == "cnet"


def test_cnet_input_init():
  w = np.asarray(ncplx.cnet_input_init(jax.random.key(1), (16, 32)))
  n = 16 * 32
  re, im = w.real * n, w.imag * n
  assert re.min() >= -0.5 and re.max() <= 0.5
  np.testing.assert_allclose(im, np.sqrt(1 - re**2), rtol=1e-5)
  assert w.dtype == np.complex64


# ---------------------------------------------------------------------------
# The Phase-Coherent Transformer.


def _pct_params(m: ncplx.ComplexLM) -> dict:
  """The model's parameters in PyTorch layout (``weight (out, in)``)."""

  def arr(p):
    return np.asarray(p[...]).astype(np.complex128)

  layers = []
  for b in m.blocks:
    a = b.attn
    d = a.q_kernel[...].shape[0]
    flat = [
      arr(k).reshape(d, -1).T for k in (a.q_kernel, a.k_kernel, a.v_kernel)
    ]
    layers.append(
      {
        "attn_gamma": arr(b.norm1.scale),
        "to_qkv": np.concatenate(flat, axis=0),
        "attn_bias": float(a.core.gate_bias[...]),
        "to_out": arr(a.out_kernel).reshape(-1, d).T,
        "ffn_gamma": arr(b.norm2.scale),
        "ff1_w": arr(b.up.kernel).T,
        "ff1_b": arr(b.up.bias),
        "modrelu_b": float(b.act.bias[...]),
        "ff2_w": arr(b.down.kernel).T,
        "ff2_b": arr(b.down.bias),
      }
    )
  return {
    "embed": arr(m.embed),
    "layers": layers,
    "final_gamma": arr(m.final_norm.scale),
    "logits_w": np.asarray(m.head.kernel[...], np.float64).T,
    "logits_b": np.asarray(m.head.bias[...], np.float64),
  }


@pytest.mark.slow
def test_pct_official_matches_transformer_cell():
  heads, dim_head, n, vocab = 2, 4, 7, 13
  cfg = ncplx.ComplexLMConfig.pct_official(
    vocab, width=8, depth=2, num_heads=heads, head_dim=dim_head, max_len=n
  )
  m = ncplx.ComplexLM(cfg, rngs=nnx.Rngs(0))
  _randomize(m, RNG)
  for b in m.blocks:  # Gate and modReLU biases where they matter.
    b.attn.core.gate_bias[...] = jnp.float32(-0.3)
    b.act.bias[...] = jnp.float32(-0.4)
  tokens = RNG.integers(0, vocab, size=n)
  want = official.pct_lm_logits(
    tokens, _pct_params(m), heads=heads, dim_head=dim_head
  )
  got = m(jnp.asarray(tokens[None], jnp.int32))[0]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_pct_official_counts_and_init():
  vocab, d, depth, heads, hd, n = 16, 128, 4, 4, 32, 32
  cfg = ncplx.ComplexLMConfig.pct_official(vocab, max_len=n)
  m = ncplx.ComplexLM(cfg, rngs=nnx.Rngs(0))
  inner = heads * hd
  # TransformerCell's parameters (complex counted twice, as reals).
  complex_entries = vocab * d + d
  complex_entries += depth * (
    2 * d + 3 * d * inner + inner * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
  )
  real = depth * 2 + 2 * d * vocab + vocab  # gate + modReLU biases, readout
  assert ncplx.count_real_parameters(m) == 2 * complex_entries + real
  b = m.blocks[0]
  assert b.act.bias[...].shape == () and float(b.act.bias[...]) == 0.0
  np.testing.assert_allclose(float(b.attn.core.gate_bias[...]), -math.log(n))
  np.testing.assert_allclose(np.asarray(b.norm1.scale[...]), 1.0)
  assert isinstance(b.norm1, ncplx.PCTRMSNorm)
  # Embedding: torch.randn(complex) / sqrt(D), E|e|^2 = 1/D.
  emb = np.asarray(m.embed[...])
  np.testing.assert_allclose((np.abs(emb) ** 2).mean() * d, 1.0, rtol=0.1)
  # Fused to_qkv Glorot: per-component variance 1 / (D + 3 inner).
  qkv = np.concatenate(
    [np.asarray(k[...]).ravel() for k in (b.attn.q_kernel, b.attn.v_kernel)]
  )
  np.testing.assert_allclose(qkv.real.var() * (d + 3 * inner), 1.0, rtol=0.05)
  out = np.asarray(b.attn.out_kernel[...])
  np.testing.assert_allclose(out.real.var() * (inner + d), 1.0, rtol=0.05)
  # FFN and readout: PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  for w, fan_in in (
    (np.asarray(b.up.kernel[...]), d),
    (np.asarray(b.up.bias[...]), d),
    (np.asarray(b.down.kernel[...]), 4 * d),
    (np.asarray(m.head.kernel[...]), 2 * d),
    (np.asarray(m.head.bias[...]), 2 * d),
  ):
    bound = 1 / math.sqrt(fan_in)
    parts = [w.real, w.imag] if np.iscomplexobj(w) else [w]
    for part in parts:
      assert np.abs(part).max() <= bound
      assert np.abs(part).max() > 0.8 * bound
  y = m(jnp.zeros((2, n), jnp.int32))
  assert y.shape == (2, n, vocab) and y.dtype == jnp.float32 and c.finite(y)


@pytest.mark.slow
def test_pct_official_gates_and_other_attention():
  relu = ncplx.ComplexLMConfig.pct_official(
    8, width=8, depth=1, num_heads=2, head_dim=4, max_len=5, gate="relu"
  )
  assert dict(relu.attention_kwargs) == {"gate": "relu", "gate_bias_len": 5}
  soft = ncplx.ComplexLMConfig.pct_official(
    8, width=8, depth=1, num_heads=2, head_dim=4, attention="complex_softmax"
  )
  assert soft.attention_kwargs == () and soft.norm == "pctrmsnorm"
  for cfg in (relu, soft):
    m = ncplx.ComplexLM(cfg, rngs=nnx.Rngs(0))
    assert m(jnp.zeros((1, 5), jnp.int32)).shape == (1, 5, 8)


def test_defaults_keep_the_previous_stack():
  """Without the new fields a config builds what it built before."""
  m = ncplx.ComplexLM(
    ncplx.ComplexLMConfig(vocab_size=8, width=4, depth=1, max_len=4),
    rngs=nnx.Rngs(0),
  )
  b = m.blocks[0]
  assert m.pos_embed is None and b.up.bias is not None
  assert b.attn.q_kernel[...].shape == (4, 1, 4)


def test_complex_lm_refuses_bad_new_fields():
  base = {"vocab_size": 8, "width": 4, "depth": 1, "max_len": 4}
  for field, value, match in (
    ("param_init", "torch", r"param_init must be one of"),
    ("modrelu_bias", "row", r"modrelu_bias must be one of"),
    ("embed_init", "zeros", r"embed_init must be one of"),
    ("head_dim", 0, r"head_dim must be a positive integer"),
  ):
    with pytest.raises(ValueError, match=match):
      ncplx.ComplexLM(
        ncplx.ComplexLMConfig(**base, **{field: value}), rngs=nnx.Rngs(0)
      )


# ---------------------------------------------------------------------------
# The modules.


def test_pct_rms_norm_module_matches_function():
  norm = ncplx.PCTRMSNorm(6, rngs=nnx.Rngs(0))
  norm.scale[...] = jnp.asarray(c.np_cnormal(RNG, (6,)), jnp.complex64)
  x = jnp.asarray(c.np_cnormal(RNG, (2, 3, 6)), jnp.complex64)
  c.close(norm(x), cplx.pct_rms_norm(x, norm.scale[...]), atol=1e-7)
  pairs = ncplx.PCTRMSNorm(12, real_pairs=True, rngs=nnx.Rngs(0))
  y = pairs(cplx.to_real(x))
  assert y.dtype == jnp.float32
  c.close(y, cplx.to_real(cplx.pct_rms_norm(x)), atol=1e-7)
  with pytest.raises(ValueError, match=r"PCTRMSNorm: use_bias=True"):
    ncplx.PCTRMSNorm(6, use_bias=True, rngs=nnx.Rngs(0))
  assert ncplx.NORM_SPECS["pctrmsnorm"].dtype_kind == "complex"


def test_fourier_hadamard_conv_module_matches_functions():
  index = cplx.local_kernel_index((2, 2), (4, 4))
  conv = ncplx.FourierHadamardConv(16, index, rngs=nnx.Rngs(0))
  assert conv.kernel[...].shape == (4,)
  assert (np.asarray(conv.kernel[...]).imag > 0).all()  # CNet's init.
  x = jnp.asarray(c.np_cnormal(RNG, (3, 16)), jnp.complex64)
  want = cplx.fourier_hadamard_conv(
    x, cplx.pad_kernel(conv.kernel[...], index, 16)
  )
  c.close(conv(x), want, atol=1e-6)
  full = ncplx.FourierHadamardConv(16, inverse=False, rngs=nnx.Rngs(0))
  c.close(
    full(x),
    cplx.fourier_hadamard_conv(x, full.kernel[...], inverse=False),
    atol=1e-6,
  )
  with pytest.raises(ValueError, match=r"pad_kernel: kernel_index entries"):
    ncplx.FourierHadamardConv(4, (0, 9), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"FourierHadamardConv: size must be"):
    ncplx.FourierHadamardConv(0, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_layer_init_options():
  act = ncplx.ModReLU(5, power=2, per_feature=False, rngs=nnx.Rngs(0))
  act.bias[...] = jnp.float32(-0.5)
  z = jnp.asarray(c.np_cnormal(RNG, (2, 5)), jnp.complex64)
  c.close(act(z), cplx.modrelu(z, jnp.float32(-0.5), power=2), atol=1e-7)
  init = ncplx.torch_linear_init(9)
  dense = ncplx.ComplexDense(
    9, 3, kernel_init=init, bias_init=init, rngs=nnx.Rngs(0)
  )
  assert np.abs(np.asarray(dense.bias[...])).max() > 0
  assert np.abs(np.asarray(dense.kernel[...]).real).max() <= 1 / 3
  real = init(jax.random.key(0), (4,), jnp.float32)
  assert real.dtype == jnp.float32 and float(jnp.abs(real).max()) <= 1 / 3
  with pytest.raises(ValueError, match=r"fan_in must be a positive"):
    ncplx.torch_linear_init(0)
  for init_name in ("glorot", "fused_glorot", "cnet"):
    mha = ncplx.ComplexMultiHeadAttention(
      8, 2, head_dim=3, init=init_name, rngs=nnx.Rngs(0)
    )
    assert mha.q_kernel[...].shape == (8, 2, 3)
    assert mha(z[:1, None, :1].repeat(8, -1).repeat(4, 1)).shape == (1, 4, 8)
  with pytest.raises(ValueError, match=r"init must be one of"):
    ncplx.ComplexMultiHeadAttention(8, 2, init="he", rngs=nnx.Rngs(0))
