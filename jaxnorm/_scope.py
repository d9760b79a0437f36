"""`scoped`: every public pure function runs under a `jax.named_scope`.

The scope is the function's name (``rms_norm``, ``seed_norm``,
``born_attention``), so a profile (TensorBoard, Perfetto, XProf) or an HLO
dump names each op after the paper's function that emitted it, and nested
calls read as a path (``add_rms_norm/rms_norm/...``).

Rule: every callable listed in the ``__all__`` of a pure-function package
(`jaxnorm.norms`, `jaxnorm.fused_norms`, `jaxnorm.activations`,
`jaxnorm.attention`, `jaxnorm.residual`, `jaxnorm.rl`, `jaxnorm.quant`,
`jaxnorm.looped`, `jaxnorm.analysis`, `jaxnorm.graph`,
`jaxnorm.depth_metrics`, `jaxnorm.cplx`) is decorated, with no exception:
state initializers (``init_*_state``), scalar schedules (`deepnorm_alpha`)
and factories (`as_flax_attention_fn`) too, so the rule is checked
mechanically (tests/test_named_scope.py). Private helpers, building blocks
left out of ``__all__`` and `jax.custom_vjp` cores are not decorated: the
public function that calls them is, so their ops sit inside its scope and
``defvjp`` still applies to the undecorated core. `scoped` goes outermost,
above any other decorator.

The optax transforms of `jaxnorm.optim` are factories whose ops run later,
in the returned ``init`` and ``update``: their factories are decorated with
`jaxnorm.optim._common.scoped_transform`, which runs both under the
factory's name and sets the same ``SCOPE_ATTR``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax

_F = TypeVar("_F", bound=Callable[..., Any])

SCOPE_ATTR = "__jaxnorm_scope__"
"""Attribute `scoped` sets on the wrapper: the scope's name."""


def scoped(fn: _F) -> _F:
  """Runs ``fn`` under ``jax.named_scope(fn.__name__)``.

  The wrapper keeps ``fn``'s name, docstring and signature
  (`functools.wraps`; `inspect.signature` follows ``__wrapped__``), so
  `jax.jit` with ``static_argnames`` and docs/make_api.py see ``fn``'s own
  arguments. It carries the scope name as ``SCOPE_ATTR``.
  """
  name = fn.__name__

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    with jax.named_scope(name):
      return fn(*args, **kwargs)

  setattr(wrapper, SCOPE_ATTR, name)
  return wrapper  # type: ignore[return-value]
