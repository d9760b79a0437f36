"""Graph Transformer primitives: Laplacian encodings, graph attention, loss.

Pure functions over dense, padded batches of graphs: ``B`` graphs of up to
``N`` nodes, an adjacency ``(B, N, N)`` and a boolean ``node_mask`` ``(B, N)``
that is True on real nodes. Padded nodes have no edges. Spectra and
statistics are computed in ``promote_types(dtype, float32)``.

The paper's model (Dwivedi & Bresson) restricts attention to the neighbours
of a node, adds Laplacian eigenvectors as positional encodings (with random
sign flips in training) and uses BatchNorm over real nodes
(`jaxnorm.norms.batch_norm` with ``mask=``); the node-classification
benchmarks of Benchmarking GNNs (PATTERN, CLUSTER) train with a
class-balanced cross-entropy and report the weighted (class-averaged)
accuracy.

Examples:
  Every example in this module assumes ``import jax``,
  ``import jax.numpy as jnp`` and ``import numpy as np``:

  >>> from jaxnorm import graph
  >>> labels = jnp.array([0, 0, 0, 1])  # 4 real nodes
  >>> print(np.asarray(graph.class_balanced_weights(labels, 2)))
  [0.25 0.75]

References:
  Dwivedi & Bresson, *A Generalization of Transformer Networks to Graphs*,
  arXiv:2012.09699 (2020); Dwivedi et al., *Benchmarking Graph Neural
  Networks*, arXiv:2003.00982 (2020).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from jaxnorm import _checks, _numerics, _scope

__all__ = [
  "class_balanced_cross_entropy",
  "class_balanced_weights",
  "confusion_matrix",
  "graph_attention",
  "laplacian_pe",
  "random_sign_flip",
  "weighted_accuracy_from_confusion",
  "weighted_class_accuracy",
]

# The Laplacian's diagonal L_pp at padded nodes: above the normalized
# Laplacian's largest eigenvalue (2), so their eigenvectors sort last.
_PAD_EIGENVALUE = 3.0


def _node_mask(
  who: str, node_mask: ArrayLike | None, shape: tuple[int, ...], hint: str
) -> jax.Array:
  """``node_mask`` as a boolean ``shape`` array (all True for ``None``)."""
  if node_mask is None:
    return jnp.ones(shape, bool)
  if jnp.result_type(node_mask) != jnp.bool_:
    raise TypeError(
      f"{who}: node_mask must be boolean (True on real nodes), got "
      f"node_mask.dtype={jnp.result_type(node_mask)}"
    )
  _checks.check_shape(who, "node_mask", node_mask, shape, hint)
  return jnp.asarray(node_mask)


def _check_square(who: str, adjacency: jax.Array) -> None:
  _checks.check_ndim(who, "adjacency", adjacency, minimum=2)
  if adjacency.shape[-1] != adjacency.shape[-2]:
    raise ValueError(
      f"{who}: adjacency must be square on its last two axes (..., N, N), "
      f"got adjacency.shape={adjacency.shape}"
    )


@_scope.scoped
def laplacian_pe(
  adjacency: ArrayLike,
  k: int,
  *,
  node_mask: ArrayLike | None = None,
) -> Float[Array, "*batch n k"]:
  r"""Laplacian eigenvector positional encodings of (padded) graphs.

  .. math::
    L = I - D^{-1/2} A D^{-1/2},\quad d_i = \max(\textstyle\sum_j A_{ji}, 1),
    \quad \mathrm{PE} = [v_1, \dots, v_k]

  where :math:`v_0, v_1, \dots` are the eigenvectors of :math:`L` in
  ascending order of eigenvalue: the trivial :math:`v_0 \propto
  \sqrt{d}` is dropped. ``A[..., j, i] = 1`` is an edge ``j -> i``
  (in-degrees, as the official DGL code). Padded nodes (``node_mask``
  False) lose their edges and get :math:`L_{pp} = 3`, above the normalized
  Laplacian's maximum 2, so their eigenvectors sort last; their PE rows are
  0, and the columns beyond ``n_valid - 1`` of a small graph are 0, so a
  padded batch gives the unpadded result. Eigenvectors have an arbitrary
  sign (and basis, for repeated eigenvalues): the paper flips signs at
  random in training (`random_sign_flip`).

  Deviation: the official code solves approximately
  (``scipy.sparse.linalg.eigs(L, k + 1, which="SR", tol=1e-2)``); this uses
  the exact dense ``jnp.linalg.eigh``, which reads the symmetric part of
  ``L``: give undirected (symmetric) adjacencies.

  Args:
    adjacency: ``(..., N, N)``, boolean or numeric 0/1.
    k: number of encodings (the paper's ``pos_enc_dim``).
    node_mask: boolean ``(..., N)``, True on real nodes; ``None`` means
      every node is real.

  Returns:
    float32 (float64 for float64 input) ``(..., N, k)``.

  Raises:
    ValueError: for a non-square ``adjacency``, a non-positive ``k`` or a
      ``node_mask`` of another shape.
    TypeError: for a non-boolean ``node_mask``.

  Examples:
    >>> a = jnp.array([[0, 1], [1, 0]], bool)  # one edge, 2 nodes
    >>> pe = graph.laplacian_pe(a, 1)
    >>> print(np.abs(np.asarray(pe)).round(4))  # up to sign
    [[0.7071]
     [0.7071]]

  References:
    Dwivedi & Bresson, arXiv:2012.09699 (2020); Dwivedi et al., *Benchmarking
    Graph Neural Networks*, arXiv:2003.00982 (2020).
  """
  who = "laplacian_pe"
  adjacency = jnp.asarray(adjacency)
  _check_square(who, adjacency)
  _checks.check_positive_int(who, "k", k)
  n = adjacency.shape[-1]
  valid = _node_mask(who, node_mask, adjacency.shape[:-1], "adjacency nodes")
  dtype = (
    _numerics.compute_dtype(adjacency)
    if jnp.issubdtype(adjacency.dtype, jnp.floating)
    else jnp.dtype(jnp.float32)
  )
  pair = valid[..., :, None] & valid[..., None, :]
  a = jnp.where(pair, adjacency.astype(dtype), 0.0)
  inv_sqrt = jax.lax.rsqrt(jnp.maximum(jnp.sum(a, axis=-2), 1.0))
  diagonal = jnp.where(valid, 1.0, _PAD_EIGENVALUE).astype(dtype)
  eye = jnp.broadcast_to(jnp.eye(n, dtype=dtype), a.shape)
  lap = eye * diagonal[..., None, :]
  lap = lap - inv_sqrt[..., :, None] * a * inv_sqrt[..., None, :]
  _, vectors = jnp.linalg.eigh(lap)
  pe = vectors[..., 1 : k + 1]
  if pe.shape[-1] < k:
    widths = [(0, 0)] * (pe.ndim - 1) + [(0, k - pe.shape[-1])]
    pe = jnp.pad(pe, widths)
  n_valid = jnp.sum(valid, axis=-1)[..., None, None]
  column = jnp.arange(1, k + 1).reshape((1,) * valid.ndim + (k,))
  keep = valid[..., :, None] & (column < n_valid)
  return jnp.where(keep, pe, 0.0)


@_scope.scoped
def random_sign_flip(
  pe: Float[ArrayLike, "*batch n k"],
  key: jax.Array,
  *,
  per_graph: bool = False,
) -> Float[Array, "*batch n k"]:
  r"""Multiplies each eigenvector column by an independent random sign.

  .. math:: \mathrm{PE}'_{:, c} = s_c\,\mathrm{PE}_{:, c},\quad
     s_c \sim \mathrm{Uniform}\{-1, +1\}

  The official code draws one sign per column for the whole batch, in
  training only; ``per_graph=True`` draws one per graph and column.

  Args:
    pe: encodings ``(..., N, k)``.
    key: a PRNG key.
    per_graph: draw signs per leading index (graph) as well.

  Returns:
    Array with the shape and dtype of ``pe``.

  Raises:
    TypeError: for non-floating ``pe``.
    ValueError: for ``pe`` of rank < 2.

  Examples:
    >>> pe = jnp.ones((3, 2))
    >>> flipped = graph.random_sign_flip(pe, jax.random.key(0))
    >>> print(np.all(np.abs(np.asarray(flipped)) == 1.0), flipped.shape)
    True (3, 2)

  References:
    Dwivedi & Bresson, arXiv:2012.09699 (2020).
  """
  who = "random_sign_flip"
  _checks.check_floating(who, "pe", pe)
  pe = jnp.asarray(pe)
  _checks.check_ndim(who, "pe", pe, minimum=2)
  lead = pe.shape[:-2] if per_graph else (1,) * (pe.ndim - 2)
  shape = (*lead, 1, pe.shape[-1])
  signs = jnp.where(jax.random.bernoulli(key, 0.5, shape), 1.0, -1.0)
  return (pe * signs.astype(pe.dtype)).astype(pe.dtype)


def _check_graph_attention(
  who: str,
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  adjacency: jax.Array,
  edge: jax.Array | None,
  logit_clip: float | None,
  denom_eps: float,
) -> None:
  for name, a in (("query", query), ("key", key), ("value", value)):
    _checks.check_floating(who, name, a)
    _checks.check_ndim(who, name, a, expected=4)
  if key.shape != query.shape:
    raise ValueError(
      f"{who}: key must have the shape of query (B, N, H, Dh)={query.shape}, "
      f"got key.shape={key.shape}"
    )
  if value.shape[:-1] != query.shape[:-1]:
    raise ValueError(
      f"{who}: value must match query on (B, N, H)={query.shape[:-1]}, got "
      f"value.shape={value.shape}"
    )
  b, n = query.shape[:2]
  if jnp.result_type(adjacency) != jnp.bool_:
    raise TypeError(
      f"{who}: adjacency must be boolean (adjacency[b, i, j]: node i "
      f"receives from node j), got adjacency.dtype={adjacency.dtype}"
    )
  _checks.check_shape(who, "adjacency", adjacency, (b, n, n), "(B, N, N)")
  if edge is not None:
    _checks.check_floating(who, "edge", edge)
    _checks.check_shape(
      who, "edge", edge, (b, n, *query.shape[1:]), "(B, N, N, H, Dh)"
    )
  if logit_clip is not None and not logit_clip > 0:
    raise ValueError(
      f"{who}: logit_clip must be None or > 0, got {logit_clip=}"
    )
  _checks.check_nonnegative(who, "denom_eps", denom_eps)


@_scope.scoped
def graph_attention(
  query: Float[ArrayLike, "b n h d"],
  key: Float[ArrayLike, "b n h d"],
  value: Float[ArrayLike, "b n h dv"],
  adjacency: Bool[ArrayLike, "b n n"],
  *,
  edge: Float[ArrayLike, "b n n h d"] | None = None,
  scale: float | None = None,
  logit_clip: float | None = None,
  denom_eps: float = 0.0,
) -> (
  Float[Array, "b n h dv"]
  | tuple[Float[Array, "b n h dv"], Float[Array, "b n n h d"]]
):
  r"""Multi-head attention restricted to the neighbours of each node.

  Node form, per head:

  .. math::
    s_{ij} = c\,(q_i \cdot k_j),\quad
    \mathrm{out}_i = \frac{\sum_{j \in N(i)} e^{s_{ij}} v_j}
      {\sum_{j \in N(i)} e^{s_{ij}} + \epsilon}

  with ``c = scale`` (default :math:`1/\sqrt{D_h}`), :math:`N(i) = \{j :
  \mathrm{adjacency}[b, i, j]\}` and :math:`\epsilon` = ``denom_eps``. With
  ``edge`` (the projected edge features :math:`\hat e_{ij}`) the score is
  a vector first,

  .. math::
    \hat s_{ij} = c\,(q_i \odot k_j) \odot \hat e_{ij} \in
    \mathbb{R}^{D_h},\quad s_{ij} = \textstyle\sum_c \hat s_{ij}[c],

  and :math:`\hat s_{ij}` is also returned as the edge output (before the
  clip and the softmax; 0 off the edges). ``logit_clip = t`` clamps
  :math:`s_{ij}` to ``[-t, t]`` before the exponential, as the official code
  does with ``t = 5`` (the paper states a plain softmax).

  A node attends to itself only if ``adjacency`` has the self-loop (the
  SBM graphs and the complete graph of the full-attention variant have
  none). A node without neighbours outputs 0, unlike JAX's masked-softmax
  convention (the mean of the values), and so does a padded node. The
  maximum logit of each row is subtracted for stability; ``denom_eps`` is
  rescaled with it, so the result equals the unshifted formula.

  Args:
    query: ``(B, N, H, Dh)``.
    key: ``(B, N, H, Dh)``.
    value: ``(B, N, H, Dv)``.
    adjacency: boolean ``(B, N, N)``; ``adjacency[b, i, j]`` means node
      ``i`` receives from node ``j``.
    edge: projected edge features ``(B, N, N, H, Dh)`` or ``None``.
    scale: logit scale, default ``1/sqrt(Dh)``.
    logit_clip: clamp of the logits, or ``None``.
    denom_eps: added to the softmax normalizer (official edge layer:
      ``1e-6``).

  Returns:
    ``out`` ``(B, N, H, Dv)`` in ``query.dtype``; with ``edge``, the pair
    ``(out, e_out)`` with ``e_out`` ``(B, N, N, H, Dh)``.

  Raises:
    ValueError: for mismatched shapes, ``logit_clip <= 0`` or a negative
      ``denom_eps``.
    TypeError: for non-floating inputs or a non-boolean ``adjacency``.

  Examples:
    >>> q = k = jnp.zeros((1, 3, 1, 1))  # 3 nodes, equal logits
    >>> v = jnp.array([1.0, 2.0, 6.0]).reshape(1, 3, 1, 1)
    >>> adj = jnp.array([[[1, 1, 0], [0, 1, 0], [1, 1, 1]]], bool)  # i <- j
    >>> out = graph.graph_attention(q, k, v, adj)
    >>> print(np.asarray(out[0, :, 0, 0]))  # mean over each node's neighbours
    [1.5 2.  3. ]

  References:
    Dwivedi & Bresson, *A Generalization of Transformer Networks to Graphs*,
    arXiv:2012.09699 (2020).
  """
  who = "graph_attention"
  query, key, value = (jnp.asarray(a) for a in (query, key, value))
  adjacency = jnp.asarray(adjacency)
  edge = None if edge is None else jnp.asarray(edge)
  _check_graph_attention(
    who, query, key, value, adjacency, edge, logit_clip, denom_eps
  )
  dtype = _numerics.compute_dtype(query, key, value)
  c = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
  q, k = query.astype(dtype), key.astype(dtype)
  allowed = adjacency[:, None]  # (B, 1, N, N) over (B, H, N, N) logits.
  e_out = None
  if edge is None:
    logits = jnp.einsum("bihd,bjhd->bhij", q, k) * jnp.asarray(c, dtype)
  else:
    scores = q[:, :, None] * k[:, None, :] * jnp.asarray(c, dtype)
    scores = scores * edge.astype(dtype)  # (B, N, N, H, Dh)
    e_out = jnp.where(adjacency[..., None, None], scores, 0.0)
    logits = jnp.moveaxis(jnp.sum(scores, axis=-1), -1, 1)
  if logit_clip is not None:
    logits = jnp.clip(logits, -logit_clip, logit_clip)
  has_any = jnp.any(allowed, axis=-1, keepdims=True)
  row_max = jnp.max(jnp.where(allowed, logits, -jnp.inf), -1, keepdims=True)
  shift = jax.lax.stop_gradient(jnp.where(has_any, row_max, 0.0))
  weights = jnp.where(allowed, jnp.exp(logits - shift), 0.0)
  denom = jnp.sum(weights, axis=-1, keepdims=True)
  if denom_eps:
    denom = denom + denom_eps * jnp.exp(-shift)
  weights = weights / jnp.where(denom > 0, denom, 1.0)
  out = jnp.einsum("bhij,bjhd->bihd", weights, value.astype(dtype))
  out = out.astype(query.dtype)
  if e_out is None:
    return out
  return out, e_out.astype(query.dtype)


def _check_labels(
  who: str, labels: jax.Array, node_mask: ArrayLike | None
) -> jax.Array:
  """Checks integer labels and their mask; returns the mask (all True)."""
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise TypeError(
      f"{who}: labels must be integer class ids, got {labels.dtype=}"
    )
  return _node_mask(who, node_mask, labels.shape, "labels")


def _check_node_labels(
  who: str,
  logits: jax.Array,
  labels: jax.Array,
  node_mask: ArrayLike | None,
) -> jax.Array:
  """Checks ``(..., C)`` logits against ``(...)`` labels; returns the mask."""
  _checks.check_floating(who, "logits", logits)
  _checks.check_ndim(who, "logits", logits, minimum=2)
  _checks.check_shape(
    who, "labels", labels, logits.shape[:-1], "logits.shape[:-1]"
  )
  return _check_labels(who, labels, node_mask)


def _balanced_weights(
  labels: jax.Array, valid: jax.Array, num_classes: int
) -> jax.Array:
  """``(V - n_c) / V`` for present classes, 0 for absent ones, ``(C,)``."""
  onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  onehot = jnp.where(valid[..., None], onehot, 0.0)
  counts = jnp.sum(onehot, axis=tuple(range(labels.ndim)))
  total = jnp.sum(counts)
  weights = (total - counts) / jnp.maximum(total, 1.0)
  return jnp.where(counts > 0, weights, 0.0)


@_scope.scoped
def class_balanced_weights(
  labels: Int[ArrayLike, "..."],
  num_classes: int,
  *,
  node_mask: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, " c"]:
  r"""Class weights of the SBM benchmarks: rare classes weigh more.

  .. math:: w_c = \frac{V - n_c}{V}\,[n_c > 0]

  with ``V`` the number of real nodes and ``n_c`` those of class ``c``
  (a class absent from the batch gets 0).

  Args:
    labels: integer class ids of any shape.
    num_classes: number of classes ``C``.
    node_mask: boolean, shape of ``labels``, True on real nodes.

  Returns:
    float32 ``(C,)``.

  Raises:
    ValueError: for a non-positive ``num_classes`` or a mask shape other
      than ``labels``'.
    TypeError: for non-integer labels or a non-boolean mask.

  Examples:
    >>> labels = jnp.array([0, 0, 0, 1])
    >>> w = graph.class_balanced_weights(labels, 3)
    >>> print(np.asarray(w))  # (V - n_c) / V, 0 for an absent class
    [0.25 0.75 0.  ]

  References:
    Dwivedi et al., *Benchmarking Graph Neural Networks*, arXiv:2003.00982
    (2020), official code ``train_SBMs_node_classification.py``.
  """
  who = "class_balanced_weights"
  labels = jnp.asarray(labels)
  _checks.check_positive_int(who, "num_classes", num_classes)
  valid = _check_labels(who, labels, node_mask)
  return _balanced_weights(labels, valid, num_classes)


@_scope.scoped
def class_balanced_cross_entropy(
  logits: Float[ArrayLike, "... c"],
  labels: Int[ArrayLike, "..."],
  *,
  node_mask: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, ""]:
  r"""Cross-entropy weighted by `class_balanced_weights`, as a weighted mean.

  .. math:: \mathcal{L} = \frac{\sum_i w_{y_i}\,\ell_i}{\sum_i w_{y_i}},
     \quad \ell_i = -\log \mathrm{softmax}(z_i)_{y_i}

  over the real nodes ``i``; the weights are those of this batch, so this
  is torch's ``CrossEntropyLoss(weight=w)`` of the official code. A batch
  with a single class (all weights 0) gives 0.

  Args:
    logits: ``(..., C)``.
    labels: integer ``(...)``.
    node_mask: boolean ``(...)``, True on real nodes.

  Returns:
    A float32 scalar.

  Raises:
    ValueError: for mismatched shapes.
    TypeError: for non-floating logits, non-integer labels or a
      non-boolean mask.

  Examples:
    >>> logits = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    >>> loss = graph.class_balanced_cross_entropy(logits, jnp.array([0, 0, 1]))
    >>> print(np.asarray(loss).round(4))  # every node loses log 2
    0.6931

  References:
    Dwivedi et al., arXiv:2003.00982 (2020), official code.
  """
  who = "class_balanced_cross_entropy"
  logits, labels = jnp.asarray(logits), jnp.asarray(labels)
  valid = _check_node_labels(who, logits, labels, node_mask)
  weights = _balanced_weights(labels, valid, logits.shape[-1])
  per_node = optax.softmax_cross_entropy_with_integer_labels(
    logits.astype(_numerics.compute_dtype(logits)), labels
  ).astype(jnp.float32)
  w = jnp.where(valid, weights[labels], 0.0)
  return jnp.sum(w * per_node) / jnp.maximum(jnp.sum(w), 1e-12)


@_scope.scoped
def confusion_matrix(
  logits: Float[ArrayLike, "... c"],
  labels: Int[ArrayLike, "..."],
  *,
  node_mask: Bool[ArrayLike, "..."] | None = None,
) -> Float[Array, "c c"]:
  """Counts of (true class, predicted class) over the real nodes.

  The prediction is ``argmax(logits)``; rows are true classes. Counts add
  over batches, so a split's matrix is the sum of its batches'.

  Args:
    logits: ``(..., C)``.
    labels: integer ``(...)``.
    node_mask: boolean ``(...)``, True on real nodes.

  Returns:
    float32 ``(C, C)``.

  Raises:
    ValueError: for mismatched shapes.
    TypeError: for non-floating logits, non-integer labels or a
      non-boolean mask.

  Examples:
    >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    >>> print(np.asarray(graph.confusion_matrix(logits, jnp.array([0, 0, 1]))))
    [[1. 1.]
     [1. 0.]]
  """
  who = "confusion_matrix"
  logits, labels = jnp.asarray(logits), jnp.asarray(labels)
  valid = _check_node_labels(who, logits, labels, node_mask)
  c = logits.shape[-1]
  true = jax.nn.one_hot(labels, c, dtype=jnp.float32)
  true = jnp.where(valid[..., None], true, 0.0)
  pred = jax.nn.one_hot(jnp.argmax(logits, axis=-1), c, dtype=jnp.float32)
  axes = tuple(range(labels.ndim))
  return jnp.tensordot(true, pred, axes=(axes, axes))


@_scope.scoped
def weighted_accuracy_from_confusion(
  confusion: Float[ArrayLike, "*batch c c"],
) -> Float[Array, "*batch"]:
  r"""Class-averaged recall in percent from a confusion matrix.

  .. math:: \mathrm{acc} = \frac{100}{|K|} \sum_{c \in K}
     \frac{M_{cc}}{\sum_{c'} M_{cc'}}

  over the classes ``K`` that occur as a true or a predicted class (the
  rows of scikit-learn's ``confusion_matrix`` in the official
  ``accuracy_SBM``); a class only predicted has recall 0.

  Args:
    confusion: ``(..., C, C)`` counts, rows true classes.

  Returns:
    float32 ``(...)``; 0 for an empty matrix.

  Raises:
    ValueError: for a non-square last two axes.
    TypeError: for a non-floating matrix.

  Examples:
    >>> m = jnp.array([[1.0, 1.0], [1.0, 0.0]])  # rows: true classes
    >>> acc = graph.weighted_accuracy_from_confusion(m)
    >>> print(np.asarray(acc))  # recalls 50 and 0 percent
    25.0
  """
  who = "weighted_accuracy_from_confusion"
  _checks.check_floating(who, "confusion", confusion)
  m = jnp.asarray(confusion).astype(jnp.float32)
  _checks.check_ndim(who, "confusion", m, minimum=2)
  if m.shape[-1] != m.shape[-2]:
    raise ValueError(
      f"{who}: confusion must be square (..., C, C), got {m.shape=}"
    )
  true = jnp.sum(m, axis=-1)
  present = (true + jnp.sum(m, axis=-2)) > 0
  recall = jnp.diagonal(m, axis1=-2, axis2=-1) / jnp.maximum(true, 1.0)
  count = jnp.sum(present, axis=-1).astype(jnp.float32)
  return 100.0 * jnp.sum(recall, axis=-1) / jnp.maximum(count, 1.0)


@_scope.scoped
def weighted_class_accuracy(
  logits: Float[ArrayLike, "... c"],
  labels: Int[ArrayLike, "..."],
  *,
  node_mask: Bool[ArrayLike, "..."] | None = None,
  per_batch: bool = False,
) -> Float[Array, ""]:
  r"""Weighted accuracy of the SBM benchmarks: mean per-class recall, in %.

  `weighted_accuracy_from_confusion` of `confusion_matrix`: over every
  real node given (a whole split) by default. ``per_batch=True`` follows
  the official code instead: axis 0 indexes batches, the accuracy is taken
  per batch and then averaged.

  Args:
    logits: ``(..., C)``; ``(num_batches, ..., C)`` with ``per_batch``.
    labels: integer ``(...)``.
    node_mask: boolean ``(...)``, True on real nodes.
    per_batch: average per-batch accuracies over axis 0.

  Returns:
    A float32 scalar in ``[0, 100]``.

  Raises:
    ValueError: for mismatched shapes, or ``per_batch`` with logits of
      rank < 3.
    TypeError: for non-floating logits, non-integer labels or a
      non-boolean mask.

  Examples:
    >>> logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    >>> acc = graph.weighted_class_accuracy(logits, jnp.array([0, 0, 1]))
    >>> print(np.asarray(acc))  # class 0: 1 of 2, class 1: 0 of 1
    25.0

  References:
    Dwivedi et al., arXiv:2003.00982 (2020), official ``accuracy_SBM``.
  """
  who = "weighted_class_accuracy"
  logits, labels = jnp.asarray(logits), jnp.asarray(labels)
  valid = _check_node_labels(who, logits, labels, node_mask)
  if not per_batch:
    return weighted_accuracy_from_confusion(
      confusion_matrix(logits, labels, node_mask=valid)
    )
  _checks.check_ndim(who, "logits", logits, minimum=3)
  matrices = jax.vmap(lambda z, y, m: confusion_matrix(z, y, node_mask=m))(
    logits, labels, valid
  )
  return jnp.mean(weighted_accuracy_from_confusion(matrices))
