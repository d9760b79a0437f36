"""The polarized self-attention module (maths: `jaxnorm.attention.psa`).

It holds the 1x1 conv / norm weights of one PSA form and calls its pure
function on NHWC maps. Parameters carry the logical axis name ``channels``.

Examples:
  >>> PSA_VARIANTS
  ('parallel', 'sequential', 'paper_parallel', 'paper_sequential')
"""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm import attention as attn
from jaxnorm.nn import _param

PSAVariant = Literal[
  "parallel", "sequential", "paper_parallel", "paper_sequential"
]
PSA_VARIANTS: tuple[str, ...] = (
  "parallel",
  "sequential",
  "paper_parallel",
  "paper_sequential",
)


def _torch_conv_default(
  key: jax.Array, shape: tuple[int, ...], fan_in: int, dtype: Any
) -> jax.Array:
  """Torch's ``Conv2d`` default init: ``U(+-1/sqrt(fan_in))``."""
  bound = 1.0 / math.sqrt(fan_in)
  return jax.random.uniform(key, shape, dtype, -bound, bound)


class PolarizedSelfAttention(nnx.Module):
  """Polarized self-attention on ``(B, H, W, C)`` maps.

  ``variant`` picks the layer:

  * ``"parallel"`` (default): the official ``PSA_p``, `attention.psa_parallel`;
  * ``"sequential"``: the official ``PSA_s``, `attention.psa_sequential`;
  * ``"paper_parallel"`` / ``"paper_sequential"``: `attention.psa_paper_form`
    (the unverified third-party reading, with the channel-branch LayerNorm).

  Sizes follow the official code: ``C' = C // 2``, and for ``PSA_s`` the
  bottleneck ``C_b = C' // 4``. Parameters (names of the pure functions):
  ``channel_query (C, 1)``, ``channel_value``, ``spatial_query``,
  ``spatial_value`` ``(C, C')``, plus ``channel_up (C', C)`` (parallel);
  ``channel_down (C', C_b)``, ``channel_down_bias``, ``channel_norm_scale``,
  ``channel_norm_bias`` ``(C_b,)``, ``channel_up (C_b, C)``,
  ``channel_up_bias (C,)`` (sequential); ``channel_up (C', C)``,
  ``norm_scale``, ``norm_bias`` ``(C,)`` (paper form).

  Init, as the official ``reset_parameters``: the four bias-free q/v convs
  are Kaiming-normal with fan-in and the ReLU gain (torch
  ``kaiming_normal_(mode="fan_in")``: an untruncated normal of standard
  deviation ``sqrt(2 / C)``); the ``conv_up`` convs keep torch's ``Conv2d``
  default, weights and biases ``U(+-1/sqrt(fan_in))`` with ``fan_in`` their
  input channels; LayerNorms start at scale 1, bias 0. The paper form's
  ``channel_up`` uses the same torch default (it has no official code).

  Examples:
    >>> psa = PolarizedSelfAttention(8, rngs=nnx.Rngs(0))  # PSA_p, C' = 4
    >>> psa.channel_query.shape, psa.channel_value.shape, psa.channel_up.shape
    ((8, 1), (8, 4), (4, 8))
    >>> psa(jnp.ones((2, 4, 4, 8), jnp.float32)).shape  # (B, H, W, C)
    (2, 4, 4, 8)
  """

  def __init__(
    self,
    channels: int,
    *,
    variant: PSAVariant = "parallel",
    eps: float = 1e-5,
    dtype=None,
    param_dtype=jnp.float32,
    rngs: nnx.Rngs,
  ):
    """Builds the 1x1 conv weights of ``variant``.

    Args:
      channels: ``C``.
      variant: one of `PSA_VARIANTS`.
      eps: the LayerNorm epsilon (sequential and paper forms).
      dtype: compute dtype (default: the input's).
      param_dtype: parameter dtype.
      rngs: parameter RNG streams.

    Raises:
      ValueError: on an unknown variant, or channels too few for ``C' =
        C // 2`` (and ``C_b = C' // 4`` in ``PSA_s``) to be positive.
    """
    who = "PolarizedSelfAttention"
    _checks.check_positive_int(who, "channels", channels)
    _checks.check_choice(who, "variant", variant, PSA_VARIANTS)
    low = 8 if variant == "sequential" else 2
    if channels < low:
      raise ValueError(
        f"{who}: variant {variant!r} needs channels >= {low} (C' = C // 2"
        f"{' and C_b = C // 8' if low == 8 else ''} must be positive), got "
        f"{channels=}"
      )
    self.variant, self.eps, self.dtype = variant, eps, dtype
    c, cp = channels, channels // 2
    he = jax.nn.initializers.variance_scaling(2.0, "fan_in", "normal")

    def kaiming(shape):
      return _param.param(
        he(rngs.params(), shape, param_dtype), ("channels", None)
      )

    def torch_default(shape, fan_in, names):
      w = _torch_conv_default(rngs.params(), shape, fan_in, param_dtype)
      return _param.param(w, names)

    def const(value, n, names):
      return _param.param(jnp.full((n,), value, param_dtype), names)

    self.channel_query = kaiming((c, 1))
    self.channel_value = kaiming((c, cp))
    self.spatial_query = kaiming((c, cp))
    self.spatial_value = kaiming((c, cp))
    if variant == "sequential":
      cb = cp // 4
      self.channel_down = torch_default((cp, cb), cp, (None, None))
      self.channel_down_bias = torch_default((cb,), cp, (None,))
      self.channel_norm_scale = const(1.0, cb, (None,))
      self.channel_norm_bias = const(0.0, cb, (None,))
      self.channel_up = torch_default((cb, c), cb, (None, "channels"))
      self.channel_up_bias = torch_default((c,), cb, ("channels",))
    else:
      self.channel_up = torch_default((cp, c), cp, (None, "channels"))
    if variant.startswith("paper"):
      self.norm_scale = const(1.0, c, ("channels",))
      self.norm_bias = const(0.0, c, ("channels",))

  def weights(self) -> dict[str, jax.Array]:
    """The keyword weights of this variant's pure function."""
    names = ["channel_query", "channel_value", "spatial_query"]
    names += ["spatial_value", "channel_up"]
    if self.variant == "sequential":
      names += ["channel_down", "channel_down_bias", "channel_up_bias"]
      names += ["channel_norm_scale", "channel_norm_bias"]
    elif self.variant != "parallel":
      names += ["norm_scale", "norm_bias"]
    return {n: getattr(self, n)[...] for n in names}

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies PSA to ``(B, H, W, C)``."""
    x = x.astype(self.dtype or x.dtype)
    w = self.weights()
    if self.variant == "parallel":
      return attn.psa_parallel(x, **w)
    if self.variant == "sequential":
      return attn.psa_sequential(x, eps=self.eps, **w)
    layout = self.variant.removeprefix("paper_")
    return attn.psa_paper_form(x, layout=layout, eps=self.eps, **w)
