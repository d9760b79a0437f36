"""DyT and SeeDNorm kernels, forward and backward, GPU and TPU.

Same contract, tiling, lowerings and mesh handling as the RMSNorm and
LayerNorm kernels of `pallas_kernels.norms`, which re-exports these.

Their backward kernels keep more values live than RMSNorm's (DyT: the tanh
and the three parameter-gradient contributions; SeeDNorm: per-head dynamic
scales and four contributions), so their Mosaic GPU blocks are smaller
(`DYT_GPU_BLOCK_ELEMS`, `SEED_GPU_BLOCK_ELEMS`): at RMSNorm's 64 float32 per
thread per tile ptxas (sm_90a, jax 0.12.0.1) spilled 52 bytes from the DyT
backward at 2 x 4096 float32, and 128-200 bytes from SeeDNorm's at 4 x 1152
(36 per thread) and 2 x 4096, while DyT at 4 x 1152 and SeeDNorm at
4 x 1024 (32 per thread) compiled without. Wider rows run the reference
under ``implementation=None``; the compile set
(`tests/pallas_kernels/test_aot_compile.py`) checks every width it tries.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks
from pallas_kernels import _rows
from pallas_kernels._norm_rows import (
  Axis,
  _check_param,
  _flat,
  _on_mesh,
  _params,
  _prepare,
  _rms_k,
  _row_call,
  _Static,
)

# Largest Mosaic GPU blocks (elements; one warpgroup of 128 threads).
DYT_GPU_BLOCK_ELEMS = 128 * 48
SEED_GPU_BLOCK_ELEMS = 128 * 32


# ---------------------------------------------------------------------------
# DyT.


def _dyt_fwd_body(st: _Static):
  def body(xs, ps, ops):
    del ops
    a, *rest = ps
    y = jnp.tanh(a * xs[0])
    if st.has_scale:
      y = y * rest[0]
    if st.has_bias:
      y = y + rest[-1]
    return [y], []

  return body


def _dyt_bwd_body(st: _Static):
  # y = w tanh(a x) + b: dx = dy w a (1 - t^2), da = sum dy w (1 - t^2) x,
  # dw = sum dy t, db = sum dy.
  def body(xs, ps, ops):
    del ops
    x, dy = xs
    a, *rest = ps
    t = jnp.tanh(a * x)
    g = dy * rest[0] if st.has_scale else dy
    u = g * (1.0 - t * t)
    contribs = [u * x]
    if st.has_scale:
      contribs.append(dy * t)
    if st.has_bias:
      contribs.append(dy)
    return [u * a], contribs

  return body


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dyt_core(x2, alpha, scale, bias, st):
  return _dyt_core_fwd(x2, alpha, scale, bias, st)[0]


def _alpha_row(alpha, st):
  return jnp.broadcast_to(
    alpha.astype(jnp.float32).reshape(()), (st.tiling.features,)
  )


def _dyt_core_fwd(x2, alpha, scale, bias, st):
  (y,), _ = _row_call(
    st,
    _dyt_fwd_body(st),
    [x2],
    [_alpha_row(alpha, st), *_params(scale, bias)],
    [x2.dtype],
    0,
    "jaxnorm_dyt_fwd",
  )
  return y, (x2, alpha, scale, bias)


def _dyt_core_bwd(st, res, dy):
  x2, alpha, scale, bias = res
  params = [_alpha_row(alpha, st), *_params(scale, bias)]
  (dx,), sums = _row_call(
    st,
    _dyt_bwd_body(st),
    [x2, dy],
    params,
    [x2.dtype],
    len(params),
    "jaxnorm_dyt_bwd",
  )
  dalpha, *sums = sums
  dalpha = jnp.sum(dalpha).reshape(alpha.shape).astype(alpha.dtype)
  sums = iter(sums)
  dscale = None if scale is None else next(sums).astype(scale.dtype)
  dbias = None if bias is None else next(sums).astype(bias.dtype)
  return dx, dalpha, dscale, dbias


_dyt_core.defvjp(_dyt_core_fwd, _dyt_core_bwd)


@_on_mesh(1)
def dyt_pallas(
  x: Float[ArrayLike, "..."],
  alpha: Float[ArrayLike, " "],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  axis: Axis = -1,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "..."]:
  r"""Dynamic Tanh as a fused Pallas kernel (forward and backward).

  Same maths as `jaxnorm.norms.dyt`:
  :math:`y = \mathrm{scale} \odot \tanh(\alpha x) + \mathrm{bias}`. The
  backward writes ``dx`` and per-block partial sums for ``scale``, ``bias``
  and ``alpha`` (the scalar's gradient is the sum of its row partials).
  DyT is element-wise, so the row blocking only serves the parameter
  reductions; the tiling is the norms' (`norm_block_heuristic`).

  Args:
    x: input ``(..., d)``, float32, bfloat16 (or float16 on GPU).
    alpha: scalar of shape ``()`` or ``(1,)``.
    scale: gain over the trailing ``axis`` or ``None``.
    bias: offset over the trailing ``axis`` or ``None``.
    axis: the trailing axis or axes ``scale`` and ``bias`` run along.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: see `rms_norm_pallas`.
    interpret: see `rms_norm_pallas`.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a non-scalar ``alpha``, bad axis or parameter shape.
    NotImplementedError: for a case the kernel does not cover.

  References:
    Zhu, Chen, He, LeCun & Liu, *Transformers without Normalization*,
    arXiv:2503.10622 (2025).
  """
  who = "dyt_pallas"
  _checks.check_floating(who, "alpha", alpha)
  if jnp.size(alpha) != 1 or jnp.ndim(alpha) > 1:
    raise ValueError(
      f"{who}: alpha must be a scalar of shape () or (1,), "
      f"got alpha.shape={jnp.shape(alpha)}"
    )
  x, axes, tiling, interpret = _prepare(
    who, x, axis, block_rows, interpret, backend, DYT_GPU_BLOCK_ELEMS
  )
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  st = _Static(
    tiling, interpret, has_scale=scale is not None, has_bias=bias is not None
  )
  f = tiling.features
  s = None if scale is None else _flat(scale, f)
  b = None if bias is None else _flat(bias, f)
  y = _dyt_core(x.reshape(tiling.rows, f), jnp.asarray(alpha), s, b, st)
  return y.reshape(x.shape)


# ---------------------------------------------------------------------------
# SeeDNorm.

# Heads are handled by an unrolled loop of masked row sums (portable to
# Triton and Mosaic for any head width); beyond this many heads a kernel
# with a (rows, heads, head_dim) layout would be needed.
MAX_SEED_HEADS = 64


def _head_masks(st: _Static, ops: _rows.RowOps) -> list[jax.Array]:
  hd = st.tiling.features // st.num_heads
  col = ops.col_ids()
  return [
    jnp.logical_and(col >= h * hd, col < (h + 1) * hd)
    for h in range(st.num_heads)
  ]


def _per_head(v: jax.Array, masks: list[jax.Array], fn, ops) -> jax.Array:
  """Sums ``v`` over each head's columns, maps ``fn``, spreads it back."""
  out = jnp.zeros_like(v)
  for m in masks:
    sh = ops.sum(jnp.where(m, v, 0.0))
    out = jnp.where(m, ops.full(fn(sh)), out)
  return out


def _seed_terms(x, ps, st, ops):
  gamma, alpha, beta = ps
  masks = _head_masks(st, ops)
  scale_dot = 1.0 / st.tiling.features if st.div_dim else 1.0
  t = _per_head(x * beta, masks, lambda d: jnp.tanh(d * scale_dot), ops)
  _, k = _rms_k(x, st, ops)
  return gamma + alpha * t, t, ops.full(k), masks, scale_dot


def _seed_fwd_body(st: _Static):
  def body(xs, ps, ops):
    s, _, k, _, _ = _seed_terms(xs[0], ps, st, ops)
    return [s * xs[0] * k], []

  return body


def _seed_bwd_body(st: _Static):
  # y = s x k with s = gamma + alpha tanh(dot_h), dot_h = <x_h, beta_h> (/D):
  # the RMS part is RMSNorm's backward with gain s; the dynamic part adds
  # ddot_h beta to dx, ddot_h = sum_h(dy x k alpha) (1 - t_h^2) (/D).
  def body(xs, ps, ops):
    x, dy = xs
    _, alpha, beta = ps
    s, t, k, masks, scale_dot = _seed_terms(x, ps, st, ops)
    g = dy * s
    gx = ops.full(ops.mean(g * x))
    ds = dy * x * k
    ddot = _per_head(ds * alpha, masks, lambda v: v, ops) * (1.0 - t * t)
    ddot = ddot * scale_dot
    dx = k * g - gx * k * k * k * x + ddot * beta
    return [dx], [ds, ds * t, ddot * x]

  return body


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _seed_core(x2, scale, dyn_scale, dyn_proj, st):
  return _seed_core_fwd(x2, scale, dyn_scale, dyn_proj, st)[0]


def _seed_core_fwd(x2, scale, dyn_scale, dyn_proj, st):
  (y,), _ = _row_call(
    st,
    _seed_fwd_body(st),
    [x2],
    [scale, dyn_scale, dyn_proj],
    [x2.dtype],
    0,
    "jaxnorm_seed_norm_fwd",
  )
  return y, (x2, scale, dyn_scale, dyn_proj)


def _seed_core_bwd(st, res, dy):
  x2, *params = res
  (dx,), sums = _row_call(
    st,
    _seed_bwd_body(st),
    [x2, dy],
    params,
    [x2.dtype],
    3,
    "jaxnorm_seed_norm_bwd",
  )
  return (dx, *(g.astype(p.dtype) for g, p in zip(sums, params)))


_seed_core.defvjp(_seed_core_fwd, _seed_core_bwd)


@_on_mesh(1)
def seed_norm_pallas(
  x: Float[ArrayLike, "... d"],
  scale: Float[ArrayLike, " d"],
  dyn_scale: Float[ArrayLike, " d"],
  dyn_proj: Float[ArrayLike, " d"],
  *,
  eps: float = 1e-6,
  num_heads: int = 1,
  axis: int = -1,
  dyn_scale_div_dim: bool = False,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "... d"]:
  r"""SeeDNorm as a fused Pallas kernel (forward and backward).

  Same maths as `jaxnorm.norms.seed_norm`:
  :math:`y = (\gamma + \alpha \tanh(\langle x_h, \beta_h \rangle))
  \odot x / \sqrt{\mathrm{mean}(x^2) + \epsilon}` per head ``h``. The
  backward writes ``dx`` and per-block partial sums for all three parameter
  vectors. Heads are unrolled masked reductions (at most
  ``MAX_SEED_HEADS = 64``).

  Args:
    x: input ``(..., d)``; ``axis`` must be the last axis.
    scale: :math:`\gamma`, shape ``(d,)``.
    dyn_scale: :math:`\alpha`, shape ``(d,)``.
    dyn_proj: :math:`\beta`, shape ``(d,)``.
    eps: added inside the square root.
    num_heads: number of heads; must divide ``d``.
    axis: the feature axis (the last one).
    dyn_scale_div_dim: divide the dot product by ``d`` before the tanh.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: see `rms_norm_pallas`.
    interpret: see `rms_norm_pallas`.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or head count.
    NotImplementedError: for a case the kernel does not cover (including
      ``num_heads > 64``).

  References:
    Cai, Zhu, Liu & Min, *SeeDNorm: Self-Rescaled Dynamic Normalization*,
    arXiv:2510.22777 (2025).
  """
  who = "seed_norm_pallas"
  if isinstance(axis, (tuple, list)):
    raise ValueError(f"{who}: axis must be a single int, got {axis=}")
  _checks.check_positive_int(who, "num_heads", num_heads)
  # The head limit holds for every lowering, so it is named before any
  # lowering-specific width limit.
  if num_heads > MAX_SEED_HEADS:
    raise NotImplementedError(
      f"{who}: the kernel unrolls at most {MAX_SEED_HEADS} heads, got "
      f"num_heads={num_heads}; use the reference (implementation='xla')"
    )
  x, axes, tiling, interpret = _prepare(
    who, x, axis, block_rows, interpret, backend, SEED_GPU_BLOCK_ELEMS
  )
  params = {"scale": scale, "dyn_scale": dyn_scale, "dyn_proj": dyn_proj}
  for name, p in params.items():
    if p is None:
      raise ValueError(f"{who}: {name} is required, got None")
    _check_param(who, name, p, x, axes)
  _checks.check_divisible(
    who, "x.shape[axis]", tiling.features, "num_heads", num_heads
  )
  st = _Static(
    tiling,
    interpret,
    float(eps),
    num_heads=num_heads,
    div_dim=bool(dyn_scale_div_dim),
  )
  f = tiling.features
  y = _seed_core(
    x.reshape(tiling.rows, f), *(_flat(p, f) for p in params.values()), st
  )
  return y.reshape(x.shape)
