"""Tests of `jaxnorm.norms.fakeln`: FakeLN, its running std and schedule.

Oracle: the NumPy float64 transcription `tests/oracles/fakeln_numpy.py`
(the divisor chosen per token, the bias-corrected average in closed form).
Claims of spec ``norms.md`` section 10: with a token's true std FakeLN is
LayerNorm; frozen at the statistics of a calibration batch it is the
LayerNorm it replaces on that batch; the schedule of GPT-2 small.
"""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnorm import norms
from tests import helpers
from tests.norms import common
from tests.oracles import fakeln_numpy as ref


def _state(remove_at=0, bos_off_at=0):
  return norms.init_fake_ln_state(remove_at=remove_at, bos_off_at=bos_off_at)


class TestFakeLayerNorm:
  @pytest.mark.parametrize("std_shape", [(), (5,), (3, 5)])
  @pytest.mark.parametrize("affine", [True, False])
  def test_numpy(self, key, std_shape, affine):
    kx, kp, ks = jax.random.split(key, 3)
    x = common.normal(kx, (3, 5, 8), scale=2.0, shift=1.0)
    scale, bias = common.params(kp, 8) if affine else (None, None)
    std = 0.5 + jax.random.uniform(ks, std_shape)
    y = norms.fake_layer_norm(x, scale, bias, std=std)
    assert y.dtype == x.dtype and y.shape == x.shape
    helpers.assert_close(
      y, ref.fake_layer_norm(x, scale, bias, std), atol=2e-6, rtol=1e-6
    )

  def test_claim_true_std_is_layer_norm(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (2, 5, 8), scale=3.0, shift=1.0)
    scale, bias = common.params(kp, 8)
    true = ref.token_std(x, 1e-6)
    helpers.assert_close(
      norms.fake_layer_norm(x, scale, bias, std=true),
      norms.layer_norm(x, scale, bias, eps=1e-6),
      atol=1e-5,
    )

  @hypothesis.settings(deadline=None, max_examples=20)
  @hypothesis.given(
    a=st.floats(-3, 3), b=st.floats(-3, 3), c=st.floats(-10, 10),
    seed=st.integers(0, 2**16),
  )  # fmt: skip
  def test_constant_std_is_linear_and_shift_invariant(self, a, b, c, seed):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x, z = common.normal(k1, (4, 8)), common.normal(k2, (4, 8))
    scale, bias = common.params(k3, 8)
    f = functools.partial(
      norms.fake_layer_norm, scale=scale, bias=None, std=jnp.float32(1.7)
    )
    helpers.assert_close(f(a * x + b * z), a * f(x) + b * f(z), atol=5e-5)
    # The centering is kept: adding a constant to every feature is a no-op.
    g = functools.partial(norms.fake_layer_norm, std=jnp.float32(0.3))
    helpers.assert_close(g(x + c, scale, bias), g(x, scale, bias), atol=5e-4)

  def test_bfloat16_computes_in_float32(self, key):
    x = common.normal(key, (4, 16), dtype=jnp.bfloat16, scale=1e3)
    y = norms.fake_layer_norm(x, std=jnp.float32(1e3))
    assert y.dtype == jnp.bfloat16
    helpers.assert_close(
      y, ref.fake_layer_norm(x, None, None, 1e3), atol=2e-2, rtol=1e-2
    )

  def test_errors(self):
    x = jnp.ones((2, 5, 8))
    with pytest.raises(ValueError, match="std must broadcast"):
      norms.fake_layer_norm(x, std=jnp.ones((3,)))
    with pytest.raises(ValueError, match="std must broadcast"):
      norms.fake_layer_norm(x, std=jnp.ones((2, 5, 8)))
    with pytest.raises(ValueError, match="fake_layer_norm: scale"):
      norms.fake_layer_norm(x, jnp.ones((7,)), std=1.0)
    with pytest.raises(TypeError, match="fake_layer_norm: bias"):
      norms.fake_layer_norm(x, None, jnp.ones((8,), jnp.int32), std=1.0)
    with pytest.raises(TypeError, match="fake_layer_norm"):
      norms.fake_layer_norm(jnp.ones((2, 3), jnp.int32), std=1.0)
    with pytest.raises(ValueError, match="fake_layer_norm: x must have rank"):
      norms.fake_layer_norm(jnp.float32(1.0), std=1.0)


