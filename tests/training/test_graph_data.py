"""Tests of `jaxnorm.training.graph_data` (offline PATTERN and CLUSTER).

Oracles (spec): empirical intra/inter-cluster edge densities equal p/q
within 3 sigma, pattern-base density 0.5; symmetric graphs without
self-loops; bit-identical graphs for one seed; the recipe's features and
labels; the cache round trip; padded records and encodings.
"""

import numpy as np
import pytest

from jaxnorm.training import graph_data as gd


def _numpy_pe(a, k):
  """Float64 oracle of `jaxnorm.graph.laplacian_pe` (simple spectra)."""
  a = a.astype(np.float64)
  d = np.maximum(a.sum(0), 1.0) ** -0.5
  _, v = np.linalg.eigh(np.eye(len(a)) - d[:, None] * a * d[None, :])
  out = np.zeros((len(a), k))
  out[:, : min(k, len(a) - 1)] = v[:, 1 : k + 1]
  return out


def _within_3_sigma(hits, pairs, p):
  sigma = np.sqrt(p * (1 - p) / pairs)
  assert abs(hits / pairs - p) < 3 * sigma, (hits / pairs, p)


class TestGenerators:
  def test_cluster_densities_features_labels(self):
    rng = np.random.default_rng(0)
    graphs = [gd.sbm_cluster(rng) for _ in range(40)]
    same = diff = same_hits = diff_hits = 0
    for g in graphs:
      a, y, x = g.adjacency, g.labels, g.features
      np.testing.assert_array_equal(a, a.T)
      assert not a.diagonal().any()
      iu = np.triu_indices(len(y), 1)
      s = (y[:, None] == y[None, :])[iu]
      same, diff = same + s.sum(), diff + (~s).sum()
      same_hits += a[iu][s].sum()
      diff_hits += a[iu][~s].sum()
      assert sorted(x[x > 0]) == list(range(1, 7))  # one seed per cluster
      for r in range(6):
        assert x[y == r].max() == r + 1
      assert 30 <= len(y) <= 6 * 34
    _within_3_sigma(same_hits, same, 0.55)
    _within_3_sigma(diff_hits, diff, 0.25)

  def test_pattern_densities_and_labels(self):
    splits = gd.generate("pattern", [200, 40], seed=1, patterns=20)
    assert [len(s) for s in splits] == [200, 40]
    pattern_hits = pattern_pairs = cross_hits = cross_pairs = 0
    for g in splits[0]:
      a, y = g.adjacency, g.labels
      np.testing.assert_array_equal(a, a.T)
      assert not a.diagonal().any()
      on = y == 1
      assert 5 <= on.sum() < 35 and set(np.unique(g.features)) <= {0, 1, 2}
      cross_hits += a[np.ix_(on, ~on)].sum()
      cross_pairs += on.sum() * (~on).sum()
      sub = a[np.ix_(on, on)]
      pattern_hits += np.triu(sub, 1).sum()
      pattern_pairs += on.sum() * (on.sum() - 1) // 2
    _within_3_sigma(cross_hits, cross_pairs, 0.5)
    _within_3_sigma(pattern_hits, pattern_pairs, 0.5)
    mean_nodes = np.mean([len(g.labels) for g in splits[0]])
    assert 95 < mean_nodes < 140  # the benchmark's ~119 nodes per graph

  def test_pattern_is_fixed_per_instance(self):
    """Graphs of one pattern share its subgraph and features."""
    (train,) = gd.generate("pattern", [20], seed=2, patterns=2)
    first, second = train[0], train[1]  # same pattern instance

    def canonical(g):
      on = np.flatnonzero(g.labels == 1)
      return len(on), np.sort(g.features[on])

    assert canonical(first)[0] == canonical(second)[0]
    np.testing.assert_array_equal(canonical(first)[1], canonical(second)[1])

  def test_base_graph_density(self):
    """PATTERN's base SBM: p=0.5 within, q=0.35 across clusters."""
    rng = np.random.default_rng(3)
    hits = {True: 0, False: 0}
    pairs = {True: 0, False: 0}
    for _ in range(30):
      clusters = gd._clusters(rng, 5, 5, 35)
      a = gd._block_model(rng, clusters, 0.5, 0.35)
      iu = np.triu_indices(len(clusters), 1)
      s = (clusters[:, None] == clusters[None, :])[iu]
      for key in (True, False):
        hits[key] += a[iu][s == key].sum()
        pairs[key] += (s == key).sum()
    _within_3_sigma(hits[True], pairs[True], 0.5)
    _within_3_sigma(hits[False], pairs[False], 0.35)

  def test_seeded_and_bit_identical(self):
    a = gd.generate("cluster", [5], seed=4)[0]
    b = gd.generate("cluster", [5], seed=4)[0]
    c = gd.generate("cluster", [5], seed=5)[0]
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x.adjacency, y.adjacency)
      np.testing.assert_array_equal(x.features, y.features)
    assert any(len(x.labels) != len(y.labels) for x, y in zip(a, c))

  def test_errors(self):
    with pytest.raises(ValueError, match="generate: unknown dataset 'zinc'"):
      gd.generate("zinc", [1], seed=0)
    with pytest.raises(ValueError, match="generate: a PATTERN split size"):
      gd.generate("pattern", [15], seed=0, patterns=10)
    with pytest.raises(ValueError, match="generate: need 0 < size_min"):
      gd.generate("cluster", [1], seed=0, size_min=5, size_max=5)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  cache = tmp_path_factory.mktemp("graphs")
  kwargs = dict(seed=0, patterns=4, size_min=3, size_max=6)
  sources = gd.load_sources(
    "pattern", [8, 4], pe_dim=3, cache_dir=cache, **kwargs
  )
  return cache, kwargs, sources


