"""What every attention core shares: head sizes, projections, option checks.

A core is the part of multi-head attention between the projections and the
output projection: it receives the (pre-normed) block input ``x (B, T, D)``
and the projected, QK-normed, rotated ``q (B, T, N, H)``, ``k, v (B, T, K,
H)`` and returns ``(B, T, N, H)``; with cross-attention (``inputs_k``) the
keys and values have their own length ``S``, and in a decode step they are
the whole cache. It owns the parameters and state its
paper adds (sink logits, gates, running estimates) and calls one pure
function of `jaxnorm.attention`. `FunctionCore` is the parameter-free core
that only forwards to its pure function.

Examples:
  >>> dims = HeadDims(num_features=8, num_heads=4, num_kv_heads=2, head_dim=2)
  >>> dims.num_heads // dims.num_kv_heads  # query heads per key/value head
  2
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks
from jaxnorm.attention import _core
from jaxnorm.nn import _param

# Arguments a core fills in itself; never user options.
_DATA_ARGS = frozenset({"query", "key", "value", "bias", "mask", "is_causal"})

# Named by the cores without a causal form when refusing is_causal=True.
CAUSAL_ALTERNATIVES = "softmax, sink, gated or causal_linear"


class HeadDims(NamedTuple):
  """The sizes a core is built for.

  Attributes:
    num_features: model width ``D`` (the block input ``x``).
    num_heads: query heads ``N``.
    num_kv_heads: key/value heads ``K`` (``N % K == 0``).
    head_dim: per-head width ``H``.
  """

  num_features: int
  num_heads: int
  num_kv_heads: int
  head_dim: int


def dense_param(
  rngs: nnx.Rngs,
  shape: tuple[int, ...],
  in_axis: int | tuple[int, ...],
  out_axis: int | tuple[int, ...],
  dtype: Any,
  names: tuple[str | None, ...],
) -> nnx.Param:
  """A projection kernel with LeCun-normal (truncated, fan-in) init."""
  init = jax.nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis
  )
  return _param.param(init(rngs.params(), shape, dtype), names)


def check_options(
  who: str,
  fn: Callable[..., Any],
  options: Mapping[str, Any],
  owned: tuple[str, ...] = (),
) -> tuple[tuple[str, Any], ...]:
  """Checks that ``options`` are keyword options of the pure function ``fn``.

  Args:
    who: the core's name, for the message.
    fn: the pure attention function the core calls.
    options: user options forwarded to ``fn``.
    owned: arguments of ``fn`` the core supplies itself (its parameters).

  Returns:
    ``options`` as sorted ``(name, value)`` pairs: hashable, so a module
    holding them keeps a hashable graph definition (`nnx.jit`).

  Raises:
    ValueError: for an option ``fn`` does not take, or one the core owns;
      the message lists the valid options.
  """
  params = inspect.signature(fn).parameters
  valid = sorted(
    n
    for n, p in params.items()
    if p.kind == inspect.Parameter.KEYWORD_ONLY
    and n not in _DATA_ARGS
    and n not in owned
  )
  bad = sorted(set(options) - set(valid))
  if bad:
    raise ValueError(
      f"{who}: unknown option(s) {', '.join(map(repr, bad))} for "
      f"{fn.__name__}; valid options are {', '.join(valid) or 'none'}"
    )
  return tuple(sorted(options.items()))


def refuse_mask(who: str, mask: Any, bias: Any) -> None:
  """Raises when a core without masking receives a mask or a bias."""
  if mask is not None or bias is not None:
    raise ValueError(
      f"{who}: this attention takes no mask or bias; got "
      f"mask={'set' if mask is not None else None}, "
      f"bias={'set' if bias is not None else None}"
    )


def require_full_heads(who: str, dims: HeadDims, why: str) -> None:
  """Raises unless ``num_kv_heads == num_heads``."""
  if dims.num_kv_heads != dims.num_heads:
    raise ValueError(
      f"{who}: {why}, so num_kv_heads must equal num_heads="
      f"{dims.num_heads}, got num_kv_heads={dims.num_kv_heads}"
    )


def check_odd(who: str, name: str, value: Any) -> None:
  """Raises unless ``value`` is a positive odd int (a SAME conv size)."""
  _checks.check_positive_int(who, name, value)
  if value % 2 == 0:
    raise ValueError(f"{who}: {name} must be odd, got {name}={value}")


def refuse_causal(who: str, is_causal: bool, alternatives: str) -> None:
  """Raises when a core without a causal form is asked to be causal."""
  if is_causal:
    raise ValueError(
      f"{who}: this attention has no causal form (its normalizer sums over "
      f"every key, future ones included); use is_causal=False or a causal "
      f"attention such as {alternatives}"
    )


class AttentionCore(nnx.Module):
  """Base class of the cores (see the module docstring for the contract).

  A subclass is built as ``Core(dims, *, is_causal, param_dtype, rngs,
  **options)`` and called as ``core(x, q, k, v, *, mask, bias)``; a core
  with ``supports_cache`` also takes ``cached=True`` (`call_structure`).

  Attributes:
    ties_keys: class-level capability: the paper has no key projection and
      uses the queries as keys (SOFT); `MultiHeadAttention` then builds no
      key kernel, key bias or key norm and passes ``k=None``.
    supports_cache: class-level capability: the core runs a decode step on
      a key/value cache (``init_cache`` / ``decode=True`` of
      `MultiHeadAttention`): each query's output depends on the keys it may
      see and on its own input only, so feeding the cache with a mask gives
      the full causal forward.

  Examples:
    >>> from jaxnorm.nn.attention import ATTENTIONS
    >>> cls = ATTENTIONS["sink"].core  # a registered core class
    >>> issubclass(cls, AttentionCore), cls.supports_cache, cls.ties_keys
    (True, True, False)
    >>> core = cls(HeadDims(8, 2, 2, 4), is_causal=True, rngs=nnx.Rngs(0))
    >>> q = jnp.zeros((1, 3, 2, 4), jnp.float32)  # (B, T, N, H)
    >>> core(None, q, q, q).shape  # x, q, k, v -> (B, T, N, H)
    (1, 3, 2, 4)
  """

  ties_keys: ClassVar[bool] = False
  supports_cache: ClassVar[bool] = False

  def cross_refusal(self) -> str | None:
    """Why the core cannot attend to other inputs (``inputs_k``), or None."""
    if self.ties_keys:
      return "it ties keys to queries (no key projection)"
    return None

  def cache_refusal(self) -> str | None:
    """Why the core cannot decode from a cache now, or None."""
    if not self.supports_cache:
      return (
        "it has no decode cache (the softmax-family cores have one: their "
        "output is a masked softmax over cached keys and values)"
      )
    return None

  def local_window(self) -> tuple[int, int] | None:
    """The ``local_window_size`` option as ``(left, right)``, or None."""
    options = dict(getattr(self, "options", ()))
    who = type(self).__name__
    return _core.window(who, options.get("local_window_size"))


def call_structure(
  core: AttentionCore, cached: bool
) -> tuple[bool, dict[str, Any]]:
  """``is_causal`` and the pure function's options for one core call.

  A cached call (a decode step) gets the causal and local-window structure
  from its mask, built in cache coordinates by `MultiHeadAttention`, so the
  core then applies neither ``is_causal`` nor ``local_window_size``.
  """
  options = dict(core.options)
  if not cached:
    return core.is_causal, options
  options.pop("local_window_size", None)
  return False, options


def cast_param(p: nnx.Variable, like: jax.Array) -> jax.Array:
  """A parameter's value in ``like``'s dtype."""
  return jnp.asarray(p[...]).astype(like.dtype)


class FunctionCore(AttentionCore):
  """A core without parameters: forwards to one pure function.

  Subclasses set ``function`` (the pure attention function), ``masked``
  (it takes ``bias``/``mask``/``is_causal``) and ``causal_form`` (it has a
  causal form; when False, ``is_causal=True`` is refused).
  """

  function: ClassVar[Callable[..., jax.Array]]
  masked: ClassVar[bool] = True
  causal_form: ClassVar[bool] = True

  def __init__(
    self,
    dims: HeadDims,
    *,
    is_causal: bool = False,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
    **options: Any,
  ):
    del param_dtype, rngs  # No parameters.
    who = type(self).__name__
    if not self.causal_form:
      refuse_causal(who, is_causal, CAUSAL_ALTERNATIVES)
    self.dims, self.is_causal = dims, is_causal
    self.options = check_options(who, type(self).function, options)

  def __call__(
    self, x, q, k, v, *, mask=None, bias=None, cached=False
  ) -> jax.Array:
    """``(B, T, N, H)`` output of the pure function on ``q, k, v``."""
    del x
    fn = type(self).function
    if not self.masked:
      refuse_mask(type(self).__name__, mask, bias)
      return fn(q, k, v, **dict(self.options))
    is_causal, options = call_structure(self, cached)
    return fn(q, k, v, bias, mask, is_causal=is_causal, **options)
