"""What a fuzz builder receives (`Draw`, `Fill`) and returns (`Case`).

A hypothesis draw fixes the structure of one call: the rank, the axis, the
input dtype and whether the reduced axis has one element. The value kind
(`KINDS`) only changes values, so every kind of one draw reuses one compiled
program: the harness (`tests.fuzz._property`) runs them all per draw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

FLOATS = ("float32", "bfloat16", "float16", "float64")
DTYPES = (*FLOATS, "int32")
COMPLEX = ("complex64", "complex128", "float32", "int32")
KINDS = ("normal", "zeros", "constant", "huge", "extreme", "tiny")
# The kinds whose squares fit in float32, for functions of products of two
# fuzzed values (attention logits q k, second moments and running variances,
# |z|^2): their true values at 1e30 are past float32 by definition.
SQUARABLE = ("normal", "zeros", "constant", "huge", "tiny")
# Kinds whose reciprocals stay in range: ``1/(S*W)`` of 1e-30 inputs is
# 1e60, past float32, and ``1/sqrt(a*b)`` of 1e-4 past float16 (SALU maps).
RECIPROCAL = ("normal", "zeros", "constant", "huge")
# Kinds of moderate magnitude: k3 and the policy ratio exponentiate
# differences of log-probabilities (e^1e4 overflows by definition), and
# graph_attention returns its edge logits q k e (1e12 for 1e4 inputs).
BOUNDED = ("normal", "zeros", "constant", "tiny")
# Functions of Python scalars or shapes: one dtype, one value kind.
STATIC = {"dtypes": ("float32",), "kinds": ("normal",)}
# Ranks of inputs with a batch axis, and of images ``(n, *spatial, c)``.
BATCHED = (2, 3, 4)
IMAGES = (3, 4)

# Magnitudes of the "huge", "extreme" and "tiny" kinds, within each range.
_HUGE = {"float16": 1e4}
_EXTREME = {"float16": 1e4}
_TINY = {"float16": 1e-4}


def np_dtype(name: str) -> np.dtype:
  """The NumPy dtype of a dtype name (bfloat16 through ml_dtypes)."""
  return np.dtype(jnp.bfloat16) if name == "bfloat16" else np.dtype(name)


def canonical(name: str) -> np.dtype:
  """The dtype JAX computes a ``name`` input in (x64 is disabled)."""
  return np.dtype(
    {"float64": "float32", "complex128": "complex64"}.get(
      name, np_dtype(name).name
    )
  )


@dataclasses.dataclass(frozen=True)
class Draw:
  """The structure of one fuzzed call.

  Attributes:
    rank: rank of the primary input.
    axis: the axis the function reduces over, in ``[-rank, rank)`` (``-1``
      for functions without ``axis``).
    dtype: dtype name of the primary (data) inputs.
    one: whether the reduced axis has a single element.
  """

  rank: int
  axis: int
  dtype: str
  one: bool

  def shape(self, last: int = 4) -> tuple[int, ...]:
    """A ``rank``-d shape ending in ``last``, the reduced axis 1 if ``one``."""
    dims = [2, 3, 2, last][-self.rank :]
    if self.one:
      dims[self.axis] = 1
    return tuple(dims)

  @property
  def wide(self) -> bool:
    """A 64-bit draw: NumPy input that JAX computes in 32 bits."""
    return self.dtype in ("float64", "complex128")

  @property
  def out(self) -> np.dtype:
    """The output dtype of a function that keeps its input's dtype.

    float64 and complex128 arrive as float32 / complex64 (x64 is off); an
    accepted int32 input computes (and returns) float32.
    """
    return (
      np.dtype("float32") if self.dtype == "int32" else canonical(self.dtype)
    )

  @property
  def compute(self) -> np.dtype:
    """``promote_types(dtype, float32)``: the dtype of a statistic."""
    out = self.out
    return out if out.kind == "c" else np.dtype("float32")


class Fill:
  """Arrays for one draw and one value kind.

  `data` follows the kind (the fuzzed inputs); `param`, `normal` and `uniform`
  do not (weights and secondary inputs stay ordinary).
  """

  def __init__(self, draw: Draw, kind: str):
    self.draw = draw
    self.kind = kind
    self.rng = np.random.default_rng(0)

  def data(
    self, shape: tuple[int, ...], dtype: str | None = None, *, axis: int = -1
  ) -> np.ndarray:
    """Values of this kind; ``"constant"`` is constant along ``axis``."""
    name = dtype or self.draw.dtype
    if self.kind == "constant" and shape:
      base = list(shape)
      base[axis] = 1
      z = np.broadcast_to(self._normal(tuple(base), name), shape) + 0.5
    else:
      z = self._normal(shape, name)
    mag = {
      "normal": 1.0,
      "zeros": 0.0,
      "constant": 1.0,
      "huge": _HUGE.get(name, 1e4),
      "extreme": _EXTREME.get(name, 1e30),
      "tiny": _TINY.get(name, 1e-30),
    }[self.kind]
    return self._cast(z * mag, name)

  def normal(self, shape: tuple[int, ...], dtype: str = "float32"):
    """Standard normal values whatever the kind."""
    return self._cast(self._normal(shape, dtype), dtype)

  def param(self, shape: tuple[int, ...], dtype: str = "float32"):
    """A positive gain-like parameter in ``[0.5, 1.5)``."""
    return self._cast(self.rng.uniform(0.5, 1.5, shape), dtype)

  def uniform(self, shape, low=0.0, high=1.0, dtype: str = "float32"):
    """Uniform values in ``[low, high)`` whatever the kind."""
    return self._cast(self.rng.uniform(low, high, shape), dtype)

  def mask(self, shape: tuple[int, ...]) -> np.ndarray:
    """A boolean mask, True almost everywhere (one False per row)."""
    m = np.ones(shape, bool)
    if shape and shape[-1] > 1:
      m[..., -1] = False
    return m

  def _normal(self, shape, name):
    z = self.rng.standard_normal(shape)
    if name.startswith("complex"):
      z = z + 1j * self.rng.standard_normal(shape)
    return z

  @staticmethod
  def _cast(z, name):
    dtype = np_dtype(name)
    if dtype.kind == "i":
      return np.clip(np.round(3 * np.real(z)), -(2**20), 2**20).astype(dtype)
    if dtype.kind != "c":
      z = np.real(z)
      if dtype.itemsize == 2:
        # Half of float16's max, so a sum or rotation of two stays finite.
        z = np.clip(z, -3e4, 3e4)
    return np.asarray(z).astype(dtype)


class Case(NamedTuple):
  """One call and what its documented output looks like.

  Attributes:
    args: positional arguments.
    kwargs: keyword arguments.
    shape: shape of ``pick(output)``; ``None`` leaves it unchecked.
    dtype: dtype of ``pick(output)``; ``None`` leaves it unchecked.
    pick: selects the output array whose shape and dtype are documented
      (``None``: the output itself).
    then: for factories, the arguments their result is called with.
  """

  args: tuple
  kwargs: dict
  shape: tuple[int, ...] | None
  dtype: Any
  pick: Callable[[Any], Any] | None = None
  then: tuple | None = None


def case(*args, expect=None, pick=None, then=None, **kwargs) -> Case:
  """A `Case` from a call's arguments; ``expect=(shape, dtype)``."""
  shape, dtype = expect if expect is not None else (None, None)
  return Case(args, kwargs, shape, dtype, pick, then)


