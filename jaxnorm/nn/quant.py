"""`Int8Dense`: a drop-in for the shared `Dense` with an int8 matmul.

Same constructor, parameter paths (``kernel (in, out)``, ``bias``) and
logical axis names as `jaxnorm.nn.layers.Dense`, so a trained model's state
loads unchanged; the forward pass runs the matmul through `jaxnorm.quant`
(``quant_mode="mixed"``: LLM.int8(), ``"vector"``/``"tensor"``: plain int8
absmax, ``"none"``: float). `swap_dense` replaces every dense layer of a
built model in place. The maths is in `jaxnorm.quant`.

Examples:
  >>> QUANT_MODES
  ('none', 'tensor', 'vector', 'mixed')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, quant
from jaxnorm.nn import layers

QuantMode = Literal["none", "tensor", "vector", "mixed"]
QUANT_MODES = ("none", "tensor", "vector", "mixed")


def quantized_matmul(
  x: jax.Array,
  kernel: jax.Array,
  *,
  quant_mode: QuantMode,
  threshold: float = 6.0,
  absmax_mode: quant.AbsmaxMode = "paper",
  outlier_weight: quant.OutlierWeight = "fp",
) -> jax.Array:
  """``x @ kernel`` through the `jaxnorm.quant` path named by ``quant_mode``.

  Raises:
    ValueError: for an unknown ``quant_mode`` (and as `jaxnorm.quant`).

  Examples:
    >>> x = jnp.array([[1.0, -2.0, 0.5]], jnp.float32)
    >>> w = jnp.eye(3, dtype=jnp.float32)
    >>> quantized_matmul(x, w, quant_mode="none").tolist()
    [[1.0, -2.0, 0.5]]
    >>> y = quantized_matmul(x, w, quant_mode="vector")
    >>> [round(v, 4) for v in y[0].tolist()]
    [1.0079, -2.0, 0.5039]

    (int8 absmax of the row, scale ``127 / 2``: ``1 -> round(63.5) / 63.5 =
    64 / 63.5``.)
  """
  _checks.check_choice(
    "quantized_matmul", "quant_mode", quant_mode, QUANT_MODES
  )
  if quant_mode == "none":
    return jnp.matmul(x, kernel.astype(x.dtype))
  if quant_mode == "mixed":
    return quant.int8_mixed_matmul(
      x,
      kernel,
      threshold=threshold,
      absmax_mode=absmax_mode,
      outlier_weight=outlier_weight,
    )
  return quant.int8_vectorwise_matmul(x, kernel, granularity=quant_mode)


class Int8Dense(layers.Dense):
  """``y = int8_matmul(x, kernel) (+ bias)``, a drop-in for `layers.Dense`.

  A subclass of `layers.Dense` (same parameters, paths and axis names) whose
  matmul runs through `quantized_matmul`.

  Args:
    in_features: input width.
    out_features: output width.
    quant_mode: ``"mixed"`` (LLM.int8(), default), ``"vector"``,
      ``"tensor"`` or ``"none"``.
    threshold: outlier threshold of ``"mixed"``.
    absmax_mode: ``"paper"`` or ``"bnb"`` (`jaxnorm.quant.int8_mixed_matmul`).
    outlier_weight: ``"fp"`` or ``"dequant"``.
    **kwargs: the `layers.Dense` arguments (``names``, ``use_bias``,
      ``kernel_init``, ``dtype``, ``param_dtype``, ``rngs``).

  Raises:
    ValueError: for an unknown mode or a negative threshold.

  Examples:
    >>> dense = Int8Dense(4, 2, quant_mode="vector", names=(None, None),
    ...                   rngs=nnx.Rngs(0))
    >>> sorted(nnx.to_pure_dict(nnx.state(dense, nnx.Param)))  # as Dense
    ['bias', 'kernel']
    >>> x = jnp.ones((3, 4), jnp.float32)
    >>> bool(jnp.allclose(dense(x), x @ dense.kernel[...], atol=0.02))
    True
  """

  def __init__(
    self,
    in_features: int,
    out_features: int,
    *,
    quant_mode: QuantMode = "mixed",
    threshold: float = 6.0,
    absmax_mode: quant.AbsmaxMode = "paper",
    outlier_weight: quant.OutlierWeight = "fp",
    **kwargs: Any,
  ):
    who = "Int8Dense"
    _checks.check_choice(who, "quant_mode", quant_mode, QUANT_MODES)
    _checks.check_choice(who, "absmax_mode", absmax_mode, quant.ABSMAX_MODES)
    _checks.check_choice(
      who, "outlier_weight", outlier_weight, quant.OUTLIER_WEIGHTS
    )
    _checks.check_nonnegative(who, "threshold", threshold)
    super().__init__(in_features, out_features, **kwargs)
    self.quant_mode, self.threshold = quant_mode, threshold
    self.absmax_mode, self.outlier_weight = absmax_mode, outlier_weight

  @classmethod
  def from_dense(cls, dense: nnx.Module, **options: Any) -> Int8Dense:
    """An `Int8Dense` sharing ``dense``'s kernel and bias variables.

    Args:
      dense: a `layers.Dense` (anything with ``kernel``, ``bias``, ``dtype``).
      **options: ``quant_mode``, ``threshold``, ``absmax_mode``,
        ``outlier_weight``.
    """
    h, o = dense.kernel.shape
    new = cls(
      h,
      o,
      names=(None, None),
      use_bias=dense.bias is not None,
      dtype=dense.dtype,
      rngs=nnx.Rngs(0),
      **options,
    )
    new.kernel, new.bias = dense.kernel, dense.bias
    return new

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the quantized map to the last axis of ``x``."""
    y = quantized_matmul(
      x.astype(self.dtype),
      self.kernel[...].astype(self.dtype),
      quant_mode=self.quant_mode,
      threshold=self.threshold,
      absmax_mode=self.absmax_mode,
      outlier_weight=self.outlier_weight,
    )
    if self.bias is not None:
      b = self.bias[...].astype(self.dtype)
      y = y + b.reshape((1,) * (y.ndim - 1) + b.shape)
    return y


