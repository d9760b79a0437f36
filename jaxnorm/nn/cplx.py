"""Complex-valued nnx modules: layers, norms, attention cores and models.

Every module declares its parameters (complex ones in ``param_dtype``
complex64 unless stated) and calls one pure function of `jaxnorm.cplx`; the
maths and references live there. Two families of use:

* **Complex-native** modules take complex ``(..., d)`` arrays:
  `ComplexDense`, `ComplexConv`, the norms, `ModReLU`,
  `ComplexMultiHeadAttention` (Born, PCT or complex-softmax mixing, or CNet's
  causal Fourier mixing) and the two models, `ComplexLM` (CNet / PCT style
  language model) and `CVCNN` (the CV-CNN of the CNN vs CV-CNN study).
* **Real-pair** forms fit the real registries: the norms with
  ``real_pairs=True`` take a real ``(..., 2d)`` input as split halves
  ``[Re | Im]`` (`jaxnorm.cplx.to_complex`) and return real ``(..., 2d)``;
  the attention cores `BornAttention`, `ComplexFormerAttention` and
  `PCTAttention` take the real projections of `MultiHeadAttention` as split
  halves per head (a real projection of a real input is a widely-linear
  complex projection). `NORM_SPECS` and `ATTENTION_SPECS` are their
  registry entries.

Complex parameters need conjugated gradients: train them with
`jaxnorm.optim.complex.complex_adam` (plain optax climbs the loss in every
imaginary part).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, attention, cplx
from jaxnorm.nn import _param, registry
from jaxnorm.nn.attention import _base

Names = tuple[str | None, ...] | None


def complex_glorot(
  key: jax.Array, shape, dtype=jnp.complex64, *, in_axis=0, out_axis=-1
) -> jax.Array:
  """Complex Glorot normal: ``E|w|^2 = 2/(fan_in + fan_out)`` (circular).

  A circular complex normal is Trabelsi et al.'s Rayleigh-modulus,
  uniform-phase initialization.
  """
  init = jax.nn.initializers.variance_scaling(
    1.0, "fan_avg", "normal", in_axis=in_axis, out_axis=out_axis, dtype=dtype
  )
  return init(key, shape, dtype)


def complex_he(
  key: jax.Array, shape, dtype=jnp.complex64, *, in_axis=-2, out_axis=-1
) -> jax.Array:
  """Complex He normal: ``E|w|^2 = 2/fan_in`` (conv kernels, fan-in axes)."""
  init = jax.nn.initializers.variance_scaling(
    2.0, "fan_in", "normal", in_axis=in_axis, out_axis=out_axis, dtype=dtype
  )
  return init(key, shape, dtype)


def _zeros(shape, dtype, names: Names) -> nnx.Param:
  return _param.param(jnp.zeros(shape, dtype), names)


# ---------------------------------------------------------------------------
# Layers.


class ComplexDense(nnx.Module):
  """Complex dense layer; maths in `jaxnorm.cplx.complex_dense`.

  Parameters: ``kernel (in, out)`` complex Glorot, ``bias (out,)`` zeros.
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    use_bias: bool = True,
    param_dtype: Any = jnp.complex64,
    axis_names: Names = ("embed", "mlp"),
    rngs: nnx.Rngs,
  ):
    who = "ComplexDense"
    _checks.check_positive_int(who, "in_features", in_features)
    _checks.check_positive_int(who, "out_features", out_features)
    self.kernel = _param.param(
      complex_glorot(rngs.params(), (in_features, out_features), param_dtype),
      axis_names,
    )
    self.bias = (
      _zeros((out_features,), param_dtype, axis_names and axis_names[-1:])
      if use_bias
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x @ kernel + bias`` for complex ``x (..., in)``."""
    bias = None if self.bias is None else self.bias[...]
    return cplx.complex_dense(x, self.kernel[...], bias)


class ComplexConv(nnx.Module):
  """Complex convolution; maths in `jaxnorm.cplx.complex_conv`.

  Parameters: ``kernel (*window, in, out)`` complex He (fan-in),
  ``bias (out,)`` zeros.
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    kernel_size: tuple[int, ...],
    *,
    strides: int | tuple[int, ...] = 1,
    padding: str = "SAME",
    use_bias: bool = True,
    gauss_trick: bool = False,
    param_dtype: Any = jnp.complex64,
    rngs: nnx.Rngs,
  ):
    who = "ComplexConv"
    _checks.check_positive_int(who, "in_features", in_features)
    _checks.check_positive_int(who, "out_features", out_features)
    shape = (*kernel_size, in_features, out_features)
    fan_in = tuple(range(len(kernel_size) + 1))
    self.kernel = _param.param(
      complex_he(rngs.params(), shape, param_dtype, in_axis=fan_in),
      (None,) * len(kernel_size) + ("conv_in", "conv_out"),
    )
    self.bias = (
      _zeros((out_features,), param_dtype, ("conv_out",)) if use_bias else None
    )
    self.strides, self.padding, self.gauss_trick = strides, padding, gauss_trick

  def __call__(self, x: jax.Array) -> jax.Array:
    """Complex ``(N, *spatial, in)`` -> ``(N, *out_spatial, out)``."""
    bias = None if self.bias is None else self.bias[...]
    return cplx.complex_conv(
      x,
      self.kernel[...],
      bias,
      strides=self.strides,
      padding=self.padding,
      gauss_trick=self.gauss_trick,
    )


