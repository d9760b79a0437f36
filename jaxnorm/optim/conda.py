r"""Conda: Column-Normalized Adam.

Wang et al., *Conda: Column-Normalized Adam for Training Large Language Models
Faster*, arXiv:2509.24218 (2025); reference code ``jie040109/Conda``
(``conda_torch/conda.py``, ``conda_torch/projector.py``), whose step is
reproduced here.

**Axes.** The official code works on a torch ``(out, in)`` weight ``W``: if
``out >= in`` ("tall") it rotates the input side with :math:`V^\top` from
:math:`M = U S V^\top`, otherwise the output side with :math:`U`. In the Flax
layout ``K = W^T`` of shape ``(fan_in, fan_out)`` (see
`jaxnorm.optim.MatrixAxes`) the same rule reads: **rotate the smaller side**
(the input side on ties). With :math:`K_M = P_L S P_R^\top` the SVD of the
first moment in Flax layout,

* input side (``fan_in <= fan_out``): :math:`P = P_L` (``fan_in`` square),
  ``proj(X) = P^T X``, ``back(Y) = P Y``;
* output side: :math:`P = P_R` (``fan_out`` square), ``proj(X) = X P``,
  ``back(Y) = Y P^T``.

With ``'std'`` the rotation is square, so the projected second moment has
the parameter's shape; its "columns" are the rotated coordinates of the
smaller side. The other projection types (``'reverse_std'`` always,
``'right'``/``'left'`` on the shapes where they rotate the larger side) are
**low-rank**: the basis is ``k x r`` with ``r = min(fan_in, fan_out)``, the
projected coordinates are ``r x r`` and ``back`` returns only the component in
the basis' span, as the official projector computes. Batch axes index
independent matrices (batched SVD).

Deviation: the official ``Conda`` allocates ``exp_avg_sq`` in the parameter's
shape, so every low-rank case fails there with a broadcasting error, and its
``reverse_std`` back-projection picks the side from the (square) projected
shape, which fails for wide torch weights. Here the second moment lives in
the projected ``r x r`` coordinates (stored in the parameter's shape, leading
rows or columns, the rest zero) and ``back`` uses the side of ``proj``: the
low-rank projection the projector implements. ``'std'``, and the square
cases of the others, equal the official step.

**Leaves that are not matrices** (rank < 2, or ``None`` axes) take the same
step without projection, as the official class does for its non-Conda
parameter group: Adam with ``eps`` on the uncorrected root and, in `conda`,
decay after the step. Signs of singular vectors do
not matter (each enters twice and :math:`v` sees only squares); their order
does, since :math:`v` is never rotated: both LAPACK and XLA sort singular
values in descending order.

**Sharding.** Everything but the SVD is elementwise or a matmul with a small
``k x k`` basis (``k = min(fan_in, fan_out)``) and runs sharded under
``jit``. The SVD has no SPMD partitioning rule: XLA's partitioner all-gathers
the first moment to every device for the refresh (every
``update_proj_gap`` steps, inside a ``lax.cond`` so other steps skip it) and
every device computes the same basis; we document rather than hide that
gather. Under an explicit mesh (``jax.set_mesh`` with ``AxisType.Explicit``
axes) the gather is spelled out and wider: each matrix leaf's gradient and
moments are resharded to replicated for its projected step (every step, not
only at refreshes) and the results resharded back to the parameter's
sharding; mesh axes of type ``Auto`` keep the partitioner's plan. The bases
keep the parameters' tree structure (`optax.MaskedNode` at leaves without
matrix axes, so ``optax.tree.map_params`` works) but are bare, replicated
arrays: they carry no parameter sharding metadata (``nnx.Optimizer`` and
linen ``nn.Partitioned`` trees).

**One counter.** `conda` is a single transform (the learning rate, the
schedule and the post-step decay are applied inside it from the one
``count``), so ``optax.tree_utils.tree_get(state, "count")`` returns the
step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike, DTypeLike

from jaxnorm import _checks, _numerics
from jaxnorm.optim import _axes, _common

PROJECTION_TYPES = ("std", "reverse_std", "right", "left")


class ScaleByCondaState(NamedTuple):
  """State of `scale_by_conda` and `conda`."""

  count: jax.Array  # shape (), int32; steps taken so far
  mu: optax.Updates  # first moment, parameter layout (unprojected)
  # Second moment, parameter shape; projected coordinates for matrix leaves
  # (low-rank: the leading r rows or columns, the rest zero).
  nu: optax.Updates
  # The parameters' structure: a batch_shape + (k, r) basis per matrix leaf,
  # optax.MaskedNode at the others.
  basis: optax.Updates


class PostStepDecayState(NamedTuple):
  """State of `add_decayed_weights_after_step` (schedule counter)."""

  count: jax.Array  # shape (), int32


def _side(d: _axes.Dims, projection_type: str) -> str:
  """``'in'`` or ``'out'``: which side of the Flax matrix is rotated."""
  tall = d.fan_out >= d.fan_in  # torch (out, in) with out >= in
  if projection_type == "std":
    return "in" if tall else "out"
  if projection_type == "reverse_std":
    return "out" if tall else "in"
  return "in" if projection_type == "right" else "out"


def _basis_shape(d: _axes.Dims, side: str) -> tuple[int, int]:
  """``(k, r)``: rotated side and rank of the basis."""
  k = d.fan_in if side == "in" else d.fan_out
  return k, min(d.fan_in, d.fan_out)


def orthogonal_basis(m: jax.Array, side: str) -> jax.Array:
  """Conda's basis from the reduced SVD of the first moment ``m``.

  Args:
    m: ``(batch, fan_in, fan_out)`` first moment, float32.
    side: ``'in'`` (left singular vectors, ``(fan_in, r)``) or ``'out'``
      (right singular vectors as columns, ``(fan_out, r)``), with
      ``r = min(fan_in, fan_out)``.

  Returns:
    ``(batch, k, r)`` matrices with orthonormal columns (square for the
    smaller side).
  """
  u, _, vh = jnp.linalg.svd(m, full_matrices=False)
  return u if side == "in" else jnp.swapaxes(vh, -1, -2)


def _is_sharded(x: jax.Array) -> bool:
  """Whether ``x``'s type carries a sharding (an explicit-mesh array)."""
  return any(s is not None for s in jax.typeof(x).sharding.spec)


