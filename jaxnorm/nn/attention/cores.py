"""Attention cores, one class per paper (the maths is in `jaxnorm.attention`).

Each core is built as ``Core(dims, *, is_causal, param_dtype, rngs,
**options)`` (`HeadDims`) and called as ``core(x, q, k, v, *, mask,
bias)`` by `MultiHeadAttention` (plus ``cached=True`` in a decode step for
the cores with ``supports_cache``: softmax, off-by-one, sink, gated and
affine-scaled). ``options`` are the keyword options of the
core's pure function (checked when the core is built) plus the core's own
constructor arguments. Parameter paths below are relative to the core, which
sits at ``<attention>.core`` in a model.

======================  ==============================================
core                    parameters / state (logical axis names)
======================  ==============================================
`SoftmaxAttention`      none
`OffByOneAttention`     none
`SinkAttention`         ``sinks (N,)`` ``("heads",)``, init 0
`GatedAttention`        ``gate_kernel (D, N, H)`` or ``(D, N, 1)``
`AffineScaledAttention` ``alpha_kernel (D, N)``; state ``alpha_ma``
`SoftAttention`         map form: ``landmark_kernel (r, r, H, H)``,
                        ``landmark_scale``/``landmark_bias (H,)``,
                        ``local_kernel (k, k, N)``; token form: none
`NaLaAttention`         map form: ``gate_kernel (D, N, H)``,
                        ``gate_bias``, ``lepe_bias``, ``norm_scale``,
                        ``norm_bias (N*H,)``, ``lepe_kernel (k, k,
                        N*H)``; token form: none
`LinaAttention`         ``key_gate``, ``value_gate (max_len, K)``
`CausalLinearAttention` none
`MXFP4Attention`        none
`SinkhornAttention`     none
======================  ==============================================

Cores whose paper layer acts on a 2-D token map (SOFT, NaLaFormer) have the
class attribute ``needs_grid`` (read into their spec,
`jaxnorm.nn.registry.AttentionSpec`): a model with a map (the ViT) builds
them with ``grid_shape=(h, w)`` and ``num_prefix`` (its [CLS]); without
``grid_shape`` they run a documented token form for 1-D sequences.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, vision
from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base

_CAUSAL_ALTERNATIVES = "softmax, sink, gated or causal_linear"


class AffineScaleEMA(nnx.BatchStat):
  """The running estimate ``alpha_ma`` of Affine-Scaled Attention."""


def _require_full_heads(who: str, dims: _base.HeadDims, why: str) -> None:
  """Raises unless ``num_kv_heads == num_heads``."""
  if dims.num_kv_heads != dims.num_heads:
    raise ValueError(
      f"{who}: {why}, so num_kv_heads must equal num_heads="
      f"{dims.num_heads}, got num_kv_heads={dims.num_kv_heads}"
    )


def _check_odd(who: str, name: str, value: Any) -> None:
  """Raises unless ``value`` is a positive odd int (a SAME conv size)."""
  _checks.check_positive_int(who, name, value)
  if value % 2 == 0:
    raise ValueError(f"{who}: {name} must be odd, got {name}={value}")


def _torch_conv_init(
  rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype: Any
) -> jax.Array:
  """Torch's ``Conv2d`` default weight init, ``U(+-1/sqrt(fan_in))``."""
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(rngs.params(), shape, dtype, -bound, bound)


