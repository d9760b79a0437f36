r"""RMNP: Row-Momentum Normalized Preconditioning.

Deng et al., *RMNP: Row-Momentum Normalized Preconditioning for Scalable
Matrix-Based Optimization*, arXiv:2603.20527 (2026); reference code
``Dominator-Index/RMNP`` (``rmnp/rmnp.py``), whose step is the default here.

**Rows.** The official code normalizes each row of a torch ``(out, in)``
weight over the input dimension (``F.normalize(dim=-1)``), one row per output
unit, with no transpose for tall matrices. For a Flax ``(in, out)`` kernel a
"row" is therefore a **column**: the normalization reduces over
`MatrixAxes.reduction` (axis 0 of a Dense kernel, axes ``(0, 1, 2)`` of a
``(kh, kw, in, out)`` conv kernel), one norm per output unit, and the shape
factor is :math:`\sqrt{\max(1, \text{fan\_out}/\text{fan\_in})}`.

**Sharding.** The step is elementwise plus one sum of squares over the
reduction axes; under ``jit`` it runs on the local shards with an all-reduce
of the per-unit partial sums. Nothing is gathered, unlike Muon's
Newton-Schulz, which needs whole-matrix products.

**One counter.** `rmnp` is a single transform: the RMNP step of matrix
leaves, optax's Adam step of the others, the learning rates (or schedules)
and the decay all read the one ``count`` of `RmnpState`, so
``optax.tree_utils.tree_get(state, "count")`` is the step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike, DTypeLike

from jaxnorm import _numerics
from jaxnorm.optim import _axes, _common


class ScaleByRmnpState(NamedTuple):
  """State of `scale_by_rmnp`."""

  count: jax.Array  # shape (), int32
  momentum: optax.Updates


class RmnpState(NamedTuple):
  """State of `rmnp`."""

  count: jax.Array  # shape (), int32
  # Every leaf: RMNP's momentum buffer (matrix leaves) or Adam's first
  # moment (the others).
  momentum: optax.Updates
  nu: optax.Updates  # Adam's second moment; MaskedNode for matrix leaves


def row_normalize(
  u: jax.Array, d: _axes.Dims, eps: ArrayLike = 1e-12
) -> jax.Array:
  r"""RMNP's direction before the shape factor: unit norm per output unit.

  :math:`R = U / \max(\lVert U_{:,j}\rVert_2, \epsilon)` with the norm over the
  reduction axes of ``d`` (torch ``F.normalize(U, dim=-1)`` on ``(out, in)``).

  Args:
    u: the momentum direction, shape ``d.shape``.
    d: resolved matrix axes (see `jaxnorm.optim.MatrixAxes`).
    eps: lower bound of the norm.

  Returns:
    ``R``, same shape and dtype as ``u``.
  """
  sq = _axes.reduce_sum(u * u, d.reduction)
  norm = jnp.maximum(jnp.sqrt(sq), _common.as_scalar(eps, u))
  return u / jnp.broadcast_to(norm, u.shape)


def shape_factor(d: _axes.Dims) -> float:
  r""":math:`\sqrt{\max(1, \text{fan\_out} / \text{fan\_in})}` (official)."""
  return max(1.0, d.fan_out / d.fan_in) ** 0.5


def _direction(
  beta: ArrayLike, nesterov: bool, ema: bool, shape_scale: bool, eps: ArrayLike
) -> Any:
  """RMNP's per-leaf step ``(g, buf, dims) -> (R, new buf)`` in f32."""

  def step(g_in, b_in, d):
    g = _common.f32(g_in)
    b = b_in.astype(g.dtype)
    beta_ = _common.as_scalar(beta, g)
    one = jnp.ones((), g.dtype)
    gw = (one - beta_) * g if ema else g
    b = beta_ * b + gw
    u = gw + beta_ * b if nesterov else b
    r = row_normalize(u, d, eps)
    if shape_scale:
      r = r * jnp.asarray(shape_factor(d), g.dtype)
    return r, b

  return step


