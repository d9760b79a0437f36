import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import activations as act
from jaxnorm.nn import activations as nn_act
from tests import helpers


def test_selu_elu_values():
  x = jnp.array([1.0, -1.0, -10.0, 0.0], jnp.float32)
  helpers.assert_close(
    act.selu(x),
    np.array(
      [1.0507009873554805, -1.1113307378125625, -1.7580195232607867, 0.0]
    ),
    atol=1e-6,
  )
  helpers.assert_close(
    act.elu(jnp.array([-1.0, 2.0])),
    np.array([-0.6321205588285577, 2.0]),
    atol=1e-7,
  )
  helpers.assert_close(act.selu(x), jax.nn.selu(x), atol=1e-7)
  helpers.assert_close(act.elu(x, alpha=0.5), jax.nn.elu(x, 0.5), atol=1e-7)


def test_selu_elu_gradient_at_zero_takes_exponential_branch():
  # jax.nn and torch take the exponential branch at x = 0: SELU's slope
  # there is lambda * alpha (not lambda), ELU's is alpha (not 1).
  zero = jnp.float32(0.0)
  g = jax.grad(act.selu)(zero)
  assert float(g) == pytest.approx(act.SELU_LAMBDA * act.SELU_ALPHA, rel=1e-6)
  assert float(g) == pytest.approx(float(jax.grad(jax.nn.selu)(zero)))
  for alpha in (1.0, 0.5):
    g = jax.grad(lambda t, a=alpha: act.elu(t, alpha=a))(zero)
    assert float(g) == pytest.approx(alpha, rel=1e-6)
    assert float(g) == float(
      jax.grad(lambda t, a=alpha: jax.nn.elu(t, a))(zero)
    )
  assert float(act.selu(zero)) == 0.0 and float(act.elu(zero)) == 0.0


def test_selu_moments(key):
  x = jax.random.normal(key, (2_000_000,), jnp.float32)
  y = act.selu(x)
  assert abs(float(y.mean())) < 5e-3
  assert abs(float(y.var()) - 1.0) < 5e-3


def test_selu_bfloat16_keeps_dtype():
  x = jnp.linspace(-3, 3, 11, dtype=jnp.bfloat16)
  assert act.selu(x).dtype == jnp.bfloat16
  assert act.elu(x).dtype == jnp.bfloat16


def test_integer_input_raises():
  with pytest.raises(TypeError, match="selu: x must have a floating dtype"):
    act.selu(jnp.arange(3))


@pytest.mark.parametrize(
  "rate,a,b,dropped",
  [
    (0.05, 0.9548444760, 0.0839355722, -1.5947758717),
    (0.1, 0.9212845161, 0.1619709701, -1.4577387305),
  ],
)
def test_alpha_dropout_constants(rate, a, b, dropped):
  ca, cb = act.alpha_dropout_constants(rate)
  assert ca == pytest.approx(a, abs=1e-9)
  assert cb == pytest.approx(b, abs=1e-9)
  assert ca * act.SELU_SATURATION + cb == pytest.approx(dropped, abs=1e-9)


def test_alpha_dropout_statistics(key):
  k1, k2 = jax.random.split(key)
  x = act.selu(jax.random.normal(k1, (1_000_000,), jnp.float32))
  y = act.alpha_dropout(x, 0.1, key=k2)
  assert abs(float(y.mean())) < 5e-3
  assert abs(float(y.var()) - 1.0) < 5e-3
  a, b = act.alpha_dropout_constants(0.1)
  frac = float(jnp.mean(jnp.abs(y - (a * act.SELU_SATURATION + b)) < 1e-6))
  assert abs(frac - 0.1) < 3e-3


def test_alpha_dropout_inference_identity_and_explicit_mask(key):
  x = jax.random.normal(key, (4, 5))
  assert act.alpha_dropout(x, 0.1, deterministic=True) is x
  mask = jnp.arange(20).reshape(4, 5) % 3 != 0
  a, b = act.alpha_dropout_constants(0.2)
  want = np.where(np.asarray(mask), np.asarray(x), act.SELU_SATURATION) * a + b
  helpers.assert_close(act.alpha_dropout(x, 0.2, mask=mask), want, atol=1e-6)


def test_alpha_dropout_matches_torch_value_set():
  torch = pytest.importorskip("torch")
  x = np.linspace(-2, 2, 64).astype(np.float32)
  torch.manual_seed(0)
  yt = torch.nn.functional.alpha_dropout(
    torch.from_numpy(x), p=0.2, training=True
  ).numpy()
  a, b = act.alpha_dropout_constants(0.2)
  kept = np.abs(yt - (a * x + b)) < 1e-5
  dropped = np.abs(yt - (a * act.SELU_SATURATION + b)) < 1e-5
  assert np.all(kept | dropped)
  ours = act.alpha_dropout(jnp.asarray(x), 0.2, mask=jnp.asarray(kept))
  helpers.assert_close(ours, yt, atol=1e-5)