class TestCacheAndSources:
  def test_cache_round_trip(self, small):
    cache, kwargs, sources = small
    assert len(list(cache.glob("*.npz"))) == 1
    assert len(list(cache.glob("*_pe3.npy"))) == 2
    again = gd.load_splits("pattern", [8, 4], cache_dir=cache, **kwargs)
    fresh = gd.generate("pattern", [8, 4], **kwargs)
    for split_a, split_b in zip(again, fresh):
      for x, y in zip(split_a, split_b):
        np.testing.assert_array_equal(x.adjacency, y.adjacency)
        np.testing.assert_array_equal(x.labels, y.labels)
        np.testing.assert_array_equal(x.features, y.features)
    cached = gd.load_sources(
      "pattern", [8, 4], pe_dim=3, cache_dir=cache, **kwargs
    )
    np.testing.assert_array_equal(cached[0].pe, sources[0].pe)

  def test_records_are_padded_graphs_with_their_pe(self, small):
    _, kwargs, sources = small
    train = sources[0]
    graphs = gd.generate("pattern", [8, 4], **kwargs)[0]
    n_pad = train.features.shape[1]
    assert n_pad % 8 == 0 and len(train) == 8
    for i, g in enumerate(graphs):
      rec = train[i]
      n = len(g.labels)
      assert rec["node_mask"].sum() == n and rec["adjacency"].shape == (
        n_pad,
        n_pad,
      )
      np.testing.assert_array_equal(rec["adjacency"][:n, :n], g.adjacency)
      assert not rec["adjacency"][n:].any() and not rec["pe"][n:].any()
      pe = _numpy_pe(g.adjacency, 3)
      signs = np.sign(np.sum(pe * rec["pe"][:n], 0))
      np.testing.assert_allclose(
        rec["pe"][:n], pe * np.where(signs == 0, 1, signs), atol=1e-4
      )

  def test_batches(self, small):
    _, _, (train, val) = small
    batch = next(iter(gd.graph_batches(train, batch_size=4, seed=0)))
    assert batch["adjacency"].shape == (4, *train.adjacency.shape[1:])
    evals = gd.eval_batches(val, batch_size=3)
    assert len(evals) == 2
    assert not evals[-1]["node_mask"][1:].any()  # padded with empty graphs
    assert sum(b["node_mask"].sum() for b in evals) == val.node_mask.sum()

  def test_source_errors(self, small):
    _, kwargs, (train, _) = small
    graphs = gd.generate("pattern", [8, 4], **kwargs)[0]
    with pytest.raises(ValueError, match="GraphSource: num_nodes=2 is smaller"):
      gd.GraphSource(graphs, num_nodes=2, pe_dim=2)
    with pytest.raises(ValueError, match="GraphSource: pe must have shape"):
      gd.GraphSource(
        graphs, num_nodes=train.features.shape[1], pe_dim=2, pe=train.pe
      )
