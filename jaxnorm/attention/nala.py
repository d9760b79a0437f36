"""NaLaFormer: norm-aware linear attention, and its layer on a token map."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics, _scope, norms
from jaxnorm.attention import _core, _grid, lina


def _sign_split(x: jax.Array) -> jax.Array:
  return jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)


def _safe_pow(x: jax.Array, p: jax.Array) -> jax.Array:
  """``x ** p`` for ``x >= 0`` with finite gradients at ``x = 0``."""
  pos = x > 0
  return jnp.where(pos, jnp.exp(p * jnp.log(jnp.where(pos, x, 1.0))), 0.0)


def nala_query_feature(
  q: Float[Array, "... h"], *, power_scale: float = 3.0, eps: float = 1e-6
) -> Float[Array, "... 2h"]:
  r"""NaLaFormer's norm-aware query map.

  .. math:: r = \|q\|, \quad p(r) = \lambda (0.5 + \tanh r), \quad
     \phi_q(q) = [(\mathrm{ReLU}(q)/r)^{p}; (\mathrm{ReLU}(-q)/r)^{p}]

  The direction ``q/r`` carries the angle; the norm enters as the exponent
  (a temperature): larger norms give spikier weights. ``r`` is clamped at
  ``eps`` (inside the square root, so an all-zero row has finite
  gradients). Float32 output.

  Raises:
    ValueError: if ``q`` is a scalar.
    TypeError: if ``q`` is not floating.
  """
  _checks.check_floating("nala_query_feature", "q", q)
  _checks.check_ndim("nala_query_feature", "q", q, minimum=1)
  dtype = _numerics.compute_dtype(q)
  q = q.astype(dtype)
  # sqrt of the clamped square: finite gradients at q = 0 (an all-zero row).
  r = jnp.sqrt(jnp.maximum(jnp.sum(q * q, axis=-1, keepdims=True), eps * eps))
  p = power_scale * (0.5 + jnp.tanh(r))
  return _safe_pow(_sign_split(q / r), p)


def nala_key_feature(k: Float[Array, "... h"]) -> Float[Array, "... 2h"]:
  r"""NaLaFormer's key map :math:`[\mathrm{ReLU}(k^3); \mathrm{ReLU}(-k^3)]`.

  The sign split preserves the norm of ``k**3`` and makes
  :math:`\phi(q)\cdot\phi(k)` the sum of same-sign products (the "cosine
  inhibit"). Float32 output.

  Raises:
    ValueError: if ``k`` is a scalar.
    TypeError: if ``k`` is not floating.
  """
  _checks.check_floating("nala_key_feature", "k", k)
  _checks.check_ndim("nala_key_feature", "k", k, minimum=1)
  k = k.astype(_numerics.compute_dtype(k))
  return _sign_split(k * k * k)


def _rotate_every_two(x: jax.Array) -> jax.Array:
  x1, x2 = x[..., 0::2], x[..., 1::2]
  return jnp.stack([-x2, x1], axis=-1).reshape(x.shape)


@_scope.scoped
def nala_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B S K H"],
  value: Float[Array, "B S K Hv"],
  *,
  power_scale: float = 3.0,
  eps: float = 1e-6,
  rope_sin_cos: tuple[jax.Array, jax.Array] | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""NaLaFormer norm-aware linear attention (non-causal, linear in length).

  .. math::
     z_i = \frac{1}{\phi_q(q_i)\cdot \overline{\phi_k(k)} + \epsilon}, \quad
     \mathrm{out}_i = z_i \, \tilde\phi_q(q_i)^T \Big(\frac1S \sum_j
     \tilde\phi_k(k_j) v_j^T\Big)

  with `nala_query_feature` and `nala_key_feature` (feature dim ``2H``).
  :math:`\tilde\phi` are the features after an optional rotate-every-two RoPE
  (``rope_sin_cos = (sin, cos)``, each broadcastable to ``(T, 2H)``; needs
  ``S == T``), applied in the numerator only, as in the official code; the
  denominator uses the un-rotated features. Without RoPE the implied weights
  are non-negative and rows sum to 1 up to ``eps``. Computed in float32.
  The LePE conv, output gate and LayerNorm of the block are the module's job.

  Unverified: v1 of the paper may use a ``[cos; sin]`` lift instead of the
  sign split; this follows the ICML-2026 code (``NALA.py``).

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, S, K, H)``.
    value: ``(B, S, K, Hv)``.
    power_scale: :math:`\lambda` (code: 3; also the key's cube).
    eps: denominator and norm clamp epsilon.
    rope_sin_cos: optional ``(sin, cos)`` for the numerator's features.

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or RoPE tables.
    TypeError: on non-floating inputs.

  Examples:
    >>> q = jnp.array([[1.0, 2.0], [3.0, -1.0]]).reshape(1, 2, 1, 2)
    >>> k = jnp.ones((1, 2, 1, 2))  # equal keys: every query reads mean(v)
    >>> v = jnp.array([[1.0, 0.0], [3.0, 2.0]]).reshape(1, 2, 1, 2)
    >>> print(np.asarray(attention.nala_attention(q, k, v)[0, :, 0]).round(4))
    [[2. 1.]
     [2. 1.]]

  References:
    Meng et al., *NaLaFormer: Norm-Aware Linear Attention for Transformer
    Models*, arXiv:2506.21137 (2025); ICML 2026 version *Norm x Direction:
    Restoring the Missing Query Norm in Vision Linear Attention*.
  """
  who = "nala_attention"
  d, q, k, v, _, _ = _core.prepare(who, query, key, value, None, None)
  dtype = _numerics.compute_dtype(q, k, v)
  k, v = _core.repeat_kv(d, k), _core.repeat_kv(d, v).astype(dtype)
  fq = nala_query_feature(q, power_scale=power_scale, eps=eps)
  fk = nala_key_feature(k)
  den = jnp.einsum("btnf,bnf->btn", fq, jnp.mean(fk, axis=1)) + eps
  if rope_sin_cos is not None:
    if d.q_len != d.kv_len:
      raise ValueError(
        f"{who}: rope_sin_cos needs q_len == kv_len, got {query.shape=} "
        f"and {key.shape=}"
      )
    sin, cos = (jnp.asarray(a, dtype) for a in rope_sin_cos)
    f = 2 * d.head_dim
    for name, a in (("sin", sin), ("cos", cos)):
      if a.ndim != 2 or a.shape[1] != f or a.shape[0] not in (1, d.q_len):
        raise ValueError(
          f"{who}: rope_sin_cos {name} must have shape ({d.q_len}, {f}), "
          f"got {a.shape}"
        )
    sin, cos = sin[None, :, None, :], cos[None, :, None, :]
    fq = fq * cos + _rotate_every_two(fq) * sin
    fk = fk * cos + _rotate_every_two(fk) * sin
  kv = jnp.einsum("bsnf,bsne->bnfe", fk, v) / d.kv_len
  num = jnp.einsum("btnf,bnfe->btne", fq, kv)
  return _core.finish(d, num / den[..., None], query.dtype)


@_scope.scoped
def grid_rope_tables(
  grid_shape: tuple[int, int],
  head_dim: int,
  *,
  num_prefix: int = 0,
  base: float = 10000.0,
) -> tuple[Float[Array, "T H"], Float[Array, "T H"]]:
  r"""NaLaFormer's 2-D rotate-every-two RoPE tables ``(sin, cos)``.

  .. math::
     \omega_i = \mathrm{base}^{-i/(H/4 - 1)},\ i < H/4, \quad
     \theta_{(r, c)} = [r\,\omega \otimes 1_2;\ c\,\omega \otimes 1_2]

  Each frequency is repeated for the two entries of a rotated pair; the
  first ``H/2`` feature dims rotate with the row ``r``, the last ``H/2``
  with the column ``c`` (official ``RoPE`` of ``NALA.py``, where the
  exponents are ``linspace(0, 1, H/4)``). Rows are the tokens in sequence
  order; the ``num_prefix`` leading tokens get ``sin = 0, cos = 1`` (not
  rotated).

  Args:
    grid_shape: ``(h, w)`` of the token map.
    head_dim: ``H``, a multiple of 4.
    num_prefix: tokens before the map.
    base: frequency base.

  Returns:
    ``(sin, cos)``, each ``(num_prefix + h * w, H)`` float32.

  Raises:
    ValueError: on a bad grid or a head dim not divisible by 4.

  Examples:
    >>> sin, cos = attention.grid_rope_tables((1, 2), 8)  # tokens (0,0), (0,1)
    >>> print(sin.shape, np.asarray(sin[1]).round(3))  # sin(1), sin(1e-4)
    (2, 8) [0.    0.    0.    0.    0.841 0.841 0.    0.   ]

  References:
    Meng et al., arXiv:2506.21137 (2025), code ``ZacharyMeng/NaLaFormer``.
  """
  who = "grid_rope_tables"
  _checks.check_positive_int(who, "head_dim", head_dim)
  _checks.check_divisible(who, "head_dim", head_dim, "4", 4)
  _grid.grid_tokens(grid_shape, num_prefix, who=who)
  gh, gw = grid_shape
  angle = jnp.repeat(
    1.0 / base ** jnp.linspace(0.0, 1.0, head_dim // 4, dtype=jnp.float32), 2
  )
  angle = angle[None, None, :]
  rows = jnp.arange(gh, dtype=jnp.float32)[:, None, None] * angle
  cols = jnp.arange(gw, dtype=jnp.float32)[None, :, None] * angle
  theta = jnp.concatenate(
    [
      jnp.broadcast_to(rows, (gh, gw, head_dim // 2)),
      jnp.broadcast_to(cols, (gh, gw, head_dim // 2)),
    ],
    axis=-1,
  ).reshape(gh * gw, head_dim)
  pad = jnp.zeros((num_prefix, head_dim), jnp.float32)
  theta = jnp.concatenate([pad, theta], axis=0)
  return jnp.sin(theta), jnp.cos(theta)


@_scope.scoped
def nala_grid_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B T N H"],
  value: Float[Array, "B T N H"],
  gate: Float[Array, "B T N H"],
  *,
  lepe_kernel: Float[Array, "k k C"],
  lepe_bias: Float[Array, " C"],
  norm_scale: Float[Array, " C"],
  norm_bias: Float[Array, " C"],
  grid_shape: tuple[int, int],
  num_prefix: int = 0,
  power_scale: float = 3.0,
  eps: float = 1e-6,
  norm_eps: float = 1e-5,
  rope_base: float = 10000.0,
) -> Float[Array, "B T N H"]:
  r"""NaLaFormer's attention layer on a token map (official ``NALA.py``).

  .. math::
     o = \mathrm{NaLa}(q, k, v;\ \mathrm{RoPE}_{2D}), \quad
     y = \mathrm{LN}_C\big(o + \mathrm{DWConv}_{k \times k}(v)\big)
       \odot \mathrm{SiLU}(g)

  ``NaLa`` is `jaxnorm.attention.nala_attention` with the 2-D RoPE of
  `grid_rope_tables` on the query and key *features* in the numerator only
  (the same table for both halves of the sign split). The LePE branch is a
  depthwise ``k x k`` conv with bias (official 5x5) of ``v`` over the
  ``C = N * H`` channels of the map (`attention.lina_depthwise_conv`); the
  LayerNorm (eps 1e-5, torch's default) runs over ``C``. The output
  projection is the caller's. Computed in ``promote_types(dtype,
  float32)`` (the official code runs this block in float32).

  Deviation: the official backbone has no prefix tokens; here the
  ``num_prefix`` tokens (a [CLS]) take part in the attention without a
  rotation and get no LePE term.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, T, N, H)``.
    value: ``(B, T, N, H)``.
    gate: ``(B, T, N, H)``, the gate projection ``g``.
    lepe_kernel: ``(k, k, C)`` depthwise kernel, odd ``k``.
    lepe_bias: ``(C,)``.
    norm_scale: LayerNorm scale ``(C,)``.
    norm_bias: LayerNorm bias ``(C,)``.
    grid_shape: ``(h, w)`` with ``T = num_prefix + h * w``.
    num_prefix: tokens before the map.
    power_scale: :math:`\lambda` of `attention.nala_query_feature`.
    eps: NaLa's denominator and norm-clamp epsilon.
    norm_eps: the LayerNorm epsilon.
    rope_base: RoPE frequency base.

  Returns:
    ``(B, T, N, H)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes, a bad grid or ``H % 4 != 0``.
    TypeError: on non-floating inputs.

  Examples:
    >>> q = k = v = g = jnp.ones((1, 4, 1, 4))  # a 2 x 2 map, C = N H = 4
    >>> y = attention.nala_grid_attention(
    ...     q, k, v, g, lepe_kernel=jnp.zeros((3, 3, 4)),
    ...     lepe_bias=jnp.zeros(4), norm_scale=jnp.zeros(4),
    ...     norm_bias=jnp.ones(4), grid_shape=(2, 2))
    >>> print(y.shape, np.asarray(y[0, 0, 0]).round(4))  # 1 * silu(1)
    (1, 4, 1, 4) [0.7311 0.7311 0.7311 0.7311]

  References:
    Meng et al., *NaLaFormer: Norm-Aware Linear Attention for Transformer
    Models*, arXiv:2506.21137 (2025); ICML 2026 code ``ZacharyMeng/
    NaLaFormer NaLaformer/NALA.py`` (``NormAwareLinearAttn``).
  """
  who = "nala_grid_attention"
  arrays = (("query", query), ("key", key), ("value", value), ("gate", gate))
  for name, a in arrays:
    _checks.check_floating(who, name, a)
    _checks.check_ndim(who, name, a, expected=4)
  for name, a in arrays[1:]:
    _checks.check_shape(who, name, a, query.shape, "like query: (B, T, N, H)")
  query = jnp.asarray(query)
  b, t, n, h = query.shape
  _grid.check_grid(who, grid_shape, num_prefix, t)
  c = n * h
  _grid.check_square_kernel(who, "lepe_kernel", lepe_kernel, (c,), odd=True)
  for name, a in (
    ("lepe_bias", lepe_bias),
    ("norm_scale", norm_scale),
    ("norm_bias", norm_bias),
  ):
    _checks.check_shape(who, name, a, (c,), "C = N * H")
  dtype = _numerics.compute_dtype(query, key, value, gate)
  q, k, v, g = (a.astype(dtype) for _, a in arrays)
  sin, cos = grid_rope_tables(
    grid_shape, h, num_prefix=num_prefix, base=rope_base
  )
  both = (jnp.tile(a, 2).astype(dtype) for a in (sin, cos))
  o = nala_attention(
    q, k, v, power_scale=power_scale, eps=eps, rope_sin_cos=tuple(both)
  )
  lepe = lina.lina_depthwise_conv(
    v.reshape(b, t, c),
    lepe_kernel,
    lepe_bias,
    grid_shape=grid_shape,
    num_prefix=num_prefix,
  )
  y = norms.layer_norm(
    o.reshape(b, t, c) + lepe, norm_scale, norm_bias, eps=norm_eps
  )
  y = y * jax.nn.silu(g.reshape(b, t, c))
  return y.reshape(b, t, n, h).astype(query.dtype)
