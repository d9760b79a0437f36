"""Parameter creation shared by the jaxnorm modules."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxnorm import sharding


def param(
  value: jax.Array,
  names: Sequence[str | None] | None,
  variable_type: type[nnx.Variable] = nnx.Param,
) -> nnx.Variable:
  """Wraps ``value`` as an nnx variable that carries logical axis names.

  The names are always stored as ``out_sharding`` metadata, so
  `nnx.get_partition_spec` resolves them under any rule table. The value is
  placed (sharded eagerly) only when a mesh is active; without one the module
  still builds, e.g. in a notebook on a single device. Under a mesh, a
  logical name without a rule in the active rules is replicated (with one
  warning) instead of failing (`jaxnorm.sharding.param_names`), so every
  module builds under a user's mesh with other axis names.
  """
  if names is None:
    return variable_type(value)
  names = sharding.param_names(names)
  if len(names) != value.ndim:
    raise ValueError(
      f"param: axis names must have one entry per axis, got {names=} for "
      f"shape {value.shape}"
    )
  return variable_type(
    value, out_sharding=tuple(names), eager_sharding=sharding.has_mesh()
  )


AFFINE_REFUSALS_ATTR = "__jaxnorm_affine_refusals__"
"""Attribute `paper_affine` sets on the decorated ``__init__``: its rules."""

_PROMOTE_REASON = (
  "promotes its input with its parameters' dtypes (flax's default rule); "
  "LayerNorm, RMSNorm, BatchNorm, GroupNorm and InstanceNorm take "
  "promote_dtype="
)


class AffineRule(NamedTuple):
  """How `paper_affine` answers one of flax's keywords.

  ``accepts(value)`` says whether the value agrees with the paper (it is
  then dropped); any other value is refused as ``"<who>: <keyword> is not
  available: <reason(who)>"``, the keyword spelled with its value where
  ``show_value`` (``use_scale=False``).
  """

  refused: str  # The refused values as the docs spell them.
  accepts: Callable[[Any], bool]
  reason: Callable[[str], str]  # Of the module's class name.
  show_value: bool = False


def _affine_rules(
  own: set[str],
  no_bias: str | None,
  needs_scale: str | None,
  needs_bias: str | None,
  own_init: str | None,
) -> dict[str, AffineRule]:
  """The rule of each flax keyword an ``__init__`` leaves undeclared."""
  rules: dict[str, AffineRule] = {}
  if needs_scale is not None:
    rules["use_scale"] = AffineRule(
      "use_scale=False",
      bool,
      lambda who: f"the paper needs its scale ({needs_scale})",
      show_value=True,
    )
  if no_bias is not None:
    rules["use_bias"] = AffineRule(
      "use_bias=True",
      lambda v: not v,
      lambda who: f"{who} has no bias ({no_bias})",
      show_value=True,
    )
    rules["bias_init"] = AffineRule(
      "bias_init", lambda v: False, lambda who: f"{who} has no bias ({no_bias})"
    )
  elif needs_bias is not None:
    rules["use_bias"] = AffineRule(
      "use_bias=False",
      bool,
      lambda who: f"the paper needs its bias ({needs_bias})",
      show_value=True,
    )
  if own_init is not None:
    for name in ("scale_init", "bias_init"):
      rules.setdefault(
        name, AffineRule(name, lambda v: False, lambda who: own_init)
      )
  rules["promote_dtype"] = AffineRule(
    "promote_dtype (not None)",
    lambda v: v is None,
    lambda who: f"{who} {_PROMOTE_REASON}",
  )
  return {k: r for k, r in rules.items() if k not in own}


def paper_affine(
  *,
  no_bias: str | None = None,
  needs_scale: str | None = None,
  needs_bias: str | None = None,
  own_init: str | None = None,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
  """The affine keywords of flax on a module whose paper fixes its affine.

  Decorates a module's ``__init__``. flax's ``use_scale``, ``use_bias``,
  ``scale_init``, ``bias_init`` and ``promote_dtype`` that the ``__init__``
  does not declare itself are answered here: a value that agrees with the
  paper (``use_bias=False`` on a norm without bias, ``use_scale=True`` on
  one that needs its scale, ``promote_dtype=None``: flax's default rule,
  which every jaxnorm norm follows) is accepted and dropped; any other is a
  `ValueError` naming the keyword and the reason, never Python's bare
  "unexpected keyword" `TypeError`. Keywords outside this set pass through
  untouched. The rules are kept on the wrapper (`affine_refusals` reads
  them; docs/make_api.py lists them as deviations from flax).

  Args:
    no_bias: why the norm has no bias (``use_bias=True`` and
      ``bias_init`` are refused).
    needs_scale: why the paper needs its scale (``use_scale=False`` is
      refused).
    needs_bias: why the paper needs its bias (``use_bias=False`` is
      refused).
    own_init: why the parameters keep their own initialization
      (``scale_init`` and ``bias_init`` are refused).

  Returns:
    The decorator.
  """

  def decorate(init: Callable[..., None]) -> Callable[..., None]:
    own = set(inspect.signature(init).parameters)
    rules = _affine_rules(own, no_bias, needs_scale, needs_bias, own_init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
      who = type(self).__name__
      for name in sorted(set(kwargs) & set(rules)):
        rule, value = rules[name], kwargs.pop(name)
        if not rule.accepts(value):
          shown = f"{name}={value!r}" if rule.show_value else name
          raise ValueError(
            f"{who}: {shown} is not available: {rule.reason(who)}"
          )
      init(self, *args, **kwargs)

    setattr(wrapper, AFFINE_REFUSALS_ATTR, rules)
    return wrapper

  return decorate


def affine_refusals(cls: type) -> dict[str, str]:
  """The flax keywords ``cls`` refuses by `paper_affine`: spelling -> why.

  Empty for a class whose ``__init__`` is not decorated (it takes every
  flax keyword it declares). Conditional refusals an ``__init__`` makes
  itself (``CLSNorm(kind="rms", use_bias=True)``) are not listed.

  Examples:
    >>> from jaxnorm import nn
    >>> refusals = affine_refusals(nn.ScaleNorm)
    >>> print(*refusals, sep=", ")
    use_scale=False, use_bias=True, bias_init, promote_dtype (not None)
    >>> print(refusals["use_bias=True"])
    ScaleNorm has no bias (y = g x / ||x|| has one scalar gain and no shift)
  """
  rules = getattr(cls.__init__, AFFINE_REFUSALS_ATTR, {})
  return {r.refused: r.reason(cls.__name__) for r in rules.values()}


class OwnedParam(NamedTuple):
  """An `nnx.Param` of a model with the module that owns it."""

  path: tuple[Any, ...]  # Its path in ``nnx.state(model, nnx.Param)``.
  owner_path: tuple[Any, ...]  # Path of the innermost module above it.
  owner: nnx.Module
  name: str  # The owner's attribute (a list attribute names its items).
  value: jax.Array  # A `jax.ShapeDtypeStruct` in an abstract model.


def owned_params(model: nnx.Module) -> list[OwnedParam]:
  """Every `nnx.Param` of ``model`` with its owner, in state order.

  The order is that of ``nnx.to_flat_state(nnx.state(model, nnx.Param))``;
  an abstract model (`nnx.eval_shape`) gives its shape structs as values.
  """
  modules = {
    tuple(path): node
    for path, node in nnx.iter_graph(model)
    if isinstance(node, nnx.Module)
  }
  owned = []
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    path = tuple(path)
    depth = max(i for i in range(len(path)) if path[:i] in modules)
    owner_path = path[:depth]
    owned.append(
      OwnedParam(
        path,
        owner_path,
        modules[owner_path],
        str(path[depth]),
        var.get_value(),
      )
    )
  return owned
