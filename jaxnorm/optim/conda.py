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

The rotation is square, so the projected second moment has the parameter's
shape; its "columns" are the rotated coordinates of the smaller side. Batch
axes index independent matrices (batched SVD). Signs of singular vectors do
not matter (each enters twice and :math:`v` sees only squares); their order
does, since :math:`v` is never rotated: both LAPACK and XLA sort singular
values in descending order.

**Sharding.** Everything but the SVD is elementwise or a matmul with a small
``k x k`` basis (``k = min(fan_in, fan_out)``) and runs sharded under
``jit``. The SVD has no SPMD partitioning rule: XLA's partitioner all-gathers
the first moment to every device for the refresh (every
``update_proj_gap`` steps, inside a ``lax.cond`` so other steps skip it) and
every device computes the same basis; we document rather than hide that
gather.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.typing import ArrayLike

from jaxnorm import _checks
from jaxnorm.optim import _axes, _common

PROJECTION_TYPES = ("std", "reverse_std", "right", "left")


class ScaleByCondaState(NamedTuple):
  """State of `scale_by_conda`."""

  count: jax.Array  # shape (), int32; steps taken so far
  mu: optax.Updates  # first moment, parameter layout (unprojected)
  nu: optax.Updates  # second moment, projected coordinates, parameter shape
  basis: optax.Updates  # per leaf: batch_shape + (k, k) orthogonal matrix


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


def _basis_size(d: _axes.Dims, side: str) -> int:
  return d.fan_in if side == "in" else d.fan_out


def orthogonal_basis(m: jax.Array, side: str) -> jax.Array:
  """Conda's rotation from the SVD of the first moment ``m``.

  Args:
    m: ``(batch, fan_in, fan_out)`` first moment, float32.
    side: ``'in'`` (left singular vectors, ``fan_in`` square) or ``'out'``
      (right singular vectors as columns, ``fan_out`` square).

  Returns:
    ``(batch, k, k)`` orthogonal matrices.
  """
  u, _, vh = jnp.linalg.svd(m, full_matrices=False)
  return u if side == "in" else jnp.swapaxes(vh, -1, -2)


def _proj(x: jax.Array, p: jax.Array, side: str) -> jax.Array:
  if side == "in":
    return jnp.einsum("bki,bkj->bij", p, x)
  return jnp.einsum("bik,bkj->bij", x, p)


def _back(y: jax.Array, p: jax.Array, side: str) -> jax.Array:
  if side == "in":
    return jnp.einsum("bik,bkj->bij", p, y)
  return jnp.einsum("bik,bjk->bij", y, p)


def _check_gap(who: str, gap: Any, offset: Any) -> None:
  if isinstance(gap, (int, np.integer)):
    _checks.check_positive_int(who, "update_proj_gap", gap)
  if isinstance(offset, (int, np.integer)) and offset not in (0, 1):
    raise ValueError(
      f"{who}: refresh_offset must be 0 (official schedule) "
      f"or 1 (pytorch_optimizer schedule), got "
      f"refresh_offset={offset!r}"
    )


