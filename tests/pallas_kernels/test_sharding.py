"""Kernels inside `shard_map` on a (data, tensor) mesh of 4 CPU devices.

Explicitly through `shard_rows` / `shard_heads`, and automatically: under
`jax.set_mesh` a row kernel (called directly or by `implementation=`
dispatch) wraps itself in `shard_rows`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from jaxnorm import fused_norms, norms
from jaxnorm import sharding as jsharding
from pallas_kernels import norms as pk
from pallas_kernels import sharding as psharding
from tests import helpers
from tests.pallas_kernels import _common as c

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
pytestmark = pytest.mark.slow

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


@pytest.mark.parametrize("lw", c.LOWERINGS)
@pytest.mark.parametrize("name", ["rms", "layer", "add_rms", "dyt", "seed"])
def test_sharded_kernel_matches_unsharded_reference(mesh, lw, name, key):
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
  fn = psharding.shard_rows(kernel, mesh, ROWS, num_row_args=nrow, **lw, **kw)
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


def _explicit_mesh():
  return jax.make_mesh(
    (2, 2), ("data", "tensor"), axis_types=(AxisType.Explicit,) * 2
  )


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "auto"])
def test_kernels_shard_themselves_on_a_context_mesh(explicit, key):
  # Under jax.set_mesh the kernel runs inside shard_map (a Pallas call
  # cannot be partitioned): rows split as the input is (explicit axes) or
  # each mesh axis over the first leading axis it divides (auto axes).
  m = (
    _explicit_mesh()
    if explicit
    else jsharding.make_mesh((2, 2), ("data", "tensor"))
  )
  x0, (s, b) = c.inputs(key, (4, 16, 32), jnp.float32, 2)
  x = jax.device_put(x0, jax.NamedSharding(m, ROWS))
  fn = jax.jit(lambda x, s, b: pk.layer_norm_pallas(x, s, b, interpret=True))
  with jax.set_mesh(m):
    assert "shard_map" in str(jax.make_jaxpr(fn)(x, s, b))
    out = fn(x, s, b)
    (_, grads) = _loss_and_grads(fn, (x, s, b))
  (_, grads_ref) = _loss_and_grads(norms.layer_norm, (x, s, b))
  helpers.assert_close(out, norms.layer_norm(x, s, b), atol=1e-5, rtol=1e-5)
  helpers.assert_close(grads, grads_ref, atol=1e-4, rtol=1e-5)
  # Without a context mesh, an unsharded input runs the kernel directly, and
  # a sharded one runs it on its own mesh.
  assert "shard_map" not in str(jax.make_jaxpr(fn)(x0, s, b))
  assert "shard_map" in str(jax.make_jaxpr(fn)(x, s, b))


def test_dispatch_on_a_mesh_runs_the_sharded_kernel(monkeypatch, key):
  # implementation=None on an accelerator (faked: interpreted kernels) goes
  # through the self-sharding kernel.
  c.fake_target(monkeypatch)
  kernel = pk.add_rms_norm_pallas
  monkeypatch.setattr(
    pk,
    "add_rms_norm_pallas",
    lambda *a, **kw: kernel(*a, interpret=True, **kw),
  )
  m = _explicit_mesh()
  x, (s,) = c.inputs(key, (4, 16, 32), jnp.float32, 1)
  x = jax.device_put(x, jax.NamedSharding(m, ROWS))
  fn = jax.jit(lambda x, s: fused_norms.add_rms_norm(x, x * 0.5, s))
  with jax.set_mesh(m):
    assert "shard_map" in str(jax.make_jaxpr(fn)(x, s))
    h, y = fn(x, s)
  hr, yr = fused_norms.add_rms_norm(x, x * 0.5, s, implementation="xla")
  helpers.assert_close((h, y), (hr, yr), atol=1e-5, rtol=1e-5)


def test_sharded_feature_axis_is_not_implemented(key):
  m = _explicit_mesh()
  x, _ = c.inputs(key, (4, 64), jnp.float32, 0)
  x = jax.device_put(x, jax.NamedSharding(m, P("data", "tensor")))
  with (
    jax.set_mesh(m),
    pytest.raises(NotImplementedError, match="sharded along a normalized axis"),
  ):
    pk.rms_norm_pallas(x, interpret=True)


def test_shard_rows_errors(mesh):
  with pytest.raises(ValueError, match="trailing axes must be unsharded"):
    psharding.shard_rows(pk.rms_norm_pallas, mesh, P("data", "tensor"))
  with pytest.raises(ValueError, match=r"names axes \['model'\]"):
    psharding.shard_rows(pk.rms_norm_pallas, mesh, P("model", None))
  fn = psharding.shard_rows(pk.rms_norm_pallas, mesh, ROWS, interpret=True)
  with pytest.raises(ValueError, match="row_spec has 3 entries"):
    fn(jnp.ones((4, 32)))


# The attention kernels' own lowerings: Triton semantics in the generic
# interpreter and Mosaic TPU in the TPU interpreter.
ATTENTION_INTERPRETERS = [
  pytest.param(c.TRITON, id="triton", marks=c.TRITON_SKIP),
  pytest.param({"interpret": pltpu.InterpretParams()}, id="mtpu"),
]


@pytest.mark.parametrize("lowering", ATTENTION_INTERPRETERS)
@pytest.mark.parametrize("kind", ["sink", "linear"])
def test_sharded_attention_matches_reference(mesh, lowering, kind, key):
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
      pa.sink_attention_pallas, mesh, is_causal=True, **lowering
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
      **lowering,
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


def test_heads_plan_splits_batch_then_heads():
  mesh = jsharding.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
  q, k = jnp.zeros((4, 8, 4, 16)), jnp.zeros((4, 8, 2, 16))
  with jax.set_mesh(mesh):
    # The batch of 4 takes data and fsdp, the 2 key heads take tensor.
    assert psharding.heads_plan(q, k)[1:] == (("data", "fsdp"), ("tensor",))
    # An odd batch stays whole: data takes the 2 key heads, and fsdp and
    # tensor, dividing neither, replicate the work.
    assert psharding.heads_plan(q[:3], k[:3])[1:] == (None, ("data",))
    assert psharding.heads_plan(q[0], k[0]) is None  # unbatched
  assert psharding.heads_plan(q, k) is None  # no mesh


@pytest.mark.parametrize("kind", ["sink", "linear"])
def test_kernels_run_per_device_on_the_context_mesh(kind, key):
  # implementation=None dispatch calls the kernels as is; on a mesh they
  # split themselves over it (a Pallas call cannot be partitioned by XLA).
  from jaxnorm import attention as ref
  from pallas_kernels import attention as pa
  from pallas_kernels import linear_attention as pla

  mesh = jsharding.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
  ks = jax.random.split(key, 4)
  q = jax.random.normal(ks[0], (2, 24, 4, 16))
  k = jax.random.normal(ks[1], (2, 24, 2, 16))
  v = jax.random.normal(ks[2], (2, 24, 2, 16))
  lowering = {"interpret": pltpu.InterpretParams()}
  if kind == "sink":
    mask = jax.random.bernoulli(ks[3], 0.8, (2, 1, 24, 24))
    sinks = jnp.array([0.1, -0.5, 1.0, 0.0])
    kern = lambda q, k, v: pa.sink_attention_pallas(
      q, k, v, None, mask, sinks=sinks, is_causal=True, **lowering
    )
    want = ref.sink_attention(q, k, v, mask=mask, sinks=sinks, is_causal=True)
  else:
    kern = lambda q, k, v: pla.causal_linear_attention_pallas(
      q, k, v, chunk_size=8, **lowering
    )
    want = ref.causal_linear_attention(q, k, v)
  with jax.set_mesh(mesh):
    out = jax.jit(kern)(q, k, v)
  helpers.assert_close(out, want, atol=2e-5, rtol=1e-5)


def test_affine_scaled_kernel_refuses_a_mesh():
  from pallas_kernels import attention as pa

  mesh = jsharding.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
  q = jnp.ones((2, 8, 2, 16))
  with (
    jax.set_mesh(mesh),
    pytest.raises(NotImplementedError, match=r"not on a device mesh"),
  ):
    pa.affine_scaled_attention_pallas(
      q, q, q, alpha=jnp.ones((2, 8, 2)), alpha_ma=jnp.ones(()), interpret=True
    )