def test_alpha_dropout_errors(key):
  x = jnp.ones((3,))
  with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)"):
    act.alpha_dropout(x, 1.0, key=key)
  with pytest.raises(ValueError, match="pass exactly one of key"):
    act.alpha_dropout(x, 0.1)
  with pytest.raises(ValueError, match="mask must have shape"):
    act.alpha_dropout(x, 0.1, mask=jnp.ones((4,), bool))
  with pytest.raises(TypeError, match="mask must be boolean"):
    act.alpha_dropout(x, 0.1, mask=jnp.ones((3,)))


@pytest.mark.parametrize("distribution", ["normal", "truncated_normal"])
def test_lecun_normal_variance(key, distribution):
  w = act.lecun_normal(distribution)(key, (400, 500), jnp.float32)
  assert abs(float(w.var()) * 400 - 1.0) < 0.02


def test_lecun_normal_bad_distribution():
  with pytest.raises(ValueError, match="distribution must be one of"):
    act.lecun_normal("uniform")


@pytest.mark.parametrize("distribution", ["normal", "truncated_normal"])
def test_selu_self_normalizes_through_64_layers(key, distribution):
  width = 128
  init = act.lecun_normal(distribution)
  kx, kw = jax.random.split(key)
  ws = jax.vmap(lambda k: init(k, (width, width), jnp.float32))(
    jax.random.split(kw, 64)
  )
  x0 = jax.random.normal(kx, (256, width), jnp.float32)

  def deep(f):
    return jax.lax.scan(lambda h, w: (f(h @ w), None), x0, ws)[0]

  x = deep(act.selu)
  assert abs(float(x.mean())) < 0.1
  assert abs(float(x.var()) - 1.0) < 0.15
  # The control diverges from unit variance: ReLU halves the second moment.
  assert float(deep(jax.nn.relu).var()) < 1e-3


def test_salu_values_and_reparameterization():
  x = jnp.array([0.5, 1.0, 3.0])
  helpers.assert_close(
    act.salu(x, 2.0, 0.5),
    np.array([0.8944271909999159, 1.414213562373095, 1.8973665961010275]),
    atol=1e-6,
  )
  grid = np.linspace(-50, 50, 10001)
  s, w = act.salu_sw_from_ab(2.0, 0.5)
  assert float(s) == pytest.approx(2.0) and float(w) == pytest.approx(1.0)
  a = np.asarray(act.salu(jnp.asarray(grid, jnp.float32), 2.0, 0.5))
  b = np.asarray(act.salu_sw(jnp.asarray(grid, jnp.float32), s, w))
  np.testing.assert_allclose(a, b, atol=1e-6)
  a2, b2 = act.salu_ab_from_sw(*act.salu_sw_from_ab(2.0, 0.5))
  assert float(a2) == pytest.approx(2.0) and float(b2) == pytest.approx(0.5)


def test_salu_properties():
  f = lambda x: act.salu(x, 2.0, 0.5)  # noqa: E731
  slope = jax.grad(lambda t: f(t[None])[0])(jnp.float32(0.0))
  assert float(slope) == pytest.approx(2.0)
  assert abs(float(f(jnp.full((1,), 1e6))[0]) - 2.0) < 1e-6
  x = jnp.linspace(-20, 20, 101)
  assert bool(jnp.all(jnp.abs(f(x)) < 2.0))
  helpers.assert_close(f(-x), -f(x), atol=0)


def test_salu_per_channel_and_errors():
  x = jnp.ones((2, 3))
  y = act.salu(x, jnp.array([1.0, 2.0, 3.0]), 1.0)
  helpers.assert_close(
    y[0], np.array([1 / np.sqrt(2), 2 / np.sqrt(3), 3 / 2]), atol=1e-6
  )
  with pytest.raises(ValueError, match=r"salu: gain must have shape \(3,\)"):
    act.salu(x, jnp.ones((2,)), 1.0)
  with pytest.raises(ValueError, match=r"salu_sw: width must have shape"):
    act.salu_sw(x, 1.0, jnp.ones((3, 1)))


