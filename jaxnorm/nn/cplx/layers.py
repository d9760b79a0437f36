"""Complex layers: dense, convolution, modReLU and the complex inits.

Each module declares its complex parameters (``param_dtype`` complex64
unless stated) and calls one pure function of `jaxnorm.cplx`, where the
maths and references live.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _param

Names = tuple[str | None, ...] | None


def complex_glorot(
  key: jax.Array, shape, dtype=jnp.complex64, *, in_axis=0, out_axis=-1
) -> jax.Array:
  """Complex Glorot normal: ``E|w|^2 = 2/(fan_in + fan_out)`` (circular).

  A circular complex normal is Trabelsi et al.'s Rayleigh-modulus,
  uniform-phase initialization.

  Examples:
    >>> w = complex_glorot(jax.random.key(0), (256, 256))  # E|w|^2 = 2 / 512
    >>> w.dtype, bool(abs(float(jnp.mean(jnp.abs(w) ** 2)) * 256 - 1) < 0.05)
    (dtype('complex64'), True)
  """
  init = jax.nn.initializers.variance_scaling(
    1.0, "fan_avg", "normal", in_axis=in_axis, out_axis=out_axis, dtype=dtype
  )
  return init(key, shape, dtype)


def complex_he(
  key: jax.Array, shape, dtype=jnp.complex64, *, in_axis=-2, out_axis=-1
) -> jax.Array:
  """Complex He normal: ``E|w|^2 = 2/fan_in`` (conv kernels, fan-in axes).

  Examples:
    >>> w = complex_he(jax.random.key(0), (3, 3, 16, 32))  # E|w|^2 = 2 / 144
    >>> w.dtype, bool(abs(float(jnp.mean(jnp.abs(w) ** 2)) * 72 - 1) < 0.05)
    (dtype('complex64'), True)
  """
  init = jax.nn.initializers.variance_scaling(
    2.0, "fan_in", "normal", in_axis=in_axis, out_axis=out_axis, dtype=dtype
  )
  return init(key, shape, dtype)


def cnet_input_init(key: jax.Array, shape, dtype=jnp.complex64) -> jax.Array:
  """CNet's ``CInput`` init: ``Re ~ U(-1/2, 1/2)``, ``Im = sqrt(1 - Re^2)``.

  Both parts are divided by the parameter's element count ``n`` (CNet's
  ``CFunc::init_inputs``: ``re / length``, ``sqrt(1 - re^2) / length``), so
  every entry has a positive imaginary part and modulus exactly ``1/n``. CNet
  draws every weight of a net this way (its Q, K, V, output, FFN and head
  matrices and the learned positional table); only the token embedding has
  its own init (``CEmbedding``, divided by ``sqrt(E)``; ``emb_gauss``).

  Examples:
    >>> w = cnet_input_init(jax.random.key(0), (4, 8))  # n = 32
    >>> bool(jnp.all(w.imag > 0)), bool(jnp.all(jnp.abs(w) * 32 <= 1.0 + 1e-6))
    (True, True)

  References:
    Crasmaru, *CNet* (code ``crasmarum/CNet`` at commit
    ``4730a732738e2675215fa5f010387b9a1c37412b``, ``impl/cfunc.h``).
  """
  n = math.prod(shape)
  real = jnp.finfo(jnp.dtype(dtype)).dtype
  re = jax.random.uniform(key, shape, real, minval=-0.5, maxval=0.5)
  im = jnp.sqrt(1.0 - re * re)
  return (jax.lax.complex(re, im) / n).astype(dtype)


def torch_linear_init(fan_in: int) -> Callable[..., jax.Array]:
  """PyTorch's ``nn.Linear`` default init: ``U(-1/sqrt(fan_in), ...)``.

  ``kaiming_uniform_(a=sqrt(5))`` on the weight and ``uniform_(-b, b)`` on
  the bias both draw from ``U(-b, b)``, ``b = 1/sqrt(fan_in)``; on a complex
  tensor PyTorch's ``uniform_`` draws the real and imaginary parts
  independently (``at::view_as_real``). The PCT's complex FFN
  (``nn.Linear(dtype=cfloat)``) and real readout keep this init.

  Args:
    fan_in: the layer's input features.

  Returns:
    An initializer ``(key, shape, dtype) -> array`` (complex or real).

  Examples:
    >>> init = torch_linear_init(4)  # bound 1/2
    >>> w = init(jax.random.key(0), (4, 3), jnp.complex64)
    >>> bool(jnp.all(jnp.abs(w.real) <= 0.5)), bool(jnp.all(w.imag != 0))
    (True, True)
  """
  _checks.check_positive_int("torch_linear_init", "fan_in", fan_in)
  bound = 1.0 / math.sqrt(fan_in)

  def init(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.complexfloating):
      return jax.random.uniform(key, shape, dtype, -bound, bound)
    real = jnp.finfo(dtype).dtype
    u = jax.random.uniform(key, (2, *shape), real, -bound, bound)
    return jax.lax.complex(u[0], u[1]).astype(dtype)

  return init


def _zeros(shape, dtype, names: Names) -> nnx.Param:
  return _param.param(jnp.zeros(shape, dtype), names)


# ---------------------------------------------------------------------------
# Layers.


class ComplexDense(nnx.Module):
  """Complex dense layer; maths in `jaxnorm.cplx.complex_dense`.

  Parameters: ``kernel (in, out)`` complex Glorot, ``bias (out,)`` zeros
  (``kernel_init``, ``bias_init``: flax initializers called with the shape
  and ``param_dtype``, e.g. `cnet_input_init` or `torch_linear_init`).

  Examples:
    >>> dense = ComplexDense(2, 3, rngs=nnx.Rngs(0))
    >>> y = dense(jnp.ones((4, 2), jnp.complex64))  # zero bias at init
    >>> y.shape, bool(jnp.allclose(y[0], dense.kernel[...].sum(0)))
    ((4, 3), True)
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    use_bias: bool = True,
    kernel_init: Callable[..., jax.Array] | None = None,
    bias_init: Callable[..., jax.Array] | None = None,
    param_dtype: Any = jnp.complex64,
    axis_names: Names = ("embed", "mlp"),
    rngs: nnx.Rngs,
  ):
    who = "ComplexDense"
    _checks.check_positive_int(who, "in_features", in_features)
    _checks.check_positive_int(who, "out_features", out_features)
    init = complex_glorot if kernel_init is None else kernel_init
    self.kernel = _param.param(
      init(rngs.params(), (in_features, out_features), param_dtype),
      axis_names,
    )
    bias_names = axis_names and axis_names[-1:]
    if not use_bias:
      self.bias = None
    elif bias_init is None:
      self.bias = _zeros((out_features,), param_dtype, bias_names)
    else:
      self.bias = _param.param(
        bias_init(rngs.params(), (out_features,), param_dtype), bias_names
      )

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x @ kernel + bias`` for complex ``x (..., in)``."""
    bias = None if self.bias is None else self.bias[...]
    return cplx.complex_dense(x, self.kernel[...], bias)


class ComplexConv(nnx.Module):
  """Complex convolution; maths in `jaxnorm.cplx.complex_conv`.

  Parameters: ``kernel (*window, in, out)`` complex He (fan-in),
  ``bias (out,)`` zeros; output channels named ``channels`` (the real
  CNN's logical axis, `jaxnorm.sharding.DEFAULT_RULES`).

  Examples:
    >>> conv = ComplexConv(1, 4, (3, 3), strides=2, rngs=nnx.Rngs(0))
    >>> y = conv(jnp.ones((1, 8, 8, 1), jnp.complex64))  # SAME padding
    >>> y.shape, y.dtype, conv.kernel[...].shape
    ((1, 4, 4, 4), dtype('complex64'), (3, 3, 1, 4))
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
      (None,) * (len(kernel_size) + 1) + ("channels",),
    )
    self.bias = (
      _zeros((out_features,), param_dtype, ("channels",)) if use_bias else None
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


class ModReLU(nnx.Module):
  """modReLU with a learned real bias; maths in `jaxnorm.cplx.modrelu`.

  Parameter: ``bias (d,)`` real, init 0; ``per_feature=False`` keeps one
  scalar ``bias ()`` for all features, as the PCT's official FFN does
  (``ModReLU.bias = nn.Parameter(torch.tensor(0.))``, ``power=2``).

  Examples:
    >>> act = ModReLU(2, rngs=nnx.Rngs(0))
    >>> act.bias[...] = jnp.array([-1.0, -1.0])  # relu(|z| + b) z / |z|
    >>> [round(abs(v), 4) for v in act(jnp.array([3 + 4j, 0.5j])).tolist()]
    [4.0, 0.0]
  """

  def __init__(
    self,
    num_features: int,
    *,
    power: int = 1,
    per_feature: bool = True,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    del rngs
    _checks.check_positive_int("ModReLU", "num_features", num_features)
    _checks.check_positive_int("ModReLU", "power", power)
    self.power = power
    self.bias = (
      _zeros((num_features,), param_dtype, ("mlp",))
      if per_feature
      else _zeros((), param_dtype, ())
    )

  def __call__(self, z: jax.Array) -> jax.Array:
    """``modrelu(z, bias, power=power)``."""
    return cplx.modrelu(z, self.bias[...], power=self.power)