class TestFakeLN:
  def test_numpy_over_a_schedule(self, key):
    kp, *kxs = jax.random.split(key, 8)
    scale, bias = common.params(kp, 8)
    kw = dict(remove_at=3, bos_off_at=5)
    oracle = ref.FakeLN(**kw, momentum=0.7, eps=1e-6)
    state = _state(**kw)
    step = jax.jit(functools.partial(norms.fake_ln, momentum=0.7))
    for i, k in enumerate(kxs):
      # Position 0 much larger, as an attention sink.
      x = common.normal(k, (2, 4, 8), scale=1.0 + i)
      x = x.at[:, 0].multiply(5.0)
      y, state = step(x, scale, bias, state)
      helpers.assert_close(y, oracle(x, scale, bias), atol=2e-5, rtol=1e-5)
      helpers.assert_close(state.std, oracle.std, atol=0, rtol=1e-5)
      helpers.assert_close(state.bos_std, oracle.bos_std, atol=0, rtol=1e-5)
      assert int(state.step) == i + 1 and int(state.count) == min(i + 1, 3)
      common.assert_same_structure(state, _state())

  def test_real_is_layer_norm_and_scale_invariant(self, key):
    kx, kp = jax.random.split(key)
    x = common.normal(kx, (2, 6, 16), scale=3.0, shift=0.5)
    scale, bias = common.params(kp, 16)
    y, _ = norms.fake_ln(x, scale, bias, _state(remove_at=1), eps=0.0)
    helpers.assert_close(
      y, norms.layer_norm(x, scale, bias, eps=0.0), atol=2e-5
    )
    y7, _ = norms.fake_ln(7.0 * x, scale, bias, _state(remove_at=1), eps=0.0)
    helpers.assert_close(y7, y, atol=2e-5)

  def test_fake_is_linear_not_scale_invariant(self, key):
    x = common.normal(key, (2, 6, 16), scale=3.0)
    state = _state(remove_at=1)
    _, state = norms.fake_ln(x, None, None, state)  # records, step 1: fake
    y, _ = norms.fake_ln(x, None, None, state, training=False)
    y7, _ = norms.fake_ln(7.0 * x, None, None, state, training=False)
    helpers.assert_close(y7, 7.0 * y, atol=1e-4)

  def test_claim_frozen_statistics_equal_layer_norm_on_calibration(self, key):
    kx, kp = jax.random.split(key)
    # A calibration batch whose tokens share one std, 2.5.
    x = common.normal(kx, (3, 5, 16), shift=1.0)
    xc = x - jnp.mean(x, -1, keepdims=True)
    x = 1.0 + 2.5 * xc / jnp.sqrt(jnp.mean(xc * xc, -1, keepdims=True))
    scale, bias = common.params(kp, 16)
    ln = norms.layer_norm(x, scale, bias, eps=1e-6)
    state = _state(remove_at=1)
    y_real, state = norms.fake_ln(x, scale, bias, state, momentum=0.9)
    helpers.assert_close(state.std, np.sqrt(2.5**2 + 1e-6), atol=1e-5)
    y_fake, state = norms.fake_ln(x, scale, bias, state, momentum=0.9)
    assert int(state.count) == 1  # Frozen: the fake call did not record.
    helpers.assert_close(y_real, ln, atol=1e-5)
    helpers.assert_close(y_fake, ln, atol=2e-5)

  def test_bias_correction_is_the_batch_mean_after_one_update(self, key):
    x = common.normal(key, (2, 4, 8), scale=2.0)
    _, state = norms.fake_ln(x, None, None, _state(bos_off_at=1))
    sigma = ref.token_std(x, 1e-6)
    helpers.assert_close(state.std, sigma[:, 1:].mean(), atol=1e-6)
    helpers.assert_close(state.bos_std, sigma[:, 0].mean(), atol=1e-6)
    # Without the position-0 std every position is shared.
    _, plain = norms.fake_ln(x, None, None, _state())
    helpers.assert_close(plain.std, sigma.mean(), atol=1e-6)
    # A single position is shared even while the position-0 std is on.
    _, one = norms.fake_ln(x[:, :1], None, None, _state(bos_off_at=1))
    helpers.assert_close(one.std, sigma[:, 0].mean(), atol=1e-6)

  def test_first_call_records_when_fake_from_the_start(self, key):
    k1, k2 = jax.random.split(key)
    x1, x2 = (
      common.normal(k1, (2, 4, 8)),
      common.normal(k2, (2, 4, 8), scale=3.0),
    )
    y1, state = norms.fake_ln(x1, None, None, _state(remove_at=0))
    helpers.assert_close(state.std, ref.token_std(x1, 1e-6).mean(), atol=1e-6)
    assert int(state.count) == 1
    helpers.assert_close(
      y1, ref.fake_layer_norm(x1, None, None, state.std), atol=1e-5
    )
    _, later = norms.fake_ln(x2, None, None, state)
    helpers.assert_close(later, state._replace(step=state.step + 1), atol=0)

  def test_inference_only_reads(self, key):
    x = common.normal(key, (2, 4, 8))
    state = _state(remove_at=2)._replace(std=jnp.float32(3.0))
    y, new = norms.fake_ln(x, None, None, state, training=False)
    helpers.assert_close(new, state, atol=0)
    helpers.assert_close(y, norms.layer_norm(x), atol=1e-5)  # step 0: real

  def test_empty_batch_keeps_state(self):
    state = _state(remove_at=1)
    for shape in [(0, 3, 4), (2, 0, 4)]:
      x = jnp.zeros(shape, jnp.bfloat16)
      y, new = jax.jit(norms.fake_ln)(x, None, None, state)
      assert y.shape == shape and y.dtype == x.dtype
      helpers.assert_close(new, state, atol=0)

  def test_gradients(self, key):
    kx, kp, kg = jax.random.split(key, 3)
    x = common.normal(kx, (2, 4, 8), scale=2.0)
    scale, bias = common.params(kp, 8)
    g = common.normal(kg, (2, 4, 8))

    def vjp(state):
      f = lambda x: norms.fake_ln(x, scale, bias, state, training=False)[0]
      return jax.vjp(f, x)[1](g)[0]

    # Real: LayerNorm's gradient.
    ln_grad = jax.vjp(lambda x: norms.layer_norm(x, scale, bias), x)[1](g)[0]
    helpers.assert_close(vjp(_state(remove_at=1)), ln_grad, atol=1e-5)
    # Fake: the linear map's transpose, centered (g * scale) / s.
    fake = _state()._replace(std=jnp.float32(1.5))
    gs = np.asarray(g, np.float64) * np.asarray(scale, np.float64) / 1.5
    helpers.assert_close(vjp(fake), gs - gs.mean(-1, keepdims=True), atol=1e-6)
    # Training: no gradient reaches the recorded statistic.
    grad = jax.grad(lambda x: norms.fake_ln(x, None, None, _state())[1].std)(x)
    helpers.assert_close(grad, jnp.zeros_like(x), atol=0)

  def test_dtypes_and_jit(self, key):
    k1, k2 = jax.random.split(key)
    state = _state(remove_at=1, bos_off_at=1)
    helpers.assert_jit_matches_eager(
      lambda x: norms.fake_ln(x, None, None, state),
      common.normal(k1, (2, 4, 8)),
      atol=1e-5,
    )
    x = common.normal(k2, (2, 4, 8), dtype=jnp.bfloat16, scale=1e4)
    y, new = norms.fake_ln(x, None, None, state)
    assert y.dtype == jnp.bfloat16 and helpers.all_finite(y)
    common.assert_same_structure(new, state)

  def test_errors(self):
    x, st0 = jnp.ones((2, 4, 8)), _state()
    with pytest.raises(ValueError, match="fake_ln: x must have rank >= 2"):
      norms.fake_ln(jnp.ones((8,)), None, None, st0)
    with pytest.raises(TypeError, match="fake_ln: x must have a floating"):
      norms.fake_ln(jnp.ones((2, 8), jnp.int32), None, None, st0)
    with pytest.raises(ValueError, match="fake_ln: scale must have shape"):
      norms.fake_ln(x, jnp.ones((7,)), None, st0)
    with pytest.raises(TypeError, match="state must be a FakeLNState"):
      norms.fake_ln(x, None, None, tuple(st0))
    with pytest.raises(ValueError, match=r"state.std must have shape \(\)"):
      norms.fake_ln(x, None, None, st0._replace(std=jnp.ones((8,))))
    with pytest.raises(ValueError, match="momentum must be in"):
      norms.fake_ln(x, None, None, st0, momentum=1.0)
    with pytest.raises(ValueError, match="remove_at must be a non-negative"):
      norms.init_fake_ln_state(remove_at=-1)
    with pytest.raises(ValueError, match="bos_off_at must be a non-negative"):
      norms.init_fake_ln_state(bos_off_at=True)


class TestRemovalSchedule:
  def test_claim_gpt2_small(self):
    s = norms.fakeln.removal_steps(12)
    assert s[("ln_2", 0)] == 20 and s[("ln_2", 11)] == 42
    assert s[("ln_1qk", 0)] == 44 and s[("ln_1qk", 11)] == 66
    assert s[("ln_1v", 0)] == 68 and s[("ln_1v", 11)] == 101
    assert s[("ln_f", None)] == 104
    assert s[("eot_off", None)] == 106 and s[("bos_off", None)] == 116
    assert norms.fakeln.removal_events(44, 12) == {("ln_1qk", 0)}
    assert norms.fakeln.removal_events(19, 12) == frozenset()
    assert norms.fakeln.removal_steps(2, start=5, gap=3)[("ln_f", None)] == 47

  def test_errors(self):
    with pytest.raises(ValueError, match="num_layers"):
      norms.fakeln.removal_steps(0)
    with pytest.raises(ValueError, match="gap"):
      norms.fakeln.removal_steps(2, gap=0)
    with pytest.raises(ValueError, match="start must be a non-negative"):
      norms.fakeln.removal_steps(2, start=-1)
