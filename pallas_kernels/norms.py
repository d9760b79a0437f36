"""Fused RMSNorm / LayerNorm kernels, forward and backward, GPU and TPU.

Each public function has the signature of its reference in `jaxnorm.norms`
plus the keyword-only knobs ``block_rows``, ``backend`` and ``interpret``,
and carries a `jax.custom_vjp` whose backward pass is a Pallas kernel too:

* forward: one read of ``x``, one write of ``y``; statistics in float32,
  two-pass within the block (the whole row is on chip), like the reference.
* backward: reads ``x`` and ``dy``, recomputes the row statistics (free in a
  memory-bound kernel, and it saves writing and re-reading them), writes
  ``dx`` and per-block partial sums of the parameter gradients, which a tiny
  second pass (`jnp.sum` over blocks) reduces.

Tiling and lowerings: `pallas_kernels._rows` (one heuristic,
`norm_block_heuristic`); on GPU the default is the Mosaic GPU lowering
(`pallas_kernels.mosaic_gpu_rows`), and ``backend="triton"`` keeps the
Triton one while the installed JAX has it. Unsupported inputs raise
`NotImplementedError` naming the case, so `implementation=None` dispatch can
fall back to the reference: normalized axes that are not the trailing ones,
rows wider than `MAX_FEATURES` (Mosaic GPU: wider than 8192 or not a
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

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks
from pallas_kernels import _rows, mosaic_gpu_rows, sharding

Axis = int | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Static:
  """Hashable static configuration of one kernel call."""

  tiling: _rows.RowTiling
  interpret: Any
  eps: float = 0.0
  offset: float = 0.0
  eps_mode: str = "inside"
  has_scale: bool = False
  has_bias: bool = False
  kind: str = "rms"
  h_dtype: str = "float32"
  x_dtype: str = "float32"
  num_heads: int = 1
  div_dim: bool = False


def _prepare(
  who: str,
  x: Any,
  axis: Axis,
  block_rows: int | None,
  interpret: Any,
  backend: str | None,
) -> tuple[jax.Array, tuple[int, ...], _rows.RowTiling, Any]:
  """Validates the kernel-specific facts and builds the tiling.

  Returns ``(x, axes, tiling, interpret)`` with ``interpret`` the value to
  pass to Pallas (`_rows.interpreter`).
  """
  _checks.check_floating(who, "x", x)
  x = jnp.asarray(x)
  axes = _checks.normalize_axes(who, axis, x.ndim)
  lowering = _rows.row_lowering(who, interpret, backend)
  _rows.trailing_axes(who, axes, x.ndim)
  _rows.check_dtype(who, x.dtype, lowering)
  if x.size == 0:
    raise NotImplementedError(
      f"{who}: kernels need a non-empty input, got x.shape={x.shape}"
    )
  rows, feats = _rows.flatten_rows(x, len(axes))
  tiling = _rows.norm_block_heuristic(
    who, lowering, rows, feats, x.dtype, block_rows
  )
  return x, axes, tiling, _rows.interpreter(lowering, interpret)


def _row_call(
  st: _Static, body, row_inputs, params, out_dtypes, partials, name
):
  """`_rows.row_call` or its Mosaic GPU twin, per the tiling's lowering."""
  call = (
    mosaic_gpu_rows.row_call
    if st.tiling.lowering == "mosaic_gpu"
    else _rows.row_call
  )
  return call(
    body,
    st.tiling,
    row_inputs,
    params,
    out_dtypes,
    partials,
    interpret=st.interpret,
    name=name,
  )


