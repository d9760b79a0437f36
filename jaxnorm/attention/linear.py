"""Causal linear attention and its feature maps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxnorm import _checks, _dispatch, _numerics, _scope
from jaxnorm.attention import _core

FeatureMap = Literal["elu_plus_one", "relu", "identity"]
# The feature maps phi, shared with the Pallas kernel
# (`pallas_kernels.linear_attention` imports this table).
FEATURE_MAPS: dict[str, Callable[[jax.Array], jax.Array]] = {
  "elu_plus_one": lambda x: jax.nn.elu(x) + 1.0,
  "relu": lambda x: jax.nn.relu(x) + 1e-6,
  "identity": lambda x: x,
}


@_scope.scoped
def causal_linear_attention(
  query: Float[Array, "B T N H"],
  key: Float[Array, "B T K H"],
  value: Float[Array, "B T K Hv"],
  *,
  feature_map: FeatureMap = "elu_plus_one",
  normalize: bool = True,
  eps: float = 1e-6,
  chunk_size: int = 64,
  algorithm: Literal["chunked", "quadratic"] = "chunked",
  implementation: _dispatch.Implementation | None = None,
) -> Float[Array, "B T N Hv"]:
  r"""Causal linear attention, computed chunk by chunk with O(T) memory.

  .. math:: \mathrm{out}_i = \frac{\sum_{j \le i} (\phi(q_i)\cdot\phi(k_j))
     v_j}{\sum_{j \le i} \phi(q_i)\cdot\phi(k_j) + \epsilon}

  (no denominator when ``normalize=False``). ``"chunked"`` scans over chunks
  of ``chunk_size`` queries: inside a chunk it uses the masked quadratic form,
  across chunks the running state :math:`\sum_j \phi(k_j) v_j^T` and
  :math:`\sum_j \phi(k_j)`; memory is :math:`O(T\,H + C^2)` per head instead
  of :math:`O(T^2)`. ``"quadratic"`` materializes the ``(T, T)`` weights and
  is the reference. Statistics in float32. Causal by construction: the
  output at ``t`` depends on no token after ``t``.

  ``implementation`` picks the Pallas kernel of the chunked algorithm
  (`pallas_kernels.linear_attention.causal_linear_attention_pallas`,
  ``"pallas"``), the jnp reference (``"xla"``) or, for None, the kernel on
  GPU/TPU when it covers the case and the reference otherwise. The kernel
  runs only ``algorithm="chunked"``.

  Args:
    query: ``(B, T, N, H)``.
    key: ``(B, T, K, H)`` (self-attention: same length as ``query``).
    value: ``(B, T, K, Hv)``.
    feature_map: :math:`\phi`: ``"elu_plus_one"`` (Katharopoulos et al.),
      ``"relu"`` (+1e-6) or ``"identity"``.
    normalize: divide by the running normalizer.
    eps: denominator epsilon.
    chunk_size: queries per chunk (the sequence is zero-padded to a
      multiple; padded keys are excluded).
    algorithm: ``"chunked"`` or ``"quadratic"`` (formerly the values of
      ``implementation``).
    implementation: ``"xla"``, ``"pallas"`` or None (best available).

  Returns:
    ``(B, T, N, Hv)`` in ``query.dtype``.

  Raises:
    ValueError: on mismatched shapes or options (an ``implementation`` of
      ``"chunked"``/``"quadratic"`` names ``algorithm=`` instead).
    TypeError: on non-floating inputs.
    NotImplementedError: for ``implementation="pallas"`` on a case the
      kernel does not cover (including ``algorithm="quadratic"``).

  Examples:
    >>> q = k = jnp.zeros((1, 3, 1, 1))  # elu(0) + 1 = 1: equal weights
    >>> v = jnp.array([1.0, 3.0, 8.0]).reshape(1, 3, 1, 1)
    >>> out = attention.causal_linear_attention(q, k, v)
    >>> print(np.asarray(out[0, :, 0, 0]).round(4))  # running mean of v
    [1. 2. 4.]

  References:
    Katharopoulos et al., *Transformers are RNNs: Fast Autoregressive
    Transformers with Linear Attention*, arXiv:2006.16236 (2020);
    Hua et al., *Transformer Quality in Linear Time* (chunked form),
    arXiv:2202.10447 (2022).
  """
  who = "causal_linear_attention"
  if implementation in ("chunked", "quadratic"):
    raise ValueError(
      f"{who}: implementation picks the kernel ('xla', 'pallas' or None); "
      f"the chunked/quadratic switch is algorithm={implementation!r}, got "
      f"{implementation=}"
    )
  _checks.check_choice(who, "feature_map", feature_map, tuple(FEATURE_MAPS))
  _checks.check_choice(who, "algorithm", algorithm, ("chunked", "quadratic"))
  _checks.check_positive_int(who, "chunk_size", chunk_size)
  d, q, k, v, _, _ = _core.prepare(who, query, key, value, None, None)
  if d.q_len != d.kv_len:
    raise ValueError(
      f"{who}: key must have the query's length ({d.q_len}) for causal "
      f"self-attention, got {key.shape=}"
    )

  def call_kernel(kernel):
    if algorithm != "chunked":
      raise NotImplementedError(
        f"the kernel runs algorithm='chunked' only, got {algorithm=}"
      )
    if d.unbatched:
      raise NotImplementedError("the kernel needs batched (B, T, N, H) input")
    return kernel(
      query,
      key,
      value,
      feature_map=feature_map,
      normalize=normalize,
      eps=eps,
      chunk_size=chunk_size,
    )

  return _dispatch.dispatch(
    who,
    implementation,
    "causal_linear_attention_pallas",
    call_kernel,
    lambda: _reference(
      d,
      q,
      k,
      v,
      feature_map,
      normalize,
      eps,
      chunk_size,
      algorithm,
      query.dtype,
    ),
    arrays=(query,),
  )


def _reference(
  d: _core.Dims,
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  feature_map: str,
  normalize: bool,
  eps: float,
  chunk_size: int,
  algorithm: str,
  out_dtype,
) -> jax.Array:
  """The jnp chunked / quadratic forms of `causal_linear_attention`."""
  dtype = _numerics.compute_dtype(q, k, v)
  phi = FEATURE_MAPS[feature_map]
  fq = phi(q.astype(dtype))
  fk = _core.repeat_kv(d, phi(k.astype(dtype)))
  vv = _core.repeat_kv(d, v.astype(dtype))
  t = d.q_len
  if algorithm == "quadratic":
    w = jnp.einsum("btnf,bsnf->bnts", fq, fk)
    w = jnp.where(jnp.tril(jnp.ones((t, t), jnp.bool_)), w, 0.0)
    out = jnp.einsum("bnts,bsne->btne", w, vv)
    if normalize:
      out = out / (jnp.transpose(jnp.sum(w, -1), (0, 2, 1))[..., None] + eps)
    return _core.finish(d, out, out_dtype)
  c = min(chunk_size, t)
  nc = -(-t // c)
  pad = nc * c - t

  def chunks(x):
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return jnp.moveaxis(x.reshape(d.batch, nc, c, *x.shape[2:]), 1, 0)

  valid = (jnp.arange(nc * c) < t).astype(dtype).reshape(nc, c, 1, 1)
  fqc, fkc, vc = chunks(fq), chunks(fk), chunks(vv)
  fkc = fkc * valid[:, None]
  tri = jnp.tril(jnp.ones((c, c), jnp.bool_))

  def step(carry, xs):
    state, norm = carry  # B N F E, B N F
    fq_i, fk_i, v_i = xs
    w = jnp.where(tri, jnp.einsum("btnf,bsnf->bnts", fq_i, fk_i), 0.0)
    num = jnp.einsum("bnts,bsne->btne", w, v_i)
    num = num + jnp.einsum("btnf,bnfe->btne", fq_i, state)
    den = jnp.transpose(jnp.sum(w, -1), (0, 2, 1))
    den = den + jnp.einsum("btnf,bnf->btn", fq_i, norm)
    state = state + jnp.einsum("bsnf,bsne->bnfe", fk_i, v_i)
    norm = norm + jnp.sum(jnp.swapaxes(fk_i, 1, 2), axis=2)
    out = num / (den[..., None] + eps) if normalize else num
    return (state, norm), out

  f = fq.shape[-1]
  init = (
    jnp.zeros((d.batch, d.heads, f, d.value_dim), dtype),
    jnp.zeros((d.batch, d.heads, f), dtype),
  )
  _, outs = jax.lax.scan(step, init, (fqc, fkc, vc))
  out = jnp.moveaxis(outs, 0, 1).reshape(d.batch, nc * c, d.heads, d.value_dim)[
    :, :t
  ]
  return _core.finish(d, out, out_dtype)
