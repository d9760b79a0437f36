"""Single-stream residual steps and their network (`ResidualStack`).

The steps of pre-norm, post-norm, sandwich, the scaled residual (depth rule)
and the gated ones (SkipInit, ReZero, LayerScale), the builders that the
specs of those schemes carry, and the stack of one-stream steps (with the
fused pre-norm path).

Examples:
  >>> step = PreNormResidual(4, norm=None, rngs=nnx.Rngs(0))  # x + f(x)
  >>> step(jnp.ones((1, 4), jnp.float32), lambda h: 2.0 * h).tolist()
  [[3.0, 3.0, 3.0, 3.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import _param, layers
from jaxnorm.nn.residual._common import (
  Branch,
  NormSpec,
  Placement,
  StepBuilder,
  Sublayer,
  build_norm,
  check_blocks,
  check_input,
  params_key,
  read_index,
  stack_steps,
  store_index,
)


def _identity(x: jax.Array) -> jax.Array:
  return x


class PreNormResidual(nnx.Module):
  """Pre-norm step ``x + f(norm(x))``; see `jaxnorm.residual.pre_norm`.

  ``layer_index`` (0-based Transformer layer: a Python integer, or an
  integer scalar array when the layers are created under ``nnx.vmap`` for
  ``nnx.scan``) enables LayerNorm Scaling. ``norm=None`` is the norm-free
  step ``x + f(x)``.

  Examples:
    >>> step = PreNormResidual(4, norm="rmsnorm", rngs=nnx.Rngs(0))
    >>> x = jnp.full((2, 4), 3.0, jnp.float32)  # RMS 3: norm(x) is 1
    >>> [round(v, 4) for v in step(x, lambda h: 2.0 * h)[0].tolist()]
    [5.0, 5.0, 5.0, 5.0]
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "PreNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = params_key(rngs)
    self.num_features = num_features
    self.layer_index = store_index(layer_index)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    norm = _identity if self.norm is None else self.norm
    return residual.pre_norm(
      x, sublayer, norm, layer_index=read_index(self.layer_index)
    )