# ---------------------------------------------------------------------------
# Norms.


def _pairs(who: str, num_features: int, real_pairs: bool) -> int:
  """The complex width: ``num_features`` or half of it for real pairs."""
  _checks.check_positive_int(who, "num_features", num_features)
  if real_pairs:
    if num_features % 2:
      raise ValueError(
        f"{who}: real_pairs=True reads split halves [Re | Im], so "
        f"num_features must be even, got num_features={num_features}"
      )
    return num_features // 2
  return num_features


def _apply(module: nnx.Module, fn: Callable[[jax.Array], jax.Array], x):
  """``fn`` on complex ``x``, or on ``to_complex(x)`` for real pairs."""
  if not module.real_pairs:
    return fn(x)
  return cplx.to_real(fn(cplx.to_complex(x)))


def _whitening_dtype_rows(param_dtype: Any, axis_names: Names):
  """The complex dtype of the bias/mean and the names of ``(3, C)`` rows."""
  cdt = jnp.complex128 if param_dtype == jnp.float64 else jnp.complex64
  rows = (None,) + tuple(axis_names) if axis_names else None
  return cdt, rows


def _whitening_params(
  c: int, use_scale: bool, use_bias: bool, param_dtype: Any, axis_names: Names
) -> tuple[nnx.Param | None, nnx.Param | None]:
  """``scale (3, C)`` (init ``(1/√2, 0, 1/√2)``) and complex ``bias (C,)``."""
  cdt, rows = _whitening_dtype_rows(param_dtype, axis_names)
  scale = (
    _param.param(cplx.init_whitening_scale(c, param_dtype), rows)
    if use_scale
    else None
  )
  bias = _zeros((c,), cdt, axis_names) if use_bias else None
  return scale, bias


class ComplexBatchNorm(nnx.Module):
  """Complex batch norm; maths in `jaxnorm.cplx.complex_batch_norm`.

  Parameters: ``scale (3, C)`` real, rows ``(γrr, γri, γii)`` init
  ``(1/√2, 0, 1/√2)``; ``bias (C,)`` complex, zeros. Running statistics
  (`nnx.BatchStat`): ``mean (C,)`` complex, ``cov (3, C)`` real. Follows
  flax's train/eval protocol: ``use_running_average`` (``model.eval()``,
  ``nnx.view`` through `set_view`, or a call argument). ``real_pairs``:
  real ``(..., 2C)`` input and output (split halves).

  This module does not subclass `jaxnorm.nn.norms`' ``RunningAverage``:
  importing the norm package here would make an import cycle once the
  norm registry lists this module.
  """

  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.9,
    eps: float = 1e-4,
    use_scale: bool = True,
    use_bias: bool = True,
    real_pairs: bool = False,
    use_running_average: bool = False,
    axis_name: str | None = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    del rngs  # Deterministic init.
    c = _pairs("ComplexBatchNorm", num_features, real_pairs)
    self.real_pairs, self.momentum, self.eps = real_pairs, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    cdt, rows = _whitening_dtype_rows(param_dtype, axis_names)
    self.scale, self.bias = _whitening_params(
      c, use_scale, use_bias, param_dtype, axis_names
    )
    state = cplx.init_complex_batch_norm_state(c, cdt)
    self.mean = _param.param(state.mean, axis_names, nnx.BatchStat)
    self.cov = _param.param(state.cov, rows, nnx.BatchStat)

  def set_view(self, use_running_average: bool | None = None) -> None:
    """Hook of ``nnx.view``: sets ``use_running_average`` when given.

    Args:
      use_running_average: True for inference (running statistics), False
        for training (batch statistics, updated running statistics).
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes complex ``x (..., C)`` (or real pairs ``(..., 2C)``)."""
    if use_running_average is None:
      use_running_average = self.use_running_average
    training = not use_running_average
    state = cplx.ComplexBatchNormState(self.mean[...], self.cov[...])
    scale = None if self.scale is None else self.scale[...]
    bias = None if self.bias is None else self.bias[...]
    new = []

    def fn(z):
      y, s = cplx.complex_batch_norm(
        z,
        scale,
        bias,
        state,
        training=training,
        momentum=self.momentum,
        eps=self.eps,
        axis_name=self.axis_name,
      )
      new.append(s)
      return y

    y = _apply(self, fn, x)
    if training:
      self.mean[...], self.cov[...] = new[0]
    return y


