"""Graph Transformer (Dwivedi & Bresson) from named parts.

`GraphTransformer` classifies the nodes of a padded batch of graphs:
``features (B, N)`` int, ``adjacency (B, N, N)`` bool, ``node_mask (B, N)``
bool and, with Laplacian encodings, ``pe (B, N, k)``. Its parts are named in
`GraphTransformerConfig`:

* ``norm``: a name of `jaxnorm.nn.NORMS`: a per-node norm of the ``graphs``
  layout (``layernorm``, ``rmsnorm``, ...) or a batch-statistics norm that
  takes a mask (``batchnorm``: statistics over the real nodes, or the real
  edges, of the batch);
* ``graph``: ``sparse`` (attention over the graph's neighbours) or ``full``
  (every other real node);
* ``pe``: ``lap`` (Laplacian eigenvectors, `jaxnorm.graph.laplacian_pe`;
  sign flipping is the training loop's job, `jaxnorm.graph.random_sign_flip`)
  or ``none``;
* ``edge_features``: the edge stream of the edge layer (edge input 1 per
  edge, as the SBM benchmarks have no edge features).

The layer is the official code's post-norm block (`GraphTransformerLayer`).
The maths is in `jaxnorm.graph.graph_attention`; modules only hold
parameters.

Examples:
  >>> GRAPHS, POSITIONAL
  (('sparse', 'full'), ('lap', 'none'))

References:
  Dwivedi & Bresson, *A Generalization of Transformer Networks to Graphs*,
  arXiv:2012.09699 (2020); official code ``graphdeeplearning/graphtransformer``
  (``layers/graph_transformer_{,edge_}layer.py``, ``nets/SBMs_node_
  classification/graph_transformer_net.py``), read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, graph
from jaxnorm.nn import _param, layers
from jaxnorm.nn import norms as nn_norms

GRAPHS: tuple[str, ...] = ("sparse", "full")
POSITIONAL: tuple[str, ...] = ("lap", "none")


def graph_norms() -> tuple[str, ...]:
  """Norm names a `GraphTransformer` accepts, from the norms' specs.

  Norms whose spec ``takes_mask`` (called with the node or edge mask:
  `jaxnorm.nn.BatchNorm` takes its statistics over the real nodes of the
  batch) and per-node norms of the ``graphs`` layout without batch
  statistics.

  Examples:
    >>> names = graph_norms()
    >>> "batchnorm" in names, "layernorm" in names, "groupnorm" in names
    (True, True, False)
  """
  return tuple(
    sorted(
      name
      for name, spec in nn_norms.NORMS.items()
      if _norm_mode(spec) is not None
    )
  )


def _norm_mode(spec) -> str | None:
  """How the model calls a norm: ``mask`` (with the node mask), ``plain``."""
  if spec.dtype_kind != "real":  # The model is real-valued.
    return None
  if spec.takes_mask:
    return "mask"
  if "graphs" in spec.layouts and not spec.batch_stats:
    return "plain"
  return None


@dataclasses.dataclass(frozen=True)
class GraphTransformerConfig:
  """A Graph Transformer for node classification.

  Attributes:
    num_classes: node classes ``C``.
    vocab_size: number of node feature values (an embedding table).
    norm: a name of `graph_norms`.
    graph: ``sparse`` (neighbours) or ``full`` (all real nodes).
    pe: ``lap`` (Laplacian encodings) or ``none``.
    pe_dim: number of encodings ``k``.
    edge_features: use the edge layer with an edge stream.
    width: hidden size ``d``.
    depth: number of layers ``L``.
    num_heads: attention heads (divide ``width``).
    logit_clip: clamp of the attention logits (official code 5), or None.
    readout_layers: hidden layers of the readout MLP (``d / 2**l`` wide).
    dropout: dropout rate (input, attention output and FFN).
    norm_kwargs: extra keyword arguments of every norm, ``(name, value)``
      pairs; they override torch's defaults (``eps=1e-5``, BatchNorm
      ``momentum=0.9`` in jaxnorm's convention).
    remat: `jaxnorm.nn.layers.REMAT_CHOICES`: runs each
      `GraphTransformerLayer` under that `jax.checkpoint` policy.

  Examples:
    >>> cfg = GraphTransformerConfig(num_classes=3, vocab_size=5)
    >>> cfg.norm, cfg.graph, cfg.pe, cfg.width, cfg.depth
    ('batchnorm', 'sparse', 'lap', 80, 10)
    >>> GraphTransformerConfig(3, 5, norm="groupnorm")
    Traceback (most recent call last):
    ValueError: GraphTransformerConfig: norm 'groupnorm' cannot normalize ...
  """

  num_classes: int
  vocab_size: int
  norm: str = "batchnorm"
  graph: str = "sparse"
  pe: str = "lap"
  pe_dim: int = 2
  edge_features: bool = False
  width: int = 80
  depth: int = 10
  num_heads: int = 8
  logit_clip: float | None = None
  readout_layers: int = 2
  dropout: float = 0.0
  norm_kwargs: tuple[tuple[str, Any], ...] = ()
  remat: str = "none"

  def __post_init__(self):
    """Checks names and sizes; messages list the valid choices."""
    who = "GraphTransformerConfig"
    valid = graph_norms()
    if self.norm not in valid:
      raise ValueError(
        f"{who}: norm {self.norm!r} cannot normalize padded graphs; valid "
        f"names are {', '.join(valid)}"
      )
    _checks.check_choice(who, "graph", self.graph, GRAPHS)
    _checks.check_choice(who, "pe", self.pe, POSITIONAL)
    for name in ("num_classes", "vocab_size", "pe_dim", "width", "depth"):
      _checks.check_positive_int(who, name, getattr(self, name))
    _checks.check_positive_int(who, "num_heads", self.num_heads)
    _checks.check_divisible(
      who, "width", self.width, "num_heads", self.num_heads
    )
    if self.width >> self.readout_layers < 1:
      raise ValueError(
        f"{who}: width={self.width} is too narrow for readout_layers="
        f"{self.readout_layers} (each halves it)"
      )
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"{who}: dropout must be in [0, 1), got {self.dropout}")


class _Norm(nnx.Module):
  """A registry norm applied to node (or edge) features with their mask."""

  def __init__(
    self, name: str, width: int, kwargs: Mapping[str, Any], *, rngs: nnx.Rngs
  ):
    spec = nn_norms.NORMS[name]
    self.mode = _norm_mode(spec)
    defaults = {"eps": 1e-5}
    if issubclass(spec.module, nn_norms.BatchNorm):
      defaults["momentum"] = 0.9  # torch's momentum=0.1 on the new batch
    self.norm = nn_norms.make_norm(
      name, width, rngs=rngs, **{**defaults, **kwargs}
    )

  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    """Normalizes ``x (..., d)``; batch statistics over ``mask (...)``."""
    if self.mode == "mask":
      return self.norm(x, mask=mask)
    return self.norm(x)


class _FFN(nnx.Module):
  """``W2 drop(ReLU(W1 x))``, ``d -> 2d -> d`` with biases."""

  def __init__(self, width: int, dropout: nnx.Dropout, *, dtype, rngs):
    self.up = layers.Dense(
      width, 2 * width, names=("embed", "mlp"), dtype=dtype, rngs=rngs
    )
    self.down = layers.Dense(
      2 * width, width, names=("mlp", "embed"), dtype=dtype, rngs=rngs
    )
    self.dropout = dropout

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the FFN over the last axis."""
    return self.down(self.dropout(jax.nn.relu(self.up(x))))


