"""Shared assertions: function vs oracle, module vs function, jit vs eager,
and gradient checks. Every tolerance is explicit at the call site."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np


def as_float64(a: Any) -> np.ndarray:
  """``a`` in NumPy float64, or complex128 when it is complex."""
  a = np.asarray(a)
  return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def assert_close(
  actual: Any, expected: Any, *, atol: float, rtol: float = 0.0
) -> None:
  """Trees equal within tolerance, compared in float64 (complex128) NumPy."""
  chex.assert_trees_all_equal_structs(actual, expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(
      as_float64(a), as_float64(e), atol=atol, rtol=rtol
    )


def assert_matches_oracle(
  fn: Callable[..., Any],
  oracle: Callable[..., Any],
  *args: Any,
  atol: float,
  rtol: float = 0.0,
) -> None:
  """``fn(*args)`` equals an independent implementation ``oracle(*args)``."""
  assert_close(fn(*args), oracle(*args), atol=atol, rtol=rtol)


def assert_vjp_matches(
  fn: Callable[..., Any],
  oracle: Callable[..., Any],
  args: Sequence[Any],
  *,
  key: jax.Array,
  atol: float,
  rtol: float = 0.0,
) -> None:
  """Forward values and VJPs (random cotangent) of two functions agree.

  ``args`` are the differentiable inputs of both callables; the cotangent is a
  standard normal draw shaped like the output.
  """
  out, vjp_fn = jax.vjp(fn, *args)
  out_ref, vjp_ref = jax.vjp(oracle, *args)
  assert_close(out, out_ref, atol=atol, rtol=rtol)
  leaves, treedef = jax.tree.flatten(out)
  keys = jax.random.split(key, len(leaves))
  cot = jax.tree.unflatten(
    treedef,
    [
      jax.random.normal(k, leaf.shape, jnp.float32).astype(leaf.dtype)
      for k, leaf in zip(keys, leaves)
    ],
  )
  assert_close(vjp_fn(cot), vjp_ref(cot), atol=atol, rtol=rtol)


def assert_jit_matches_eager(
  fn: Callable[..., Any], *args: Any, atol: float = 1e-6, **kwargs: Any
) -> None:
  """``jax.jit(fn)`` gives the eager result (static kwargs closed over)."""
  eager = fn(*args, **kwargs)
  jitted = jax.jit(lambda *a: fn(*a, **kwargs))(*args)
  assert_close(jitted, eager, atol=atol)


def assert_grads_numerical(
  fn: Callable[..., Any],
  args: Sequence[Any],
  *,
  atol: float = 1e-2,
  rtol: float = 1e-2,
  eps: float = 1e-3,
) -> None:
  """Reverse-mode gradients agree with finite differences (float32 inputs)."""
  jax.test_util.check_grads(
    fn, tuple(args), order=1, modes=("rev",), atol=atol, rtol=rtol, eps=eps
  )


def all_finite(tree: Any) -> bool:
  """True when every leaf of ``tree`` (real or complex) is free of NaN and
  Inf; a complex leaf needs both parts finite."""
  return all(
    bool(np.all(np.isfinite(as_float64(leaf))))
    for leaf in jax.tree.leaves(tree)
  )


def as_dtype_kind(x: jax.Array, dtype_kind: str) -> jax.Array:
  """A real test input for a part of ``dtype_kind`` (its spec's field).

  ``"real"``: ``x`` unchanged. ``"complex"``: ``x + i flip(x)`` (the
  features reversed along the last axis; ``x + i x`` for a scalar),
  complex64 (complex128 for
  float64 ``x``): an all-zero example or token stays all zero, a NaN or a
  changed token stays in its example and token, and both parts vary.
  """
  if dtype_kind == "real":
    return x
  real = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
  x = x.astype(real)
  return jax.lax.complex(x, jnp.flip(x, -1) if x.ndim else x)


def real_readout(y: jax.Array) -> jax.Array:
  """A real array of ``y``'s shape for a linear loss: ``y`` if real, else
  ``Re y + Im y`` (both parts reach the loss and its gradients)."""
  if jnp.iscomplexobj(y):
    return jnp.real(y) + jnp.imag(y)
  return y