class ComplexLayerNorm(nnx.Module):
  """Complex layer norm; maths in `jaxnorm.cplx.complex_layer_norm`.

  Parameters as `ComplexBatchNorm` (no running statistics).
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-4,
    use_scale: bool = True,
    use_bias: bool = True,
    real_pairs: bool = False,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    del rngs
    c = _pairs("ComplexLayerNorm", num_features, real_pairs)
    self.real_pairs, self.eps = real_pairs, eps
    self.scale, self.bias = _whitening_params(
      c, use_scale, use_bias, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each token of ``x``."""
    scale = None if self.scale is None else self.scale[...]
    bias = None if self.bias is None else self.bias[...]
    return _apply(
      self,
      lambda z: cplx.complex_layer_norm(z, scale, bias, eps=self.eps),
      x,
    )


class ComplexRMSNorm(nnx.Module):
  """CNet's TokenNorm; maths in `jaxnorm.cplx.complex_rms_norm`.

  Parameter: ``scale (d,)`` complex, init 1 (``use_scale=False`` is CNet's
  parameter-free TokenNorm).
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    use_scale: bool = True,
    real_pairs: bool = False,
    param_dtype: Any = jnp.complex64,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    del rngs
    c = _pairs("ComplexRMSNorm", num_features, real_pairs)
    self.real_pairs, self.eps = real_pairs, eps
    self.scale = (
      _param.param(jnp.ones((c,), param_dtype), axis_names)
      if use_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each token of ``x``."""
    scale = None if self.scale is None else self.scale[...]
    return _apply(
      self, lambda z: cplx.complex_rms_norm(z, scale, eps=self.eps), x
    )


