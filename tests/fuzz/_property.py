"""The public pure functions and the property every one of them must keep.

For each draw and value kind, a function either returns finite outputs
(every floating or complex leaf) whose documented array has the documented
shape and dtype, or raises a `ValueError` / `TypeError` from jaxnorm's own
code (not from inside jax) whose message names one of the function's
arguments and says what it got. A NaN, an Inf, a wrong shape or dtype, a
warning (the suite turns warnings into errors) or a bare jax error fails.

Hypothesis draws the compiled cases (`check_function`): float32, bfloat16,
float16 (complex64 for complex functions) over ranks, axes and one-element
axes, each draw run under `jax.jit` once for all value kinds. int32,
float64 and complex128 inputs decide their outcome at trace time, so every
function is checked on them by tracing only (`check_traced`).
"""

from __future__ import annotations

import importlib
import inspect
import math
import pathlib
import re
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import hypothesis
import jax
import numpy as np
from hypothesis import strategies as st

import jaxnorm
from tests.fuzz import _builders, _cases

PACKAGES = (
  "norms",
  "fused_norms",
  "activations",
  "attention",
  "residual",
  "rl",
  "quant",
  "looped",
  "analysis",
  "graph",
  "depth_metrics",
  "cplx",
)

_PACKAGE = pathlib.Path(jaxnorm.__file__).resolve().parent

_TRACED = ("int32", "float64", "complex128")

# Each example costs one XLA:CPU compile (about 0.1 s) for all six value
# kinds: two per function keep the fuzz of ~175 functions near 20 s
# single-process (CI's budget); each further example adds about 12 s.
SETTINGS = hypothesis.settings(
  max_examples=2,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=list(hypothesis.HealthCheck),
)


def public_functions(package: str) -> dict[str, Callable[..., Any]]:
  """``"<package>.<name>"`` -> function, for the functions in ``__all__``.

  A module without ``__all__`` contributes the functions it defines whose
  names do not start with ``_``.
  """
  module = importlib.import_module(f"jaxnorm.{package}")
  names = getattr(module, "__all__", None)
  if names is None:
    names = [
      n
      for n, v in vars(module).items()
      if not n.startswith("_")
      and getattr(v, "__module__", None) == module.__name__
    ]
  return {
    f"{package}.{n}": getattr(module, n)
    for n in names
    if inspect.isfunction(getattr(module, n))
  }


def all_public_functions() -> dict[str, Callable[..., Any]]:
  """`public_functions` of every pure-function package."""
  out = {}
  for package in PACKAGES:
    out.update(public_functions(package))
  return out


def default_draw(spec: _cases.Spec, dtype: str | None = None) -> _cases.Draw:
  """The plainest draw: first rank, last axis, no 1-axis, first dtype."""
  return _cases.Draw(spec.ranks[0], -1, dtype or spec.dtypes[0], False)


def traced_dtypes(spec: _cases.Spec) -> tuple[str, ...]:
  """The dtypes checked by tracing only: the plain one, int32 and 64-bit.

  Their outcome is decided at trace time (a refusal of integers, the
  dtype of a 64-bit NumPy input), so they cost no compile.
  """
  return tuple(
    dict.fromkeys(
      (spec.dtypes[0],) + tuple(t for t in spec.dtypes if t in _TRACED)
    )
  )


