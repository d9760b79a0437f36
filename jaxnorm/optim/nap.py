r"""NaP: the weight-projection step of Normalize-and-Project, as a transform.

Lyle, Zheng, Khetarpal, Martens, van Hasselt, Pascanu and Dabney,
*Normalization and effective learning rates in reinforcement learning*,
arXiv:2407.01800 (NeurIPS 2024).

NaP puts a normalization layer before every nonlinearity, so the preceding
weights are scale-invariant, and after every optimizer step projects each such
weight back to its norm at initialization,
:math:`W \leftarrow W\,\lVert W_0\rVert_F / \lVert W\rVert_F`, which keeps the
effective learning rate :math:`\propto \eta / \lVert W\rVert^2` constant.
`nap_project` is that projection as the **last** element of an optax chain.

Unverified: the paper text could not be read; the per-layer Frobenius norm,
the unprojected readout and the projection period follow secondary sources
(``docs/research/nap-qualification.md`` audit and the NeurIPS poster digest,
see the project spec). Not implemented: the paper's joint treatment of norm
layers' scale and offset (``norm_affine='joint'`` in the spec); leave those
parameters out of ``mask``.

**Sharding.** One sum of squares per leaf (or per output unit), all-reduced
across shards by XLA; nothing is gathered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from jaxnorm import _checks, _numerics
from jaxnorm.optim import _axes, _common

GRANULARITIES = ("layer", "unit")


class NapProjectState(NamedTuple):
  """State of `nap_project`."""

  count: jax.Array  # shape (), int32
  # Norms at init in the parameters' structure: per masked leaf a bare
  # array (compute dtype, the leaf's rank with size-1 reduced axes, no
  # parameter sharding metadata), optax.MaskedNode at unmasked leaves.
  target: optax.Updates


def _reduce_axes(
  x: jax.Array, d: _axes.Dims | None, granularity: str
) -> tuple[int, ...]:
  if d is None:
    return tuple(range(x.ndim))
  if granularity == "unit":
    return d.reduction
  return d.reduction + d.output


def _norm(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  x = _common.f32(x)
  return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=True))


@_common.scoped_transform
def nap_project(
  mask: Any | Callable[[Any], Any],
  *,
  eps: ArrayLike = 1e-12,
  granularity: str = "layer",
  period: ArrayLike = 1,
  axes: _axes.AxesSpec = None,
) -> optax.GradientTransformation:
  r"""Projects masked weights back to their initial norm after each update.

  ``init(params)`` stores :math:`\tau = \lVert p_0\rVert` per masked leaf
  (per batch index, or per output unit with ``granularity='unit'``).
  ``update(u, state, params)`` returns
  :math:`\tilde p - p` with :math:`\tilde p = (p + u)\,\tau /
  \max(\lVert p + u\rVert, \epsilon)` for masked leaves on projection steps
  (every ``period``-th update), and ``u`` unchanged otherwise. Put it last,
  after the learning rate and weight decay.

  Args:
    mask: boolean pytree (a prefix of the params) or a callable from params
      to one; ``True`` marks hidden weights that feed a normalization layer.
      There is no default: the readout layer, which the paper leaves
      unprojected, cannot be recognized from the tree.
    eps: lower bound of the current norm.
    granularity: ``'layer'`` (paper: one Frobenius norm per weight matrix) or
      ``'unit'`` (jaxnorm extension: one norm per output unit, over the
      reduction axes of ``axes``).
    period: project every ``period`` updates (1 = every step; the paper
      found every step and every 1000 steps nearly identical). A Python int
      is checked at construction; an integer array (e.g. from
      ``optax.inject_hyperparams``) is used as is.
    axes: matrix axes spec (see `jaxnorm.optim.MatrixAxes`); batch axes get
      one norm each, and ``'unit'`` needs the reduction axes.

  Returns:
    An `optax.GradientTransformation`; ``update`` needs ``params``.

  Raises:
    ValueError: unknown ``granularity``, non-positive ``period``, negative
      ``eps``, ``granularity='unit'`` on a masked leaf of rank < 2, or (at
      update) missing ``params``.
    TypeError: a ``period`` array that is not an integer scalar.

  Examples:
    The weight keeps its initial Frobenius norm, 5, after an SGD step:

    >>> import optax
    >>> p = {"w": jnp.array([[3.0, 0.0], [0.0, 4.0]])}  # norm 5
    >>> tx = optax.chain(optax.sgd(0.1), optim.nap_project(mask={"w": True}))
    >>> u, state = tx.update({"w": jnp.ones((2, 2))}, tx.init(p), p)
    >>> new = optax.apply_updates(p, u)["w"]
    >>> print(round(float(jnp.linalg.norm(new)), 4))
    5.0

  References:
    Lyle et al., *Normalization and effective learning rates in
    reinforcement learning*, arXiv:2407.01800 (2024).
  """
  who = "nap_project"
  _checks.check_choice(who, "granularity", granularity, GRANULARITIES)
  _common.check_step_count(who, "period", period)
  _common.check_hyper(who, "eps", eps)

  def leaf_info(params):
    treedef = jax.tree.structure(params)
    flags = _common.leaf_mask(who, mask, params)
    dims = _axes.leaf_dims(who, axes, params)
    for x, f, d in zip(treedef.flatten_up_to(params), flags, dims):
      if f and granularity == "unit" and d is None:
        raise ValueError(
          f"{who}: granularity='unit' needs matrix axes, got a masked leaf "
          f"of shape {x.shape}; use granularity='layer' or unmask it"
        )
    return treedef, flags, dims

  def init_fn(params):
    treedef, flags, dims = leaf_info(params)
    targets = [
      _norm(p, _reduce_axes(p, d, granularity)) if f else None
      for p, f, d in zip(treedef.flatten_up_to(params), flags, dims)
    ]
    return NapProjectState(
      jnp.zeros([], jnp.int32), _common.per_leaf(params, targets)
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        f"{who}: params are required; call update(updates, state, params)"
      )
    treedef, flags, dims = leaf_info(params)
    count = _common.increment(state.count)
    fire = count % jnp.asarray(period).astype(jnp.int32) == 0
    us = treedef.flatten_up_to(updates)
    ps = treedef.flatten_up_to(params)
    ts = _common.leaves_of(params, state.target)
    out = []
    for u, p, tau, f, d in zip(us, ps, ts, flags, dims):
      if not f:
        out.append(u)
        continue
      new = _common.f32(p) + _common.f32(u).astype(_numerics.compute_dtype(p))
      norm = _norm(new, _reduce_axes(p, d, granularity))
      factor = tau.astype(new.dtype) / jnp.maximum(
        norm, _common.as_scalar(eps, new)
      )
      proj = new * jnp.broadcast_to(factor, new.shape) - _common.f32(p)
      out.append(jnp.where(fire, proj.astype(u.dtype), u))
    return treedef.unflatten(out), NapProjectState(count, state.target)

  return optax.GradientTransformation(init_fn, update_fn)
