r"""DepthBench layer metrics: how much computation each layer contributes.

Pure functions over the hidden states ``hs`` of a residual stack, shaped
``(L + 1, *tokens, d)``: ``hs[0]`` is the embedding output and ``hs[l + 1]``
the output of block ``l``. Metrics that need a model run (a skipped layer,
two swapped layers, a layer replaced by its linear fit) take the hidden
states or losses of those runs, so any model that can return its hidden
states can be analysed:

* `angular_distance_matrix`: mean angle between the states of two depths;
* `causal_effect`: how skipping block ``s`` changes the updates of later
  blocks;
* `permutation_score`: loss change when two blocks swap weights, with the
  three global summaries;
* `fit_linear_layer` and `linear_usefulness`: how much loss a block's best
  affine replacement costs.

``mask`` arguments (boolean ``tokens``, True on real tokens) exclude
padding. Statistics are computed in float32 (float64 stays).

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import depth_metrics
  >>> hs = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # 2 depths, 1 token
  >>> print(np.asarray(depth_metrics.angular_distance_matrix(hs)))
  [[0.  0.5]
   [0.5 0. ]]

References:
  DepthBench, official code ``keyu-wang-2002/DepthBench``
  (``analysis/layer_score_utils.py``, ``compute_angular_distance.py``,
  ``compute_usefulness_score.py``), read; paper not found (no arXiv id).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "PermutationScores",
  "Usefulness",
  "angular_distance_matrix",
  "causal_effect",
  "fit_linear_layer",
  "linear_usefulness",
  "permutation_score",
]

# torch.nn.functional.cosine_similarity's floor on each norm.
_COSINE_EPS = 1e-8
# The official causal score is 0 below this mean update norm.
_CAUSAL_FLOOR = 1e-8


def _hidden_states(
  who: str, name: str, hs: ArrayLike, mask: ArrayLike | None
) -> tuple[jax.Array, jax.Array]:
  """``hs`` as ``(L + 1, T, d)`` in the compute dtype and a ``(T,)`` weight.

  The token axes between the depth axis and the feature axis are
  flattened; the weight is the mask as 0/1 (all ones without a mask).
  """
  _checks.check_floating(who, name, hs)
  hs = jnp.asarray(hs)
  _checks.check_ndim(who, name, hs, minimum=3)
  tokens = hs.shape[1:-1]
  if mask is None:
    weight = jnp.ones(math.prod(tokens), _numerics.compute_dtype(hs))
  else:
    if jnp.result_type(mask) != jnp.bool_:
      raise TypeError(
        f"{who}: mask must be boolean (True on real tokens), got "
        f"mask.dtype={jnp.result_type(mask)}"
      )
    _checks.check_shape(who, "mask", mask, tokens, f"{name}.shape[1:-1]")
    weight = jnp.asarray(mask).reshape(-1).astype(_numerics.compute_dtype(hs))
  flat = hs.reshape(hs.shape[0], -1, hs.shape[-1])
  return flat.astype(_numerics.compute_dtype(hs)), weight


def _token_mean(values: jax.Array, weight: jax.Array) -> jax.Array:
  """Mean over the last (token) axis, weighted by the 0/1 ``(T,)`` weight."""
  w = weight.reshape((1,) * (values.ndim - 1) + weight.shape)
  return jnp.sum(values * w, axis=-1) / jnp.maximum(jnp.sum(weight), 1.0)


@_scope.scoped
def angular_distance_matrix(
  hs: Float[ArrayLike, "depth *tokens d"],
  *,
  mask: Bool[ArrayLike, "*tokens"] | None = None,
) -> Float[Array, "depth depth"]:
  r"""Mean angular distance between the hidden states of every two depths.

  .. math:: D_{ij} = \frac{1}{\pi}\,\mathrm{mean}_t
     \arccos \frac{h_{i,t} \cdot h_{j,t}}
     {\max(\lVert h_{i,t}\rVert, \epsilon)\max(\lVert h_{j,t}\rVert,
     \epsilon)}

  with the cosine clamped to ``[-1, 1]`` and :math:`\epsilon = 10^{-8}`
  (torch's ``cosine_similarity``). ``D`` is 0 for equal states and 1 for
  opposite ones.

  Deviation: the official code fills only ``i < j`` (NaN elsewhere); this
  returns the symmetric matrix with a zero diagonal.

  Args:
    hs: hidden states ``(L + 1, *tokens, d)``.
    mask: boolean ``tokens``; padding (False) is excluded.

  Returns:
    ``(L + 1, L + 1)`` in the compute dtype.

  Raises:
    TypeError: for non-floating ``hs`` or a non-boolean mask.
    ValueError: for rank < 3 or a mask of another shape.

  Examples:
    >>> hs = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]], [[-1.0, 0.0]]])  # depth 3
    >>> print(np.asarray(depth_metrics.angular_distance_matrix(hs)).round(4))
    [[0.  0.5 1. ]
     [0.5 0.  0.5]
     [1.  0.5 0. ]]

  References:
    DepthBench official code, ``compute_angular_distance_matrix``.
  """
  who = "angular_distance_matrix"
  h, weight = _hidden_states(who, "hs", hs, mask)
  norms = jnp.maximum(jnp.linalg.norm(h, axis=-1), _COSINE_EPS)
  unit = h / norms[..., None]
  cosine = jnp.clip(jnp.einsum("itd,jtd->ijt", unit, unit), -1.0, 1.0)
  distance = _token_mean(jnp.arccos(cosine), weight) / jnp.pi
  eye = jnp.eye(h.shape[0], dtype=bool)
  return jnp.where(eye, 0.0, distance).astype(distance.dtype)


@_scope.scoped
def causal_effect(
  base_hs: Float[ArrayLike, "depth *tokens d"],
  skipped_hs: Float[ArrayLike, "depth *tokens d"],
  skipped: int,
  *,
  mask: Bool[ArrayLike, "*tokens"] | None = None,
) -> Float[Array, " layers"]:
  r"""Effect of skipping block ``s`` on the updates of the later blocks.

  With :math:`\Delta_j = h_{j+1} - h_j` in the normal run and
  :math:`\Delta'_j` in the run where block ``s`` is the identity
  (:math:`h'_{s+1} = h'_s`):

  .. math:: C_{sj} = \frac{\mathrm{mean}_t \lVert \Delta'_{j,t} -
     \Delta_{j,t}\rVert}{\mathrm{mean}_t \lVert \Delta_{j,t}\rVert},
     \qquad s < j \le L - 1,

  and 0 where the denominator is below ``1e-8``. Entries ``j <= s`` are 0,
  so the result is row ``s`` of the official ``(L, L)`` causal matrix.
  Blocks whose update does not depend on their input (``h + c``) give 0;
  an identity stack gives 0 (every update is 0).

  Args:
    base_hs: hidden states ``(L + 1, *tokens, d)`` of the normal run.
    skipped_hs: the same with block ``skipped`` replaced by the identity.
    skipped: the index ``s`` of the skipped block, ``0 <= s < L``.
    mask: boolean ``tokens``; padding (False) is excluded.

  Returns:
    ``(L,)`` in the compute dtype.

  Raises:
    TypeError: for non-floating states or a non-boolean mask.
    ValueError: for mismatched shapes, rank < 3 or ``skipped`` out of
      range.

  Examples:
    >>> base = jnp.array([[[0.0]], [[1.0]], [[3.0]]])  # updates 1, 2
    >>> skip = jnp.array([[[0.0]], [[0.0]], [[3.0]]])  # block 0 skipped
    >>> c = depth_metrics.causal_effect(base, skip, 0)
    >>> print(np.asarray(c))  # block 1's update 2 -> 3: |3 - 2| / 2
    [0.  0.5]

  References:
    DepthBench official code, ``compute_causal_effect_on_future``.
  """
  who = "causal_effect"
  base, weight = _hidden_states(who, "base_hs", base_hs, mask)
  other, _ = _hidden_states(who, "skipped_hs", skipped_hs, mask)
  if other.shape != base.shape:
    raise ValueError(
      f"{who}: skipped_hs must have the shape of base_hs "
      f"{jnp.shape(base_hs)}, got skipped_hs.shape={jnp.shape(skipped_hs)}"
    )
  layers = base.shape[0] - 1
  if not isinstance(skipped, int) or not 0 <= skipped < layers:
    raise ValueError(
      f"{who}: skipped must be a block index in [0, {layers}), got {skipped=}"
    )
  delta = jnp.diff(base, axis=0)
  delta_skip = jnp.diff(other, axis=0)
  change = _token_mean(jnp.linalg.norm(delta_skip - delta, axis=-1), weight)
  size = _token_mean(jnp.linalg.norm(delta, axis=-1), weight)
  effect = jnp.where(size > _CAUSAL_FLOOR, change / size, 0.0)
  later = jnp.arange(layers) > skipped
  return jnp.where(later, effect, 0.0).astype(effect.dtype)


class PermutationScores(NamedTuple):
  """`permutation_score` results.

  Attributes:
    scores: ``(L, L)``; ``|loss_swap(i, j) - loss| / loss`` on the
      evaluated pairs ``i < j``, 0 elsewhere.
    mean: mean score over the evaluated pairs.
    normalized: their sum divided by ``L (L - 1) / 2``.
    weighted: mean over blocks ``l`` of the average of
      ``0.9**l * score`` over the pairs containing ``l`` (0 for a block in
      no pair).
    per_layer: those per-block averages, ``(L,)``.
  """

  scores: jax.Array
  mean: jax.Array
  normalized: jax.Array
  weighted: jax.Array
  per_layer: jax.Array


@_scope.scoped
def permutation_score(
  loss: Float[ArrayLike, ""],
  swapped_loss: Float[ArrayLike, "layers layers"],
  *,
  pairs: Bool[ArrayLike, "layers layers"] | None = None,
  decay: float = 0.9,
) -> PermutationScores:
  r"""Loss sensitivity to swapping the weights of two blocks.

  .. math:: P_{ij} = \frac{|\mathcal{L}_{i \leftrightarrow j} -
     \mathcal{L}|}{\mathcal{L}}, \qquad i < j

  (0 if :math:`\mathcal{L} \le 10^{-8}`), and the official summaries:
  the mean over evaluated pairs, the sum over :math:`L(L-1)/2`, and the
  mean over blocks of the per-block average of :math:`0.9^{l} P` (the
  earlier block of a pair weighs more in its own average).

  Args:
    loss: the unmodified model's loss.
    swapped_loss: ``(L, L)``; ``[i, j]`` for ``i < j`` is the loss with
      blocks ``i`` and ``j`` swapped (other entries are ignored).
    pairs: boolean ``(L, L)``, the evaluated pairs (read above the
      diagonal); ``None`` means every pair ``i < j``.
    decay: the per-block weight base (official 0.9).

  Returns:
    `PermutationScores`.

  Raises:
    TypeError: for non-floating losses or a non-boolean ``pairs``.
    ValueError: for a non-square ``swapped_loss``, a non-scalar ``loss``
      or ``pairs`` of another shape.

  Examples:
    >>> swapped = jnp.array([[0.0, 3.0], [0.0, 0.0]])  # swapping 0, 1: loss 3
    >>> s = depth_metrics.permutation_score(jnp.array(2.0), swapped)
    >>> print(np.asarray(s.scores), float(s.mean))  # |3 - 2| / 2
    [[0.  0.5]
     [0.  0. ]] 0.5

  References:
    DepthBench official code, ``compute_permutation_score_for_pair`` and
    ``compute_global_permutation_score``.
  """
  who = "permutation_score"
  for name, value in (("loss", loss), ("swapped_loss", swapped_loss)):
    _checks.check_floating(who, name, value)
  _checks.check_scalar(who, "loss", loss)
  swapped = jnp.asarray(swapped_loss)
  _checks.check_ndim(who, "swapped_loss", swapped, expected=2)
  n = swapped.shape[0]
  _checks.check_shape(who, "swapped_loss", swapped, (n, n), "(L, L)")
  dtype = _numerics.compute_dtype(swapped)
  upper = jnp.triu(jnp.ones((n, n), bool), 1)
  if pairs is not None:
    if jnp.result_type(pairs) != jnp.bool_:
      raise TypeError(
        f"{who}: pairs must be boolean, got "
        f"pairs.dtype={jnp.result_type(pairs)}"
      )
    _checks.check_shape(who, "pairs", pairs, (n, n), "swapped_loss.shape")
    upper = upper & jnp.asarray(pairs)
  base = jnp.asarray(loss).reshape(()).astype(dtype)
  raw = jnp.abs(swapped.astype(dtype) - base) / jnp.maximum(base, 1e-30)
  scores = jnp.where(upper & (base > 1e-8), raw, 0.0)
  count = jnp.sum(upper).astype(dtype)
  total = jnp.sum(scores)
  weights = jnp.asarray(decay, dtype) ** jnp.arange(n, dtype=dtype)
  member = (upper | upper.T).astype(dtype)
  symmetric = scores + scores.T
  per_layer = weights * jnp.sum(symmetric, axis=1)
  per_layer = per_layer / jnp.maximum(jnp.sum(member, axis=1), 1.0)
  return PermutationScores(
    scores=scores,
    mean=total / jnp.maximum(count, 1.0),
    normalized=total / max(n * (n - 1) / 2, 1.0),
    weighted=jnp.mean(per_layer),
    per_layer=per_layer,
  )


@_scope.scoped
def fit_linear_layer(
  inputs: Float[ArrayLike, "*tokens d"],
  outputs: Float[ArrayLike, "*tokens e"],
  *,
  mask: Bool[ArrayLike, "*tokens"] | None = None,
) -> tuple[Float[Array, "d e"], Float[Array, " e"]]:
  r"""Least-squares affine map from a block's input to its output.

  .. math:: (W, b) = \arg\min \textstyle\sum_t \lVert x_t W + b - y_t
     \rVert^2

  over the real tokens (``lstsq`` on ``[x, 1]``, as the official code).

  Args:
    inputs: block inputs ``(*tokens, d)``.
    outputs: block outputs ``(*tokens, e)``.
    mask: boolean ``tokens``; padding (False) is excluded.

  Returns:
    ``(W (d, e), b (e,))`` in the compute dtype.

  Raises:
    TypeError: for non-floating inputs or a non-boolean mask.
    ValueError: for mismatched token shapes or a mask of another shape.

  Examples:
    >>> x = jnp.array([[0.0], [1.0], [2.0]])
    >>> w, b = depth_metrics.fit_linear_layer(x, 3 * x + 1)
    >>> print(np.asarray(w).round(4), np.asarray(b).round(4))
    [[3.]] [1.]

  References:
    DepthBench official code, ``fit_linear_mapping``.
  """
  who = "fit_linear_layer"
  x, weight = _hidden_states(who, "inputs", jnp.asarray(inputs)[None], mask)
  _checks.check_floating(who, "outputs", outputs)
  y = jnp.asarray(outputs)
  if y.shape[:-1] != jnp.shape(inputs)[:-1]:
    raise ValueError(
      f"{who}: outputs must match inputs on the token axes "
      f"{jnp.shape(inputs)[:-1]}, got outputs.shape={y.shape}"
    )
  y = y.reshape(-1, y.shape[-1]).astype(x.dtype)
  design = jnp.concatenate([x[0], jnp.ones((x.shape[1], 1), x.dtype)], axis=1)
  keep = weight[:, None]
  solution, *_ = jnp.linalg.lstsq(design * keep, y * keep)
  return solution[:-1], solution[-1]


class Usefulness(NamedTuple):
  """`linear_usefulness` results.

  Attributes:
    ratio: ``(L,)`` loss with the block replaced by its affine fit over the
      original loss.
    significant: ``(L,)`` boolean, ``ratio > threshold``.
    score: the fraction of significant blocks (the global usefulness).
  """

  ratio: jax.Array
  significant: jax.Array
  score: jax.Array


@_scope.scoped
def linear_usefulness(
  loss: Float[ArrayLike, ""],
  linear_loss: Float[ArrayLike, " layers"],
  *,
  threshold: float = 1.1,
) -> Usefulness:
  r"""How many blocks do more than an affine map could.

  .. math:: r_l = \mathcal{L}_{l \to \mathrm{lin}} / \mathcal{L},\qquad
     \mathrm{score} = \frac{1}{L}\,\#\{l : r_l > 1.1\}

  where :math:`\mathcal{L}_{l \to \mathrm{lin}}` is the loss with block
  ``l`` replaced by `fit_linear_layer` of its own input/output pairs. An
  identity or exactly affine block has :math:`r = 1`.

  Args:
    loss: the unmodified model's loss (> 0).
    linear_loss: ``(L,)`` losses with each block replaced.
    threshold: the significance ratio (official 1.1).

  Returns:
    `Usefulness`.

  Raises:
    TypeError: for non-floating losses.
    ValueError: for a non-scalar ``loss`` or ``linear_loss`` of rank != 1.

  Examples:
    >>> loss, linear_loss = jnp.array(2.0), jnp.array([2.0, 3.0])
    >>> u = depth_metrics.linear_usefulness(loss, linear_loss)
    >>> print(np.asarray(u.ratio), np.asarray(u.significant), float(u.score))
    [1.  1.5] [False  True] 0.5

  References:
    DepthBench official code, ``compute_layer_usefulness_linear_
    approximation`` and ``compute_global_usefulness_score``.
  """
  who = "linear_usefulness"
  for name, value in (("loss", loss), ("linear_loss", linear_loss)):
    _checks.check_floating(who, name, value)
  _checks.check_scalar(who, "loss", loss)
  _checks.check_ndim(who, "linear_loss", linear_loss, expected=1)
  lin = jnp.asarray(linear_loss)
  dtype = _numerics.compute_dtype(lin)
  ratio = lin.astype(dtype) / jnp.asarray(loss).reshape(()).astype(dtype)
  significant = ratio > threshold
  score = jnp.mean(significant.astype(dtype))
  return Usefulness(ratio=ratio, significant=significant, score=score)
