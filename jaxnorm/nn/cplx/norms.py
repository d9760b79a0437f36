"""Complex norms: whitening batch norm, layer norm, CNet's TokenNorm, PCT's.

Complex-native by default (complex ``(..., C)`` in and out); with
``real_pairs=True`` a norm reads a real ``(..., 2C)`` input as split halves
``[Re | Im]`` (`jaxnorm.cplx.to_complex`) and returns real ``(..., 2C)``.
The maths lives in `jaxnorm.cplx`.

flax's constructor conventions: ``use_scale``/``use_bias`` (False drops the
parameter), ``scale_init``/``bias_init`` (called with the parameter's shape
and dtype: ``(3, C)`` real for a whitening scale, ``(C,)`` complex for a
bias), ``param_dtype`` and ``dtype``, the output dtype (complex, or real
with ``real_pairs=True``; ``None`` keeps the input's).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, cplx
from jaxnorm.nn import _norm_keys, _param, registry
from jaxnorm.nn.cplx.layers import Names

Initializer = Callable[..., jax.Array]


def _pairs(who: str, num_features: int, real_pairs: bool) -> int:
  """The complex width: ``num_features`` or half of it for real pairs."""
  _checks.check_positive_int(who, "num_features", num_features)
  if real_pairs:
    if num_features % 2:
      raise ValueError(
        f"{who}: real_pairs=True reads split halves [Re | Im], so "
        f"num_features must be even, got num_features={num_features}"
      )
    return num_features // 2
  return num_features


def _check_dtype(who: str, dtype: Any, real_pairs: bool) -> None:
  """The output ``dtype``: complex, or real floating for real pairs.

  Raises:
    TypeError: for a dtype of the other kind (or an integer dtype).
  """
  if dtype is None:
    return
  kind, want = (
    (jnp.floating, "a real floating dtype (real_pairs=True: real output)")
    if real_pairs
    else (jnp.complexfloating, "a complex dtype (complex in, complex out)")
  )
  if not jnp.issubdtype(dtype, kind):
    raise TypeError(
      f"{who}: dtype must be {want}, got dtype={jnp.dtype(dtype).name}"
    )


def _apply(module: nnx.Module, fn: Callable[[jax.Array], jax.Array], x):
  """``fn`` on complex ``x``, or on ``to_complex(x)`` for real pairs.

  The result in the module's output ``dtype`` when one is set.
  """
  y = fn(x) if not module.real_pairs else cplx.to_real(fn(cplx.to_complex(x)))
  return y if module.dtype is None else y.astype(module.dtype)


def _whitening_dtype_rows(param_dtype: Any, axis_names: Names):
  """The complex dtype of the bias/mean and the names of ``(3, C)`` rows."""
  cdt = jnp.complex128 if param_dtype == jnp.float64 else jnp.complex64
  rows = (None,) + tuple(axis_names) if axis_names else None
  return cdt, rows


def _init(
  who: str, num_features: int, real_pairs: bool, dtype: Any, rngs
) -> tuple[int, jax.Array, jax.Array]:
  """The complex width and output dtype, checked; the family's two keys.

  The keys are drawn whatever the options, which keeps the initialization
  of later layers independent of the norm chosen.
  """
  keys = _norm_keys.draw_keys(rngs)
  c = _pairs(who, num_features, real_pairs)
  _check_dtype(who, dtype, real_pairs)
  return c, *keys


def _whitening_init(key: jax.Array, shape: tuple[int, ...], dtype: Any):
  """The whitening scale's init ``(1/√2, 0, 1/√2)`` (Trabelsi et al.)."""
  del key  # Constant.
  return cplx.init_whitening_scale(shape[1], dtype)


def _whitening_scale(
  c: int,
  use_scale: bool,
  init: Initializer,
  key: jax.Array,
  param_dtype: Any,
  axis_names: Names,
) -> nnx.Param | None:
  """Real ``scale (3, C)`` (γrr, γri, γii) from ``init``, or None."""
  if not use_scale:
    return None
  _, rows = _whitening_dtype_rows(param_dtype, axis_names)
  return _param.param(init(key, (3, c), param_dtype), rows)


def _complex_bias(
  c: int,
  use_bias: bool,
  init: Initializer,
  key: jax.Array,
  param_dtype: Any,
  axis_names: Names,
) -> nnx.Param | None:
  """Complex ``bias (C,)`` from ``init`` (zeros by default), or None."""
  if not use_bias:
    return None
  cdt, _ = _whitening_dtype_rows(param_dtype, axis_names)
  return _param.param(init(key, (c,), cdt), axis_names)


