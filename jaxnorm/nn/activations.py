"""Modules for the activations in `jaxnorm.activations`.

They only hold parameters (stored as logarithms so positivity holds by
construction) and call the pure functions; see those for the maths.

Examples:
  >>> sorted(n for n, spec in ACTIVATIONS.items() if spec.build is not None)
  ['galu', 'salu', 'swalu']
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, activations
from jaxnorm.nn import _param


def _log_param(
  who: str, name: str, value: float, num_features: int, param_dtype, names
) -> nnx.Param:
  if not value > 0:
    raise ValueError(f"{who}: {name} must be > 0, got {name}={value!r}")
  v = jnp.full(
    (num_features,), jnp.log(jnp.asarray(value, jnp.float32)), param_dtype
  )
  return _param.param(v, names)


class SALU(nnx.Module):
  """SALU with per-channel amplitude ``S`` and width ``W`` (see `salu_sw`).

  Stores ``log_amplitude`` and ``log_width`` of shape ``(num_features,)`` and
  computes ``activations.salu_sw(x, exp(log_amplitude), exp(log_width))``
  over the last axis. The default init ``S = W = 1`` (``a = b = 1``) is
  unverified against the paper; for use as a normalization replacement a
  larger ``init_amplitude`` keeps it near-linear over the activation range.
  Use `from_gain_curvature` to initialize from the paper's ``(a, b)``.

  Examples:
    >>> salu = SALU(3)  # S = W = 1
    >>> salu.log_amplitude[...].tolist(), salu.log_width.shape
    ([0.0, 0.0, 0.0], (3,))
    >>> y = salu(jnp.array([-1.0, 0.0, 2.0], jnp.float32))
    >>> [round(v, 4) for v in y.tolist()]  # x / sqrt(1 + x^2) at S = W = 1
    [-0.7071, 0.0, 0.8944]
  """

  def __init__(
    self,
    num_features: int,
    *,
    init_amplitude: float = 1.0,
    init_width: float = 1.0,
    dtype=None,
    param_dtype=jnp.float32,
    axis_names: Sequence[str | None] | None = ("norm",),
    rngs: nnx.Rngs | None = None,
  ):
    del rngs  # Deterministic init; accepted for a uniform constructor.
    who = "SALU"
    _checks.check_positive_int(who, "num_features", num_features)
    self.num_features = num_features
    self.dtype = dtype
    self.log_amplitude = _log_param(
      who,
      "init_amplitude",
      init_amplitude,
      num_features,
      param_dtype,
      axis_names,
    )
    self.log_width = _log_param(
      who, "init_width", init_width, num_features, param_dtype, axis_names
    )

  @classmethod
  def from_gain_curvature(
    cls, num_features: int, gain: float, curvature: float, **kwargs
  ) -> SALU:
    """Builds a SALU whose initial ``(a, b)`` are ``(gain, curvature)``."""
    if not (gain > 0 and curvature > 0):
      raise ValueError(
        f"SALU: gain and curvature must be > 0, got {gain=}, {curvature=}"
      )
    s, w = activations.salu_sw_from_ab(gain, curvature)
    return cls(
      num_features, init_amplitude=float(s), init_width=float(w), **kwargs
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies SALU over the last axis; output in ``dtype`` or ``x.dtype``."""
    if x.shape[-1:] != (self.num_features,):
      raise ValueError(
        f"SALU: x must have num_features={self.num_features} channels on "
        f"its last axis, got {x.shape=}"
      )
    dt = self.dtype or x.dtype
    s = jnp.exp(self.log_amplitude[...].astype(jnp.float32))
    w = jnp.exp(self.log_width[...].astype(jnp.float32))
    return activations.salu_sw(x.astype(dt), s, w)