class ModReLU(nnx.Module):
  """modReLU with a learned real bias; maths in `jaxnorm.cplx.modrelu`.

  Parameter: ``bias (d,)`` real, init 0 (PCT; ``power=2`` in its FFN).
  """

  def __init__(
    self,
    num_features: int,
    *,
    power: int = 1,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    del rngs
    _checks.check_positive_int("ModReLU", "num_features", num_features)
    _checks.check_positive_int("ModReLU", "power", power)
    self.power = power
    self.bias = _zeros((num_features,), param_dtype, ("mlp",))

  def __call__(self, z: jax.Array) -> jax.Array:
    """``modrelu(z, bias, power=power)``."""
    return cplx.modrelu(z, self.bias[...], power=self.power)


# ---------------------------------------------------------------------------
# Attention cores for the real `MultiHeadAttention` (split halves per head).


def _even_head(who: str, dims: _base.HeadDims) -> None:
  if dims.head_dim % 2:
    raise ValueError(
      f"{who}: the head dim must be even (split halves [Re | Im] per head), "
      f"got head_dim={dims.head_dim}"
    )


def _split_heads(*arrays: jax.Array) -> list[jax.Array]:
  return [cplx.to_complex(a) for a in arrays]


class BornAttention(_base.AttentionCore):
  """CNet Born attention on split-halves heads, `cplx.born_attention`.

  The real per-head projections ``q, k, v (B, T, N, 2h)`` are read as
  complex ``(B, T, N, h)``; the complex output returns as ``[Re | Im]``.
  Takes boolean masks (not additive biases: Born weights have no logits).
  Causal form: ``is_causal=True``. No parameters.

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet``).
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
    del param_dtype, rngs
    who = type(self).__name__
    _even_head(who, dims)
    self.is_causal = is_causal
    self.options = _base.check_options(who, cplx.born_attention, options)

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)`` real: Born attention of the complex heads."""
    del x
    if bias is not None:
      raise ValueError(
        f"{type(self).__name__}: Born attention has no logits, so it takes "
        "no additive bias; pass a boolean mask instead"
      )
    out = cplx.born_attention(
      *_split_heads(q, k, v),
      mask,
      is_causal=self.is_causal,
      **dict(self.options),
    )
    return cplx.to_real(out)


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

  Split-halves heads as `BornAttention`. Parameter: ``gate_bias ()``, one
  real scalar per layer, init ``-log(gate_bias_len)`` (64 in the code).
  Causal form: ``is_causal=True``; masks and additive biases on the score.

  References:
    Hioki, arXiv:2605.10123 (2026); code
    ``leohio/phase-coherent-transformer-r-d``.
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    gate_bias_len: int = 64,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs
    who = type(self).__name__
    _even_head(who, dims)
    _checks.check_positive_int(who, "gate_bias_len", gate_bias_len)
    self.is_causal = is_causal
    self.options = _base.check_options(
      who, cplx.pct_attention, options, owned=("gate_bias",)
    )
    self.gate_bias = _param.param(
      jnp.asarray(-math.log(gate_bias_len), param_dtype), ()
    )

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)`` real: PCT attention of the complex heads."""
    del x
    out = cplx.pct_attention(
      *_split_heads(q, k, v),
      self.gate_bias[...],
      bias,
      mask,
      is_causal=self.is_causal,
      **dict(self.options),
    )
    return cplx.to_real(out)


def _real_pairs(num_features: int, layout: str | None = None) -> dict:
  del num_features, layout
  return {"real_pairs": True}


_PER_TOKEN = frozenset({"tokens", "images", "graphs"})
_NO_DECAY_WHITENING = types.MappingProxyType({"scale": False, "bias": False})

NORM_SPECS: Mapping[str, registry.NormSpec] = types.MappingProxyType(
  {
    "complexbatchnorm": registry.NormSpec(
      ComplexBatchNorm,
      "Trabelsi et al., arXiv:1705.09792",
      defaults=_real_pairs,
      layouts=frozenset({"tokens", "images"}),
      batch_stats=True,
      decay=_NO_DECAY_WHITENING,
    ),
    "complexlayernorm": registry.NormSpec(
      ComplexLayerNorm,
      "Trabelsi et al., arXiv:1705.09792",
      defaults=_real_pairs,
      layouts=_PER_TOKEN,
      decay=_NO_DECAY_WHITENING,
    ),
    "complexrmsnorm": registry.NormSpec(
      ComplexRMSNorm,
      "Crasmaru, CNet (crasmarum/CNet)",
      defaults=_real_pairs,
      layouts=_PER_TOKEN,
    ),
  }
)
"""Registry entries of the complex norms in their real-pairs form: merge
into `jaxnorm.nn.norms.NORMS` (and its ``NormName``)."""

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
`jaxnorm.nn.attention.ATTENTIONS` (and its ``AttentionName``)."""


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


@dataclasses.dataclass(frozen=True)
class ComplexLMConfig:
  """A complex-valued decoder LM (CNet Born stack or PCT stack).

  Attributes:
    vocab_size: vocabulary.
    width: complex width ``D`` (``2 D`` reals per token).
    depth: blocks.
    num_heads: heads of the mixer.
    max_len: longest sequence.
    mixer: ``born``, ``pct``, ``softmax`` or ``fourier`` (see
      `ComplexMultiHeadAttention`).
    gate: PCT gate name (`jaxnorm.cplx.PCT_GATES`).
    norm: ``rms`` (`ComplexRMSNorm`, CNet's TokenNorm with a complex gain)
      or ``layer`` (`ComplexLayerNorm`).
    activation: FFN activation: ``split_gelu`` (CNet) or ``modrelu`` (PCT,
      power 2).
    ffn_ratio: FFN hidden width over ``D``.
    readout: ``born`` (logits ``log|z|^2`` of a complex head: the softmax
      of them is the Born rule) or ``real`` (a real dense layer on ``[Re |
      Im]``, the PCT's readout).
    embed_init: ``gauss`` (CNet's recipe ``emb_gauss``: Re, Im ~
      U(-1, 1)/sqrt(D)), ``glorot`` or ``cnet`` (``CInput``'s biased init,
      positive imaginary parts, which the authors report sits at a unigram
      saddle with the Born loss).
    cnet_gelu: CNet's block, which applies ``split_gelu`` to the stream
      after each residual add (and the norm input after the first); off
      gives a plain pre-norm block.
  """

  vocab_size: int = 256
  width: int = 32
  depth: int = 2
  num_heads: int = 1
  max_len: int = 64
  mixer: str = "born"
  gate: str = "sigmoid"
  norm: str = "rms"
  activation: str = "split_gelu"
  ffn_ratio: int = 4
  readout: str = "born"
  embed_init: str = "gauss"
  cnet_gelu: bool = True


