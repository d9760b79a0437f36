"""Affine-Scaled Attention (Bae et al., 2026)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope
from jaxnorm.attention import _core


@_scope.scoped
def linear_clipping(x: Float[Array, "..."]) -> Float[Array, "..."]:
  r"""Affine-Scaled Attention's default gate, ``clip(0.1 x + 0.5, 0, 1)``.

  Zero for ``x <= -5``, one for ``x >= 5``, linear in between (the paper's
  "linear clipping"; the sigmoid is its ablation).

  Examples:
    >>> y = attention.linear_clipping(jnp.array([-10.0, 0.0, 2.0, 10.0]))
    >>> print(np.asarray(y))  # clip(0.1 x + 0.5, 0, 1)
    [0.  0.5 0.7 1. ]
  """
  _checks.check_floating("linear_clipping", "x", x)
  x = jnp.asarray(x)
  dtype = _numerics.compute_dtype(x)
  y = jnp.clip(x.astype(dtype) * 0.1 + 0.5, 0.0, 1.0)
  return y.astype(x.dtype)


def affine_scale_running_estimate(
  alpha: Float[Array, "..."],
  valid: Bool[Array, "..."],
  alpha_ma: Float[Array, "..."],
  *,
  head_axis: int,
  training: bool,
  rho: float,
) -> Float[Array, "..."]:
  r"""The running estimate :math:`\bar\alpha` of Affine-Scaled Attention.

  Training: :math:`\bar\alpha \leftarrow \rho\,\bar\alpha + (1 - \rho)
  \,\mathrm{mean}(\alpha)`, the mean over the query rows that have at least
  one allowed key (``valid``), per head when ``alpha_ma`` has shape ``(N,)``
  and over everything when it is a scalar; no gradient flows into the
  estimate. Inference returns ``alpha_ma`` unchanged. Shared by
  `affine_scaled_attention` and its Pallas kernel so both use one update.

  Args:
    alpha: per-row scales, a 4-d array with the heads on ``head_axis``, in
      the compute dtype.
    valid: rows with an allowed key, same shape as ``alpha``.
    alpha_ma: ``(N,)`` or ``()``.
    head_axis: the axis of ``alpha`` holding the ``N`` heads.
    training: update (True) or keep (False) the estimate.
    rho: EMA decay in ``[0, 1]``.

  Returns:
    The estimate in ``alpha``'s dtype (cast it back to ``alpha_ma.dtype``).
  """
  _checks.check_floating("affine_scale_running_estimate", "alpha", alpha)
  alpha = jnp.asarray(alpha)
  if not training:
    return alpha_ma.astype(alpha.dtype)
  axes = (
    tuple(i for i in range(alpha.ndim) if i != head_axis)
    if alpha_ma.ndim == 1
    else tuple(range(alpha.ndim))
  )
  n_valid = jnp.maximum(jnp.sum(valid.astype(alpha.dtype), axis=axes), 1.0)
  batch_mean = jnp.sum(jnp.where(valid, alpha, 0.0), axis=axes) / n_valid
  new_ma = rho * alpha_ma.astype(alpha.dtype) + (1.0 - rho) * batch_mean
  return jax.lax.stop_gradient(new_ma)


def check_affine_args(
  who: str,
  batch: int,
  q_len: int,
  heads: int,
  alpha: jax.Array,
  alpha_ma: jax.Array,
  rho: float,
) -> jax.Array:
  """Validates ``alpha``, ``alpha_ma`` and ``rho``; returns ``alpha_ma``.

  Shared by `affine_scaled_attention` and its Pallas kernel.

  Raises:
    TypeError: if ``alpha`` is not floating.
    ValueError: if ``alpha`` is not ``(batch, q_len, heads)``, ``alpha_ma``
      neither ``(heads,)`` nor ``()``, or ``rho`` outside ``[0, 1]``.
  """
  _checks.check_floating(who, "alpha", alpha)
  _checks.check_shape(
    who, "alpha", alpha, (batch, q_len, heads), "(batch, q_len, heads)"
  )
  alpha_ma = jnp.asarray(alpha_ma)
  if alpha_ma.shape not in ((heads,), ()):
    raise ValueError(
      f"{who}: alpha_ma must have shape ({heads},) (per head) or () (per "
      f"layer), got {alpha_ma.shape=}"
    )
  if not 0.0 <= rho <= 1.0:
    raise ValueError(f"{who}: rho must be in [0, 1], got {rho=}")
  return alpha_ma


@_scope.scoped
def affine_scaled_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  bias: Float[Array, "B N T S"] | None = None,
  mask: Bool[Array, "B N T S"] | None = None,
  *,
  alpha: Float[Array, "B T N"],
  alpha_ma: Float[Array, "..."],
  scale: float | None = None,
  is_causal: bool = False,
  training: bool = False,
  rho: float = 0.9,
  implementation: _dispatch.Implementation | None = None,
) -> tuple[Float[Array, "B T N Hv"], Float[Array, "..."]]:
  r"""Affine-Scaled Attention: softmax weights with an input-dependent affine.

  .. math::
     P = \mathrm{softmax}(q k^T s), \quad
     \beta_i = \frac{\bar\alpha - \alpha_i}{N_i}, \quad
     \mathrm{out}_i = \sum_{j \in \mathcal{A}_i} (\alpha_i P_{ij} + \beta_i)
     v_j

  ``alpha`` is :math:`\phi(X W_a)` (`linear_clipping` by default), one scalar
  per query and head. :math:`\bar\alpha` is ``alpha_ma``, a running estimate
  of the batch mean of ``alpha``:
  :math:`\bar\alpha_t = \rho \bar\alpha_{t-1} + (1 - \rho) E[\alpha_t]`.
  Each weight row sums to :math:`\bar\alpha` (not 1) and may be negative.

  Conventions (unverified; the paper leaves them open):

  * ``N_i`` is the number of keys query ``i`` may attend to (its allowed set
    :math:`\mathcal{A}_i` from ``mask``/``is_causal``); ``beta`` is spread on
    those keys only, so masked keys get exactly 0. A query with no allowed key
    outputs 0.
  * The running estimate's axes follow ``alpha_ma.shape``: ``(N,)`` is one
    value per head (default in the module), ``()`` one per layer. The mean
    runs over batch and queries (and heads for ``()``), over rows with at
    least one allowed key.
  * Causality: :math:`\beta` always uses the estimate from **before** the
    current batch (``alpha_ma`` as passed, under ``stop_gradient``), in
    training and in eval. Training returns the updated estimate (which
    includes this batch's :math:`\alpha`) for the next step; eval returns
    ``alpha_ma`` unchanged. So no output depends on another position's
    :math:`\alpha` (with ``is_causal``, the output at ``t`` depends on no
    token after ``t``), and for equal ``alpha_ma`` the training and eval
    outputs are identical. Deviation: using the updated estimate in
    :math:`\beta` (the paper's literal order, the EMA update before use)
    would leak the batch mean of :math:`\alpha`, i.e. future tokens, into
    every position of a causal model.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    bias: additive bias broadcastable to ``(B, N, T, S)``.
    mask: boolean mask broadcastable to ``(B, N, T, S)``.
    alpha: the scale ``(B, T, N)``.
    alpha_ma: running estimate, ``(N,)`` or ``()``.
    scale: logit scale, default ``1/sqrt(H)``.
    is_causal: apply a lower-triangular mask.
    training: update the running estimate (True) or use it (False).
    rho: EMA decay (paper: 0.9).
    implementation: ``"xla"`` (reference), ``"pallas"`` (the softmax part
      in the flash kernel, `pallas_kernels.attention.
      affine_scaled_attention_pallas`; no additive ``bias``) or None (the
      kernel on GPU/TPU when it covers the case, else the reference).

  Returns:
    ``(out, new_alpha_ma)``: ``(B, T, N, Hv)`` in ``query.dtype`` and the
    estimate in ``alpha_ma.dtype``.

  Raises:
    ValueError: on mismatched shapes (``alpha``, ``alpha_ma``, q/k/v,
      bias, mask), ``rho`` outside ``[0, 1]`` or an unknown
      ``implementation``.
    TypeError: on non-floating inputs or a non-boolean mask.
    NotImplementedError: for ``implementation="pallas"`` on a case the
      kernel does not cover.

  Examples:
    >>> q = k = jnp.zeros((1, 2, 1, 2))
    >>> v = jnp.ones((1, 2, 1, 2))
    >>> out, ma = attention.affine_scaled_attention(
    ...     q, k, v, alpha=jnp.full((1, 2, 1), 0.3), alpha_ma=jnp.full(1, 0.8),
    ...     training=True)
    >>> print(np.asarray(out[0, :, 0]))  # each weight row sums to alpha_ma
    [[0.8 0.8]
     [0.8 0.8]]
    >>> print(np.asarray(ma).round(4))  # 0.9 * 0.8 + 0.1 * 0.3
    [0.75]

  References:
    Bae et al., *Affine-Scaled Attention: Towards Flexible and Stable
    Transformer Attention*, arXiv:2602.23057 (2026), eqs. 6-11.
  """
  who = "affine_scaled_attention"
  d, q, k, v, bias4, mask4 = _core.prepare(who, query, key, value, bias, mask)
  if d.unbatched:
    raise ValueError(
      f"{who}: query must be batched (B, T, N, H), got {query.shape=}"
    )
  alpha_ma = check_affine_args(
    who, d.batch, d.q_len, d.heads, alpha, alpha_ma, rho
  )

  def reference():
    dtype = _numerics.compute_dtype(q, k, v)
    allowed = _core.allowed_mask(d, mask4, is_causal)
    logits = _core.masked_logits(
      d, q, k, bias4, allowed, _core.default_scale(d, scale), dtype
    )
    p = jax.nn.softmax(logits, axis=-1)
    a = jnp.transpose(alpha.astype(dtype), (0, 2, 1))[..., None]  # B N T 1
    count = _core.row_count(d, allowed, dtype)  # (B|1, N|1, T|1, 1)
    valid = jnp.broadcast_to(count > 0, a.shape)
    new_ma = affine_scale_running_estimate(
      a, valid, alpha_ma, head_axis=1, training=training, rho=rho
    )
    old = jax.lax.stop_gradient(alpha_ma.astype(dtype))
    ma = old.reshape((1, d.heads, 1, 1) if old.ndim else (1, 1, 1, 1))
    beta = (ma - a) / jnp.maximum(count, 1.0)
    w = a * p + beta
    if allowed is not None:
      w = jnp.where(allowed, w, 0.0)
    w = jnp.where(valid, w, 0.0)
    out = _core.finish(d, _core.apply_weights(d, w, v, dtype), query.dtype)
    return out, new_ma.astype(alpha_ma.dtype)

  return _dispatch.dispatch(
    who,
    implementation,
    "affine_scaled_attention_pallas",
    lambda kernel: kernel(
      query,
      key,
      value,
      bias,
      mask,
      alpha=alpha,
      alpha_ma=alpha_ma,
      scale=scale,
      is_causal=is_causal,
      training=training,
      rho=rho,
    ),
    reference,
    arrays=(query,),
  )
