"""Shared sublayers and norms of the residual function tests."""

import jax.numpy as jnp

from jaxnorm import norms


def rms(x):
  """RMSNorm without a gain."""
  return norms.rms_norm(x, None)


def linear(w):
  """The linear sublayer ``x @ w`` in the dtype of ``x``."""
  return lambda x: x @ jnp.asarray(w, x.dtype)