def _replicated(x: jax.Array) -> jax.Array:
  """``x`` resharded to replicated if its type is sharded, else ``x``."""
  if not _is_sharded(x):
    return x
  return jax.sharding.reshard(x, jax.sharding.PartitionSpec())


def _sharded_like(x: jax.Array, like: jax.Array) -> jax.Array:
  """``x`` resharded to ``like``'s type sharding if that is sharded."""
  if not _is_sharded(like):
    return x
  return jax.sharding.reshard(x, jax.typeof(like).sharding)


def _proj(x: jax.Array, p: jax.Array, side: str) -> jax.Array:
  if side == "in":
    return jnp.einsum("bki,bkj->bij", p, x)
  return jnp.einsum("bik,bkj->bij", x, p)


def _back(y: jax.Array, p: jax.Array, side: str) -> jax.Array:
  if side == "in":
    return jnp.einsum("bik,bkj->bij", p, y)
  return jnp.einsum("bik,bjk->bij", y, p)


def _projected(v: jax.Array, r: int, side: str) -> jax.Array:
  """The ``r`` projected coordinates of a stored ``(b, fan_in, fan_out)``."""
  return v[:, :r, :] if side == "in" else v[:, :, :r]


def _stored(v: jax.Array, d: _axes.Dims) -> jax.Array:
  """Projected ``v`` zero-padded back to ``(b, fan_in, fan_out)``."""
  pad_in, pad_out = d.fan_in - v.shape[1], d.fan_out - v.shape[2]
  return jnp.pad(v, ((0, 0), (0, pad_in), (0, pad_out)))


def _check_gap(who: str, gap: Any, offset: Any) -> None:
  _common.check_step_count(who, "update_proj_gap", gap)
  if isinstance(offset, (jax.Array, np.ndarray)):
    if offset.ndim or not jnp.issubdtype(offset.dtype, jnp.integer):
      raise TypeError(
        f"{who}: refresh_offset must be 0, 1 or an integer scalar array, "
        f"got an array of shape {offset.shape} and dtype {offset.dtype}"
      )
  elif isinstance(offset, bool) or offset not in (0, 1):
    raise ValueError(
      f"{who}: refresh_offset must be 0 (official schedule) "
      f"or 1 (pytorch_optimizer schedule), got "
      f"refresh_offset={offset!r}"
    )