class _Gate(nnx.Module):
  _fn = None
  _default_width = 1.0

  def __init__(
    self,
    num_features: int,
    *,
    init_width: float | None = None,
    experimental: bool = False,
    dtype=None,
    param_dtype=jnp.float32,
    axis_names: Sequence[str | None] | None = ("norm",),
    rngs: nnx.Rngs | None = None,
  ):
    del rngs
    who = type(self).__name__
    if not experimental:
      raise ValueError(
        f"{who}: the SaluNet gate formula is unverified (jaxnorm's own "
        f"design); pass experimental=True, got {experimental=}"
      )
    _checks.check_positive_int(who, "num_features", num_features)
    self.num_features = num_features
    self.dtype = dtype
    width = self._default_width if init_width is None else init_width
    self.log_width = _log_param(
      who, "init_width", width, num_features, param_dtype, axis_names
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the gate over the last axis."""
    dt = self.dtype or x.dtype
    w = jnp.exp(self.log_width[...].astype(jnp.float32))
    return type(self)._fn(x.astype(dt), w, experimental=True)


class SWALU(_Gate):
  """Learnable-width SWALU gate (experimental; see `activations.swalu`).

  Examples:
    >>> gate = SWALU(3, experimental=True)  # refused without experimental
    >>> y = gate(jnp.array([-1.0, 0.0, 2.0], jnp.float32))
    >>> gate.log_width.shape, [round(v, 4) for v in y.tolist()]
    ((3,), [-0.2764, 0.0, 1.7071])
  """

  _fn = staticmethod(activations.swalu)
  _default_width = activations.SWALU_WIDTH


class GALU(_Gate):
  """Learnable-width GALU gate (experimental; see `activations.galu`).

  Examples:
    >>> gate = GALU(3, experimental=True)  # refused without experimental
    >>> y = gate(jnp.array([-1.0, 0.0, 2.0], jnp.float32))
    >>> gate.log_width.shape, [round(v, 4) for v in y.tolist()]
    ((3,), [-0.1882, 0.0, 1.8474])
  """

  _fn = staticmethod(activations.galu)
  _default_width = activations.GALU_WIDTH


class AlphaDropout(nnx.Module):
  """Alpha-dropout for SELU networks (see `activations.alpha_dropout`).

  Draws its keep-mask from the ``dropout`` stream of ``rngs``. Like
  `nnx.Dropout`, it is active unless ``deterministic`` is True: set it here,
  per call, through ``model.eval()`` / ``model.train()``, or through flax's
  view protocol, ``nnx.view(model, deterministic=True)`` (`set_view`).

  Examples:
    >>> drop = AlphaDropout(0.5, rngs=nnx.Rngs(dropout=0))
    >>> x = jnp.ones((2, 4), jnp.float32)
    >>> drop(x).shape  # training: a random keep-mask
    (2, 4)
    >>> drop.eval()
    >>> bool((drop(x) == x).all())  # deterministic: the identity
    True
  """

  def __init__(
    self,
    rate: float,
    *,
    deterministic: bool = False,
    rng_collection: str = "dropout",
    rngs: nnx.Rngs | None = None,
  ):
    activations.alpha_dropout_constants(rate)  # Validates the rate.
    self.rate = rate
    self.deterministic = deterministic
    self.rngs = (
      rngs[rng_collection].fork() if rngs is not None else nnx.data(None)
    )

  def __call__(
    self,
    x: jax.Array,
    *,
    deterministic: bool | None = None,
    key: jax.Array | None = None,
  ) -> jax.Array:
    """Applies alpha-dropout; ``key`` overrides the module's stream."""
    det = self.deterministic if deterministic is None else deterministic
    if det or self.rate == 0.0:
      return x
    if key is None:
      if self.rngs is None:
        raise ValueError(
          "AlphaDropout: deterministic is False but the module has no rngs; "
          "pass rngs=nnx.Rngs(dropout=...) or key=... to the call"
        )
      key = self.rngs()
    return activations.alpha_dropout(x, self.rate, key=key)

  def set_view(self, deterministic: bool | None = None) -> None:
    """Sets the mode for ``nnx.view`` (flax's view protocol).

    Args:
      deterministic: if True, disables the dropout (inference); ``None``
        leaves the mode unchanged.
    """
    if deterministic is not None:
      self.deterministic = deterministic


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
  """A registered activation.

  Attributes:
    fn: the elementwise function, or ``None`` for a learnable activation.
    build: ``build(width, rngs) -> module`` of a learnable activation.
    gated: a GLU form: the MLP's up projection is doubled and the output is
      ``fn(a) * b``.

  Examples:
    >>> spec = ACTIVATIONS["swiglu"]
    >>> spec.gated, spec.elementwise, spec.fn is jax.nn.silu
    (True, False, True)
    >>> type(ACTIVATIONS["salu"].build(4, nnx.Rngs(0))).__name__
    'SALU'
  """

  fn: Callable[[jax.Array], jax.Array] | None = None
  build: Callable[[int, nnx.Rngs], nnx.Module] | None = None
  gated: bool = False

  @property
  def elementwise(self) -> bool:
    """A plain elementwise function (neither gated nor learnable)."""
    return self.build is None and not self.gated


def _gelu(x: jax.Array) -> jax.Array:
  return jax.nn.gelu(x, approximate=False)


ACTIVATIONS: Mapping[str, ActivationSpec] = types.MappingProxyType(
  {
    "gelu": ActivationSpec(_gelu),
    "relu": ActivationSpec(jax.nn.relu),
    "silu": ActivationSpec(jax.nn.silu),
    "elu": ActivationSpec(activations.elu),
    "selu": ActivationSpec(activations.selu),
    "swiglu": ActivationSpec(jax.nn.silu, gated=True),
    "geglu": ActivationSpec(_gelu, gated=True),
    "salu": ActivationSpec(build=lambda w, rngs: SALU(w, rngs=rngs)),
    "swalu": ActivationSpec(
      build=lambda w, rngs: SWALU(w, experimental=True, rngs=rngs)
    ),
    "galu": ActivationSpec(
      build=lambda w, rngs: GALU(w, experimental=True, rngs=rngs)
    ),
  }
)
"""The MLP activations the models accept, by name."""
