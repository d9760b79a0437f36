"""Complex-native multi-head attention: the complex LM's mixing layer.

`ComplexMultiHeadAttention` projects complex tokens and mixes them with
CNet's Born attention, PCT attention, complex softmax attention or CNet's
causal Fourier mixing; the maths lives in `jaxnorm.cplx`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, attention, cplx
from jaxnorm.nn import _param
from jaxnorm.nn.cplx.layers import complex_glorot

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
