"""The SOFT core (the maths is `jaxnorm.attention.soft`).

`SoftAttention` ties keys to queries (``ties_keys``) and has the class
attribute ``needs_grid`` (read into its spec,
`jaxnorm.nn.registry.AttentionSpec`): a model with a token map (the ViT)
builds it with ``grid_shape=(h, w)`` and ``num_prefix`` (its [CLS]) for the
paper's layer; without ``grid_shape`` it runs a documented token form for
1-D sequences.

Examples:
  >>> SoftAttention.ties_keys, SoftAttention.needs_grid
  (True, True)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.nn import _param
from jaxnorm.nn.attention import _base


def _torch_conv_init(
  rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype: Any
) -> jax.Array:
  """Torch's ``Conv2d`` default weight init, ``U(+-1/sqrt(fan_in))``."""
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(rngs.params(), shape, dtype, -bound, bound)


class SoftAttention(_base.AttentionCore):
  r"""SOFT softmax-free attention (`attention.soft_attention`).

  Queries double as keys (``ties_keys``: no key projection). No causal
  form (landmarks pool future tokens), no mask. Needs ``num_kv_heads ==
  num_heads``.

  Map form (``grid_shape`` given: the paper's layer, official
  ``SoftmaxFreeAttentionKernel``): `attention.soft_grid_attention`, with
  learned landmarks (`attention.soft_conv_landmarks`: a ``ratio x ratio``
  conv of stride ``ratio`` shared by the heads, LayerNorm, GELU) and the
  depthwise-conv branch on ``v`` (`attention.soft_local_conv`, ``conv_size``
  k, official 9/5/3 by stage; 0 turns it off). Parameters, with torch's
  ``Conv2d`` default init ``U(+-1/sqrt(fan_in))`` as the official model
  (its init touches only Linear and LayerNorm): ``landmark_kernel (r, r,
  H, H)`` (fan-in ``H r^2``), ``landmark_scale`` (1) and ``landmark_bias``
  (0) ``(H,)``, ``local_kernel (k, k, N)`` (fan-in ``k^2``).

  Token form (no ``grid_shape``; for 1-D sequences): parameter-free
  landmarks `attention.soft_landmarks`, means of ``ratio`` consecutive
  scaled queries (the length must be a multiple of ``ratio``), and no
  local branch. No parameters.

  Examples:
    >>> from jaxnorm.nn.attention import HeadDims
    >>> core = SoftAttention(HeadDims(8, 2, 2, 4), grid_shape=(2, 2),
    ...                      rngs=nnx.Rngs(0))  # map form, ratio 2
    >>> core.landmark_kernel.shape, core.local_kernel.shape
    ((2, 2, 4, 4), (3, 3, 2))
    >>> q = jnp.ones((1, 4, 2, 4), jnp.float32)  # the 2 x 2 map's tokens
    >>> core(None, q, None, q).shape  # x unused, k None (tied to q)
    (1, 4, 2, 4)

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
    _base.refuse_causal(who, is_causal, _base.CAUSAL_ALTERNATIVES)
    _checks.check_positive_int(who, "ratio", ratio)
    _base.require_full_heads(who, dims, "SOFT ties keys to queries")
    self.ratio, self.grid_shape, self.num_prefix = ratio, grid_shape, num_prefix
    self.options = _base.check_options(
      who, attn.soft_attention, options, owned=("landmarks",)
    )
    if grid_shape is None:
      self.landmark_kernel = self.landmark_scale = None
      self.landmark_bias = self.local_kernel = None
      return
    attn.grid_tokens(grid_shape, num_prefix, who=who)
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
      _base.check_odd(who, "conv_size", conv_size)
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
    return attn.soft_grid_attention(
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
