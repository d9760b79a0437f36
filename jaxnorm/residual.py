"""Residual wiring as pure functions: where the norm sits around a sublayer.

A block is written once as a sublayer ``f`` (attention, MLP) and a norm
``norm``; these functions decide how the residual stream ``x`` flows around
them. They take callables, so they compose with plain functions as well as
with nnx modules (call them inside a module's ``__call__``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, norms

ArrayFn = Callable[[jax.Array], jax.Array]
AddNormFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
IndexLike = int | jax.Array


def _add(x: ArrayLike, y: jax.Array) -> jax.Array:
  """The residual add ``x + y`` in the compute dtype, cast to ``x.dtype``.

  The stream keeps its dtype whatever the branch or a norm returns (e.g. a
  float32 norm output for a bfloat16 stream, flax's dtype rule).
  """
  x = jnp.asarray(x)
  ct = _numerics.compute_dtype(x)
  return (x.astype(ct) + y.astype(ct)).astype(x.dtype)


def check_layer_index(who: str, layer_index: IndexLike | None) -> None:
  """Raises `ValueError` unless ``layer_index`` is a 0-based layer index.

  A non-negative Python integer, ``None``, or an integer array of shape
  ``()`` (a traced index, e.g. the layer counter of an ``nnx.scan``; its
  value is not checked).
  """
  if layer_index is None:
    return
  if isinstance(layer_index, (jax.Array, np.ndarray)):
    if not jnp.issubdtype(layer_index.dtype, jnp.integer) or (
      layer_index.ndim != 0
    ):
      raise ValueError(
        f"{who}: an array layer_index must be an integer scalar, got "
        f"layer_index.dtype={layer_index.dtype}, "
        f"layer_index.shape={layer_index.shape}"
      )
    return
  if (
    isinstance(layer_index, bool)
    or not isinstance(layer_index, (int, np.integer))
    or layer_index < 0
  ):
    raise ValueError(
      f"{who}: layer_index must be a non-negative integer (0-based), an "
      f"integer scalar array or None, got {layer_index=}"
    )


def _scaled(norm: ArrayFn, layer_index: IndexLike | None) -> ArrayFn:
  if layer_index is None:
    return norm
  if not isinstance(layer_index, (jax.Array, np.ndarray)):
    factor = norms.layer_norm_scaling(int(layer_index))
    return lambda h: norm(h) * factor

  def scaled(h: jax.Array) -> jax.Array:
    y = norm(h)
    ell = jnp.asarray(layer_index).astype(jnp.float32) + 1.0
    return y * jax.lax.rsqrt(ell).astype(y.dtype)

  return scaled


def pre_norm(
  x: jax.Array,
  sublayer: ArrayFn,
  norm: ArrayFn,
  *,
  layer_index: IndexLike | None = None,
) -> jax.Array:
  r"""Pre-norm residual step :math:`x + f(\mathrm{norm}(x))`.

  With ``layer_index`` (0-based) the norm output is multiplied by the
  LayerNorm Scaling factor :math:`1/\sqrt{\ell}`, ``ell = layer_index + 1``
  (see `jaxnorm.norms.layer_norm_scaling`), giving
  :math:`x + f(\mathrm{norm}(x)/\sqrt{\ell})`.

  Args:
    x: residual stream.
    sublayer: the branch ``f``.
    norm: the normalization applied to the branch input.
    layer_index: 0-based block index enabling LayerNorm Scaling: a Python
      integer, or an integer scalar array (traced, e.g. inside ``nnx.scan``
      over layers; the factor is then formed in float32 and cast to the
      norm's output dtype); ``None`` (default) is the plain pre-norm block.

  Returns:
    The updated stream, with the shape and dtype of ``x`` (the sum is formed
    in ``promote_types(x.dtype, float32)``).

  Raises:
    ValueError: for a negative, non-integer or non-scalar ``layer_index``.

  References:
    Xiong et al., *On Layer Normalization in the Transformer Architecture*,
    arXiv:2002.04745 (2020); Sun et al., *The Curse of Depth in Large
    Language Models*, arXiv:2502.05795 (2025).
  """
  check_layer_index("pre_norm", layer_index)
  return _add(x, sublayer(_scaled(norm, layer_index)(x)))


def post_norm(x: jax.Array, sublayer: ArrayFn, norm: ArrayFn) -> jax.Array:
  r"""Post-norm residual step :math:`\mathrm{norm}(x + f(x))`.

  The original Transformer wiring. The sum is formed in
  ``promote_types(x.dtype, float32)``; the output has the dtype of ``x``
  (the residual steps keep the stream's dtype).

  References:
    Vaswani et al., *Attention Is All You Need*, arXiv:1706.03762 (2017).
  """
  return norm(_add(x, sublayer(x))).astype(jnp.result_type(x))


def sandwich_norm(
  x: jax.Array,
  sublayer: ArrayFn,
  norm_in: ArrayFn,
  norm_out: ArrayFn,
  *,
  layer_index: IndexLike | None = None,
) -> jax.Array:
  r"""Sandwich residual step.

  .. math:: x + \mathrm{norm_{out}}(f(\mathrm{norm_{in}}(x)))

  ``layer_index`` applies LayerNorm Scaling to the input norm as in
  `pre_norm`.

  References:
    Ding et al., *CogView: Mastering Text-to-Image Generation via
    Transformers*, arXiv:2105.13290 (2021).
  """
  check_layer_index("sandwich_norm", layer_index)
  return _add(x, norm_out(sublayer(_scaled(norm_in, layer_index)(x))))


def fused_pre_norm(
  x: Float[ArrayLike, "... d"],
  sublayers: Sequence[ArrayFn],
  norm: ArrayFn,
  add_norms: Sequence[AddNormFn],
  *,
  return_hidden: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  r"""A stack of `pre_norm` steps with every residual add fused into a norm.

  The pre-norm stack :math:`x_{k+1} = x_k + f_k(\mathrm{norm}_k(x_k))`,
  ``k = 0 .. K-1``, regrouped so that each residual add meets the norm that
  reads its result (one pass over the stream with a fused kernel):

  .. math::
    y_0 = \mathrm{norm}_0(x_0),\quad b_k = f_k(y_k),\quad
    (x_{k+1}, y_{k+1}) = \mathrm{add\_norm}_{k+1}(b_k, x_k)
    \ (k < K - 1),\quad x_K = x_{K-1} + b_{K-1},

  where ``add_norm(b, x)`` returns :math:`(x + b, \mathrm{norm}(x + b))`
  (`jaxnorm.fused_norms.add_rms_norm`, ``add_layer_norm``, or a norm
  module's ``add_and_norm``). The result equals the unfused stack.

  Args:
    x: residual stream ``(..., d)``.
    sublayers: the branches ``f_0 .. f_{K-1}``, each ``(..., d)`` to
      ``(..., d)``.
    norm: :math:`\mathrm{norm}_0`, applied to ``x``.
    add_norms: :math:`\mathrm{add\_norm}_1 .. \mathrm{add\_norm}_{K-1}`
      (one fewer than ``sublayers``).
    return_hidden: also return :math:`x_1 .. x_K` stacked to
      ``(K, ..., d)``.

  Returns:
    :math:`x_K` in the dtype of ``x`` (and the stacked hidden states).

  Raises:
    ValueError: for an empty ``sublayers``, or ``add_norms`` whose length is
      not ``len(sublayers) - 1``.

  References:
    Xiong et al., *On Layer Normalization in the Transformer Architecture*,
    arXiv:2002.04745 (2020).
  """
  who = "fused_pre_norm"
  if not sublayers or len(add_norms) != len(sublayers) - 1:
    raise ValueError(
      f"{who}: need at least one sublayer and one add_norm per sublayer "
      f"after the first, got {len(sublayers)} sublayers and "
      f"{len(add_norms)} add_norms"
    )
  x = jnp.asarray(x)
  hidden = []
  branch = sublayers[0](norm(x))
  for sublayer, add_norm in zip(sublayers[1:], add_norms):
    x, y = add_norm(branch, x)
    hidden.append(x)
    branch = sublayer(y)
  x = _add(x, branch)
  hidden.append(x)
  return (x, jnp.stack(hidden)) if return_hidden else x


# ---------------------------------------------------------------------------
# Shared helpers.

ScaleRule = Literal["1/n", "1/sqrt(n)"]
SCALE_RULES: tuple[str, ...] = ("1/n", "1/sqrt(n)")
Readout = Literal["sum", "mean"]
READOUTS: tuple[str, ...] = ("sum", "mean")
ResidualMap = Literal["sinkhorn", "quaternion", "identity"]
RESIDUAL_MAPS: tuple[str, ...] = ("sinkhorn", "quaternion", "identity")


def _leading(v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Explicitly broadcasts ``v`` (trailing dims match) to ``shape``."""
  v = jnp.reshape(v, (1,) * (len(shape) - v.ndim) + v.shape)
  return jnp.broadcast_to(v, shape)


def _check_streams(who: str, h: ArrayLike) -> tuple[int, int]:
  _checks.check_floating(who, "h", h)
  _checks.check_ndim(who, "h", h, minimum=2)
  n, d = np.shape(h)[-2:]
  return int(n), int(d)


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


def _check_scalar(who: str, name: str, v: ArrayLike) -> None:
  _checks.check_floating(who, name, v)
  if np.ndim(v) != 0 and tuple(np.shape(v)) != (1,):
    raise ValueError(
      f"{who}: {name} must be a scalar (shape () or (1,)), "
      f"got {name}.shape={np.shape(v)}"
    )


def _scalar(v: ArrayLike, dtype: jnp.dtype) -> jax.Array:
  return jnp.reshape(jnp.asarray(v), ()).astype(dtype)


def _unit(v: jax.Array, eps: float) -> jax.Array:
  """``v / max(||v||_2, eps)`` over the last axis, with finite gradients.

  Written as ``v * rsqrt(max(sum(v^2), eps^2))``: the same value, but an
  all-zero row differentiates through the constant branch of the max
  (gradient ``1/eps``) instead of through ``sqrt`` at 0 (NaN).
  """
  sq = jnp.sum(v * v, axis=-1, keepdims=True)
  return v * jax.lax.rsqrt(jnp.maximum(sq, eps * eps))


# ---------------------------------------------------------------------------
# Scaled residuals: depth rule, SkipInit, ReZero, LayerScale.


def residual_scale(
  num_residuals: int, rule: ScaleRule | float = "1/n"
) -> float:
  r"""Depth-dependent branch scale :math:`\lambda` for ``num_residuals`` n.

  "On residual network depth" expands the tower
  :math:`x_k = x_{k-1} + \lambda f_k(x_{k-1})` into :math:`\binom{n}{j}`
  paths of order :math:`j` weighted :math:`\lambda^j`; with
  :math:`\lambda = 1/n` the total weight :math:`(1 + 1/n)^n \le e` is
  bounded in depth. The paper's best empirical setting is
  :math:`1/\sqrt{n}`.

  Unverified: for Transformers the paper does not say whether ``n`` counts
  blocks or sublayers; jaxnorm's wrappers pass the number of sublayers
  (attention and MLP each count).

  Args:
    num_residuals: number of residual branches ``n`` in the tower.
    rule: ``"1/n"`` (the derived rule, default), ``"1/sqrt(n)"``, or a
      positive float used as is.

  Returns:
    The Python float :math:`\lambda`.

  Raises:
    ValueError: for a non-positive ``num_residuals``, an unknown rule or a
      non-positive float.

  References:
    Dherin & Munn, *On residual network depth*, arXiv:2510.03470 (2025).
  """
  who = "residual_scale"
  _checks.check_positive_int(who, "num_residuals", num_residuals)
  if isinstance(rule, str):
    _checks.check_choice(who, "rule", rule, SCALE_RULES)
    return 1.0 / (num_residuals if rule == "1/n" else math.sqrt(num_residuals))
  if (
    isinstance(rule, bool) or not isinstance(rule, (int, float)) or (rule <= 0)
  ):
    raise ValueError(
      f"{who}: rule must be '1/n', '1/sqrt(n)' or a positive float, got {rule=}"
    )
  return float(rule)


def scaled_residual(
  x: Float[ArrayLike, "... d"],
  sublayer: ArrayFn,
  scale: Float[ArrayLike, "*d"] | float,
  *,
  norm: ArrayFn | None = None,
) -> Float[Array, "... d"]:
  r"""Scaled residual step :math:`x + s \odot f(\mathrm{norm}(x))`.

  One function covers the scaled-residual family; only ``scale`` differs:

  * depth rule (Dherin & Munn): a constant :math:`s = 1/n` or
    :math:`1/\sqrt{n}` from `residual_scale`;
  * SkipInit (De & Smith) and ReZero (Bachlechner et al.): a learnable scalar
    :math:`\alpha` initialized to 0 and no normalization (``norm=None``), so
    the network is the identity at initialization;
  * LayerScale (Touvron et al., CaiT): a learnable per-channel vector
    :math:`\mathrm{diag}(\lambda)` (init 1e-5 to 0.1) after a pre-norm.

  The sum is formed in ``promote_types(x.dtype, float32)`` and cast back to
  ``x.dtype``.

  Args:
    x: residual stream ``(..., d)``.
    sublayer: the branch ``f``, mapping ``(..., d)`` to ``(..., d)``.
    scale: a Python float, a scalar array (shape ``()`` or ``(1,)``) or a
      vector of shape ``(d,)``.
    norm: optional normalization of the branch input (pre-norm placement).

  Returns:
    The updated stream with the shape and dtype of ``x``.

  Raises:
    TypeError: if ``x`` or ``scale`` is not floating.
    ValueError: if ``scale`` is neither a scalar nor shaped ``(d,)``, or the
      branch output does not have the shape of ``x``.

  References:
    Dherin & Munn, *On residual network depth*, arXiv:2510.03470 (2025);
    De & Smith, *Batch Normalization Biases Residual Blocks Towards the
    Identity Function in Deep Networks*, arXiv:2002.10444 (2020);
    Bachlechner et al., *ReZero is All You Need: Fast Convergence at Large
    Depth*, arXiv:2003.04887 (2020); Touvron et al., *Going deeper with
    Image Transformers*, arXiv:2103.17239 (2021).
  """
  who = "scaled_residual"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  d = x.shape[-1]
  if not isinstance(scale, (int, float)):
    _checks.check_floating(who, "scale", scale)
    if np.ndim(scale) != 0 and tuple(np.shape(scale)) not in ((1,), (d,)):
      raise ValueError(
        f"{who}: scale must be a scalar or have shape (x.shape[-1],)="
        f"({d},), got scale.shape={np.shape(scale)}"
      )
  y = sublayer(x if norm is None else norm(x))
  if y.shape != x.shape:
    raise ValueError(
      f"{who}: the sublayer must keep the shape of x, got "
      f"{x.shape=} and output shape {y.shape}"
    )
  ct = _numerics.compute_dtype(x)
  if isinstance(scale, (int, float)):
    s = jnp.asarray(scale, ct)
  else:
    s = jnp.asarray(scale).astype(ct)
    s = (
      jnp.reshape(s, ())
      if s.size == 1 and d != 1
      else _leading(jnp.reshape(s, (-1,)), x.shape)
    )
  return (x.astype(ct) + s * y.astype(ct)).astype(x.dtype)


# ---------------------------------------------------------------------------
# Multi-stream residuals: shared stream update, expansion and readout.


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
  """
  who = "expand_streams"
  _checks.check_positive_int(who, "num_streams", num_streams)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  return jnp.broadcast_to(
    x[..., None, :], (*x.shape[:-1], num_streams, x.shape[-1])
  )


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
  """
  who = "reduce_streams"
  _checks.check_choice(who, "readout", readout, READOUTS)
  _check_streams(who, h)
  h = jnp.asarray(h)
  ct = _numerics.compute_dtype(h)
  out = jnp.sum(h.astype(ct), axis=-2)
  if readout == "mean":
    out = out / h.shape[-2]
  return out.astype(h.dtype)


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

  References:
    Zhu et al., *Hyper-Connections*, arXiv:2409.19606 (2024); Xie et al.,
    *mHC: Manifold-Constrained Hyper-Connections*, arXiv:2512.24880 (2025).
  """
  who = "hyper_connection"
  n, d = _check_streams(who, h)
  h = jnp.asarray(h)
  lead = h.shape[:-2]
  _check_map(who, "h_pre", h_pre, lead, (n,))
  _check_map(who, "h_post", h_post, lead, (n,))
  _check_map(who, "h_res", h_res, lead, (n, n))
  ct = _numerics.compute_dtype(h)
  hc = h.astype(ct)
  pre = _leading(jnp.asarray(h_pre).astype(ct), h.shape[:-1])
  post = _leading(jnp.asarray(h_post).astype(ct), h.shape[:-1])
  res = _leading(jnp.asarray(h_res).astype(ct), (*lead, n, n))
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

  References:
    Zhu et al., *Hyper-Connections*, arXiv:2409.19606 (2024), Sec. 2.1-2.2
    and Algorithm 2.
  """
  who = "hc_maps"
  n, d = _check_streams(who, h)
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
    _check_scalar(who, "alpha_scale", alpha_scale)
    _check_scalar(who, "beta_scale", beta_scale)
    normed = _unit(h.astype(ct), eps) * math.sqrt(d)
    if norm_scale is not None:
      _checks.check_floating(who, "norm_scale", norm_scale)
      _checks.check_shape(
        who, "norm_scale", norm_scale, (d,), "(d,) with d = h.shape[-1]"
      )
      normed = normed * _leading(
        1.0 + jnp.asarray(norm_scale).astype(ct), normed.shape
      )
    act = jnp.tanh if tanh else (lambda t: t)
    wa = act(normed @ jnp.asarray(dynamic_alpha).astype(ct))
    wb = act(normed @ jnp.asarray(dynamic_beta).astype(ct))
    alpha = _scalar(alpha_scale, ct) * wa + _leading(alpha, wa.shape)
    beta = _scalar(beta_scale, ct) * wb + _leading(beta, wb.shape)
  return alpha[..., 0], beta, jnp.swapaxes(alpha[..., 1:], -1, -2)


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


# ---------------------------------------------------------------------------
# Sinkhorn-Knopp and quaternion rotations.


def sinkhorn_knopp(
  logits: Float[ArrayLike, "... n n"],
  *,
  num_iters: int = 20,
  temperature: float = 1.0,
  log_domain: bool = True,
  eps: float = 0.0,
) -> Float[Array, "... n n"]:
  r"""Projects logits onto (near) doubly stochastic matrices (mHC Eq. 9).

  .. math::
    M^{(0)} = \exp(\mathrm{logits} / \tau),\qquad
    M^{(t)} = T_r(T_c(M^{(t-1)})),\quad t = 1..t_{max},

  where :math:`T_c` divides each column by its sum and :math:`T_r` each row.
  The row step is last, so rows sum to 1 to rounding; columns converge to 1
  (within about 1e-5 after 20 iterations for logits of scale 2). The
  operation order equals ``hyper_connections``' ``sinkhorn_knopps``
  (normalize axis -2, then -1) on the same matrix.

  ``log_domain=True`` (default) alternates ``log_softmax`` over axis -2 and
  -1 and exponentiates once at the end (stable for any logit scale); the
  direct form subtracts the column max (Sinkhorn is invariant to column
  scaling) and divides, adding ``eps`` to every denominator like DeepSeek's
  reference kernel (``eps=1e-6`` there). Gradients flow through every
  iteration (``fori_loop``, reverse-differentiable). Computed in float32 (or
  float64), cast back to the logits dtype.

  Unverified: the paper has no temperature (its only logit scale is the
  gate :math:`a_{res}`); ``temperature`` is a jaxnorm extension, default 1.

  Args:
    logits: ``(..., n, n)``.
    num_iters: :math:`t_{max}`, the paper's 20 by default.
    temperature: :math:`\tau > 0`.
    log_domain: iterate on log-probabilities.
    eps: denominator guard of the direct form (must be 0 in log domain).

  Returns:
    Non-negative ``(..., n, n)`` with unit row sums and near-unit column
    sums, in the dtype of ``logits``.

  Raises:
    TypeError: for non-floating logits.
    ValueError: for a non-square matrix, non-positive ``num_iters`` or
      ``temperature``, negative ``eps``, or ``eps`` in log domain.

  References:
    Sinkhorn & Knopp, *Concerning nonnegative matrices and doubly
    stochastic matrices*, Pacific J. Math. 21 (1967); Xie et al., *mHC:
    Manifold-Constrained Hyper-Connections*, arXiv:2512.24880 (2025).
  """
  who = "sinkhorn_knopp"
  _checks.check_floating(who, "logits", logits)
  _checks.check_ndim(who, "logits", logits, minimum=2)
  shape = np.shape(logits)
  if shape[-1] != shape[-2]:
    raise ValueError(
      f"{who}: logits must be square in the last two axes, "
      f"got logits.shape={shape}"
    )
  _checks.check_positive_int(who, "num_iters", num_iters)
  if not temperature > 0:
    raise ValueError(f"{who}: temperature must be > 0, got {temperature=}")
  _checks.check_nonnegative(who, "eps", eps)
  if log_domain and eps:
    raise ValueError(
      f"{who}: eps applies to the direct form only; use "
      f"log_domain=False with {eps=}"
    )
  logits = jnp.asarray(logits)
  ct = _numerics.compute_dtype(logits)
  z = logits.astype(ct) / temperature
  m = _sinkhorn_iterations(
    z, num_iters=num_iters, log_domain=log_domain, eps=float(eps)
  )
  return m.astype(logits.dtype)


@functools.partial(jax.jit, static_argnames=("num_iters", "log_domain", "eps"))
def _sinkhorn_iterations(
  z: jax.Array, *, num_iters: int, log_domain: bool, eps: float
) -> jax.Array:
  """The iterations of `sinkhorn_knopp` on logits ``z`` (compute dtype).

  Jitted so that eager callers (one call per layer) compile the loop once
  per shape instead of once per call; inside a traced caller it inlines.
  """
  if log_domain:

    def body(_, z):
      z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True)
      return z - jax.nn.logsumexp(z, axis=-1, keepdims=True)

    return jnp.exp(jax.lax.fori_loop(0, num_iters, body, z))
  z = z - jax.lax.stop_gradient(jnp.max(z, axis=-2, keepdims=True))

  def body(_, m):
    m = m / (jnp.sum(m, axis=-2, keepdims=True) + eps)
    return m / (jnp.sum(m, axis=-1, keepdims=True) + eps)

  return jax.lax.fori_loop(0, num_iters, body, jnp.exp(z))


def _check_quaternion(who: str, name: str, p: ArrayLike) -> None:
  _checks.check_floating(who, name, p)
  _checks.check_ndim(who, name, p, minimum=1)
  if np.shape(p)[-1] != 4:
    raise ValueError(
      f"{who}: {name} must have 4 components in its last "
      f"axis (a quaternion), got {name}.shape={np.shape(p)}"
    )


def quaternion_left_matrix(
  p: Float[ArrayLike, "... 4"],
) -> Float[Array, "... 4 4"]:
  r"""Matrix :math:`L(p)` of left multiplication :math:`x \mapsto p\,x`.

  With :math:`p = p_0 + p_1 i + p_2 j + p_3 k` as a vector of :math:`R^4`,
  :math:`L(p) = [[p_0,-p_1,-p_2,-p_3],[p_1,p_0,-p_3,p_2],
  [p_2,p_3,p_0,-p_1],[p_3,-p_2,p_1,p_0]]`; in SO(4) for unit ``p``.

  Raises:
    TypeError: for a non-floating ``p``.
    ValueError: unless ``p.shape[-1] == 4``.
  """
  _check_quaternion("quaternion_left_matrix", "p", p)
  p0, p1, p2, p3 = jnp.moveaxis(jnp.asarray(p), -1, 0)
  rows = [
    [p0, -p1, -p2, -p3],
    [p1, p0, -p3, p2],
    [p2, p3, p0, -p1],
    [p3, -p2, p1, p0],
  ]
  return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def quaternion_right_matrix(
  q: Float[ArrayLike, "... 4"],
) -> Float[Array, "... 4 4"]:
  r"""Matrix :math:`R(q)` of right multiplication :math:`x \mapsto x\,q`.

  :math:`R(q) = [[q_0,-q_1,-q_2,-q_3],[q_1,q_0,q_3,-q_2],
  [q_2,-q_3,q_0,q_1],[q_3,q_2,-q_1,q_0]]`; commutes with every
  :math:`L(p)`, and :math:`R(\bar q) = R(q)^\top`.

  Raises:
    TypeError: for a non-floating ``q``.
    ValueError: unless ``q.shape[-1] == 4``.
  """
  _check_quaternion("quaternion_right_matrix", "q", q)
  q0, q1, q2, q3 = jnp.moveaxis(jnp.asarray(q), -1, 0)
  rows = [
    [q0, -q1, -q2, -q3],
    [q1, q0, q3, -q2],
    [q2, -q3, q0, q1],
    [q3, q2, -q1, q0],
  ]
  return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def quaternion_rotation(
  p: Float[ArrayLike, "... 4"],
  q: Float[ArrayLike, "... 4"],
  *,
  eps: float = 1e-12,
) -> Float[Array, "... 4 4"]:
  r"""The SO(4) rotation :math:`x \mapsto \hat p\, x\, \bar{\hat q}`.

  .. math::
    M = L(\hat p)\, R(\bar{\hat q}) = L(\hat p)\, R(\hat q)^\top,\quad
    \hat p = p / \max(\lVert p\rVert, \epsilon),

  closed form, no iteration. Every rotation of SO(4) has this form
  (:math:`S^3 \times S^3` double cover: ``(p, q)`` and ``(-p, -q)`` give the
  same matrix); :math:`p = q = 1` gives the identity and :math:`p = q` the
  SO(3) subgroup fixing the real axis.

  Unverified (oHC paper text not read): whether oHC uses
  :math:`p x \bar q` or :math:`p x q`; both lie in SO(4), only the conjugate
  form is the identity at :math:`p = q = 1`, so it is used here.

  Args:
    p: left quaternion generator ``(..., 4)``; need not be unit.
    q: right quaternion generator ``(..., 4)``.
    eps: floor of the norms.

  Returns:
    ``(..., 4, 4)`` orthogonal with determinant +1, in float32 (float64 for
    float64 input).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: unless both have 4 components and equal shapes.

  References:
    Guo et al., *oHC: Orthogonal Hyper-Connections on SO(4) via
    Quaternions*, arXiv:2609.02672 (2026).
  """
  who = "quaternion_rotation"
  _check_quaternion(who, "p", p)
  _check_quaternion(who, "q", q)
  if np.shape(p) != np.shape(q):
    raise ValueError(
      f"{who}: p and q must have the same shape, got "
      f"{np.shape(p)=} and {np.shape(q)=}"
    )
  p, q = jnp.asarray(p), jnp.asarray(q)
  ct = _numerics.compute_dtype(p)
  p, q = p.astype(ct), q.astype(ct)
  p, q = _unit(p, eps), _unit(q, eps)
  return quaternion_left_matrix(p) @ jnp.swapaxes(
    quaternion_right_matrix(q), -1, -2
  )


# ---------------------------------------------------------------------------
# mHC, oHC and iHC maps.


def mhc_maps(
  h: Float[ArrayLike, "... n d"],
  *,
  phi_pre: Float[ArrayLike, "nd n"] | None,
  phi_post: Float[ArrayLike, "nd n"] | None,
  phi_res: Float[ArrayLike, "nd m"] | None,
  b_pre: Float[ArrayLike, " n"],
  b_post: Float[ArrayLike, " n"],
  b_res: Float[ArrayLike, "*r"] | None,
  a_pre: Float[ArrayLike, ""] | float = 0.01,
  a_post: Float[ArrayLike, ""] | float = 0.01,
  a_res: Float[ArrayLike, ""] | float = 0.01,
  residual: ResidualMap = "sinkhorn",
  num_iters: int = 20,
  temperature: float = 1.0,
  log_domain: bool = True,
  eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  r"""Coefficient maps of mHC (and of the oHC / iHC residual variants).

  mHC (paper Eq. 7-9), with the stream state flattened stream-major to
  :math:`x_v \in R^{nd}` and :math:`x' = x_v / \sqrt{\mathrm{mean}(x_v^2) +
  \epsilon}`:

  .. math::
    \tilde H^{pre} = a_{pre}\, x'\phi_{pre} + b_{pre},\quad
    \tilde H^{post} = a_{post}\, x'\phi_{post} + b_{post},\quad
    \tilde H^{res} = a_{res}\, \mathrm{mat}_{n\times n}(x'\phi_{res})
      + b_{res},

  .. math::
    H^{pre} = \sigma(\tilde H^{pre}),\quad
    H^{post} = 2\sigma(\tilde H^{post}),\quad
    H^{res} = \mathrm{SinkhornKnopp}(\tilde H^{res}).

  No tanh (unlike HC). :math:`H^{pre} \ge 0`, :math:`H^{post} \in (0, 2)`,
  :math:`H^{res}` doubly stochastic (rows exactly, columns to ~1e-5).

  ``residual`` selects the mixing matrix:

  * ``"sinkhorn"`` (mHC): ``phi_res`` ``(nd, n*n)``, ``b_res`` ``(n, n)``;
    ``mat`` is a row-major reshape, rows are target streams.
  * ``"quaternion"`` (oHC, ``n = 4``): ``phi_res`` ``(nd, 8)``, ``b_res``
    ``(8,)``; the 8 numbers are quaternions ``[p, q]`` and
    :math:`H^{res} = L(\hat p) R(\bar{\hat q})` (`quaternion_rotation`), an
    SO(4) rotation with no iteration. Biases ``(1,0,0,0)`` twice give the
    identity at init.
  * ``"identity"`` (iHC baseline): :math:`H^{res} = I_n`; ``phi_res`` and
    ``b_res`` must be ``None``.

  Unverified (oHC, paper not read): whether the quaternions are produced
  per token from the mHC head (as here) or are static per layer (pass
  ``phi_res=None``), and the unit-norm handling (here a division by the
  norm).

  The RMSNorm weight of Eq. 7 is folded into ``phi`` (paper Sec. 4.3), so
  there is none here. ``phi_* = None`` drops the input-dependent term (a
  static map). Coefficient maths in float32 (paper: ``phi`` in TF32,
  gates, biases and coefficients in FP32).

  Deviation: the paper's config uses RMSNorm eps 1e-20; the default here is
  the official DeepSeek kernels' 1e-6.

  Args:
    h: stream state ``(..., n, d)``.
    phi_pre: ``(n*d, n)`` or ``None``.
    phi_post: ``(n*d, n)`` or ``None``.
    phi_res: see ``residual``.
    b_pre: ``(n,)``.
    b_post: ``(n,)``.
    b_res: see ``residual``.
    a_pre: gating factor, scalar (paper init 0.01).
    a_post: gating factor, scalar.
    a_res: gating factor, scalar.
    residual: ``"sinkhorn"``, ``"quaternion"`` or ``"identity"``.
    num_iters: Sinkhorn iterations (paper 20).
    temperature: Sinkhorn temperature (jaxnorm extension, default 1).
    log_domain: log-domain Sinkhorn iterations.
    eps: RMSNorm epsilon.

  Returns:
    ``(h_pre, h_post, h_res)`` for `hyper_connection`, per token (shapes
    ``h.shape[:-1]``, ``h.shape[:-1]``, ``h.shape[:-2] + (n, n)``) or
    static when no ``phi`` is given; float32 (float64 for float64 input).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: for an unknown ``residual``, ``n != 4`` with quaternions, or
      any shape that does not match ``n = h.shape[-2]``, ``d = h.shape[-1]``.

  References:
    Xie et al., *mHC: Manifold-Constrained Hyper-Connections*,
    arXiv:2512.24880 (2025); Guo et al., *oHC: Orthogonal Hyper-Connections
    on SO(4) via Quaternions*, arXiv:2609.02672 (2026).
  """
  who = "mhc_maps"
  n, d = _check_streams(who, h)
  _checks.check_choice(who, "residual", residual, RESIDUAL_MAPS)
  h = jnp.asarray(h)
  if residual == "quaternion" and n != 4:
    raise ValueError(
      f"{who}: residual='quaternion' (oHC) needs n = 4 "
      f"streams, got h.shape[-2]={n}"
    )
  res_out = {"sinkhorn": n * n, "quaternion": 8, "identity": 0}[residual]
  res_bias = {"sinkhorn": (n, n), "quaternion": (8,), "identity": ()}[residual]
  if residual == "identity":
    if phi_res is not None or b_res is not None:
      raise ValueError(
        f"{who}: residual='identity' (iHC) takes no phi_res or b_res; pass None"
      )
  else:
    if b_res is None:
      raise ValueError(
        f"{who}: residual={residual!r} needs b_res of shape {res_bias}"
      )
    _checks.check_floating(who, "b_res", b_res)
    _checks.check_shape(
      who, "b_res", b_res, res_bias, f"residual={residual!r}, n={n}"
    )
  for name, b in (("b_pre", b_pre), ("b_post", b_post)):
    _checks.check_floating(who, name, b)
    _checks.check_shape(who, name, b, (n,), "(n,) with n = h.shape[-2]")
  for name, a in (("a_pre", a_pre), ("a_post", a_post), ("a_res", a_res)):
    if not isinstance(a, (int, float)):
      _check_scalar(who, name, a)
  for name, phi, out in (
    ("phi_pre", phi_pre, n),
    ("phi_post", phi_post, n),
    ("phi_res", phi_res, res_out),
  ):
    if phi is not None:
      _checks.check_floating(who, name, phi)
      _checks.check_shape(
        who, name, phi, (n * d, out), f"(n*d, {out}) with n, d = h.shape[-2:]"
      )
  ct = _numerics.compute_dtype(h)
  if any(phi is not None for phi in (phi_pre, phi_post, phi_res)):
    xv = jnp.reshape(h.astype(ct), (*h.shape[:-2], n * d))
    xn = xv * jax.lax.rsqrt(jnp.mean(xv * xv, axis=-1, keepdims=True) + eps)
  else:
    xn = None

  def logits(phi, b, a):
    b = jnp.asarray(b).astype(ct)
    if phi is None:
      return b
    z = xn @ jnp.asarray(phi).astype(ct)
    z = jnp.reshape(z, (*z.shape[:-1], *b.shape))
    return _scalar(a, ct) * z + _leading(b, z.shape)

  h_pre = jax.nn.sigmoid(logits(phi_pre, b_pre, a_pre))
  h_post = 2.0 * jax.nn.sigmoid(logits(phi_post, b_post, a_post))
  if residual == "identity":
    h_res = jnp.eye(n, dtype=ct)
  elif residual == "sinkhorn":
    h_res = sinkhorn_knopp(
      logits(phi_res, b_res, a_res),
      num_iters=num_iters,
      temperature=temperature,
      log_domain=log_domain,
    )
  else:
    pq = logits(phi_res, b_res, a_res)
    h_res = quaternion_rotation(pq[..., :4], pq[..., 4:])
  return h_pre, h_post, h_res


def mhc_static_init(
  num_streams: int,
  *,
  residual: ResidualMap = "sinkhorn",
  res_diag: float = 0.99,
  dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  r"""Initial biases ``(b_pre, b_post, b_res)`` for `mhc_maps`.

  Unverified: the mHC paper states only the gate init (0.01); the biases
  are jaxnorm's choice, the paper's own "disabled mapping" values (Table 1)
  as a neutral start:

  * :math:`H^{pre} = 1/n` (``b_pre = logit(1/n)``): the branch reads the
    mean of the streams;
  * :math:`H^{post} = 1` (``b_post = 0``);
  * :math:`H^{res}` with diagonal ``res_diag`` and the rest spread evenly:
    diagonal logit :math:`\log(\mathrm{res\_diag}\,(n - 1) /
    (1 - \mathrm{res\_diag}))`, off-diagonal 0. That matrix is already doubly
    stochastic, so Sinkhorn returns it exactly. For oHC the quaternion biases
    are ``(1, 0, 0, 0)`` twice (:math:`H^{res} = I`); iHC has none.

  With identical streams (`expand_streams`) and ``phi = 0``, any such
  network equals ``n`` copies of the Pre-Norm residual network, because the
  rows of :math:`H^{res}` sum to 1 and :math:`\sum_i H^{pre}_i = 1`.

  Args:
    num_streams: ``n`` (4 for quaternions).
    residual: as in `mhc_maps`.
    res_diag: diagonal of the initial Sinkhorn matrix, in ``[1/n, 1)``.
    dtype: dtype of the returned arrays.

  Returns:
    Arrays built with ``jnp`` ops (they follow an active mesh); ``b_res`` is
    ``None`` for ``"identity"``.

  Raises:
    ValueError: for a bad ``num_streams``, ``residual`` or ``res_diag``.
  """
  who = "mhc_static_init"
  _checks.check_positive_int(who, "num_streams", num_streams)
  _checks.check_choice(who, "residual", residual, RESIDUAL_MAPS)
  n = num_streams
  pre = math.log((1.0 / n) / (1.0 - 1.0 / n)) if n > 1 else 30.0
  b_pre = jnp.full((n,), pre, dtype)
  b_post = jnp.zeros((n,), dtype)
  if residual == "identity":
    return b_pre, b_post, None
  if residual == "quaternion":
    if n != 4:
      raise ValueError(
        f"{who}: residual='quaternion' needs num_streams=4, got {num_streams=}"
      )
    return b_pre, b_post, jnp.tile(jnp.eye(4, dtype=dtype)[0], 2)
  if n == 1:
    return b_pre, b_post, jnp.zeros((1, 1), dtype)
  if not 1.0 / n <= res_diag < 1.0:
    raise ValueError(
      f"{who}: res_diag must lie in [1/n, 1) = [{1.0 / n}, 1), got {res_diag=}"
    )
  diag = math.log(res_diag * (n - 1) / (1.0 - res_diag))
  return b_pre, b_post, jnp.eye(n, dtype=dtype) * diag


# ---------------------------------------------------------------------------
# Attention residuals.


def attn_res_weights(
  sources: Float[ArrayLike, "m ... d"],
  query: Float[ArrayLike, " d"],
  *,
  key_scale: Float[ArrayLike, " d"] | None = None,
  eps: float = 1e-6,
  mask: Bool[ArrayLike, " m"] | None = None,
) -> Float[Array, "m ..."]:
  r"""Depth-attention weights :math:`a_{i\to l}` of AttnRes.

  .. math::
    a_{i\to l} = \frac{\exp(w_l^\top \mathrm{RMSNorm}(k_i))}
                 {\sum_j \exp(w_l^\top \mathrm{RMSNorm}(k_j))},

  a softmax over the source axis (axis 0) only, separately per token, with
  no :math:`1/\sqrt{d}` temperature. The keys are the sources themselves,
  RMS-normalized with gain ``key_scale`` (each sublayer has its own).

  Args:
    sources: ``(m, ..., d)``: the ``m`` earlier values (embedding and
      sublayer outputs, or block summaries), stacked on axis 0.
    query: the pseudo-query :math:`w_l`, ``(d,)``.
    key_scale: RMSNorm gain of the keys, ``(d,)``; ``None`` means 1.
    eps: RMSNorm epsilon (Unverified: not stated; 1e-6).
    mask: ``(m,)`` booleans, True for the sources that exist; the others
      get weight exactly 0 (a fixed-size buffer of sources, filled as the
      network deepens). At least one entry must be True (not checked).

  Returns:
    ``(m, ...)`` weights summing to 1 over axis 0 (float32, or float64 for
    float64 input).

  Raises:
    TypeError: for non-floating inputs or a non-boolean ``mask``.
    ValueError: for ``sources`` of rank < 2, a ``query``/``key_scale``
      whose length is not ``sources.shape[-1]``, or a ``mask`` not shaped
      ``(m,)``.

  References:
    Kimi Team, *Attention Residuals*, arXiv:2603.15031 (2026).
  """
  who = "attn_res_weights"
  _checks.check_floating(who, "sources", sources)
  _checks.check_ndim(who, "sources", sources, minimum=2)
  sources = jnp.asarray(sources)
  d = sources.shape[-1]
  _checks.check_floating(who, "query", query)
  _checks.check_shape(who, "query", query, (d,), "(d,), d = sources.shape[-1]")
  if key_scale is not None:
    _checks.check_floating(who, "key_scale", key_scale)
    _checks.check_shape(
      who, "key_scale", key_scale, (d,), "(d,), d = sources.shape[-1]"
    )
  if mask is not None:
    if jnp.result_type(mask) != jnp.bool_:
      raise TypeError(
        f"{who}: mask must be boolean (True = the source exists), got "
        f"mask.dtype={jnp.result_type(mask)}"
      )
    _checks.check_shape(
      who, "mask", mask, sources.shape[:1], "(m,), m = sources.shape[0]"
    )
  ct = _numerics.compute_dtype(sources)
  keys = norms.rms_norm(sources.astype(ct), None, eps=eps)
  if key_scale is not None:
    keys = keys * _leading(jnp.asarray(key_scale).astype(ct), keys.shape)
  scores = keys @ jnp.asarray(query).astype(ct)
  if mask is not None:
    valid = jnp.reshape(jnp.asarray(mask), (-1,) + (1,) * (scores.ndim - 1))
    scores = jnp.where(valid, scores, -jnp.inf)
  return jax.nn.softmax(scores, axis=0)


def attn_res(
  sources: Float[ArrayLike, "m ... d"],
  query: Float[ArrayLike, " d"],
  *,
  key_scale: Float[ArrayLike, " d"] | None = None,
  eps: float = 1e-6,
  mask: Bool[ArrayLike, " m"] | None = None,
) -> Float[Array, "... d"]:
  r"""Attention residual: the input of layer ``l`` as attention over depth.

  .. math::
    h_l = \sum_{i=0}^{l-1} a_{i\to l}\, v_i

  with the weights of `attn_res_weights`. Full AttnRes: the sources are
  :math:`v_0 = h_1` (the embedding) and every earlier sublayer output
  :math:`f_i(h_i)` (branch outputs, not running sums). Block AttnRes: the
  sources are the block summaries :math:`b_0 = h_1, b_1, \ldots` plus the
  current partial block sum. With ``query = 0`` (the paper's init),
  :math:`h_l` is the mean of the sources.

  Args:
    sources: ``(m, ..., d)`` values stacked on axis 0.
    query: pseudo-query ``(d,)``.
    key_scale: key RMSNorm gain ``(d,)`` or ``None``.
    eps: key RMSNorm epsilon.
    mask: ``(m,)`` booleans, True for the sources that exist (the others
      get weight 0).

  Returns:
    ``(..., d)`` in the dtype of ``sources`` (weighted sum in float32).

  Raises:
    TypeError: for non-floating inputs.
    ValueError: as `attn_res_weights`.

  References:
    Kimi Team, *Attention Residuals*, arXiv:2603.15031 (2026).
  """
  w = attn_res_weights(sources, query, key_scale=key_scale, eps=eps, mask=mask)
  sources = jnp.asarray(sources)
  out = jnp.sum(w[..., None] * sources.astype(w.dtype), axis=0)
  return out.astype(sources.dtype)
