"""Tests of `jaxnorm.graph`: Laplacian PE, graph attention, loss, metric.

Oracles: the spectra of path and cycle graphs (golden values of the spec),
NumPy float64 eigendecompositions, permutation equivariance and padding
invariance; a dense NumPy loop over edges for graph attention and the
masked `jaxnorm.attention.dot_product_attention` on the complete graph;
NumPy transcriptions of the official class weights, weighted loss and
``accuracy_SBM``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import attention, graph
from tests import helpers


def _path(n):
  a = np.zeros((n, n), bool)
  i = np.arange(n - 1)
  a[i, i + 1] = a[i + 1, i] = True
  return a


def _cycle(n):
  a = _path(n)
  a[0, n - 1] = a[n - 1, 0] = True
  return a


def _random_graph(rng, n, p=0.4):
  upper = np.triu(rng.random((n, n)) < p, 1)
  return upper | upper.T


def _numpy_pe(a, k):
  """Float64 oracle: eigenvectors 1..k of I - D^-1/2 A D^-1/2."""
  a = np.asarray(a, np.float64)
  d = np.maximum(a.sum(0), 1.0) ** -0.5
  lap = np.eye(len(a)) - d[:, None] * a * d[None, :]
  w, v = np.linalg.eigh(lap)
  pe = np.zeros((len(a), k))
  cols = v[:, 1 : k + 1]
  pe[:, : cols.shape[1]] = cols
  return w, pe


def _match_signs(pe, ref):
  """``pe`` with each column's sign chosen to agree with ``ref``."""
  pe = np.asarray(pe, np.float64)
  signs = np.sign(np.sum(pe * ref, axis=0))
  return pe * np.where(signs == 0, 1.0, signs)


class TestLaplacianPE:
  def test_path_golden(self):
    """P4: eigenvalues [0, .5, 1.5, 2]; PE(k=2) the spec's golden vectors."""
    w, _ = _numpy_pe(_path(4), 2)
    np.testing.assert_allclose(w, [0.0, 0.5, 1.5, 2.0], atol=1e-12)
    golden = np.array(
      [
        [0.57735, -0.57735],
        [0.40825, 0.40825],
        [-0.40825, 0.40825],
        [-0.57735, -0.57735],
      ]
    )
    pe = graph.laplacian_pe(_path(4), 2)
    assert pe.dtype == jnp.float32 and pe.shape == (4, 2)
    np.testing.assert_allclose(_match_signs(pe, golden), golden, atol=1e-5)

  def test_cycle_subspaces(self):
    """C8: eigenvalues 1 - cos(2 pi m / 8); PE spans their eigenspaces."""
    w, _ = _numpy_pe(_cycle(8), 4)
    expected = np.sort(1 - np.cos(2 * np.pi * np.arange(8) / 8))
    np.testing.assert_allclose(w, expected, atol=1e-12)
    m = np.arange(8)
    for k, modes in ((2, [1]), (4, [1, 2])):
      basis = np.concatenate(
        [
          np.stack(
            [np.cos(2 * np.pi * f * m / 8), np.sin(2 * np.pi * f * m / 8)]
          )
          for f in modes
        ]
      ).T
      basis /= np.linalg.norm(basis, axis=0)
      pe = np.asarray(graph.laplacian_pe(_cycle(8), k), np.float64)
      np.testing.assert_allclose(pe @ pe.T, basis @ basis.T, atol=1e-5)

  def test_matches_numpy_with_isolated_node(self):
    rng = np.random.default_rng(5)
    a = _random_graph(rng, 9)
    a[3, :] = a[:, 3] = False  # degree clipped at 1: L_33 = 1
    w, ref = _numpy_pe(a, 3)
    assert np.min(np.diff(w[:5])) > 1e-2  # simple spectrum up to k + 1
    pe = graph.laplacian_pe(a.astype(np.float32), 3)
    np.testing.assert_allclose(_match_signs(pe, ref), ref, atol=1e-4)

  def test_permutation_equivariance(self):
    rng = np.random.default_rng(1)
    a = _random_graph(rng, 10, 0.5)
    w, _ = _numpy_pe(a, 4)
    assert np.min(np.diff(w[:6])) > 1e-2
    perm = rng.permutation(10)
    pe = np.asarray(graph.laplacian_pe(a, 4))
    pe_perm = graph.laplacian_pe(a[perm][:, perm], 4)
    np.testing.assert_allclose(
      _match_signs(pe_perm, pe[perm]), pe[perm], atol=1e-4
    )

  def test_padding_invariance_and_short_graphs(self):
    """A padded batch gives each graph's own PE; missing columns are 0."""
    rng = np.random.default_rng(2)
    graphs = [_path(4), _random_graph(rng, 6, 0.6), _path(2)]
    n, k = 8, 3
    adj = np.zeros((3, n, n), bool)
    mask = np.zeros((3, n), bool)
    for b, a in enumerate(graphs):
      adj[b, : len(a), : len(a)] = a
      mask[b, : len(a)] = True
    adj[0, 6, 7] = adj[0, 7, 6] = True  # edges of padded nodes are dropped
    pe = np.asarray(graph.laplacian_pe(adj, k, node_mask=mask))
    for b, a in enumerate(graphs):
      _, ref = _numpy_pe(a, k)
      np.testing.assert_allclose(
        _match_signs(pe[b, : len(a)], ref), ref, atol=1e-5
      )
      np.testing.assert_array_equal(pe[b, len(a) :], 0.0)
    np.testing.assert_array_equal(pe[2, :, 1:], 0.0)  # P2: one eigenvector
    np.testing.assert_array_equal(pe[0, :, :], pe[0] * mask[0, :, None])

  def test_k_beyond_nodes(self):
    pe = graph.laplacian_pe(_path(3), 5)
    assert pe.shape == (3, 5)
    np.testing.assert_array_equal(pe[:, 2:], 0.0)

  def test_jit_matches_eager(self):
    a = jnp.asarray(_cycle(6))[None]
    fn = functools.partial(graph.laplacian_pe, k=2)
    helpers.assert_close(jax.jit(fn)(a), fn(a), atol=1e-6)

  def test_errors(self):
    with pytest.raises(ValueError, match="laplacian_pe: adjacency must be sq"):
      graph.laplacian_pe(jnp.ones((3, 4)), 2)
    with pytest.raises(ValueError, match="laplacian_pe: k must be a positive"):
      graph.laplacian_pe(jnp.ones((3, 3)), 0)
    with pytest.raises(TypeError, match="laplacian_pe: node_mask must be bo"):
      graph.laplacian_pe(jnp.ones((3, 3)), 1, node_mask=jnp.ones(3))
    with pytest.raises(ValueError, match="laplacian_pe: node_mask must have"):
      graph.laplacian_pe(jnp.ones((3, 3)), 1, node_mask=jnp.ones(4, bool))


