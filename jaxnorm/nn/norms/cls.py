"""[CLS]-specialized norm module; maths in `jaxnorm.norms.cls`."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, norms
from jaxnorm.nn._norm_keys import draw_keys
from jaxnorm.nn._param import paper_affine
from jaxnorm.nn.norms._common import (
  Initializer,
  Names,
  cast,
  maybe,
  optional,
  param,
  promote,
)
from jaxnorm.nn.norms.layer import LayerNorm, RMSNorm
from jaxnorm.nn.norms.scale_vectors import NORM_ROLES, NormRole


class CLSNorm(nnx.Module):
  """[CLS]-specialized LayerNorm/RMSNorm (`norms.specialized_layer_norm`).

  Parameters ``scale_cls``, ``scale_patch`` (1) and, for
  ``kind="layer"``, ``bias_cls``, ``bias_patch`` (0). Token types come
  from the call's ``token_type`` or, by default, from the layout
  ``[CLS] * num_cls_tokens, registers, patches`` along axis -2
  (`jaxnorm.norms.cls_token_type`). `from_shared` clones a trained shared
  norm, so the specialized model starts equal to it. ``scale_init`` and
  ``bias_init`` initialize both copies (from one key each, so they start
  equal); ``use_bias`` defaults to the kind's (a bias for ``"layer"``, none
  for ``"rms"``, where ``use_bias=True`` is refused). The specialized
  scales are the method: ``use_scale=False`` is refused.

  Examples:
    >>> norm = CLSNorm(2, kind="rms", rngs=nnx.Rngs(0))  # token 0 is [CLS]
    >>> norm.scale_cls[...] = jnp.array([2.0, 2.0])
    >>> y = norm(jnp.array([[3.0, 4.0], [3.0, 4.0]]))  # (seq, d)
    >>> [[round(v, 4) for v in row] for row in y.tolist()]
    [[1.6971, 2.2627], [0.8485, 1.1314]]
  """

  @paper_affine(
    needs_scale="the per-type scales scale_cls and scale_patch are the "
    "[CLS] specialization",
  )
  def __init__(
    self,
    num_features: int,
    *,
    kind: Literal["layer", "rms"] = "layer",
    eps: float = 1e-6,
    num_cls_tokens: int = 1,
    num_registers: int = 0,
    registers_with: norms.RegistersWith = "patch",
    role: NormRole = "input",
    use_bias: bool | None = None,
    scale_init: Initializer = nnx.initializers.ones,
    bias_init: Initializer = nnx.initializers.zeros,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "CLSNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "kind", kind, ("layer", "rms"))
    _checks.check_choice(
      who, "registers_with", registers_with, ("patch", "cls")
    )
    _checks.check_choice(who, "role", role, NORM_ROLES)
    if kind == "rms" and use_bias:
      raise ValueError(
        f"{who}: use_bias=True is not available with kind='rms': the RMS "
        "form re-scales only (no bias); give kind='layer' for a bias"
      )
    scale_key, bias_key = draw_keys(rngs)
    self.num_features, self.kind, self.eps = num_features, kind, eps
    self.num_cls_tokens, self.num_registers = num_cls_tokens, num_registers
    self.registers_with, self.role, self.dtype = registers_with, role, dtype
    use_bias = kind == "layer" if use_bias is None else use_bias
    # A fresh array per parameter (a train step donates every buffer).
    shape = (num_features,)
    self.scale_cls = param(
      scale_init(scale_key, shape, param_dtype), axis_names
    )
    self.scale_patch = param(
      scale_init(scale_key, shape, param_dtype), axis_names
    )
    self.bias_cls = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )
    self.bias_patch = optional(
      use_bias, bias_init, bias_key, num_features, param_dtype, axis_names
    )

  @classmethod
  def from_shared(cls, norm: LayerNorm | RMSNorm, **kwargs: Any) -> CLSNorm:
    """Both copies cloned from a shared `LayerNorm` or `RMSNorm`."""
    if not isinstance(norm, (LayerNorm, RMSNorm)):
      raise TypeError(
        "CLSNorm.from_shared: norm must be a LayerNorm or "
        f"RMSNorm, got {type(norm).__name__}"
      )
    kind = "layer" if isinstance(norm, LayerNorm) else "rms"
    if norm.scale is None or norm.scale_offset:
      raise ValueError(
        "CLSNorm.from_shared: the shared norm must have a "
        "scale and scale_offset=0"
      )
    if kind == "layer" and norm.bias is None:
      raise ValueError(
        "CLSNorm.from_shared: the shared LayerNorm must have a bias"
      )
    if kind == "rms" and norm.eps_mode != "inside":
      raise ValueError(
        "CLSNorm.from_shared: the shared RMSNorm must use eps_mode='inside'"
      )
    module = cls(
      norm.num_features,
      kind=kind,
      eps=norm.eps,
      dtype=norm.dtype,
      param_dtype=norm.scale[...].dtype,
      rngs=nnx.Rngs(0),
      **kwargs,
    )
    module.scale_cls[...] = norm.scale[...]
    module.scale_patch[...] = norm.scale[...]
    if kind == "layer":
      module.bias_cls[...] = norm.bias[...]
      module.bias_patch[...] = norm.bias[...]
    return module

  def __call__(
    self, x: jax.Array, token_type: jax.Array | None = None
  ) -> jax.Array:
    """Normalizes ``(..., seq, d)`` tokens with per-type affines."""
    _checks.check_ndim("CLSNorm", "x", x, minimum=2)
    x = promote(x, self)
    if token_type is None:
      token_type = norms.cls_token_type(
        x.shape[-2],
        num_cls_tokens=self.num_cls_tokens,
        num_registers=self.num_registers,
        registers_with=self.registers_with,
      )
    y = norms.specialized_layer_norm(
      x,
      token_type,
      self.scale_cls[...],
      maybe(self.bias_cls),
      self.scale_patch[...],
      maybe(self.bias_patch),
      eps=self.eps,
      kind=self.kind,
    )
    return cast(y, self)