@_common.scoped_transform
def scale_by_conda(
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  *,
  update_proj_gap: ArrayLike = 2000,
  scale: ArrayLike = 1.0,
  projection_type: str = "std",
  refresh_offset: ArrayLike = 0,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
) -> optax.GradientTransformation:
  r"""Conda's projected, column-normalized Adam direction.

  With :math:`t` the 0-based step, for a matrix leaf:

  .. math::
    M &\leftarrow b_1 M + (1 - b_1) G,\\
    P &\leftarrow \mathrm{basis}(\mathrm{SVD}(M))
      \text{ if } t = 0 \text{ or } (t + \text{offset}) \bmod
      \text{gap} = 0,\\
    V &\leftarrow b_2 V + (1 - b_2)\,\mathrm{proj}(G)^2,\\
    \text{out} &= \text{scale}\,\frac{\sqrt{1 - b_2^{t+1}}}{1 - b_1^{t+1}}\,
      \mathrm{back}\Big(\frac{\mathrm{proj}(M)}{\sqrt{V} + \epsilon}\Big).

  Leaves without matrix axes take the same step with ``proj`` and ``back``
  the identity and no ``scale`` (the official class's unprojected group).
  ``refresh_offset=0`` is the official schedule (1-based steps 1, gap+1,
  2 gap+1, ...); ``refresh_offset=1`` is ``pytorch_optimizer.Conda``'s
  (steps 1, gap, 2 gap, ...). ``eps`` is added to the uncorrected
  :math:`\sqrt{V}` as in the official code.

  Args:
    b1: first-moment decay.
    b2: second-moment decay.
    eps: denominator epsilon (the official code uses 1e-8; its docstring
      says 1e-6).
    update_proj_gap: steps between basis refreshes (2000 in the authors'
      recipes and pytorch_optimizer; the official argparse default is 50).
    scale: multiplier on the projected update (1.0; the authors' LLM
      recipes use 0.25).
    projection_type: ``'std'`` (official default), ``'reverse_std'``,
      ``'right'`` (always the torch input side) or ``'left'`` (output side);
      see the module doc for the low-rank cases. ``'full'`` (both sides) is
      not implemented.
    refresh_offset: 0 (official) or 1 (pytorch_optimizer) schedule.
    mu_dtype: first-moment dtype, as optax's ``mu_dtype``: ``None`` (default)
      is float32 for half-precision params and the params' dtype otherwise;
      a dtype forces it. ``V`` and the basis always take the default.
    axes: matrix axes spec (see `jaxnorm.optim.MatrixAxes`), evaluated on
      ``params`` when given, else on the updates.

  Returns:
    An `optax.GradientTransformation` (``params`` only feed ``axes``).

  Raises:
    ValueError: bad ``projection_type``, ``update_proj_gap``,
      ``refresh_offset``, betas outside [0, 1) or negative ``eps``.
    TypeError: an ``update_proj_gap`` or ``refresh_offset`` array that is
      not an integer scalar (arrays, e.g. from ``optax.inject_hyperparams``,
      are used unchecked).

  Examples:
    A ``(3, 2)`` kernel rotates its output side (``fan_out < fan_in``) with a
    ``2 x 2`` basis; the bias has no basis and takes Adam's first step,
    ``sign(g)``:

    >>> p = {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}  # Flax (in, out)
    >>> g = {"b": jnp.array([0.5, -2.0]), "w": jnp.arange(6.0).reshape(3, 2)}
    >>> tx = optim.scale_by_conda()
    >>> u, state = tx.update(g, tx.init(p), p)
    >>> print(state._fields, state.basis["w"].shape, state.basis["b"])
    ('count', 'mu', 'nu', 'basis') (2, 2) MaskedNode()
    >>> print(np.asarray(u["b"], float).round(4).tolist())
    [1.0, -1.0]

  References:
    Wang et al., *Conda: Column-Normalized Adam for Training Large Language
    Models Faster*, arXiv:2509.24218 (2025).
  """
  who = "scale_by_conda"
  _checks.check_choice(
    who, "projection_type", projection_type, PROJECTION_TYPES
  )
  _check_gap(who, update_proj_gap, refresh_offset)
  _common.check_hyper(who, "b1", b1, high=1.0)
  _common.check_hyper(who, "b2", b2, high=1.0)
  _common.check_hyper(who, "eps", eps)

  def init_fn(params):
    dims = _axes.leaf_dims(who, axes, params)
    treedef = jax.tree.structure(params)
    ps = treedef.flatten_up_to(params)
    mus, nus, bases = [], [], []
    for p, d in zip(ps, dims):
      dt = _numerics.compute_dtype(p)
      mus.append(jnp.zeros_like(p, _common.moment_dtype(mu_dtype, p)))
      nus.append(jnp.zeros_like(p, dt))
      if d is None:
        bases.append(None)
      else:
        shape = _basis_shape(d, _side(d, projection_type))
        bases.append(jnp.zeros(d.batch_shape + shape, dt))
    un = treedef.unflatten
    return ScaleByCondaState(
      jnp.zeros([], jnp.int32),
      un(mus),
      un(nus),
      _common.per_leaf(params, bases),
    )

  def matrix_step(g, m, v_in, q_in, d, refresh, b2_, eps_):
    # On an explicit mesh the step runs on replicated copies (the SVD has no
    # partitioning rule, and merging or contracting sharded axes needs a
    # gather anyway); the results take back their inputs' sharding.
    side = _side(d, projection_type)
    k, r = _basis_shape(d, side)
    gm = _axes.to_matrix(_replicated(g), d)
    mm = _axes.to_matrix(_replicated(m), d)
    q_old = jnp.reshape(q_in, (d.num_batch, k, r))
    q = jax.lax.cond(
      refresh,
      lambda: orthogonal_basis(mm, side),
      lambda: q_old.astype(g.dtype),
    )
    gp, mp = _proj(gm, q, side), _proj(mm, q, side)
    vm = _axes.to_matrix(_replicated(v_in).astype(g.dtype), d)
    v = b2_ * _projected(vm, r, side) + (jnp.ones((), g.dtype) - b2_) * gp * gp
    n = mp / (jnp.sqrt(v) + eps_)
    u = _axes.from_matrix(_back(n, q, side), d) * _common.as_scalar(scale, g)
    v = _axes.from_matrix(_stored(v, d), d)
    return (
      _sharded_like(u, g),
      _sharded_like(v, v_in),
      jnp.reshape(q, q_in.shape).astype(q_in.dtype),
    )

  def update_fn(updates, state, params=None):
    tree = updates if params is None else params
    dims = _axes.leaf_dims(who, axes, tree)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    ms = treedef.flatten_up_to(state.mu)
    vs = treedef.flatten_up_to(state.nu)
    qs = _common.leaves_of(updates, state.basis)
    t = state.count
    gap = jnp.asarray(update_proj_gap).astype(jnp.int32)
    offset = jnp.asarray(refresh_offset).astype(jnp.int32)
    refresh = jnp.logical_or(t == 0, (t + offset) % gap == 0)
    count = _common.increment(t)
    out_u, out_m, out_v, out_q = [], [], [], []
    for g_in, m_in, v_in, q_in, d in zip(gs, ms, vs, qs, dims):
      g = _common.f32(g_in)
      one = jnp.ones((), g.dtype)
      b1_, b2_ = _common.as_scalar(b1, g), _common.as_scalar(b2, g)
      eps_ = _common.as_scalar(eps, g)
      m = b1_ * m_in.astype(g.dtype) + (one - b1_) * g
      if d is None:
        v = b2_ * v_in.astype(g.dtype) + (one - b2_) * g * g
        u = m / (jnp.sqrt(v) + eps_)
        out_q.append(None)
      else:
        u, v, q = matrix_step(g, m, v_in, q_in, d, refresh, b2_, eps_)
        out_q.append(q)
      tt = count.astype(g.dtype)
      u = u * (jnp.sqrt(one - b2_**tt) / (one - b1_**tt))
      out_u.append(u.astype(g_in.dtype))
      out_m.append(m.astype(m_in.dtype))
      out_v.append(v.astype(v_in.dtype))
    un = treedef.unflatten
    return un(out_u), ScaleByCondaState(
      count, un(out_m), un(out_v), _common.per_leaf(updates, out_q)
    )

  return optax.GradientTransformation(init_fn, update_fn)


