"""Attention Residuals: each sublayer's input as attention over depth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, _scope, norms
from jaxnorm.residual._common import leading


@_scope.scoped
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

  Examples:
    >>> sources = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # m = 2, one token
    >>> w = residual.attn_res_weights(sources, jnp.array([1.0, 0.0]))
    >>> print(np.asarray(w[:, 0]).round(4))  # softmax(sqrt(2) * [1, 0])
    [0.8044 0.1956]

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
    keys = keys * leading(jnp.asarray(key_scale).astype(ct), keys.shape)
  scores = keys @ jnp.asarray(query).astype(ct)
  if mask is not None:
    valid = jnp.reshape(jnp.asarray(mask), (-1,) + (1,) * (scores.ndim - 1))
    scores = jnp.where(valid, scores, -jnp.inf)
  return jax.nn.softmax(scores, axis=0)


@_scope.scoped
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

  Examples:
    >>> sources = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    >>> h = residual.attn_res(sources, jnp.zeros(2))  # query 0: the mean
    >>> print(np.asarray(h))
    [[0.5 0.5]]

  References:
    Kimi Team, *Attention Residuals*, arXiv:2603.15031 (2026).
  """
  w = attn_res_weights(sources, query, key_scale=key_scale, eps=eps, mask=mask)
  sources = jnp.asarray(sources)
  out = jnp.sum(w[..., None] * sources.astype(w.dtype), axis=0)
  return out.astype(sources.dtype)
