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

Schemes (`RESIDUALS`):

======================  ====================================================
name                    wiring of sublayer ``f_k`` (norms from `make_norm`)
======================  ====================================================
``prenorm``             ``x + f(norm(x))``
``postnorm``            ``norm(x + f(x))``
``sandwich``            ``x + norm_out(f(norm_in(x)))``
``lns``                 ``x + f(norm(x) / sqrt(l))``, LayerNorm Scaling
``scaled``              ``x + lam * f(norm(x))``, ``lam = 1/n`` or 1/sqrt(n)
``skipinit``            ``x + alpha * f(x)``, scalar ``alpha`` init 0
``rezero``              ``x + alpha * f(x)``, scalar ``alpha`` init 0
``layerscale``          ``x + diag(gamma) f(norm(x))``, ``gamma`` init 1e-5
``hc``                  Hyper-Connections (dynamic or static), ``n`` streams
``mhc``                 mHC: Sinkhorn-constrained stream mixing
``ohc``                 oHC: SO(4) stream mixing from two quaternions
``ihc``                 iHC: mHC with identity stream mixing
``attnres``             Full Attention Residuals
``block_attnres``       Block Attention Residuals
======================  ====================================================

Depth growth at initialization, measured by
``tests/nn/test_residual.py::test_depth_growth_table`` (marked slow) on a
24-layer (48-sublayer) stack of single-head causal softmax attention and
GELU MLP sublayers with Gaussian weights (std ``1/sqrt(fan_in)``), ``d = 32``,
RMSNorm everywhere, batch 2 x 8 tokens of unit-RMS Gaussian embeddings,
float32. "growth" is the RMS of the hidden state after the last layer over
its RMS after the first layer (multi-stream schemes read out with
``"mean"``; for AttnRes the hidden state is the aggregated sublayer input
:math:`h_l`). All schemes also stay finite in float32 and bfloat16, with
finite gradients (``test_24_layer_stack_finite``).

=================  ======  ================================================
scheme             growth  note
=================  ======  ================================================
prenorm            3.67    the stream accumulates unnormalized branches
postnorm           1.00    every step ends in a norm
sandwich           4.05    branch outputs normalized to RMS 1 and summed
lns                1.24    1/sqrt(l) damps the late branches
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, fused_norms, residual
from jaxnorm.nn import _param
from jaxnorm.nn import norms as nn_norms

Sublayer = Callable[[jax.Array], jax.Array]
NormSpec = str | None


def _make_norm(
  norm: NormSpec, num_features: int, norm_kwargs: Mapping | None, rngs: nnx.Rngs
) -> nnx.Module | None:
  if norm is None:
    return None
  return nn_norms.make_norm(
    norm, num_features, rngs=rngs, **dict(norm_kwargs or {})
  )


def _identity(x: jax.Array) -> jax.Array:
  return x


def _then(norm: nnx.Module | None, sublayer: Sublayer) -> Sublayer:
  """The branch with its own pre-norm: ``f(norm(x))``."""
  if norm is None:
    return sublayer
  return lambda x: sublayer(norm(x))