def scale_by_conda(
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  *,
  update_proj_gap: ArrayLike = 2000,
  scale: ArrayLike = 1.0,
  projection_type: str = "std",
  refresh_offset: int = 0,
  mu_dtype: Any = None,
  axes: _axes.AxesSpec = None,
) -> optax.GradientTransformation:
  r"""Conda's projected, column-normalized Adam direction (matrix leaves).

  With :math:`t` the 0-based step:

  .. math::
    M &\leftarrow b_1 M + (1 - b_1) G,\\
    P &\leftarrow \mathrm{basis}(\mathrm{SVD}(M))
      \text{ if } t = 0 \text{ or } (t + \text{offset}) \bmod
      \text{gap} = 0,\\
    V &\leftarrow b_2 V + (1 - b_2)\,\mathrm{proj}(G)^2,\\
    \text{out} &= \text{scale}\,\frac{\sqrt{1 - b_2^{t+1}}}{1 - b_1^{t+1}}\,
      \mathrm{back}\Big(\frac{\mathrm{proj}(M)}{\sqrt{V} + \epsilon}\Big).

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
    scale: multiplier on the update (1.0; the authors' LLM recipes use 0.25).
    projection_type: ``'std'`` (official default), ``'reverse_std'``,
      ``'right'`` (always the torch input side) or ``'left'`` (output side).
      ``'full'`` (both sides) is not implemented.
    refresh_offset: 0 (official) or 1 (pytorch_optimizer) schedule.
    mu_dtype: first-moment dtype (default float32); ``V`` and the basis are
      float32.
    axes: matrix axes spec; every leaf seen must be a matrix.

  Returns:
    An `optax.GradientTransformation` (``params`` unused).

  Raises:
    ValueError: bad ``projection_type``, ``update_proj_gap``,
      ``refresh_offset``, betas outside [0, 1), negative ``eps``, or (at
      init/update) a leaf without matrix axes.

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

  def leaf_dims(tree):
    dims = _axes.dims_leaves(_axes.resolve_tree(who, axes, tree), tree)
    for x, d in zip(jax.tree.leaves(tree), dims):
      if d is None:
        raise ValueError(
          f"{who}: every leaf needs matrix axes, got a leaf of shape "
          f"{x.shape} without; route it to Adam with conda() or "
          "optax.partition"
        )
    return dims

  def init_fn(params):
    dims = leaf_dims(params)
    treedef = jax.tree.structure(params)
    ps = treedef.flatten_up_to(params)
    mus, nus, bases = [], [], []
    for p, d in zip(ps, dims):
      dt = _common.compute_dtype(p)
      mus.append(jnp.zeros(p.shape, mu_dtype or dt))
      nus.append(jnp.zeros(p.shape, dt))
      k = _basis_size(d, _side(d, projection_type))
      bases.append(jnp.zeros(d.batch_shape + (k, k), dt))
    un = treedef.unflatten
    return ScaleByCondaState(
      jnp.zeros([], jnp.int32), un(mus), un(nus), un(bases)
    )

  def update_fn(updates, state, params=None):
    del params
    dims = leaf_dims(updates)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    ms = treedef.flatten_up_to(state.mu)
    vs = treedef.flatten_up_to(state.nu)
    qs = treedef.flatten_up_to(state.basis)
    t = state.count
    gap = jnp.asarray(update_proj_gap).astype(jnp.int32)
    offset = jnp.asarray(refresh_offset).astype(jnp.int32)
    refresh = jnp.logical_or(t == 0, (t + offset) % gap == 0)
    count = _common.increment(t)
    out_u, out_m, out_v, out_q = [], [], [], []
    for g_in, m_in, v_in, q_in, d in zip(gs, ms, vs, qs, dims):
      side = _side(d, projection_type)
      g = _common.f32(g_in)
      one = jnp.ones((), g.dtype)
      b1_, b2_ = _common.as_scalar(b1, g), _common.as_scalar(b2, g)
      m = b1_ * m_in.astype(g.dtype) + (one - b1_) * g
      gm, mm = _axes.to_matrix(g, d), _axes.to_matrix(m, d)
      q_old = jnp.reshape(q_in, (d.num_batch,) + q_in.shape[-2:])
      q = jax.lax.cond(
        refresh,
        lambda mm=mm, side=side: orthogonal_basis(mm, side),
        lambda q_old=q_old: q_old.astype(g.dtype),
      )
      gp, mp = _proj(gm, q, side), _proj(mm, q, side)
      v = b2_ * _axes.to_matrix(v_in.astype(g.dtype), d) + (one - b2_) * gp * gp
      n = mp / (jnp.sqrt(v) + _common.as_scalar(eps, g))
      tt = count.astype(g.dtype)
      step = jnp.sqrt(one - b2_**tt) / (one - b1_**tt)
      u = _axes.from_matrix(_back(n, q, side), d) * (
        _common.as_scalar(scale, g) * step
      )
      out_u.append(u.astype(g_in.dtype))
      out_m.append(m.astype(m_in.dtype))
      out_v.append(_axes.from_matrix(v, d).astype(v_in.dtype))
      out_q.append(jnp.reshape(q, q_in.shape).astype(q_in.dtype))
    un = treedef.unflatten
    return un(out_u), ScaleByCondaState(count, un(out_m), un(out_v), un(out_q))

  return optax.GradientTransformation(init_fn, update_fn)


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
    An `optax.GradientTransformation`; ``update`` needs ``params``.

  Raises:
    ValueError: negative ``weight_decay``, or (at update) missing ``params``
      while ``weight_decay`` is not a literal 0.
  """
  who = "add_decayed_weights_after_step"
  _common.check_hyper(who, "weight_decay", weight_decay)

  def init_fn(params):
    del params
    return PostStepDecayState(jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    count = _common.increment(state.count)
    if params is None:
      if isinstance(weight_decay, (int, float)) and weight_decay == 0:
        return updates, PostStepDecayState(count)
      raise ValueError(
        f"{who}: params are required; call update(updates, state, params)"
      )
    lr = (
      learning_rate(state.count) if callable(learning_rate) else learning_rate
    )

    def one(u, p):
      uc = _common.f32(u)
      rate = _common.as_scalar(lr, uc) * _common.as_scalar(weight_decay, uc)
      return (uc - rate * (p.astype(uc.dtype) + uc)).astype(u.dtype)

    return jax.tree.map(one, updates, params), PostStepDecayState(count)

  return optax.GradientTransformation(init_fn, update_fn)


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
  refresh_offset: int = 0,
  mu_dtype: Any = None,
  axes: _axes.AxesSpec = None,
  adam_learning_rate: optax.ScalarOrSchedule | None = None,
  adam_weight_decay: ArrayLike | None = None,
) -> optax.GradientTransformation:
  r"""Conda for matrix leaves, AdamW for the rest (`optax.partition`).

  Matrix leaves: ``chain(scale_by_conda, scale_by_learning_rate,
  add_decayed_weights_after_step)``, exactly the official update
  :math:`W \leftarrow (W - \eta\,\text{out})(1 - \eta\lambda)` (decay after
  the step, so it cannot be the usual ``add_decayed_weights`` before the
  learning rate). Other leaves (rank < 2, or ``None`` axes: pass those for
  embeddings and the LM head, as the official script keeps only attention
  and MLP weights in the Conda group) get ``optax.adamw(adam_learning_rate
  or learning_rate, b1, b2, eps, adam_weight_decay or weight_decay)``.

  Deviation: the official code runs those leaves through the same class
  without projection (Adam with ``eps`` on the uncorrected root and decay
  after the step); optax's AdamW puts ``eps`` after the bias correction and
  decays before the step. The difference is of order ``eps`` and
  :math:`\eta^2\lambda`.

  Args:
    learning_rate: scalar or schedule (authors' LLaMA recipe 0.01, GPT-2
      6e-3).
    b1: first-moment decay (recipes 0.9).
    b2: second-moment decay (recipes 0.99).
    eps: denominator epsilon.
    weight_decay: decoupled decay, applied after the step.
    update_proj_gap: steps between SVD refreshes (recipes 2000).
    scale: update multiplier (recipes 0.25).
    projection_type: see `scale_by_conda`.
    refresh_offset: 0 official schedule, 1 pytorch_optimizer schedule.
    mu_dtype: first-moment dtype (default float32).
    axes: matrix axes spec; ``None`` entries go to AdamW.
    adam_learning_rate: AdamW learning rate (default ``learning_rate``).
    adam_weight_decay: AdamW decay (default ``weight_decay``).

  Returns:
    An `optax.GradientTransformation` (``update`` needs ``params`` when
    ``weight_decay`` is used).

  References:
    Wang et al., *Conda: Column-Normalized Adam for Training Large Language
    Models Faster*, arXiv:2509.24218 (2025).
  """
  return _common.standard_promotion(
    optax.partition(
      {
        "conda": optax.chain(
          scale_by_conda(
            b1,
            b2,
            eps,
            update_proj_gap=update_proj_gap,
            scale=scale,
            projection_type=projection_type,
            refresh_offset=refresh_offset,
            mu_dtype=mu_dtype,
            axes=axes,
          ),
          optax.scale_by_learning_rate(learning_rate),
          add_decayed_weights_after_step(learning_rate, weight_decay),
        ),
        "adam": _common.in_compute_dtype(
          optax.adamw(
            adam_learning_rate
            if adam_learning_rate is not None
            else learning_rate,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=(
              adam_weight_decay
              if adam_weight_decay is not None
              else weight_decay
            ),
            mu_dtype=mu_dtype,
          )
        ),
      },
      _axes.matrix_labels(axes, "conda", "adam"),
    )
  )
