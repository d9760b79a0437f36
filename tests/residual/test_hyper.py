"""Tests for jaxnorm.residual.hyper: stream expansion and readout, the
stream update and the HC maps, against the ``hyper-connections`` golden
vectors (``tests/oracles/hc_golden.py``) and the paper's invariants."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import residual as R
from jaxnorm.nn import residual as nn_res
from tests import helpers
from tests.oracles import hc_golden
from tests.residual import _common as common
from tests.residual._common import Linear

HC_GOLDEN = pathlib.Path(hc_golden.__file__).with_name("hc_golden.npz")


# ---------------------------------------------------------------------------
# Hyper-Connections.


def _hc_params(data, case, k, d):
  p = lambda name: jnp.asarray(data[f"hc/{case}/p{k}/{name}"])  # noqa: E731
  return dict(
    static_alpha=p("static_alpha"),
    static_beta=p("static_beta"),
    dynamic_alpha=p("dynamic_alpha_fn"),
    dynamic_beta=p("dynamic_beta_fn"),
    alpha_scale=p("dynamic_alpha_scale"),
    beta_scale=p("dynamic_beta_scale"),
    norm_scale=p("norm.gamma"),
  )


def _hc_net(data, case):
  x = jnp.asarray(data[f"hc/{case}/x"])
  d = x.shape[-1]
  h = R.expand_streams(x, hc_golden.N)
  for k in range(2):
    maps = R.hc_maps(
      h, tanh=case != "dynamic_notanh", **_hc_params(data, case, k, d)
    )
    w = data[f"hc/{case}/w{k}"].T  # torch (out, in) -> (in, out)
    h = R.hyper_connection(
      h, common.linear(w), h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    )
  return R.reduce_streams(h)


@pytest.mark.parametrize("case", hc_golden.CASES)
def test_hc_matches_golden(case):
  data = np.load(HC_GOLDEN)
  helpers.assert_close(_hc_net(data, case), data[f"hc/{case}/y"], atol=1e-5)


@pytest.mark.parametrize("case", ["static", "dynamic"])
def test_hc_live_oracle_matches_committed_golden(case):
  pytest.importorskip("torch")
  pytest.importorskip("hyper_connections")
  live, data = hc_golden.compute(), np.load(HC_GOLDEN)
  for k in data.files:
    if k.startswith(f"hc/{case}/"):
      np.testing.assert_allclose(live[k], data[k], atol=1e-6, err_msg=k)


def test_static_hc_without_dynamic_weights():
  data = np.load(HC_GOLDEN)
  x = jnp.asarray(data["hc/static/x"])
  h = R.expand_streams(x, 4)
  p = _hc_params(data, "static", 0, x.shape[-1])
  full = R.hc_maps(h, **p)
  static = R.hc_maps(
    h, static_alpha=p["static_alpha"], static_beta=p["static_beta"]
  )
  assert static[2].shape == (4, 4)
  for a, b in zip(full, static):
    helpers.assert_close(a, jnp.broadcast_to(b, a.shape), atol=0)


def test_hc_init_is_n_copies_of_prenorm(key):
  # Spec 1 test 1: fresh HCs on two linear branches = n * plain residual.
  n, d = 4, 32
  x = jax.random.normal(key, (2, 3, d))
  ws = [jax.random.normal(jax.random.key(k), (d, d)) / d for k in (5, 6)]
  h = R.expand_streams(x, n)
  plain = x
  for k, w in enumerate(ws):
    alpha, beta = R.hc_static_init(n, k)
    maps = R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((d, n + 1)),
      dynamic_beta=jnp.zeros((d,)),
    )
    f = lambda v, w=w: common.linear(w)(common.rms(v))  # noqa: E731
    h = R.hyper_connection(h, f, h_pre=maps[0], h_post=maps[1], h_res=maps[2])
    plain = plain + f(plain)
  helpers.assert_close(R.reduce_streams(h), n * plain, atol=1e-5)
  helpers.assert_close(R.reduce_streams(h, readout="mean"), plain, atol=1e-6)


def test_hc_single_stream_is_plain_residual(key):
  # Spec 1 test 3: n = 1, alpha = [[1, 1]], B = [1] gives x + T(x).
  x = jax.random.normal(key, (3, 8))
  h = R.expand_streams(x, 1)
  maps = R.hc_maps(h, static_alpha=jnp.ones((1, 2)), static_beta=jnp.ones((1,)))
  out = R.hyper_connection(
    h, jnp.sin, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
  )
  helpers.assert_close(out[..., 0, :], x + jnp.sin(x), atol=0)


def test_hyper_connection_keeps_dtype_and_jits(key):
  h = jax.random.normal(key, (2, 4, 8)).astype(jnp.bfloat16)
  alpha, beta = R.hc_static_init(4, 1)
  maps = R.hc_maps(h, static_alpha=alpha, static_beta=beta)
  out = R.hyper_connection(
    h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
  )
  assert out.dtype == jnp.bfloat16
  helpers.assert_jit_matches_eager(
    lambda h: R.hyper_connection(
      h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    h.astype(jnp.float32),
  )


def test_hc_errors(key):
  h = jax.random.normal(key, (2, 4, 8))
  alpha, beta = R.hc_static_init(4, 0)
  with pytest.raises(
    ValueError,
    match=r"static_alpha must have shape "
    r"\(3, 4\).*got static_alpha.shape=\(4, 5\)",
  ):
    R.hc_maps(h[:, :3], static_alpha=alpha, static_beta=beta[:3])
  with pytest.raises(ValueError, match="static_beta must have shape"):
    R.hc_maps(h, static_alpha=alpha, static_beta=beta[:3])
  with pytest.raises(ValueError, match="give both dynamic_alpha"):
    R.hc_maps(
      h, static_alpha=alpha, static_beta=beta, dynamic_alpha=jnp.zeros((8, 5))
    )
  with pytest.raises(ValueError, match="dynamic_alpha must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 4)),
      dynamic_beta=jnp.zeros(8),
    )
  with pytest.raises(ValueError, match="dynamic_beta must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(4),
    )
  with pytest.raises(ValueError, match="norm_scale must have shape"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(8),
      norm_scale=jnp.zeros(4),
    )
  with pytest.raises(ValueError, match="alpha_scale must be a scalar"):
    R.hc_maps(
      h,
      static_alpha=alpha,
      static_beta=beta,
      dynamic_alpha=jnp.zeros((8, 5)),
      dynamic_beta=jnp.zeros(8),
      alpha_scale=jnp.zeros(2),
    )
  with pytest.raises(ValueError, match="h must have rank >= 2"):
    R.hc_maps(h[0, 0], static_alpha=alpha, static_beta=beta)
  with pytest.raises(ValueError, match="layer_index must be a non-negative"):
    R.hc_static_init(4, -1)
  pre, post, res = R.hc_maps(h, static_alpha=alpha, static_beta=beta)
  with pytest.raises(ValueError, match=r"h_res must have shape \(3, 3\)"):
    R.hyper_connection(
      h[:, :3], jnp.tanh, h_pre=pre[:3], h_post=post[:3], h_res=res
    )
  with pytest.raises(ValueError, match=r"h_pre must have shape \(4,\)"):
    R.hyper_connection(h, jnp.tanh, h_pre=pre[:2], h_post=post, h_res=res)
  with pytest.raises(ValueError, match="sublayer must map"):
    R.hyper_connection(
      h, lambda v: v[..., :2], h_pre=pre, h_post=post, h_res=res
    )
  with pytest.raises(ValueError, match="num_streams must be a positive"):
    R.expand_streams(h, 0)
  with pytest.raises(ValueError, match="readout must be one of"):
    R.reduce_streams(h, readout="max")


# ---------------------------------------------------------------------------
# The modules (jaxnorm.nn.residual.hyper).


def test_hc_module_matches_golden_and_function():
  data = np.load(HC_GOLDEN)
  for case in ("dynamic", "dynamic_notanh", "static"):
    x = jnp.asarray(data[f"hc/{case}/x"])
    d = x.shape[-1]
    blocks = [Linear(data[f"hc/{case}/w{k}"].T) for k in range(2)]
    net = nn_res.make_residual(
      "hc",
      blocks,
      num_features=d,
      rngs=nnx.Rngs(0),
      norm=None,
      tanh=case != "dynamic_notanh",
      readout="sum",  # lucidrains' reduce sums the streams.
    )
    for k, step in enumerate(net.steps):
      p = lambda n, k=k: jnp.asarray(data[f"hc/{case}/p{k}/{n}"])  # noqa
      step.static_alpha[...] = p("static_alpha")
      step.static_beta[...] = p("static_beta")
      step.dynamic_alpha[...] = p("dynamic_alpha_fn")
      step.dynamic_beta[...] = p("dynamic_beta_fn")
      step.alpha_scale[...] = p("dynamic_alpha_scale")
      step.beta_scale[...] = p("dynamic_beta_scale")
      step.norm_scale[...] = p("norm.gamma")
    helpers.assert_close(net(x), data[f"hc/{case}/y"], atol=1e-5)
  h = jax.random.normal(jax.random.key(0), (2, 4, d))
  step = net.steps[1]
  maps = R.hc_maps(
    h,
    static_alpha=step.static_alpha[...],
    static_beta=step.static_beta[...],
    dynamic_alpha=step.dynamic_alpha[...],
    dynamic_beta=step.dynamic_beta[...],
    alpha_scale=step.alpha_scale[...],
    beta_scale=step.beta_scale[...],
    norm_scale=step.norm_scale[...],
  )
  helpers.assert_close(
    step(h, jnp.tanh),
    R.hyper_connection(
      h, jnp.tanh, h_pre=maps[0], h_post=maps[1], h_res=maps[2]
    ),
    atol=1e-6,
  )
