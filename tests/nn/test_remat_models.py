"""Rematerialization of the graph, complex LM and CV-CNN models.

``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs each layer of the stack
(`GraphTransformerLayer`, `ComplexBlock`, a CV-CNN stage) under a
`jax.checkpoint` policy at call time. Oracles: the model with
``remat="none"``, whose outputs, parameter gradients and updated state
(BatchNorm statistics, dropout counters) every policy must reproduce; its
state paths, shapes and dtypes, which no policy may change (checkpoints
restore across ``remat``, checked for every registered model in
``tests/nn/test_model_registry.py``); and the residuals the backward pass
keeps, which ``"full"`` must shrink.
"""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import graph
from jaxnorm.nn import cplx as ncplx
from jaxnorm.nn import graph as nn_graph
from jaxnorm.nn import layers
from tests import helpers

POLICIES = ("full", "dots", "dots_no_batch")

_GRAPH = nn_graph.GraphTransformerConfig(
  num_classes=3,
  vocab_size=4,
  width=8,
  depth=2,
  num_heads=2,
  pe_dim=2,
  logit_clip=5.0,
  readout_layers=1,
)
_CLM = ncplx.ComplexLMConfig(
  vocab_size=17, width=8, depth=2, num_heads=2, max_len=8, ffn_ratio=2
)
_CVCNN = ncplx.CVCNNConfig(num_classes=3, image_shape=(8, 8, 1), widths=(4, 8))

# name -> (config, model class); `_inputs` builds the call's arguments.
# Training mode but for ``cvcnn_eval``: BatchNorm takes batch statistics and
# updates its running ones inside the rematerialized layers.
CASES = {
  # BatchNorm over the real nodes, Laplacian encodings, dropout (the
  # layers' own dropout streams advance inside the checkpoint).
  "graph": (
    dataclasses.replace(_GRAPH, dropout=0.2),
    nn_graph.GraphTransformer,
  ),
  # The edge stream (a second carry), LayerNorm, all-pairs attention.
  "graph_edge": (
    dataclasses.replace(
      _GRAPH, norm="layernorm", graph="full", edge_features=True, pe="none"
    ),
    nn_graph.GraphTransformer,
  ),
  "clm": (_CLM, ncplx.ComplexLM),
  # Fourier mixing (no attention module), ModReLU and the real readout.
  "clm_fourier": (
    dataclasses.replace(
      _CLM,
      attention=ncplx.FOURIER,
      activation="modrelu",
      readout="real",
      cnet_gelu=False,
    ),
    ncplx.ComplexLM,
  ),
  "cvcnn": (_CVCNN, ncplx.CVCNN),
  # Running averages: a Python flag the stage closes over.
  "cvcnn_eval": (
    dataclasses.replace(_CVCNN, input="pairs", image_shape=(8, 8, 2)),
    ncplx.CVCNN,
  ),
}
FAST = {("cvcnn", "dots_no_batch")}


def _graph_batch(batch=2, n=5):
  rng = np.random.default_rng(0)
  sizes = [n - i % 2 for i in range(batch)]  # a padded node every other
  adj = np.zeros((batch, n, n), bool)
  mask = np.zeros((batch, n), bool)
  feats = np.zeros((batch, n), np.int32)
  for i, s in enumerate(sizes):
    upper = np.triu(rng.random((s, s)) < 0.6, 1)
    adj[i, :s, :s] = upper | upper.T
    mask[i, :s] = True
    feats[i, :s] = rng.integers(0, 4, s)
  pe = graph.laplacian_pe(adj, 2, node_mask=mask)
  return jnp.asarray(feats), jnp.asarray(adj), jnp.asarray(mask), pe


def _inputs(name, batch=2):
  """The positional and keyword arguments of the model's call."""
  config = CASES[name][0]
  if name.startswith("graph"):
    feats, adj, mask, pe = _graph_batch(batch)
    return (feats, adj, mask, None if config.pe == "none" else pe), {}
  if name.startswith("clm"):
    return (jax.random.randint(jax.random.key(3), (batch, 8), 0, 17),), {}
  x = jax.random.normal(jax.random.key(4), (batch, *config.image_shape))
  kwargs = {"use_running_average": True} if name == "cvcnn_eval" else {}
  return (x,), kwargs


