"""Matrix axes: which axes of a parameter are inputs, outputs and batch.

Matrix optimizers (AdamP's channel view, Conda's rotation, RMNP's row norms,
NaP's per-unit norms) need to know which axis of a weight is the input
("fan-in") and which the output ("fan-out"). Flax kernels are ``(in, out)``
(Dense) and ``(kh, kw, in, out)`` (Conv); torch weights are ``(out, in)`` and
``(out, in, kh, kw)``. Nothing here guesses from ``ndim`` beyond the documented
default; the axes are named with `MatrixAxes`, in the spirit of optax's
``MuonDimensionNumbers``.

An ``axes`` argument is ``None`` (the Flax default), one `MatrixAxes`, a
pytree of them (a prefix of the parameters; ``None`` marks a non-matrix
leaf), or a callable from the parameters to such a pytree. The public
optimizers (`adamp`, `sgdp`, `conda`, `rmnp`) evaluate it on the full
parameters they are given; it never receives `optax.MaskedNode`
placeholders (a ``scale_by_*`` transform inside ``optax.partition`` refuses a
callable: resolve it first, ``axes=rule(params)``).

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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax.core import meta

from jaxnorm import _checks

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
      ``MatrixAxes(output=(1, 2))``; output projection
      ``(heads, head_dim, embed)``: ``MatrixAxes(output=2)``.
    * gemma's einsum kernels: ``q_einsum`` ``(N, D, H)``:
      ``MatrixAxes(output=(0, 2), reduction=1)``; ``attn_vec_einsum``
      ``(N, H, D)``: ``MatrixAxes(output=2)``. The default (output = last
      axis) would treat ``H`` alone as the output of the query kernel:
      silently a different matrix.
    * equinox ``Linear.weight`` ``(out, in)``: ``MatrixAxes(output=0)``, as
      torch.

    `logical_axes` derives these from the logical axis names a parameter
    tree carries (`axes_from_names` for one leaf).
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


def _has_masked_node(tree: Any) -> bool:
  nodes = jax.tree.leaves(
    tree, is_leaf=lambda x: isinstance(x, optax.MaskedNode)
  )
  return any(isinstance(x, optax.MaskedNode) for x in nodes)


def resolve_tree(who: str, axes: AxesSpec, tree: Any) -> Any:
  """Per-leaf `Dims` (or None) for every array leaf of ``tree``.

  Args:
    who: the calling function, for error messages.
    axes: ``None`` (default rule: `MatrixAxes()` for leaves of rank >= 2,
      ``None`` otherwise), one `MatrixAxes` for every leaf of rank >= 2
      (lower ranks get ``None``), a pytree of `MatrixAxes` / ``None`` that is
      a prefix of ``tree``, or a callable mapping ``tree`` to such a pytree.
      A callable is only ever called on real parameters: a ``tree`` holding
      `optax.MaskedNode` placeholders (inside `optax.partition` or
      `optax.masked`) is refused for callables, and pytree specs skip the
      placeholders.
    tree: the parameters (or updates, for transforms without params).

  Returns:
    A pytree with the structure of ``tree`` whose leaves are `Dims` or None.

  Raises:
    ValueError: if a callable ``axes`` would see `optax.MaskedNode` leaves,
      or a leaf's axes do not fit its shape (see `resolve`).
  """
  if axes is None:
    spec = jax.tree.map(lambda x: MatrixAxes() if x.ndim >= 2 else None, tree)
  elif isinstance(axes, MatrixAxes):
    spec = jax.tree.map(lambda x: axes if x.ndim >= 2 else None, tree)
  elif callable(axes):
    if _has_masked_node(tree):
      raise ValueError(
        f"{who}: a callable `axes` would receive optax.MaskedNode "
        "placeholders (this transform runs inside optax.partition or "
        "optax.masked); evaluate the rule on the full parameters and pass "
        "the resulting pytree, axes=rule(params), or use the public "
        "optimizer, which evaluates `axes` on the unmasked parameters"
      )
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


def leaf_dims(who: str, axes: AxesSpec, tree: Any) -> list[Dims | None]:
  """`resolve_tree` flattened in the leaf order of ``tree``.

  A tree without leaves (``optax.tree.map_params``' placeholder) has no
  dims; ``axes`` is not evaluated on it.
  """
  treedef = jax.tree.structure(tree)
  if treedef.num_leaves == 0:
    return []
  return treedef.flatten_up_to(resolve_tree(who, axes, tree))


LAYOUTS = ("in_out", "out_in")


def _names_of(x: Any) -> tuple[Any, ...] | None:
  """The logical axis names a parameter box carries, or None."""
  if isinstance(x, nnx.Variable):
    names = x.get_metadata().get("out_sharding")
  elif isinstance(x, meta.AxisMetadata):
    names = getattr(x, "names", None)
  elif isinstance(x, jax.sharding.PartitionSpec):
    names = tuple(x)
  else:
    return None
  return None if names is None else tuple(names)


def _is_named(x: Any) -> bool:
  return isinstance(
    x, (nnx.Variable, meta.AxisMetadata, jax.sharding.PartitionSpec)
  )


def _has_name(entry: Any, names: tuple[str, ...]) -> bool:
  parts = entry if isinstance(entry, tuple) else (entry,)
  return any(p in names for p in parts)


def axes_from_names(
  names: tuple[Any, ...],
  *,
  model: tuple[str, ...] = ("embed",),
  batch: tuple[str, ...] = ("layers",),
  exclude: tuple[str, ...] = ("vocab",),
  layout: str = "in_out",
) -> MatrixAxes | None:
  """`MatrixAxes` of one weight from its logical axis names.

  A weight maps the model width (``model`` names, the residual stream) to a
  hidden space or back. Axes named in ``batch`` are batch axes (independent
  matrices). Of the other ("matrix") axes, the model-width group is the
  **output** when it ends the kernel (``layout='in_out'``: Flax and einsum
  kernels, whose output axes come last) or starts it (``layout='out_in'``:
  torch and equinox ``(out, in)``), and the **input** otherwise; every other
  matrix axis takes the opposite role. Without a model-width axis (or with
  only such axes) the last (``'in_out'``) or first (``'out_in'``) matrix axis
  is the output.

  Examples (``layout='in_out'``):

  * Flax query ``('embed', 'heads', 'head_dim')``: input ``embed``, outputs
    ``heads, head_dim``; output projection ``('heads', 'head_dim', 'embed')``:
    inputs ``heads, head_dim``, output ``embed``;
  * gemma's einsum query ``(N, D, H)`` = ``('heads', 'embed', 'head_dim')``:
    input ``embed`` (axis 1), outputs axes 0 and 2; its ``attn_vec_einsum``
    ``(N, H, D)``: inputs ``N, H``, output ``D``;
  * stacked MLP ``('layers', 'embed', 'mlp')``: batch axis 0.

  With ``layout='out_in'``: torch ``q_proj.weight`` ``('heads', 'embed')`` has
  output axis 0, ``o_proj.weight`` ``('embed', 'heads')`` output axis 0 too.

  Args:
    names: one entry per axis: a name, ``None`` or a tuple of names.
    model: names of the model width.
    batch: names of batch axes (stacked layers).
    exclude: names that make the leaf a non-matrix (``None``): embedding
      tables and LM heads, which the Conda and RMNP authors train with Adam.
    layout: ``'in_out'`` or ``'out_in'``, see above.

  Returns:
    A `MatrixAxes`, or ``None`` for excluded leaves and leaves with fewer
    than two matrix axes.

  Raises:
    ValueError: for an unknown ``layout``.

  Examples:
    >>> optim.axes_from_names(("embed", "heads", "head_dim"))
    MatrixAxes(output=(1, 2), reduction=(0,))
    >>> optim.axes_from_names(("layers", "embed", "mlp"))  # axis 0: batch
    MatrixAxes(output=(2,), reduction=(1,))
    >>> optim.axes_from_names(("heads", "embed"), layout="out_in")  # torch
    MatrixAxes(output=(0,), reduction=(1,))
    >>> print(optim.axes_from_names(("vocab", "embed")))  # left to Adam
    None
  """
  _checks.check_choice("axes_from_names", "layout", layout, LAYOUTS)
  if any(_has_name(n, exclude) for n in names):
    return None
  mat = [a for a, n in enumerate(names) if not _has_name(n, batch)]
  if len(mat) < 2:
    return None
  is_model = [_has_name(names[a], model) for a in mat]
  edge = mat[-1] if layout == "in_out" else mat[0]
  if any(is_model) and not all(is_model):
    group = tuple(a for a, m in zip(mat, is_model) if m)
    rest = tuple(a for a, m in zip(mat, is_model) if not m)
    edge_is_model = is_model[-1] if layout == "in_out" else is_model[0]
    output, reduction = (group, rest) if edge_is_model else (rest, group)
  else:
    output = (edge,)
    reduction = tuple(a for a in mat if a != edge)
  return MatrixAxes(output=output, reduction=reduction)


def logical_axes(
  tree: Any,
  *,
  model: tuple[str, ...] = ("embed",),
  batch: tuple[str, ...] = ("layers",),
  exclude: tuple[str, ...] = ("vocab",),
  layout: str = "in_out",
) -> Any:
  """An ``axes`` pytree from the logical names a parameter tree carries.

  Reads the names of each leaf (``nnx.Variable`` sharding metadata, as on
  ``nnx.state(model, nnx.Param)``; linen ``nn.Partitioned`` /
  ``nn.LogicallyPartitioned`` boxes; or a tree of ``PartitionSpec`` such as
  ``nnx.get_partition_spec(state)``) and applies `axes_from_names` with the
  same keyword arguments. Unnamed leaves of rank >= 2 get the positional
  rule of ``layout`` (output last, or first), lower ranks ``None``.

  The result is a prefix of the boxed tree and of its unboxed arrays, so pass
  it once as ``axes=`` (it is resolved statically, at every ``init`` and
  ``update``, including inside ``nnx.Optimizer`` whose ``update`` sees bare
  arrays).

  Args:
    tree: parameters with names.
    model: see `axes_from_names`.
    batch: see `axes_from_names`.
    exclude: see `axes_from_names`.
    layout: see `axes_from_names`.

  Returns:
    A pytree of `MatrixAxes` / ``None`` with one entry per parameter.

  Examples:
    From a tree of ``PartitionSpec`` (as ``nnx.get_partition_spec`` gives):

    >>> P = jax.sharding.PartitionSpec
    >>> specs = {"emb": P("vocab", "embed"), "q": P("embed", "heads", "hd")}
    >>> axes = optim.logical_axes(specs)
    >>> print(axes["emb"], axes["q"])
    None MatrixAxes(output=(1, 2), reduction=(0,))
    >>> opt = optim.rmnp(0.02, axes=axes)  # emb takes AdamW's step
  """
  kw = dict(model=model, batch=batch, exclude=exclude, layout=layout)

  def one(x):
    names = _names_of(x)
    value = x
    if isinstance(x, nnx.Variable):
      value = x.get_value()
    elif isinstance(x, meta.AxisMetadata):
      value = x.unbox()
    if isinstance(value, jax.sharding.PartitionSpec):
      ndim = len(tuple(value))
    else:
      ndim = jnp.ndim(value)
    if names is None or len(names) != ndim:
      names = (None,) * ndim
    return axes_from_names(names, **kw)

  return jax.tree.map(one, tree, is_leaf=_is_named)


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
