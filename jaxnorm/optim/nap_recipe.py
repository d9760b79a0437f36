r"""NaP beyond the projection: ELR, re-warmed schedules, joint affine.

Effective learning rates, re-warmed schedules and the joint projection of
norm layers' scale and offset.

Lyle et al. pair the weight projection (`jaxnorm.optim.nap_project`) with
three more pieces, given here as optax-compatible functions:

* `effective_learning_rate`: the quantity NaP holds fixed. For a weight
  feeding a normalization layer the function is invariant to
  :math:`W \to cW`, its gradient scales as :math:`1/c`, so an SGD step of
  size :math:`\eta` acts like :math:`\eta/\lVert W\rVert^2` on the direction
  (:math:`\eta/\lVert W\rVert` for Adam-like updates, whose size does not
  depend on :math:`\lVert W\rVert`).
* `task_reset_schedule` / `nap_rewarm_schedule`: since projection removes the
  implicit decay of the effective learning rate, NaP adds an explicit
  schedule, restarted ("re-warmed") at every task change in sequential ALE.
* `nap_project_joint`: project groups of leaves (a norm layer's scale and
  offset) jointly back to their joint norm at init.

Unverified [SECONDARY]: the paper text could not be read. The Rainbow
schedule (warmup from ``1e-8`` to ``6.25e-4`` over 1,000 steps, cosine to
``1e-6``, restarted at every game) and the joint scale/offset treatment come
from secondary sources (the project spec, ``norms.md`` section 12); which
affine option the reported runs used is not known. The ELR formulas are [I].

References:
  Lyle, Zheng, Khetarpal, Martens, van Hasselt, Pascanu and Dabney,
  *Normalization and effective learning rates in reinforcement learning*,
  arXiv:2407.01800 (NeurIPS 2024).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.optim import _common

ElrOptimizer = Literal["sgd", "adam"]
ELR_OPTIMIZERS = ("sgd", "adam")


def _f32(x: jax.Array) -> jax.Array:
  # _numerics.compute_dtype is valid under strict promotion for float64.
  return x.astype(_numerics.compute_dtype(x))


@_scope.scoped
def effective_learning_rate(
  learning_rate: ArrayLike,
  params: Any,
  mask: Any | Callable[[Any], Any] = None,
  *,
  optimizer: ElrOptimizer = "sgd",
) -> Any:
  r"""Per-leaf effective learning rate of scale-invariant weights.

  .. math:: \eta_{\mathrm{eff}} = \eta / \lVert W\rVert_F^2 \ (\text{SGD}),
     \qquad \eta / \lVert W\rVert_F \ (\text{Adam-like})

  Args:
    learning_rate: :math:`\eta` (scalar).
    params: parameter pytree.
    mask: ``None`` (every leaf), a bool pytree (prefix) or a callable from
      params to one, as `optax.masked`; unmasked leaves map to ``None``.
    optimizer: ``"sgd"`` or ``"adam"``.

  Returns:
    A pytree of scalars in each leaf's compute dtype (float32 for half and
      single precision, float64 for float64), ``None`` for unmasked leaves.

  Raises:
    ValueError: for an unknown ``optimizer`` or a bad mask.

  Examples:
    >>> p = {"w": jnp.full((2, 2), 2.0)}  # ||w||_F = 4
    >>> elr = optim.effective_learning_rate(0.1, p)  # 0.1 / 4**2
    >>> print(round(float(elr["w"]), 6))
    0.00625
    >>> elr = optim.effective_learning_rate(0.1, p, optimizer="adam")
    >>> print(round(float(elr["w"]), 6))  # 0.1 / 4
    0.025
  """
  who = "effective_learning_rate"
  _checks.check_choice(who, "optimizer", optimizer, ELR_OPTIMIZERS)
  treedef = jax.tree.structure(params)
  flags = _common.leaf_mask(who, mask, params)
  power = 2.0 if optimizer == "sgd" else 1.0
  out = []
  for p, f in zip(treedef.flatten_up_to(params), flags):
    if not f:
      out.append(None)
      continue
    pf = _f32(p)
    norm = jnp.sqrt(jnp.sum(pf * pf))
    out.append(_common.as_scalar(learning_rate, norm) / norm**power)
  return treedef.unflatten(out)


def task_reset_schedule(
  schedule: optax.Schedule, task_length: int
) -> optax.Schedule:
  r"""``step -> schedule(step mod task_length)``: restart at every task.

  Args:
    schedule: an optax schedule.
    task_length: steps per task.

  Returns:
    The periodic schedule.

  Raises:
    ValueError: for a non-positive ``task_length``.

  Examples:
    >>> import optax
    >>> ramp = optax.linear_schedule(0.0, 1.0, transition_steps=4)
    >>> sched = optim.task_reset_schedule(ramp, task_length=4)
    >>> print([round(float(sched(t)), 4) for t in range(6)])
    [0.0, 0.25, 0.5, 0.75, 0.0, 0.25]
  """
  _checks.check_positive_int("task_reset_schedule", "task_length", task_length)

  def fn(step):
    return schedule(jnp.asarray(step) % task_length)

  return fn


def nap_rewarm_schedule(
  task_length: int,
  *,
  peak_value: float = 6.25e-4,
  init_value: float = 1e-8,
  end_value: float = 1e-6,
  warmup_steps: int = 1000,
) -> optax.Schedule:
  """The sequential-ALE schedule of NaP: warmup + cosine, per task.

  Linear warmup from ``init_value`` to ``peak_value`` over
  ``warmup_steps``, cosine decay to ``end_value`` at the end of the task,
  restarted every ``task_length`` steps (`task_reset_schedule` over
  `optax.warmup_cosine_decay_schedule`). Defaults are the Rainbow values
  [SECONDARY].

  Args:
    task_length: steps per task (``> warmup_steps``).
    peak_value: learning rate after warmup.
    init_value: learning rate at each task's first step.
    end_value: learning rate the cosine reaches at step ``task_length``,
      which is the next task's first step (the task's last step is one
      cosine step above it).
    warmup_steps: warmup length.

  Returns:
    An optax schedule.

  Raises:
    ValueError: if ``task_length <= warmup_steps`` or either is not a
      positive integer.

  Examples:
    Warmup over 2 steps, cosine over the other 8, restart at step 10:

    >>> sched = optim.nap_rewarm_schedule(
    ...     10, peak_value=1.0, init_value=0.0, end_value=0.0, warmup_steps=2)
    >>> print([round(float(sched(t)), 4) for t in (0, 1, 2, 6, 10, 11)])
    [0.0, 0.5, 1.0, 0.5, 0.0, 0.5]
  """
  who = "nap_rewarm_schedule"
  _checks.check_positive_int(who, "task_length", task_length)
  _checks.check_positive_int(who, "warmup_steps", warmup_steps)
  if task_length <= warmup_steps:
    raise ValueError(
      f"{who}: task_length must exceed warmup_steps={warmup_steps}, got "
      f"{task_length=}"
    )
  inner = optax.warmup_cosine_decay_schedule(
    init_value=init_value,
    peak_value=peak_value,
    warmup_steps=warmup_steps,
    decay_steps=task_length,
    end_value=end_value,
  )
  return task_reset_schedule(inner, task_length)


class NapProjectJointState(NamedTuple):
  """State of `nap_project_joint`."""

  count: jax.Array  # shape (), int32
  # The parameters' structure: each grouped leaf holds its group's joint
  # norm at init (a compute-dtype scalar), ungrouped leaves optax.MaskedNode.
  target: optax.Updates


@_common.scoped_transform
def nap_project_joint(
  groups: Any | Callable[[Any], Any],
  *,
  eps: ArrayLike = 1e-12,
) -> optax.GradientTransformation:
  r"""Projects groups of leaves jointly back to their joint norm at init.

  For each group :math:`g` (e.g. one norm layer's scale and offset),
  :math:`\tau_g = \lVert (p_0)_g\rVert` over the concatenated leaves and,
  after every update, :math:`\tilde p_g = (p + u)_g\,\tau_g /
  \max(\lVert (p + u)_g\rVert, \epsilon)`; the returned update is
  :math:`\tilde p - p`. Put it last in the chain (with `nap_project` for
  the weight matrices, on disjoint leaves).

  Args:
    groups: a pytree with the structure of the params (or a callable from
      params to one) holding a Python ``int`` group id per leaf; a negative
      id leaves the leaf alone.
    eps: lower bound of the current norm.

  Returns:
    An `optax.GradientTransformation`; ``update`` needs ``params``.

  Raises:
    ValueError: for a group id that is not an int, a negative ``eps`` or
      (at update) missing ``params``.

  Examples:
    A norm layer's scale and offset keep their joint norm, ``sqrt(2)`` (the
    SGD step alone would leave 1):

    >>> import optax
    >>> p = {"bias": jnp.zeros(2), "scale": jnp.ones(2)}
    >>> joint = optim.nap_project_joint({"bias": 0, "scale": 0})
    >>> tx = optax.chain(optax.sgd(0.5), joint)
    >>> g = {"bias": jnp.array([1.0, -1.0]), "scale": jnp.ones(2)}
    >>> u, state = tx.update(g, tx.init(p), p)
    >>> print(round(float(optax.tree.norm(optax.apply_updates(p, u))), 4))
    1.4142

  References:
    Lyle et al., arXiv:2407.01800 (2024) (the joint option [SECONDARY]).
  """
  who = "nap_project_joint"
  _common.check_hyper(who, "eps", eps)

  def ids(params):
    treedef = jax.tree.structure(params)
    if treedef.num_leaves == 0:  # optax.tree.map_params' placeholder
      return treedef, [], []
    g = groups(params) if callable(groups) else groups
    flat = treedef.flatten_up_to(g)
    for i in flat:
      if isinstance(i, bool) or not isinstance(i, int):
        raise ValueError(
          f"{who}: groups must hold one Python int id per leaf (negative: "
          f"not projected), got {i!r}"
        )
    return treedef, flat, sorted({i for i in flat if i >= 0})

  def sq_norms(leaves, flat, keys):
    out = []
    for k in keys:
      out.append(
        sum(
          jnp.sum(jnp.square(_f32(x))) for x, i in zip(leaves, flat) if i == k
        )
      )
    return out

  def init_fn(params):
    treedef, flat, keys = ids(params)
    leaves = treedef.flatten_up_to(params)
    joint = dict(zip(keys, (jnp.sqrt(s) for s in sq_norms(leaves, flat, keys))))
    target = [joint[i] if i >= 0 else None for i in flat]
    return NapProjectJointState(
      jnp.zeros([], jnp.int32), _common.per_leaf(params, target)
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        f"{who}: params are required; call update(updates, state, params)"
      )
    treedef, flat, keys = ids(params)
    ps = treedef.flatten_up_to(params)
    us = treedef.flatten_up_to(updates)
    new = [_f32(p) + _f32(u) for p, u in zip(ps, us)]
    norms = [jnp.sqrt(s) for s in sq_norms(new, flat, keys)]
    target = {}
    for t, i in zip(_common.leaves_of(params, state.target), flat):
      if i >= 0:
        target.setdefault(i, t)  # every leaf of a group holds the same
    factor = {
      k: target[k] / jnp.maximum(n, _common.as_scalar(eps, n))
      for k, n in zip(keys, norms)
    }
    out = [
      u if i < 0 else (x * factor[i].astype(x.dtype) - _f32(p)).astype(u.dtype)
      for x, p, u, i in zip(new, ps, us, flat)
    ]
    count = _common.increment(state.count)
    return treedef.unflatten(out), NapProjectJointState(count, state.target)

  return optax.GradientTransformation(init_fn, update_fn)
