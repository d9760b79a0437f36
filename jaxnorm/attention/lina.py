"""LINA linear attention (division / subtraction normalization)."""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.attention import _core

_KERNELS = {
  "relu": jax.nn.relu,
  "identity": lambda x: x,
  "leaky_relu": jax.nn.leaky_relu,
  "exp": jnp.exp,
}


def _gate(who: str, name: str, g, d: _core.Dims, dtype) -> jax.Array | None:
  if g is None:
    return None
  g = jnp.asarray(g)
  _checks.check_floating(who, name, g)
  if g.shape == (d.kv_len, d.kv_heads):
    g = g[None]
  if g.shape not in (
    (d.batch, d.kv_len, d.kv_heads),
    (1, d.kv_len, d.kv_heads),
  ):
    raise ValueError(
      f"{who}: {name} must have shape (kv_len, kv_heads)=({d.kv_len}, "
      f"{d.kv_heads}) (static) or (batch, kv_len, kv_heads)=({d.batch}, "
      f"{d.kv_len}, {d.kv_heads}) (dynamic), got {name}.shape={g.shape}"
    )
  return g.astype(dtype)[..., None]


def _shifted_relu(x: jax.Array, *, shift: float) -> jax.Array:
  return jax.nn.relu(x) + shift


@_scope.scoped
def lina_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  *,
  normalization: Literal["division", "subtraction"] = "division",
  kernel: Literal["relu", "identity", "leaky_relu", "exp"] = "relu",
  key_gate: Float[Array, "S K"] | None = None,
  value_gate: Float[Array, "S K"] | None = None,
  scale: float | None = None,
  eps: float = 1e-6,
  relu_eps: float | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""LINA linear attention (non-causal), division or subtraction normalized.

  With :math:`\phi` = ``kernel`` (default ReLU; plus ``relu_eps``, see below)
  and gated keys/values :math:`\kappa_j = g^k_j \phi(k_j)`,
  :math:`\nu_j = g^v_j v_j`:

  * division (LINA's default):
    :math:`\mathrm{out}_i = \phi(q_i)^T (\frac1S\sum_j \kappa_j \nu_j^T) /
    (\phi(q_i)\cdot\bar\kappa + \epsilon)`;
  * subtraction (the InLine-style ablation, :math:`s` = ``scale``, default
    ``H**-0.5``): :math:`\mathrm{out}_i = \frac{s}{S}\phi(q_i)^T \sum_j
    \kappa_j \nu_j^T + (1 - s\,\phi(q_i)\cdot\bar\kappa)\,\bar\nu`; its
    implied weights sum to exactly 1 per row and may be negative.

  The KV gate (``key_gate``/``value_gate``) is LINA's data-independent
  per-token, per-head scalar (shape ``(S, K)``, init 1 in the module) or a
  dynamic ``(B, S, K)`` gate. A constant key gate cancels in the division
  form. LINA's depthwise conv on the block input is `lina_depthwise_conv`.
  Computed in float32 (the paper notes fp32 is needed to avoid NaN loss).

  ``relu_eps`` is added to the ReLU features (``kernel="relu"`` only). None
  takes each form's official value: :math:`10^{-6}` in the division form
  (``vision_transformer_linear_decouple1_kvscale1.py``, which keeps the
  denominator positive) and 0, a plain ReLU, in the subtraction form
  (``vision_transformer_linear9.py``). ``relu_eps=1e-6`` with
  ``normalization="subtraction"`` is jaxnorm's earlier behaviour.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    normalization: ``"division"`` or ``"subtraction"``.
    kernel: feature map ``"relu"``, ``"identity"``, ``"leaky_relu"`` or
      ``"exp"``.
    key_gate: optional key gate ``(S, K)`` or ``(B, S, K)``.
    value_gate: optional value gate, same shapes.
    scale: subtraction-form scale ``s``.
    eps: division-form denominator epsilon.
    relu_eps: added to ReLU features; None is 1e-6 (division) or 0
      (subtraction).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or unknown options.
    TypeError: on non-floating inputs.

  Examples:
    >>> q = jnp.array([[1.0, 2.0], [3.0, 1.0]]).reshape(1, 2, 1, 2)
    >>> k = jnp.ones((1, 2, 1, 2))  # equal keys: every query reads mean(v)
    >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
    >>> print(np.asarray(attention.lina_attention(q, k, v)[0, :, 0]).round(4))
    [[2. 1.]
     [2. 1.]]

  References:
    Wang et al., *LINA: Linear Autoregressive Image Generative Models with
    Continuous Tokens*, arXiv:2601.22630 (2026); Han et al., *Bridging the
    Divide: Reconsidering Softmax and Linear Attention* (InLine),
    arXiv:2412.06590 (2024).
  """
  who = "lina_attention"
  _checks.check_choice(
    who, "normalization", normalization, ("division", "subtraction")
  )
  _checks.check_choice(who, "kernel", kernel, tuple(_KERNELS))
  d, q, k, v, _, _ = _core.prepare(who, query, key, value, None, None)
  dtype = _numerics.compute_dtype(q, k, v)
  gk = _gate(who, "key_gate", key_gate, d, dtype)
  gv = _gate(who, "value_gate", value_gate, d, dtype)
  phi = _KERNELS[kernel]
  if kernel == "relu":
    shift = relu_eps
    if shift is None:
      shift = 1e-6 if normalization == "division" else 0.0
    phi = functools.partial(_shifted_relu, shift=shift)
  fq = phi(q.astype(dtype))
  fk = phi(k.astype(dtype))
  vv = v.astype(dtype)
  if gk is not None:
    fk = fk * gk
  if gv is not None:
    vv = vv * gv
  fk, vv = _core.repeat_kv(d, fk), _core.repeat_kv(d, vv)
  kv = jnp.einsum("bsnf,bsne->bnfe", fk, vv) / d.kv_len
  kmean = jnp.mean(fk, axis=1)  # B N F
  num = jnp.einsum("btnf,bnfe->btne", fq, kv)
  qk = jnp.einsum("btnf,bnf->btn", fq, kmean)[..., None]
  if normalization == "division":
    out = num / (qk + eps)
  else:
    s = d.head_dim**-0.5 if scale is None else scale
    out = s * num + (1.0 - s * qk) * jnp.mean(vv, axis=1)[:, None]
  return _core.finish(d, out, query.dtype)


@_scope.scoped
def lina_depthwise_conv(
  x: Float[Array, "B L C"],
  kernel: Float[Array, "k k C"],
  bias: Float[Array, " C"] | None = None,
  *,
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
) -> Float[Array, "B L C"]:
  """LINA's local branch: a depthwise ``k x k`` conv over the image tokens.

  Tokens ``x[:, num_prefix:]`` are reshaped to ``grid_shape`` (row-major),
  convolved per channel with zero ``SAME`` padding, and flattened back; the
  ``num_prefix`` conditioning tokens get 0. LINA adds this (computed on the
  block input, 5x5) to the attention output before the out-projection.

  Raises:
    ValueError: if the token count does not match ``grid_shape`` or the
      kernel/bias shapes do not match the channels.

  Examples:
    >>> x = jnp.array([9.0, 1.0, 2.0, 3.0, 4.0]).reshape(1, 5, 1)  # 1 + 2 x 2
    >>> y = attention.lina_depthwise_conv(
    ...     x, jnp.full((1, 1, 1), 2.0), grid_shape=(2, 2), num_prefix=1)
    >>> print(np.asarray(y[0, :, 0]))  # the prefix token gets 0
    [0. 2. 4. 6. 8.]
  """
  who = "lina_depthwise_conv"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, expected=3)
  b, length, c = x.shape
  gh, gw = grid_shape
  if length - num_prefix != gh * gw:
    raise ValueError(
      f"{who}: x must have num_prefix + prod(grid_shape)="
      f"{num_prefix + gh * gw} tokens, got {x.shape=}"
    )
  if (
    kernel.ndim != 3
    or kernel.shape[0] != kernel.shape[1]
    or (kernel.shape[2] != c)
  ):
    raise ValueError(
      f"{who}: kernel must have shape (k, k, {c}), got {kernel.shape=}"
    )
  dtype = _numerics.compute_dtype(x)
  img = x[:, num_prefix:].astype(dtype).reshape(b, gh, gw, c)
  rhs = kernel.astype(dtype).reshape(kernel.shape[0], kernel.shape[1], 1, c)
  y = jax.lax.conv_general_dilated(
    img,
    rhs,
    (1, 1),
    "SAME",
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
    feature_group_count=c,
  )
  if bias is not None:
    _checks.check_shape(who, "bias", bias, (c,), "one per channel")
    y = y + bias.astype(dtype).reshape(1, 1, 1, c)
  y = y.reshape(b, gh * gw, c)
  pad = jnp.zeros((b, num_prefix, c), dtype)
  return jnp.concatenate([pad, y], axis=1).astype(x.dtype)
