"""PATTERN and CLUSTER, generated offline: the Benchmarking-GNNs SBM recipe.

Both node-classification datasets of Dwivedi et al. are stochastic block
models, made here with NumPy from a seed (`numpy.random.Generator`), so a run
needs no download and two runs with one seed see bit-identical graphs:

* ``pattern``: a 5-cluster SBM (sizes ``randint(5, 35)``, p=0.5, q=0.35,
  node features uniform in {0, 1, 2}) with one of 100 fixed random patterns
  (``m = randint(5, 35)`` nodes, internal p=0.5, its own fixed features)
  attached by Bernoulli(0.5) edges; label 1 on the pattern's nodes. 100
  train / 20 val / 20 test graphs per pattern (10k / 2k / 2k).
* ``cluster``: a 6-cluster SBM (p=0.55, q=0.25); every feature is 0 except
  one random node per cluster ``r``, which carries ``r + 1``; the label is
  the cluster. 10k / 1k / 1k graphs.

Nodes are shuffled with a random permutation at the end; graphs are
undirected without self-loops. A split is cached as ``.npz`` in the run
directory (upper triangles bit-packed) under a name that encodes the
generator's arguments, and served as a `grain.sources.RandomAccessDataSource`
whose records are padded to the dataset's node count: ``features`` (int32),
``adjacency`` (bool), ``labels`` (int32), ``node_mask`` (bool) and ``pe``
(float32 Laplacian encodings, `jaxnorm.graph.laplacian_pe`).

Deviation: the official notebooks draw each edge with a Python loop over
``np.random.binomial``; this draws the upper triangle at once, which has the
same distribution but other graphs for a given seed.

References:
  Dwivedi et al., *Benchmarking Graph Neural Networks*, arXiv:2003.00982
  (2020), ``data/SBMs/generate_SBM_{PATTERN,CLUSTER}.ipynb``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Literal

import grain
import jax
import numpy as np

from jaxnorm import graph

GraphDataset = Literal["pattern", "cluster"]
GRAPH_DATASETS: tuple[str, ...] = ("pattern", "cluster")
NUM_CLASSES = {"pattern": 2, "cluster": 6}
VOCAB_SIZE = {"pattern": 3, "cluster": 7}
SPLIT_SIZES = {"pattern": (10000, 2000, 2000), "cluster": (10000, 1000, 1000)}
"""The benchmark's train/val/test graph counts."""
PE_DIM = {"pattern": 2, "cluster": 10}
"""The official configs' Laplacian encoding sizes (``pos_enc_dim``)."""


@dataclasses.dataclass(frozen=True)
class Graph:
  """One graph: int features ``(n,)``, bool adjacency ``(n, n)``, labels."""

  features: np.ndarray
  adjacency: np.ndarray
  labels: np.ndarray


def _block_model(
  rng: np.random.Generator, clusters: np.ndarray, p: float, q: float
) -> np.ndarray:
  """Symmetric SBM adjacency: p within a cluster, q across; no loops."""
  same = clusters[:, None] == clusters[None, :]
  draw = rng.random((len(clusters), len(clusters))) < np.where(same, p, q)
  upper = np.triu(draw, 1)
  return upper | upper.T


def _clusters(
  rng: np.random.Generator, count: int, size_min: int, size_max: int
) -> np.ndarray:
  """Cluster ids ``r`` repeated ``randint(size_min, size_max)`` times."""
  sizes = rng.integers(size_min, size_max, size=count)
  return np.repeat(np.arange(count), sizes)


def _shuffle(rng: np.random.Generator, g: Graph) -> Graph:
  order = rng.permutation(len(g.features))
  return Graph(g.features[order], g.adjacency[order][:, order], g.labels[order])


def sbm_pattern(
  rng: np.random.Generator,
  *,
  pattern_adjacency: np.ndarray,
  pattern_features: np.ndarray,
  num_clusters: int = 5,
  size_min: int = 5,
  size_max: int = 35,
  p: float = 0.5,
  q: float = 0.35,
  q_pattern: float = 0.5,
  vocab_size: int = 3,
) -> Graph:
  """One PATTERN graph: an SBM with the given pattern attached.

  The base graph's features are uniform in ``range(vocab_size)``; the
  pattern keeps its own adjacency and features, and each (pattern, base)
  node pair is an edge with probability ``q_pattern``. Labels are 1 on
  pattern nodes, 0 elsewhere.
  """
  clusters = _clusters(rng, num_clusters, size_min, size_max)
  base = _block_model(rng, clusters, p, q)
  features = rng.integers(0, vocab_size, size=len(clusters))
  n, m = len(clusters), len(pattern_features)
  cross = rng.random((m, n)) < q_pattern
  adjacency = np.block([[base, cross.T], [cross, pattern_adjacency]])
  labels = np.concatenate([np.zeros(n), np.ones(m)]).astype(np.int32)
  g = Graph(
    np.concatenate([features, pattern_features]).astype(np.int32),
    adjacency,
    labels,
  )
  return _shuffle(rng, g)


