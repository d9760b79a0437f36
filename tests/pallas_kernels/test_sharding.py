"""Kernels inside `shard_map` on a (data, tensor) mesh of 4 CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from jaxnorm import fused_norms, norms
from jaxnorm import sharding as jsharding
from pallas_kernels import norms as pk
from pallas_kernels import sharding as psharding
from tests import helpers
from tests.pallas_kernels import _common as c

ROWS = P("data", "tensor", None)


@pytest.fixture(scope="module")
def mesh():
  return jsharding.make_mesh((2, 2), ("data", "tensor"))


def _loss_and_grads(fn, args):
  def loss(*a):
    out = fn(*a)
    return sum(
      jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in jax.tree.leaves(out)
    )

  return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(
    *args
  )


@pytest.mark.parametrize("interpret", c.LOWERINGS)
@pytest.mark.parametrize("name", ["rms", "layer", "add_rms", "dyt", "seed"])
def test_sharded_kernel_matches_unsharded_reference(mesh, interpret, name, key):
  x, (s, b, p) = c.inputs(key, (4, 16, 32), jnp.float32, 3)
  r, _ = c.inputs(jax.random.fold_in(key, 5), (4, 16, 32), jnp.float32, 0)
  cases = {
    "rms": (pk.rms_norm_pallas, norms.rms_norm, (x, s), 1, {}),
    "layer": (pk.layer_norm_pallas, norms.layer_norm, (x, s, b), 1, {}),
    "add_rms": (
      pk.add_rms_norm_pallas,
      lambda x, r, s: fused_norms.add_rms_norm(x, r, s),
      (x, r, s),
      2,
      {},
    ),
    "dyt": (pk.dyt_pallas, norms.dyt, (x, jnp.array(0.6), s, b), 1, {}),
    "seed": (
      pk.seed_norm_pallas,
      norms.seed_norm,
      (x, s, b, p * 0.1),
      1,
      {"num_heads": 2},
    ),
  }
  kernel, ref, args, nrow, kw = cases[name]
  fn = psharding.shard_rows(
    kernel, mesh, ROWS, num_row_args=nrow, interpret=interpret, **kw
  )
  args = tuple(
    jax.device_put(a, jax.NamedSharding(mesh, ROWS)) if a.ndim == 3 else a
    for a in args
  )
  out = jax.jit(fn)(*args)
  for o in jax.tree.leaves(out):
    assert o.sharding.spec == ROWS
  helpers.assert_close(out, ref(*args, **kw), atol=1e-5, rtol=1e-5)
  (val, grads) = _loss_and_grads(fn, args)
  (val_ref, grads_ref) = _loss_and_grads(lambda *a: ref(*a, **kw), args)
  helpers.assert_close(val, val_ref, atol=1e-3, rtol=1e-5)
  helpers.assert_close(grads, grads_ref, atol=1e-4, rtol=1e-5)


def test_shard_rows_errors(mesh):
  with pytest.raises(ValueError, match="trailing axes must be unsharded"):
    psharding.shard_rows(pk.rms_norm_pallas, mesh, P("data", "tensor"))
  with pytest.raises(ValueError, match=r"names axes \['model'\]"):
    psharding.shard_rows(pk.rms_norm_pallas, mesh, P("model", None))
  fn = psharding.shard_rows(pk.rms_norm_pallas, mesh, ROWS, interpret=True)
  with pytest.raises(ValueError, match="row_spec has 3 entries"):
    fn(jnp.ones((4, 32)))


@pytest.mark.parametrize("interpret", c.LOWERINGS)
@pytest.mark.parametrize("kind", ["sink", "linear"])
def test_sharded_attention_matches_reference(mesh, interpret, kind, key):
  from jaxnorm import attention as ref
  from pallas_kernels import attention as pa
  from pallas_kernels import linear_attention as pla

  ks = jax.random.split(key, 4)
  q = jax.random.normal(ks[0], (2, 24, 4, 16))
  k = jax.random.normal(ks[1], (2, 24, 2, 16))
  v = jax.random.normal(ks[2], (2, 24, 2, 16))
  mask = jax.random.bernoulli(ks[3], 0.8, (2, 1, 24, 24))
  sinks = jnp.array([0.1, -0.5, 1.0, 0.0])
  if kind == "sink":
    fn = psharding.shard_heads(
      pa.sink_attention_pallas, mesh, is_causal=True, interpret=interpret
    )
    kern = lambda q, k, v, s: fn(q, k, v, mask=mask, sinks=s)
    oracle = lambda q, k, v, s: ref.sink_attention(
      q, k, v, mask=mask, sinks=s, is_causal=True
    )
    args = (q, k, v, sinks)
  else:
    fn = psharding.shard_heads(
      pla.causal_linear_attention_pallas,
      mesh,
      chunk_size=8,
      interpret=interpret,
    )
    kern = lambda q, k, v: fn(q, k, v)
    oracle = lambda q, k, v: ref.causal_linear_attention(q, k, v)
    args = (q, k, v)
  out = jax.jit(kern)(*args)
  assert out.sharding.is_equivalent_to(
    jax.NamedSharding(mesh, P("data", None, "tensor", None)), 4
  )
  helpers.assert_close(out, oracle(*args), atol=2e-5, rtol=1e-5)
  (_, grads) = _loss_and_grads(kern, args)
  (_, grads_ref) = _loss_and_grads(oracle, args)
  helpers.assert_close(grads, grads_ref, atol=1e-4, rtol=1e-5)


def test_shard_heads_errors(mesh):
  from pallas_kernels import attention as pa

  with pytest.raises(ValueError, match="axis 'model' is not in"):
    psharding.shard_heads(pa.sink_attention_pallas, mesh, head_axis="model")
  fn = psharding.shard_heads(pa.sink_attention_pallas, mesh, interpret=True)
  x = jnp.ones((2, 8, 3, 16))
  with pytest.raises(ValueError, match="3 key heads must be divisible"):
    fn(x, x, x)