class PostNormResidual(nnx.Module):
  """Post-norm step ``norm(x + f(x))``; see `jaxnorm.residual.post_norm`.

  Examples:
    >>> step = PostNormResidual(2, rngs=nnx.Rngs(0))  # LayerNorm
    >>> x = jnp.array([[1.0, 3.0]], jnp.float32)
    >>> [round(v, 4) for v in step(x, lambda h: h)[0].tolist()]  # norm(2 x)
    [-1.0, 1.0]
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "layernorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("PostNormResidual", "num_features", num_features)
    key = params_key(rngs)
    self.num_features = num_features
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.post_norm(x, sublayer, self.norm)


class SandwichNormResidual(nnx.Module):
  """Sandwich step ``x + norm_out(f(norm_in(x)))``.

  See `jaxnorm.residual.sandwich_norm`; both norms are built by name.
  ``layer_index`` applies LayerNorm Scaling to ``norm_in`` as in
  `PreNormResidual`.

  Examples:
    >>> step = SandwichNormResidual(4, rngs=nnx.Rngs(0))  # two RMSNorms
    >>> sorted(nnx.to_pure_dict(nnx.state(step, nnx.Param)))
    ['norm_in', 'norm_out']
    >>> x = jnp.full((1, 4), 3.0, jnp.float32)
    >>> [round(v, 4) for v in step(x, lambda h: 5.0 * h)[0].tolist()]  # 3 + 1
    [4.0, 4.0, 4.0, 4.0]
  """

  def __init__(
    self,
    num_features: int,
    *,
    norm: str = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    layer_index: residual.IndexLike | None = None,
    rngs: nnx.Rngs,
  ):
    who = "SandwichNormResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    residual.check_layer_index(who, layer_index)
    key = params_key(rngs)
    self.num_features = num_features
    self.layer_index = store_index(layer_index)
    self.norm_in = build_norm(norm, num_features, norm_kwargs, key, 0)
    self.norm_out = build_norm(norm, num_features, norm_kwargs, key, 1)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.sandwich_norm(
      x,
      sublayer,
      self.norm_in,
      self.norm_out,
      layer_index=read_index(self.layer_index),
    )


class ScaledResidual(nnx.Module):
  """Constant depth-scaled step ``x + lam * f(norm(x))``.

  ``lam = residual.residual_scale(num_residuals, scale)``: ``"1/n"`` (the
  rule of Dherin & Munn), ``"1/sqrt(n)"`` or a float. ``norm=None`` (the
  paper's normalization-free setting) drops the norm. No parameters beyond
  the norm's. See `jaxnorm.residual.scaled_residual`.

  Examples:
    >>> step = ScaledResidual(4, num_residuals=8, norm=None, rngs=nnx.Rngs(0))
    >>> step.scale  # "1/n"
    0.125
    >>> step(jnp.ones((1, 4), jnp.float32), lambda h: 4.0 * h).tolist()
    [[1.5, 1.5, 1.5, 1.5]]
  """

  def __init__(
    self,
    num_features: int,
    *,
    num_residuals: int,
    scale: residual.ScaleRule | float = "1/n",
    norm: NormSpec = "rmsnorm",
    norm_kwargs: Mapping | None = None,
    rngs: nnx.Rngs,
  ):
    _checks.check_positive_int("ScaledResidual", "num_features", num_features)
    key = params_key(rngs)
    self.num_features = num_features
    self.scale = residual.residual_scale(num_residuals, scale)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.scale, norm=self.norm)


class GatedResidual(nnx.Module):
  """Learned branch gate ``x + g * f(norm(x))`` (SkipInit, ReZero, LayerScale).

  ``shape="scalar"``: one ``gate`` (shape ``(1,)``), SkipInit / ReZero with
  ``init_value=0`` and ``norm=None``: the gate multiplies the end of the
  residual branch, as SkipInit's official code (``skipinit_gain``, one per
  residual block) and ReZero's (``resweight``; one per Transformer layer,
  shared by its attention and MLP: `make_residual` shares one module across
  the sublayers of a layer). ``shape="vector"``: a per-channel ``gate``
  (shape ``(d,)``), LayerScale with a pre-norm and a small ``init_value``
  (CaiT: 0.1 up to depth 18, 1e-5 at 24, 1e-6 beyond). See
  `jaxnorm.residual.scaled_residual`.

  Examples:
    >>> step = GatedResidual(4, rngs=nnx.Rngs(0))  # SkipInit: one gate, 0
    >>> step.gate[...].tolist()
    [0.0]
    >>> x = jnp.ones((1, 4), jnp.float32)
    >>> bool((step(x, jnp.tanh) == x).all())  # the identity at init
    True
    >>> GatedResidual(4, shape="vector", rngs=nnx.Rngs(0)).gate.shape
    (4,)
  """

  def __init__(
    self,
    num_features: int,
    *,
    shape: Literal["scalar", "vector"] = "scalar",
    init_value: float = 0.0,
    norm: NormSpec = None,
    norm_kwargs: Mapping | None = None,
    param_dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
  ):
    who = "GatedResidual"
    _checks.check_positive_int(who, "num_features", num_features)
    _checks.check_choice(who, "shape", shape, ("scalar", "vector"))
    key = params_key(rngs)
    self.num_features = num_features
    size = 1 if shape == "scalar" else num_features
    names = (None,) if shape == "scalar" else ("norm",)
    self.gate = _param.param(jnp.full((size,), init_value, param_dtype), names)
    self.norm = build_norm(norm, num_features, norm_kwargs, key)

  def __call__(self, x: jax.Array, sublayer: Sublayer) -> jax.Array:
    """Applies one residual step around ``sublayer``."""
    check_input(type(self).__name__, x, self.num_features)
    return residual.scaled_residual(x, sublayer, self.gate[...], norm=self.norm)


# ---------------------------------------------------------------------------
# Step builders (``ResidualSpec.step``): ``step(num_features, place, *,
# rngs, **options)``.


def make_prenorm_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> PreNormResidual:
  """Pre-norm's step, the same at every place."""
  del place
  return PreNormResidual(num_features, rngs=rngs, **options)


def make_lns_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> PreNormResidual:
  """LayerNorm Scaling's step: the pre-norm step of layer ``place.layer``."""
  return PreNormResidual(
    num_features, layer_index=place.layer, rngs=rngs, **options
  )


def make_postnorm_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> PostNormResidual:
  """Post-norm's step, the same at every place."""
  del place
  return PostNormResidual(num_features, rngs=rngs, **options)


def make_sandwich_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> SandwichNormResidual:
  """Sandwich's step, the same at every place."""
  del place
  return SandwichNormResidual(num_features, rngs=rngs, **options)


def make_scaled_step(
  num_features: int, place: Placement, *, rngs: nnx.Rngs, **options: Any
) -> ScaledResidual:
  """The scaled residual's step: its rule reads the stack's sublayers."""
  return ScaledResidual(
    num_features, num_residuals=place.num_sublayers, rngs=rngs, **options
  )


def make_gated_step(
  num_features: int,
  place: Placement,
  *,
  shape: Literal["scalar", "vector"],
  rngs: nnx.Rngs,
  **options: Any,
) -> GatedResidual:
  """A gated step (``shape``: SkipInit, ReZero scalar; LayerScale vector)."""
  del place
  return GatedResidual(num_features, shape=shape, rngs=rngs, **options)


