"""The NaLaFormer core (the maths is `jaxnorm.attention.nala`).

`NaLaAttention` has the class attribute ``needs_grid`` (read into its spec,
`jaxnorm.nn.registry.AttentionSpec`): a model with a token map (the ViT)
builds it with ``grid_shape=(h, w)`` and ``num_prefix`` (its [CLS]) for the
paper's layer; without ``grid_shape`` it runs a documented token form for
1-D sequences.

Examples:
  >>> NaLaAttention.needs_grid, NaLaAttention.ties_keys
  (True, False)
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base


class NaLaAttention(_base.AttentionCore):
  r"""NaLaFormer norm-aware linear attention.

  No causal form (the key summary runs over every key) and no mask.

  Map form (``grid_shape`` given: the paper's layer, official
  ``NormAwareLinearAttn``): `attention.nala_grid_attention`, i.e.
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

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = NaLaAttention(HeadDims(8, 2, 2, 4), grid_shape=(2, 2),
    ...                      rngs=nnx.Rngs(0))  # map form
    >>> core.gate_kernel.shape, core.lepe_kernel.shape  # (D, N, H), (k, k, NH)
    ((8, 2, 4), (5, 5, 8))
    >>> q = jnp.ones((1, 4, 2, 4), jnp.float32)  # the 2 x 2 map's tokens
    >>> core(jnp.ones((1, 4, 8), jnp.float32), q, q, q).shape
    (1, 4, 2, 4)

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
    _base.refuse_causal(who, is_causal, _base.CAUSAL_ALTERNATIVES)
    self.options = _base.check_options(
      who, attn.nala_attention, options, owned=("rope_sin_cos",)
    )
    self.grid_shape, self.num_prefix = grid_shape, num_prefix
    if grid_shape is None:
      self.gate_kernel = self.gate_bias = self.lepe_kernel = None
      self.lepe_bias = self.norm_scale = self.norm_bias = None
      return
    attn.grid_tokens(grid_shape, num_prefix, who=who)
    _base.require_full_heads(who, dims, "the LePE conv and gate act on N * H")
    _checks.check_divisible(who, "head_dim", dims.head_dim, "4 (2-D RoPE)", 4)
    _base.check_odd(who, "lepe_size", lepe_size)
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
    return attn.nala_grid_attention(
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