@_common.scoped_transform
def scale_by_rmnp(
  beta: ArrayLike = 0.95,
  *,
  nesterov: bool = True,
  ema: bool = False,
  shape_scale: bool = True,
  eps: ArrayLike = 1e-12,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
) -> optax.GradientTransformation:
  r"""RMNP's momentum, row normalization and shape scaling.

  Official ``rmnp/rmnp.py`` step (defaults):

  .. math::
    b &\leftarrow \beta b + g \quad (\text{ema: } \beta b + (1-\beta) g),\\
    U &= g + \beta b \text{ (nesterov; ema: } (1-\beta) g + \beta b)
      \text{ or } b,\\
    R &= \sqrt{\max(1, n_\text{out}/n_\text{in})}\;
      U / \max(\lVert U_{\text{unit}}\rVert_2, \epsilon).

  ``ema=True, nesterov=False, shape_scale=False`` is the paper/README formula
  (same direction as the code without Nesterov: the row normalization is
  scale-invariant). The LLaMA-variant of the repository is ``ema=True,
  nesterov=True``.

  Deviation: the official code writes ``R`` into a bfloat16 buffer before
  applying it (rounding the direction to bf16); here ``R`` stays in the
  compute dtype and is cast only to the parameter's dtype (about 4e-3 relative
  difference for float32 parameters).

  Args:
    beta: momentum :math:`\beta`.
    nesterov: Nesterov direction (official default True).
    ema: exponential moving average instead of the plain sum.
    shape_scale: multiply by the shape factor.
    eps: lower bound of each unit's norm (torch ``F.normalize``: 1e-12).
    mu_dtype: momentum dtype, as optax's ``mu_dtype``: ``None`` (default) is
      float32 for half-precision params and the params' dtype otherwise; a
      dtype forces it.
    axes: matrix axes spec (see `jaxnorm.optim.MatrixAxes`), evaluated on
      ``params`` when given, else on the updates; every leaf this transform
      sees must be a matrix.

  Returns:
    An `optax.GradientTransformation` (``params`` only feed ``axes``).

  Raises:
    ValueError: ``beta`` outside [0, 1), negative ``eps``, or (at update) a
      leaf without matrix axes.

  Examples:
    A ``(1, 4)`` kernel has four output units of one weight each; each is
    normalized to 1 and scaled by ``sqrt(4 / 1) = 2``:

    >>> g = {"w": jnp.array([[0.5, -1.0, 2.0, -3.0]])}  # Flax (in=1, out=4)
    >>> tx = optim.scale_by_rmnp()
    >>> r, state = tx.update(g, tx.init(g))
    >>> print(np.asarray(r["w"], float).round(4).tolist(), state._fields)
    [[2.0, -2.0, 2.0, -2.0]] ('count', 'momentum')

  References:
    Deng et al., *RMNP: Row-Momentum Normalized Preconditioning for Scalable
    Matrix-Based Optimization*, arXiv:2603.20527 (2026).
  """
  who = "scale_by_rmnp"
  _common.check_hyper(who, "beta", beta, high=1.0)
  _common.check_hyper(who, "eps", eps)

  direction = _direction(beta, nesterov, ema, shape_scale, eps)

  def init_fn(params):
    return ScaleByRmnpState(
      jnp.zeros([], jnp.int32),
      jax.tree.map(
        lambda p: jnp.zeros_like(p, _common.moment_dtype(mu_dtype, p)), params
      ),
    )

  def update_fn(updates, state, params=None):
    dims = _axes.leaf_dims(who, axes, updates if params is None else params)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    bs = treedef.flatten_up_to(state.momentum)
    out_u, out_b = [], []
    for g_in, b_in, d in zip(gs, bs, dims):
      if d is None:
        raise ValueError(
          f"{who}: every leaf needs matrix axes, got a leaf of shape "
          f"{g_in.shape} without; route it to Adam with rmnp() or "
          "optax.partition"
        )
      r, b = direction(g_in, b_in, d)
      out_u.append(r.astype(g_in.dtype))
      out_b.append(b.astype(b_in.dtype))
    un = treedef.unflatten
    return un(out_u), ScaleByRmnpState(
      _common.increment(state.count), un(out_b)
    )

  return optax.GradientTransformation(init_fn, update_fn)