class TestSignFlip:
  def test_flips_whole_columns(self, key):
    pe = jax.random.normal(key, (3, 5, 4))
    out = graph.random_sign_flip(pe, jax.random.key(1))
    ratio = np.asarray(out / pe)
    np.testing.assert_allclose(np.abs(ratio), 1.0)
    np.testing.assert_allclose(ratio, ratio[:1, :1] * np.ones_like(ratio))

  def test_per_graph(self, key):
    pe = jnp.ones((64, 5, 3))
    out = np.asarray(graph.random_sign_flip(pe, key, per_graph=True))
    np.testing.assert_array_equal(out, out[:, :1] * np.ones_like(out))
    assert len(np.unique(out[:, 0, 0])) == 2  # graphs draw their own signs

  def test_errors(self, key):
    with pytest.raises(TypeError, match="random_sign_flip: pe must have a f"):
      graph.random_sign_flip(jnp.ones((2, 2), jnp.int32), key)
    with pytest.raises(ValueError, match="random_sign_flip: pe must have ra"):
      graph.random_sign_flip(jnp.ones(3), key)


def _attention_loop(q, k, v, adj, edge, scale, clip, eps):
  """Dense NumPy float64 loop over nodes, heads and edges."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  b, n, h, dh = q.shape
  out = np.zeros((b, n, h, v.shape[-1]))
  e_out = np.zeros((b, n, n, h, dh))
  for bi in range(b):
    for i in range(n):
      for hi in range(h):
        num, den = 0.0, 0.0
        for j in range(n):
          if not adj[bi, i, j]:
            continue
          s_vec = q[bi, i, hi] * k[bi, j, hi] * scale
          if edge is not None:
            s_vec = s_vec * np.asarray(edge, np.float64)[bi, i, j, hi]
            e_out[bi, i, j, hi] = s_vec
            s = s_vec.sum()
          else:
            s = q[bi, i, hi] @ k[bi, j, hi] * scale
          if clip is not None:
            s = np.clip(s, -clip, clip)
          num = num + np.exp(s) * v[bi, j, hi]
          den += np.exp(s)
        if den > 0 or eps > 0:
          out[bi, i, hi] = num / (den + eps)
  return out, e_out


@pytest.fixture(scope="module")
def qkv():
  kq, kk, kv, ke = jax.random.split(jax.random.key(3), 4)
  shape = (2, 6, 2, 4)
  return (
    jax.random.normal(kq, shape),
    jax.random.normal(kk, shape),
    jax.random.normal(kv, (2, 6, 2, 3)),
    jax.random.normal(ke, (2, 6, 6, 2, 4)),
  )


def _sparse_adjacency():
  rng = np.random.default_rng(4)
  adj = np.stack([_random_graph(rng, 6, 0.5) for _ in range(2)])
  adj[0, 2, :] = adj[0, :, 2] = False  # isolated node
  return adj


class TestGraphAttention:
  def test_complete_graph_equals_masked_dot_product_attention(self, qkv):
    q, k, v, _ = qkv
    adj = ~np.eye(6, dtype=bool)[None].repeat(2, 0)
    out = graph.graph_attention(q, k, v, adj)
    ref = attention.dot_product_attention(
      q, k, v, mask=jnp.asarray(adj)[:, None], implementation="xla"
    )
    helpers.assert_close(out, ref, atol=1e-6)

  @pytest.mark.parametrize("clip", [None, 0.3])
  def test_node_form_matches_loop(self, qkv, clip):
    q, k, v, _ = qkv
    adj = _sparse_adjacency()
    out = graph.graph_attention(q, k, v, adj, logit_clip=clip)
    ref, _ = _attention_loop(q, k, v, adj, None, 0.5, clip, 0.0)
    helpers.assert_close(out, ref, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out)[0, 2], 0.0)  # isolated

  def test_edge_form_matches_loop(self, qkv):
    q, k, v, e = qkv
    adj = _sparse_adjacency()
    out, e_out = graph.graph_attention(
      q, k, v, adj, edge=e, scale=0.7, logit_clip=5.0, denom_eps=1e-2
    )
    ref, e_ref = _attention_loop(q, k, v, adj, e, 0.7, 5.0, 1e-2)
    helpers.assert_close((out, e_out), (ref, e_ref), atol=1e-5)

  def test_large_logits_are_stable(self, qkv):
    q, k, v, _ = qkv
    adj = _sparse_adjacency()
    q, k = 8.0 * q, 8.0 * k  # logits beyond float32's exp range (88)
    assert float(jnp.max(jnp.einsum("bihd,bjhd->bhij", q, k))) / 2 > 90
    out = graph.graph_attention(q, k, v, adj)
    ref, _ = _attention_loop(q, k, v, adj, None, 0.5, None, 0.0)
    assert np.all(np.isfinite(np.asarray(out)))
    helpers.assert_close(out, ref, atol=1e-4)

  def test_permutation_equivariance(self, qkv):
    q, k, v, e = qkv
    adj = _sparse_adjacency()
    perm = np.random.default_rng(5).permutation(6)
    out, e_out = graph.graph_attention(q, k, v, adj, edge=e)
    p_out, p_e = graph.graph_attention(
      q[:, perm],
      k[:, perm],
      v[:, perm],
      adj[:, perm][:, :, perm],
      edge=e[:, perm][:, :, perm],
    )
    helpers.assert_close(
      (p_out, p_e), (out[:, perm], e_out[:, perm][:, :, perm]), atol=1e-6
    )

  def test_padding_invariance_and_gradients(self, qkv):
    q, k, v, _ = qkv
    adj = _sparse_adjacency()
    pad = ((0, 0), (0, 3), (0, 0), (0, 0))
    big_adj = np.pad(adj, ((0, 0), (0, 3), (0, 3)))
    out = graph.graph_attention(q, k, v, adj)
    padded = graph.graph_attention(
      jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad), big_adj
    )
    helpers.assert_close(padded[:, :6], out, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(padded)[:, 6:], 0.0)
    grads = jax.grad(
      lambda q: jnp.sum(graph.graph_attention(q, k, v, adj) ** 2)
    )(q)
    assert np.all(np.isfinite(np.asarray(grads)))
    np.testing.assert_array_equal(np.asarray(grads)[0, 2], 0.0)

  def test_errors(self, qkv):
    q, k, v, e = qkv
    adj = jnp.ones((2, 6, 6), bool)
    who = "graph_attention"
    with pytest.raises(ValueError, match=f"{who}: query must have rank 4"):
      graph.graph_attention(q[0], k, v, adj)
    with pytest.raises(ValueError, match=f"{who}: key must have the shape"):
      graph.graph_attention(q, k[:, :5], v, adj)
    with pytest.raises(ValueError, match=f"{who}: value must match query"):
      graph.graph_attention(q, k, v[:, :5], adj)
    with pytest.raises(TypeError, match=f"{who}: adjacency must be boolean"):
      graph.graph_attention(q, k, v, jnp.ones((2, 6, 6)))
    with pytest.raises(ValueError, match=f"{who}: adjacency must have shape"):
      graph.graph_attention(q, k, v, adj[:, :5])
    with pytest.raises(ValueError, match=f"{who}: edge must have shape"):
      graph.graph_attention(q, k, v, adj, edge=e[:, :5])
    with pytest.raises(ValueError, match=f"{who}: logit_clip must be None"):
      graph.graph_attention(q, k, v, adj, logit_clip=0.0)
    with pytest.raises(ValueError, match=f"{who}: denom_eps must be >= 0"):
      graph.graph_attention(q, k, v, adj, denom_eps=-1.0)


def _accuracy_sbm(scores, targets):
  """The official ``accuracy_SBM`` (scikit-learn confusion matrix)."""
  pred = np.argmax(scores, axis=1)
  classes = np.union1d(targets, pred)
  cm = np.array(
    [[np.sum((targets == r) & (pred == c)) for c in classes] for r in classes]
  )
  recall = [
    cm[i, i] / np.sum(targets == r) if np.sum(targets == r) else 0.0
    for i, r in enumerate(classes)
  ]
  return 100.0 * np.sum(recall) / len(classes)


@pytest.fixture(scope="module")
def node_batch():
  rng = np.random.default_rng(6)
  logits = rng.normal(size=(3, 7, 4)).astype(np.float32)
  labels = rng.integers(0, 3, size=(3, 7)).astype(np.int32)  # class 3 absent
  mask = rng.random((3, 7)) < 0.8
  return logits, labels, mask


class TestLossAndMetric:
  def test_class_weights(self, node_batch):
    _, labels, mask = node_batch
    y = labels[mask]
    counts = np.bincount(y, minlength=4)
    expected = (len(y) - counts) / len(y) * (counts > 0)
    w = graph.class_balanced_weights(labels, 4, node_mask=mask)
    helpers.assert_close(w, expected, atol=1e-7)

  def test_weighted_cross_entropy(self, node_batch):
    logits, labels, mask = node_batch
    z, y = logits[mask].astype(np.float64), labels[mask]
    counts = np.bincount(y, minlength=4)
    w = ((len(y) - counts) / len(y) * (counts > 0))[y]
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -logp[np.arange(len(y)), y]
    loss = graph.class_balanced_cross_entropy(logits, labels, node_mask=mask)
    helpers.assert_close(loss, np.sum(w * nll) / np.sum(w), atol=1e-6)

  def test_single_class_batch_loss_is_zero(self):
    loss = graph.class_balanced_cross_entropy(
      jnp.ones((4, 3)), jnp.zeros(4, jnp.int32)
    )
    assert float(loss) == 0.0

  def test_weighted_accuracy_matches_official(self, node_batch):
    logits, labels, mask = node_batch
    acc = graph.weighted_class_accuracy(logits, labels, node_mask=mask)
    expected = _accuracy_sbm(logits[mask], labels[mask])
    helpers.assert_close(acc, expected, atol=1e-4)
    per_batch = graph.weighted_class_accuracy(
      logits, labels, node_mask=mask, per_batch=True
    )
    expected = np.mean(
      [_accuracy_sbm(z[m], y[m]) for z, y, m in zip(logits, labels, mask)]
    )
    helpers.assert_close(per_batch, expected, atol=1e-4)

  def test_confusion_adds_over_batches(self, node_batch):
    logits, labels, mask = node_batch
    total = sum(
      graph.confusion_matrix(z, y, node_mask=m)
      for z, y, m in zip(logits, labels, mask)
    )
    helpers.assert_close(
      graph.weighted_accuracy_from_confusion(total),
      graph.weighted_class_accuracy(logits, labels, node_mask=mask),
      atol=1e-5,
    )
    assert float(jnp.sum(total)) == mask.sum()

  def test_perfect_and_chance(self):
    labels = jnp.array([0, 0, 0, 1], jnp.int32)
    perfect = jax.nn.one_hot(labels, 2)
    majority = jax.nn.one_hot(jnp.zeros(4, jnp.int32), 2)
    assert float(graph.weighted_class_accuracy(perfect, labels)) == 100.0
    assert float(graph.weighted_class_accuracy(majority, labels)) == 50.0

  def test_errors(self):
    z, y = jnp.ones((2, 3, 4)), jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(TypeError, match="class_balanced_cross_entropy: lab"):
      graph.class_balanced_cross_entropy(z, y.astype(jnp.float32))
    with pytest.raises(ValueError, match="confusion_matrix: labels must hav"):
      graph.confusion_matrix(z, y[:, :2])
    with pytest.raises(TypeError, match="weighted_class_accuracy: node_mask"):
      graph.weighted_class_accuracy(z, y, node_mask=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="class_balanced_weights: node_mask"):
      graph.class_balanced_weights(y, 4, node_mask=jnp.ones((3,), bool))
    with pytest.raises(ValueError, match="class_balanced_weights: num_class"):
      graph.class_balanced_weights(y, 0)
    with pytest.raises(ValueError, match="weighted_class_accuracy: logits m"):
      graph.weighted_class_accuracy(z[0], y[0], per_batch=True)
    with pytest.raises(ValueError, match="weighted_accuracy_from_confusion"):
      graph.weighted_accuracy_from_confusion(jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="confusion_matrix: logits must have"):
      graph.confusion_matrix(y, y)