class ComplexBatchNorm(nnx.Module):
  """Complex batch norm; maths in `jaxnorm.cplx.complex_batch_norm`.

  Parameters: ``scale (3, C)`` real, rows ``(γrr, γri, γii)`` init
  ``(1/√2, 0, 1/√2)``; ``bias (C,)`` complex, zeros. Running statistics
  (`nnx.BatchStat`): ``mean (C,)`` complex64, ``cov (3, C)`` float32,
  whatever ``param_dtype`` (as `jaxnorm.nn.BatchNorm`'s), updated under
  `jax.lax.stop_gradient`. Follows
  flax's train/eval protocol: ``use_running_average`` (``model.eval()``,
  ``nnx.view`` through `set_view`, or a call argument). ``real_pairs``:
  real ``(..., 2C)`` input and output (split halves). ``scale_init``
  defaults to the paper's whitening init.

  This module does not subclass `jaxnorm.nn.norms`' ``RunningAverage``:
  importing the norm package here would be an import cycle, as the norm
  registry lists this module.

  Examples:
    >>> bn = ComplexBatchNorm(1, eps=0.0, rngs=nnx.Rngs(0))
    >>> y = bn(jnp.array([[1 + 0j], [-1 + 0j], [1j], [-1j]]))  # training mode
    >>> [round(abs(v), 4) for v in y[:, 0].tolist()]  # whitened, times 1/sqrt 2
    [1.0, 1.0, 1.0, 1.0]
    >>> bn.mean[...].dtype, bn.cov[...].dtype  # the running statistics
    (dtype('complex64'), dtype('float32'))
  """

  dtype_kind: ClassVar[str] = "complex"

  @_param.paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    momentum: float = 0.9,
    eps: float = 1e-4,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = _whitening_init,
    bias_init: Initializer = nnx.initializers.zeros,
    real_pairs: bool = False,
    use_running_average: bool = False,
    axis_name: str | None = None,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    c, scale_key, bias_key = _init(
      "ComplexBatchNorm", num_features, real_pairs, dtype, rngs
    )
    self.real_pairs, self.momentum, self.eps = real_pairs, momentum, eps
    self.use_running_average, self.axis_name = use_running_average, axis_name
    self.dtype = dtype
    _, rows = _whitening_dtype_rows(param_dtype, axis_names)
    self.scale = _whitening_scale(
      c, use_scale, scale_init, scale_key, param_dtype, axis_names
    )
    self.bias = _complex_bias(
      c, use_bias, bias_init, bias_key, param_dtype, axis_names
    )
    state = cplx.init_complex_batch_norm_state(c, jnp.complex64)
    self.mean = _param.param(state.mean, axis_names, nnx.BatchStat)
    self.cov = _param.param(state.cov, rows, nnx.BatchStat)

  def set_view(self, use_running_average: bool | None = None) -> None:
    """Hook of ``nnx.view``: sets ``use_running_average`` when given.

    Args:
      use_running_average: True for inference (running statistics), False
        for training (batch statistics, updated running statistics).
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average

  def __call__(
    self, x: jax.Array, *, use_running_average: bool | None = None
  ) -> jax.Array:
    """Normalizes complex ``x (..., C)`` (or real pairs ``(..., 2C)``)."""
    if use_running_average is None:
      use_running_average = self.use_running_average
    training = not use_running_average
    state = cplx.ComplexBatchNormState(self.mean[...], self.cov[...])
    scale = None if self.scale is None else self.scale[...]
    bias = None if self.bias is None else self.bias[...]
    new = []

    def fn(z):
      y, s = cplx.complex_batch_norm(
        z,
        scale,
        bias,
        state,
        training=training,
        momentum=self.momentum,
        eps=self.eps,
        axis_name=self.axis_name,
      )
      new.append(s)
      return y

    y = _apply(self, fn, x)
    if training:
      self.mean[...], self.cov[...] = jax.lax.stop_gradient(new[0])
    return y


class ComplexLayerNorm(nnx.Module):
  """Complex layer norm; maths in `jaxnorm.cplx.complex_layer_norm`.

  Parameters and keywords as `ComplexBatchNorm` (no running statistics).

  Examples:
    >>> norm = ComplexLayerNorm(4, eps=0.0, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([[1 + 0j, -1 + 0j, 1j, -1j]]))  # covariance I / 2
    >>> [round(abs(v), 4) for v in y[0].tolist()]  # whitened, times 1/sqrt 2
    [1.0, 1.0, 1.0, 1.0]
  """

  dtype_kind: ClassVar[str] = "complex"

  @_param.paper_affine()
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-4,
    use_scale: bool = True,
    use_bias: bool = True,
    scale_init: Initializer = _whitening_init,
    bias_init: Initializer = nnx.initializers.zeros,
    real_pairs: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    c, scale_key, bias_key = _init(
      "ComplexLayerNorm", num_features, real_pairs, dtype, rngs
    )
    self.real_pairs, self.eps, self.dtype = real_pairs, eps, dtype
    self.scale = _whitening_scale(
      c, use_scale, scale_init, scale_key, param_dtype, axis_names
    )
    self.bias = _complex_bias(
      c, use_bias, bias_init, bias_key, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each token of ``x``."""
    scale = None if self.scale is None else self.scale[...]
    bias = None if self.bias is None else self.bias[...]
    return _apply(
      self,
      lambda z: cplx.complex_layer_norm(z, scale, bias, eps=self.eps),
      x,
    )


