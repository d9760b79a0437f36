"""Tests of `jaxnorm.nn.graph`: the Graph Transformer from named parts.

Oracles: permutation equivariance and padding invariance of the node logits
(in training mode, so BatchNorm's statistics must ignore padded nodes and
edges); the layer against the pure functions called with its parameters;
the full-graph variant against the sparse one on complete graphs.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnorm import graph, norms
from jaxnorm.nn import graph as nn_graph
from tests import helpers

_BASE = nn_graph.GraphTransformerConfig(
  num_classes=3,
  vocab_size=4,
  width=8,
  depth=2,
  num_heads=2,
  pe_dim=2,
  logit_clip=5.0,
)


def _batch(seed=0, sizes=(5, 7), n=8):
  rng = np.random.default_rng(seed)
  b = len(sizes)
  adj = np.zeros((b, n, n), bool)
  mask = np.zeros((b, n), bool)
  feats = np.zeros((b, n), np.int32)
  for i, s in enumerate(sizes):
    upper = np.triu(rng.random((s, s)) < 0.5, 1)
    adj[i, :s, :s] = upper | upper.T
    mask[i, :s] = True
    feats[i, :s] = rng.integers(0, 4, s)
  pe = np.asarray(graph.laplacian_pe(adj, 2, node_mask=mask))
  return feats, adj, mask, pe


def _pad(batch, extra):
  feats, adj, mask, pe = batch
  n = feats.shape[1]
  rng = np.random.default_rng(9)
  feats = np.pad(feats, ((0, 0), (0, extra)))
  feats[:, n:] = rng.integers(0, 4, feats[:, n:].shape)  # garbage in pads
  return (
    feats,
    np.pad(adj, ((0, 0), (0, extra), (0, extra))),
    np.pad(mask, ((0, 0), (0, extra))),
    np.pad(pe, ((0, 0), (0, extra), (0, 0)), constant_values=3.0),
  )


_CONFIGS = {
  "bn": _BASE,
  "ln": dataclasses.replace(_BASE, norm="layernorm"),
  "full": dataclasses.replace(_BASE, graph="full"),
  "nope": dataclasses.replace(_BASE, pe="none"),
  "edge": dataclasses.replace(_BASE, edge_features=True),
}


@nnx.jit
def _logits(model, batch):
  feats, adj, mask, pe = batch
  pe = None if model.config.pe == "none" else pe
  return model(feats, adj, mask, pe)


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_padding_invariance_in_training(name):
  """Extra padded nodes (with garbage) change nothing, BN state included."""
  cfg = _CONFIGS[name]
  model = nn_graph.GraphTransformer(cfg, rngs=nnx.Rngs(0))
  twin = nnx.clone(model)
  batch = _batch()
  out = _logits(model, batch)
  padded = _logits(twin, _pad(batch, 4))
  mask = batch[2]
  helpers.assert_close(
    np.asarray(padded)[:, :8][mask], np.asarray(out)[mask], atol=2e-5
  )
  helpers.assert_close(
    nnx.state(twin, nnx.BatchStat), nnx.state(model, nnx.BatchStat), atol=1e-5
  )


@pytest.mark.parametrize("name", ["bn", "edge"])
def test_permutation_equivariance(name):
  model = nn_graph.GraphTransformer(_CONFIGS[name], rngs=nnx.Rngs(1))
  model.eval()
  feats, adj, mask, pe = _batch(1, sizes=(8, 8))
  perm = np.random.default_rng(2).permutation(8)
  out = _logits(model, (feats, adj, mask, pe))
  permuted = _logits(
    model,
    (feats[:, perm], adj[:, perm][:, :, perm], mask[:, perm], pe[:, perm]),
  )
  helpers.assert_close(permuted, np.asarray(out)[:, perm], atol=2e-5)


def test_full_graph_is_sparse_on_complete_graphs():
  sparse = nn_graph.GraphTransformer(_BASE, rngs=nnx.Rngs(3))
  full = nn_graph.GraphTransformer(_CONFIGS["full"], rngs=nnx.Rngs(3))
  feats, _, mask, pe = _batch(2)
  complete = mask[:, :, None] & mask[:, None, :] & ~np.eye(8, dtype=bool)
  helpers.assert_close(
    _logits(full, (feats, np.zeros_like(complete), mask, pe))[mask],
    _logits(sparse, (feats, complete, mask, pe))[mask],
    atol=1e-5,
  )


def test_layer_matches_pure_functions():
  """A layer equals the pure functions called with its parameters."""
  cfg = _CONFIGS["bn"]
  layer = nn_graph.GraphTransformerLayer(
    cfg, dtype=jnp.float32, rngs=nnx.Rngs(4)
  )
  feats, adj, mask, _ = _batch(3)
  h = jax.random.normal(jax.random.key(5), (2, 8, 8))
  out, _ = layer(h, None, jnp.asarray(adj), jnp.asarray(mask))

  def dense(m, x):
    y = x @ m.kernel[...]
    return y if m.bias is None else y + m.bias[...][None, None]

  def bn(norm, x):
    state = norms.init_batch_norm_state(8)
    y, _ = norms.batch_norm(
      x,
      norm.norm.scale[...],
      norm.norm.bias[...],
      state,
      training=True,
      momentum=0.9,
      mask=jnp.asarray(mask),
    )
    return y

  def split(x):
    return x.reshape(2, 8, 2, 4)

  att = graph.graph_attention(
    split(dense(layer.query, h)),
    split(dense(layer.key, h)),
    split(dense(layer.value, h)),
    jnp.asarray(adj),
    logit_clip=5.0,
  ).reshape(2, 8, 8)
  s = layer.h
  y = bn(s.norm1, h + dense(s.out, att))
  ffn = dense(s.ffn.down, jax.nn.relu(dense(s.ffn.up, y)))
  expected = bn(s.norm2, y + ffn)
  helpers.assert_close(out[mask], expected[mask], atol=1e-5)
  # the running statistics moved towards the masked batch statistics
  assert float(jnp.max(jnp.abs(s.norm1.norm.mean[...]))) > 0


def test_train_step_reduces_weighted_loss():
  model = nn_graph.GraphTransformer(_BASE, rngs=nnx.Rngs(6))
  feats, adj, mask, pe = _batch(4)
  labels = (feats % 3).astype(np.int32)
  opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, opt):
    def loss_fn(model):
      logits = model(feats, adj, mask, pe)
      return graph.class_balanced_cross_entropy(logits, labels, node_mask=mask)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  with jax.numpy_dtype_promotion("standard"):  # optax's own Adam
    losses = [float(step(model, opt)) for _ in range(30)]
  assert losses[-1] < 0.7 * losses[0]


def test_graph_norms_from_specs():
  valid = nn_graph.graph_norms()
  assert "batchnorm" in valid and "layernorm" in valid
  assert "instancenorm" not in valid and "powernorm" not in valid


def test_errors():
  who = "GraphTransformerConfig"
  with pytest.raises(ValueError, match=f"{who}: norm 'instancenorm' cannot"):
    dataclasses.replace(_BASE, norm="instancenorm")
  with pytest.raises(ValueError, match=f"{who}: graph must be one of"):
    dataclasses.replace(_BASE, graph="dense")
  with pytest.raises(ValueError, match=f"{who}: pe must be one of"):
    dataclasses.replace(_BASE, pe="rwpe")
  with pytest.raises(ValueError, match=f"{who}: width=8 must be divisible"):
    dataclasses.replace(_BASE, num_heads=3)
  with pytest.raises(ValueError, match=f"{who}: width=8 is too narrow"):
    dataclasses.replace(_BASE, readout_layers=4)
  with pytest.raises(ValueError, match=f"{who}: dropout must be in"):
    dataclasses.replace(_BASE, dropout=1.0)
  with pytest.raises(ValueError, match=f"{who}: depth must be a positive"):
    dataclasses.replace(_BASE, depth=0)
  model = nn_graph.GraphTransformer(_BASE, rngs=nnx.Rngs(0))
  feats, adj, mask, _ = _batch()
  with pytest.raises(ValueError, match="GraphTransformer: pe='lap' needs"):
    model(feats, adj, mask)
  nope = nn_graph.GraphTransformer(_CONFIGS["nope"], rngs=nnx.Rngs(0))
  pe = np.ones((2, 8, 2), np.float32)
  helpers.assert_close(  # encodings are ignored without pe="lap"
    nope(feats, adj, mask, pe), nope(feats, adj, mask), atol=0.0
  )


def test_rngs_flip_the_encodings_signs():
  model = nn_graph.GraphTransformer(_CONFIGS["ln"], rngs=nnx.Rngs(7))
  feats, adj, mask, pe = _batch(5)
  key = jax.random.key(8)
  flipped = graph.random_sign_flip(jnp.asarray(pe), key)
  helpers.assert_close(
    model(feats, adj, mask, pe, rngs=key),
    model(feats, adj, mask, flipped),
    atol=1e-6,
  )
