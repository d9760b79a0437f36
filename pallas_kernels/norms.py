"""Fused RMSNorm / LayerNorm kernels, forward and backward, GPU and TPU.

Each public function has the signature of its reference in `jaxnorm.norms`
plus the keyword-only knobs ``block_rows``, ``backend`` and ``interpret``,
and carries a `jax.custom_vjp` whose backward pass is a Pallas kernel too:

* forward: one read of ``x``, one write of ``y``; statistics in float32,
  two-pass within the block (the whole row is on chip), like the reference.
* backward: reads ``x`` and ``dy``, recomputes the row statistics (free in a
  memory-bound kernel, and it saves writing and re-reading them), writes
  ``dx`` and per-block partial sums of the parameter gradients, which a tiny
  second pass (`jnp.sum` over blocks) reduces. The gradient is derived by
  hand (`_rms_bwd_math`, `_ln_bwd_math`); the reference has none (autodiff
  differentiates it), and the hand form is tested against that.

Tiling and lowerings: `pallas_kernels._rows` (one heuristic,
`norm_block_heuristic`); on GPU the default is the Mosaic GPU lowering
(`pallas_kernels.mosaic_gpu_rows`), and ``backend="triton"`` keeps the
Triton one while the installed JAX has it. Unsupported inputs raise
`NotImplementedError` naming the case, so `implementation=None` dispatch can
fall back to the reference: normalized axes that are not the trailing ones,
rows wider than `MAX_FEATURES` (Mosaic GPU: wider than 4096 or not a
multiple of 32), dtypes the lowering lacks, empty inputs, CPU without
``interpret``, a backend the device or the installed JAX lacks.

On a device mesh (an active `jax.set_mesh` with more than one device and no
manual axes) every kernel runs per device under `jax.shard_map`
(`pallas_kernels.sharding.shard_rows`): a Pallas call cannot be partitioned
by XLA. The rows are split as the input's explicit sharding says, or, for
`AxisType.Auto` axes, each mesh axis over the first leading axis it divides;
a sharded normalized axis raises `NotImplementedError` (see `_on_mesh`).
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
  _gain,
  _on_mesh,
  _params,
  _prepare,
  _rms_k,
  _row_call,
  _Static,
)

# DyT and SeeDNorm live in `dyt_seed`; re-exported for `implementation=`.
from pallas_kernels.dyt_seed import MAX_SEED_HEADS, dyt_pallas, seed_norm_pallas

# ---------------------------------------------------------------------------
# RMSNorm.


def _rms_fwd_math(x, ps, st, ops):
  _, k = _rms_k(x, st, ops)
  return x * ops.full(k) * _gain(ps, st)


def _rms_bwd_math(x, dy, ps, st, ops):
  # y = w x k(m), m = mean(x^2): dx = k g - a x with g = dy w and
  # a = mean(g x) k^3 (inside) or mean(g x) k^2 / sqrt(m) (outside, 0 at m=0).
  ms, k = _rms_k(x, st, ops)
  g = dy * _gain(ps, st)
  gx = ops.mean(g * x)
  if st.eps_mode == "inside":
    a = gx * k * k * k
  else:
    safe = ms > 0
    inv = jnp.where(safe, jax.lax.rsqrt(jnp.where(safe, ms, 1.0)), 0.0)
    a = gx * k * k * inv
  kf = ops.full(k)
  contribs = [dy * x * kf] if st.has_scale else []
  return kf * g - ops.full(a) * x, contribs


def _rms_fwd_body(st: _Static):
  def body(xs, ps, ops):
    return [_rms_fwd_math(xs[0], ps, st, ops)], []

  return body


def _rms_bwd_body(st: _Static):
  def body(xs, ps, ops):
    dx, contribs = _rms_bwd_math(xs[0], xs[1], ps, st, ops)
    return [dx], contribs

  return body


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_core(x2, scale, st):
  return _rms_core_fwd(x2, scale, st)[0]


def _rms_core_fwd(x2, scale, st):
  params = [] if scale is None else [scale]
  (y,), _ = _row_call(
    st, _rms_fwd_body(st), [x2], params, [x2.dtype], 0, "jaxnorm_rms_norm_fwd"
  )
  return y, (x2, scale)


def _rms_core_bwd(st, res, dy):
  x2, scale = res
  params = [] if scale is None else [scale]
  (dx,), sums = _row_call(
    st,
    _rms_bwd_body(st),
    [x2, dy],
    params,
    [x2.dtype],
    len(params),
    "jaxnorm_rms_norm_bwd",
  )
  dscale = None if scale is None else sums[0].astype(scale.dtype)
  return dx, dscale


_rms_core.defvjp(_rms_core_fwd, _rms_core_bwd)


@_on_mesh(1)
def rms_norm_pallas(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  eps_mode: str = "inside",
  scale_offset: float = 0.0,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "..."]:
  r"""RMSNorm as a fused Pallas kernel (forward and backward).

  Same maths and conventions as `jaxnorm.norms.rms_norm`:
  :math:`y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot x\,k` with
  :math:`k = 1/\sqrt{\mathrm{mean}(x^2) + \epsilon}` (``eps_mode="inside"``)
  or :math:`1/(\sqrt{\mathrm{mean}(x^2)} + \epsilon)` (``"outside"``).

  Args:
    x: input ``(..., d)``, float32, bfloat16 (or float16 on GPU).
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    eps: stabilizer.
    axis: the trailing axis or axes to normalize over.
    eps_mode: ``"inside"`` or ``"outside"`` the square root.
    scale_offset: constant added to ``scale``.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: ``"mosaic_gpu"``, ``"triton"`` (while the installed JAX has
      it) or ``"mosaic_tpu"``; ``None`` picks the device's default (Mosaic
      GPU on NVIDIA GPUs of compute capability >= 9.0, Triton on older GPUs,
      Mosaic TPU on TPUs; Mosaic GPU in the interpreter).
    interpret: ``True`` runs the ``backend`` kernel in its interpreter,
      ``pltpu.InterpretParams()`` the TPU kernel and ``InterpretGPUParams()``
      the Mosaic GPU kernel in theirs, ``False`` compiles for the device.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or scale.
    ValueError: for a bad axis, scale shape, ``eps_mode`` or ``block_rows``.
    NotImplementedError: for a case the kernel does not cover (see module
      docstring).

  References:
    Zhang & Sennrich, *Root Mean Square Layer Normalization*,
    arXiv:1910.07467 (2019).
  """
  who = "rms_norm_pallas"
  _checks.check_choice(who, "eps_mode", eps_mode, ("inside", "outside"))
  x, axes, tiling, interpret = _prepare(
    who, x, axis, block_rows, interpret, backend
  )
  _check_param(who, "scale", scale, x, axes)
  st = _Static(
    tiling,
    interpret,
    float(eps),
    float(scale_offset),
    eps_mode,
    has_scale=scale is not None,
  )
  s = None if scale is None else _flat(scale, tiling.features)
  y = _rms_core(x.reshape(tiling.rows, tiling.features), s, st)
  return y.reshape(x.shape)


# ---------------------------------------------------------------------------
# LayerNorm.


def _ln_stats(x: jax.Array, st: _Static, ops: _rows.RowOps):
  """Centered rows (zero in padded columns) and full-tile ``rstd``, two-pass."""
  xc = x - ops.full(ops.mean(x))
  if ops.colmask is not None:
    xc = jnp.where(ops.colmask, xc, 0.0)
  rstd = ops.full(jax.lax.rsqrt(ops.mean(xc * xc) + st.eps))
  return xc, rstd


def _ln_fwd_math(x, ps, st, ops):
  xc, rstd = _ln_stats(x, st, ops)
  y = xc * rstd * _gain(ps, st)
  if st.has_bias:
    y = y + ps[-1]
  return y


def _ln_bwd_math(x, dy, ps, st, ops):
  # dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy (scale + offset).
  xc, rstd = _ln_stats(x, st, ops)
  xhat = xc * rstd
  g = dy * _gain(ps, st)
  mg, mgx = ops.full(ops.mean(g)), ops.full(ops.mean(g * xhat))
  dx = rstd * (g - mg - xhat * mgx)
  contribs = []
  if st.has_scale:
    contribs.append(dy * xhat)
  if st.has_bias:
    contribs.append(dy)
  return dx, contribs


def _ln_fwd_body(st: _Static):
  def body(xs, ps, ops):
    return [_ln_fwd_math(xs[0], ps, st, ops)], []

  return body


def _ln_bwd_body(st: _Static):
  def body(xs, ps, ops):
    dx, contribs = _ln_bwd_math(xs[0], xs[1], ps, st, ops)
    return [dx], contribs

  return body


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ln_core(x2, scale, bias, st):
  return _ln_core_fwd(x2, scale, bias, st)[0]


def _ln_core_fwd(x2, scale, bias, st):
  (y,), _ = _row_call(
    st,
    _ln_fwd_body(st),
    [x2],
    _params(scale, bias),
    [x2.dtype],
    0,
    "jaxnorm_layer_norm_fwd",
  )
  return y, (x2, scale, bias)


def _ln_core_bwd(st, res, dy):
  x2, scale, bias = res
  params = _params(scale, bias)
  (dx,), sums = _row_call(
    st,
    _ln_bwd_body(st),
    [x2, dy],
    params,
    [x2.dtype],
    len(params),
    "jaxnorm_layer_norm_bwd",
  )
  sums = iter(sums)
  dscale = None if scale is None else next(sums).astype(scale.dtype)
  dbias = None if bias is None else next(sums).astype(bias.dtype)
  return dx, dscale, dbias


_ln_core.defvjp(_ln_core_fwd, _ln_core_bwd)


@_on_mesh(1)
def layer_norm_pallas(
  x: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  scale_offset: float = 0.0,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> Float[Array, "..."]:
  r"""LayerNorm as a fused Pallas kernel (forward and backward).

  Same maths and conventions as `jaxnorm.norms.layer_norm`:
  :math:`y = (\mathrm{scale} + \mathrm{scale\_offset}) \odot (x - \mu)
  / \sqrt{\sigma^2 + \epsilon} + \mathrm{bias}`, two-pass variance.

  Args:
    x: input ``(..., d)``, float32, bfloat16 (or float16 on GPU).
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    bias: offset of shape ``x.shape[axis]`` or ``None``.
    eps: added to the variance.
    axis: the trailing axis or axes to normalize over.
    scale_offset: constant added to ``scale``.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: see `rms_norm_pallas`.
    interpret: see `rms_norm_pallas`.

  Returns:
    Array with the shape and dtype of ``x``.

  Raises:
    TypeError: for non-floating input or parameters.
    ValueError: for a bad axis, parameter shape or ``block_rows``.
    NotImplementedError: for a case the kernel does not cover.

  References:
    Ba, Kiros & Hinton, *Layer Normalization*, arXiv:1607.06450 (2016).
  """
  who = "layer_norm_pallas"
  x, axes, tiling, interpret = _prepare(
    who, x, axis, block_rows, interpret, backend
  )
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  st = _Static(
    tiling,
    interpret,
    float(eps),
    float(scale_offset),
    has_scale=scale is not None,
    has_bias=bias is not None,
  )
  f = tiling.features
  s = None if scale is None else _flat(scale, f)
  b = None if bias is None else _flat(bias, f)
  y = _ln_core(x.reshape(tiling.rows, f), s, b, st)
  return y.reshape(x.shape)


# ---------------------------------------------------------------------------
# Fused residual add + RMSNorm / LayerNorm.


def _norm_fwd_math(h, ps, st, ops):
  if st.kind == "rms":
    return _rms_fwd_math(h, ps, st, ops)
  return _ln_fwd_math(h, ps, st, ops)


def _norm_bwd_math(h, dy, ps, st, ops):
  if st.kind == "rms":
    return _rms_bwd_math(h, dy, ps, st, ops)
  return _ln_bwd_math(h, dy, ps, st, ops)


def _add_fwd_body(st: _Static):
  def body(xs, ps, ops):
    x, r = xs
    # The stream is stored in residual.dtype; normalize the stored value.
    h = (x + r).astype(st.h_dtype).astype(jnp.float32)
    return [h, _norm_fwd_math(h, ps, st, ops)], []

  return body


def _add_bwd_body(st: _Static):
  def body(xs, ps, ops):
    h, dy, dh = xs
    dn, contribs = _norm_bwd_math(h, dy, ps, st, ops)
    return [dn + dh], contribs

  return body


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _add_core(x2, r2, scale, bias, st):
  return _add_core_fwd(x2, r2, scale, bias, st)[0]


def _add_core_fwd(x2, r2, scale, bias, st):
  (h, y), _ = _row_call(
    st,
    _add_fwd_body(st),
    [x2, r2],
    _params(scale, bias),
    [r2.dtype, r2.dtype],
    0,
    f"jaxnorm_add_{st.kind}_norm_fwd",
  )
  return (h, y), (h, scale, bias)


def _add_core_bwd(st, res, cts):
  h, scale, bias = res
  dh, dy = cts
  params = _params(scale, bias)
  (d,), sums = _row_call(
    st,
    _add_bwd_body(st),
    [h, dy, dh],
    params,
    [h.dtype],
    len(params),
    f"jaxnorm_add_{st.kind}_norm_bwd",
  )
  sums = iter(sums)
  dscale = None if scale is None else next(sums).astype(scale.dtype)
  dbias = None if bias is None else next(sums).astype(bias.dtype)
  return d.astype(st.x_dtype), d, dscale, dbias


_add_core.defvjp(_add_core_fwd, _add_core_bwd)


def _add_norm(
  who,
  kind,
  x,
  residual,
  scale,
  bias,
  eps,
  axis,
  eps_mode,
  scale_offset,
  block_rows,
  backend,
  interpret,
):
  x, axes, tiling, interpret = _prepare(
    who, x, axis, block_rows, interpret, backend
  )
  _checks.check_floating(who, "residual", residual)
  residual = jnp.asarray(residual)
  _checks.check_shape(who, "residual", residual, x.shape, "x.shape")
  _rows.check_dtype(who, residual.dtype, tiling.lowering)
  _check_param(who, "scale", scale, x, axes)
  _check_param(who, "bias", bias, x, axes)
  st = _Static(
    tiling,
    interpret,
    float(eps),
    float(scale_offset),
    eps_mode,
    has_scale=scale is not None,
    has_bias=bias is not None,
    kind=kind,
    h_dtype=jnp.dtype(residual.dtype).name,
    x_dtype=jnp.dtype(x.dtype).name,
  )
  f, r = tiling.features, tiling.rows
  s = None if scale is None else _flat(scale, f)
  b = None if bias is None else _flat(bias, f)
  h, y = _add_core(x.reshape(r, f), residual.reshape(r, f), s, b, st)
  return h.reshape(x.shape), y.reshape(x.shape)


@_on_mesh(2)
def add_rms_norm_pallas(
  x: Float[ArrayLike, "..."],
  residual: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  eps_mode: str = "inside",
  scale_offset: float = 0.0,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  r"""Fused residual add + RMSNorm: one pass returns the stream and its norm.

  Kernel of `jaxnorm.fused_norms.add_rms_norm`:
  :math:`h = \mathrm{residual} + x` (float32 add, stored in
  ``residual.dtype``) and :math:`y = \mathrm{rms\_norm}(h)`. The forward
  reads ``x`` and ``residual`` and writes ``h`` and ``y`` (4 arrays instead
  of 6 unfused); the backward reads ``h``, ``dy`` and ``dh`` and writes the
  single gradient shared by ``x`` and ``residual``.

  Args:
    x: the branch output ``(..., d)``.
    residual: the residual stream, same shape as ``x``.
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    eps: stabilizer.
    axis: the trailing axis or axes to normalize over.
    eps_mode: ``"inside"`` or ``"outside"`` the square root.
    scale_offset: constant added to ``scale``.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: see `rms_norm_pallas`.
    interpret: see `rms_norm_pallas`.

  Returns:
    ``(h, y)``, both with the shape and dtype of ``residual``.

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for mismatched shapes, a bad axis or ``block_rows``.
    NotImplementedError: for a case the kernel does not cover.
  """
  who = "add_rms_norm_pallas"
  _checks.check_choice(who, "eps_mode", eps_mode, ("inside", "outside"))
  return _add_norm(
    who,
    "rms",
    x,
    residual,
    scale,
    None,
    eps,
    axis,
    eps_mode,
    scale_offset,
    block_rows,
    backend,
    interpret,
  )


@_on_mesh(2)
def add_layer_norm_pallas(
  x: Float[ArrayLike, "..."],
  residual: Float[ArrayLike, "..."],
  scale: Float[ArrayLike, " *d"] | None = None,
  bias: Float[ArrayLike, " *d"] | None = None,
  *,
  eps: float = 1e-6,
  axis: Axis = -1,
  scale_offset: float = 0.0,
  block_rows: int | None = None,
  backend: str | None = None,
  interpret: Any = False,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
  r"""Fused residual add + LayerNorm (see `add_rms_norm_pallas`).

  Kernel of `jaxnorm.fused_norms.add_layer_norm`:
  :math:`h = \mathrm{residual} + x`, :math:`y = \mathrm{layer\_norm}(h)`.

  Args:
    x: the branch output ``(..., d)``.
    residual: the residual stream, same shape as ``x``.
    scale: gain of shape ``x.shape[axis]`` or ``None``.
    bias: offset of shape ``x.shape[axis]`` or ``None``.
    eps: added to the variance.
    axis: the trailing axis or axes to normalize over.
    scale_offset: constant added to ``scale``.
    block_rows: rows per grid step (default: `norm_block_heuristic`).
    backend: see `rms_norm_pallas`.
    interpret: see `rms_norm_pallas`.

  Returns:
    ``(h, y)``, both with the shape and dtype of ``residual``.

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for mismatched shapes, a bad axis or ``block_rows``.
    NotImplementedError: for a case the kernel does not cover.
  """
  return _add_norm(
    "add_layer_norm_pallas",
    "ln",
    x,
    residual,
    scale,
    bias,
    eps,
    axis,
    "inside",
    scale_offset,
    block_rows,
    backend,
    interpret,
  )


__all__ = [
  "MAX_SEED_HEADS",
  "add_layer_norm_pallas",
  "add_rms_norm_pallas",
  "dyt_pallas",
  "layer_norm_pallas",
  "rms_norm_pallas",
  "seed_norm_pallas",
]
