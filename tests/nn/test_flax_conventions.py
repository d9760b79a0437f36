"""flax's constructor and call conventions on every jaxnorm norm module.

Registry-driven: every name in `jaxnorm.nn.NORMS` either honours flax's
``use_scale`` / ``use_bias`` / ``scale_init`` / ``bias_init`` / ``dtype`` /
``param_dtype`` / ``promote_dtype`` or refuses a value with a `ValueError`
naming the keyword. Then the five norms flax also has (LayerNorm, RMSNorm,
BatchNorm, GroupNorm, InstanceNorm) against ``flax.nnx`` on the same
parameters: a small grid of dtypes, affine switches, axes and masks,
``promote_dtype``, positional GroupNorm, and BatchNorm's float32 running
statistics updated under ``stop_gradient``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnorm import nn as jnn
from jaxnorm.nn import cplx as ncplx
from tests import helpers

D = 8
SHAPES = {"tokens": (2, 5, D), "images": (2, 3, 3, D), "graphs": (2, 5, D)}
NAMES = sorted(jnn.NORMS)


def _whitening_identity(shape, dtype):
  """Rows ``(γrr, γri, γii) = (1, 0, 1)``: the identity whitening scale."""
  return jnp.broadcast_to(jnp.array([1.0, 0.0, 1.0], dtype)[:, None], shape)


# The stored value of a "scale" parameter that multiplies by one, where it is
# not one: norms that apply 1 + scale, and the 2x2 whitening scales.
_UNIT_SCALE = {
  "regionnormb": jnp.zeros,
  "timestepdecaynorm": jnp.zeros,
  "complexbatchnorm": _whitening_identity,
  "complexlayernorm": _whitening_identity,
}


def _build(name, **kwargs):
  return jnn.make_norm(name, D, rngs=nnx.Rngs(0), **kwargs)


def _input(name, key, dtype=jnp.float32):
  layout = min(jnn.NORMS[name].layouts)
  x = (1 + 2 * jax.random.normal(key, SHAPES[layout])).astype(dtype)
  return helpers.as_dtype_kind(x, jnn.NORMS[name].dtype_kind)


@nnx.jit
def _call(module, x):
  return module(x)


def _params(module):
  """``{attribute name: value}`` of the module's `nnx.Param`s."""
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
    assert len(path) == 1, path  # Norm parameters are direct attributes.
    out[str(path[0])] = var.get_value()
  return out


def _set(module, name, value):
  getattr(module, name)[...] = value


def _perturb_shared(a, b, key):
  """Equal random values for the parameters ``a`` and ``b`` share."""
  pa, pb = _params(a), _params(b)
  for i, name in enumerate(sorted(set(pa) & set(pb))):
    v = pa[name]
    noise = jax.random.normal(jax.random.fold_in(key, i), v.shape, v.dtype)
    _set(a, name, v + 0.2 * noise)
    _set(b, name, v + 0.2 * noise)


def _named(module, prefix):
  return {n: v for n, v in _params(module).items() if n.startswith(prefix)}