# ---------------------------------------------------------------------------
# The network of one-stream steps.


class ResidualStack(nnx.Module):
  """Single-stream network: ``x = steps[k](x, blocks[k])`` for every k.

  ``steps`` are residual-step modules (`PreNormResidual`, ...), one per
  sublayer (one module may serve several sublayers, e.g. ReZero's gate
  shared by a layer's attention and MLP).

  ``remat`` (`jaxnorm.nn.layers.REMAT_CHOICES`) runs every sublayer under
  that `jax.checkpoint` policy (`Branch`); the parameters are unchanged.

  ``fused=True`` (pre-norm steps without LayerNorm Scaling whose norms have
  an ``add_and_norm`` method, e.g. `RMSNorm`, `LayerNorm`) runs each
  residual add together with the next step's norm, ``(h, y) =
  norm.add_and_norm(f(y_prev), h)`` (one kernel pass when the norm's
  ``implementation`` is ``"pallas"``); the recurrence is
  `jaxnorm.residual.fused_pre_norm`. The result equals the unfused stack.

  Examples:
    >>> steps = [PreNormResidual(4, rngs=nnx.Rngs(k)) for k in range(2)]
    >>> net = ResidualStack([jnp.tanh, jnp.tanh], steps, num_features=4)
    >>> y, hidden = net(jnp.ones((3, 4), jnp.float32), return_hidden=True)
    >>> y.shape, hidden.shape  # hidden: (num_sublayers, ..., d)
    ((3, 4), (2, 3, 4))
  """

  def __init__(
    self,
    blocks: Sequence[Sublayer],
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    fused: bool = False,
    remat: layers.RematName = "none",
  ):
    who = "ResidualStack"
    layers.check_remat(who, remat)
    blocks = check_blocks(who, blocks)
    if len(steps) != len(blocks):
      raise ValueError(
        f"{who}: need one step per block, got "
        f"{len(steps)} steps for {len(blocks)} blocks"
      )
    for k, step in enumerate(steps if fused else ()):
      if not (
        isinstance(step, PreNormResidual)
        and step.layer_index is None
        and hasattr(step.norm, "add_and_norm")
      ):
        raise NotImplementedError(
          f"{who}: fused needs pre-norm steps whose norm has a fused "
          f"add_and_norm (RMSNorm, LayerNorm) and no LayerNorm Scaling; "
          f"steps[{k}] is {type(step).__name__} with norm "
          f"{type(getattr(step, 'norm', None)).__name__}"
        )
    self.num_features, self.fused, self.remat = num_features, fused, remat
    self.blocks, self.steps = nnx.List(blocks), nnx.List(steps)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the network on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns the hidden state after every
    sublayer, stacked to ``(num_sublayers, ..., d)``.
    """
    check_input("ResidualStack", x, self.num_features)
    if self.fused:
      return residual.fused_pre_norm(
        x,
        [Branch(block, self.remat) for block in self.blocks],
        self.steps[0].norm,
        [step.norm.add_and_norm for step in self.steps[1:]],
        return_hidden=return_hidden,
      )
    hidden = []
    for block, step in zip(self.blocks, self.steps):
      x = step(x, Branch(block, self.remat))
      hidden.append(x)
    return (x, jnp.stack(hidden)) if return_hidden else x


def make_residual_stack(
  blocks: list[Sublayer],
  step: StepBuilder,
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int,
  fused_implementation: str | None = None,
  remat: layers.RematName = "none",
  **options: Any,
) -> ResidualStack:
  """A `ResidualStack` of the steps ``step`` makes, one per sublayer.

  ``fused_implementation`` (``"xla"`` or ``"pallas"``; `make_residual`
  admits it for the schemes whose spec is ``fused``) becomes the norms'
  ``implementation``, which runs each residual add fused into the next
  norm (``add_and_norm``).
  """
  who = "make_residual"
  fused = fused_implementation
  if fused is not None:
    _checks.check_choice(who, "fused_implementation", fused, ("xla", "pallas"))
    norm_kwargs = dict(options.get("norm_kwargs") or {})
    if norm_kwargs.setdefault("implementation", fused) != fused:
      raise ValueError(
        f"{who}: fused_implementation={fused!r} conflicts with "
        f"norm_kwargs implementation={norm_kwargs['implementation']!r}"
      )
    options["norm_kwargs"] = norm_kwargs
  steps = stack_steps(
    step,
    num_features,
    len(blocks),
    sublayers_per_layer=sublayers_per_layer,
    rngs=rngs,
    **options,
  )
  return ResidualStack(
    blocks,
    steps,
    num_features=num_features,
    fused=fused is not None,
    remat=remat,
  )
