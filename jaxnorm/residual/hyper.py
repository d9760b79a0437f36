"""Multi-stream residuals: streams, their shared update, Hyper-Connections.

Expansion of the embedding into ``n`` streams and their readout, the stream
update shared by HC, mHC, oHC and iHC (`hyper_connection`), and the static
and dynamic Hyper-Connection maps.
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks, _numerics, _scope
from jaxnorm.residual._common import (
  ArrayFn,
  IndexLike,
  check_layer_index,
  check_scalar,
  check_streams,
  leading,
  scalar,
  unit,
)

Readout = Literal["sum", "mean"]
READOUTS: tuple[str, ...] = ("sum", "mean")


def _check_map(
  who: str,
  name: str,
  v: ArrayLike,
  lead: tuple[int, ...],
  core: tuple[int, ...],
) -> None:
  """A map is either static (shape ``core``) or per token (``lead + core``)."""
  _checks.check_floating(who, name, v)
  shape = tuple(np.shape(v))
  if shape != core and shape != lead + core:
    raise ValueError(
      f"{who}: {name} must have shape {core} (static) or {lead + core} "
      f"(per token, h.shape[:-2] + {core}), got {name}.shape={shape}"
    )


@_scope.scoped
def expand_streams(
  x: Float[ArrayLike, "... d"], num_streams: int
) -> Float[Array, "... n d"]:
  r"""Copies the embedding into ``n`` identical residual streams.

  :math:`H^0 = 1_n h_0^\top` (HC Sec. 2; DeepSeek's
  ``expand_from_embedding`` for mHC).

  Args:
    x: hidden state ``(..., d)``.
    num_streams: expansion rate ``n``.

  Returns:
    ``(..., n, d)`` with every stream equal to ``x`` (dtype of ``x``).

  Raises:
    ValueError: for a non-positive ``num_streams`` or a scalar ``x``.

  Examples:
    >>> h = residual.expand_streams(jnp.array([1.0, 2.0]), 3)
    >>> print(h.shape, np.asarray(h[2]))
    (3, 2) [1. 2.]
  """
  who = "expand_streams"
  _checks.check_positive_int(who, "num_streams", num_streams)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  return jnp.broadcast_to(
    x[..., None, :], (*x.shape[:-1], num_streams, x.shape[-1])
  )


@_scope.scoped
def reduce_streams(
  h: Float[ArrayLike, "... n d"], *, readout: Readout = "sum"
) -> Float[Array, "... d"]:
  r"""Reads the hidden state out of the streams before the final norm.

  ``"sum"`` is HC's :math:`h_L = \sum_i H^L_i` (the final norm cancels the
  factor ``n``); ``"mean"`` divides by ``n`` (DepthBench).

  Args:
    h: stream state ``(..., n, d)``.
    readout: ``"sum"`` (default) or ``"mean"``.

  Returns:
    ``(..., d)`` in the dtype of ``h`` (accumulated in float32).

  Raises:
    ValueError: for an unknown ``readout`` or ``h`` of rank < 2.

  Examples:
    >>> h = jnp.array([[1.0, 2.0], [3.0, 4.0]])  # n = 2 streams, d = 2
    >>> print(np.asarray(residual.reduce_streams(h)))
    [4. 6.]
    >>> print(np.asarray(residual.reduce_streams(h, readout="mean")))
    [2. 3.]
  """
  who = "reduce_streams"
  _checks.check_choice(who, "readout", readout, READOUTS)
  check_streams(who, h)
  h = jnp.asarray(h)
  ct = _numerics.compute_dtype(h)
  out = jnp.sum(h.astype(ct), axis=-2)
  if readout == "mean":
    out = out / h.shape[-2]
  return out.astype(h.dtype)


@_scope.scoped
def hyper_connection(
  h: Float[ArrayLike, "... n d"],
  sublayer: ArrayFn,
  *,
  h_pre: Float[ArrayLike, "*b n"],
  h_post: Float[ArrayLike, "*b n"],
  h_res: Float[ArrayLike, "*b n n"],
) -> Float[Array, "... n d"]:
  r"""One multi-stream residual step (HC, mHC, oHC, iHC).

  In the mHC paper's notation (its Eq. 3), with :math:`x_l` the ``n x d``
  stream state ``h``:

  .. math::
    x_{l+1} = H^{res} x_l + {H^{post}}^\top f(H^{pre} x_l),

  i.e. the branch reads :math:`\sum_i H^{pre}_i x_l[i]` and stream ``j``
  becomes :math:`\sum_i H^{res}_{ji} x_l[i] + H^{post}_j\, y`. HC's
  :math:`A_m`, :math:`A_r^\top` and :math:`B` are :math:`H^{pre}`,
  :math:`H^{res}` and :math:`H^{post}`. The maps come from `hc_maps` or
  `mhc_maps`; each may be static (one per layer) or per token.

  Mixing is computed in ``promote_types(h.dtype, float32)``; the branch
  input and the output are cast to ``h.dtype``.

  Args:
    h: stream state ``(..., n, d)``.
    sublayer: the branch ``f`` (with its own pre-norm), ``(..., d)`` to
      ``(..., d)``.
    h_pre: read weights, ``(n,)`` or ``h.shape[:-1]``.
    h_post: write weights, ``(n,)`` or ``h.shape[:-1]``.
    h_res: stream mixing matrix (rows are targets), ``(n, n)`` or
      ``h.shape[:-2] + (n, n)``.

  Returns:
    The new stream state, shape and dtype of ``h``.

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for maps whose shape does not match ``h`` (wrong stream
      count), or a branch that changes the shape.

  Examples:
    >>> h = jnp.array([[1.0, 1.0], [2.0, 2.0]])  # n = 2 streams, d = 2
    >>> y = residual.hyper_connection(
    ...     h, lambda u: 10 * u, h_pre=jnp.array([1.0, 0.0]),
    ...     h_post=jnp.array([1.0, 1.0]), h_res=jnp.eye(2))
    >>> print(np.asarray(y))  # each stream + f(stream 0)
    [[11. 11.]
     [12. 12.]]

  References:
    Zhu et al., *Hyper-Connections*, arXiv:2409.19606 (2024); Xie et al.,
    *mHC: Manifold-Constrained Hyper-Connections*, arXiv:2512.24880 (2025).
  """
  who = "hyper_connection"
  n, d = check_streams(who, h)
  h = jnp.asarray(h)
  lead = h.shape[:-2]
  _check_map(who, "h_pre", h_pre, lead, (n,))
  _check_map(who, "h_post", h_post, lead, (n,))
  _check_map(who, "h_res", h_res, lead, (n, n))
  ct = _numerics.compute_dtype(h)
  hc = h.astype(ct)
  pre = leading(jnp.asarray(h_pre).astype(ct), h.shape[:-1])
  post = leading(jnp.asarray(h_post).astype(ct), h.shape[:-1])
  res = leading(jnp.asarray(h_res).astype(ct), (*lead, n, n))
  x_in = jnp.einsum("...i,...id->...d", pre, hc).astype(h.dtype)
  y = sublayer(x_in)
  if y.shape != x_in.shape:
    raise ValueError(
      f"{who}: the sublayer must map (..., d) to (..., d), "
      f"got input shape {x_in.shape} and output {y.shape}"
    )
  mixed = jnp.einsum("...ji,...id->...jd", res, hc)
  out = mixed + post[..., None] * y.astype(ct)[..., None, :]
  return out.astype(h.dtype)


# ---------------------------------------------------------------------------
# Hyper-Connections (static and dynamic).


@_scope.scoped
def hc_maps(
  h: Float[ArrayLike, "... n d"],
  *,
  static_alpha: Float[ArrayLike, "n n1"],
  static_beta: Float[ArrayLike, " n"],
  dynamic_alpha: Float[ArrayLike, "d n1"] | None = None,
  dynamic_beta: Float[ArrayLike, " d"] | None = None,
  alpha_scale: Float[ArrayLike, ""] | float = 0.01,
  beta_scale: Float[ArrayLike, ""] | float = 0.01,
  norm_scale: Float[ArrayLike, " d"] | None = None,
  tanh: bool = True,
  eps: float = 1e-12,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  r"""Hyper-Connection maps (static SHC or dynamic DHC) for one sublayer.

  The HC matrix is :math:`\alpha = [A_m | A_r] \in R^{n \times (n+1)}` and
  :math:`B \in R^{n}`. Static (SHC): :math:`\alpha` = ``static_alpha``,
  :math:`B` = ``static_beta``. Dynamic (DHC), per token and stream:

  .. math::
    \bar H = \mathrm{norm}(H),\quad
    \alpha(H) = s_\alpha \tanh(\bar H W_\alpha) + \alpha_{static},\quad
    B(H) = s_\beta \tanh(\bar H w_\beta) + B_{static},

  where row ``i`` of :math:`\alpha` and entry ``j`` of :math:`B` come from
  stream ``i`` / ``j``. Returned in `hyper_connection`'s convention:
  ``h_pre = A_m``, ``h_post = B``, ``h_res = A_r^T``.

  Deviation: the paper normalizes with LayerNorm; like the reference code
  (lucidrains ``hyper-connections``, the golden oracle) this uses
  :math:`\mathrm{norm}(x) = x / \max(\lVert x\rVert_2, \epsilon)\,
  \sqrt{d}\,(1 + \gamma)` with ``gamma = norm_scale`` (init 0).

  Paper init (equivalent to Pre-Norm): ``static_alpha = [e_{k mod n} | I]``
  for sublayer ``k``, ``static_beta = 1``, dynamic weights 0, scales 0.01.

  Args:
    h: stream state ``(..., n, d)``.
    static_alpha: :math:`[A_m | A_r]`, shape ``(n, n + 1)``.
    static_beta: :math:`B`, shape ``(n,)``.
    dynamic_alpha: :math:`W_\alpha`, shape ``(d, n + 1)``; ``None`` for
      static HC (then ``dynamic_beta`` must be ``None`` too).
    dynamic_beta: :math:`w_\beta`, shape ``(d,)``.
    alpha_scale: :math:`s_\alpha`, scalar.
    beta_scale: :math:`s_\beta`, scalar.
    norm_scale: :math:`\gamma` of the norm, shape ``(d,)`` (``None`` = 0).
    tanh: apply ``tanh`` to the dynamic terms (the paper's default).
    eps: floor of the L2 norm.

  Returns:
    ``(h_pre, h_post, h_res)``: static shapes ``(n,), (n,), (n, n)``, or per
    token ``h.shape[:-1]``, ``h.shape[:-1]``, ``h.shape[:-2] + (n, n)``;
    float32 (or float64 for float64 input).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for shapes that do not match ``n = h.shape[-2]`` and
      ``d = h.shape[-1]``, or only one of the two dynamic weights.

  Examples:
    >>> alpha, beta = residual.hc_static_init(2, 0)
    >>> h_pre, h_post, h_res = residual.hc_maps(
    ...     jnp.ones((2, 3)), static_alpha=alpha, static_beta=beta)
    >>> print(np.asarray(h_pre), np.asarray(h_post))  # A_m = e_0, B = 1
    [1. 0.] [1. 1.]
    >>> print(np.asarray(h_res))  # A_r^T
    [[1. 0.]
     [0. 1.]]

  References:
    Zhu et al., *Hyper-Connections*, arXiv:2409.19606 (2024), Sec. 2.1-2.2
    and Algorithm 2.
  """
  who = "hc_maps"
  n, d = check_streams(who, h)
  h = jnp.asarray(h)
  _checks.check_floating(who, "static_alpha", static_alpha)
  _checks.check_shape(
    who,
    "static_alpha",
    static_alpha,
    (n, n + 1),
    "(n, n + 1) with n = h.shape[-2]",
  )
  _checks.check_floating(who, "static_beta", static_beta)
  _checks.check_shape(
    who, "static_beta", static_beta, (n,), "(n,) with n = h.shape[-2]"
  )
  if (dynamic_alpha is None) != (dynamic_beta is None):
    raise ValueError(
      f"{who}: give both dynamic_alpha and dynamic_beta "
      "(dynamic HC) or neither (static HC)"
    )
  ct = _numerics.compute_dtype(h)
  alpha = jnp.asarray(static_alpha).astype(ct)
  beta = jnp.asarray(static_beta).astype(ct)
  if dynamic_alpha is not None:
    _checks.check_floating(who, "dynamic_alpha", dynamic_alpha)
    _checks.check_shape(
      who,
      "dynamic_alpha",
      dynamic_alpha,
      (d, n + 1),
      "(d, n + 1) with d = h.shape[-1]",
    )
    _checks.check_floating(who, "dynamic_beta", dynamic_beta)
    _checks.check_shape(
      who, "dynamic_beta", dynamic_beta, (d,), "(d,) with d = h.shape[-1]"
    )
    check_scalar(who, "alpha_scale", alpha_scale)
    check_scalar(who, "beta_scale", beta_scale)
    normed = unit(h.astype(ct), eps) * math.sqrt(d)
    if norm_scale is not None:
      _checks.check_floating(who, "norm_scale", norm_scale)
      _checks.check_shape(
        who, "norm_scale", norm_scale, (d,), "(d,) with d = h.shape[-1]"
      )
      normed = normed * leading(
        1.0 + jnp.asarray(norm_scale).astype(ct), normed.shape
      )
    act = jnp.tanh if tanh else (lambda t: t)
    wa = act(normed @ jnp.asarray(dynamic_alpha).astype(ct))
    wb = act(normed @ jnp.asarray(dynamic_beta).astype(ct))
    alpha = scalar(alpha_scale, ct) * wa + leading(alpha, wa.shape)
    beta = scalar(beta_scale, ct) * wb + leading(beta, wb.shape)
  return alpha[..., 0], beta, jnp.swapaxes(alpha[..., 1:], -1, -2)


@_scope.scoped
def hc_static_init(
  num_streams: int, layer_index: IndexLike, *, dtype: jnp.dtype = jnp.float32
) -> tuple[jax.Array, jax.Array]:
  r"""HC's initial ``(static_alpha, static_beta)`` for sublayer ``k``.

  :math:`A_m = e_{k \bmod n}`, :math:`A_r = I_n`, :math:`B = 1_n`: every
  stream carries the plain residual sum and the network starts as ``n``
  copies of the Pre-Norm network (HC Sec. 2.3, Eq. 14).

  Args:
    num_streams: ``n``.
    layer_index: 0-based sublayer index ``k``: a Python integer, or an
      integer scalar array (traced, e.g. when the layers are created under
      ``nnx.vmap`` for an ``nnx.scan`` over layers).
    dtype: dtype of the returned arrays.

  Returns:
    Arrays of shapes ``(n, n + 1)`` and ``(n,)``, built with ``jnp`` ops so
    that they follow an active mesh.

  Raises:
    ValueError: for a non-positive ``num_streams`` or a negative,
      non-integer or non-scalar index.

  Examples:
    >>> alpha, beta = residual.hc_static_init(2, 1)  # sublayer 1 reads stream 1
    >>> print(np.asarray(alpha))  # [A_m | A_r] = [e_1 | I]
    [[0. 1. 0.]
     [1. 0. 1.]]
    >>> print(np.asarray(beta))
    [1. 1.]
  """
  who = "hc_static_init"
  _checks.check_positive_int(who, "num_streams", num_streams)
  if layer_index is None:
    raise ValueError(f"{who}: layer_index must be given, got None")
  check_layer_index(who, layer_index)
  read = jax.nn.one_hot(jnp.asarray(layer_index) % num_streams, num_streams)
  eye = jnp.eye(num_streams, dtype=dtype)
  alpha = jnp.concatenate([read.astype(dtype)[:, None], eye], axis=1)
  return alpha, jnp.ones((num_streams,), dtype)