def _mesh_rows(
  who: str, x: Any, axis: Any
) -> tuple[Any, PartitionSpec, int] | None:
  """``(mesh, row_spec, num_feature_axes)`` to run per device, or ``None``.

  The mesh is the context one (`jax.set_mesh`), else that of a sharded
  ``x`` (a `NamedSharding`). ``None`` without a mesh of more than one
  device, inside a `shard_map` (manual axes: already per device), and for
  arguments the kernel itself rejects (it raises its own error).

  Raises:
    NotImplementedError: when ``x`` is explicitly sharded along a
      normalized axis (a row must live on one device).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:  # a sharded input carries its mesh
    mesh = getattr(jax.typeof(x).sharding, "mesh", mesh)
  if mesh.empty or mesh.size == 1:
    return None
  if any(t == AxisType.Manual for t in mesh.axis_types):
    return None
  ndim = jnp.ndim(x)
  try:
    axes = _checks.normalize_axes(who, axis, ndim)
  except (TypeError, ValueError):
    return None
  nf = len(axes)
  if axes != tuple(range(ndim - nf, ndim)):
    return None
  spec = tuple(getattr(jax.typeof(x).sharding, "spec", ()))
  spec += (None,) * (ndim - len(spec))
  if any(s is not None for s in spec[ndim - nf :]):
    raise NotImplementedError(
      f"{who}: x is sharded along a normalized axis, sharding "
      f"spec={spec}; a row must live on one device, so reshard it or use "
      "the reference (implementation='xla')"
    )
  if not any(s is not None for s in spec):
    spec = _split_rows(mesh, jnp.shape(x)[: ndim - nf]) + (None,) * nf
  return mesh, PartitionSpec(*spec), nf


def _split_rows(mesh: Any, lead: tuple[int, ...]) -> tuple[Any, ...]:
  """Each mesh axis over the first leading axis whose size it divides."""
  left, names = list(lead), [[] for _ in lead]
  for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True):
    for d, n in enumerate(left):
      if size > 1 and n % size == 0:
        names[d].append(name)
        left[d] //= size
        break
  return tuple(
    None if not n else n[0] if len(n) == 1 else tuple(n) for n in names
  )


def _on_mesh(num_row_args: int):
  """Runs the decorated kernel per device on the context mesh.

  `_mesh_rows` decides whether and how; the kernel then goes through
  `sharding.shard_rows` with its keyword arguments, and the parameters
  (the positional arguments after the ``num_row_args`` row arrays) are
  replicated.
  """

  def wrap(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
      plan = _mesh_rows(fn.__name__, args[0], kwargs.get("axis", -1))
      if plan is None:
        return fn(*args, **kwargs)
      mesh, spec, nf = plan
      return sharding.shard_rows(
        fn,
        mesh,
        spec,
        num_row_args=num_row_args,
        num_feature_axes=nf,
        **kwargs,
      )(*args)

    return run

  return wrap


def _check_param(
  who: str, name: str, p: Any, x: jax.Array, axes: tuple[int, ...]
) -> None:
  if p is None:
    return
  _checks.check_floating(who, name, p)
  _checks.check_shape(
    who, name, p, tuple(x.shape[a] for a in axes), "x.shape[axis]"
  )


def _flat(p: Any, feats: int) -> jax.Array:
  return jnp.asarray(p).reshape(feats)


def _gain(ps: list[jax.Array], st: _Static) -> jax.Array | float:
  """``scale + offset`` as a (1, width) row, or the scalar ``1 + offset``."""
  if st.has_scale:
    return ps[0] + st.offset
  return 1.0 + st.offset


# ---------------------------------------------------------------------------
# RMSNorm.


def _rms_k(x: jax.Array, st: _Static, ops: _rows.RowOps):
  """Mean square and the normalizing factor ``k`` of each row (row form)."""
  ms = ops.mean(x * x)
  if st.eps_mode == "inside":
    return ms, jax.lax.rsqrt(ms + st.eps)
  return ms, 1.0 / (ops.sqrt(ms) + st.eps)


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


def _params(*ps):
  return [p for p in ps if p is not None]


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
    who, x, axis, block_rows, interpret, backend
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
    who, x, axis, block_rows, interpret, backend
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
