"""The row-norm kernels' hand-derived backward vs autodiff of the reference.

`pallas_kernels.norms` derives ``dx`` and the parameter gradients of
RMSNorm and LayerNorm by hand (`_rms_bwd_math`, `_ln_bwd_math`); the
reference `jaxnorm.norms` has none (`jax.grad` differentiates the equation).
Here the kernels' row maths run on plain float32 rows, as a kernel block
sees them but without Pallas (fast, so in the default run; test_norms.py
runs the whole kernels in the interpreters), against `jax.vjp` of the
reference in float32 and bfloat16 on odd widths, with an all-zero row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxnorm import norms
from pallas_kernels import _norm_rows, _rows
from pallas_kernels import norms as pk
from tests import helpers
from tests.pallas_kernels import _common as c

SHAPES = [(37, 33), (5, 96), (9, 7)]


def _id(shape):
  return "x".join(map(str, shape))


def _static(**kwargs):
  # The row maths read only the options; the tiling is the row call's.
  return _norm_rows._Static(None, False, **kwargs)


def _kernel_vjp(bwd_math, st, x, ps, dy):
  """``(dx, *dparams)`` by a kernel's backward maths, all rows one block."""
  f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
  ops = _rows.RowOps(features=x.shape[-1], width=x.shape[-1])
  rows = [f32(p)[None] for p in ps]
  dx, contribs = bwd_math(f32(x), f32(dy), rows, st, ops)
  sums = [jnp.sum(t, axis=0).astype(p.dtype) for t, p in zip(contribs, ps)]
  return (dx.astype(x.dtype), *sums)


def _check(bwd_math, st, ref, x, ps, key):
  y, vjp = jax.vjp(ref, x, *ps)
  dy = jax.random.normal(key, y.shape, jnp.float32).astype(y.dtype)
  want = vjp(dy)
  got = _kernel_vjp(bwd_math, st, x, ps, dy)
  assert helpers.all_finite(got) and helpers.all_finite(want)
  n, nrows = x.shape[-1], x.shape[0]
  helpers.assert_close(got[0], want[0], **c.tol(x.dtype, n))
  for g, w in zip(got[1:], want[1:]):
    t = c.tol(jnp.float32, n * nrows)
    t["atol"] *= max(1.0, float(jnp.max(jnp.abs(w))))
    helpers.assert_close(g, w, **t)


def _inputs(key, shape, dtype, num_params):
  x, ps = c.inputs(key, shape, dtype, num_params)
  return x.at[1].set(0.0), ps


_RMS = [
  pytest.param(dict(), 1, id="inside"),
  pytest.param(dict(eps_mode="outside", eps=1e-3), 1, id="outside"),
  pytest.param(dict(scale_offset=1.0), 1, id="offset"),
  pytest.param(dict(eps_mode="outside", eps=1e-3), 0, id="outside-noscale"),
]


@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("kwargs,num_params", _RMS)
def test_rms_backward_is_autodiff_of_reference(
  kwargs, num_params, shape, dtype, key
):
  x, ps = _inputs(key, shape, dtype, num_params)
  st = _static(
    eps=kwargs.get("eps", 1e-6),
    offset=kwargs.get("scale_offset", 0.0),
    eps_mode=kwargs.get("eps_mode", "inside"),
    has_scale=num_params == 1,
  )
  ref = lambda x, *ps: norms.rms_norm(x, *ps, **kwargs)  # noqa: E731
  _check(pk._rms_bwd_math, st, ref, x, ps, jax.random.fold_in(key, 1))


_LN = [
  pytest.param(True, True, 0.0, id="scale-bias"),
  pytest.param(True, False, 1.0, id="scale-offset"),
  pytest.param(False, True, 0.0, id="bias"),
  pytest.param(False, False, 0.0, id="none"),
]


@pytest.mark.parametrize("dtype", c.DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
@pytest.mark.parametrize("has_scale,has_bias,offset", _LN)
def test_layer_norm_backward_is_autodiff_of_reference(
  has_scale, has_bias, offset, shape, dtype, key
):
  x, ps = _inputs(key, shape, dtype, has_scale + has_bias)
  st = _static(eps=1e-6, offset=offset, has_scale=has_scale, has_bias=has_bias)

  def ref(x, *params):
    p = iter(params)
    scale = next(p) if has_scale else None
    bias = next(p) if has_bias else None
    return norms.layer_norm(x, scale, bias, scale_offset=offset)

  _check(pk._ln_bwd_math, st, ref, x, ps, jax.random.fold_in(key, 1))