def _embed_init(kind: str, key, shape) -> jax.Array:
  v, d = shape
  kr, ki = jax.random.split(key)
  if kind == "gauss":
    u = jax.random.uniform(kr, (2, v, d), minval=-1.0, maxval=1.0)
    return jax.lax.complex(u[0], u[1]) / math.sqrt(d)
  if kind == "cnet":
    re = jax.random.uniform(kr, (v, d), minval=-0.5, maxval=0.5)
    im = jnp.sqrt(1.0 - re**2)
    return jax.lax.complex(re, im) / math.sqrt(d)
  return complex_glorot(key, shape, in_axis=1, out_axis=0)


class ComplexBlock(nnx.Module):
  """Pre-norm block: ``x + mix(norm x)``, ``x + FFN(norm x)``."""

  def __init__(self, c: ComplexLMConfig, *, rngs: nnx.Rngs):
    d = c.width

    def norm():
      if c.norm == "layer":
        return ComplexLayerNorm(d, rngs=rngs)
      return ComplexRMSNorm(d, rngs=rngs)

    self.cnet_gelu = c.cnet_gelu
    self.norm1, self.norm2 = norm(), norm()
    self.attn = ComplexMultiHeadAttention(
      d, c.num_heads, mixer=c.mixer, gate=c.gate, rngs=rngs
    )
    hidden = c.ffn_ratio * d
    self.up = ComplexDense(d, hidden, rngs=rngs)
    self.down = ComplexDense(hidden, d, rngs=rngs, axis_names=("mlp", "embed"))
    self.act = (
      ModReLU(hidden, power=2, rngs=rngs) if c.activation == "modrelu" else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """One block on complex ``(B, T, D)``."""
    gelu = cplx.split_gelu if self.cnet_gelu else (lambda z: z)
    x = x + self.attn(gelu(self.norm1(x)))
    x = gelu(x)
    h = self.up(self.norm2(x))
    h = cplx.split_gelu(h) if self.act is None else self.act(h)
    return gelu(x + self.down(h))


class ComplexLM(nnx.Module):
  """Complex decoder LM: complex embedding, blocks, norm, readout.

  ``__call__`` returns real logits ``(B, T, V)`` (for any softmax
  cross-entropy: with ``readout="born"`` that softmax is the Born rule);
  `amplitudes` returns the complex Born amplitudes for
  `jaxnorm.cplx.born_cross_entropy` (CNet's loss, with its backward-only
  ``target_floor``).
  """

  def __init__(
    self, config: ComplexLMConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    """Builds the model.

    ``dtype`` is the dtype of the returned logits (the runner's argument;
    the compute is complex64).
    """
    c = self.config = config
    self.dtype = dtype
    who = "ComplexLM"
    _checks.check_choice(who, "mixer", c.mixer, MIXERS)
    _checks.check_choice(who, "norm", c.norm, ("rms", "layer"))
    _checks.check_choice(
      who, "activation", c.activation, ("split_gelu", "modrelu")
    )
    _checks.check_choice(who, "readout", c.readout, ("born", "real"))
    _checks.check_choice(
      who, "embed_init", c.embed_init, ("gauss", "glorot", "cnet")
    )
    self.embed = _param.param(
      _embed_init(c.embed_init, rngs.params(), (c.vocab_size, c.width)),
      ("vocab", "embed"),
    )
    self.blocks = nnx.List([ComplexBlock(c, rngs=rngs) for _ in range(c.depth)])
    self.final_norm = (
      ComplexLayerNorm(c.width, rngs=rngs)
      if c.norm == "layer"
      else ComplexRMSNorm(c.width, rngs=rngs)
    )
    if c.readout == "born":
      self.head = ComplexDense(
        c.width,
        c.vocab_size,
        use_bias=False,
        rngs=rngs,
        axis_names=("embed", "vocab"),
      )
    else:
      self.head = nnx.Linear(2 * c.width, c.vocab_size, rngs=rngs)

  def features(self, tokens: jax.Array) -> jax.Array:
    """Final normed complex hidden states ``(B, T, D)``."""
    if tokens.ndim != 2 or tokens.shape[1] > self.config.max_len:
      raise ValueError(
        f"ComplexLM: tokens must have shape (batch, seq) with seq <= "
        f"max_len={self.config.max_len}, got tokens.shape={tokens.shape}"
      )
    x = jnp.take(self.embed[...], tokens, axis=0)
    for block in self.blocks:
      x = block(x)
    return self.final_norm(x)

  def amplitudes(self, tokens: jax.Array) -> jax.Array:
    """Complex Born amplitudes ``(B, T, V)`` (``readout="born"`` only)."""
    if self.config.readout != "born":
      raise ValueError(
        "ComplexLM.amplitudes: needs readout='born', got "
        f"readout={self.config.readout!r}"
      )
    return self.head(self.features(tokens))

  def __call__(self, tokens: jax.Array, *, rngs: Any = None) -> jax.Array:
    """Real logits ``(B, T, V)`` for int tokens."""
    del rngs
    if self.config.readout == "born":
      z = self.amplitudes(tokens)
      logits = jnp.log(cplx.modulus_squared(z) + 1e-15)
    else:
      logits = self.head(cplx.to_real(self.features(tokens)))
    return logits.astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class CVCNNConfig:
  """The CV-CNN of the CNN vs CV-CNN study (complex conv, BN, CReLU).

  Attributes:
    num_classes: classes.
    image_shape: ``(H, W, C)`` of the input.
    widths: complex channels per stride-2 stage.
    input: ``real`` (a real image becomes ``x + 0i``), ``pairs`` (channel
      split halves ``[Re | Im]``, so ``C`` is even), or ``complex``.
    activation: ``crelu`` (the study's) or ``cardioid``/``zrelu``.
  """

  num_classes: int = 10
  image_shape: tuple[int, ...] = (28, 28, 1)
  widths: tuple[int, ...] = (16, 32, 64)
  input: str = "real"
  activation: str = "crelu"


class CVCNN(nnx.Module):
  """Stride-2 complex conv stages -> mean pool -> ``|z|`` -> real dense.

  Each stage: `ComplexConv` 3x3 stride 2, `ComplexBatchNorm`, activation
  (CReLU). How the study formed complex inputs from MRI is unknown; the
  ``input`` field says what this model does. Parameter counts in reals:
  `count_real_parameters`.
  """

  def __init__(
    self, config: CVCNNConfig, *, dtype: Any = jnp.float32, rngs: nnx.Rngs
  ):
    """Builds the model.

    ``dtype`` is the dtype of the returned logits (the runner's argument;
    the compute is complex64).
    """
    c = self.config = config
    self.dtype = dtype
    who = "CVCNN"
    _checks.check_choice(who, "input", c.input, ("real", "pairs", "complex"))
    _checks.check_choice(
      who, "activation", c.activation, tuple(cplx.ACTIVATIONS)
    )
    ch = c.image_shape[-1]
    if c.input == "pairs":
      if ch % 2:
        raise ValueError(
          f"{who}: input='pairs' needs an even channel count, got "
          f"image_shape={c.image_shape}"
        )
      ch //= 2
    convs, norms = [], []
    for w in c.widths:
      convs.append(ComplexConv(ch, w, (3, 3), strides=2, rngs=rngs))
      norms.append(ComplexBatchNorm(w, rngs=rngs))
      ch = w
    self.convs, self.norms = nnx.List(convs), nnx.List(norms)
    self.head = nnx.Linear(ch, c.num_classes, rngs=rngs)

  def __call__(
    self,
    x: jax.Array,
    *,
    use_running_average: bool | None = None,
    rngs: Any = None,
  ) -> jax.Array:
    """Real logits ``(N, classes)`` for images ``(N, H, W, C)``."""
    del rngs
    c = self.config
    if c.input == "real":
      z = jax.lax.complex(
        x.astype(jnp.float32), jnp.zeros(x.shape, jnp.float32)
      )
    elif c.input == "pairs":
      z = cplx.to_complex(x)
    else:
      z = x
    act = cplx.ACTIVATIONS[c.activation]
    for conv, norm in zip(self.convs, self.norms):
      z = act(norm(conv(z), use_running_average=use_running_average))
    pooled = jnp.mean(z, axis=tuple(range(1, z.ndim - 1)))
    return self.head(cplx.modulus(pooled)).astype(self.dtype)


def count_real_parameters(model: nnx.Module) -> int:
  """Trainable parameters in reals: a complex entry counts twice."""
  return sum(
    p.size * (2 if jnp.iscomplexobj(p) else 1)
    for p in jax.tree.leaves(nnx.state(model, nnx.Param))
  )