class _FunctionCore(_base.AttentionCore):
  """A core without parameters: forwards to one pure function.

  Subclasses set ``function`` (the pure attention function), ``masked``
  (it takes ``bias``/``mask``/``is_causal``) and ``causal_form`` (it has a
  causal form; when False, ``is_causal=True`` is refused).
  """

  function: ClassVar[Callable[..., jax.Array]]
  masked: ClassVar[bool] = True
  causal_form: ClassVar[bool] = True

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del param_dtype, rngs  # No parameters.
    who = type(self).__name__
    if not self.causal_form:
      _base.refuse_causal(who, is_causal, _CAUSAL_ALTERNATIVES)
    self.dims, self.is_causal = dims, is_causal
    self.options = _base.check_options(who, type(self).function, options)

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)`` output of the pure function on ``q, k, v``."""
    del x
    fn = type(self).function
    if not self.masked:
      _base.refuse_mask(type(self).__name__, mask, bias)
      return fn(q, k, v, **dict(self.options))
    is_causal, options = _base.call_structure(self, cached)
    return fn(q, k, v, bias, mask, is_causal=is_causal, **options)


class SoftmaxAttention(_FunctionCore):
  """Softmax attention, `jaxnorm.attention.dot_product_attention`.

  Causal form: the lower-triangular mask (``is_causal=True``).

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """

  function = staticmethod(attn.dot_product_attention)
  supports_cache = True


class OffByOneAttention(_FunctionCore):
  """Softmax off-by-one: `jaxnorm.attention.sink_attention` with zero sinks.

  Causal form: the lower-triangular mask; the sink is a key every query
  sees.

  References:
    E. Miller, *Attention Is Off By One* (2023, blog).
  """

  function = staticmethod(attn.sink_attention)
  supports_cache = True


class MXFP4Attention(_FunctionCore):
  """MXFP4 fake-quantized attention, `jaxnorm.attention.mxfp4_attention`.

  Causal form: ``is_causal=True`` (the pure function's causal mode decides
  how V's block scales avoid later tokens; see its docstring).

  References:
    Yu et al., *MXAttention: Data-Free Optimal Scaling and Pre-Normalization
    Quantization for MXFP4 Attention*, arXiv:2607.24377 (2026).
  """

  function = staticmethod(attn.mxfp4_attention)


class SinkhornAttention(_FunctionCore):
  """Sinkhorn (entropic OT plan) attention, `attention.sinkhorn_attention`.

  Causal form: ``is_causal=True`` as the pure function defines it.

  References:
    Freytes, *Geometric Attention: A Regime-Explicit Operator Semantics for
    Transformer Attention*, arXiv:2601.11618 (2026).
  """

  function = staticmethod(attn.sinkhorn_attention)


class NaLaAttention(_base.AttentionCore):
  r"""NaLaFormer norm-aware linear attention.

  No causal form (the key summary runs over every key) and no mask.

  Map form (``grid_shape`` given: the paper's layer, official
  ``NormAwareLinearAttn``): `vision.nala_grid_attention`, i.e.
  :math:`\mathrm{LN}(\mathrm{NaLa}(q, k, v) + \mathrm{DWConv}(v)) \odot
  \mathrm{SiLU}(g)` with the 2-D RoPE on the features in the numerator.
  Parameters: the gate projection ``gate_kernel (D, N, H)`` (LeCun normal,
  as the other projections of `MultiHeadAttention`) and ``gate_bias (N *
  H,)`` (0; the official ``qkvg`` has a bias); the LePE conv
  ``lepe_kernel (k, k, N * H)`` (``lepe_size`` k, official 5; normal
  with std 0.02, as the official timm ``trunc_normal_(std=.02)`` whose
  bounds +-2 lie 100 std out) and ``lepe_bias`` (0); the LayerNorm
  ``norm_scale`` (1) and ``norm_bias`` (0). Needs ``num_kv_heads ==
  num_heads`` and ``head_dim % 4 == 0``; `MultiHeadAttention`'s own RoPE
  (``use_rope``) would rotate q and k *before* the feature maps, so leave it
  off.

  Token form (no ``grid_shape``; for 1-D sequences): the attention kernel
  `attention.nala_attention` alone, without the LePE conv, LayerNorm, gate
  and RoPE of the paper's layer. No parameters.

  References:
    Meng et al., *NaLaFormer: Norm-Aware Linear Attention for Transformer
    Models*, arXiv:2506.21137 (2025).
  """

  needs_grid: ClassVar[bool] = True

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    grid_shape: tuple[int, int] | None = None,
    num_prefix: int = 0,
    lepe_size: int = 5,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _base.refuse_causal(who, is_causal, _CAUSAL_ALTERNATIVES)
    self.options = _base.check_options(
      who, attn.nala_attention, options, owned=("rope_sin_cos",)
    )
    self.grid_shape, self.num_prefix = grid_shape, num_prefix
    if grid_shape is None:
      self.gate_kernel = self.gate_bias = self.lepe_kernel = None
      self.lepe_bias = self.norm_scale = self.norm_bias = None
      return
    vision.grid_tokens(grid_shape, num_prefix, who=who)
    _require_full_heads(who, dims, "the LePE conv and gate act on N * H")
    _checks.check_divisible(who, "head_dim", dims.head_dim, "4 (2-D RoPE)", 4)
    _check_odd(who, "lepe_size", lepe_size)
    n, h = dims.num_heads, dims.head_dim
    c, pd = n * h, param_dtype
    self.gate_kernel = _base.dense_param(
      rngs,
      (dims.num_features, n, h),
      0,
      (1, 2),
      pd,
      ("embed", "heads", "head_dim"),
    )
    lepe = 0.02 * jax.random.normal(
      rngs.params(), (lepe_size, lepe_size, c), pd
    )
    self.lepe_kernel = _param.param(lepe, (None, None, "heads"))
    self.gate_bias = _param.param(jnp.zeros((c,), pd), ("heads",))
    self.lepe_bias = _param.param(jnp.zeros((c,), pd), ("heads",))
    self.norm_scale = _param.param(jnp.ones((c,), pd), ("heads",))
    self.norm_bias = _param.param(jnp.zeros((c,), pd), ("heads",))

  def cross_refusal(self) -> str | None:
    """The map form attends within its token map only."""
    if self.grid_shape is not None:
      return (
        "the map form's LePE conv, gate and 2-D RoPE act on the query token "
        "map (build it without grid_shape for the token form)"
      )
    return None

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``; the map form reads the gate from ``x``."""
    _base.refuse_mask(type(self).__name__, mask, bias)
    if self.grid_shape is None:
      return attn.nala_attention(q, k, v, **dict(self.options))
    gate = jnp.einsum("btd,dnh->btnh", x, _base.cast_param(self.gate_kernel, x))
    gate = gate + _base.cast_param(self.gate_bias, x).reshape(
      (1, 1) + q.shape[2:]
    )
    return vision.nala_grid_attention(
      q,
      k,
      v,
      gate,
      lepe_kernel=self.lepe_kernel[...],
      lepe_bias=self.lepe_bias[...],
      norm_scale=self.norm_scale[...],
      norm_bias=self.norm_bias[...],
      grid_shape=self.grid_shape,
      num_prefix=self.num_prefix,
      **dict(self.options),
    )


class CausalLinearAttention(_FunctionCore):
  """Causal linear attention, `attention.causal_linear_attention`.

  Always causal whatever ``is_causal`` says (the running key-value state
  only ever holds the prefix); takes no mask.

  References:
    Katharopoulos et al., *Transformers are RNNs: Fast Autoregressive
    Transformers with Linear Attention*, arXiv:2006.16236 (2020).
  """

  function = staticmethod(attn.causal_linear_attention)
  masked = False

  def cross_refusal(self) -> str | None:
    """The running key-value state is the prefix of the queries' sequence."""
    return (
      "it is always causal self-attention (its running key-value state "
      "is the queries' own prefix)"
    )


class SinkAttention(_base.AttentionCore):
  """Learned per-head sink logits, `jaxnorm.attention.sink_attention`.

  Parameters: ``sinks (N,)``, init 0 (off-by-one at init). Causal form: the
  lower-triangular mask.

  References:
    OpenAI, *gpt-oss-120b & gpt-oss-20b Model Card*, arXiv:2508.10925
    (2025); Xiao et al., *Efficient Streaming Language Models with Attention
    Sinks*, arXiv:2309.17453 (2023).
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
    del rngs  # Zero init.
    self.is_causal = is_causal
    self.options = _base.check_options(
      type(self).__name__, attn.sink_attention, options, owned=("sinks",)
    )
    self.sinks = _param.param(
      jnp.zeros((dims.num_heads,), param_dtype), ("heads",)
    )

  supports_cache = True

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``: attention with the learned sinks."""
    del x
    is_causal, options = _base.call_structure(self, cached)
    return attn.sink_attention(
      q, k, v, bias, mask, sinks=self.sinks[...], is_causal=is_causal, **options
    )


class GatedAttention(_base.AttentionCore):
  r"""Gated attention output: SDPA then :math:`Y \odot \sigma(x W_g)`.

  Parameters: ``gate_kernel (D, N, H)``, or ``(D, N, 1)`` with
  ``headwise=True``, LeCun-normal init; `attention.gated_attention_output`.
  Causal form: the lower-triangular mask (the gate is per position).

  References:
    Qiu et al., *Gated Attention for Large Language Models*,
    arXiv:2505.06708 (2025).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    headwise: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    self.is_causal = is_causal
    self.options = _base.check_options(
      type(self).__name__, attn.dot_product_attention, options
    )
    width = 1 if headwise else dims.head_dim
    self.gate_kernel = _base.dense_param(
      rngs,
      (dims.num_features, dims.num_heads, width),
      0,
      (1, 2),
      param_dtype,
      ("embed", "heads", None if headwise else "head_dim"),
    )

  supports_cache = True

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``: gated SDPA output."""
    is_causal, options = _base.call_structure(self, cached)
    y = attn.dot_product_attention(
      q, k, v, bias, mask, is_causal=is_causal, **options
    )
    gates = jnp.einsum(
      "btd,dnh->btnh", x, _base.cast_param(self.gate_kernel, x)
    )
    return attn.gated_attention_output(y, gates)


class AffineScaledAttention(_base.AttentionCore):
  r"""Affine-Scaled Attention, `attention.affine_scaled_attention`.

  Parameters: ``alpha_kernel (D, N)`` (no bias), ``alpha =
  linear_clipping(x @ alpha_kernel)``; state `AffineScaleEMA` ``alpha_ma``
  (``(N,)``, or ``()`` with ``ema_axes="per_layer"``), updated in training
  mode. ``use_running_average=True`` (``model.eval()``, or ``nnx.view(model,
  use_running_average=True)`` through `set_view`) uses and keeps the stored
  estimate.

  Causal form: ``is_causal=True`` with the pure function's causal handling
  of the running estimate (see its docstring).

  References:
    Bae et al., *Affine-Scaled Attention: Towards Flexible and Stable
    Transformer Attention*, arXiv:2602.23057 (2026).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    ema_axes: Literal["per_head", "per_layer"] = "per_head",
    use_running_average: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _checks.check_choice(who, "ema_axes", ema_axes, ("per_head", "per_layer"))
    self.is_causal, self.use_running_average = is_causal, use_running_average
    self.options = _base.check_options(
      who,
      attn.affine_scaled_attention,
      options,
      owned=("alpha", "alpha_ma", "training"),
    )
    n = dims.num_heads
    self.alpha_kernel = _base.dense_param(
      rngs, (dims.num_features, n), 0, 1, param_dtype, ("embed", "heads")
    )
    shape, names = ((n,), ("heads",)) if ema_axes == "per_head" else ((), ())
    self.alpha_ma = _param.param(
      jnp.zeros(shape, jnp.float32), names, AffineScaleEMA
    )

  supports_cache = True

  def cache_refusal(self) -> str | None:
    """Decoding runs in eval mode: training updates ``alpha_ma`` per call."""
    if not self.use_running_average:
      return (
        "in training mode every call updates alpha_ma, so a decode step "
        "would not equal the full forward; decode in eval mode "
        "(model.eval() or nnx.view(model, use_running_average=True))"
      )
    return None

  def set_view(self, use_running_average: bool | None = None) -> None:
    """The `nnx.view` protocol: train (False) or eval (True) behaviour.

    Args:
      use_running_average: use and keep the stored ``alpha_ma`` (True) or
        update it from the batch (False); None leaves it unchanged.
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)``; updates ``alpha_ma`` in training mode."""
    logits = jnp.einsum(
      "btd,dn->btn", x, _base.cast_param(self.alpha_kernel, x)
    )
    alpha = attn.linear_clipping(logits.astype(jnp.float32))
    training = not self.use_running_average
    is_causal, options = _base.call_structure(self, cached)
    y, new_ma = attn.affine_scaled_attention(
      q,
      k,
      v,
      bias,
      mask,
      alpha=alpha,
      alpha_ma=self.alpha_ma[...],
      is_causal=is_causal,
      training=training,
      **options,
    )
    if training:
      self.alpha_ma[...] = new_ma
    return y


class SoftAttention(_base.AttentionCore):
  r"""SOFT softmax-free attention (`attention.soft_attention`).

  Queries double as keys (``ties_keys``: no key projection). No causal
  form (landmarks pool future tokens), no mask. Needs ``num_kv_heads ==
  num_heads``.

  Map form (``grid_shape`` given: the paper's layer, official
  ``SoftmaxFreeAttentionKernel``): `vision.soft_grid_attention`, with
  learned landmarks (`vision.soft_conv_landmarks`: a ``ratio x ratio``
  conv of stride ``ratio`` shared by the heads, LayerNorm, GELU) and the
  depthwise-conv branch on ``v`` (`vision.soft_local_conv`, ``conv_size``
  k, official 9/5/3 by stage; 0 turns it off). Parameters, with torch's
  ``Conv2d`` default init ``U(+-1/sqrt(fan_in))`` as the official model
  (its init touches only Linear and LayerNorm): ``landmark_kernel (r, r,
  H, H)`` (fan-in ``H r^2``), ``landmark_scale`` (1) and ``landmark_bias``
  (0) ``(H,)``, ``local_kernel (k, k, N)`` (fan-in ``k^2``).

  Token form (no ``grid_shape``; for 1-D sequences): parameter-free
  landmarks `attention.soft_landmarks`, means of ``ratio`` consecutive
  scaled queries (the length must be a multiple of ``ratio``), and no
  local branch. No parameters.

  References:
    Lu et al., *SOFT: Softmax-free Transformer with Linear Complexity*,
    arXiv:2110.11945 (2021).
  """

  ties_keys = True
  needs_grid: ClassVar[bool] = True

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    ratio: int = 2,
    conv_size: int = 3,
    grid_shape: tuple[int, int] | None = None,
    num_prefix: int = 0,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    who = type(self).__name__
    _base.refuse_causal(who, is_causal, _CAUSAL_ALTERNATIVES)
    _checks.check_positive_int(who, "ratio", ratio)
    _require_full_heads(who, dims, "SOFT ties keys to queries")
    self.ratio, self.grid_shape, self.num_prefix = ratio, grid_shape, num_prefix
    self.options = _base.check_options(
      who, attn.soft_attention, options, owned=("landmarks",)
    )
    if grid_shape is None:
      self.landmark_kernel = self.landmark_scale = None
      self.landmark_bias = self.local_kernel = None
      return
    vision.grid_tokens(grid_shape, num_prefix, who=who)
    if ratio > min(grid_shape):
      raise ValueError(
        f"{who}: the landmark window ratio={ratio} must fit the grid "
        f"{grid_shape}"
      )
    h, n, pd = dims.head_dim, dims.num_heads, param_dtype
    self.landmark_kernel = _param.param(
      _torch_conv_init(rngs, (ratio, ratio, h, h), h * ratio * ratio, pd),
      (None, None, None, "head_dim"),
    )
    self.landmark_scale = _param.param(jnp.ones((h,), pd), ("head_dim",))
    self.landmark_bias = _param.param(jnp.zeros((h,), pd), ("head_dim",))
    local = None
    if conv_size:
      _check_odd(who, "conv_size", conv_size)
      local = _param.param(
        _torch_conv_init(rngs, (conv_size, conv_size, n), conv_size**2, pd),
        (None, None, "heads"),
      )
    self.local_kernel = local

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)``; ``k`` is None (tied to ``q``)."""
    del x, k
    _base.refuse_mask(type(self).__name__, mask, bias)
    options = dict(self.options)
    if self.grid_shape is None:
      landmarks = attn.soft_landmarks(q, self.ratio, scale=options.get("scale"))
      return attn.soft_attention(q, v, landmarks, **options)
    local = self.local_kernel
    return vision.soft_grid_attention(
      q,
      v,
      landmark_kernel=self.landmark_kernel[...],
      landmark_scale=self.landmark_scale[...],
      landmark_bias=self.landmark_bias[...],
      local_kernel=None if local is None else local[...],
      grid_shape=self.grid_shape,
      num_prefix=self.num_prefix,
      **options,
    )


