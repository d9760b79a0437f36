"""Helpers shared by the norm modules of `jaxnorm.nn.norms`."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm.nn._param import param

Initializer = Callable[..., jax.Array]
Names = Sequence[str | None] | None


PromoteDtype = Callable[..., tuple[Any, ...]]
"""flax's ``promote_dtype``: ``fn(args, dtype=...)`` returns ``args`` cast to
one dtype (`flax.nnx.nn.dtypes.promote_dtype`)."""


def promote(x: jax.Array, module: nnx.Module) -> jax.Array:
  """The input of a module call, promoted as flax's norms promote it.

  The computation dtype of the module's call: with ``module.dtype=None``,
  the promotion of the input dtype with the dtypes of the module's
  parameters, as in flax's ``LayerNorm``/``RMSNorm``/``Linear`` (a bfloat16
  input with float32 parameters gives float32, computed from the exact
  upcast input; a module without parameters keeps the input dtype). With an
  explicit ``dtype`` the input is upcast to it when it is narrower, and
  kept otherwise (the statistics then run on the exact input, and `cast`
  sets the output dtype). A non-floating input is left as is, so the pure
  function refuses it with its `TypeError`.
  """
  params = jax.tree.leaves(nnx.state(module, nnx.Param))
  return promote_to(x, module.dtype, params)


def promote_to(
  x: jax.Array, dtype: Any, params: Sequence[jax.Array | None]
) -> jax.Array:
  """`promote` for a module's explicit ``dtype`` and parameter values.

  Shared with `jaxnorm.linen`, whose parameters are call-time values;
  ``None`` entries (absent parameters) are skipped.
  """
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  with jax.numpy_dtype_promotion("standard"):
    if dtype is None:
      out = jnp.result_type(x, *(p.dtype for p in params if p is not None))
    else:
      out = jnp.result_type(x, dtype)
  return x.astype(out)


def promote_args(
  module: Any,
  x: jax.Array,
  *params: jax.Array | None,
  statistics: int = 0,
) -> tuple[Any, ...]:
  """``(x, *params)`` as the module computes with them.

  Without ``module.promote_dtype``: ``x`` as `promote_to` gives it (the
  parameters, which the pure functions cast to their compute dtype, as
  they are). With it, flax's rule: ``module.promote_dtype((x, *params),
  dtype=module.dtype)``, then ``x`` upcast to the output dtype where that
  is wider, so the pure function, whose output has ``x.dtype``, returns
  flax's output dtype and precision (the callable runs under standard
  dtype promotion, as flax's assumes). The output dtype is ``dtype``, else
  the promotion of the returned ``x`` and parameters except the first
  ``statistics`` of them (BatchNorm's running ``mean`` and ``var``, which
  flax promotes but leaves out of its output rule).
  """
  if module.promote_dtype is None:
    return (promote_to(x, module.dtype, params), *params)
  with jax.numpy_dtype_promotion("standard"):
    x, *params = module.promote_dtype((x, *params), dtype=module.dtype)
    x = jnp.asarray(x)
    out = module.dtype
    if out is None:
      affine = params[statistics:]
      out = jnp.result_type(x, *(p for p in affine if p is not None))
    return (x.astype(jnp.result_type(x, out)), *params)


def cast(y: jax.Array, module: Any) -> jax.Array:
  """``y`` in the module's explicit output ``dtype``, if one is set."""
  return y if module.dtype is None else y.astype(module.dtype)


_LAST_AXIS = (-1, (-1,))

FLAX_SPELLING_ATTR = "__jaxnorm_flax_spelling__"
"""Attribute `flax_spelling` sets on the decorated ``__init__``."""