class ComplexRMSNorm(nnx.Module):
  """CNet's TokenNorm; maths in `jaxnorm.cplx.complex_rms_norm`.

  Parameter: ``scale (d,)`` complex, init 1 (``scale_init``;
  ``use_scale=False`` is CNet's parameter-free TokenNorm). No bias:
  ``use_bias=True`` and ``bias_init`` are refused. ``dtype`` as in
  `ComplexBatchNorm`.

  Examples:
    >>> norm = ComplexRMSNorm(2, rngs=nnx.Rngs(0))  # unit complex gain
    >>> y = norm(jnp.array([3 + 0j, 4j]))  # RMS modulus sqrt(12.5)
    >>> [round(abs(v), 4) for v in y.tolist()], y.dtype
    ([0.8485, 1.1314], dtype('complex64'))
  """

  dtype_kind: ClassVar[str] = "complex"

  @_param.paper_affine(
    no_bias="CNet's TokenNorm divides by the RMS modulus; no shift"
  )
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-5,
    use_scale: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    real_pairs: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.complex64,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    c, scale_key, _ = _init(
      "ComplexRMSNorm", num_features, real_pairs, dtype, rngs
    )
    self.real_pairs, self.eps, self.dtype = real_pairs, eps, dtype
    self.scale = (
      _param.param(scale_init(scale_key, (c,), param_dtype), axis_names)
      if use_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each token of ``x``."""
    scale = None if self.scale is None else self.scale[...]
    return _apply(
      self, lambda z: cplx.complex_rms_norm(z, scale, eps=self.eps), x
    )


class PCTRMSNorm(nnx.Module):
  """The PCT's ``ComplexRMSNorm``; maths in `jaxnorm.cplx.pct_rms_norm`.

  ``scale * x / (sqrt(d) * ||x||)``: per-element output RMS ``1/d`` with the
  unit gain, where CNet's TokenNorm (`ComplexRMSNorm`) gives 1. Parameter:
  ``scale (d,)`` complex, init 1 (``scale_init``; the code's ``gamma``).
  ``eps`` (1e-12) clamps the sum of squares. No bias. ``dtype`` as in
  `ComplexBatchNorm`.

  Examples:
    >>> norm = PCTRMSNorm(4, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.array([3 + 0j, 4j, 0j, 0j]))  # ||y|| = 1 / sqrt(4)
    >>> [round(abs(v), 4) for v in y.tolist()]
    [0.3, 0.4, 0.0, 0.0]

  References:
    Hioki, arXiv:2605.10123 (2026); code
    ``leohio/phase-coherent-transformer-r-d``.
  """

  dtype_kind: ClassVar[str] = "complex"

  @_param.paper_affine(
    no_bias="the PCT's ComplexRMSNorm L2-normalizes each token; no shift"
  )
  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-12,
    use_scale: bool = True,
    scale_init: Initializer = nnx.initializers.ones,
    real_pairs: bool = False,
    dtype: Any = None,
    param_dtype: Any = jnp.complex64,
    axis_names: Names = ("norm",),
    rngs: nnx.Rngs,
  ):
    c, scale_key, _ = _init("PCTRMSNorm", num_features, real_pairs, dtype, rngs)
    self.real_pairs, self.eps, self.dtype = real_pairs, eps, dtype
    self.scale = (
      _param.param(scale_init(scale_key, (c,), param_dtype), axis_names)
      if use_scale
      else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each token of ``x``."""
    scale = None if self.scale is None else self.scale[...]
    return _apply(self, lambda z: cplx.pct_rms_norm(z, scale, eps=self.eps), x)


_PER_TOKEN = frozenset({"tokens", "images", "graphs"})
_NO_DECAY_WHITENING = types.MappingProxyType({"scale": False, "bias": False})

NORM_SPECS: Mapping[str, registry.NormSpec] = types.MappingProxyType(
  {
    "complexbatchnorm": registry.NormSpec(
      ComplexBatchNorm,
      "Trabelsi et al., arXiv:1705.09792",
      layouts=frozenset({"tokens", "images"}),
      batch_stats=True,
      decay=_NO_DECAY_WHITENING,
    ),
    "complexlayernorm": registry.NormSpec(
      ComplexLayerNorm,
      "Trabelsi et al., arXiv:1705.09792",
      layouts=_PER_TOKEN,
      decay=_NO_DECAY_WHITENING,
    ),
    "complexrmsnorm": registry.NormSpec(
      ComplexRMSNorm,
      "Crasmaru, CNet (crasmarum/CNet)",
      layouts=_PER_TOKEN,
    ),
    "pctrmsnorm": registry.NormSpec(
      PCTRMSNorm,
      "Hioki, arXiv:2605.10123 (PCT's ComplexRMSNorm)",
      layouts=_PER_TOKEN,
    ),
  }
)
"""Registry entries of the complex norms: merge into
`jaxnorm.nn.norms.NORMS` (and its ``NormName``).

The registry builds the complex-native form: ``num_features`` complex
channels, complex input and output (the modules' ``dtype_kind`` class
attribute is ``"complex"``); a real model passes ``real_pairs=True`` and
``2 C`` real features. ``causal``: per-token statistics (layer, RMS) or
running statistics in evaluation mode (batch norm, which takes batch
statistics in training, hence ``batch_stats``)."""