class LinaAttention(_base.AttentionCore):
  """LINA linear attention, `attention.lina_attention`.

  Parameters (only with ``max_len``): static KV gates ``key_gate`` and
  ``value_gate`` of shape ``(max_len, K)`` (``("seq", "kv_heads")``), init
  1, indexed by key position; the keys (``inputs_k`` in cross-attention)
  may then be at most ``max_len`` long. No causal form, no
  mask.

  References:
    Wang et al., *LINA: Linear Autoregressive Image Generative Models with
    Continuous Tokens*, arXiv:2601.22630 (2026).
  """

  def __init__(
    self,
    dims: _base.HeadDims,
    *,
    is_causal: bool = False,
    max_len: int | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del rngs  # Ones init.
    who = type(self).__name__
    _base.refuse_causal(who, is_causal, _CAUSAL_ALTERNATIVES)
    self.options = _base.check_options(
      who, attn.lina_attention, options, owned=("key_gate", "value_gate")
    )
    if max_len is None:
      self.key_gate = self.value_gate = None
    else:
      _checks.check_positive_int(who, "max_len", max_len)
      shape, names = (max_len, dims.num_kv_heads), ("seq", "kv_heads")
      self.key_gate = _param.param(jnp.ones(shape, param_dtype), names)
      self.value_gate = _param.param(jnp.ones(shape, param_dtype), names)

  def __call__(self, x, q, k, v, *, mask=None, bias=None) -> jax.Array:
    """``(B, T, N, H)`` LINA output with the static gates, if any."""
    who = type(self).__name__
    _base.refuse_mask(who, mask, bias)
    gates = {}
    if self.key_gate is not None:
      t, max_len = v.shape[1], self.key_gate.shape[0]
      if t > max_len:
        raise ValueError(
          f"{who}: key/value length {t} exceeds max_len={max_len}"
        )
      gates = dict(
        key_gate=self.key_gate[...][:t], value_gate=self.value_gate[...][:t]
      )
    return attn.lina_attention(q, k, v, **gates, **dict(self.options))
