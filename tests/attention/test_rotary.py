"""Rotary position embedding."""

import functools
import pathlib

import jax.numpy as jnp
import pytest

from jaxnorm import attention as attn
from tests import helpers
from tests.attention import _common

ORACLES = pathlib.Path(__file__).parent.parent / "oracles"
_qkv = functools.partial(_common.qkv, t=6)


def test_rope_relative_and_errors(key):
  q, k, _ = _qkv(key, k=4)
  rq, rk = attn.rope(q), attn.rope(k)
  lg = jnp.einsum("btnh,bsnh->bnts", rq, rk)
  shifted = jnp.einsum(
    "btnh,bsnh->bnts",
    attn.rope(q, jnp.arange(6.0) + 7.0),
    attn.rope(k, jnp.arange(6.0) + 7.0),
  )
  helpers.assert_close(lg, shifted, atol=1e-4)
  helpers.assert_close(attn.rope(q, jnp.zeros(6)), q, atol=0)
  with pytest.raises(ValueError, match="rope: the head dim must be even"):
    attn.rope(q[..., :7])
  with pytest.raises(ValueError, match=r"rope: positions must have shape"):
    attn.rope(q, jnp.zeros(5))
