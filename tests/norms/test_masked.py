"""``mask=`` on the pure layer_norm / rms_norm / group_norm."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers


def _oracle(x, mask, center, eps=1e-6):
  x = np.asarray(x, np.float64)
  m = np.broadcast_to(np.asarray(mask, np.float64)[..., None], x.shape)
  count = np.maximum(m.sum(-1, keepdims=True), 1.0)
  mean = (x * m).sum(-1, keepdims=True) / count if center else 0.0
  var = ((x - mean) ** 2 * m).sum(-1, keepdims=True) / count
  return (x - mean) / np.sqrt(var + eps)


@pytest.fixture(scope="module")
def data():
  x = jax.random.normal(jax.random.key(0), (3, 5, 8))
  # A position mask (x.shape[:-1]) with one fully masked row.
  mask = jax.random.bernoulli(jax.random.key(1), 0.7, (3, 5)).at[0].set(False)
  return x, mask


def test_position_mask_matches_numpy(data):
  # With a positions mask the statistics of a row are the row's own (or
  # zero when the row is masked out): the masked form equals the oracle.
  x, mask = data
  # Masked-out rows are x / sqrt(eps), about 1e3: relative tolerance.
  helpers.assert_close(
    norms.layer_norm(x, mask=mask), _oracle(x, mask, True), atol=1e-5, rtol=1e-6
  )
  helpers.assert_close(
    norms.rms_norm(x, mask=mask), _oracle(x, mask, False), atol=1e-5, rtol=1e-6
  )
  full = jnp.ones(x.shape[:-1], bool)
  helpers.assert_close(
    norms.layer_norm(x, mask=full), norms.layer_norm(x), atol=1e-6
  )
  helpers.assert_close(
    norms.group_norm(x, num_groups=2, mask=jnp.ones_like(x, bool)),
    norms.group_norm(x, num_groups=2),
    atol=1e-5,
  )


def test_feature_mask_excludes_elements(data):
  x, _ = data
  fmask = jnp.arange(8) < 6  # Broadcasts over x, as in flax.
  y = norms.layer_norm(x, mask=fmask)
  want = (x - x[..., :6].mean(-1, keepdims=True)) / jnp.sqrt(
    x[..., :6].var(-1, keepdims=True) + 1e-6
  )
  helpers.assert_close(y, want, atol=1e-5)


def test_mask_errors(data):
  x, mask = data
  with pytest.raises(ValueError, match=r"layer_norm: mask= normalizes over"):
    norms.layer_norm(x, mask=mask, axis=1)
  with pytest.raises(NotImplementedError, match=r"rms_norm: the Pallas"):
    norms.rms_norm(x, mask=mask, implementation="pallas")
  with pytest.raises(TypeError, match=r"mask must be boolean"):
    norms.layer_norm(x, mask=mask.astype(jnp.float32))
