"""`jaxnorm.norms.batch_norm(mask=)`: statistics over valid elements only.

Oracles: a NumPy float64 transcription of the masked moments; the unmasked
call on the gathered valid rows (padding invariance); flax's
``BatchNorm(mask=)``; cross-device statistics under `shard_map`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from jaxnorm import norms
from tests import helpers


def _inputs(key, shape=(3, 7, 5)):
  kx, km, ks, kb = jax.random.split(key, 4)
  x = 2.0 * jax.random.normal(kx, shape) + 1.5
  mask = jax.random.bernoulli(km, 0.6, shape[:-1]).at[0, 0].set(True)
  scale = 1.0 + 0.1 * jax.random.normal(ks, shape[-1:])
  bias = 0.1 * jax.random.normal(kb, shape[-1:])
  return x, mask, scale, bias


def _oracle(x, mask, scale, bias, state, momentum, eps):
  x = np.asarray(x, np.float64)
  valid = x[np.asarray(mask)]
  mu, var = valid.mean(0), valid.var(0)
  y = (x - mu) / np.sqrt(var + eps) * np.asarray(scale) + np.asarray(bias)
  mean = momentum * np.asarray(state.mean) + (1 - momentum) * mu
  run_var = momentum * np.asarray(state.var) + (1 - momentum) * var
  return y, norms.BatchNormState(mean, run_var)


def test_masked_statistics_match_numpy(key):
  x, mask, scale, bias = _inputs(key)
  state = norms.init_batch_norm_state(5)
  out = norms.batch_norm(
    x, scale, bias, state, training=True, momentum=0.9, mask=mask
  )
  helpers.assert_close(
    out, _oracle(x, mask, scale, bias, state, 0.9, 1e-5), atol=2e-5
  )


def test_padding_invariance(key):
  """Valid rows normalized as the unmasked call on those rows alone."""
  x, mask, scale, bias = _inputs(key)
  state = norms.init_batch_norm_state(5)
  y, new = norms.batch_norm(x, scale, bias, state, training=True, mask=mask)
  valid = np.asarray(mask)
  y_ref, new_ref = norms.batch_norm(x[valid], scale, bias, state, training=True)
  helpers.assert_close((y[valid], new), (y_ref, new_ref), atol=1e-5, rtol=1e-5)


def test_all_true_mask_is_unmasked(key):
  x, _, scale, bias = _inputs(key)
  state = norms.init_batch_norm_state(5)
  kwargs = dict(training=True, momentum=0.9)
  helpers.assert_close(
    norms.batch_norm(
      x, scale, bias, state, mask=jnp.ones(x.shape[:-1], bool), **kwargs
    ),
    norms.batch_norm(x, scale, bias, state, **kwargs),
    atol=1e-6,
  )


def test_flax_parity(key):
  x, mask, scale, bias = _inputs(key)
  layer = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5)
  variables = {
    "params": {"scale": scale, "bias": bias},
    "batch_stats": {"mean": jnp.zeros(5), "var": jnp.ones(5)},
  }
  y_ref, upd = layer.apply(
    variables, x, mask=mask[..., None], mutable=["batch_stats"]
  )
  y, new = norms.batch_norm(
    x,
    scale,
    bias,
    norms.init_batch_norm_state(5),
    training=True,
    momentum=0.9,
    mask=mask,
  )
  helpers.assert_close(
    (y, new.mean, new.var),
    (y_ref, upd["batch_stats"]["mean"], upd["batch_stats"]["var"]),
    atol=1e-5,
  )


def test_all_masked_keeps_state_and_inference_ignores_mask(key):
  x, _, scale, bias = _inputs(key)
  state = norms.BatchNormState(jnp.full(5, 0.3), jnp.full(5, 2.0))
  none = jnp.zeros(x.shape[:-1], bool)
  _, new = norms.batch_norm(x, scale, bias, state, training=True, mask=none)
  helpers.assert_close(new, state, atol=0.0)
  helpers.assert_close(
    norms.batch_norm(x, scale, bias, state, training=False, mask=none),
    norms.batch_norm(x, scale, bias, state, training=False),
    atol=0.0,
  )


def test_gradient_ignores_masked_rows(key):
  """Masked rows do not influence valid outputs (zero cross-gradient)."""
  x, mask, scale, bias = _inputs(key)
  state = norms.init_batch_norm_state(5)

  def valid_sum(x):
    y, _ = norms.batch_norm(x, scale, bias, state, training=True, mask=mask)
    return jnp.sum(jnp.where(mask[..., None], jnp.sin(y), 0.0))

  g = jax.grad(valid_sum)(x)
  np.testing.assert_array_equal(np.asarray(g)[~np.asarray(mask)], 0.0)


def test_other_axis(key):
  x, mask, scale, bias = _inputs(key)
  state = norms.init_batch_norm_state(5)
  xt = jnp.moveaxis(x, -1, 1)
  y, new = norms.batch_norm(
    xt, scale, bias, state, training=True, axis=1, mask=mask
  )
  y_ref, new_ref = norms.batch_norm(
    x, scale, bias, state, training=True, mask=mask
  )
  helpers.assert_close(
    (jnp.moveaxis(y, 1, -1), new), (y_ref, new_ref), atol=1e-6
  )


def test_cross_device_statistics(key):
  x, mask, scale, bias = _inputs(key, (4, 6, 5))
  state = norms.init_batch_norm_state(5)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("d",))

  def fn(x, m):
    return norms.batch_norm(
      x, scale, bias, state, training=True, axis_name="d", mask=m
    )

  sharded = jax.jit(
    jax.shard_map(
      fn,
      mesh=mesh,
      in_specs=(P("d"), P("d")),
      out_specs=(P("d"), norms.BatchNormState(P(), P())),
    )
  )(x, mask)
  whole = norms.batch_norm(x, scale, bias, state, training=True, mask=mask)
  helpers.assert_close(sharded, whole, atol=1e-5)


def test_mask_errors():
  x = jnp.ones((2, 3, 4))
  state = norms.init_batch_norm_state(4)
  with pytest.raises(TypeError, match="batch_norm: mask must be boolean"):
    norms.batch_norm(x, None, None, state, training=True, mask=jnp.ones((2, 3)))
  with pytest.raises(ValueError, match=r"batch_norm: mask must have shape"):
    norms.batch_norm(
      x, None, None, state, training=True, mask=jnp.ones((2, 4), bool)
    )