def sbm_cluster(
  rng: np.random.Generator,
  *,
  num_clusters: int = 6,
  size_min: int = 5,
  size_max: int = 35,
  p: float = 0.55,
  q: float = 0.25,
) -> Graph:
  """One CLUSTER graph: an SBM with one labelled seed node per cluster."""
  clusters = _clusters(rng, num_clusters, size_min, size_max)
  adjacency = _block_model(rng, clusters, p, q)
  features = np.zeros(len(clusters), np.int32)
  for r in range(num_clusters):
    members = np.flatnonzero(clusters == r)
    features[members[rng.integers(len(members))]] = r + 1
  return _shuffle(rng, Graph(features, adjacency, clusters.astype(np.int32)))


def generate(
  name: GraphDataset,
  sizes: Sequence[int],
  *,
  seed: int,
  patterns: int = 100,
  size_min: int = 5,
  size_max: int = 35,
) -> list[list[Graph]]:
  """The splits of a dataset, ``sizes`` graphs each (train, val, test...).

  PATTERN draws ``patterns`` patterns first; every split holds
  ``sizes[i] // patterns`` graphs of each pattern (10000/2000/2000 with 100
  patterns is the benchmark's 100/20/20 per pattern). ``size_min`` and
  ``size_max`` bound the clusters and the patterns (benchmark: 5 and 35,
  exclusive); smaller values make smaller graphs of the same kind.

  Raises:
    ValueError: for an unknown name, a PATTERN split size that is not a
      multiple of ``patterns``, or ``size_max <= size_min``.
  """
  who = "graph_data.generate"
  if name not in GRAPH_DATASETS:
    raise ValueError(
      f"{who}: unknown dataset {name!r}; valid names are "
      f"{', '.join(GRAPH_DATASETS)}"
    )
  if not 0 < size_min < size_max:
    raise ValueError(
      f"{who}: need 0 < size_min < size_max, got {size_min=}, {size_max=}"
    )
  rng = np.random.default_rng(seed)
  bounds = {"size_min": size_min, "size_max": size_max}
  if name == "cluster":
    return [[sbm_cluster(rng, **bounds) for _ in range(n)] for n in sizes]
  for size in sizes:
    if size % patterns:
      raise ValueError(
        f"{who}: a PATTERN split size must be a multiple of "
        f"patterns={patterns}, got {size}"
      )
  splits: list[list[Graph]] = [[] for _ in sizes]
  for _ in range(patterns):
    m = int(rng.integers(size_min, size_max))
    w0 = _block_model(rng, np.zeros(m, np.int64), 0.5, 0.5)
    u0 = rng.integers(0, 3, size=m).astype(np.int32)
    for split, size in zip(splits, sizes):
      split.extend(
        sbm_pattern(rng, pattern_adjacency=w0, pattern_features=u0, **bounds)
        for _ in range(size // patterns)
      )
  return splits


def _pack(graphs: Sequence[Graph]) -> dict[str, np.ndarray]:
  """Concatenated features/labels, node counts, packed upper triangles."""
  sizes = np.array([len(g.features) for g in graphs], np.int64)
  bits = [
    np.packbits(g.adjacency[np.triu_indices(len(g.features), 1)])
    for g in graphs
  ]
  return {
    "sizes": sizes,
    "features": np.concatenate([g.features for g in graphs]),
    "labels": np.concatenate([g.labels for g in graphs]),
    "bit_sizes": np.array([len(b) for b in bits], np.int64),
    "bits": np.concatenate(bits),
  }


def _unpack(arrays: dict[str, np.ndarray]) -> list[Graph]:
  graphs = []
  node_at = np.concatenate([[0], np.cumsum(arrays["sizes"])])
  bit_at = np.concatenate([[0], np.cumsum(arrays["bit_sizes"])])
  for i, n in enumerate(arrays["sizes"]):
    n = int(n)
    iu = np.triu_indices(n, 1)
    upper = np.unpackbits(arrays["bits"][bit_at[i] : bit_at[i + 1]])
    adjacency = np.zeros((n, n), bool)
    adjacency[iu] = upper[: len(iu[0])].astype(bool)
    adjacency |= adjacency.T
    span = slice(node_at[i], node_at[i + 1])
    graphs.append(
      Graph(arrays["features"][span], adjacency, arrays["labels"][span])
    )
  return graphs


def _cache_stem(name: str, sizes: Sequence[int], **kwargs: int) -> str:
  """The cache file name's stem: every argument of `generate`."""
  tag = "-".join(str(s) for s in sizes)
  rest = "_".join(f"{k}{v}" for k, v in sorted(kwargs.items()))
  return f"sbm_{name}_{tag}_{rest}"


def load_splits(
  name: GraphDataset,
  sizes: Sequence[int],
  *,
  seed: int,
  cache_dir: str | pathlib.Path | None = None,
  **options: int,
) -> list[list[Graph]]:
  """`generate`, cached as ``.npz`` in ``cache_dir`` (a run directory).

  ``options`` are `generate`'s ``patterns``, ``size_min``, ``size_max``.
  The file name encodes every argument, so a cached file is reused only
  for the same dataset; ``cache_dir=None`` does not cache.
  """
  if cache_dir is None:
    return generate(name, sizes, seed=seed, **options)
  stem = _cache_stem(name, sizes, seed=seed, **options)
  path = pathlib.Path(cache_dir) / f"{stem}.npz"
  if path.exists():
    with np.load(path) as f:
      return [
        _unpack(
          {k[len(f"{i}_") :]: f[k] for k in f.files if k.startswith(f"{i}_")}
        )
        for i in range(len(sizes))
      ]
  splits = generate(name, sizes, seed=seed, **options)
  path.parent.mkdir(parents=True, exist_ok=True)
  arrays = {
    f"{i}_{k}": v
    for i, split in enumerate(splits)
    for k, v in _pack(split).items()
  }
  tmp = path.with_name(path.name + ".tmp.npz")
  np.savez_compressed(tmp, **arrays)
  tmp.replace(path)
  return splits


PE_BUCKET = 64


def _bucketed_pe(
  graphs: Sequence[Graph], num_nodes: int, pe_dim: int, pe_batch: int
) -> np.ndarray:
  """``(len(graphs), num_nodes, pe_dim)`` encodings, by size buckets."""
  pe = np.zeros((len(graphs), num_nodes, pe_dim), np.float32)
  sizes = np.array([len(g.features) for g in graphs])
  buckets = -(-sizes // PE_BUCKET) * PE_BUCKET
  pe_fn = jax.jit(lambda a, m: graph.laplacian_pe(a, pe_dim, node_mask=m))
  for width in np.unique(buckets):
    members = np.flatnonzero(buckets == width)
    for start in range(0, len(members), pe_batch):
      chunk = members[start : start + pe_batch]
      adjacency = np.zeros((pe_batch, width, width), bool)
      mask = np.zeros((pe_batch, width), bool)
      for row, i in enumerate(chunk):
        n = sizes[i]
        adjacency[row, :n, :n] = graphs[i].adjacency
        mask[row, :n] = True
      out = np.asarray(pe_fn(adjacency, mask))
      for row, i in enumerate(chunk):
        pe[i, : sizes[i]] = out[row, : sizes[i]]
  return pe


class GraphSource(grain.sources.RandomAccessDataSource):
  """Padded node-classification records of a list of graphs.

  Every record has ``num_nodes`` rows: ``features`` ``(N,)`` int32,
  ``labels`` ``(N,)`` int32, ``node_mask`` ``(N,)`` bool, ``adjacency``
  ``(N, N)`` bool and ``pe`` ``(N, pe_dim)`` float32 (all 0 past the
  graph's nodes). Encodings are computed once with
  `jaxnorm.graph.laplacian_pe`, on graphs grouped by size and padded to a
  multiple of `PE_BUCKET` nodes (padding does not change them, and the
  cubic eigensolver runs on small matrices).
  """

  def __init__(
    self,
    graphs: Sequence[Graph],
    *,
    num_nodes: int,
    pe_dim: int,
    pe: np.ndarray | None = None,
    pe_batch: int = 128,
  ):
    """Pads ``graphs`` to ``num_nodes`` and computes their encodings.

    Args:
      graphs: the graphs.
      num_nodes: the padded node count ``N``.
      pe_dim: number of Laplacian encodings ``k``.
      pe: precomputed ``(len(graphs), N, k)`` encodings (a cache), or
        ``None`` to compute them.
      pe_batch: graphs per eigensolver call.

    Raises:
      ValueError: if a graph has more than ``num_nodes`` nodes, or ``pe``
        has another shape.
    """
    largest = max(len(g.features) for g in graphs)
    if largest > num_nodes:
      raise ValueError(
        f"GraphSource: num_nodes={num_nodes} is smaller than the largest "
        f"graph ({largest} nodes)"
      )
    count = len(graphs)
    self.features = np.zeros((count, num_nodes), np.int32)
    self.labels = np.zeros((count, num_nodes), np.int32)
    self.node_mask = np.zeros((count, num_nodes), bool)
    self.adjacency = np.zeros((count, num_nodes, num_nodes), bool)
    for i, g in enumerate(graphs):
      n = len(g.features)
      self.features[i, :n] = g.features
      self.labels[i, :n] = g.labels
      self.node_mask[i, :n] = True
      self.adjacency[i, :n, :n] = g.adjacency
    if pe is None:
      pe = _bucketed_pe(graphs, num_nodes, pe_dim, pe_batch)
    elif pe.shape != (count, num_nodes, pe_dim):
      raise ValueError(
        f"GraphSource: pe must have shape {(count, num_nodes, pe_dim)}, got "
        f"pe.shape={pe.shape}"
      )
    self.pe = pe

  def __len__(self) -> int:
    """Number of graphs."""
    return len(self.features)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    """The padded record of graph ``index``."""
    return {
      "features": self.features[index],
      "labels": self.labels[index],
      "node_mask": self.node_mask[index],
      "adjacency": self.adjacency[index],
      "pe": self.pe[index],
    }


def load_sources(
  name: GraphDataset,
  sizes: Sequence[int],
  *,
  seed: int,
  pe_dim: int,
  cache_dir: str | pathlib.Path | None = None,
  **options: int,
) -> list[GraphSource]:
  """`load_splits` as `GraphSource` s padded to one size, encodings cached.

  The encodings are saved beside the graphs (``..._pe{k}.npy`` per split),
  so a second run in the same directory skips the eigensolver.
  """
  splits = load_splits(name, sizes, seed=seed, cache_dir=cache_dir, **options)
  num_nodes = padded_size(*splits)
  sources = []
  for i, split in enumerate(splits):
    path = None
    if cache_dir is not None:
      stem = _cache_stem(name, sizes, seed=seed, **options)
      path = pathlib.Path(cache_dir) / f"{stem}_split{i}_pe{pe_dim}.npy"
    pe = np.load(path) if path is not None and path.exists() else None
    source = GraphSource(split, num_nodes=num_nodes, pe_dim=pe_dim, pe=pe)
    if path is not None and pe is None:
      np.save(path, source.pe)
    sources.append(source)
  return sources


def padded_size(*splits: Sequence[Graph], multiple: int = 8) -> int:
  """The largest graph of ``splits``, rounded up to ``multiple`` nodes."""
  largest = max(len(g.features) for split in splits for g in split)
  return -(-largest // multiple) * multiple


def graph_batches(
  source: GraphSource, *, batch_size: int, seed: int
) -> grain.MapDataset:
  """Shuffled batches of padded graphs, forever (reshuffled each epoch)."""
  ds = grain.MapDataset.source(source).shuffle(seed=seed)
  return ds.repeat(None).batch(batch_size, drop_remainder=True)


def eval_batches(
  source: GraphSource, *, batch_size: int
) -> list[dict[str, np.ndarray]]:
  """Every graph once, in order; the last batch is padded with empty graphs.

  Empty graphs have no real node (``node_mask`` all False), so they change
  no masked statistic or metric.
  """
  out = []
  for start in range(0, len(source), batch_size):
    idx = np.arange(start, min(start + batch_size, len(source)))
    pad = batch_size - len(idx)
    batch = {}
    for k in ("features", "labels", "node_mask", "adjacency", "pe"):
      arr = getattr(source, k)[idx]
      batch[k] = np.concatenate(
        [arr, np.zeros((pad, *arr.shape[1:]), arr.dtype)]
      )
    out.append(batch)
  return out
