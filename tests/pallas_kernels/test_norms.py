"""RMSNorm / LayerNorm kernels vs `jaxnorm.norms`, all lowerings, on CPU."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from jaxnorm import _target, aot, norms
from pallas_kernels import _rows
from pallas_kernels import norms as pk
from tests import helpers
from tests.pallas_kernels import _common as c

# Pallas kernels run in the (slow) CPU interpreter here: CI runs them (-m slow).
pytestmark = pytest.mark.slow

TPU = pltpu.InterpretParams()


@pytest.mark.parametrize(
  "lw,dtype,shape,block_rows",
  c.grid(
    c.SHAPES,
    {("bf16", "37x96"), ("f32", "3x13x128-br16"), ("f32", "5x40-br16")},
  ),
)
def test_rms_norm_matches_reference(lw, dtype, shape, block_rows, key):
  br = c.block_rows_for(lw, block_rows, dtype)
  x, (s,) = c.inputs(key, shape, dtype, 1)
  with c.unsupported(lw, shape[-1]):
    c.check_fwd_vjp(
      lambda x, s: pk.rms_norm_pallas(x, s, block_rows=br, **lw),
      lambda x, s: norms.rms_norm(x, s),
      (x, s),
      key=key,
      n=shape[-1],
      dtype=dtype,
      nrows=x.size // shape[-1],
    )


@pytest.mark.parametrize(
  "lw,dtype,shape,block_rows",
  c.grid(c.SHAPES[:2], {("f32", "37x96"), ("bf16", "3x13x128-br16")}),
)
def test_layer_norm_matches_reference(lw, dtype, shape, block_rows, key):
  br = c.block_rows_for(lw, block_rows, dtype)
  x, (s, b) = c.inputs(key, shape, dtype, 2)
  c.check_fwd_vjp(
    lambda x, s, b: pk.layer_norm_pallas(x, s, b, block_rows=br, **lw),
    lambda x, s, b: norms.layer_norm(x, s, b),
    (x, s, b),
    key=key,
    n=shape[-1],
    dtype=dtype,
    nrows=x.size // shape[-1],
  )


_OPTIONS = [
  pytest.param(dict(eps_mode="outside", eps=1e-3), id="outside"),
  pytest.param(dict(scale_offset=1.0), id="offset"),
  pytest.param(dict(eps=0.5), id="eps"),
]


@pytest.mark.parametrize(
  "lw,kwargs",
  [
    pytest.param(lw.values[0], *o.values, id=f"{lw.id}-{o.id}", marks=lw.marks)
    for lw in c.LOWERINGS
    for o in _OPTIONS
    # The Mosaic GPU kernel shares the other options' code with Triton's.
    if lw.id != "mgpu" or o.id == "outside"
  ],
)
def test_rms_norm_options(lw, kwargs, key):
  x, (s,) = c.inputs(key, (24, 64), jnp.float32, 1)
  x = x.at[3].set(0.0)  # an all-zero row: the "outside" bwd guard
  c.check_fwd_vjp(
    lambda x, s: pk.rms_norm_pallas(x, s, **lw, **kwargs),
    lambda x, s: norms.rms_norm(x, s, **kwargs),
    (x, s),
    key=key,
    n=64,
    dtype=jnp.float32,
    nrows=24,
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_no_params_and_two_trailing_axes(lw, key):
  x, _ = c.inputs(key, (6, 4, 24), jnp.float32, 0)
  for kernel, ref in (
    (pk.rms_norm_pallas, norms.rms_norm),
    (pk.layer_norm_pallas, norms.layer_norm),
  ):
    c.check_fwd_vjp(
      lambda x: kernel(x, axis=(-2, -1), scale_offset=0.5, **lw),
      lambda x: ref(x, axis=(-2, -1), scale_offset=0.5),
      (x,),
      key=key,
      n=96,
      dtype=jnp.float32,
      nrows=6,
    )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_layer_norm_scale_only_and_bias_only(lw, key):
  x, (p,) = c.inputs(key, (16, 64), jnp.float32, 1)
  c.check_fwd_vjp(
    lambda x, p: pk.layer_norm_pallas(x, p, None, **lw),
    lambda x, p: norms.layer_norm(x, p, None),
    (x, p),
    key=key,
    n=64,
    dtype=jnp.float32,
    nrows=16,
  )
  c.check_fwd_vjp(
    lambda x, p: pk.layer_norm_pallas(x, None, p, **lw),
    lambda x, p: norms.layer_norm(x, None, p),
    (x, p),
    key=key,
    n=64,
    dtype=jnp.float32,
    nrows=16,
  )


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_large_mean_layer_norm_is_two_pass(lw, key):
  # |mean| >> std: a one-pass E[x^2] - E[x]^2 would lose every digit.
  x, (s, b) = c.inputs(key, (16, 64), jnp.float32, 2, loc=1e4, scale=1.0)
  y = jax.jit(lambda x: pk.layer_norm_pallas(x, s, b, **lw))(x)
  helpers.assert_close(y, norms.layer_norm(x, s, b), atol=2e-3)


@pytest.mark.parametrize("lw", c.LOWERINGS)
def test_vmap_and_grad_under_jit(lw, key):
  x, (s,) = c.inputs(key, (3, 10, 32), jnp.float32, 1)

  def loss(fn):
    return lambda x, s: jnp.sum(jnp.sin(jax.vmap(lambda xi: fn(xi, s))(x)))

  kern = jax.jit(
    jax.grad(
      loss(lambda xi, s: pk.rms_norm_pallas(xi, s, block_rows=16, **lw)),
      argnums=(0, 1),
    )
  )
  ref = jax.grad(loss(lambda xi, s: norms.rms_norm(xi, s)), argnums=(0, 1))
  helpers.assert_close(kern(x, s), ref(x, s), atol=1e-5, rtol=1e-5)
  y = jax.vmap(
    lambda xi: pk.layer_norm_pallas(xi, s, s, **lw),
    in_axes=1,
    out_axes=1,
  )(x)
  helpers.assert_close(y, norms.layer_norm(x, s, s), atol=1e-5, rtol=1e-5)


def test_jit_matches_eager(key):
  x, (s,) = c.inputs(key, (8, 32), jnp.float32, 1)
  helpers.assert_jit_matches_eager(
    pk.rms_norm_pallas, x, s, interpret=True, atol=1e-6
  )


def test_kernel_is_sensitive_to_eps(key):
  # The comparisons above can fail: a different eps is visible at atol.
  x, (s,) = c.inputs(key, (8, 32), jnp.float32, 1, scale=0.05, loc=0.0)
  y = pk.rms_norm_pallas(x, s, eps=1e-2, interpret=True)
  with pytest.raises(AssertionError):
    helpers.assert_close(y, norms.rms_norm(x, s), **c.tol(jnp.float32, 32))


# ---------------------------------------------------------------------------
# Mosaic GPU specifics: the shifted last block and inputs under one block.


@pytest.mark.parametrize(
  "shape,block_rows",
  [
    pytest.param((5, 64), None, id="5x64-padded"),
    pytest.param((24, 64), 8, id="24x64-exact"),
    pytest.param((21, 64), 8, id="21x64-shifted"),
  ],
)
def test_mosaic_gpu_row_blocks(shape, block_rows, key):
  # Rows fewer than one block are zero-padded; an exact grid has no shift;
  # 21 rows in blocks of 8 end with a block shifted back by 3 rows, whose
  # overlap must count once in the parameter gradients.
  x, (s, b) = c.inputs(key, shape, jnp.float32, 2)
  c.check_fwd_vjp(
    lambda x, s, b: pk.layer_norm_pallas(
      x, s, b, block_rows=block_rows, interpret=True
    ),
    lambda x, s, b: norms.layer_norm(x, s, b),
    (x, s, b),
    key=key,
    n=shape[-1],
    dtype=jnp.float32,
    nrows=shape[0],
  )


# ---------------------------------------------------------------------------
# Heuristic, backend selection and errors.


def test_heuristic_tiles():
  t = _rows.norm_block_heuristic("f", "triton", 1000, 96, jnp.float32)
  assert (t.block_rows, t.block_cols, t.num_warps) == (32, 128, 4)
  t = _rows.norm_block_heuristic("f", "triton", 3, 16384, jnp.bfloat16)
  assert (t.block_rows, t.block_cols, t.num_warps) == (1, 16384, 16)
  t = _rows.norm_block_heuristic("f", "tpu", 100000, 4096, jnp.bfloat16)
  assert (t.block_rows, t.block_cols) == (64, 4096)
  t = _rows.norm_block_heuristic("f", "tpu", 100000, 128, jnp.float32)
  assert t.block_rows == 512 and t.num_blocks == 196
  t = _rows.norm_block_heuristic("f", "tpu", 20, 128, jnp.float32)
  assert t.block_rows == 20 and t.num_blocks == 1
  # Mosaic GPU: 4096 // features rows (power of two), at least the split's
  # row unit, at most the rows (in whole units).
  t = _rows.norm_block_heuristic("f", "mosaic_gpu", 1000, 96, jnp.float32)
  assert (t.block_rows, t.block_cols) == (32, 96)
  t = _rows.norm_block_heuristic("f", "mosaic_gpu", 1000, 4096, jnp.bfloat16)
  assert t.block_rows == 2
  t = _rows.norm_block_heuristic("f", "mosaic_gpu", 37, 256, jnp.float32)
  assert t.block_rows == 16 and t.num_blocks == 3
  t = _rows.norm_block_heuristic("f", "mosaic_gpu", 5, 96, jnp.float32)
  assert t.block_rows == 16


def test_tpu_tiles_follow_the_chip_and_refuse_what_cannot_fit():
  # A float32 tile is 1/16 of the chip's default scoped VMEM.
  tile = functools.partial(_rows.norm_block_heuristic, "f", "tpu", 100000)
  assert tile(4096, jnp.bfloat16, chip=aot.CHIPS["v5e"]).block_rows == 64
  assert tile(4096, jnp.bfloat16, chip=aot.CHIPS["v6e"]).block_rows == 128
  assert tile(16384, jnp.float32, chip=aot.CHIPS["v5p"]).block_rows == 16
  # 32 x 16384 float32 rows need 24 MiB: over v5e's 16 MiB, under v6e's 32.
  assert tile(16384, jnp.float32, 32, aot.CHIPS["v6e"]).block_rows == 32
  with pytest.raises(NotImplementedError, match="limit of v5e; pass a small"):
    tile(16384, jnp.float32, 32, aot.CHIPS["v5e"])
  with pytest.raises(NotImplementedError, match="fit without spilling"):
    _rows.norm_block_heuristic("f", "mosaic_gpu", 64, 4096, jnp.bfloat16, 4)


@pytest.mark.parametrize(
  "features,split",
  [
    (32, (4, 1, 4, 8)),
    (96, (4, 1, 4, 8)),
    (128, (4, 1, 1, 32)),
    (768, (2, 2, 1, 32)),
    (4096, (1, 4, 1, 32)),
  ],
)
def test_mosaic_gpu_split(features, split):
  # Lanes along columns first (128 contiguous columns per warp and row),
  # then warps; what is left spreads over rows. 4 warps x 32 lanes always.
  wr, wc, lr, lc = _rows.mosaic_gpu_split(features)
  assert (wr, wc, lr, lc) == split
  assert wr * wc == 4 and lr * lc == 32
  assert features % (wc * lc * _rows.MOSAIC_GPU_VECTOR) == 0


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (
      dict(lowering="triton", block_rows=12, block_cols=128),
      "power-of-two block_rows",
    ),
    (
      dict(lowering="triton", block_rows=8, block_cols=64),
      "must cover features",
    ),
    (dict(lowering="tpu", block_rows=12, block_cols=96), "multiple of 8"),
    (
      dict(lowering="tpu", block_rows=16, block_cols=128),
      "block_cols == features",
    ),
    (dict(lowering="tpu", block_rows=0, block_cols=96), "block_rows must"),
    (
      dict(lowering="mosaic_gpu", block_rows=8, block_cols=96),
      "multiple of 16 for features=96",
    ),
  ],
)
def test_tiling_rejects_bad_tiles(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _rows.RowTiling(rows=40, features=96, **kwargs)
  with pytest.raises(ValueError, match="rows and features"):
    _rows.RowTiling("tpu", 0, 96, 8, 96)
  with pytest.raises(ValueError, match="multiple of 32, got features=40"):
    _rows.mosaic_gpu_split(40)


@pytest.fixture
def device(monkeypatch):
  """Pretends the target is a ``platform`` device of the given capability."""

  def set_device(platform, compute_capability=None):
    target = _target.Target(platform, "fake", "test", compute_capability)
    c.fake_target(monkeypatch, target)

  return set_device


def test_backend_selection_per_device(device, monkeypatch):
  pick = lambda backend=None: _rows.row_lowering("f", False, backend)  # noqa: E731
  device("gpu", (9, 0))
  assert pick() == "mosaic_gpu"
  assert pick("mosaic_gpu") == "mosaic_gpu"
  device("gpu", (10, 0))
  assert pick() == "mosaic_gpu"
  device("tpu")
  assert pick() == pick("mosaic_tpu") == "tpu"
  with pytest.raises(NotImplementedError, match="'tpu' with backend='tr"):
    pick("triton") if _rows.triton_available() else pick("mosaic_gpu")
  device("gpu")  # ROCm reports an architecture, not a capability
  monkeypatch.setattr(_rows, "pltr", None)
  with pytest.raises(NotImplementedError, match="compute capability >= 9.0"):
    pick()
  with pytest.raises(NotImplementedError, match="no longer has"):
    pick("triton")
  with pytest.raises(NotImplementedError, match="'gpu' with backend='mosaic_t"):
    pick("mosaic_tpu")


@pytest.mark.skipif(
  not _rows.triton_available(), reason="needs the Pallas Triton lowering"
)
def test_older_gpus_get_triton(device):
  device("gpu", (8, 0))
  assert _rows.row_lowering("f", False, None) == "triton"


def test_interpreters_imply_their_backend():
  gpu_params = _rows.gpu_interpret_params()()
  assert _rows.row_lowering("f", True, None) == "mosaic_gpu"
  assert _rows.row_lowering("f", TPU, None) == "tpu"
  assert _rows.row_lowering("f", gpu_params, "mosaic_gpu") == "mosaic_gpu"
  assert _rows.row_lowering("f", True, "mosaic_tpu") == "tpu"
  assert isinstance(_rows.interpreter("tpu", True), pltpu.InterpretParams)
  assert isinstance(
    _rows.interpreter("mosaic_gpu", True), _rows.gpu_interpret_params()
  )
  with pytest.raises(ValueError, match="runs the mosaic_tpu kernel"):
    _rows.row_lowering("f", TPU, "mosaic_gpu")
  with pytest.raises(ValueError, match="runs the mosaic_gpu kernel"):
    _rows.row_lowering("f", gpu_params, "triton")
  with pytest.raises(ValueError, match="backend must be one of"):
    _rows.row_lowering("f", True, "cuda")


@pytest.mark.parametrize("fn", [pk.rms_norm_pallas, pk.layer_norm_pallas])
def test_unsupported_cases_raise_not_implemented(fn):
  x = jnp.ones((4, 16), jnp.float32)
  with pytest.raises(
    NotImplementedError, match="no compiled Pallas lowering for backend 'cpu'"
  ):
    fn(x)
  with pytest.raises(NotImplementedError, match="trailing axes only"):
    fn(x, axis=0, interpret=True)
  with pytest.raises(NotImplementedError, match="up to 16384 features"):
    fn(jnp.ones((2, 16385), jnp.float32), interpret=True)
  for wide in (4608, 4064):  # 2 rows x 4608; 16 rows x 4064
    with pytest.raises(NotImplementedError, match="at most 8192 elements"):
      fn(jnp.ones((2, wide), jnp.float32), interpret=True)
  with pytest.raises(NotImplementedError, match="multiple of 32"):
    fn(x, interpret=True)
  with pytest.raises(NotImplementedError, match="tpu kernel supports"):
    fn(x.astype(jnp.float16), interpret=TPU)
  with pytest.raises(NotImplementedError, match="non-empty input"):
    fn(jnp.ones((0, 16), jnp.float32), interpret=True)


@pytest.mark.parametrize("fn", [pk.rms_norm_pallas, pk.layer_norm_pallas])
def test_invalid_inputs_raise(fn):
  x = jnp.ones((40, 96), jnp.float32)
  with pytest.raises(TypeError, match="floating dtype"):
    fn(jnp.ones((4, 16), jnp.int32), interpret=True)
  with pytest.raises(ValueError, match=r"scale must have shape \(96,\)"):
    fn(x, jnp.ones((95,)), interpret=True)
  with pytest.raises(ValueError, match="multiple of 16 for features=96"):
    fn(x, block_rows=12, interpret=True)
  with pytest.raises(ValueError, match="multiple of 8"):
    fn(x, block_rows=12, interpret=TPU)
  with pytest.raises(ValueError, match="axis must be integers"):
    fn(x, axis=2, interpret=True)
  with pytest.raises(ValueError, match="backend must be one of"):
    fn(x, backend="cuda", interpret=True)


@c.TRITON_SKIP
def test_triton_tiles_are_checked():
  with pytest.raises(ValueError, match="power-of-two block_rows"):
    pk.rms_norm_pallas(
      jnp.ones((40, 96)), block_rows=12, backend="triton", interpret=True
    )


def test_rms_norm_bad_eps_mode():
  with pytest.raises(ValueError, match="eps_mode must be one of"):
    pk.rms_norm_pallas(jnp.ones((4, 32)), eps_mode="middle", interpret=True)
