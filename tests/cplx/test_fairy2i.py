"""Tests of `jaxnorm.cplx.fairy2i`: PhaseQuant against golden vectors from
a NumPy port of Fairy2i's ``PhaseQuantSTE`` (tests/oracles/complex_golden.npz,
written by tests/oracles/complex_numpy.py), its sector rule, rotation
covariance, the spec's error levels and the straight-through gradient."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import cplx
from tests.cplx import _common as c
from tests.oracles import complex_numpy as ref

GOLDEN = np.load(
  pathlib.Path(__file__).parents[1] / "oracles" / "complex_golden.npz"
)
RNG = np.random.default_rng(2)


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_phase_quantize_matches_golden(stages):
  w = GOLDEN["w"]
  with jax.enable_x64(True):
    got = cplx.phase_quantize(jnp.asarray(w), num_stages=stages)
    np.testing.assert_allclose(got, GOLDEN[f"w{stages}"], atol=1e-12)
  np.testing.assert_allclose(
    GOLDEN[f"w{stages}"], ref.phase_quant_stages(w, stages), atol=1e-12
  )


def test_codes_sectors_and_argmax_rule():
  w = c.np_cnormal(RNG, (200,))
  codes = np.asarray(cplx.phase_codes(jnp.asarray(w, jnp.complex64)))
  assert set(np.round(codes, 6).tolist()) <= {1, -1, 1j, -1j}
  cands = np.array([1, 1j, -1, -1j])
  best = cands[np.argmax(np.real(w[:, None] * np.conj(cands)), axis=1)]
  np.testing.assert_array_equal(codes, best)
  edges = jnp.asarray(
    np.exp(1j * np.pi * np.array([-0.25, 0.25, 0.75, -0.75])), jnp.complex64
  )
  # Half-open sectors as the code: [-π/4, π/4) -> 1, [π/4, 3π/4) -> i ...
  np.testing.assert_array_equal(cplx.phase_codes(edges), [1, 1j, -1, -1j])
  assert complex(cplx.phase_codes(jnp.zeros(1, jnp.complex64))[0]) == 1


def test_rotation_swaps_scales():
  """Q(i w) = i Q(w): codes rotate and s_re, s_im swap."""
  w = c.np_cnormal(RNG, (64,))
  with jax.enable_x64(True):
    q = cplx.phase_quantize(jnp.asarray(w))
    qi = cplx.phase_quantize(jnp.asarray(1j * w))
    off_edge = np.abs(np.cos(4 * np.angle(w)) + 1) > 1e-9
    np.testing.assert_allclose(
      np.asarray(qi)[off_edge], 1j * np.asarray(q)[off_edge], atol=1e-12
    )


def test_relative_error_levels_for_gaussian_weights():
  """Spec [N]: relative error ≈ 0.60 for W1 and ≈ 0.36 for W2."""
  w = jnp.asarray(c.np_cnormal(RNG, (256, 256)), jnp.complex64)
  errs = [
    float(
      jnp.linalg.norm(cplx.phase_quantize(w, num_stages=t) - w)
      / jnp.linalg.norm(w)
    )
    for t in (1, 2)
  ]
  np.testing.assert_allclose(errs, [0.60, 0.36], atol=0.02)


def test_straight_through_gradient_and_kernel_round_trip():
  w = jnp.asarray(c.np_cnormal(RNG, (4, 3)), jnp.complex64)
  g = jax.grad(lambda t: jnp.sum(jnp.real(cplx.phase_quantize(t))))(w)
  c.close(g, np.ones((4, 3)), atol=0)  # Identity (JAX's conj convention).
  g0 = jax.grad(
    lambda t: jnp.sum(jnp.real(cplx.phase_quantize(t, straight_through=False)))
  )(w)
  c.close(g0, np.zeros((4, 3)), atol=0)
  kernel = jnp.asarray(RNG.normal(size=(6, 8)), jnp.float32)
  kq = cplx.fairy2i_quantize_kernel(kernel, num_stages=1)
  u, ww = cplx.widely_linear_from_real(kq)
  for part in (u, ww):  # Each of U, W holds codes times two scales.
    p = np.asarray(part)
    assert len(np.unique(np.round(np.abs(p), 5))) <= 2
  gk = jax.grad(lambda k: jnp.sum(cplx.fairy2i_quantize_kernel(k) ** 2))(kernel)
  c.close(gk, 2 * cplx.fairy2i_quantize_kernel(kernel), atol=1e-6)


def test_bitnet_baselines():
  w = RNG.normal(size=(5, 7))
  wj = jnp.asarray(w, jnp.float32)
  b = np.where(w - w.mean() > 0, 1.0, -1.0) * np.abs(w).mean()
  c.close(cplx.binary_quantize_kernel(wj), b, atol=1e-6)
  gamma = np.abs(w).mean()
  t = np.clip(np.round(w / (gamma + 1e-5)), -1, 1) * gamma
  c.close(cplx.ternary_quantize_kernel(wj), t, atol=1e-6)
  g = jax.grad(lambda k: jnp.sum(cplx.ternary_quantize_kernel(k)))(wj)
  c.close(g, np.ones_like(w), atol=0)


def test_errors():
  with pytest.raises(ValueError, match=r"phase_quantize: num_stages must be"):
    cplx.phase_quantize(jnp.ones(2, jnp.complex64), num_stages=0)
  with pytest.raises(TypeError, match=r"phase_codes: w must have a complex"):
    cplx.phase_codes(jnp.ones(2))
  with pytest.raises(ValueError, match=r"widely_linear_from_real: kernel must"):
    cplx.fairy2i_quantize_kernel(jnp.ones((3, 4)))
  with pytest.raises(TypeError, match=r"binary_quantize_kernel: kernel must"):
    cplx.binary_quantize_kernel(jnp.ones(2, jnp.complex64))
  with pytest.raises(TypeError, match=r"ternary_quantize_kernel: kernel must"):
    cplx.ternary_quantize_kernel(jnp.ones(2, jnp.complex64))