def first(out):
  """The first output of a ``(y, ...)`` tuple."""
  return out[0]


@dataclasses.dataclass(frozen=True)
class Spec:
  """How to fuzz one function.

  Attributes:
    build: ``(Draw, Fill) -> Case``.
    ranks: the ranks of the primary input it takes.
    axis: whether it takes an ``axis`` (then the draw picks one).
    dtypes: input dtypes to draw.
    kinds: value kinds to run (documented domains narrow it).
  """

  build: Callable[[Draw, Fill], Case]
  ranks: tuple[int, ...] = (1, 2, 3, 4)
  axis: bool = False
  dtypes: tuple[str, ...] = DTYPES
  kinds: tuple[str, ...] = KINDS


# ---------------------------------------------------------------------------
# Helpers shared by the builders of several families.


def x_axis(d: Draw, f: Fill):
  """``x`` of the draw's shape and the length of its drawn axis."""
  x = f.data(d.shape(), axis=d.axis)
  return x, x.shape[d.axis]


def scalars(*args, **kwargs):
  """A builder of one fixed call (Python scalars and shapes only)."""

  def build(d, f):
    del d, f
    return case(*args, **kwargs)

  return build


def positive(f: Fill, shape, dtype=None):
  """Positive values of the kind (zeros become ones): a domain of ``> 0``."""
  z = np.abs(f.data(shape, dtype))
  return np.where(z > 0, z, np.ones_like(z))


def qkv(d, f, *, n=2, k=1, h=4, hv=4, t=3, s=3):
  """Query, key and value ``(B, T, N, H)``, ``(B, S, K, H)``, ``(B, S, K, Hv)``.

  ``d.one`` gives one key (``S = 1``); rank 3 drops the batch axis.
  """
  s = 1 if d.one else s
  lead = (2,) if d.rank != 3 else ()
  return (
    f.data(lead + (t, n, h)),
    f.data(lead + (s, k, h)),
    f.data(lead + (s, k, hv)),
  )


def attention_out(q, v, d):
  """The documented ``(B, T, N, Hv)`` output in ``query.dtype``."""
  return (q.shape[:-1] + v.shape[-1:], d.out)


def labels(f, shape, c=3):
  return np.round(f.uniform(shape, 0, c - 1)).astype(np.int32)
