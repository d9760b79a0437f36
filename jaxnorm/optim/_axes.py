"""Matrix axes: which axes of a parameter are inputs, outputs and batch.

Matrix optimizers (AdamP's channel view, Conda's rotation, RMNP's row norms,
NaP's per-unit norms) need to know which axis of a weight is the input
("fan-in") and which the output ("fan-out"). Flax kernels are ``(in, out)``
(Dense) and ``(kh, kw, in, out)`` (Conv); torch weights are ``(out, in)`` and
``(out, in, kh, kw)``. Nothing here guesses from ``ndim`` beyond the documented
default; the axes are named with `MatrixAxes`, in the spirit of optax's
``MuonDimensionNumbers``.

Vocabulary used by every optimizer in this package, for a matrix viewed as
``(fan_in, fan_out)`` (the Flax layout):

* an **output unit** (torch: a *row* of ``weight``, AdamP: a *channel*) is one
  index along the output axes; its weights are a vector over the reduction
  (input) axes;
* the **reduction axes** are summed over by ``x @ W``;
* **batch axes** (neither reduction nor output, e.g. a stacked-layer axis) index
  independent matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

AxesSpec = Any  # MatrixAxes | None | pytree of those | Callable[[tree], tree]


class MatrixAxes(NamedTuple):
  """Names the output, reduction (input) and batch axes of a weight.

  Attributes:
    output: the output axis or axes; one output unit (a torch "row", an AdamP
      "channel") per index. Default ``-1``, the Flax convention.
    reduction: the input (fan-in) axis or axes. ``None`` (default) means every
      axis not in ``output``, so there are no batch axes. Axes in neither field
      are batch axes: each batch index is an independent matrix.

  Examples:
    * Flax ``Dense`` kernel ``(in, out)`` or ``Conv`` kernel
      ``(kh, kw, in, out)``: ``MatrixAxes()``.
    * torch ``Linear.weight`` ``(out, in)`` or ``Conv2d.weight``
      ``(out, in, kh, kw)``: ``MatrixAxes(output=0)``.
    * stacked layers ``(layers, in, out)``: ``MatrixAxes(output=2,
      reduction=1)``.
    * attention query kernel ``(embed, heads, head_dim)``:
      ``MatrixAxes(output=(1, 2))``.
  """

  output: int | tuple[int, ...] = -1
  reduction: int | tuple[int, ...] | None = None


class Dims(NamedTuple):
  """`MatrixAxes` resolved against one array shape (static, hashable)."""

  shape: tuple[int, ...]
  batch: tuple[int, ...]
  reduction: tuple[int, ...]
  output: tuple[int, ...]

  @property
  def fan_in(self) -> int:
    """Product of the reduction-axis sizes."""
    return math.prod(self.shape[a] for a in self.reduction)

  @property
  def fan_out(self) -> int:
    """Product of the output-axis sizes."""
    return math.prod(self.shape[a] for a in self.output)

  @property
  def batch_shape(self) -> tuple[int, ...]:
    """Sizes of the batch axes, in axis order."""
    return tuple(self.shape[a] for a in self.batch)

  @property
  def num_batch(self) -> int:
    """Number of independent matrices."""
    return math.prod(self.batch_shape)


def _axis_tuple(
  who: str, field: str, value: Any, ndim: int, shape: tuple[int, ...]
) -> tuple[int, ...]:
  axes = (value,) if isinstance(value, int) else tuple(value)
  if not axes:
    raise ValueError(
      f"{who}: MatrixAxes.{field} must name at least one axis, "
      f"got {field}={value!r} for a leaf of shape {shape}"
    )
  out = []
  for a in axes:
    if not isinstance(a, int) or not -ndim <= a < ndim:
      raise ValueError(
        f"{who}: MatrixAxes.{field} must be axes in [-{ndim}, {ndim}) for a "
        f"leaf of shape {shape}, got {field}={value!r}"
      )
    out.append(a % ndim)
  return tuple(sorted(out))


def resolve(who: str, axes: MatrixAxes, shape: tuple[int, ...]) -> Dims:
  """Resolves ``axes`` for an array of ``shape``.

  Raises:
    ValueError: if the array has rank < 2, an axis is out of range, or the
      output and reduction axes overlap.
  """
  shape = tuple(shape)
  ndim = len(shape)
  if ndim < 2:
    raise ValueError(
      f"{who}: matrix axes need a leaf of rank >= 2, got shape {shape}; "
      f"give it MatrixAxes None (route it to the Adam branch)"
    )
  output = _axis_tuple(who, "output", axes.output, ndim, shape)
  if axes.reduction is None:
    reduction = tuple(a for a in range(ndim) if a not in output)
  else:
    reduction = _axis_tuple(who, "reduction", axes.reduction, ndim, shape)
  if set(output) & set(reduction):
    raise ValueError(
      f"{who}: MatrixAxes output and reduction axes must be disjoint, got "
      f"output={output} and reduction={reduction} for shape {shape}"
    )
  if not reduction:
    raise ValueError(
      f"{who}: MatrixAxes leaves no reduction axis for shape {shape}"
    )
  batch = tuple(a for a in range(ndim) if a not in output + reduction)
  return Dims(shape, batch, reduction, output)


def _is_spec_leaf(x: Any) -> bool:
  return (
    x is None or isinstance(x, MatrixAxes) or isinstance(x, optax.MaskedNode)
  )


def resolve_tree(
  who: str, axes: AxesSpec, tree: Any, *, default_if_matrix: bool = True
) -> Any:
  """Per-leaf `Dims` (or None) for every array leaf of ``tree``.

  Args:
    who: the calling function, for error messages.
    axes: ``None`` (default rule: `MatrixAxes()` for leaves of rank >= 2,
      ``None`` otherwise), one `MatrixAxes` for every leaf of rank >= 2
      (lower ranks get ``None``), a pytree of
      `MatrixAxes` / ``None`` that is a prefix of ``tree``, or a callable
      mapping ``tree`` to such a pytree. ``tree`` may hold `optax.MaskedNode`
      placeholders (inside `optax.partition`); they stay placeholders.
    tree: the parameters or updates.
    default_if_matrix: with ``axes=None``, whether rank >= 2 leaves get
      `MatrixAxes()`; otherwise every leaf gets ``None``.

  Returns:
    A pytree with the structure of ``tree`` whose leaves are `Dims` or None.
  """
  if axes is None:
    spec = jax.tree.map(
      lambda x: MatrixAxes() if default_if_matrix and x.ndim >= 2 else None,
      tree,
    )
  elif isinstance(axes, MatrixAxes):
    spec = jax.tree.map(lambda x: axes if x.ndim >= 2 else None, tree)
  elif callable(axes):
    spec = axes(tree)
  else:
    spec = axes

  def fill(ax, sub):
    def one(x):
      if ax is None or isinstance(ax, optax.MaskedNode):
        return _NONE
      return resolve(who, ax, x.shape)

    return jax.tree.map(one, sub)

  out = jax.tree.map(fill, spec, tree, is_leaf=_is_spec_leaf)
  return jax.tree.map(
    lambda d: None if d is _NONE else d,
    out,
    is_leaf=lambda d: d is _NONE or isinstance(d, Dims),
  )


class _NoneMarker:
  """A leaf standing in for None while mapping (None is an empty pytree)."""


_NONE = _NoneMarker()


def dims_leaves(dims_tree: Any, tree: Any) -> list[Dims | None]:
  """Flattens a `resolve_tree` result in the leaf order of ``tree``."""
  treedef = jax.tree.structure(tree)
  return treedef.flatten_up_to(dims_tree)


def matrix_labels(
  axes: AxesSpec, matrix: str, other: str
) -> Callable[[Any], Any]:
  """A label function for `optax.partition`: matrix leaves vs the rest."""

  def labels(params):
    dims = resolve_tree("matrix_labels", axes, params)
    leaves = dims_leaves(dims, params)
    treedef = jax.tree.structure(params)
    return treedef.unflatten([other if d is None else matrix for d in leaves])

  return labels


def to_matrix(x: jax.Array, d: Dims) -> jax.Array:
  """``x`` (shape ``d.shape``) as ``(num_batch, fan_in, fan_out)``."""
  perm = d.batch + d.reduction + d.output
  if perm != tuple(range(len(d.shape))):
    x = jnp.transpose(x, perm)
  return jnp.reshape(x, (d.num_batch, d.fan_in, d.fan_out))


def from_matrix(y: jax.Array, d: Dims) -> jax.Array:
  """Inverse of `to_matrix`."""
  perm = d.batch + d.reduction + d.output
  mid = tuple(d.shape[a] for a in perm)
  y = jnp.reshape(y, mid)
  if perm == tuple(range(len(d.shape))):
    return y
  inv = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
  return jnp.transpose(y, inv)


def reduce_sum(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """Sum over ``axes``, kept as size-1 axes (explicit broadcasting)."""
  return jnp.sum(x, axis=axes, keepdims=True)