def _model(name, remat, *, abstract=False):
  config, cls = CASES[name]
  config = dataclasses.replace(config, remat=remat)
  build = lambda: cls(config, rngs=nnx.Rngs(0))  # noqa: E731
  return nnx.eval_shape(build) if abstract else build()


def _comparable(tree):
  """``tree`` with PRNG keys as their raw data (for `helpers.assert_close`)."""
  return jax.tree.map(
    lambda x: (
      jax.random.key_data(x)
      if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
      else x
    ),
    tree,
  )


@functools.cache
def _run(name, remat):
  """Jitted outputs, parameter gradients and the state after the call."""
  model = _model(name, remat)
  args, kwargs = _inputs(name)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(params, rest):
    model = nnx.merge(graphdef, params, rest, copy=True)
    out = model(*args, **kwargs)
    cotangent = jax.random.normal(jax.random.key(5), out.shape, out.dtype)
    return jnp.sum(out * cotangent), (out, nnx.split(model, nnx.Param, ...)[2])

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, (out, new_rest)), grads = step(params, rest)
  return out, grads, _comparable(new_rest)


def _assert_close(actual, expected):
  """Leaves equal to 1e-5 of their largest entry (at least 1e-5).

  Float32 round-off scales with a leaf's magnitude: the complex LM's Born
  logits give parameter gradients near 60, whose reordered sums differ by
  a few 1e-5 wherever the entry itself is small.
  """
  chex.assert_trees_all_equal_structs(actual, expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    scale = max(1.0, float(np.max(np.abs(e), initial=0.0)))
    helpers.assert_close(a, e, atol=1e-5 * scale, rtol=1e-5)


@pytest.mark.parametrize(
  ("name", "remat"),
  [
    (n, r) if (n, r) in FAST else pytest.param(n, r, marks=pytest.mark.slow)
    for n in CASES
    for r in POLICIES
  ],
)
def test_remat_keeps_outputs_gradients_and_state(name, remat):
  want, want_grads, want_rest = _run(name, "none")
  got, grads, rest = _run(name, remat)
  # XLA fuses the rematerialized program differently: round-off only.
  _assert_close(got, want)
  _assert_close(grads, want_grads)
  # BatchNorm statistics and dropout counters come out of the checkpoint.
  _assert_close(rest, want_rest)


def _saved_bytes(name, remat, batch):
  """Bytes of the residuals ``jax.vjp`` keeps for the backward pass."""
  model = _model(name, remat, abstract=True)
  args, kwargs = _inputs(name, batch)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def residuals(params, rest):
    def fn(p):
      return nnx.merge(graphdef, p, rest, copy=True)(*args, **kwargs)

    return jax.tree.leaves(jax.vjp(fn, params)[1])

  return sum(
    int(np.prod(r.shape)) * r.dtype.itemsize
    for r in jax.eval_shape(residuals, params, rest)
  )


@pytest.mark.parametrize(
  "name", [pytest.param("graph", marks=pytest.mark.slow), "clm", "cvcnn"]
)
def test_full_remat_saves_fewer_residuals(name):
  # A batch of 16: activations, not parameters, dominate what is saved.
  none, full = (_saved_bytes(name, r, 16) for r in ("none", "full"))
  assert full < none, (full, none)


@pytest.mark.parametrize(
  ("name", "who"),
  [("graph", "GraphTransformer"), ("clm", "ComplexLM"), ("cvcnn", "CVCNN")],
)
def test_bad_remat_is_refused(name, who):
  valid = ", ".join(repr(r) for r in layers.REMAT_CHOICES)
  with pytest.raises(
    ValueError,
    match=rf"^{who}: remat must be one of {valid}; got 'sometimes'$",
  ):
    _model(name, "sometimes")
