"""`implementation=` on rms_norm / layer_norm / dyt / seed_norm / fused add."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import pallas_kernels.norms as pk
from jaxnorm import _dispatch, fused_norms, norms
from tests import helpers
from tests.pallas_kernels import _common as c


def _args(name, key):
  x = jax.random.normal(key, (6, 32), jnp.float32) + 0.5
  p = jnp.linspace(0.5, 1.5, 32)
  return {
    "rms_norm": (norms.rms_norm, (x, p), {}),
    "layer_norm": (norms.layer_norm, (x, p, p * 0.1), {}),
    "dyt": (norms.dyt, (x, jnp.array(0.5), p, p), {}),
    "seed_norm": (norms.seed_norm, (x, p, p, p * 0.01), {"num_heads": 2}),
    "add_rms_norm": (fused_norms.add_rms_norm, (x, x * 0.5, p), {}),
    "add_layer_norm": (fused_norms.add_layer_norm, (x, x * 0.5, p, p), {}),
  }[name]


NAMES = [
  "rms_norm",
  "layer_norm",
  "dyt",
  "seed_norm",
  "add_rms_norm",
  "add_layer_norm",
]


@pytest.mark.parametrize("name", NAMES)
def test_none_is_the_reference_on_cpu(name, key):
  fn, args, kw = _args(name, key)
  got = jax.jit(lambda *a: fn(*a, **kw))(*args)
  want = jax.jit(lambda *a: fn(*a, implementation="xla", **kw))(*args)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("name", NAMES)
def test_pallas_on_cpu_raises_naming_the_case(name, key):
  fn, args, kw = _args(name, key)
  with pytest.raises(
    NotImplementedError,
    match=rf"{name}\(implementation='pallas'\): {name}_pallas: no compiled "
    r"Pallas lowering for backend 'cpu'",
  ):
    fn(*args, implementation="pallas", **kw)
  with pytest.raises(ValueError, match="implementation must be one of"):
    fn(*args, implementation="triton", **kw)


@pytest.fixture
def fake_gpu(monkeypatch):
  """Dispatch sees a GPU; kernels run interpreted and record their calls."""
  calls = []
  c.fake_target(monkeypatch)
  for name in NAMES:
    kernel = getattr(pk, f"{name}_pallas")

    def wrapped(*a, _kernel=kernel, _name=name, **kw):
      calls.append(_name)
      return _kernel(*a, interpret=True, **kw)

    monkeypatch.setattr(pk, f"{name}_pallas", wrapped)
  return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_none_picks_the_kernel_on_an_accelerator(fake_gpu, name, key):
  fn, args, kw = _args(name, key)
  got = fn(*args, **kw)
  assert fake_gpu == [name]
  want = fn(*args, implementation="xla", **kw)
  helpers.assert_close(got, want, atol=1e-5, rtol=1e-5)
  grads = jax.grad(
    lambda *a: sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(fn(*a, **kw))),
    argnums=tuple(range(len(args))),
  )(*args)
  grads_ref = jax.grad(
    lambda *a: sum(
      jnp.sum(jnp.sin(o))
      for o in jax.tree.leaves(fn(*a, implementation="xla", **kw))
    ),
    argnums=tuple(range(len(args))),
  )(*args)
  helpers.assert_close(grads, grads_ref, atol=1e-4, rtol=1e-5)


def test_unsupported_case_falls_back_or_raises(fake_gpu, key):
  x = jax.random.normal(key, (32, 6), jnp.float32)
  s = jnp.ones((32,))
  y = norms.rms_norm(x, s, axis=0)  # not the trailing axis
  assert fake_gpu == ["rms_norm"]
  helpers.assert_close(
    y, norms.rms_norm(x, s, axis=0, implementation="xla"), atol=0.0
  )
  with pytest.raises(
    NotImplementedError,
    match=r"rms_norm\(implementation='pallas'\): .*trailing",
  ):
    norms.rms_norm(x, s, axis=0, implementation="pallas")
  wide = jnp.ones((2, 2, 130))
  p = jnp.ones((130,))
  with pytest.raises(NotImplementedError, match="at most 64 heads"):
    norms.seed_norm(wide, p, p, p, num_heads=65, implementation="pallas")
  helpers.assert_close(
    norms.seed_norm(wide, p, p, p, num_heads=65),
    norms.seed_norm(wide, p, p, p, num_heads=65, implementation="xla"),
    atol=0.0,
  )


def test_jaxnorm_imports_pallas_kernels_lazily():
  code = (
    "import sys, jaxnorm.norms, jaxnorm.fused_norms; "
    "assert 'pallas_kernels' not in sys.modules, 'eager import'"
  )
  subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
def test_modules_forward_implementation(cls, fake_gpu, key):
  from flax import nnx

  from jaxnorm import nn as jnn

  module_cls = getattr(jnn, cls)
  x = jax.random.normal(key, (4, 32), jnp.float32)
  default = module_cls(32, rngs=nnx.Rngs(0))
  xla = module_cls(32, implementation="xla", rngs=nnx.Rngs(0))
  y = default(x)
  assert fake_gpu == [{"RMSNorm": "rms_norm", "LayerNorm": "layer_norm"}[cls]]
  helpers.assert_close(y, xla(x), atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="implementation must be one of"):
    module_cls(32, implementation="cuda", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
def test_modules_pallas_on_cpu_raises(cls):
  from flax import nnx

  from jaxnorm import nn as jnn

  module = getattr(jnn, cls)(16, implementation="pallas", rngs=nnx.Rngs(0))
  with pytest.raises(NotImplementedError, match="backend 'cpu'"):
    module(jnp.ones((2, 16)))


# --- attention: the kernel table reaches pallas_kernels.attention and
# pallas_kernels.linear_attention -------------------------------------------

ATTENTION = [
  "dot_product_attention",
  "sink_attention",
  "affine_scaled_attention",
  "causal_linear_attention",
]


def _attention_args(name, key):
  from jaxnorm import attention

  kq, kk, kv = jax.random.split(key, 3)
  q = jax.random.normal(kq, (2, 8, 4, 16), jnp.float32)
  k = jax.random.normal(kk, (2, 8, 2, 16), jnp.float32)
  v = jax.random.normal(kv, (2, 8, 2, 16), jnp.float32)
  kw = {
    "dot_product_attention": {"is_causal": True},
    "sink_attention": {"is_causal": True, "sinks": jnp.linspace(-1, 1, 4)},
    "affine_scaled_attention": {
      "is_causal": True,
      "alpha": jax.random.uniform(key, (2, 8, 4)),
      "alpha_ma": jnp.full((4,), 0.3),
      "training": True,
    },
    "causal_linear_attention": {"chunk_size": 4},
  }[name]
  return getattr(attention, name), (q, k, v), kw


def _record_attention_kernels(monkeypatch):
  """Interpreted attention kernels that record their calls."""
  import pallas_kernels.attention as pa
  import pallas_kernels.linear_attention as pla

  calls = []
  for name in ATTENTION:
    module = pla if name == "causal_linear_attention" else pa
    kernel = getattr(module, f"{name}_pallas")

    def wrapped(*a, _kernel=kernel, _name=name, **kw):
      calls.append(_name)
      return _kernel(*a, interpret=pltpu.InterpretParams(), **kw)

    monkeypatch.setattr(module, f"{name}_pallas", wrapped)
  return calls


@pytest.fixture
def attention_kernels(monkeypatch):
  """Dispatch sees a CPU; the attention kernels run interpreted."""
  return _record_attention_kernels(monkeypatch)


@pytest.fixture
def attention_gpu(monkeypatch):
  """Dispatch sees a GPU; the attention kernels run interpreted."""
  c.fake_target(monkeypatch)
  return _record_attention_kernels(monkeypatch)


def _loss(fn, kw):
  def loss(*a):
    return sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(fn(*a, **kw)))

  return loss


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_none_is_the_reference_on_cpu(name, key, attention_kernels):
  fn, args, kw = _attention_args(name, key)
  got = fn(*args, **kw)
  assert attention_kernels == []
  want = fn(*args, implementation="xla", **kw)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.slow
@pytest.mark.parametrize("name", ATTENTION)
def test_attention_pallas_runs_the_interpreted_kernel(
  name, key, attention_kernels
):
  fn, args, kw = _attention_args(name, key)
  got = fn(*args, implementation="pallas", **kw)
  assert attention_kernels == [name]
  want = fn(*args, implementation="xla", **kw)
  helpers.assert_close(got, want, atol=2e-5, rtol=1e-5)
  grads = jax.grad(_loss(fn, dict(kw, implementation="pallas")), (0, 1, 2))(
    *args
  )
  grads_ref = jax.grad(_loss(fn, dict(kw, implementation="xla")), (0, 1, 2))(
    *args
  )
  helpers.assert_close(grads, grads_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_pallas_on_cpu_raises_and_unknown_lists_choices(name, key):
  fn, args, kw = _attention_args(name, key)
  with pytest.raises(
    NotImplementedError,
    match=rf"{name}\(implementation='pallas'\): {name}_pallas: no compiled "
    r"Pallas lowering for backend 'cpu'",
  ):
    fn(*args, implementation="pallas", **kw)
  with pytest.raises(
    ValueError,
    match=r"implementation must be one of None, 'xla', 'pallas'; got 'triton'",
  ):
    fn(*args, implementation="triton", **kw)


def test_attention_none_picks_the_kernel_or_falls_back(attention_gpu, key):
  from jaxnorm import attention

  fn, (q, k, v), kw = _attention_args("dot_product_attention", key)
  helpers.assert_close(
    fn(q, k, v, **kw), fn(q, k, v, implementation="xla", **kw), atol=2e-5
  )
  assert attention_gpu == ["dot_product_attention"]
  # A local window runs in the kernel as a boolean mask.
  got = fn(q, k, v, local_window_size=(2, 1))
  assert attention_gpu[-1] == "dot_product_attention"
  helpers.assert_close(
    got,
    jax.nn.dot_product_attention(q, k, v, local_window_size=(2, 1)),
    atol=2e-5,
  )
  # Cases the kernel lacks fall back under None and raise under "pallas".
  bias = jnp.zeros((1, 4, 8, 8))
  for extra, match in (
    ({"bias": bias}, "no additive bias"),
    ({"logits_soft_cap": 5.0}, "no logits_soft_cap"),
  ):
    helpers.assert_close(
      fn(q, k, v, **extra),
      fn(q, k, v, implementation="xla", **extra),
      atol=0.0,
    )
    with pytest.raises(NotImplementedError, match=match):
      fn(q, k, v, implementation="pallas", **extra)
  lin = attention.causal_linear_attention
  helpers.assert_close(
    lin(q, k, v, algorithm="quadratic"),
    lin(q, k, v, algorithm="quadratic", implementation="xla"),
    atol=0.0,
  )
  with pytest.raises(NotImplementedError, match="algorithm='chunked' only"):
    lin(q, k, v, algorithm="quadratic", implementation="pallas")
  with pytest.raises(NotImplementedError, match="batched"):
    lin(q[0], k[0], v[0], implementation="pallas")
  with pytest.raises(ValueError, match=r"switch is algorithm='quadratic'"):
    lin(q, k, v, implementation="quadratic")


def test_kernel_table_is_complete_and_typed():
  import importlib
  import typing

  named = set(typing.get_args(_dispatch.KernelName))
  listed = [
    k for spec in _dispatch.KERNEL_FAMILIES.values() for k in spec.kernels
  ]
  assert sorted(listed) == sorted(named)
  for family, spec in _dispatch.KERNEL_FAMILIES.items():
    module = importlib.import_module(spec.module)
    for kernel in spec.kernels:
      assert callable(getattr(module, kernel)), (family, kernel)
      assert _dispatch.family_of(kernel) == family
  with pytest.raises(ValueError, match="is in no family"):
    _dispatch.family_of("flash_pallas")


def test_jaxnorm_attention_imports_pallas_kernels_lazily():
  code = (
    "import sys, jaxnorm.attention; "
    "assert 'pallas_kernels' not in sys.modules, 'eager import'"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
