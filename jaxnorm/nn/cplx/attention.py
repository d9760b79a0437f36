"""Complex attention: cores for `MultiHeadAttention` and a complex MHA.

The cores (`BornAttention`, `ComplexFormerAttention`, `PCTAttention`) sit
between the projections of `jaxnorm.nn.MultiHeadAttention` and its output
projection; `ComplexMultiHeadAttention` is the complex-native layer of the
complex LM (Born, PCT, complex-softmax or CNet's Fourier mixing). The
maths lives in `jaxnorm.cplx`.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, attention, cplx
from jaxnorm.nn import _param, registry
from jaxnorm.nn.attention import _base
from jaxnorm.nn.cplx.layers import _zeros, complex_glorot


def _even_head(who: str, dims: _base.HeadDims) -> None:
  if dims.head_dim % 2:
    raise ValueError(
      f"{who}: the head dim must be even (split halves [Re | Im] per head), "
      f"got head_dim={dims.head_dim}"
    )


def _heads(core: _base.AttentionCore, fn, q, k, v) -> jax.Array:
  """``fn(q, k, v)`` on complex heads, or on ``to_complex`` of real pairs."""
  if not core.real_pairs:
    return fn(q, k, v)
  q, k, v = (cplx.to_complex(a) for a in (q, k, v))
  return cplx.to_real(fn(q, k, v))


class BornAttention(_base.AttentionCore):
  """CNet Born attention, `jaxnorm.cplx.born_attention`.

  Complex-valued (``dtype_kind = "complex"``): the heads ``q, k, v (B, T,
  N, H)`` are complex, as `MultiHeadAttention` projects them with a complex
  ``param_dtype`` from a complex input. With ``real_pairs=True`` the real
  heads ``(B, T, N, 2h)`` are read as complex ``(B, T, N, h)`` split halves
  and the output returns as ``[Re | Im]`` (a real projection of a real
  input is a widely-linear complex projection). Takes boolean masks, not
  additive biases (Born weights have no logits). Causal form:
  ``is_causal=True``. No parameters.

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``).
  """

  dtype_kind: ClassVar[str] = "complex"

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    real_pairs: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del param_dtype, rngs
    who = type(self).__name__
    if real_pairs:
      _even_head(who, dims)
    self.is_causal, self.real_pairs = is_causal, real_pairs
    self.options = _base.check_options(who, cplx.born_attention, options)

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: Born attention of the heads."""
    del x
    if bias is not None:
      raise ValueError(
        f"{type(self).__name__}: Born attention has no logits, so it takes "
        "no additive bias; pass a boolean mask instead"
      )
    return _heads(
      self,
      lambda q, k, v: cplx.born_attention(
        q, k, v, mask, is_causal=self.is_causal, **dict(self.options)
      ),
      q,
      k,
      v,
    )


class ComplexFormerAttention(_base.AttentionCore):
  """ComplexFormer attention, `jaxnorm.cplx.complexformer_attention`.

  Parameters: ``delta (N, H/2)``, init ``N(0, (H/2)^{-1/2})``, and
  ``phase_bias (N, H/2)``, init 0 (the official code's init); not decayed.
  The core applies its own relative rotation: build the attention without
  RoPE. Causal form: ``is_causal=True``; masks and biases as softmax.

  References:
    Shao et al., arXiv:2505.10222 (2025, withdrawn); code
    ``shaojintian/complexFormer``.
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _even_head(who, dims)
    self.is_causal = is_causal
    self.options = _base.check_options(
      who,
      cplx.complexformer_attention,
      options,
      owned=("positions", "key_positions"),
    )
    half = dims.head_dim // 2
    std = half**-0.5
    self.delta = _param.param(
      std
      * jax.random.normal(rngs.params(), (dims.num_heads, half), param_dtype),
      ("heads", None),
    )
    self.phase_bias = _zeros(
      (dims.num_heads, half), param_dtype, ("heads", None)
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: ComplexFormer attention."""
    del x
    return cplx.complexformer_attention(
      q,
      k,
      v,
      _base.cast_param(self.delta, q),
      _base.cast_param(self.phase_bias, q),
      bias,
      mask,
      is_causal=self.is_causal,
      **dict(self.options),
    )


