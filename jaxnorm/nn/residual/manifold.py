"""Manifold-constrained Hyper-Connections: the mHC, oHC and iHC steps.

Examples:
  >>> ihc = ManifoldHyperConnection(8, residual_map="identity",
  ...                               rngs=nnx.Rngs(0))
  >>> ihc.phi_res is None, ihc.b_res is None  # iHC: no stream mixing to learn
  (True, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param
from jaxnorm.nn.residual._common import (
  NormSpec,
  Placement,
  Sublayer,
  build_norm,
  check_state,
  params_key,
  then,
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
  ``n`` copies of the Pre-Norm network. ``layer_index`` (the models pass the
  sublayer index ``k``) focuses the initial read on stream ``k mod n``
  (``pre_focus``), as HC's; without it the read is uniform and the streams
  never separate. The branch keeps its own pre-norm
  ``norm``. Maths in `jaxnorm.residual.mhc_maps`.

  Examples:
    >>> mhc = ManifoldHyperConnection(4, num_streams=2, rngs=nnx.Rngs(0))
    >>> mhc.phi_res.shape, mhc.b_res.shape  # (n*d, n*n), (n, n)
    ((8, 4), (2, 2))
    >>> h_pre, h_post, h_res = mhc.maps(jnp.ones((3, 2, 4), jnp.float32))
    >>> [[round(v, 4) for v in row] for row in h_res[0].tolist()]
    [[0.99, 0.01], [0.01, 0.99]]

    (``h_res`` is doubly stochastic, near the identity at init.)
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
    layer_index: residual.IndexLike | None = None,
    pre_focus: float = 0.9,
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
    key = params_key(rngs)
    d, n = num_features, num_streams
    self.num_features, self.num_streams = d, n
    self.residual_map, self.dynamic = residual_map, dynamic
    self.num_iters, self.temperature = num_iters, temperature
    self.log_domain, self.eps = log_domain, eps
    b_pre, b_post, b_res = residual.mhc_static_init(
      n,
      residual=residual_map,
      res_diag=res_diag,
      layer_index=layer_index,
      pre_focus=pre_focus,
      dtype=param_dtype,
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
    # One array per gate: a train step donates every parameter buffer.
    self.a_pre = _param.param(jnp.full((), gate_init, param_dtype), ())
    self.a_post = _param.param(jnp.full((), gate_init, param_dtype), ())
    self.a_res = _param.param(jnp.full((), gate_init, param_dtype), ())
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

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
    check_state(type(self).__name__, h, self.num_streams, self.num_features)
    h_pre, h_post, h_res = self.maps(h)
    return residual.hyper_connection(
      h, then(self.norm, sublayer), h_pre=h_pre, h_post=h_post, h_res=h_res
    )


def make_manifold_step(
  num_features: int,
  place: Placement,
  *,
  residual_map: residual.ResidualMap,
  rngs: nnx.Rngs,
  **options: Any,
) -> ManifoldHyperConnection:
  """The mHC, oHC or iHC step (``residual_map``) at ``place``.

  The initial read focuses on stream ``k mod n`` of sublayer ``k``.
  """
  return ManifoldHyperConnection(
    num_features,
    residual_map=residual_map,
    layer_index=place.sublayer,
    rngs=rngs,
    **options,
  )