def swap_dense(
  model: nnx.Module,
  *,
  dense_type: type = layers.Dense,
  cls: type[Int8Dense] = Int8Dense,
  **options: Any,
) -> int:
  """Replaces every ``dense_type`` submodule of ``model`` by ``cls``, in place.

  The replacements share the original kernel and bias variables
  (`Int8Dense.from_dense`), so parameter paths and values are unchanged.

  Args:
    model: the module to edit.
    dense_type: the exact class to replace (subclasses are left alone).
    cls: `Int8Dense` or a subclass.
    **options: ``quant_mode``, ``threshold``, ``absmax_mode``,
      ``outlier_weight``.

  Returns:
    The number of layers replaced.

  Examples:
    >>> from jaxnorm.nn.nap import NaPMLP
    >>> mlp = NaPMLP((4, 8, 2), rngs=nnx.Rngs(0))  # two layers.Dense
    >>> swap_dense(mlp, quant_mode="vector")
    2
    >>> type(mlp.readout).__name__, mlp(jnp.ones((3, 4), jnp.float32)).shape
    ('Int8Dense', (3, 2))
  """
  return swap_modules(
    model, dense_type, lambda dense: cls.from_dense(dense, **options)
  )


def swap_modules(
  model: nnx.Module,
  module_type: type,
  make: Callable[[nnx.Module], nnx.Module],
) -> int:
  """Replaces every ``module_type`` submodule of ``model`` by ``make(it)``.

  In place; ``module_type`` is matched exactly (subclasses are left alone)
  and the model itself is never replaced.

  Args:
    model: the module to edit.
    module_type: the exact class to replace.
    make: builds the replacement from the module it replaces.

  Returns:
    The number of modules replaced.

  Examples:
    >>> model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), jax.nn.relu)
    >>> swap_modules(model, nnx.Linear, Int8Dense.from_dense)
    1
    >>> type(model.layers[0]).__name__
    'Int8Dense'
  """
  found = [
    (path, m)
    for path, m in nnx.iter_modules(model)
    if type(m) is module_type and path
  ]
  for path, old in found:
    parent = model
    for key in path[:-1]:
      parent = parent[key] if isinstance(key, int) else getattr(parent, key)
    new = make(old)
    if isinstance(path[-1], int):
      parent[path[-1]] = new
    else:
      setattr(parent, path[-1], new)
  return len(found)