@_common.scoped_transform
def rmnp(
  learning_rate: optax.ScalarOrSchedule = 0.02,
  *,
  beta: ArrayLike = 0.95,
  nesterov: bool = True,
  weight_decay: ArrayLike = 0.0,
  ema: bool = False,
  shape_scale: bool = True,
  eps: ArrayLike = 1e-12,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
  adam_learning_rate: optax.ScalarOrSchedule | None = None,
  adam_b1: ArrayLike = 0.9,
  adam_b2: ArrayLike = 0.95,
  adam_eps: ArrayLike = 1e-8,
  adam_weight_decay: ArrayLike = 0.0,
) -> optax.GradientTransformation:
  r"""RMNP for matrix leaves, AdamW for the rest, as one transform.

  Matrix leaves (rank >= 2 with non-``None`` axes) take `scale_by_rmnp`'s
  direction :math:`R` and the official ``W <- W (1 - lr wd) - lr R``; the
  other leaves optax's AdamW step, :math:`p \leftarrow p - \eta_a (\hat m /
  (\sqrt{\hat v} + \epsilon_a) + \lambda_a p)`, with ``adam_learning_rate``
  (default ``learning_rate``), ``adam_b1``, ``adam_b2``, ``adam_eps`` and
  ``adam_weight_decay``. Give embeddings and the LM head ``None`` axes (the
  authors train those with AdamW; `jaxnorm.optim.logical_axes` excludes
  ``vocab`` leaves by default). Authors' recipes: GPT-2 small RMNP lr 4e-3
  (wd 0) with AdamW lr 3e-3, betas (0.9, 0.95), wd 0.1.

  Args:
    learning_rate: RMNP learning rate or schedule (official default 0.02).
    beta: momentum.
    nesterov: Nesterov direction.
    weight_decay: decoupled decay on matrix leaves.
    ema: EMA momentum (paper formula) instead of the plain sum.
    shape_scale: apply the shape factor.
    eps: row-norm lower bound.
    mu_dtype: dtype of the momentum and of Adam's first moment (``None``:
      float32 for half-precision params, else theirs; a dtype forces it).
      Adam's second moment always takes the default.
    axes: matrix axes spec, evaluated on ``params`` (never on optax
      placeholders); ``None`` entries take the AdamW step.
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix) or a callable from params
      to one. ``None`` (default) applies ``weight_decay`` to every matrix
      leaf and ``adam_weight_decay`` to every other leaf.
    adam_learning_rate: AdamW learning rate or schedule (default
      ``learning_rate``).
    adam_b1: AdamW ``b1``.
    adam_b2: AdamW ``b2``.
    adam_eps: AdamW ``eps``.
    adam_weight_decay: AdamW decay.

  Returns:
    An `optax.GradientTransformation` with state `RmnpState` (``update``
    needs ``params`` unless both decays are a literal 0).

  Raises:
    ValueError: as `scale_by_rmnp`, negative decays, or (at update) missing
      ``params`` while a decay is not a literal 0.

  Examples:
    Each output unit (a column of the Flax kernel) of the matrix's update has
    norm ``lr``; the bias takes AdamW's first step, ``-lr sign(g)``:

    >>> p = {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}  # Flax (in, out)
    >>> g = {"b": jnp.array([0.5, -2.0]), "w": jnp.arange(6.0).reshape(3, 2)}
    >>> opt = optim.rmnp(learning_rate=0.1)
    >>> u, state = opt.update(g, opt.init(p), p)
    >>> norms = np.linalg.norm(np.asarray(u["w"], float), axis=0)
    >>> print(norms.round(4).tolist())  # one norm per output unit
    [0.1, 0.1]
    >>> print(np.asarray(u["b"], float).round(4).tolist(), state._fields)
    [-0.1, 0.1] ('count', 'momentum', 'nu')

  References:
    Deng et al., *RMNP: Row-Momentum Normalized Preconditioning for Scalable
    Matrix-Based Optimization*, arXiv:2603.20527 (2026).
  """
  who = "rmnp"
  _common.check_hyper(who, "beta", beta, high=1.0)
  _common.check_hyper(who, "eps", eps)
  _common.check_hyper(who, "weight_decay", weight_decay)
  _common.check_hyper(who, "adam_weight_decay", adam_weight_decay)
  adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate
  direction = _direction(beta, nesterov, ema, shape_scale, eps)
  adam = optax.scale_by_adam(adam_b1, adam_b2, adam_eps, mu_dtype=mu_dtype)

  def init_fn(params):
    dims = _axes.leaf_dims(who, axes, params)
    treedef = jax.tree.structure(params)
    ps = treedef.flatten_up_to(params)

    mus = [jnp.zeros_like(p, _common.moment_dtype(mu_dtype, p)) for p in ps]
    nus = [
      optax.MaskedNode()
      if d is not None
      else jnp.zeros_like(p, _numerics.compute_dtype(p))
      for p, d in zip(ps, dims)
    ]
    return RmnpState(
      jnp.zeros([], jnp.int32), treedef.unflatten(mus), treedef.unflatten(nus)
    )

  def update_fn(updates, state, params=None):
    active = _common.check_decay_params(
      who, params, weight_decay, adam_weight_decay
    )
    tree = updates if params is None else params
    dims = _axes.leaf_dims(who, axes, tree)
    decays = _common.leaf_mask(who, mask, tree)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    ps = treedef.flatten_up_to(tree)
    bs = treedef.flatten_up_to(state.momentum)
    vs = treedef.flatten_up_to(state.nu)
    plain = [i for i, d in enumerate(dims) if d is None]
    adam_u, adam_state = adam.update(
      tuple(_common.f32(gs[i]) for i in plain),
      optax.ScaleByAdamState(
        state.count,
        tuple(bs[i] for i in plain),
        tuple(vs[i] for i in plain),
      ),
    )
    adam_out = dict(zip(plain, zip(adam_u, adam_state.mu, adam_state.nu)))
    lr_m = _common.at_step(learning_rate, state.count)
    lr_a = _common.at_step(adam_lr, state.count)
    out_u, out_b, out_v = [], [], []
    for i, (g_in, p, b_in, v_in, d, dec) in enumerate(
      zip(gs, ps, bs, vs, dims, decays)
    ):
      if d is None:
        u, b, v = adam_out[i]
        lr, wd = lr_a, adam_weight_decay
      else:
        (u, b), v = direction(g_in, b_in, d), v_in
        lr, wd = lr_m, weight_decay
      if dec and active:
        u = u + _common.as_scalar(wd, u) * p.astype(u.dtype)
      out_u.append((-_common.as_scalar(lr, u) * u).astype(g_in.dtype))
      out_b.append(b.astype(b_in.dtype))
      out_v.append(v if d is not None else v.astype(v_in.dtype))
    un = treedef.unflatten
    return un(out_u), RmnpState(
      _common.increment(state.count), un(out_b), un(out_v)
    )

  return _common.standard_promotion(
    optax.GradientTransformation(init_fn, update_fn)
  )