class _Stream(nnx.Module):
  """Output projection, two norms and the FFN of one stream (h or e)."""

  def __init__(self, cfg: GraphTransformerConfig, dropout, *, dtype, rngs):
    d = cfg.width
    kwargs = dict(cfg.norm_kwargs)
    self.out = layers.Dense(
      d, d, names=("heads", "embed"), dtype=dtype, rngs=rngs
    )
    self.norm1 = _Norm(cfg.norm, d, kwargs, rngs=rngs)
    self.ffn = _FFN(d, dropout, dtype=dtype, rngs=rngs)
    self.norm2 = _Norm(cfg.norm, d, kwargs, rngs=rngs)
    self.dropout = dropout

  def __call__(
    self, x: jax.Array, attended: jax.Array, mask: jax.Array
  ) -> jax.Array:
    """``Norm2(y + FFN(y))`` with ``y = Norm1(x + O drop(attended))``."""
    y = self.norm1(x + self.out(self.dropout(attended)), mask)
    return self.norm2(y + self.ffn(y), mask)


class GraphTransformerLayer(nnx.Module):
  r"""One post-norm Graph Transformer layer (node, or node and edge).

  .. math::
    h' = \mathrm{Norm}(h + O_h\,\mathrm{concat}_k\,
      \mathrm{graph\_attention}(Q^k h, K^k h, V^k h)),\quad
    h'' = \mathrm{Norm}(h' + W_2\,\mathrm{ReLU}(W_1 h'))

  Q, K, V (and the edge projection) have no bias. With edge features the
  attention also returns the edge scores :math:`\hat s_{ij}`, which pass
  through the edge stream's own projection, norms and FFN; edge norms take
  their statistics over the real edges (the attention adjacency).

  Examples:
    >>> cfg = GraphTransformerConfig(3, 5, norm="layernorm", width=8,
    ...                              num_heads=2)
    >>> layer = GraphTransformerLayer(cfg, dtype=jnp.float32, rngs=nnx.Rngs(0))
    >>> mask = jnp.ones((1, 4), bool)  # (B, N): 4 real nodes
    >>> adjacency = ~jnp.eye(4, dtype=bool)[None]  # (B, N, N): all others
    >>> h, e = layer(jnp.ones((1, 4, 8), jnp.float32), None, adjacency, mask)
    >>> h.shape, e is None  # no edge stream
    ((1, 4, 8), True)
  """

  def __init__(self, cfg: GraphTransformerConfig, *, dtype: Any, rngs):
    d, self.heads = cfg.width, cfg.num_heads
    self.logit_clip = cfg.logit_clip
    self.dropout = nnx.Dropout(cfg.dropout, rngs=rngs)

    def proj():
      return layers.Dense(
        d, d, names=("embed", "heads"), use_bias=False, dtype=dtype, rngs=rngs
      )

    self.query, self.key, self.value = proj(), proj(), proj()
    self.edge_proj = proj() if cfg.edge_features else None
    self.h = _Stream(cfg, self.dropout, dtype=dtype, rngs=rngs)
    self.e = (
      _Stream(cfg, self.dropout, dtype=dtype, rngs=rngs)
      if cfg.edge_features
      else None
    )

  def __call__(
    self,
    h: jax.Array,
    e: jax.Array | None,
    adjacency: jax.Array,
    node_mask: jax.Array,
  ) -> tuple[jax.Array, jax.Array | None]:
    """Updates nodes ``h (B, N, d)`` and edges ``e (B, N, N, d)`` or None."""
    b, n, d = h.shape

    def heads(x):
      return x.reshape(*x.shape[:-1], self.heads, d // self.heads)

    q, k, v = (heads(f(h)) for f in (self.query, self.key, self.value))
    if self.e is None:
      att = graph.graph_attention(
        q, k, v, adjacency, logit_clip=self.logit_clip
      )
      return self.h(h, att.reshape(b, n, d), node_mask), None
    att, e_att = graph.graph_attention(
      q,
      k,
      v,
      adjacency,
      edge=heads(self.edge_proj(e)),
      logit_clip=self.logit_clip,
      denom_eps=1e-6,
    )
    h = self.h(h, att.reshape(b, n, d), node_mask)
    return h, self.e(e, e_att.reshape(b, n, n, d), adjacency)


class GraphTransformer(nnx.Module):
  """Node classifier: embeddings, `GraphTransformerLayer` s, MLP readout.

  ``h0 = Embed(features) + Linear(pe)`` (with ``pe="lap"``), input dropout,
  ``depth`` layers, then ``d -> d/2 -> ... -> C`` with ReLU. Padded nodes
  never reach a real node (no edges) and are excluded from BatchNorm
  statistics; their logits are meaningless (mask them in the loss).
  ``model.train()`` / ``model.eval()`` switch BatchNorm and dropout.

  Examples:
    >>> cfg = GraphTransformerConfig(3, 5, width=8, depth=2, num_heads=2,
    ...                              pe="none")
    >>> model = GraphTransformer(cfg, rngs=nnx.Rngs(0))
    >>> features = jnp.array([[0, 1, 2, 4]], jnp.int32)  # (B, N) node values
    >>> node_mask = jnp.array([[True, True, True, False]])  # node 3: padding
    >>> adjacency = ~jnp.eye(4, dtype=bool)[None]  # (B, N, N)
    >>> model(features, adjacency, node_mask).shape  # (B, N, C) logits
    (1, 4, 3)
  """

  def __init__(
    self,
    config: GraphTransformerConfig,
    *,
    dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    c = self.config = config
    layers.check_remat("GraphTransformer", c.remat)
    d = c.width
    self.embed = _param.param(
      nnx.initializers.normal(1.0)(rngs.params(), (c.vocab_size, d)),
      ("vocab", "embed"),
    )
    self.pe_proj = (
      layers.Dense(c.pe_dim, d, names=(None, "embed"), dtype=dtype, rngs=rngs)
      if c.pe == "lap"
      else None
    )
    self.edge_embed = (
      layers.Dense(1, d, names=(None, "embed"), dtype=dtype, rngs=rngs)
      if c.edge_features
      else None
    )
    self.dropout = nnx.Dropout(c.dropout, rngs=rngs)
    self.layers = nnx.List(
      [GraphTransformerLayer(c, dtype=dtype, rngs=rngs) for _ in range(c.depth)]
    )
    widths = [d >> i for i in range(c.readout_layers + 1)] + [c.num_classes]
    self.readout = nnx.List(
      [
        layers.Dense(a, b, names=(None, None), dtype=dtype, rngs=rngs)
        for a, b in zip(widths[:-1], widths[1:])
      ]
    )
    self.dtype = dtype

  def __call__(
    self,
    features: jax.Array,
    adjacency: jax.Array,
    node_mask: jax.Array,
    pe: jax.Array | None = None,
    *,
    rngs: jax.Array | None = None,
  ) -> jax.Array:
    """Node logits ``(B, N, C)``.

    Args:
      features: int node features ``(B, N)``.
      adjacency: bool ``(B, N, N)``; ``[b, i, j]``: i receives from j
        (ignored by ``graph="full"``).
      node_mask: bool ``(B, N)``, True on real nodes.
      pe: ``(B, N, k)`` Laplacian encodings; ignored with ``pe="none"``.
      rngs: a PRNG key for the training-time sign flips of ``pe``
        (`jaxnorm.graph.random_sign_flip`, one sign per column for the
        batch, as the official code); ``None`` (evaluation) flips nothing.

    Raises:
      ValueError: for ``pe`` missing with ``pe="lap"``.
    """
    c = self.config
    if c.pe == "lap" and pe is None:
      raise ValueError(
        "GraphTransformer: pe='lap' needs the Laplacian encodings, got pe=None"
      )
    node_mask = jnp.asarray(node_mask)
    if c.graph == "full":
      n = node_mask.shape[-1]
      others = ~jnp.eye(n, dtype=bool)[None]
      adjacency = jnp.broadcast_to(others, (node_mask.shape[0], n, n))
    real = node_mask[:, :, None] & node_mask[:, None, :]
    adjacency = jnp.asarray(adjacency) & real
    h = self.embed[...].astype(self.dtype)[features]
    if self.pe_proj is not None:
      if rngs is not None:
        pe = graph.random_sign_flip(pe, rngs)
      h = h + self.pe_proj(pe)
    h = self.dropout(h)
    e = None
    if self.edge_embed is not None:
      ones = adjacency[..., None].astype(self.dtype)
      e = self.edge_embed(ones)
    step = layers.rematerialize(
      lambda layer, h, e, adjacency, node_mask: layer(
        h, e, adjacency, node_mask
      ),
      c.remat,
    )
    for layer in self.layers:
      h, e = step(layer, h, e, adjacency, node_mask)
    for i, dense in enumerate(self.readout):
      h = dense(h) if i == 0 else dense(jax.nn.relu(h))
    return h