FLAX_SPELLING_REFUSALS: Mapping[str, str] = types.MappingProxyType(
  {
    "reduction_axes / feature_axes / axis other than -1": (
      "jaxnorm modules normalize the last, feature axis "
      "(`ValueError`); for other axes call the pure function in "
      "`jaxnorm.norms` with `axis=`"
    ),
    "use_fast_variance=True": (
      "jaxnorm always computes the two-pass variance (`ValueError`; "
      "`use_fast_variance=False` is accepted)"
    ),
    "scale_metadata / bias_metadata": (
      "`TypeError`: jaxnorm takes `axis_names=` (a logical name for the "
      "feature axis of every parameter)"
    ),
  }
)
"""The flax keywords `flax_spelling` refuses, and why: docs/make_api.py
lists them as deviations from flax (``epsilon`` is accepted as ``eps``)."""


def flax_spelling(init: Callable[..., None]) -> Callable[..., None]:
  """Accepts flax's constructor keywords where they mean the same.

  ``epsilon`` is ``eps``; ``reduction_axes``, ``feature_axes`` and (for
  BatchNorm) ``axis`` are accepted when they name the last axis, the only
  one a jaxnorm module normalizes over (modules with a ``reduction_axes``
  argument of their own take it as theirs); ``use_fast_variance=False`` is
  jaxnorm's two-pass variance. Anything else flax spells differently is a
  `TypeError` or `ValueError` naming the jaxnorm spelling.
  """
  own = set(inspect.signature(init).parameters)

  @functools.wraps(init)
  def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
    who = type(self).__name__
    for name in sorted(set(kwargs) - own):
      if name == "epsilon":
        if "eps" in kwargs:
          raise TypeError(f"{who}: give eps or flax's epsilon, not both")
        kwargs["eps"] = kwargs.pop("epsilon")
      elif name in ("reduction_axes", "feature_axes", "axis"):
        value = kwargs.pop(name)
        if value not in _LAST_AXIS:
          raise ValueError(
            f"{who}: {name} must be -1 (jaxnorm modules normalize the last, "
            f"feature axis), got {name}={value!r}; for other axes call the "
            "pure function in jaxnorm.norms with axis="
          )
      elif name == "use_fast_variance":
        if kwargs.pop(name):
          raise ValueError(
            f"{who}: use_fast_variance=True is not available: jaxnorm "
            "always computes the two-pass variance (use_fast_variance=False)"
          )
      elif name in ("scale_metadata", "bias_metadata"):
        raise TypeError(
          f"{who}: {name} is flax's spelling; jaxnorm takes axis_names=(a "
          "logical name,) for the feature axis of every parameter"
        )
    init(self, *args, **kwargs)

  setattr(wrapper, FLAX_SPELLING_ATTR, FLAX_SPELLING_REFUSALS)
  return wrapper


def optional(
  use: bool,
  init: Initializer,
  key: jax.Array,
  num_features: int,
  param_dtype: Any,
  names: Names,
) -> nnx.Param | None:
  """A ``(num_features,)`` parameter from ``init``, or ``None`` if unused."""
  if not use:
    return None
  return param(init(key, (num_features,), param_dtype), names)


def maybe(var: nnx.Variable | None) -> jax.Array | None:
  """The value of an optional variable."""
  return None if var is None else var[...]


class RunningAverage(nnx.Module):
  """Train/eval switch of the norms with running statistics.

  ``use_running_average`` selects inference mode (the running statistics
  are used and not updated). It follows flax's protocol: ``model.eval()`` /
  ``model.train()`` set it, ``nnx.view(model, use_running_average=...)``
  calls `set_view`, and a call argument overrides it for one call.
  """

  use_running_average: bool

  def set_view(self, use_running_average: bool | None = None) -> None:
    """Hook of ``nnx.view``: sets ``use_running_average`` when given.

    Args:
      use_running_average: True for inference (running statistics), False
        for training (batch statistics, updated running statistics).
    """
    if use_running_average is not None:
      self.use_running_average = use_running_average

  def eval_mode(self, use_running_average: bool | None) -> bool:
    """The call's mode: its argument if given, else the module's."""
    if use_running_average is None:
      return self.use_running_average
    return use_running_average