@st.composite
def draws(draw, spec: _cases.Spec, name: str) -> _cases.Draw:
  """A hypothesis strategy of compiled `Draw`s within ``spec``.

  Derandomized hypothesis starts every parametrized test from the same
  choices, so the ranks, dtypes and the one-element flag are rotated by a
  hash of ``name``: the first (simplest) draws differ between functions.
  """
  salt = zlib.crc32(name.encode())
  rank = draw(st.sampled_from(_rotate(spec.ranks, salt)))
  axis = draw(st.integers(-rank, rank - 1)) if spec.axis else -1
  dtypes = [t for t in spec.dtypes if t not in _TRACED] or [spec.dtypes[0]]
  dtype = draw(st.sampled_from(_rotate(dtypes, salt // 5)))
  one = draw(st.booleans()) != bool(salt & 1)
  return _cases.Draw(rank, axis, dtype, one)


def _rotate(items, k: int) -> list:
  items = list(items)
  k %= len(items)
  return items[k:] + items[:k]


def split(case: _cases.Case):
  """The array leaves of a case's arguments and a rebuilder of the call."""
  leaves, treedef = jax.tree.flatten((case.args, case.kwargs))
  where = [i for i, v in enumerate(leaves) if _is_array(v)]

  def rebuild(*arrays):
    full = list(leaves)
    for i, a in zip(where, arrays):
      full[i] = a
    return jax.tree.unflatten(treedef, full)

  return [leaves[i] for i in where], rebuild


def traced(fn: Callable[..., Any], case: _cases.Case):
  """``(call, arrays)``: ``call(*arrays)`` is ``fn`` on the case's args."""
  arrays, rebuild = split(case)

  def call(*xs):
    args, kwargs = rebuild(*xs)
    return fn(*args, **kwargs)

  return call, arrays


def check_function(name: str, draw: _cases.Draw) -> None:
  """Runs every value kind of ``draw`` through ``name``, compiled, and checks.

  The kinds share one compile (their arrays differ in values only).
  """
  fn = all_public_functions()[name]
  spec = _builders.BUILDERS[name]
  for kind in spec.kinds:
    case = spec.build(draw, _cases.Fill(draw, kind))
    call, arrays = traced(fn, case)
    try:
      out = jitted(name, draw, call)(*arrays) if arrays else call()
      if case.then is not None:
        out = out(*case.then)
    except (ValueError, TypeError) as e:
      check_error(fn, e)
      return
    check_output(name, kind, draw, case, out)


def check_traced(name: str, dtype: str) -> bool:
  """Traces ``name`` on the plain draw of ``dtype``; checks shape and dtype.

  No compile: `jax.eval_shape` with the arrays closed over, so a NumPy
  float64 or complex128 input reaches the function as such (a jit argument
  would arrive as 32-bit), as a user with x64 disabled passes it.

  Returns:
    Whether the call was accepted (False: it raised a well-formed error).
  """
  fn = all_public_functions()[name]
  spec = _builders.BUILDERS[name]
  draw = default_draw(spec, dtype)
  case = spec.build(draw, _cases.Fill(draw, "normal"))
  call, arrays = traced(fn, case)

  def run():
    out = call(*arrays)
    return out if case.then is None else out(*case.then)

  try:
    out = jax.eval_shape(run) if arrays or case.then else run()
  except (ValueError, TypeError) as e:
    check_error(fn, e)
    return False
  check_output(name, "traced", draw, case, out)
  return True


# One jitted call per function and draw, shared by the value kinds of the
# draw (a builder's non-array arguments depend on the draw only).
_COMPILED: dict[tuple[str, _cases.Draw], Callable[..., Any]] = {}


def jitted(name, draw, call):
  """The cached `jax.jit` of ``call``, the call of ``name`` on ``draw``."""
  key = (name, draw)
  if key not in _COMPILED:
    _COMPILED[key] = jax.jit(call)
  return _COMPILED[key]


def check_output(name, kind, draw, case, out) -> None:
  """Finite leaves; the documented array has the documented shape, dtype.

  Traced outputs (`jax.ShapeDtypeStruct` leaves) have no values to check.
  """
  where = f"{name} on {draw} with {kind} values"
  for leaf in jax.tree.leaves(out):
    assert _finite(leaf), f"{where}: non-finite output {leaf}"
  y = out if case.pick is None else case.pick(out)
  if case.shape is not None:
    assert np.shape(y) == tuple(case.shape), (
      f"{where}: shape {np.shape(y)}, documented {case.shape}"
    )
  if case.dtype is not None:
    assert np.dtype(y.dtype) == np.dtype(case.dtype), (
      f"{where}: dtype {y.dtype}, documented {np.dtype(case.dtype)}"
    )


def check_error(fn: Callable[..., Any], e: Exception) -> None:
  """A jaxnorm-raised error naming an argument and what arrived."""
  frames = traceback.extract_tb(e.__traceback__)
  last = frames[-1] if frames else None
  origin = pathlib.Path(last.filename if last else "").resolve()
  message = str(e)
  # jax drops its own frames from tracebacks, so a jax error can end on the
  # jaxnorm line that called jax: the last frame must be a raise statement.
  raised = last is not None and (last.line or "").lstrip().startswith("raise")
  assert _PACKAGE in origin.parents and raised, (
    f"{fn.__name__}: bare {type(e).__name__} from {origin}:"
    f"{last.lineno if last else '?'}: {message}"
  )
  names = inspect.signature(fn).parameters
  assert any(re.search(rf"\b{re.escape(n)}\b", message) for n in names), (
    f"{fn.__name__}: message names no argument of {list(names)}: {message}"
  )
  assert re.search(r"\bgot\b|\w=", message), (
    f"{fn.__name__}: message says not what arrived: {message}"
  )


def _is_array(v) -> bool:
  return isinstance(v, (np.ndarray, jax.Array))


def _finite(leaf) -> bool:
  if isinstance(leaf, (bool, int, str)) or leaf is None:
    return True
  if isinstance(leaf, float):
    return math.isfinite(leaf)
  if isinstance(leaf, complex):
    return math.isfinite(leaf.real) and math.isfinite(leaf.imag)
  if (
    isinstance(leaf, jax.ShapeDtypeStruct)
    or not hasattr(leaf, "dtype")
    or jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
  ):
    return True
  a = np.asarray(leaf)
  if a.dtype.kind not in "fc" and a.dtype != np.dtype("bfloat16"):
    return True
  return bool(np.all(np.isfinite(a.astype(np.complex128))))