def _decay_after_step(
  u: jax.Array, p: jax.Array, lr: ArrayLike, weight_decay: ArrayLike
) -> jax.Array:
  """``u - lr wd (p + u)`` in ``u``'s compute dtype, cast to ``u.dtype``.

  The update that gives ``(p + u)(1 - lr wd)`` after ``apply_updates``.
  """
  uc = _common.f32(u)
  rate = _common.as_scalar(lr, uc) * _common.as_scalar(weight_decay, uc)
  return (uc - rate * (p.astype(uc.dtype) + uc)).astype(u.dtype)


@_common.scoped_transform
def add_decayed_weights_after_step(
  learning_rate: optax.ScalarOrSchedule,
  weight_decay: ArrayLike = 0.0,
) -> optax.GradientTransformation:
  r"""Decoupled decay applied to the *updated* weight (Conda's order).

  Given the final update :math:`u` (learning rate already applied), returns
  :math:`u - \eta\lambda (p + u)`, so ``apply_updates`` gives
  :math:`(p + u)(1 - \eta\lambda)` exactly as the official
  ``p.add_(...); p.mul_(1 - lr * wd)``. Put it **after**
  ``scale_by_learning_rate``; ``learning_rate`` must be the same scalar or
  schedule (it is evaluated at the same step count).

  Args:
    learning_rate: :math:`\eta`, scalar or schedule.
    weight_decay: :math:`\lambda`.

  Returns:
    An `optax.GradientTransformation`; ``update`` needs ``params`` unless
    ``weight_decay`` is a literal 0.

  Raises:
    ValueError: negative ``weight_decay``, or (at update) missing ``params``
      while ``weight_decay`` is not a literal 0.

  Examples:
    After SGD with learning rate 0.1, the weight is ``(p - 0.1 g)`` shrunk by
    ``1 - 0.1 * 0.5``:

    >>> import optax
    >>> decay = optim.add_decayed_weights_after_step(0.1, weight_decay=0.5)
    >>> tx = optax.chain(optax.sgd(0.1), decay)
    >>> p, g = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([1.0, 1.0])}
    >>> u, state = tx.update(g, tx.init(p), p)
    >>> new = optax.apply_updates(p, u)["w"]
    >>> print(np.asarray(new, float).round(4).tolist())  # [0.9, 1.9] * 0.95
    [0.855, 1.805]
  """
  who = "add_decayed_weights_after_step"
  _common.check_hyper(who, "weight_decay", weight_decay)

  def init_fn(params):
    del params
    return PostStepDecayState(jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    count = _common.increment(state.count)
    if not _common.check_decay_params(who, params, weight_decay):
      return updates, PostStepDecayState(count)
    lr = _common.at_step(learning_rate, state.count)
    out = jax.tree.map(
      lambda u, p: _decay_after_step(u, p, lr, weight_decay), updates, params
    )
    return out, PostStepDecayState(count)

  return optax.GradientTransformation(init_fn, update_fn)


@_common.scoped_transform
def conda(
  learning_rate: optax.ScalarOrSchedule = 1e-3,
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  weight_decay: ArrayLike = 0.0,
  *,
  update_proj_gap: ArrayLike = 2000,
  scale: ArrayLike = 1.0,
  projection_type: str = "std",
  refresh_offset: ArrayLike = 0,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
  adam_learning_rate: optax.ScalarOrSchedule | None = None,
  adam_weight_decay: ArrayLike | None = None,
) -> optax.GradientTransformation:
  r"""Conda (Wang et al. 2025): the official optimizer, as one transform.

  Every leaf takes `scale_by_conda`'s direction :math:`\text{out}` (matrix
  leaves projected, the others plain Adam as the official class's second
  parameter group), then

  .. math::
    W \leftarrow (W - \eta\,\text{out})(1 - \eta\lambda)

  with the decay **after** the step (the official order; it cannot be the
  usual ``add_decayed_weights`` before the learning rate). Matrix leaves use
  ``learning_rate`` and ``weight_decay``; the others ``adam_learning_rate``
  and ``adam_weight_decay`` (default: the same). Give embeddings and the LM
  head ``None`` axes (the official script keeps only attention and MLP
  weights in the Conda group); `jaxnorm.optim.logical_axes` excludes
  ``vocab`` leaves by default.

  The learning rate (or schedule) and the decay are applied inside the
  transform from the one ``count`` of `ScaleByCondaState`, so
  ``optax.tree_utils.tree_get(state, "count")`` is the step.

  Args:
    learning_rate: scalar or schedule (authors' LLaMA recipe 0.01, GPT-2
      6e-3).
    b1: first-moment decay (recipes 0.9).
    b2: second-moment decay (recipes 0.99).
    eps: denominator epsilon.
    weight_decay: decoupled decay of matrix leaves, applied after the step.
    update_proj_gap: steps between SVD refreshes (recipes 2000).
    scale: update multiplier of matrix leaves (recipes 0.25).
    projection_type: see `scale_by_conda`.
    refresh_offset: 0 official schedule, 1 pytorch_optimizer schedule.
    mu_dtype: first-moment dtype (``None``: float32 for half-precision
      params, else theirs; a dtype forces it).
    axes: matrix axes spec, evaluated on ``params`` (never on optax
      placeholders); ``None`` entries take the Adam step.
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix) or a callable from params
      to one. ``None`` (default) decays every leaf, the official behaviour.
    adam_learning_rate: learning rate of non-matrix leaves (default
      ``learning_rate``).
    adam_weight_decay: decay of non-matrix leaves (default ``weight_decay``).

  Returns:
    An `optax.GradientTransformation` with state `ScaleByCondaState`
    (``update`` needs ``params`` unless both decays are a literal 0).

  Raises:
    ValueError: as `scale_by_conda`, negative decays, or (at update) missing
      ``params`` while a decay is not a literal 0.

  Examples:
    At the first step Conda is Adam in the basis ``P`` of the first moment's
    SVD: for a generic gradient every rotated coordinate of the update,
    ``P^T u``, is ``lr`` in size.

    >>> p = {"w": jnp.zeros((2, 2))}
    >>> g = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
    >>> opt = optim.conda(learning_rate=0.1)
    >>> u, state = opt.update(g, opt.init(p), p)
    >>> rotated = state.basis["w"].T @ u["w"]  # fan_in <= fan_out: input side
    >>> print(np.abs(np.asarray(rotated, float)).round(4).tolist())
    [[0.1, 0.1], [0.1, 0.1]]

  References:
    Wang et al., *Conda: Column-Normalized Adam for Training Large Language
    Models Faster*, arXiv:2509.24218 (2025).
  """
  who = "conda"
  adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate
  adam_wd = weight_decay if adam_weight_decay is None else adam_weight_decay
  _common.check_hyper(who, "weight_decay", weight_decay)
  _common.check_hyper(who, "adam_weight_decay", adam_wd)
  inner = scale_by_conda(
    b1,
    b2,
    eps,
    update_proj_gap=update_proj_gap,
    scale=scale,
    projection_type=projection_type,
    refresh_offset=refresh_offset,
    mu_dtype=mu_dtype,
    axes=axes,
  )

  def update_fn(updates, state, params=None):
    active = _common.check_decay_params(who, params, weight_decay, adam_wd)
    tree = updates if params is None else params
    dims = _axes.leaf_dims(who, axes, tree)
    decays = _common.leaf_mask(who, mask, tree)
    lr_m = _common.at_step(learning_rate, state.count)
    lr_a = _common.at_step(adam_lr, state.count)
    u, new_state = inner.update(updates, state, params)
    treedef = jax.tree.structure(updates)
    us = treedef.flatten_up_to(u)
    ps = treedef.flatten_up_to(tree)
    out = []
    for ui, p, d, dec in zip(us, ps, dims, decays):
      lr, wd = (lr_a, adam_wd) if d is None else (lr_m, weight_decay)
      uc = _common.f32(ui)
      step = -_common.as_scalar(lr, uc) * uc
      if dec and active:
        step = _decay_after_step(step, p, lr, wd)
      out.append(step.astype(ui.dtype))
    return treedef.unflatten(out), new_state

  return _common.standard_promotion(
    optax.GradientTransformation(inner.init, update_fn)
  )