class PCTAttention(_base.AttentionCore):
  """Phase-Coherent Transformer attention, `jaxnorm.cplx.pct_attention`.

  Complex heads, or real pairs with ``real_pairs=True``, as
  `BornAttention`. Parameter: ``gate_bias ()``, one real scalar per layer
  (the real dtype of ``param_dtype``), init ``-log(gate_bias_len)`` (64 in
  the code). Causal form: ``is_causal=True``; masks and additive biases on
  the score.

  References:
    Hioki, arXiv:2605.10123 (2026); code
    ``leohio/phase-coherent-transformer-r-d``.
  """

  dtype_kind: ClassVar[str] = "complex"

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    real_pairs: bool = False,
    gate_bias_len: int = 64,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs
    who = type(self).__name__
    if real_pairs:
      _even_head(who, dims)
    _checks.check_positive_int(who, "gate_bias_len", gate_bias_len)
    self.is_causal, self.real_pairs = is_causal, real_pairs
    self.options = _base.check_options(
      who, cplx.pct_attention, options, owned=("gate_bias",)
    )
    real_dtype = jnp.finfo(param_dtype).dtype
    self.gate_bias = _param.param(
      jnp.asarray(-math.log(gate_bias_len), real_dtype), ()
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``: PCT attention of the heads."""
    del x
    return _heads(
      self,
      lambda q, k, v: cplx.pct_attention(
        q,
        k,
        v,
        self.gate_bias[...],
        bias,
        mask,
        is_causal=self.is_causal,
        **dict(self.options),
      ),
      q,
      k,
      v,
    )


_NO_DECAY_PHASES = types.MappingProxyType({"delta": False, "phase_bias": False})

ATTENTION_SPECS: Mapping[str, registry.AttentionSpec] = types.MappingProxyType(
  {
    "born": registry.AttentionSpec(BornAttention, "Crasmaru, CNet"),
    "complexformer": registry.AttentionSpec(
      ComplexFormerAttention,
      "Shao et al., arXiv:2505.10222 (withdrawn)",
      decay=_NO_DECAY_PHASES,
    ),
    "pct": registry.AttentionSpec(PCTAttention, "Hioki, arXiv:2605.10123"),
  }
)
"""Registry entries of the complex attention cores: merge into
`jaxnorm.nn.attention.ATTENTIONS` (and its ``AttentionName``).

``born`` and ``pct`` are complex-valued (their cores' ``dtype_kind`` is
``"complex"``): `MultiHeadAttention` runs them on a complex input with a
complex ``param_dtype`` (or on real pairs with ``real_pairs=True``).
``complexformer`` is a real core (real heads, complex phases inside). Born
attention takes boolean masks but no additive bias."""


# ---------------------------------------------------------------------------
# Complex-native multi-head attention and the models.

Mixer = Literal["born", "pct", "softmax", "fourier"]
MIXERS: tuple[str, ...] = ("born", "pct", "softmax", "fourier")


def complex_softmax_attention(q, k, v, *, is_causal: bool = True):
  r"""Complex softmax attention (Eilers' ℂAtt, the PCT's complex baseline).

  Softmax over :math:`\mathrm{Re}\langle q, k\rangle/\sqrt H` times
  complex ``v``.

  ``Re(q^H k)`` is the real dot product of the split halves, so this is
  `jaxnorm.attention.dot_product_attention` on ``to_real`` views with scale
  ``1/sqrt(H)`` (``H`` complex dims).
  """
  h = q.shape[-1]
  out = attention.dot_product_attention(
    cplx.to_real(q),
    cplx.to_real(k),
    cplx.to_real(v),
    scale=1.0 / math.sqrt(h),
    is_causal=is_causal,
    implementation="xla",
  )
  return cplx.to_complex(out)


class ComplexMultiHeadAttention(nnx.Module):
  """Complex multi-head self-attention (causal): projections, RoPE, mixer.

  ``mixer``: ``"born"`` (`cplx.born_attention`), ``"pct"``
  (`cplx.pct_attention`, gate ``gate``), ``"softmax"``
  (`complex_softmax_attention`) or ``"fourier"`` (CNet's causal DFT of the
  flattened token-major stream, `cplx.causal_fourier_mix`; no projections).
  Parameters: ``q_kernel``, ``k_kernel``, ``v_kernel (D, N, H)`` and
  ``out_kernel (N, H, D)``, complex Glorot, no bias; PCT adds ``gate_bias
  ()`` (init ``-log 64``).
  """

  def __init__(
    self,
    num_features: int,
    num_heads: int,
    *,
    head_dim: int | None = None,
    mixer: Mixer = "born",
    gate: str = "sigmoid",
    use_rope: bool = True,
    param_dtype: Any = jnp.complex64,
    rngs: nnx.Rngs,
  ):
    who = "ComplexMultiHeadAttention"
    _checks.check_choice(who, "mixer", mixer, MIXERS)
    _checks.check_choice(who, "gate", gate, tuple(cplx.PCT_GATES))
    _checks.check_positive_int(who, "num_heads", num_heads)
    if head_dim is None:
      _checks.check_divisible(
        who, "num_features", num_features, "num_heads", num_heads
      )
      head_dim = num_features // num_heads
    self.mixer, self.gate, self.use_rope = mixer, gate, use_rope
    d, n, h = num_features, num_heads, head_dim
    if mixer == "fourier":
      return

    def kernel(shape, in_axis, out_axis, names):
      w = complex_glorot(
        rngs.params(), shape, param_dtype, in_axis=in_axis, out_axis=out_axis
      )
      return _param.param(w, names)

    qkv = ("embed", "heads", "head_dim")
    self.q_kernel = kernel((d, n, h), 0, (1, 2), qkv)
    self.k_kernel = kernel((d, n, h), 0, (1, 2), qkv)
    self.v_kernel = kernel((d, n, h), 0, (1, 2), qkv)
    self.out_kernel = kernel(
      (n, h, d), (0, 1), 2, ("heads", "head_dim", "embed")
    )
    if mixer == "pct":
      self.gate_bias = _param.param(jnp.asarray(-math.log(64.0)), ())

  def __call__(self, x: jax.Array) -> jax.Array:
    """Causal mixing of complex ``x (B, T, D)``; returns ``(B, T, D)``."""
    if self.mixer == "fourier":
      b, t, d = x.shape
      return cplx.causal_fourier_mix(x.reshape(b, t * d)).reshape(b, t, d)

    def proj(kernel):
      return jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(x.dtype))

    q, k, v = proj(self.q_kernel), proj(self.k_kernel), proj(self.v_kernel)
    if self.use_rope:
      q, k = cplx.complex_rope(q), cplx.complex_rope(k)
    if self.mixer == "born":
      y = cplx.born_attention(q, k, v, is_causal=True)
    elif self.mixer == "pct":
      y = cplx.pct_attention(
        q, k, v, self.gate_bias[...], is_causal=True, gate=self.gate
      )
    else:
      y = complex_softmax_attention(q, k, v)
    return jnp.einsum("btnh,nhd->btd", y, self.out_kernel[...].astype(y.dtype))
