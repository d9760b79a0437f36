r"""AdamP and SGDP: momentum optimizers with a projection for scale invariance.

Heo et al., *AdamP: Slowing Down the Slowdown for Momentum Optimizers on
Scale-invariant Weights*, arXiv:2006.08217 (2021); reference code
``clovaai/AdamP`` (PyPI ``adamp`` 0.3.0), whose order of operations is
reproduced exactly.

**Channels.** AdamP's "channel" is torch dim 0 of a weight, the output unit.
Here it is one index along `MatrixAxes.output` (by default the last axis of a
Flax ``(in, out)`` / ``(kh, kw, in, out)`` kernel); the cosine test and the
projection reduce over the reduction (input) axes. For torch-layout weights
pass ``axes=MatrixAxes(output=0)``. Batch axes (stacked layers) are independent
weights: each batch index runs its own channel and layer test.

**Sharding.** Everything is elementwise plus sums over the reduction (and, for
the layer view, output) axes; under ``jit`` XLA's partitioner runs them on the
local shards and all-reduces the per-channel partial sums. Nothing is gathered.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike, DTypeLike

from jaxnorm import _numerics
from jaxnorm.optim import _axes, _common

_EXPLICIT = "(the official AdamP/SGDP couple the decay with the projection)"


class ScaleByAdampState(NamedTuple):
  """State of `scale_by_adamp`."""

  count: jax.Array  # shape (), int32
  mu: optax.Updates
  nu: optax.Updates


class ScaleBySgdpState(NamedTuple):
  """State of `scale_by_sgdp`."""

  count: jax.Array  # shape (), int32
  momentum: optax.Updates


def _project(
  p: jax.Array,
  g: jax.Array,
  u: jax.Array,
  d: _axes.Dims,
  delta: jax.Array,
  wd_ratio: jax.Array,
  eps: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """AdamP's projection of direction ``u`` of weight ``p`` with gradient ``g``.

  Channel view first, layer view second, as ``adamp.AdamP._projection``:
  ``|cos(g_c, p_c)|`` per channel ``c`` (torch ``F.cosine_similarity``:
  ``x.y / (max(|x|, eps) max(|y|, eps))``); if its maximum is below
  ``delta / sqrt(fan_in)`` every channel is projected,
  ``u_c -= p_c <p_c, u_c> / (|p_c| + eps)^2``; otherwise the same with one
  channel holding the whole (batch entry of the) tensor and threshold
  ``delta / sqrt(fan_in * fan_out)``.

  Returns:
    The projected ``u`` and the per-batch decay factor (``wd_ratio`` where a
    view fired, else 1), of ``p``'s rank with size-1 reduction and output
    axes.
  """
  red, out = d.reduction, d.output
  pp = _axes.reduce_sum(p * p, red)
  gg = _axes.reduce_sum(g * g, red)
  pg = _axes.reduce_sum(p * g, red)
  pu = _axes.reduce_sum(p * u, red)
  one = jnp.ones((), p.dtype)

  def cosine(xy, xx, yy):
    return jnp.abs(xy) / (
      jnp.maximum(jnp.sqrt(xx), eps) * jnp.maximum(jnp.sqrt(yy), eps)
    )

  cos_c = jnp.max(cosine(pg, pp, gg), axis=out, keepdims=True)
  fire_c = cos_c < delta / jnp.sqrt(jnp.asarray(d.fan_in, p.dtype))
  lpp, lgg = _axes.reduce_sum(pp, out), _axes.reduce_sum(gg, out)
  lpg, lpu = _axes.reduce_sum(pg, out), _axes.reduce_sum(pu, out)
  cos_l = cosine(lpg, lpp, lgg)
  fire_l = cos_l < delta / jnp.sqrt(jnp.asarray(d.fan_in * d.fan_out, p.dtype))
  fire_l = jnp.logical_and(fire_l, jnp.logical_not(fire_c))
  # The channel coefficient has per-channel shape, the layer one per-batch
  # shape; both keep p's rank and broadcast over their size-1 axes (no
  # broadcast_to: under an explicit mesh a materialized broadcast would be
  # replicated and clash with the sharded operand).
  coef_c = pu / jnp.square(jnp.sqrt(pp) + eps)
  coef_l = lpu / jnp.square(jnp.sqrt(lpp) + eps)
  coef = jnp.where(
    fire_c, coef_c, jnp.where(fire_l, coef_l, jnp.zeros((), p.dtype))
  )
  u = u - p * coef
  wd = jnp.where(jnp.logical_or(fire_c, fire_l), wd_ratio.astype(p.dtype), one)
  return u, wd


def _check_common(
  who: str, eps: Any, weight_decay: Any, delta: Any, wd_ratio: Any
) -> None:
  _common.check_hyper(who, "eps", eps)
  _common.check_hyper(who, "weight_decay", weight_decay)
  _common.check_hyper(who, "delta", delta)
  _common.check_hyper(who, "wd_ratio", wd_ratio)


@_common.scoped_transform
def scale_by_adamp(
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  *,
  weight_decay: ArrayLike = 0.0,
  delta: ArrayLike = 0.1,
  wd_ratio: ArrayLike = 0.1,
  nesterov: bool = False,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
) -> optax.GradientTransformation:
  r"""AdamP's direction, projection and (coupled) decoupled weight decay.

  With step :math:`t` from 1, gradient :math:`g`, parameter :math:`p`:

  .. math::
    m &\leftarrow b_1 m + (1 - b_1) g,\quad
    v \leftarrow b_2 v + (1 - b_2) g^2,\\
    u &= \frac{m \text{ (or } b_1 m + (1-b_1) g \text{ with nesterov)}}
      {\sqrt{v}/\sqrt{1 - b_2^t} + \epsilon},\\
    (u, r) &= \mathrm{proj}(p, g, u)\ \text{(see module doc)},\\
    \text{out} &= \frac{u}{1 - b_1^t} + \lambda\, r\, p,

  where :math:`r` = ``wd_ratio`` if a projection fired and 1 otherwise. Chained
  with ``scale_by_learning_rate(lr)`` this is exactly ``adamp.AdamP``:
  ``p <- p (1 - lr \lambda r) - lr/(1 - b_1^t) u``. The decay lives here
  because :math:`r` depends on the projection (STYLE section 7). Leaves with
  rank < 2, or whose axes are ``None``, get plain Adam with :math:`r = 1`;
  leaves outside ``mask`` get no decay term (:math:`\lambda = 0`).

  Args:
    b1: first-moment decay.
    b2: second-moment decay.
    eps: added to the bias-corrected :math:`\sqrt{v}`, and the ``eps`` of the
      cosine and of the weight normalization.
    weight_decay: :math:`\lambda`, decoupled decay, scaled by the learning rate
      in the next transform.
    delta: cosine threshold; the view's threshold is ``delta / sqrt(dim)``.
    wd_ratio: decay multiplier for projected weights.
    nesterov: use the Nesterov direction.
    mu_dtype: first-moment dtype, as optax's ``mu_dtype``: ``None`` (default)
      is float32 for half-precision params and the params' dtype otherwise;
      a dtype forces it. The second moment always takes the default.
    axes: `MatrixAxes`, a pytree/callable of them (see
      `jaxnorm.optim.MatrixAxes`), evaluated on ``params``; ``None`` = Flax
      layout, output = last axis.
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix of it) or a callable from
      params to one. ``None`` (default) decays every leaf, the official
      behaviour. The ``wd_ratio`` coupling applies to the decayed leaves.

  Returns:
    An `optax.GradientTransformation`; ``update`` needs ``params`` and returns
    updates in each parameter's dtype.

  Raises:
    ValueError: for negative ``eps``/``weight_decay``/``delta``/``wd_ratio``,
      ``b1``/``b2`` outside [0, 1), or (at update) missing ``params``.

  Examples:
    One step on a weight ``w`` whose gradient is orthogonal to it (as for a
    weight feeding a normalization layer): Adam's first direction ``[1, -1]``
    loses its radial part, and the decay is ``0.5 * wd_ratio * w``.

    >>> w = {"w": jnp.array([[1.0], [2.0]])}  # (in=2, out=1): one unit
    >>> g = {"w": jnp.array([[0.2], [-0.1]])}  # g . w = 0
    >>> tx = optim.scale_by_adamp(weight_decay=0.5)
    >>> out, state = tx.update(g, tx.init(w), w)
    >>> print(state._fields, np.asarray(out["w"], float).round(4).tolist())
    ('count', 'mu', 'nu') [[1.25], [-0.5]]

  References:
    Heo et al., *AdamP: Slowing Down the Slowdown for Momentum Optimizers on
    Scale-invariant Weights*, arXiv:2006.08217 (2021).
  """
  who = "scale_by_adamp"
  _check_common(who, eps, weight_decay, delta, wd_ratio)
  _common.check_hyper(who, "b1", b1, high=1.0)
  _common.check_hyper(who, "b2", b2, high=1.0)

  def init_fn(params):
    return ScaleByAdampState(
      count=jnp.zeros([], jnp.int32),
      mu=jax.tree.map(
        lambda p: jnp.zeros_like(p, _common.moment_dtype(mu_dtype, p)), params
      ),
      nu=jax.tree.map(
        lambda p: jnp.zeros_like(p, _numerics.compute_dtype(p)), params
      ),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        f"{who}: params are required {_EXPLICIT}; call "
        "update(grads, state, params)"
      )
    count = _common.increment(state.count)
    dims = _axes.leaf_dims(who, axes, params)
    decays = _common.leaf_mask(who, mask, params)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    ps = treedef.flatten_up_to(params)
    ms = treedef.flatten_up_to(state.mu)
    vs = treedef.flatten_up_to(state.nu)
    out_u, out_m, out_v = [], [], []
    for g_in, p_in, m_in, v_in, d, dec in zip(gs, ps, ms, vs, dims, decays):
      g, p = (
        _common.f32(g_in),
        _common.f32(p_in).astype(_numerics.compute_dtype(g_in)),
      )
      m, v = m_in.astype(g.dtype), v_in.astype(g.dtype)
      b1_, b2_ = _common.as_scalar(b1, g), _common.as_scalar(b2, g)
      eps_ = _common.as_scalar(eps, g)
      t = count.astype(g.dtype)
      one = jnp.ones((), g.dtype)
      m = b1_ * m + (one - b1_) * g
      v = b2_ * v + (one - b2_) * g * g
      bc1 = one - b1_**t
      bc2 = one - b2_**t
      denom = jnp.sqrt(v) / jnp.sqrt(bc2) + eps_
      num = b1_ * m + (one - b1_) * g if nesterov else m
      u = num / denom
      if d is not None:
        u, wd = _project(
          p,
          g,
          u,
          d,
          _common.as_scalar(delta, g),
          _common.as_scalar(wd_ratio, g),
          eps_,
        )
      else:
        wd = one
      out = u / bc1
      if dec:
        out = out + _common.as_scalar(weight_decay, g) * wd * p
      out_u.append(out.astype(p_in.dtype))
      out_m.append(m.astype(m_in.dtype))
      out_v.append(v.astype(v_in.dtype))
    un = treedef.unflatten
    return un(out_u), ScaleByAdampState(count, un(out_m), un(out_v))

  return optax.GradientTransformation(init_fn, update_fn)


@_common.scoped_transform
def adamp(
  learning_rate: optax.ScalarOrSchedule = 1e-3,
  b1: ArrayLike = 0.9,
  b2: ArrayLike = 0.999,
  eps: ArrayLike = 1e-8,
  weight_decay: ArrayLike = 0.0,
  *,
  delta: ArrayLike = 0.1,
  wd_ratio: ArrayLike = 0.1,
  nesterov: bool = False,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
) -> optax.GradientTransformation:
  r"""AdamP (Heo et al. 2021): Adam with a projection for scale invariance.

  ``chain(scale_by_adamp(..., weight_decay), scale_by_learning_rate(lr))``;
  the decoupled decay is inside `scale_by_adamp` because its ratio depends on
  the projection (a separate ``add_decayed_weights`` cannot know it). Equal to
  ``adamp.AdamP`` step for step (see `scale_by_adamp` for the equations and
  the axis convention). Defaults are the official ones.

  Args:
    learning_rate: scalar or schedule.
    b1: first-moment decay.
    b2: second-moment decay.
    eps: denominator / cosine / normalization epsilon.
    weight_decay: decoupled decay (torch ``weight_decay``).
    delta: cosine threshold.
    wd_ratio: decay multiplier on projected weights.
    nesterov: Nesterov direction.
    mu_dtype: first-moment dtype (``None``: float32 for half-precision
      params, else theirs).
    axes: matrix axes spec (default: Flax layout, output = last axis).
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix of it) or a callable from
      params to one. ``None`` (default) decays every leaf, the official
      behaviour. The ``wd_ratio`` coupling applies to the decayed leaves.

  Returns:
    An `optax.GradientTransformation` (``update`` needs ``params``).

  Examples:
    The update of a weight whose gradient is orthogonal to it has no radial
    component, so it does not grow the weight's norm:

    >>> w = {"w": jnp.array([[1.0], [2.0]])}  # (in=2, out=1): one unit
    >>> g = {"w": jnp.array([[0.2], [-0.1]])}  # g . w = 0
    >>> opt = optim.adamp(learning_rate=0.1)
    >>> u, state = opt.update(g, opt.init(w), w)
    >>> print(np.asarray(u["w"], float).round(4).tolist())
    [[-0.12], [0.06]]
    >>> print(abs(round(float(jnp.vdot(w["w"], u["w"])), 4)))  # |w . u|
    0.0

  References:
    Heo et al., *AdamP: Slowing Down the Slowdown for Momentum Optimizers on
    Scale-invariant Weights*, arXiv:2006.08217 (2021).
  """
  return _common.standard_promotion(
    optax.chain(
      scale_by_adamp(
        b1,
        b2,
        eps,
        weight_decay=weight_decay,
        delta=delta,
        wd_ratio=wd_ratio,
        nesterov=nesterov,
        mu_dtype=mu_dtype,
        axes=axes,
        mask=mask,
      ),
      optax.scale_by_learning_rate(learning_rate),
    )
  )


@_common.scoped_transform
def scale_by_sgdp(
  momentum: ArrayLike = 0.0,
  *,
  dampening: ArrayLike = 0.0,
  weight_decay: ArrayLike = 0.0,
  nesterov: bool = False,
  eps: ArrayLike = 1e-8,
  delta: ArrayLike = 0.1,
  wd_ratio: ArrayLike = 0.1,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
) -> optax.GradientTransformation:
  r"""SGDP's direction, projection and coupled weight decay.

  .. math::
    b &\leftarrow \mu b + (1 - \text{dampening})\, g,\quad
    d = g + \mu b \text{ (nesterov) or } b,\\
    (d, r) &= \mathrm{proj}(p, g, d),\quad
    \text{out} = d + \frac{\lambda r}{1 - \mu} p,

  so that after ``scale_by_learning_rate(lr)``:
  ``p <- p (1 - lr \lambda r / (1 - \mu)) - lr d``, as ``adamp.SGDP``;
  leaves outside ``mask`` get no decay term.

  Reproduces an aliasing of the official code: without nesterov, ``d`` *is*
  the momentum buffer and the projection is done in place, so the stored
  momentum is the **projected** direction. With nesterov the buffer stays
  unprojected.

  Args:
    momentum: :math:`\mu`.
    dampening: momentum dampening.
    weight_decay: :math:`\lambda`.
    nesterov: Nesterov direction.
    eps: cosine / normalization epsilon.
    delta: cosine threshold.
    wd_ratio: decay multiplier on projected weights.
    mu_dtype: momentum dtype (``None``: float32 for half-precision params,
      else theirs; a dtype forces it).
    axes: matrix axes spec (default: Flax layout, output = last axis).
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix of it) or a callable from
      params to one. ``None`` (default) decays every leaf, the official
      behaviour. The ``wd_ratio`` coupling applies to the decayed leaves.

  Returns:
    An `optax.GradientTransformation`; ``update`` needs ``params``.

  Raises:
    ValueError: for negative hyperparameters, ``momentum`` outside [0, 1), or
      (at update) missing ``params``.

  Examples:
    A gradient with a small radial part (cosine 0.04 with ``w``, below
    ``delta / sqrt(2)``) loses it: ``g - w (w . g) / |w|^2``, which is also
    what the momentum buffer stores (the aliasing above).

    >>> w = {"w": jnp.array([[1.0], [2.0]])}  # (in=2, out=1): one unit
    >>> g = {"w": jnp.array([[0.2], [-0.09]])}  # w . g = 0.02
    >>> tx = optim.scale_by_sgdp(momentum=0.9)
    >>> d, state = tx.update(g, tx.init(w), w)
    >>> print(np.asarray(d["w"], float).round(4).tolist(), state._fields)
    [[0.196], [-0.098]] ('count', 'momentum')
    >>> print(np.asarray(state.momentum["w"], float).round(4).tolist())
    [[0.196], [-0.098]]

  References:
    Heo et al., *AdamP: Slowing Down the Slowdown for Momentum Optimizers on
    Scale-invariant Weights*, arXiv:2006.08217 (2021).
  """
  who = "scale_by_sgdp"
  _check_common(who, eps, weight_decay, delta, wd_ratio)
  _common.check_hyper(who, "momentum", momentum, high=1.0)
  _common.check_hyper(who, "dampening", dampening, high=1.0, high_open=False)

  def init_fn(params):
    return ScaleBySgdpState(
      jnp.zeros([], jnp.int32),
      jax.tree.map(
        lambda p: jnp.zeros_like(p, _common.moment_dtype(mu_dtype, p)), params
      ),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
        f"{who}: params are required {_EXPLICIT}; call "
        "update(grads, state, params)"
      )
    dims = _axes.leaf_dims(who, axes, params)
    decays = _common.leaf_mask(who, mask, params)
    treedef = jax.tree.structure(updates)
    gs = treedef.flatten_up_to(updates)
    ps = treedef.flatten_up_to(params)
    bs = treedef.flatten_up_to(state.momentum)
    out_u, out_b = [], []
    for g_in, p_in, b_in, d, dec in zip(gs, ps, bs, dims, decays):
      g = _common.f32(g_in)
      p = p_in.astype(g.dtype)
      b = b_in.astype(g.dtype)
      mom = _common.as_scalar(momentum, g)
      one = jnp.ones((), g.dtype)
      b = mom * b + (one - _common.as_scalar(dampening, g)) * g
      direction = g + mom * b if nesterov else b
      if d is not None:
        direction, wd = _project(
          p,
          g,
          direction,
          d,
          _common.as_scalar(delta, g),
          _common.as_scalar(wd_ratio, g),
          _common.as_scalar(eps, g),
        )
        if not nesterov:
          b = direction  # the official in-place aliasing, see docstring
      else:
        wd = one
      out = direction
      if dec:
        out = out + _common.as_scalar(weight_decay, g) * wd / (one - mom) * p
      out_u.append(out.astype(p_in.dtype))
      out_b.append(b.astype(b_in.dtype))
    un = treedef.unflatten
    return un(out_u), ScaleBySgdpState(
      _common.increment(state.count), un(out_b)
    )

  return optax.GradientTransformation(init_fn, update_fn)


@_common.scoped_transform
def sgdp(
  learning_rate: optax.ScalarOrSchedule,
  momentum: ArrayLike = 0.0,
  *,
  dampening: ArrayLike = 0.0,
  weight_decay: ArrayLike = 0.0,
  nesterov: bool = False,
  eps: ArrayLike = 1e-8,
  delta: ArrayLike = 0.1,
  wd_ratio: ArrayLike = 0.1,
  mu_dtype: DTypeLike | None = None,
  axes: _axes.AxesSpec = None,
  mask: Any = None,
) -> optax.GradientTransformation:
  r"""SGDP (Heo et al. 2021): SGD with momentum and AdamP's projection.

  ``chain(scale_by_sgdp(..., weight_decay), scale_by_learning_rate(lr))``;
  equal to ``adamp.SGDP`` step for step, including its in-place aliasing of
  the projected direction into the momentum buffer (see `scale_by_sgdp`).

  Args:
    learning_rate: scalar or schedule (required, as in the official code).
    momentum: momentum factor.
    dampening: momentum dampening.
    weight_decay: decay; the official decay is divided by ``1 - momentum``.
    nesterov: Nesterov direction.
    eps: cosine / normalization epsilon.
    delta: cosine threshold.
    wd_ratio: decay multiplier on projected weights.
    mu_dtype: momentum dtype (``None``: float32 for half-precision params,
      else theirs; a dtype forces it).
    axes: matrix axes spec (default: Flax layout, output = last axis).
    mask: which leaves are decayed, as ``optax.adamw(mask=...)``: a pytree
      of bools (the params' structure or a prefix of it) or a callable from
      params to one. ``None`` (default) decays every leaf, the official
      behaviour. The ``wd_ratio`` coupling applies to the decayed leaves.

  Returns:
    An `optax.GradientTransformation` (``update`` needs ``params``).

  Examples:
    The radial part of a nearly orthogonal gradient is removed,
    ``-lr (g - w (w . g) / |w|^2)``:

    >>> w = {"w": jnp.array([[1.0], [2.0]])}  # (in=2, out=1): one unit
    >>> g = {"w": jnp.array([[0.2], [-0.09]])}  # w . g = 0.02
    >>> opt = optim.sgdp(learning_rate=0.1)
    >>> u, state = opt.update(g, opt.init(w), w)
    >>> print(np.asarray(u["w"], float).round(4).tolist())  # w . u = 0
    [[-0.0196], [0.0098]]

  References:
    Heo et al., *AdamP: Slowing Down the Slowdown for Momentum Optimizers on
    Scale-invariant Weights*, arXiv:2006.08217 (2021).
  """
  return _common.standard_promotion(
    optax.chain(
      scale_by_sgdp(
        momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        eps=eps,
        delta=delta,
        wd_ratio=wd_ratio,
        mu_dtype=mu_dtype,
        axes=axes,
        mask=mask,
      ),
      optax.scale_by_learning_rate(learning_rate),
    )
  )