def _check_layer_index(who: str, layer_index: int | None) -> None:
  if layer_index is not None and (
    isinstance(layer_index, bool)
    or not isinstance(layer_index, int)
    or layer_index < 0
  ):
    raise ValueError(
      f"{who}: layer_index must be a non-negative integer "
      f"(0-based) or None, got {layer_index=}"
    )


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

  ``layer_index`` (0-based Transformer layer) enables LayerNorm Scaling.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: int | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("PreNormResidual", "num_features", num_features)
    _check_layer_index("PreNormResidual", layer_index)
    self.num_features, self.layer_index = num_features, layer_index
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    return residual.pre_norm(
      x, sublayer, self.norm, layer_index=self.layer_index
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
    self.num_features = num_features
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    return residual.post_norm(x, sublayer, self.norm)


class SandwichNormResidual(nnx.Module):
  """Sandwich step ``x + norm_out(f(norm_in(x)))``.

  See `jaxnorm.residual.sandwich_norm`; both norms are built by name.
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: int | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int(
      "SandwichNormResidual", "num_features", num_features
    )
    _check_layer_index("SandwichNormResidual", layer_index)
    self.num_features, self.layer_index = num_features, layer_index
    self.norm_in = _make_norm(norm, num_features, norm_kwargs, rngs)
    self.norm_out = _make_norm(norm, num_features, norm_kwargs, rngs)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    return residual.sandwich_norm(
      x, sublayer, self.norm_in, self.norm_out, layer_index=self.layer_index
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
    self.num_features = num_features
    self.scale = residual.residual_scale(num_residuals, scale)
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    return residual.scaled_residual(x, sublayer, self.scale, norm=self.norm)


class GatedResidual(nnx.Module):
  """Learned branch gate ``x + g * f(norm(x))`` (SkipInit, ReZero, LayerScale).

  ``shape="scalar"``: one ``gate`` (shape ``(1,)``), SkipInit / ReZero with
  ``init_value=0`` and ``norm=None``. ``shape="vector"``: a per-channel
  ``gate`` (shape ``(d,)``), LayerScale with a pre-norm and a small
  ``init_value`` (CaiT: 0.1 up to depth 18, 1e-5 at 24, 1e-6 beyond). See
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
    self.num_features = num_features
    size = 1 if shape == "scalar" else num_features
    names = (None,) if shape == "scalar" else ("norm",)
    self.gate = _param.param(jnp.full((size,), init_value, param_dtype), names)
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    return residual.scaled_residual(x, sublayer, self.gate[...], norm=self.norm)


# ---------------------------------------------------------------------------
# Multi-stream steps.


class HyperConnection(nnx.Module):
  """One Hyper-Connection around sublayer ``layer_index``.

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
    layer_index: int,
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
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

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

    def phi(out: int) -> nnx.Param:
      shape = (n * d, out)
      value = (
        phi_init_std * jax.random.normal(rngs.params(), shape, param_dtype)
        if phi_init_std
        else jnp.zeros(shape, param_dtype)
      )
      return _param.param(value, ("embed", None))

    self.phi_pre = phi(n) if dynamic else None
    self.phi_post = phi(n) if dynamic else None
    self.phi_res = phi(res_out) if dynamic and res_out else None
    gate = jnp.full((), gate_init, param_dtype)
    self.a_pre = _param.param(gate, ())
    self.a_post = _param.param(gate, ())
    self.a_res = _param.param(gate, ())
    self.norm = _make_norm(norm, num_features, norm_kwargs, rngs)

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

  def __call__(self, sources: jax.Array) -> jax.Array:
    """Aggregates ``sources`` ``(m, ..., d)`` into ``(..., d)``."""
    return residual.attn_res(
      sources, self.query[...], key_scale=self.key_scale[...], eps=self.eps
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


def _fused_norm_call(
  norm: nnx.Module, branch: jax.Array, stream: jax.Array, implementation: Any
) -> tuple[jax.Array, jax.Array]:
  """``(stream + branch, norm(stream + branch))`` through `fused_norms`."""
  scale = None if norm.scale is None else norm.scale[...]
  if isinstance(norm, nn_norms.RMSNorm):
    h, y = fused_norms.add_rms_norm(
      branch,
      stream,
      scale,
      eps=norm.eps,
      eps_mode=norm.eps_mode,
      scale_offset=norm.scale_offset,
      implementation=implementation,
    )
  else:
    bias = None if norm.bias is None else norm.bias[...]
    h, y = fused_norms.add_layer_norm(
      branch,
      stream,
      scale,
      bias,
      eps=norm.eps,
      scale_offset=norm.scale_offset,
      implementation=implementation,
    )
  return h, (y if norm.dtype is None else y.astype(norm.dtype))


class ResidualStack(nnx.Module):
  """Single-stream network: ``x = steps[k](x, blocks[k])`` for every k.

  ``steps`` are residual-step modules (`PreNormResidual`, ...), one per
  sublayer.

  ``fused_implementation`` (``"xla"`` or ``"pallas"``; pre-norm RMSNorm or
  LayerNorm steps without LayerNorm Scaling only) runs each residual add
  together with the next step's norm, ``(h, y) = add_norm(f(y_prev), h)``,
  through `jaxnorm.fused_norms` (one kernel pass with ``"pallas"``). The
  result equals the unfused stack.
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    fused_implementation: Literal["xla", "pallas"] | None = None,
  ):
    who = "ResidualStack"
    blocks = _check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    if fused_implementation is not None:
      _checks.check_choice(
        who, "fused_implementation", fused_implementation, ("xla", "pallas")
      )
      for k, step in enumerate(steps):
        if not (
          isinstance(step, PreNormResidual)
          and step.layer_index is None
          and isinstance(step.norm, (nn_norms.RMSNorm, nn_norms.LayerNorm))
        ):
          raise NotImplementedError(
            f"{who}: fused_implementation needs pre-norm steps with an "
            f"RMSNorm or LayerNorm and no LayerNorm Scaling; steps[{k}] is "
            f"{type(step).__name__} with norm "
            f"{type(getattr(step, 'norm', None)).__name__}"
          )
    self.num_features = num_features
    self.fused_implementation = fused_implementation
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns the hidden state after every
    sublayer, stacked to ``(num_sublayers, ..., d)``.
    """
    _check_input("ResidualStack", x, self.num_features)
    hidden = []
    if self.fused_implementation is not None:
      branch = None
      for block, step in zip(self.blocks, self.steps):
        if branch is None:
          y = step.norm(x)
        else:
          x, y = _fused_norm_call(
            step.norm, branch, x, self.fused_implementation
          )
          hidden.append(x)
        branch = block(y)
      x = (x + branch).astype(x.dtype)
      hidden.append(x)
      return (x, jnp.stack(hidden)) if return_hidden else x
    for block, step in zip(self.blocks, self.steps):
      x = step(x, block)
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
      h = step(h, block)
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
    self.norms = nnx.List(
      [_make_norm(norm, num_features, norm_kwargs, rngs) for _ in blocks]
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
    # sublayer k reads the non-empty slots 0..ceil(k / block_size). One
    # buffer with static slices keeps the traced graph linear in depth.
    size = self.block_size
    num_slots = -(-len(self.blocks) // size) + 1
    slots = jnp.zeros((num_slots, *x.shape), x.dtype).at[0].set(x)
    hidden = []
    for k, (block, query, norm) in enumerate(
      zip(self.blocks, self.queries, self.norms)
    ):
      h = query(slots[: -(-k // size) + 1])
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


def _build_single(
  name: str, blocks: list, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> nnx.Module:
  d = num_features
  per_layer = kwargs.pop("sublayers_per_layer", 1)
  _checks.check_positive_int("make_residual", "sublayers_per_layer", per_layer)
  fused = kwargs.pop("fused_implementation", None)
  if fused is not None and name != "prenorm":
    raise ValueError(
      f"make_residual: fused_implementation applies to "
      f"'prenorm' only, got {name!r}"
    )
  if name == "prenorm":
    steps = [PreNormResidual(d, rngs=rngs, **kwargs) for _ in blocks]
    return ResidualStack(
      blocks, steps, num_features=d, fused_implementation=fused
    )
  elif name == "lns":
    steps = [
      PreNormResidual(d, layer_index=k // per_layer, rngs=rngs, **kwargs)
      for k in range(len(blocks))
    ]
  elif name == "postnorm":
    steps = [PostNormResidual(d, rngs=rngs, **kwargs) for _ in blocks]
  elif name == "sandwich":
    steps = [SandwichNormResidual(d, rngs=rngs, **kwargs) for _ in blocks]
  elif name == "scaled":
    steps = [
      ScaledResidual(d, num_residuals=len(blocks), rngs=rngs, **kwargs)
      for _ in blocks
    ]
  elif name in ("skipinit", "rezero"):
    shared = kwargs.pop("shared", False)
    steps = [
      GatedResidual(d, shape="scalar", rngs=rngs, **kwargs)
      for _ in range(0, len(blocks), per_layer if shared else 1)
    ]
    if shared:  # ReZero option: one alpha per Transformer layer.
      steps = [steps[k // per_layer] for k in range(len(blocks))]
  else:  # layerscale
    kwargs.setdefault("init_value", 1e-5)
    kwargs.setdefault("norm", "rmsnorm")
    steps = [
      GatedResidual(d, shape="vector", rngs=rngs, **kwargs) for _ in blocks
    ]
  return ResidualStack(blocks, steps, num_features=d)


def _build_streams(
  name: str, blocks: list, num_features: int, rngs: nnx.Rngs, kwargs: dict
) -> nnx.Module:
  num_streams = kwargs.pop("num_streams", 4)
  readout = kwargs.pop("readout", "sum")
  if name == "hc":
    steps = [
      HyperConnection(
        num_features,
        layer_index=k,
        num_streams=num_streams,
        rngs=rngs,
        **kwargs,
      )
      for k in range(len(blocks))
    ]
  else:
    residual_map = {"mhc": "sinkhorn", "ohc": "quaternion", "ihc": "identity"}[
      name
    ]
    steps = [
      ManifoldHyperConnection(
        num_features,
        num_streams=num_streams,
        residual_map=residual_map,
        rngs=rngs,
        **kwargs,
      )
      for _ in blocks
    ]
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
  if name == "block_attnres":
    num_blocks = kwargs.pop("num_blocks", 8)
    _checks.check_positive_int("make_residual", "num_blocks", num_blocks)
    _checks.check_divisible(
      "make_residual", "len(blocks)", len(blocks), "num_blocks", num_blocks
    )
    kwargs["block_size"] = len(blocks) // num_blocks
  return AttnResStack(blocks, num_features=num_features, rngs=rngs, **kwargs)


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

RESIDUALS: Mapping[str, Callable[..., nnx.Module]] = types.MappingProxyType(
  {
    "prenorm": _build_single,
    "postnorm": _build_single,
    "sandwich": _build_single,
    "lns": _build_single,
    "scaled": _build_single,
    "skipinit": _build_single,
    "rezero": _build_single,
    "layerscale": _build_single,
    "hc": _build_streams,
    "mhc": _build_streams,
    "ohc": _build_streams,
    "ihc": _build_streams,
    "attnres": _build_attnres,
    "block_attnres": _build_attnres,
  }
)


def make_residual(
  name: ResidualName,
  blocks: Sequence[Sublayer],
  *,
  num_features: int,
  rngs: nnx.Rngs,
  **kwargs: Any,
) -> nnx.Module:
  """Wraps a list of sublayers into a network with the named residual scheme.

  Args:
    name: one of `RESIDUALS` (table in the module docstring).
    blocks: the sublayers, in order, each ``(..., d) -> (..., d)`` with no
      residual or norm of its own (an attention and an MLP per Transformer
      layer count as two).
    num_features: hidden size ``d``.
    rngs: parameter RNG streams.
    **kwargs: options of the scheme's step module (e.g. ``norm``,
      ``norm_kwargs``; ``scale`` for ``scaled``; ``init_value`` for the
      gated schemes; ``num_streams``, ``dynamic``, ``tanh`` for ``hc``;
      ``num_iters``, ``temperature``, ``res_diag``, ``gate_init`` for
      ``mhc``/``ohc``/``ihc``), plus ``readout`` (streams: ``"sum"`` or
      ``"mean"``; AttnRes: ``"attnres"`` or ``"sum"``),
      ``sublayers_per_layer`` (``lns``, and ``rezero`` with
      ``shared=True``), ``num_blocks`` (``block_attnres``, default 8; must
      divide ``len(blocks)``).

  Returns:
    An nnx module ``net`` with ``net(x)`` mapping ``(..., d)`` to
    ``(..., d)`` (the hidden state before the final norm) and
    ``net(x, return_hidden=True)`` also returning per-sublayer states.

  Raises:
    ValueError: for an unknown name (the message lists the valid names),
      an empty or non-callable block list, or a bad option.
  """
  if name not in RESIDUALS:
    raise ValueError(
      f"make_residual: unknown residual scheme {name!r}; "
      f"valid names are {', '.join(sorted(RESIDUALS))}"
    )
  _checks.check_positive_int("make_residual", "num_features", num_features)
  blocks = _check_blocks("make_residual", blocks)
  return RESIDUALS[name](name, blocks, num_features, rngs, dict(kwargs))