@pytest.mark.parametrize(
  "fn",
  [
    lambda x: act.salu(x, 1.0, 1.0),
    lambda x: act.salu_sw(x, 1.0, 1.0),
    lambda x: act.swalu(x, experimental=True),
    lambda x: act.galu(x, experimental=True),
  ],
  ids=["salu", "salu_sw", "swalu", "galu"],
)
def test_channel_activations_refuse_a_scalar(fn, request):
  who = request.node.callspec.id
  with pytest.raises(
    ValueError, match=rf"^{who}: x must have rank >= 1, got x.ndim=0"
  ):
    fn(jnp.float32(1.0))


def test_swalu_galu_experimental_flag_and_values():
  x = jnp.linspace(-4, 4, 9)
  with pytest.raises(ValueError, match="swalu: .*experimental=True"):
    act.swalu(x)
  with pytest.raises(ValueError, match="galu: .*experimental=True"):
    act.galu(x)
  y = act.swalu(x, experimental=True)
  u = np.asarray(x) / 2.0
  helpers.assert_close(
    y, np.asarray(x) * 0.5 * (1 + u / np.sqrt(1 + u * u)), atol=1e-6
  )
  # Slopes of the gates at 0 match Swish (1/4) and GELU (1/sqrt(2 pi)).
  gate = lambda f: jax.grad(  # noqa: E731
    lambda t: f(t[None], experimental=True)[0] / t
  )
  assert float(gate(act.swalu)(jnp.float32(1e-3))) == pytest.approx(
    0.25, rel=1e-3
  )
  assert float(gate(act.galu)(jnp.float32(1e-3))) == pytest.approx(
    1 / np.sqrt(2 * np.pi), rel=1e-3
  )


def test_salu_module_matches_function():
  m = nn_act.SALU.from_gain_curvature(3, 2.0, 0.5)
  x = jnp.linspace(-3, 3, 12).reshape(4, 3)
  helpers.assert_close(m(x), act.salu(x, 2.0, 0.5), atol=1e-6)
  assert m.log_amplitude.shape == (3,)
  with pytest.raises(ValueError, match="init_width must be > 0"):
    nn_act.SALU(3, init_width=0.0)
  with pytest.raises(ValueError, match="gain and curvature must be > 0"):
    nn_act.SALU.from_gain_curvature(3, -1.0, 1.0)
  with pytest.raises(ValueError, match="SALU: x must have num_features=3"):
    m(jnp.ones((2, 4)))


def test_gate_modules():
  x = jnp.linspace(-3, 3, 12).reshape(4, 3)
  m = nn_act.SWALU(3, experimental=True)
  helpers.assert_close(m(x), act.swalu(x, experimental=True), atol=1e-6)
  g = nn_act.GALU(3, experimental=True, init_width=0.7)
  helpers.assert_close(g(x), act.galu(x, 0.7, experimental=True), atol=1e-6)
  with pytest.raises(ValueError, match="GALU: .*experimental=True"):
    nn_act.GALU(3)


def test_alpha_dropout_module():
  m = nn_act.AlphaDropout(0.1, rngs=nnx.Rngs(dropout=1))
  x = jnp.ones((1000,))
  y1, y2 = m(x), m(x)
  assert not np.allclose(y1, y2)  # The stream advances.
  m.eval()
  assert m(x) is x
  bare = nn_act.AlphaDropout(0.1)
  with pytest.raises(ValueError, match="AlphaDropout: .*no rngs"):
    bare(x)
  helpers.assert_close(
    bare(x, key=jax.random.key(3)),
    act.alpha_dropout(x, 0.1, key=jax.random.key(3)),
    atol=0,
  )


class _MixedDropoutNet(nnx.Module):
  """flax's Dropout and jaxnorm's AlphaDropout in one model."""

  def __init__(self, rngs):
    self.linear = nnx.Linear(8, 8, rngs=rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)
    self.alpha_dropout = nn_act.AlphaDropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.alpha_dropout(act.selu(self.dropout(self.linear(x))))


def test_alpha_dropout_follows_flax_view_protocol():
  model = _MixedDropoutNet(nnx.Rngs(0, dropout=1))
  x = jnp.ones((64, 8))
  plain = act.selu(model.linear(x))
  assert not np.allclose(model(x), plain)  # Both dropouts active.
  view = nnx.view(model, deterministic=True)
  assert view.alpha_dropout.deterministic and view.dropout.deterministic
  helpers.assert_close(view(x), plain, atol=0)
  assert not model.alpha_dropout.deterministic  # The view is a copy.
  train = nnx.view(view, deterministic=False)
  assert not np.allclose(train(x), plain)
  model.eval()
  helpers.assert_close(model(x), plain, atol=0)
  model.train()
  assert not model.alpha_dropout.deterministic
  only = nnx.view(model, only=nn_act.AlphaDropout, deterministic=True)
  assert only.alpha_dropout.deterministic and not only.dropout.deterministic