@pytest.mark.parametrize("name", NAMES)
def test_use_scale_false(key, name):
  """Without its scale a norm computes as with a unit scale (or refuses)."""
  try:
    without = _build(name, use_scale=False)
  except ValueError as e:
    assert f"{jnn.NORMS[name].module.__name__}: use_scale=False" in str(e)
    return
  full = _build(name)
  scales = _named(full, "scale")
  assert scales, "a norm that drops its scale must have one by default"
  assert not _named(without, "scale")
  assert set(_params(without)) == set(_params(full)) - set(scales)
  _perturb_shared(without, full, key)
  unit = _UNIT_SCALE.get(name, jnp.ones)
  for n, v in scales.items():
    _set(full, n, unit(v.shape, v.dtype))
  x = _input(name, jax.random.fold_in(key, 1))
  helpers.assert_close(_call(without, x), _call(full, x), atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_use_bias_false(key, name):
  """Without its bias a norm computes as with a zero bias (or refuses)."""
  try:
    without = _build(name, use_bias=False)
  except ValueError as e:
    assert f"{jnn.NORMS[name].module.__name__}: use_bias=False" in str(e)
    return
  full = _build(name)
  biases = _named(full, "bias")
  assert not _named(without, "bias")
  assert set(_params(without)) == set(_params(full)) - set(biases)
  _perturb_shared(without, full, key)
  for n, v in biases.items():
    _set(full, n, jnp.zeros_like(v))
  x = _input(name, jax.random.fold_in(key, 1))
  helpers.assert_close(_call(without, x), _call(full, x), atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_use_bias_true_needs_a_bias(name):
  """``use_bias=True`` builds a bias, or says the norm has none."""
  try:
    module = _build(name, use_bias=True)
  except ValueError as e:
    who = jnn.NORMS[name].module.__name__
    assert f"{who}: use_bias=True is not available: {who} has no bias" in (
      str(e)
    )
    assert not _named(_build(name), "bias")
    return
  assert _named(module, "bias")


@pytest.mark.parametrize("prefix", ["scale", "bias"])
@pytest.mark.parametrize("name", NAMES)
def test_custom_init(name, prefix):
  """``scale_init`` / ``bias_init`` set every scale / bias parameter."""
  keyword = f"{prefix}_init"
  try:
    module = _build(name, **{keyword: nnx.initializers.constant(0.375)})
  except ValueError as e:
    assert f"{jnn.NORMS[name].module.__name__}: {keyword} is not" in str(e)
    return
  values = _named(module, prefix)
  assert values
  for v in values.values():
    np.testing.assert_array_equal(v, np.full(v.shape, 0.375, v.dtype))


@pytest.mark.parametrize("name", NAMES)
def test_dtype_and_param_dtype(key, name):
  """Parameters are stored in ``param_dtype``, the output is ``dtype``."""
  if jnn.NORMS[name].dtype_kind == "complex":
    # Complex-native: dtype is a complex output dtype (there is no complex
    # bfloat16); real pairs take a real one.
    module = _build(name, real_pairs=True, dtype=jnp.bfloat16)
    x = jax.random.normal(key, (2, 5, D))
    assert _call(module, x).dtype == jnp.bfloat16
    native = _build(name, dtype=jnp.complex64)
    assert _call(native, _input(name, key)).dtype == jnp.complex64
    return
  module = _build(name, param_dtype=jnp.bfloat16, dtype=jnp.float32)
  params = jax.tree.leaves(nnx.state(module, nnx.Param))
  assert params and all(p.dtype == jnp.bfloat16 for p in params)
  assert _call(module, _input(name, key, jnp.bfloat16)).dtype == jnp.float32
  narrow = _build(name, dtype=jnp.bfloat16)
  assert _call(narrow, _input(name, key)).dtype == jnp.bfloat16


@pytest.mark.parametrize("name", NAMES)
def test_promote_dtype(key, name):
  """flax's ``promote_dtype``: honoured, or refused by name."""
  try:
    module = _build(
      name, promote_dtype=nnx.nn.dtypes.promote_dtype, dtype=jnp.bfloat16
    )
  except ValueError as e:
    who = jnn.NORMS[name].module.__name__
    assert f"{who}: promote_dtype is not available" in str(e)
    _build(name, promote_dtype=None)  # The default rule is every norm's.
    return
  assert _call(module, _input(name, key)).dtype == jnp.bfloat16


class TestRefusals:
  """Every refusal names the module, the keyword and the reason."""

  def test_needs_scale(self):
    with pytest.raises(
      ValueError,
      match=r"ScaleNorm: use_scale=False is not available: the paper needs "
      r"its scale \(the learned scalar gain g is ScaleNorm",
    ):
      jnn.ScaleNorm(D, use_scale=False, rngs=nnx.Rngs(0))

  def test_no_bias(self):
    with pytest.raises(
      ValueError,
      match=r"RMSNorm: use_bias=True is not available: RMSNorm has no bias "
      r"\(it re-scales without re-centring",
    ):
      jnn.RMSNorm(D, use_bias=True, rngs=nnx.Rngs(0))
    with pytest.raises(
      ValueError, match=r"SeeDNorm: bias_init is not available: SeeDNorm has"
    ):
      jnn.SeeDNorm(D, bias_init=nnx.initializers.zeros, rngs=nnx.Rngs(0))
    assert jnn.RMSNorm(D, use_bias=False, rngs=nnx.Rngs(0)).scale is not None

  def test_needs_bias(self):
    with pytest.raises(
      ValueError,
      match=r"RegionNormB: use_bias=False is not available: the paper needs "
      r"its bias \(RN-B's per-region shifts",
    ):
      jnn.RegionNormB(D, use_bias=False, rngs=nnx.Rngs(0))

  def test_own_init(self):
    with pytest.raises(
      ValueError,
      match=r"RegionNormL: scale_init is not available: RN-L's gain and "
      r"shift are convolutions of its mask",
    ):
      jnn.RegionNormL(D, scale_init=nnx.initializers.ones, rngs=nnx.Rngs(0))

  def test_promote_dtype(self):
    with pytest.raises(
      ValueError,
      match=r"CRMSNorm: promote_dtype is not available: CRMSNorm promotes "
      r"its input with its parameters' dtypes",
    ):
      jnn.CRMSNorm(
        D, promote_dtype=nnx.nn.dtypes.promote_dtype, rngs=nnx.Rngs(0)
      )

  def test_module_specific(self):
    with pytest.raises(
      ValueError, match=r"CLSNorm: use_bias=True is not available with kind="
    ):
      jnn.CLSNorm(D, kind="rms", use_bias=True, rngs=nnx.Rngs(0))
    assert jnn.CLSNorm(D, kind="rms", rngs=nnx.Rngs(0)).bias_cls is None
    with pytest.raises(
      ValueError,
      match=r"ScaleVectorNorm: scale_init is not available with reparam=True",
    ):
      jnn.ScaleVectorNorm(
        D, reparam=True, scale_init=nnx.initializers.ones, rngs=nnx.Rngs(0)
      )

  def test_complex_dtype_kind(self):
    with pytest.raises(
      TypeError,
      match=r"ComplexRMSNorm: dtype must be a complex dtype \(complex in, "
      r"complex out\), got dtype=float32",
    ):
      ncplx.ComplexRMSNorm(D, dtype=jnp.float32, rngs=nnx.Rngs(0))
    with pytest.raises(
      TypeError,
      match=r"ComplexLayerNorm: dtype must be a real floating dtype",
    ):
      ncplx.ComplexLayerNorm(
        D, real_pairs=True, dtype=jnp.complex64, rngs=nnx.Rngs(0)
      )

  def test_unknown_keyword_stays_a_type_error(self):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'eta'"):
      jnn.DyT(D, eta=1.0, rngs=nnx.Rngs(0))


def test_scale_norm_takes_a_flax_initializer():
  init = nnx.initializers.constant(2.5)
  module = jnn.ScaleNorm(D, scale_init=init, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(module.scale[...], [2.5])
  number = jnn.ScaleNorm(D, scale_init=2.5, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(number.scale[...], [2.5])


# ---------------------------------------------------------------------------
# The five norms flax has, against flax.nnx on the same parameters.

FLAX = {
  "layernorm": (jnn.LayerNorm, nnx.LayerNorm, {}),
  "rmsnorm": (jnn.RMSNorm, nnx.RMSNorm, {}),
  "batchnorm": (jnn.BatchNorm, nnx.BatchNorm, {}),
  "groupnorm": (jnn.GroupNorm, nnx.GroupNorm, {"num_groups": 4}),
  "instancenorm": (jnn.InstanceNorm, nnx.InstanceNorm, {}),
}
DTYPES = [  # (x dtype, param_dtype)
  (jnp.float32, jnp.float32),
  (jnp.bfloat16, jnp.float32),
  (jnp.bfloat16, jnp.bfloat16),
  (jnp.float32, jnp.bfloat16),
]
AFFINE = [(True, True), (False, True), (True, False), (False, False)]


def _pair(name, key, **kwargs):
  """``(ours, theirs)``: the same layer, flax's parameters perturbed and
  copied into ours (running statistics too, for BatchNorm)."""
  ours_cls, theirs_cls, base = FLAX[name]
  kw = {**base, **kwargs}
  if name == "rmsnorm":
    assert kw.pop("use_bias", False) is False  # flax's RMSNorm has no bias.
  theirs = theirs_cls(D, rngs=nnx.Rngs(0), **kw)
  ours = ours_cls(D, rngs=nnx.Rngs(0), **kw)
  for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(theirs))):
    (attr,) = path
    value = var.get_value()
    noise = jax.random.normal(jax.random.fold_in(key, i), value.shape)
    noise = 0.5 * jnp.abs(noise) if attr == "var" else 0.3 * noise
    value = value + noise.astype(value.dtype)
    _set(theirs, attr, value)
    _set(ours, attr, value)
  return ours, theirs


def _theirs(module, *args, **kwargs):
  with jax.numpy_dtype_promotion("standard"):  # flax promotes implicitly.
    return module(*args, **kwargs)


def _close(got, want):
  assert got.dtype == want.dtype
  atol = 1e-5 if got.dtype == jnp.float32 else 4e-2
  helpers.assert_close(got, want, atol=atol)


@pytest.fixture(scope="module")
def images():
  return 1 + 2 * jax.random.normal(jax.random.key(3), (4, 3, 3, D))


GRID = [
  (name, *dtypes, *affine)
  for name in sorted(FLAX)
  for dtypes in DTYPES
  for affine in AFFINE
  if not (name == "rmsnorm" and affine[1])  # RMSNorm has no bias.
]


@pytest.mark.parametrize(
  ("name", "x_dtype", "param_dtype", "use_scale", "use_bias"), GRID
)
def test_matches_flax(images, name, x_dtype, param_dtype, use_scale, use_bias):
  ours, theirs = _pair(
    name,
    jax.random.key(1),
    param_dtype=param_dtype,
    use_scale=use_scale,
    use_bias=use_bias,
  )
  x = images.astype(x_dtype)
  _close(ours(x), _theirs(theirs, x))
  if name == "batchnorm":  # Then inference, from the updated statistics.
    for attr in ("mean", "var"):
      helpers.assert_close(
        getattr(ours, attr)[...], getattr(theirs, attr)[...], atol=1e-6
      )
    _close(ours(x, True), _theirs(theirs, x, True))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(FLAX))
def test_explicit_dtype_matches_flax(images, name, dtype):
  """An explicit ``dtype`` wider or narrower than the input."""
  ours, theirs = _pair(name, jax.random.key(2), dtype=dtype)
  for x in (images, images.astype(jnp.bfloat16)):
    _close(ours(x), _theirs(theirs, x))


@pytest.mark.parametrize(
  ("name", "kwargs"),
  [
    ("layernorm", {"reduction_axes": -1, "feature_axes": -1}),
    ("rmsnorm", {"reduction_axes": (-1,), "feature_axes": -1}),
    ("batchnorm", {"axis": -1}),
    ("instancenorm", {"feature_axes": -1}),
    ("groupnorm", {"reduction_axes": None}),
  ],
)
def test_axes_match_flax(images, name, kwargs):
  ours, theirs = _pair(name, jax.random.key(4), **kwargs)
  _close(ours(images), _theirs(theirs, images))


@pytest.mark.parametrize("reduction_axes", [-1, (2, 3), (1, 2, 3)])
def test_group_norm_reduction_axes_match_linen(images, reduction_axes):
  """Explicit ``reduction_axes`` against linen's GroupNorm (flax 0.12.8's
  nnx GroupNorm repeats the group statistics along axis 1, right only for
  the default axes)."""
  ours, _ = _pair("groupnorm", jax.random.key(4), reduction_axes=reduction_axes)
  theirs = nn.GroupNorm(
    num_groups=4, reduction_axes=reduction_axes, use_fast_variance=False
  )
  variables = {"params": {"scale": ours.scale[...], "bias": ours.bias[...]}}
  _close(ours(images), theirs.apply(variables, images))


@pytest.mark.parametrize(
  ("name", "mask_shape"),
  [
    ("layernorm", (4, 3, 3, D)),
    ("rmsnorm", (4, 3, 3, D)),
    ("groupnorm", (4, 3, 3, D)),
    ("instancenorm", (4, 3, 3, D)),
    ("instancenorm", (4, 3, 3, 1)),
    ("batchnorm", (4, 3, 3, 1)),
  ],
)
def test_masks_match_flax(images, name, mask_shape):
  mask = jax.random.bernoulli(jax.random.key(5), 0.7, mask_shape)
  ours, theirs = _pair(name, jax.random.key(6), use_fast_variance=False)
  _close(ours(images, mask=mask), _theirs(theirs, images, mask=mask))
  if name == "batchnorm":
    helpers.assert_close(ours.mean[...], theirs.mean[...], atol=1e-6)


def test_instance_norm_mask_is_per_example_and_channel(images):
  """Masked-out elements do not move the statistics, whatever their value."""
  mask = jax.random.bernoulli(jax.random.key(7), 0.5, images.shape)
  module = jnn.InstanceNorm(D, rngs=nnx.Rngs(0))
  moved = jnp.where(mask, images, 1e3)
  y = module(images, mask=mask)
  helpers.assert_close(
    jnp.where(mask, module(moved, mask=mask), 0.0),
    jnp.where(mask, y, 0.0),
    atol=1e-5,
  )
  with pytest.raises(ValueError, match=r"InstanceNorm: mask must have shape"):
    module(images, mask=mask[..., :2])
  with pytest.raises(ValueError, match=r"InstanceNorm: x must have"):
    module(images[:, 0, 0], mask=mask[:, 0, 0])


def _cast_all(to):
  def promote(args, *, dtype=None):
    del dtype
    return tuple(None if a is None else jnp.asarray(a, to) for a in args)

  return promote


@pytest.mark.parametrize(
  "promote",
  [
    nnx.nn.dtypes.promote_dtype,
    _cast_all(jnp.float16),
    lambda args, *, dtype=None: args,  # No promotion: flax's output rule.
  ],
  ids=["flax", "float16", "identity"],
)
@pytest.mark.parametrize("dtype", [None, jnp.bfloat16])
@pytest.mark.parametrize("name", sorted(FLAX))
def test_promote_dtype_matches_flax(images, name, dtype, promote):
  """The same ``promote_dtype`` callable: flax's output dtype and values,
  and the callable sees the same arguments as in flax."""
  seen = {"ours": [], "theirs": []}

  def spy(who):
    def fn(args, *, dtype=None):
      seen[who].append(tuple(None if a is None else a.dtype for a in args))
      return promote(args, dtype=dtype)

    return fn

  ours, theirs = _pair(name, jax.random.key(8), dtype=dtype)
  ours.promote_dtype, theirs.promote_dtype = spy("ours"), spy("theirs")
  x = images.astype(jnp.bfloat16)
  _close(ours(x), _theirs(theirs, x))
  assert seen["ours"] == seen["theirs"]


@pytest.mark.parametrize(
  ("args", "kwargs"),
  [
    ((2,), {"num_groups": 2}),
    ((None, 4), {"num_groups": None, "group_size": 4}),
  ],
)
def test_group_norm_positional(images, args, kwargs):
  positional = jnn.GroupNorm(D, *args, rngs=nnx.Rngs(0))
  keyword = jnn.GroupNorm(D, rngs=nnx.Rngs(0), **kwargs)
  flax = nnx.GroupNorm(D, *args, rngs=nnx.Rngs(0))
  assert positional.num_groups == keyword.num_groups == flax.num_groups
  np.testing.assert_array_equal(positional(images), keyword(images))
  _close(positional(images), _theirs(flax, images))


def test_batch_norm_statistics_are_float32(images):
  module = jnn.BatchNorm(D, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  flax = nnx.BatchNorm(D, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  assert module.scale[...].dtype == jnp.bfloat16
  for attr in ("mean", "var"):
    assert getattr(module, attr)[...].dtype == getattr(flax, attr)[...].dtype
    assert getattr(module, attr)[...].dtype == jnp.float32

  @nnx.jit
  def step(m, x):
    return m(x)

  step(module, images.astype(jnp.bfloat16))
  assert module.mean[...].dtype == module.var[...].dtype == jnp.float32
  assert not np.array_equal(module.mean[...], np.zeros(D))


def test_batch_norm_running_statistics_stop_the_gradient(images):
  """No gradient reaches the input through the updated running averages,
  while the output's gradient is untouched."""
  cotangent = jax.random.normal(jax.random.key(9), images.shape)

  def loss(x, with_stats):
    module = jnn.BatchNorm(D, momentum=0.5, rngs=nnx.Rngs(0))
    y = module(x)
    stats = jnp.sum(module.mean[...]) + jnp.sum(module.var[...])
    return jnp.sum(y * cotangent) + (stats if with_stats else 0.0)

  def stats_only(x):
    module = jnn.BatchNorm(D, momentum=0.5, rngs=nnx.Rngs(0))
    module(x)
    return jnp.sum(module.mean[...]) + jnp.sum(module.var[...])

  np.testing.assert_array_equal(jax.grad(stats_only)(images), 0.0)
  np.testing.assert_array_equal(
    jax.grad(loss)(images, True), jax.grad(loss)(images, False)
  )
