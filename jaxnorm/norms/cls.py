"""[CLS]-specialized normalization and linear layers for ViTs."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.norms import layer

RegistersWith = Literal["patch", "cls"]


@_scope.scoped
def cls_token_type(
  seq_len: int,
  *,
  num_cls_tokens: int = 1,
  num_registers: int = 0,
  registers_with: RegistersWith = "patch",
) -> jax.Array:
  """Token types of a ``[CLS], registers, patches`` sequence (1 = [CLS]).

  Args:
    seq_len: sequence length.
    num_cls_tokens: leading [CLS] tokens.
    num_registers: register tokens right after them (DINOv2 layout).
    registers_with: whose parameters registers use; ``"patch"`` by default
      (unverified: the two re-implementations disagree, the paper most
      likely separates only [CLS]).

  Returns:
    int32 ``(seq_len,)``.

  Raises:
    ValueError: if the special tokens do not fit or for a bad choice.

  Examples:
    >>> print(norms.cls_token_type(5, num_registers=2))
    [1 0 0 0 0]
    >>> print(norms.cls_token_type(5, num_registers=2, registers_with="cls"))
    [1 1 1 0 0]
  """
  who = "cls_token_type"
  _checks.check_choice(who, "registers_with", registers_with, ("patch", "cls"))
  _checks.check_positive_int(who, "seq_len", seq_len)
  if (
    num_cls_tokens < 0
    or num_registers < 0
    or (num_cls_tokens + num_registers > seq_len)
  ):
    raise ValueError(
      f"{who}: need 0 <= num_cls_tokens + num_registers <= "
      f"seq_len, got {num_cls_tokens=}, {num_registers=}, "
      f"{seq_len=}"
    )
  special = num_cls_tokens + (num_registers if registers_with == "cls" else 0)
  return (jnp.arange(seq_len) < special).astype(jnp.int32)


def _token_select(who: str, token_type: ArrayLike, x: jax.Array) -> jax.Array:
  """Returns ``token_type`` as a rank-``x.ndim`` boolean, True at [CLS]."""
  shape = tuple(jnp.shape(token_type))
  lead = x.shape[:-1]
  if len(shape) > len(lead) or lead[len(lead) - len(shape) :] != shape:
    raise ValueError(
      f"{who}: token_type must have shape x.shape[:-1]="
      f"{lead} or a suffix of it, got "
      f"token_type.shape={shape}"
    )
  t = jnp.asarray(token_type) != 0
  return t.reshape((1,) * (len(lead) - len(shape)) + shape + (1,))


@_scope.scoped
def specialized_layer_norm(
  x: Float[ArrayLike, "... d"],
  token_type: ArrayLike,
  scale_cls: Float[ArrayLike, " d"],
  bias_cls: Float[ArrayLike, " d"] | None,
  scale_patch: Float[ArrayLike, " d"],
  bias_patch: Float[ArrayLike, " d"] | None,
  *,
  eps: float = 1e-6,
  kind: Literal["layer", "rms"] = "layer",
) -> Float[Array, "... d"]:
  r"""LayerNorm (or RMSNorm) with separate affines for [CLS] and patches.

  The statistics are per token, so they are unchanged; only the affine is
  chosen per token: :math:`y = \gamma_{t} \odot \hat x + \beta_{t}` with
  ``t = token_type`` (1 = [CLS], 0 = patch), selected with a mask (no
  gather), so it is `jit`-friendly and :math:`\partial L/\partial
  \gamma_{cls}` only receives gradient from [CLS] positions. With equal
  parameters this is the shared norm.

  Causal-safe on ``(batch, seq, d)`` with the features last: each token
  is normalized on its own.

  Args:
    x: input ``(..., d)``, e.g. ``(batch, seq, d)``.
    token_type: integer or boolean array of shape ``x.shape[:-1]`` or a
      suffix of it (e.g. ``(seq,)`` from `cls_token_type`).
    scale_cls: [CLS] gain ``(d,)``.
    bias_cls: [CLS] offset ``(d,)`` or ``None`` (for ``kind="rms"``).
    scale_patch: patch gain ``(d,)``.
    bias_patch: patch offset ``(d,)`` or ``None``.
    eps: added to the variance (mean square for RMS).
    kind: ``"layer"`` or ``"rms"`` (only the scale is specialized).

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for bad shapes, a bad ``kind`` or biases given with only
      one token type.

  Examples:
    >>> x = jnp.array([[1.0, 3.0], [1.0, 3.0]])  # [CLS], patch
    >>> tt = norms.cls_token_type(2)
    >>> y = norms.specialized_layer_norm(
    ...     x, tt, jnp.full(2, 2.0), None, jnp.ones(2), None, kind="rms")
    >>> print(np.asarray(y).round(4))
    [[0.8944 2.6833]
     [0.4472 1.3416]]

  References:
    Marouani, Siméoni, Jégou, Bojanowski & Vo, *Revisiting [CLS] and Patch
    Token Interaction in Vision Transformers*, arXiv:2602.08626 (ICLR 2026).
  """
  who = "specialized_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_choice(who, "kind", kind, ("layer", "rms"))
  x = jnp.asarray(x)
  _numerics.check_channels(
    who,
    x,
    scale_cls=scale_cls,
    bias_cls=bias_cls,
    scale_patch=scale_patch,
    bias_patch=bias_patch,
  )
  if (bias_cls is None) != (bias_patch is None):
    raise ValueError(f"{who}: give both bias_cls and bias_patch or neither")
  is_cls = _token_select(who, token_type, x)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  xhat = (
    layer.layer_norm(xf, eps=eps)
    if kind == "layer"
    else layer.rms_norm(xf, eps=eps)
  )
  nd = x.ndim
  y = xhat * jnp.where(
    is_cls,
    _numerics.channel(scale_cls, nd, cdt),
    _numerics.channel(scale_patch, nd, cdt),
  )
  if bias_cls is not None:
    y = y + jnp.where(
      is_cls,
      _numerics.channel(bias_cls, nd, cdt),
      _numerics.channel(bias_patch, nd, cdt),
    )
  return y.astype(x.dtype)


@_scope.scoped
def specialized_linear(
  x: Float[ArrayLike, "... d_in"],
  token_type: ArrayLike,
  kernel_cls: Float[ArrayLike, "d_in d_out"],
  kernel_patch: Float[ArrayLike, "d_in d_out"],
  bias_cls: Float[ArrayLike, " d_out"] | None = None,
  bias_patch: Float[ArrayLike, " d_out"] | None = None,
) -> Float[Array, "... d_out"]:
  """A linear layer with separate weights for [CLS] and patch tokens.

  QKV specialization of the early blocks: both weight sets are applied and
  the result is selected per token (1 = [CLS]), so the tokens still
  interact in attention. Bias pairs follow the kernels.

  Args:
    x: input ``(..., d_in)``.
    token_type: as in `specialized_layer_norm`.
    kernel_cls: ``(d_in, d_out)``.
    kernel_patch: ``(d_in, d_out)``.
    bias_cls: ``(d_out,)`` or ``None``.
    bias_patch: ``(d_out,)`` or ``None``.

  Returns:
    ``(..., d_out)`` in ``x``'s dtype.

  Raises:
    TypeError: for non-floating arrays.
    ValueError: for mismatched shapes or a single bias.

  Examples:
    >>> x = jnp.ones((3, 2))  # [CLS] and two patches
    >>> y = norms.specialized_linear(
    ...     x, norms.cls_token_type(3), jnp.eye(2), 2.0 * jnp.eye(2))
    >>> print(np.asarray(y))
    [[1. 1.]
     [2. 2.]
     [2. 2.]]

  References:
    Marouani, Siméoni, Jégou, Bojanowski & Vo, *Revisiting [CLS] and Patch
    Token Interaction in Vision Transformers*, arXiv:2602.08626 (ICLR 2026).
  """
  who = "specialized_linear"
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  _checks.check_ndim(who, "x", x, minimum=1)
  for name, k in (("kernel_cls", kernel_cls), ("kernel_patch", kernel_patch)):
    _checks.check_floating(who, name, k)
    _checks.check_ndim(who, name, k, expected=2)
  d_out = jnp.shape(kernel_cls)[1]
  for name, k in (("kernel_cls", kernel_cls), ("kernel_patch", kernel_patch)):
    _checks.check_shape(
      who, name, k, (x.shape[-1], d_out), "(x.shape[-1], kernel_cls.shape[1])"
    )
  if (bias_cls is None) != (bias_patch is None):
    raise ValueError(f"{who}: give both bias_cls and bias_patch or neither")
  is_cls = _token_select(who, token_type, x)
  cdt = _numerics.compute_dtype(x)
  xf = x.astype(cdt)
  y_cls = xf @ jnp.asarray(kernel_cls).astype(cdt)
  y_patch = xf @ jnp.asarray(kernel_patch).astype(cdt)
  if bias_cls is not None:
    for name, b in (("bias_cls", bias_cls), ("bias_patch", bias_patch)):
      _checks.check_floating(who, name, b)
      _checks.check_shape(who, name, b, (d_out,))
    y_cls = y_cls + _numerics.channel(bias_cls, x.ndim, cdt)
    y_patch = y_patch + _numerics.channel(bias_patch, x.ndim, cdt)
  return jnp.where(is_cls, y_cls, y_patch).astype(x.dtype)
