"""Multi-head attention module that selects any `jaxnorm.attention` variant.

The module holds the projections (and each variant's own parameters or
state) and calls the pure function; see `jaxnorm.attention` for the maths.
Parameters carry logical axis names (``embed``, ``heads``, ``kv_heads``,
``head_dim``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, sharding
from jaxnorm import attention as attn
from jaxnorm.nn import _param

AttentionName = Literal[
  "softmax",
  "off_by_one",
  "sink",
  "gated",
  "affine_scaled",
  "soft",
  "nala",
  "lina",
  "causal_linear",
  "mxfp4",
  "sinkhorn",
]
ATTENTION_NAMES: tuple[str, ...] = (
  "softmax",
  "off_by_one",
  "sink",
  "gated",
  "affine_scaled",
  "soft",
  "nala",
  "lina",
  "causal_linear",
  "mxfp4",
  "sinkhorn",
)
# Variants whose pure function takes no mask / bias / causal flag.
_NO_MASK = ("soft", "nala", "lina", "causal_linear")


class AffineScaleEMA(nnx.BatchStat):
  """The running estimate ``alpha_ma`` of Affine-Scaled Attention."""


def _dense(rngs: nnx.Rngs, shape, in_axis, out_axis, dtype, names, init=None):
  init = init or jax.nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis
  )
  return _param.param(init(rngs.params(), shape, dtype), names)


class MultiHeadAttention(nnx.Module):
  """Multi-head self-attention with a selectable attention variant.

  ``x (B, T, D)`` -> q ``(B, T, N, H)``, k/v ``(B, T, K, H)`` -> optional
  QK-norm (any `make_norm` name, over ``H``) -> optional RoPE -> the variant
  named by ``attention`` -> output projection to ``(B, T, D)``.

  Variants and the parameters / options they add:

  * ``"softmax"``: `attention.dot_product_attention`.
  * ``"off_by_one"``: `attention.sink_attention` with zero sinks.
  * ``"sink"``: learned per-head sink logits ``sinks (N,)``, init 0.
  * ``"gated"``: SDPA then `attention.gated_attention_output` with
    ``gate_kernel (D, N, H)`` (``(D, N, 1)`` if ``gate_headwise``).
  * ``"affine_scaled"``: ``alpha_kernel (D, N)`` (no bias) and the
    `AffineScaleEMA` state ``alpha_ma`` (``(N,)``, or ``()`` with
    ``ema_axes="per_layer"``); updated unless ``use_running_average``
    (``model.eval()`` sets it). ``alpha = linear_clipping(x @ alpha_kernel)``.
  * ``"soft"``: queries double as keys (no key projection); landmarks are
    `attention.soft_landmarks` with ``soft_ratio``; needs ``K == N``.
  * ``"nala"``, ``"mxfp4"``, ``"sinkhorn"``: the pure functions.
  * ``"lina"``: static KV gates ``key_gate``/``value_gate`` of shape
    ``(lina_max_len, K)`` (init 1) when ``lina_max_len`` is given.
  * ``"causal_linear"``: `attention.causal_linear_attention` (always causal).

  ``attention_kwargs`` are forwarded to the pure function (e.g.
  ``{"p_quant": "direct"}`` for ``"mxfp4"``). Projections are bias-free by
  default with LeCun-normal (truncated) init.
  """

  def __init__(
    self,
    num_features: int,
    num_heads: int,
    *,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    attention: AttentionName = "softmax",
    is_causal: bool = False,
    use_rope: bool = False,
    rope_base: float = 10000.0,
    qk_norm: str | None = None,
    qk_norm_kwargs: Mapping[str, Any] | None = None,
    use_bias: bool = False,
    gate_headwise: bool = False,
    ema_axes: Literal["per_head", "per_layer"] = "per_head",
    soft_ratio: int = 2,
    lina_max_len: int | None = None,
    attention_kwargs: Mapping[str, Any] | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "MultiHeadAttention"
    _checks.check_choice(who, "attention", attention, ATTENTION_NAMES)
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_heads", num_heads)
    kv = num_heads if num_kv_heads is None else num_kv_heads
    _checks.check_positive_int(who, "num_kv_heads", kv)
    _checks.check_divisible(who, "num_heads", num_heads, "num_kv_heads", kv)
    if head_dim is None:
      _checks.check_divisible(
        who, "num_features", num_features, "num_heads", num_heads
      )
      head_dim = num_features // num_heads
    _checks.check_positive_int(who, "head_dim", head_dim)
    _checks.check_choice(who, "ema_axes", ema_axes, ("per_head", "per_layer"))
    if attention == "soft" and kv != num_heads:
      raise ValueError(
        f"{who}: attention='soft' ties keys to queries, so num_kv_heads must "
        f"equal num_heads={num_heads}, got num_kv_heads={kv}"
      )
    if attention in _NO_MASK and is_causal and attention != "causal_linear":
      raise ValueError(
        f"{who}: attention={attention!r} has no causal form; use "
        f"attention='causal_linear' or is_causal=False"
      )
    d, n, h = num_features, num_heads, head_dim
    self.num_features, self.num_heads, self.num_kv_heads = d, n, kv
    self.head_dim, self.attention, self.is_causal = h, attention, is_causal
    self.use_rope, self.rope_base = use_rope, rope_base
    self.soft_ratio = soft_ratio
    self.attention_kwargs = dict(attention_kwargs or {})
    self.dtype, self.use_running_average = dtype, False
    pd = param_dtype
    self.q_kernel = _dense(
      rngs, (d, n, h), 0, (1, 2), pd, ("embed", "heads", "head_dim")
    )
    self.k_kernel = (
      None
      if attention == "soft"
      else _dense(
        rngs, (d, kv, h), 0, (1, 2), pd, ("embed", "kv_heads", "head_dim")
      )
    )
    self.v_kernel = _dense(
      rngs, (d, kv, h), 0, (1, 2), pd, ("embed", "kv_heads", "head_dim")
    )
    self.out_kernel = _dense(
      rngs, (n, h, d), (0, 1), 2, pd, ("heads", "head_dim", "embed")
    )
    if use_bias:
      self.q_bias = _param.param(jnp.zeros((n, h), pd), ("heads", "head_dim"))
      self.k_bias = (
        None
        if attention == "soft"
        else _param.param(jnp.zeros((kv, h), pd), ("kv_heads", "head_dim"))
      )
      self.v_bias = _param.param(
        jnp.zeros((kv, h), pd), ("kv_heads", "head_dim")
      )
      self.out_bias = _param.param(jnp.zeros((d,), pd), ("embed",))
    else:
      self.q_bias = self.k_bias = self.v_bias = self.out_bias = None
    if qk_norm is not None:
      from jaxnorm.nn import norms  # Lazy: the norm family is independent.

      kw = dict(qk_norm_kwargs or {})
      self.q_norm = norms.make_norm(qk_norm, h, rngs=rngs, **kw)
      self.k_norm = (
        None
        if attention == "soft"
        else norms.make_norm(qk_norm, h, rngs=rngs, **kw)
      )
    else:
      self.q_norm = self.k_norm = None
    self.sinks = (
      _param.param(jnp.zeros((n,), pd), ("heads",))
      if attention == "sink"
      else None
    )
    self.gate_kernel = (
      _dense(
        rngs,
        (d, n, 1 if gate_headwise else h),
        0,
        (1, 2),
        pd,
        ("embed", "heads", None if gate_headwise else "head_dim"),
      )
      if attention == "gated"
      else None
    )
    if attention == "affine_scaled":
      self.alpha_kernel = _dense(rngs, (d, n), 0, 1, pd, ("embed", "heads"))
      shape, names = ((n,), ("heads",)) if ema_axes == "per_head" else ((), ())
      self.alpha_ma = _param.param(
        jnp.zeros(shape, jnp.float32), names, AffineScaleEMA
      )
    else:
      self.alpha_kernel = self.alpha_ma = None
    if attention == "lina" and lina_max_len is not None:
      _checks.check_positive_int(who, "lina_max_len", lina_max_len)
      self.key_gate = _param.param(
        jnp.ones((lina_max_len, kv), pd), ("seq", "kv_heads")
      )
      self.value_gate = _param.param(
        jnp.ones((lina_max_len, kv), pd), ("seq", "kv_heads")
      )
    else:
      self.key_gate = self.value_gate = None

  def _project(self, x, kernel, bias, dt):
    y = jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(dt))
    if bias is not None:
      y = y + bias[...].astype(dt).reshape((1, 1) + bias.shape)
    return y

  def __call__(
    self,
    x: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    positions: jax.Array | None = None,
    use_running_average: bool | None = None,
  ) -> jax.Array:
    """Self-attention over ``x (B, T, D)``; returns ``(B, T, D)``.

    Args:
      x: the (pre-normed) hidden states.
      mask: boolean mask broadcastable to ``(B, N, T, T)``.
      bias: additive bias broadcastable to ``(B, N, T, T)``.
      positions: RoPE positions ``(B, T)`` or ``(T,)``; default arange.
      use_running_average: affine-scaled only; overrides the attribute.

    Raises:
      ValueError: if ``x`` does not have ``num_features`` features, or a
        mask/bias is given to a variant without one.
    """
    who = "MultiHeadAttention"
    _checks.check_ndim(who, "x", x, expected=3)
    if x.shape[-1] != self.num_features:
      raise ValueError(
        f"{who}: x must have num_features={self.num_features} "
        f"features on its last axis, got {x.shape=}"
      )
    if self.attention in _NO_MASK and (mask is not None or bias is not None):
      raise ValueError(
        f"{who}: attention={self.attention!r} takes no mask "
        f"or bias; got mask or bias"
      )
    dt = self.dtype or x.dtype
    x = x.astype(dt)
    names = ("batch", "seq", "heads", "head_dim")
    q = sharding.constrain(
      self._project(x, self.q_kernel, self.q_bias, dt), names
    )
    k = (
      None
      if self.k_kernel is None
      else sharding.constrain(
        self._project(x, self.k_kernel, self.k_bias, dt),
        ("batch", "seq", "kv_heads", "head_dim"),
      )
    )
    v = self._project(x, self.v_kernel, self.v_bias, dt)
    if self.q_norm is not None:
      q = self.q_norm(q).astype(dt)
      if k is not None:
        k = self.k_norm(k).astype(dt)
    if self.use_rope:
      q = attn.rope(q, positions, base=self.rope_base)
      if k is not None:
        k = attn.rope(k, positions, base=self.rope_base)
    kw = dict(self.attention_kwargs)
    masked = dict(bias=bias, mask=mask, is_causal=self.is_causal)
    name = self.attention
    if name == "softmax":
      y = attn.dot_product_attention(q, k, v, **masked, **kw)
    elif name == "off_by_one":
      y = attn.sink_attention(q, k, v, **masked, **kw)
    elif name == "sink":
      y = attn.sink_attention(q, k, v, **masked, sinks=self.sinks[...], **kw)
    elif name == "gated":
      y = attn.dot_product_attention(q, k, v, **masked, **kw)
      gl = jnp.einsum("btd,dnh->btnh", x, self.gate_kernel[...].astype(dt))
      y = attn.gated_attention_output(y, gl)
    elif name == "affine_scaled":
      ura = (
        self.use_running_average
        if use_running_average is None
        else use_running_average
      )
      logits = jnp.einsum("btd,dn->btn", x, self.alpha_kernel[...].astype(dt))
      alpha = attn.linear_clipping(logits.astype(jnp.float32))
      y, new_ma = attn.affine_scaled_attention(
        q,
        k,
        v,
        **masked,
        alpha=alpha,
        alpha_ma=self.alpha_ma[...],
        training=not ura,
        **kw,
      )
      if not ura:
        self.alpha_ma[...] = new_ma
    elif name == "soft":
      lm = attn.soft_landmarks(q, self.soft_ratio)
      y = attn.soft_attention(q, v, lm, **kw)
    elif name == "nala":
      y = attn.nala_attention(q, k, v, **kw)
    elif name == "lina":
      t = x.shape[1]
      gates = {}
      if self.key_gate is not None:
        if t > self.key_gate.shape[0]:
          raise ValueError(
            f"{who}: sequence length {t} exceeds lina_max_len="
            f"{self.key_gate.shape[0]}"
          )
        gates = dict(
          key_gate=self.key_gate[...][:t], value_gate=self.value_gate[...][:t]
        )
      y = attn.lina_attention(q, k, v, **gates, **kw)
    elif name == "causal_linear":
      y = attn.causal_linear_attention(q, k, v, **kw)
    elif name == "mxfp4":
      y = attn.mxfp4_attention(q, k, v, **masked, **kw)
    else:  # sinkhorn
      y = attn.sinkhorn_attention(q, k, v, **masked, **kw)
    out = jnp.einsum(
      "btnh,nhd->btd", y.astype(dt), self.out_kernel[...].astype(dt)
    )
    if self.out_bias is not None:
      out = out + self.out_bias[...].astype(dt).reshape(1, 1, -1)
    return out


def make_attention(
  name: str, num_features: int, num_heads: int, *, rngs: nnx.Rngs, **kwargs: Any
) -> MultiHeadAttention:
  """Builds a `MultiHeadAttention` whose variant is ``name``.

  Args:
    name: one of `ATTENTION_NAMES`.
    num_features: model width ``D``.
    num_heads: query heads ``N``.
    rngs: parameter RNG streams.
    **kwargs: other `MultiHeadAttention` arguments.

  Returns:
    The module.

  Raises:
    ValueError: for an unknown name; the message lists every valid name.
  """
  if name not in ATTENTION_NAMES:
    raise ValueError(
      f"make_attention: unknown attention {name!r}; valid "
      f"names are {', '.join(ATTENTION_NAMES)}"
    )
  return MultiHeadAttention(
    num_features, num_heads, attention=name, rngs=rngs, **kwargs
  )
