"""Residual schemes as nnx modules, and `make_residual` to pick one by name.

A block is written once as a list of sublayers (attention, MLP, ...), each a
callable from ``(..., d)`` to ``(..., d)`` without its own residual or norm.
A residual scheme wraps the list into a network:

  net = make_residual("mhc", [attn0, mlp0, attn1, mlp1], num_features=d,
                      norm="rmsnorm", rngs=nnx.Rngs(0))
  h = net(x)  # (..., d) embedding in, (..., d) hidden state out

The output is the residual stream before the model's final norm and head
(for multi-stream schemes, after the stream readout). The maths lives in
`jaxnorm.residual`; these modules only declare parameters (with logical axis
names ``embed``, ``streams``, ``norm``) and call it.

`RESIDUALS` maps each name to a `jaxnorm.nn.registry.ResidualSpec` (builder,
paper, defaults as a function of ``(num_sublayers, sublayers_per_layer)``,
whether the scheme places norms, weight-decay exceptions); `make_residual`
applies the spec's defaults under the caller's options. For an
``nnx.scan`` over layers, `make_residual_step` builds one layer's steps by
name (`SCAN_RESIDUALS`: every scheme whose state is a fixed-size carry).
Every step module draws exactly one ``params`` key from ``rngs`` whatever
its norm and options, so swapping a norm never shifts the initialization of
later modules.

Schemes (`RESIDUALS`):

======================  ====================================================
name                    wiring of sublayer ``f_k`` (norms from `make_norm`)
======================  ====================================================
``prenorm``             ``x + f(norm(x))``
``postnorm``            ``norm(x + f(x))``
``sandwich``            ``x + norm_out(f(norm_in(x)))``
``lns``                 ``x + f(norm(x) / sqrt(l))``, ``l`` the layer
``scaled``              ``x + lam * f(norm(x))``, ``lam = 1/n`` or 1/sqrt(n)
``skipinit``            ``x + alpha * f(x)``, scalar ``alpha`` init 0
``rezero``              same, one ``alpha`` per layer (all its sublayers)
``layerscale``          ``x + diag(gamma) f(norm(x))``, CaiT's ``gamma`` init
``hc``                  Hyper-Connections (dynamic or static), ``n`` streams
``mhc``                 mHC: Sinkhorn-constrained stream mixing
``ohc``                 oHC: SO(4) stream mixing from two quaternions
``ihc``                 iHC: mHC with identity stream mixing
``attnres``             Full Attention Residuals
``block_attnres``       Block Attention Residuals
======================  ====================================================

Depth growth at initialization, measured by
``tests/nn/test_residual.py::test_24_layer_stack_depth_growth_and_finite``
(marked slow) on a
24-layer (48-sublayer) stack of single-head causal softmax attention and
GELU MLP sublayers with Gaussian weights (std ``1/sqrt(fan_in)``), ``d = 32``,
RMSNorm everywhere, batch 2 x 8 tokens of unit-RMS Gaussian embeddings,
float32, every scheme with its spec defaults. "growth" is the RMS of the
hidden state after the last sublayer over its RMS after the first
(multi-stream schemes read out with ``"mean"``; for AttnRes the hidden state
is the aggregated sublayer input :math:`h_l`). All schemes also stay finite
in float32 and bfloat16, with finite gradients (same test).

=================  ======  ================================================
scheme             growth  note
=================  ======  ================================================
prenorm            3.67    the stream accumulates unnormalized branches
postnorm           1.00    every step ends in a norm
sandwich           4.05    branch outputs normalized to RMS 1 and summed
lns                1.44    1/sqrt(l) per layer damps the late branches
scaled (1/n)       1.00    every branch weighted 1/48
skipinit, rezero   1.00    identity network at init (gate 0)
layerscale         1.00    branches weighted 1e-5
hc                 3.67    n copies of prenorm at init
mhc, ohc, ihc      3.67    same: identical streams, rows of H_res sum to 1
attnres            0.15    inputs are means over a growing set of sources
block_attnres      0.81    8 blocks: means over at most 9 sources
=================  ======  ================================================

The slow test recomputes every entry and checks it within 10%.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param, registry
from jaxnorm.nn import norms as nn_norms

Sublayer = Callable[[jax.Array], jax.Array]
NormSpec = str | None


class LayerIndex(nnx.Variable):
  """A constant 0-based layer index held as state (never trained).

  A step module built with a traced index (under ``nnx.vmap``, to stack the
  layers of an ``nnx.scan``) keeps it here, so each scanned layer reads its
  own index; a Python integer index stays a static attribute.
  """


def _store_index(layer_index: residual.IndexLike | None) -> Any:
  if isinstance(layer_index, (jax.Array, np.ndarray)):
    return LayerIndex(jnp.asarray(layer_index))
  return None if layer_index is None else int(layer_index)


def _read_index(layer_index: Any) -> residual.IndexLike | None:
  if isinstance(layer_index, LayerIndex):
    return layer_index[...]
  return layer_index


def _key(rngs: nnx.Rngs) -> jax.Array:
  """The one ``params`` key a residual module draws, whatever its options.

  Norms, random initializers and options of a module all derive their keys
  from it (``fold_in``), so swapping the norm or an option never shifts the
  keys that later modules draw from ``rngs``.
  """
  return rngs.params()


def _make_norm(
  norm: NormSpec,
  num_features: int,
  norm_kwargs: Mapping | None,
  key: jax.Array,
  slot: int = 0,
) -> nnx.Module | None:
  if norm is None:
    return None
  rngs = nnx.Rngs(params=jax.random.fold_in(key, slot))
  return nn_norms.make_norm(
    norm, num_features, rngs=rngs, **dict(norm_kwargs or {})
  )


def _then(norm: nnx.Module | None, sublayer: Sublayer) -> Sublayer:
  """The branch with its own pre-norm: ``f(norm(x))``."""
  if norm is None:
    return sublayer
  return lambda x: sublayer(norm(x))


class _Branch:
  """A sublayer handed to a step module as a plain callable.

  ``nnx.tabulate`` records the arguments of every module call and cannot
  render a Module passed as one, so the stacks hand each step this wrapper
  (shown as the sublayer's class name) instead of the sublayer module.
  """

  __slots__ = ("fn",)

  def __init__(self, fn: Sublayer):
    self.fn = fn

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.fn(x)

  def __repr__(self) -> str:
    return type(self.fn).__name__


def _check_input(who: str, x: jax.Array, num_features: int) -> None:
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  if x.shape[-1] != num_features:
    raise ValueError(
      f"{who}: x must have num_features={num_features} "
      f"features in its last axis, got {x.shape=}"
    )


def _check_state(
  who: str, h: jax.Array, num_streams: int, num_features: int
) -> None:
  _checks.check_ndim(who, "h", h, minimum=2)
  if tuple(h.shape[-2:]) != (num_streams, num_features):
    raise ValueError(
      f"{who}: h must end in (num_streams, num_features)=({num_streams}, "
      f"{num_features}), got {h.shape=}; expand the input with "
      "jaxnorm.residual.expand_streams(x, num_streams)"
    )


# ---------------------------------------------------------------------------
# Single-stream residual steps.


class PreNormResidual(nnx.Module):
  """Pre-norm step ``x + f(norm(x))``; see `jaxnorm.residual.pre_norm`.

  ``layer_index`` (0-based Transformer layer: a Python integer, or an
  integer scalar array when the layers are created under ``nnx.vmap`` for
  ``nnx.scan``) enables LayerNorm Scaling.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "PreNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = _key(rngs)
    self.num_features = num_features
    self.layer_index = _store_index(layer_index)
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    _check_input(type(self).__name__, x, self.num_features)
    return residual.pre_norm(
      x, sublayer, self.norm, layer_index=_read_index(self.layer_index)
    )


class PostNormResidual(nnx.Module):
  """Post-norm step ``norm(x + f(x))``; see `jaxnorm.residual.post_norm`."""

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "layernorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("PostNormResidual", "num_features", num_features)
    key = _key(rngs)
    self.num_features = num_features
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    _check_input(type(self).__name__, x, self.num_features)
    return residual.post_norm(x, sublayer, self.norm)


class SandwichNormResidual(nnx.Module):
  """Sandwich step ``x + norm_out(f(norm_in(x)))``.

  See `jaxnorm.residual.sandwich_norm`; both norms are built by name.
  ``layer_index`` applies LayerNorm Scaling to ``norm_in`` as in
  `PreNormResidual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "SandwichNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = _key(rngs)
    self.num_features = num_features
    self.layer_index = _store_index(layer_index)
    self.norm_in = _make_norm(norm, num_features, norm_kwargs, key, 0)
    self.norm_out = _make_norm(norm, num_features, norm_kwargs, key, 1)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    _check_input(type(self).__name__, x, self.num_features)
    return residual.sandwich_norm(
      x,
      sublayer,
      self.norm_in,
      self.norm_out,
      layer_index=_read_index(self.layer_index),
    )


class ScaledResidual(nnx.Module):
  """Constant depth-scaled step ``x + lam * f(norm(x))``.

  ``lam = residual.residual_scale(num_residuals, scale)``: ``"1/n"`` (the
  rule of Dherin & Munn), ``"1/sqrt(n)"`` or a float. ``norm=None`` (the
  paper's normalization-free setting) drops the norm. No parameters beyond
  the norm's. See `jaxnorm.residual.scaled_residual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_residuals: int,
    scale: residual.ScaleRule | float = "1/n",
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("ScaledResidual", "num_features", num_features)
    key = _key(rngs)
    self.num_features = num_features
    self.scale = residual.residual_scale(num_residuals, scale)
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    _check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.scale, norm=self.norm)


class GatedResidual(nnx.Module):
  """Learned branch gate ``x + g * f(norm(x))`` (SkipInit, ReZero, LayerScale).

  ``shape="scalar"``: one ``gate`` (shape ``(1,)``), SkipInit / ReZero with
  ``init_value=0`` and ``norm=None``: the gate multiplies the end of the
  residual branch, as SkipInit's official code (``skipinit_gain``, one per
  residual block) and ReZero's (``resweight``; one per Transformer layer,
  shared by its attention and MLP: `make_residual` shares one module across
  the sublayers of a layer). ``shape="vector"``: a per-channel ``gate``
  (shape ``(d,)``), LayerScale with a pre-norm and a small ``init_value``
  (CaiT: 0.1 up to depth 18, 1e-5 at 24, 1e-6 beyond). See
  `jaxnorm.residual.scaled_residual`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    shape: Literal["scalar", "vector"] = "scalar",
    init_value: float = 0.0,
    norm: NormSpec = None,
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "GatedResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "shape", shape, ("scalar", "vector"))
    key = _key(rngs)
    self.num_features = num_features
    size = 1 if shape == "scalar" else num_features
    names = (None,) if shape == "scalar" else ("norm",)
    self.gate = _param.param(jnp.full((size,), init_value, param_dtype), names)
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    _check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.gate[...], norm=self.norm)


# ---------------------------------------------------------------------------
# Multi-stream steps.


class HyperConnection(nnx.Module):
  """One Hyper-Connection around sublayer ``layer_index``.

  ``layer_index`` is the 0-based sublayer index ``k`` (a Python integer, or
  an integer scalar array under ``nnx.vmap``); it only selects the stream
  the branch reads at initialization.

  Parameters (paper init, equivalent to Pre-Norm): ``static_alpha``
  ``(n, n+1)`` = ``[e_{k mod n} | I]``, ``static_beta`` ``(n,)`` = 1 and, when
  ``dynamic``, ``dynamic_alpha`` ``(d, n+1)`` = 0, ``dynamic_beta`` ``(d,)`` =
  0, ``alpha_scale`` = ``beta_scale`` = 0.01 and the coefficient norm gain
  ``norm_scale`` ``(d,)`` = 0. The branch keeps its own pre-norm ``norm``.
  Maths in `jaxnorm.residual.hc_maps` and `jaxnorm.residual.hyper_connection`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    layer_index: residual.IndexLike,
    num_streams: int = 4,
    dynamic: bool = True,
    tanh: bool = True,
    scale_init: float = 0.01,
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "HyperConnection"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_streams", num_streams)
    key = _key(rngs)
    d, n = num_features, num_streams
    self.num_features, self.num_streams = d, n
    self.dynamic, self.tanh = dynamic, tanh
    alpha, beta = residual.hc_static_init(n, layer_index, dtype=param_dtype)
    self.static_alpha = _param.param(alpha, ("streams", None))
    self.static_beta = _param.param(beta, ("streams",))
    if dynamic:
      self.dynamic_alpha = _param.param(
        jnp.zeros((d, n + 1), param_dtype), ("embed", None)
      )
      self.dynamic_beta = _param.param(jnp.zeros((d,), param_dtype), ("embed",))
      self.alpha_scale = _param.param(jnp.full((), scale_init, param_dtype), ())
      self.beta_scale = _param.param(jnp.full((), scale_init, param_dtype), ())
      self.norm_scale = _param.param(jnp.zeros((d,), param_dtype), ("norm",))
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def maps(self, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(h_pre, h_post, h_res)`` for stream state ``h`` ``(..., n, d)``."""
    kw = {}
    if self.dynamic:
      kw = dict(
        dynamic_alpha=self.dynamic_alpha[...],
        dynamic_beta=self.dynamic_beta[...],
        alpha_scale=self.alpha_scale[...],
        beta_scale=self.beta_scale[...],
        norm_scale=self.norm_scale[...],
      )
    return residual.hc_maps(
      h,
      static_alpha=self.static_alpha[...],
      static_beta=self.static_beta[...],
      tanh=self.tanh,
      **kw,
    )

  def __call__(self, h: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Updates the stream state ``h`` ``(..., n, d)`` around ``sublayer``."""
    _check_state(type(self).__name__, h, self.num_streams, self.num_features)
    h_pre, h_post, h_res = self.maps(h)
    return residual.hyper_connection(
      h, _then(self.norm, sublayer), h_pre=h_pre, h_post=h_post, h_res=h_res
    )


class ManifoldHyperConnection(nnx.Module):
  """mHC (``residual="sinkhorn"``), oHC (``"quaternion"``) or iHC.

  Parameters: ``phi_pre``, ``phi_post`` ``(n*d, n)`` and ``phi_res``
  ``(n*d, n*n)`` (oHC: ``(n*d, 8)``, iHC: none), only when ``dynamic``;
  biases ``b_pre``, ``b_post`` ``(n,)`` and ``b_res`` (``(n, n)``, oHC
  ``(8,)``) from `jaxnorm.residual.mhc_static_init`; gates ``a_pre``,
  ``a_post``, ``a_res`` (scalars, paper init 0.01).

  Unverified: the paper does not give the init of ``phi`` and ``b``;
  ``phi`` starts at 0 (``phi_init_std`` draws normal values instead) and the
  biases as documented in `mhc_static_init`, so a fresh network equals
  ``n`` copies of the Pre-Norm network. The branch keeps its own pre-norm
  ``norm``. Maths in `jaxnorm.residual.mhc_maps`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_streams: int = 4,
    residual_map: residual.ResidualMap = "sinkhorn",
    dynamic: bool = True,
    gate_init: float = 0.01,
    phi_init_std: float = 0.0,
    res_diag: float = 0.99,
    num_iters: int = 20,
    temperature: float = 1.0,
    log_domain: bool = True,
    eps: float = 1e-6,
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "ManifoldHyperConnection"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "num_streams", num_streams)
    _checks.check_choice(
      who, "residual_map", residual_map, residual.RESIDUAL_MAPS
    )
    _checks.check_positive_int(who, "num_iters", num_iters)
    _checks.check_nonnegative(who, "phi_init_std", phi_init_std)
    if residual_map == "quaternion" and num_streams != 4:
      raise ValueError(
        f"{who}: residual_map='quaternion' (oHC) needs "
        f"num_streams=4, got {num_streams=}"
      )
    key = _key(rngs)
    d, n = num_features, num_streams
    self.num_features, self.num_streams = d, n
    self.residual_map, self.dynamic = residual_map, dynamic
    self.num_iters, self.temperature = num_iters, temperature
    self.log_domain, self.eps = log_domain, eps
    b_pre, b_post, b_res = residual.mhc_static_init(
      n, residual=residual_map, res_diag=res_diag, dtype=param_dtype
    )
    self.b_pre = _param.param(b_pre, ("streams",))
    self.b_post = _param.param(b_post, ("streams",))
    names = ("streams", None) if residual_map == "sinkhorn" else (None,)
    self.b_res = None if b_res is None else _param.param(b_res, names)
    res_out = {"sinkhorn": n * n, "quaternion": 8, "identity": 0}[residual_map]

    def phi(out: int, slot: int) -> nnx.Param:
      shape, k = (n * d, out), jax.random.fold_in(key, slot)
      value = (
        (phi_init_std * jax.random.normal(k, shape)).astype(param_dtype)
        if phi_init_std
        else jnp.zeros(shape, param_dtype)
      )
      return _param.param(value, ("embed", None))

    self.phi_pre = phi(n, 1) if dynamic else None
    self.phi_post = phi(n, 2) if dynamic else None
    self.phi_res = phi(res_out, 3) if dynamic and res_out else None
    gate = jnp.full((), gate_init, param_dtype)
    self.a_pre = _param.param(gate, ())
    self.a_post = _param.param(gate, ())
    self.a_res = _param.param(gate, ())
    self.norm = _make_norm(norm, num_features, norm_kwargs, key)

  def maps(self, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(h_pre, h_post, h_res)`` for stream state ``h`` ``(..., n, d)``."""

    def get(v: nnx.Variable | None) -> jax.Array | None:
      return None if v is None else v[...]

    return residual.mhc_maps(
      h,
      phi_pre=get(self.phi_pre),
      phi_post=get(self.phi_post),
      phi_res=get(self.phi_res),
      b_pre=self.b_pre[...],
      b_post=self.b_post[...],
      b_res=get(self.b_res),
      a_pre=self.a_pre[...],
      a_post=self.a_post[...],
      a_res=self.a_res[...],
      residual=self.residual_map,
      num_iters=self.num_iters,
      temperature=self.temperature,
      log_domain=self.log_domain,
      eps=self.eps,
    )

  def __call__(self, h: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Updates the stream state ``h`` ``(..., n, d)`` around ``sublayer``."""
    _check_state(type(self).__name__, h, self.num_streams, self.num_features)
    h_pre, h_post, h_res = self.maps(h)
    return residual.hyper_connection(
      h, _then(self.norm, sublayer), h_pre=h_pre, h_post=h_post, h_res=h_res
    )


class AttnResQuery(nnx.Module):
  """Pseudo-query ``query`` (init 0) and key RMSNorm gain ``key_scale``.

  One per sublayer (and one for the readout); ``self(sources)`` is
  `jaxnorm.residual.attn_res`.
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    param_dtype: Any = jnp.float32,
  ):
    _checks.check_positive_int("AttnResQuery", "num_features", num_features)
    self.num_features, self.eps = num_features, eps
    self.query = _param.param(
      jnp.zeros((num_features,), param_dtype), ("embed",)
    )
    self.key_scale = _param.param(
      jnp.ones((num_features,), param_dtype), ("norm",)
    )

  def __call__(
    self, sources: jax.Array, mask: jax.Array | None = None
  ) -> jax.Array:
    """Aggregates ``sources`` ``(m, ..., d)`` (``mask``: which exist)."""
    return residual.attn_res(
      sources,
      self.query[...],
      key_scale=self.key_scale[...],
      eps=self.eps,
      mask=mask,
    )


# ---------------------------------------------------------------------------
# Networks.


def _check_blocks(who: str, blocks: Sequence[Sublayer]) -> list[Sublayer]:
  blocks = list(blocks)
  if not blocks:
    raise ValueError(
      f"{who}: blocks must hold at least one sublayer, got an empty sequence"
    )
  for i, b in enumerate(blocks):
    if not callable(b):
      raise ValueError(
        f"{who}: every block must be callable (..., d) -> "
        f"(..., d), got blocks[{i}] of type {type(b).__name__}"
      )
  return blocks


class ResidualStack(nnx.Module):
  """Single-stream network: ``x = steps[k](x, blocks[k])`` for every k.

  ``steps`` are residual-step modules (`PreNormResidual`, ...), one per
  sublayer (one module may serve several sublayers, e.g. ReZero's gate
  shared by a layer's attention and MLP).

  ``fused=True`` (pre-norm steps without LayerNorm Scaling whose norms have
  an ``add_and_norm`` method, e.g. `RMSNorm`, `LayerNorm`) runs each
  residual add together with the next step's norm, ``(h, y) =
  norm.add_and_norm(f(y_prev), h)`` (one kernel pass when the norm's
  ``implementation`` is ``"pallas"``); the recurrence is
  `jaxnorm.residual.fused_pre_norm`. The result equals the unfused stack.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    fused: bool = False,
  ):
    who = "ResidualStack"
    blocks = _check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    for k, step in enumerate(steps if fused else ()):
      if not (
        isinstance(step, PreNormResidual)
        and step.layer_index is None
        and hasattr(step.norm, "add_and_norm")
      ):
        raise NotImplementedError(
          f"{who}: fused needs pre-norm steps whose norm has a fused "
          f"add_and_norm (RMSNorm, LayerNorm) and no LayerNorm Scaling; "
          f"steps[{k}] is {type(step).__name__} with norm "
          f"{type(getattr(step, 'norm', None)).__name__}"
        )
    self.num_features, self.fused = num_features, fused
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns the hidden state after every
    sublayer, stacked to ``(num_sublayers, ..., d)``.
    """
    _check_input("ResidualStack", x, self.num_features)
    if self.fused:
      return residual.fused_pre_norm(
        x,
        [_Branch(block) for block in self.blocks],
        self.steps[0].norm,
        [step.norm.add_and_norm for step in self.steps[1:]],
        return_hidden=return_hidden,
      )
    hidden = []
    for block, step in zip(self.blocks, self.steps):
      x = step(x, _Branch(block))
      hidden.append(x)
    return (x, jnp.stack(hidden)) if return_hidden else x


class StreamStack(nnx.Module):
  """Multi-stream network (HC, mHC, oHC, iHC).

  Expands the input into ``num_streams`` identical streams, applies one
  stream step per sublayer and reads the streams out (``"sum"``, as in HC,
  or ``"mean"``). See `jaxnorm.residual.expand_streams` and
  `jaxnorm.residual.reduce_streams`.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    num_streams: int,
    readout: residual.Readout = "sum",
  ):
    who = "StreamStack"
    blocks = _check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    _checks.check_choice(who, "readout", readout, residual.READOUTS)
    self.num_features, self.num_streams = num_features, num_streams
    self.readout = readout
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``; see `ResidualStack`.

    Hidden states are the read-out streams after every sublayer.
    """
    _check_input("StreamStack", x, self.num_features)
    h = residual.expand_streams(x, self.num_streams)
    hidden = []
    for block, step in zip(self.blocks, self.steps):
      h = step(h, _Branch(block))
      if return_hidden:
        hidden.append(residual.reduce_streams(h, readout=self.readout))
    out = residual.reduce_streams(h, readout=self.readout)
    return (out, jnp.stack(hidden)) if return_hidden else out


class AttnResStack(nnx.Module):
  """Attention Residuals network (Full, or Block with ``block_size``).

  Sublayer ``l`` reads ``h_l = attn_res(sources, w_l)`` and adds its output
  ``f_l(norm_l(h_l))`` as a new source. Full AttnRes (``block_size=1``): the
  sources are the embedding and every earlier sublayer output. Block AttnRes:
  the embedding, the completed block sums and the current partial block sum,
  a new block starting every ``block_size`` sublayers (checked before the
  block's first sublayer runs, after its input is formed, as in the official
  pseudo-code). ``readout="attnres"`` aggregates all final sources with one
  more query; ``"sum"`` adds them (the plain residual stream).

  Unverified: the paper states the ``attnres`` readout for Block AttnRes
  only; Full AttnRes uses the same by default.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    *,
    num_features: int,
    block_size: int = 1,
    readout: Literal["attnres", "sum"] = "attnres",
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    eps: float = 1e-6,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "AttnResStack"
    blocks = _check_blocks(who, blocks)
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_positive_int(who, "block_size", block_size)
    _checks.check_choice(who, "readout", readout, ("attnres", "sum"))
    self.num_features, self.block_size = num_features, block_size
    self.readout = readout
    self.blocks = nnx.List(blocks)
    self.queries = nnx.List(
      [
        AttnResQuery(num_features, eps=eps, param_dtype=param_dtype)
        for _ in blocks
      ]
    )
    key = _key(rngs)
    self.norms = nnx.List(
      [
        _make_norm(norm, num_features, norm_kwargs, key, k)
        for k in range(len(blocks))
      ]
    )
    self.readout_query = (
      AttnResQuery(num_features, eps=eps, param_dtype=param_dtype)
      if readout == "attnres"
      else None
    )

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns every sublayer's input ``h_l``
    stacked to ``(num_sublayers, ..., d)``.
    """
    _check_input("AttnResStack", x, self.num_features)
    # Slot 0 holds the embedding, slot j >= 1 the (partial) sum of block j;
    # sublayer k reads the non-empty slots 0..ceil(k / block_size), the
    # others masked out. One buffer of fixed shape keeps the traced graph
    # linear in depth and every sublayer's ops of one shape.
    size = self.block_size
    num_slots = -(-len(self.blocks) // size) + 1
    slots = jnp.zeros((num_slots, *x.shape), x.dtype).at[0].set(x)
    slot = jnp.arange(num_slots)
    hidden = []
    for k, (block, query, norm) in enumerate(
      zip(self.blocks, self.queries, self.norms)
    ):
      h = query(slots, slot <= -(-k // size))
      hidden.append(h)
      y = _then(norm, block)(h)
      slots = slots.at[k // size + 1].add(y.astype(x.dtype))
    if self.readout_query is not None:
      out = self.readout_query(slots)
    else:
      out = jnp.sum(slots.astype(jnp.float32), axis=0).astype(x.dtype)
    return (out, jnp.stack(hidden)) if return_hidden else out


# ---------------------------------------------------------------------------
# Registry.

_GATED = ("skipinit", "rezero")
_STREAM_MAPS: Mapping[str, residual.ResidualMap] = types.MappingProxyType(
  {"mhc": "sinkhorn", "ohc": "quaternion", "ihc": "identity"}
)


def _step(
  name: str,
  num_features: int,
  *,
  layer: residual.IndexLike,
  sublayer: residual.IndexLike,
  num_sublayers: int,
  rngs: nnx.Rngs,
  kwargs: Mapping[str, Any],
) -> nnx.Module:
  """The step module of scheme ``name`` around one sublayer."""
  d = num_features
  if name == "prenorm":
    return PreNormResidual(d, rngs=rngs, **kwargs)
  if name == "lns":
    return PreNormResidual(d, layer_index=layer, rngs=rngs, **kwargs)
  if name == "postnorm":
    return PostNormResidual(d, rngs=rngs, **kwargs)
  if name == "sandwich":
    return SandwichNormResidual(d, rngs=rngs, **kwargs)
  if name == "scaled":
    return ScaledResidual(d, num_residuals=num_sublayers, rngs=rngs, **kwargs)
  if name in _GATED:
    return GatedResidual(d, shape="scalar", rngs=rngs, **kwargs)
  if name == "layerscale":
    return GatedResidual(d, shape="vector", rngs=rngs, **kwargs)
  if name == "hc":
    return HyperConnection(d, layer_index=sublayer, rngs=rngs, **kwargs)
  return ManifoldHyperConnection(
    d, residual_map=_STREAM_MAPS[name], rngs=rngs, **kwargs
  )


def _layer_steps(
  name: str,
  num_features: int,
  *,
  layer: residual.IndexLike,
  sublayers: Sequence[residual.IndexLike],
  num_sublayers: int,
  rngs: nnx.Rngs,
  kwargs: Mapping[str, Any],
) -> list[nnx.Module]:
  """The step modules of one layer, one per sublayer index in ``sublayers``.

  With ``shared=True`` (ReZero's official placement, or SkipInit on
  request) one module serves every sublayer of the layer.
  """
  kwargs = dict(kwargs)
  shared = kwargs.pop("shared", False)
  if shared and name not in _GATED:
    raise ValueError(
      f"make_residual: shared applies to {', '.join(_GATED)} only, got {name!r}"
    )

  def build(sublayer: residual.IndexLike) -> nnx.Module:
    return _step(
      name,
      num_features,
      layer=layer,
      sublayer=sublayer,
      num_sublayers=num_sublayers,
      rngs=rngs,
      kwargs=kwargs,
    )

  if shared:
    return [build(sublayers[0])] * len(sublayers)
  return [build(k) for k in sublayers]


def _all_steps(
  name: str, num_sublayers: int, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> list[nnx.Module]:
  """Steps of every sublayer, grouped ``sublayers_per_layer`` to a layer."""
  per_layer = kwargs.pop("sublayers_per_layer")
  _checks.check_positive_int("make_residual", "sublayers_per_layer", per_layer)
  steps = []
  for layer, first in enumerate(range(0, num_sublayers, per_layer)):
    steps += _layer_steps(
      name,
      num_features,
      layer=layer,
      sublayers=range(first, min(first + per_layer, num_sublayers)),
      num_sublayers=num_sublayers,
      rngs=rngs,
      kwargs=kwargs,
    )
  return steps


def _build_single(
  name: str, blocks: list, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> nnx.Module:
  who = "make_residual"
  fused = kwargs.pop("fused_implementation", None)
  if fused is not None:
    if name != "prenorm":
      raise ValueError(
        f"{who}: fused_implementation applies to 'prenorm' only, got {name!r}"
      )
    _checks.check_choice(who, "fused_implementation", fused, ("xla", "pallas"))
    # The norms' own implementation runs the fused add (add_and_norm).
    norm_kwargs = dict(kwargs.get("norm_kwargs") or {})
    if norm_kwargs.setdefault("implementation", fused) != fused:
      raise ValueError(
        f"{who}: fused_implementation={fused!r} conflicts with "
        f"norm_kwargs implementation={norm_kwargs['implementation']!r}"
      )
    kwargs["norm_kwargs"] = norm_kwargs
  steps = _all_steps(name, len(blocks), num_features, rngs, kwargs)
  return ResidualStack(
    blocks, steps, num_features=num_features, fused=fused is not None
  )


def _build_streams(
  name: str, blocks: list, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> nnx.Module:
  readout = kwargs.pop("readout")
  num_streams = kwargs["num_streams"]
  steps = _all_steps(name, len(blocks), num_features, rngs, kwargs)
  return StreamStack(
    blocks,
    steps,
    num_features=num_features,
    num_streams=num_streams,
    readout=readout,
  )


def _build_attnres(
  name: str, blocks: list, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> nnx.Module:
  del kwargs["sublayers_per_layer"]  # Sources are sublayers, not layers.
  if name == "block_attnres":
    num_blocks = kwargs.pop("num_blocks")
    _checks.check_positive_int("make_residual", "num_blocks", num_blocks)
    _checks.check_divisible(
      "make_residual", "len(blocks)", len(blocks), "num_blocks", num_blocks
    )
    kwargs["block_size"] = len(blocks) // num_blocks
  return AttnResStack(blocks, num_features=num_features, rngs=rngs, **kwargs)


def _per_layer(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """LayerNorm Scaling: one factor per layer of ``sublayers_per_layer``."""
  del num_sublayers
  return {"sublayers_per_layer": sublayers_per_layer}


def _rezero(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """ReZero: one gate per layer, shared by its sublayers (official code)."""
  del num_sublayers
  return {"sublayers_per_layer": sublayers_per_layer, "shared": True}


def _layerscale(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """LayerScale: CaiT's init by depth (0.1 to 18 layers, 1e-5 to 24, 1e-6)."""
  depth = -(-num_sublayers // sublayers_per_layer)
  init = 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6
  return {"init_value": init, "norm": "rmsnorm"}


def _streams(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """HC family: 4 streams (both papers), read out by their mean."""
  del num_sublayers, sublayers_per_layer
  return {"num_streams": 4, "readout": "mean"}


def _blocks(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """Block AttnRes: the paper's 8 blocks, or the largest divisor below."""
  del sublayers_per_layer
  return {"num_blocks": max(b for b in range(1, 9) if num_sublayers % b == 0)}


ResidualName = Literal[
  "prenorm",
  "postnorm",
  "sandwich",
  "lns",
  "scaled",
  "skipinit",
  "rezero",
  "layerscale",
  "hc",
  "mhc",
  "ohc",
  "ihc",
  "attnres",
  "block_attnres",
]

_HC = "Zhu et al., Hyper-Connections, arXiv:2409.19606"
_MHC = "Xie et al., mHC, arXiv:2512.24880"
_OHC = "Guo et al., oHC, arXiv:2609.02672"
_ATTNRES = "Kimi Team, Attention Residuals, arXiv:2603.15031"
# Static routing (HC's alpha, mHC's Sinkhorn logits) is a bias of the
# stream mixing: not decayed, as DepthBench trains HC and mHC.
RESIDUALS: Mapping[str, registry.ResidualSpec] = types.MappingProxyType(
  {
    "prenorm": registry.ResidualSpec(
      _build_single, "Xiong et al., arXiv:2002.04745"
    ),
    "postnorm": registry.ResidualSpec(
      _build_single, "Vaswani et al., arXiv:1706.03762"
    ),
    "sandwich": registry.ResidualSpec(
      _build_single, "Ding et al., CogView, arXiv:2105.13290"
    ),
    "lns": registry.ResidualSpec(
      _build_single,
      "Sun et al., The Curse of Depth, arXiv:2502.05795",
      defaults=_per_layer,
    ),
    "scaled": registry.ResidualSpec(
      _build_single,
      "Dherin & Munn, On residual network depth, arXiv:2510.03470",
    ),
    "skipinit": registry.ResidualSpec(
      _build_single, "De & Smith, arXiv:2002.10444", uses_norm=False
    ),
    "rezero": registry.ResidualSpec(
      _build_single,
      "Bachlechner et al., ReZero, arXiv:2003.04887",
      defaults=_rezero,
      uses_norm=False,
    ),
    "layerscale": registry.ResidualSpec(
      _build_single,
      "Touvron et al., CaiT, arXiv:2103.17239",
      defaults=_layerscale,
    ),
    "hc": registry.ResidualSpec(
      _build_streams,
      _HC,
      defaults=_streams,
      decay=types.MappingProxyType({"static_alpha": False}),
    ),
    "mhc": registry.ResidualSpec(
      _build_streams,
      _MHC,
      defaults=_streams,
      decay=types.MappingProxyType({"b_res": False}),
    ),
    "ohc": registry.ResidualSpec(_build_streams, _OHC, defaults=_streams),
    "ihc": registry.ResidualSpec(_build_streams, _OHC, defaults=_streams),
    "attnres": registry.ResidualSpec(_build_attnres, _ATTNRES),
    "block_attnres": registry.ResidualSpec(
      _build_attnres, _ATTNRES, defaults=_blocks
    ),
  }
)


def _options(
  name: str,
  num_sublayers: int,
  sublayers_per_layer: int,
  kwargs: Mapping[str, Any],
) -> dict[str, Any]:
  """The spec's defaults of ``name`` under the user's ``kwargs``."""
  if name not in RESIDUALS:
    raise ValueError(
      f"make_residual: unknown residual scheme {name!r}; "
      f"valid names are {', '.join(sorted(RESIDUALS))}"
    )
  _checks.check_positive_int(
    "make_residual", "sublayers_per_layer", sublayers_per_layer
  )
  options = dict(RESIDUALS[name].defaults(num_sublayers, sublayers_per_layer))
  options.setdefault("sublayers_per_layer", sublayers_per_layer)
  options.update(kwargs)
  return options


def make_residual(
  name: ResidualName,
  blocks: Sequence[Sublayer],
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int = 2,
  **kwargs: Any,
) -> nnx.Module:
  r"""Wraps a list of sublayers into a network with the named residual scheme.

  The options start from the scheme's spec defaults
  (``RESIDUALS[name].defaults(len(blocks), sublayers_per_layer)``: LNS and
  ReZero per layer, LayerScale's init by depth, 4 streams read out by their
  mean for the HC family, 8 blocks (or the largest divisor of
  ``len(blocks)`` below) for Block AttnRes); ``kwargs`` override them.

  Args:
    name: one of `RESIDUALS` (table in the module docstring).
    blocks: the sublayers, in order, each ``(..., d) -> (..., d)`` with no
      residual or norm of its own (an attention and an MLP per Transformer
      layer count as two).
    num_features: hidden size ``d``.
    rngs: parameter RNG streams; every step module draws exactly one
      ``params`` key, whatever its norm and options.
    sublayers_per_layer: consecutive blocks that form one layer (2 for a
      Transformer's attention and MLP; 1 for a ResNet-style stack): LNS
      scales layer ``l`` by :math:`1/\sqrt{l}` and ReZero shares one gate
      per layer.
    **kwargs: options of the scheme's step module (e.g. ``norm``,
      ``norm_kwargs``; ``scale`` for ``scaled``; ``init_value`` for the
      gated schemes, ``shared`` for ``skipinit``/``rezero``;
      ``num_streams``, ``dynamic``, ``tanh`` for ``hc``; ``num_iters``,
      ``temperature``, ``res_diag``, ``gate_init`` for
      ``mhc``/``ohc``/``ihc``), plus ``readout`` (streams: ``"sum"`` or
      ``"mean"``; AttnRes: ``"attnres"`` or ``"sum"``), ``num_blocks``
      (``block_attnres``; must divide ``len(blocks)``) and
      ``fused_implementation`` (``prenorm`` with RMSNorm or LayerNorm:
      ``"xla"`` or ``"pallas"``, set as the norms' ``implementation``, each
      residual add fused into the next norm).

  Returns:
    An nnx module ``net`` with ``net(x)`` mapping ``(..., d)`` to
    ``(..., d)`` (the hidden state before the final norm) and
    ``net(x, return_hidden=True)`` also returning per-sublayer states.

  Raises:
    ValueError: for an unknown name (the message lists the valid names),
      an empty or non-callable block list, or a bad option.
  """
  _checks.check_positive_int("make_residual", "num_features", num_features)
  blocks = _check_blocks("make_residual", blocks)
  options = _options(name, len(blocks), sublayers_per_layer, kwargs)
  return RESIDUALS[name].build(name, blocks, num_features, rngs, options)


# ---------------------------------------------------------------------------
# One layer at a time, for nnx.scan.


class ResidualLayer(nnx.Module):
  """The residual steps of one layer, applied to a scan carry.

  ``self(carry, sublayers)`` runs ``carry = steps[j](carry, sublayers[j])``
  for the layer's sublayers in order. The carry is the residual stream
  ``(..., d)`` for single-stream schemes and the stream state ``(..., n,
  d)`` for the HC family: `embed` makes it from the embedding, `output`
  reads the hidden state out. Built by `make_residual_step`.
  """

  def __init__(
    self,
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    num_streams: int | None = None,
    readout: residual.Readout = "sum",
  ):
    self.num_features, self.num_streams = num_features, num_streams
    self.readout = readout
    self.steps = nnx.List(steps)

  def embed(self, x: jax.Array) -> jax.Array:
    """The initial carry for embeddings ``x`` ``(..., d)``."""
    _check_input("ResidualLayer", x, self.num_features)
    if self.num_streams is None:
      return x
    return residual.expand_streams(x, self.num_streams)

  def output(self, carry: jax.Array) -> jax.Array:
    """The hidden state ``(..., d)`` before the final norm."""
    if self.num_streams is None:
      return carry
    return residual.reduce_streams(carry, readout=self.readout)

  def __call__(
    self, carry: jax.Array, sublayers: Sequence[Sublayer]
  ) -> jax.Array:
    """Applies the layer's steps around ``sublayers`` (one per step)."""
    if len(sublayers) != len(self.steps):
      raise ValueError(
        f"ResidualLayer: need one sublayer per step, got "
        f"{len(sublayers)} sublayers for {len(self.steps)} steps"
      )
    for step, sublayer in zip(self.steps, sublayers):
      carry = step(carry, sublayer)
    return carry


SCAN_RESIDUALS: tuple[str, ...] = tuple(
  name for name in typing.get_args(ResidualName) if "attnres" not in name
)


def make_residual_step(
  name: ResidualName,
  num_features: int,
  *,
  layer_index: residual.IndexLike,
  num_layers: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int = 2,
  **kwargs: Any,
) -> ResidualLayer:
  """The residual steps of layer ``layer_index``, by scheme name, for scans.

  Builds the same step modules as `make_residual` builds for the sublayers
  ``layer_index * sublayers_per_layer + j`` of a ``num_layers``-layer stack,
  so an ``nnx.scan`` over layers created under ``nnx.vmap`` (with
  ``layer_index = jnp.arange(num_layers)`` as the vmapped input) equals the
  unrolled network::

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0, 0))
    def create(index, rngs):
      return Layer(index, rngs)  # holds attn, mlp and
      # make_residual_step(name, d, layer_index=index, num_layers=L, ...)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(carry, layer):
      return layer.res(carry, [layer.attn, layer.mlp])

  The carry's state must have a fixed shape, so the AttnRes schemes (whose
  sources grow with depth) are refused. A traced ``layer_index`` is held in
  a `LayerIndex` variable where the step reads it (LNS).

  Args:
    name: one of `SCAN_RESIDUALS`.
    num_features: hidden size ``d``.
    layer_index: 0-based layer index: a Python integer or an integer scalar
      array (traced under ``nnx.vmap``).
    num_layers: layers of the whole stack (the depth rules of ``scaled``
      and ``layerscale`` read it).
    rngs: parameter RNG streams (one ``params`` key per step module).
    sublayers_per_layer: sublayers of each layer (2: attention and MLP).
    **kwargs: options, as for `make_residual` (``readout`` and
      ``num_streams`` set the carry of the HC family).

  Returns:
    A `ResidualLayer`.

  Raises:
    ValueError: for a scheme outside `SCAN_RESIDUALS`, a bad index or a bad
      option.
  """
  who = "make_residual_step"
  if name not in SCAN_RESIDUALS:
    raise ValueError(
      f"{who}: residual scheme {name!r} has no fixed-size scan carry; "
      f"valid names are {', '.join(SCAN_RESIDUALS)}"
    )
  _checks.check_positive_int(who, "num_features", num_features)
  _checks.check_positive_int(who, "num_layers", num_layers)
  residual.check_layer_index(who, layer_index)
  num_sublayers = num_layers * sublayers_per_layer
  options = _options(name, num_sublayers, sublayers_per_layer, kwargs)
  del options["sublayers_per_layer"]
  readout = options.pop("readout", "sum")
  first = layer_index * sublayers_per_layer
  steps = _layer_steps(
    name,
    num_features,
    layer=layer_index,
    sublayers=[first + j for j in range(sublayers_per_layer)],
    num_sublayers=num_sublayers,
    rngs=rngs,
    kwargs=options,
  )
  return ResidualLayer(
    steps,
    num_features=num_features,
    num_streams=options.get("num_streams"),
    readout=readout,
  )
