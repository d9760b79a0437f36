"""NaLaFormer: norm-aware linear attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _numerics
from jaxnorm.attention import _core


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
