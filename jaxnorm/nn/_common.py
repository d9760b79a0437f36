"""Helpers the models share: which parts a model accepts, and its residual.

`check_parts` reads the parts' specs, never their names: a model states its
layout and whether it is causal, and the norm and attention registries'
capabilities decide (`valid_norms`, `valid_attentions` list the names that
pass). `residual` wraps a model's sublayers into the named residual scheme;
`ScannedStack` builds the same network with its layers stacked on a leading
``layers`` axis and runs it with ``nnx.scan``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import residual as residual_fns
from jaxnorm import sharding
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import layers, registry
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import residual as nn_residual

LAYERS = "layers"
"""The logical name of the leading axis of a scanned stack's variables."""


def layer_axis_name() -> str | None:
  """The name the ``layers`` axis gets in variables created now.

  ``"layers"``, or None (replicated, with one warning) under a mesh whose
  active rules lack it (`jaxnorm.sharding.param_names`), as every logical
  name of a jaxnorm parameter.
  """
  return sharding.param_names((LAYERS,))[0]


# ---------------------------------------------------------------------------
# Which parts a model accepts, from the parts' specs.


_COMPLEX_REFUSAL = (
  "is complex-valued (complex inputs and outputs), and this model is real; "
  "the complex models are jaxnorm.nn.cplx.ComplexLM and CVCNN (runner "
  "--model clm, cvcnn)"
)
_REAL_REFUSAL = (
  "is real-valued, and this model is complex-valued (complex inputs and "
  "outputs): it takes the complex parts only"
)


def _kind_refusal(kind: str, dtype_kind: str) -> str | None:
  """Why a model of ``dtype_kind`` refuses a part of ``kind``, or None."""
  if kind == dtype_kind:
    return None
  return _COMPLEX_REFUSAL if dtype_kind == "real" else _REAL_REFUSAL


def _norm_refusal(
  spec: registry.NormSpec,
  layout: str,
  causal: bool,
  allow_batch_stats: bool,
  *,
  dtype_kind: str = "real",
) -> str | None:
  """Why a model of ``layout`` (causal or not) refuses a norm, or None."""
  kind = _kind_refusal(spec.dtype_kind, dtype_kind)
  if kind is not None:
    return kind
  if layout not in spec.layouts:
    return (
      f"does not normalize the {layout} layout (it supports "
      f"{', '.join(sorted(spec.layouts))})"
    )
  if causal and not spec.causal:
    return (
      "is not causal in the tokens layout (its statistics at position t "
      "use later positions)"
    )
  if causal and spec.batch_stats and not allow_batch_stats:
    # The complex LM has no opt-in: it takes no batch statistics.
    fix = (
      "; set allow_batch_stats=True in the config to accept this"
      if dtype_kind == "real"
      else ""
    )
    return (
      "takes batch statistics in training mode (over batch and sequence, so "
      f"position t sees later tokens){fix}"
    )
  return None


def valid_norms(
  layout: str,
  causal: bool,
  allow_batch_stats: bool,
  *,
  dtype_kind: str = "real",
) -> tuple[str, ...]:
  """The sorted norm names a model of ``layout`` (causal or not) accepts.

  ``dtype_kind`` is the kind of the model: ``"real"`` admits the real norms,
  ``"complex"`` the complex ones (`jaxnorm.nn.cplx.NORM_SPECS`).
  """
  return tuple(
    sorted(
      name
      for name, spec in nn_norms.NORMS.items()
      if _norm_refusal(
        spec, layout, causal, allow_batch_stats, dtype_kind=dtype_kind
      )
      is None
    )
  )


def valid_attentions(
  layout: str, causal: bool, *, dtype_kind: str = "real"
) -> tuple[str, ...]:
  """The sorted attention names a model of ``layout`` (causal or not) takes.

  ``dtype_kind`` is the kind of the model: ``"real"`` admits the real cores,
  ``"complex"`` the complex ones (`jaxnorm.nn.cplx.ATTENTION_SPECS`).
  """
  return tuple(
    sorted(
      name
      for name, spec in nn_attention.ATTENTIONS.items()
      if layout in spec.layouts
      and (spec.causal or not causal)
      and spec.dtype_kind == dtype_kind
    )
  )


def check_parts(
  who: str,
  *,
  layout: str,
  causal: bool,
  norm: str | None = None,
  attention: str | None = None,
  allow_batch_stats: bool = False,
  dtype_kind: str = "real",
  extra_attentions: tuple[str, ...] = (),
) -> None:
  """Refuses, before anything is built, parts a model cannot run faithfully.

  Args:
    who: the model's name, for the message.
    layout: the layout the model's norms and attention see (``tokens`` or
      ``images``).
    causal: the model is autoregressive: position ``t`` may depend on
      positions ``<= t`` only, so attention needs a causal form and norms a
      causal statistic (batch statistics only with ``allow_batch_stats``).
    norm: the norm name (None or `jaxnorm.nn.residual.NORM_FREE`: no
      norm).
    attention: the attention name (None: the model has no attention).
    allow_batch_stats: the explicit opt-in for batch-statistics norms.
    dtype_kind: the kind of the model, ``"real"`` or ``"complex"``: its
      norms and attention cores must be of the same kind (a spec's
      ``dtype_kind``).
    extra_attentions: names the model accepts besides the registry's
      (`ComplexLM`'s ``"fourier"`` mixing): accepted as they are, and
      listed among the valid choices.

  Raises:
    ValueError: naming the part, the reason and the valid alternatives.
  """
  if attention is not None and attention not in extra_attentions:
    valid = ", ".join(
      sorted(
        valid_attentions(layout, causal, dtype_kind=dtype_kind)
        + tuple(extra_attentions)
      )
    )
    if attention not in nn_attention.ATTENTIONS:
      raise ValueError(
        f"{who}: unknown attention {attention!r}; valid names are {valid}"
      )
    spec = nn_attention.ATTENTIONS[attention]
    kind = _kind_refusal(spec.dtype_kind, dtype_kind)
    if kind is not None:
      raise ValueError(
        f"{who}: attention {attention!r} {kind}; choose one of {valid}"
      )
    if layout not in spec.layouts:
      raise ValueError(
        f"{who}: attention {attention!r} does not act on the {layout} "
        f"layout; choose one of {valid}"
      )
    if causal and not spec.causal:
      raise ValueError(
        f"{who}: attention {attention!r} has no causal form, so a decoder "
        f"would see future tokens; choose one of {valid}"
      )
  if norm is None or norm == nn_residual.NORM_FREE:
    return
  valid = ", ".join(
    valid_norms(layout, causal, allow_batch_stats, dtype_kind=dtype_kind)
  )
  if norm not in nn_norms.NORMS:
    raise ValueError(f"{who}: unknown norm {norm!r}; valid names are {valid}")
  reason = _norm_refusal(
    nn_norms.NORMS[norm],
    layout,
    causal,
    allow_batch_stats,
    dtype_kind=dtype_kind,
  )
  if reason is not None:
    raise ValueError(f"{who}: norm {norm!r} {reason}; choose one of {valid}")


# ---------------------------------------------------------------------------
# The residual scheme.


def _residual_kwargs(
  spec: registry.ResidualSpec | None,
  norm: str | None,
  norm_kwargs: Mapping[str, Any],
) -> dict[str, Any]:
  """The norm options, for the schemes whose spec places norms."""
  if spec is not None and spec.uses_norm:
    return {"norm": norm, "norm_kwargs": dict(norm_kwargs)}
  return {}


def residual(
  name: str,
  blocks: list[nnx.Module],
  *,
  width: int,
  per_layer: int,
  norm: str | None,
  norm_kwargs: Mapping[str, Any],
  rngs: nnx.Rngs,
  remat: layers.RematName = "none",
) -> nnx.Module:
  """Wraps the sublayers (``per_layer`` per layer) into the scheme.

  `make_residual` starts from the scheme's spec defaults; the norm goes to
  the schemes whose spec places norms (``uses_norm``). A ``remat`` other
  than ``"none"`` runs every sublayer under that `jax.checkpoint` policy;
  the parameters are the same for every ``remat``.
  """
  spec = nn_residual.RESIDUALS.get(name)
  return nn_residual.make_residual(
    name,
    blocks,
    num_features=width,
    rngs=rngs,
    sublayers_per_layer=per_layer,
    remat=remat,
    **_residual_kwargs(spec, norm, norm_kwargs),
  )


# ---------------------------------------------------------------------------
# The scanned stack.


def check_scannable(who: str, name: str) -> None:
  """Raises `ValueError` if the residual scheme ``name`` cannot be scanned.

  The reason is the spec's ``scan_refusal``; an unknown name is left to
  `make_residual_step`, whose message lists the valid names.
  """
  spec = nn_residual.RESIDUALS.get(name)
  if spec is not None and not spec.scannable:
    raise ValueError(
      f"{who}: residual {name!r} cannot be scanned: {spec.scan_refusal}; "
      "use scan_layers=False"
    )


def _name_scalar_layer_axes(stacked: nnx.Module, name: str | None) -> None:
  """Names the layer axis of parameters stacked from scalars.

  flax 0.12's ``nnx.vmap`` and ``nnx.scan`` insert the axis name into a
  non-empty ``out_sharding`` only, while ``nnx.scan`` removes it from every
  ``out_sharding`` that is not None (an empty one fails), so a scalar
  parameter named ``()`` (HC's ``alpha_scale``) gets ``(name,)`` here,
  after the stacking and after every scan.
  """
  for _, var in nnx.iter_graph(stacked):
    if (
      isinstance(var, nnx.Variable)
      and var.get_metadata().get("out_sharding") == ()
    ):
      var.set_metadata(out_sharding=(name,))


class ScanLayer(nnx.Module):
  """One layer of a `ScannedStack`: its sublayers and their residual steps.

  ``blocks`` are the layer's sublayers in order (attention, MLP) and
  ``res`` the `jaxnorm.nn.residual.ResidualLayer` that wires them.
  """

  def __init__(
    self, blocks: Sequence[nnx.Module], res: nn_residual.ResidualLayer
  ):
    self.blocks, self.res = nnx.List(blocks), res

  def __call__(self, carry: jax.Array) -> jax.Array:
    """The carry after this layer's residual steps."""
    return self.res(carry, list(self.blocks))


class ScannedStack(nnx.Module):
  """A residual network whose layers are stacked and run by ``nnx.scan``.

  The layers are built by ``nnx.vmap`` over ``nnx.split_rngs``: each holds
  the sublayers ``make_blocks(rngs)`` returns and the scheme's
  `jaxnorm.nn.residual.make_residual_step`, so every parameter gets a
  leading axis of length ``depth`` named ``layers`` (`layer_axis_name`:
  ``transform_metadata={nnx.PARTITION_NAME: "layers"}``), and the
  program holds one layer whatever the depth: compile time is flat in
  depth. The forward is an ``nnx.scan`` whose carry is the residual stream
  (the stream state of the multi-stream schemes); with ``remat`` other than
  ``"none"`` the scan body runs under `nnx.remat` with that policy, so the
  backward pass keeps each layer's input carry and what the policy saves
  (nothing more with ``"full"``).

  It computes the network `residual` builds from the same sublayers and
  parameters (`jaxnorm.nn.models.stack_layers` converts one layout to the
  other). DeepNorm's init gain (its spec default ``init_gain``) scales each
  layer's sublayers by ``jaxnorm.residual.deepnorm_beta(depth)`` inside the
  stacking, as `make_residual` does on the unrolled list.

  Args:
    name: a scheme of `jaxnorm.nn.residual.SCAN_RESIDUALS`.
    make_blocks: ``make_blocks(rngs)`` returns one layer's sublayers.
    width: hidden size ``d``.
    depth: number of layers.
    per_layer: sublayers per layer (``len(make_blocks(rngs))``).
    norm: the norm name (for the schemes whose spec places norms).
    norm_kwargs: options of every norm.
    rngs: parameter RNG streams (split across the layers).
    remat: `jaxnorm.nn.layers.REMAT_CHOICES`.
    finish: called on each built layer inside the stacking (e.g. the int8
      swap of its dense layers).

  Raises:
    ValueError: for a scheme that cannot be scanned (its spec's
      ``scan_refusal``), an unknown ``remat``, or a bad option.
  """

  def __init__(
    self,
    name: str,
    make_blocks: Callable[[nnx.Rngs], list[nnx.Module]],
    *,
    width: int,
    depth: int,
    per_layer: int,
    norm: str | None,
    norm_kwargs: Mapping[str, Any],
    rngs: nnx.Rngs,
    remat: layers.RematName = "none",
    finish: Callable[[ScanLayer], Any] | None = None,
  ):
    who = "ScannedStack"
    check_scannable(who, name)
    layers.check_remat(who, remat)
    spec = nn_residual.RESIDUALS.get(name)
    kwargs = _residual_kwargs(spec, norm, norm_kwargs)
    num_sublayers = depth * per_layer
    defaults = {} if spec is None else spec.defaults(num_sublayers, per_layer)
    gain = (
      residual_fns.deepnorm_beta(depth) if defaults.get("init_gain") else None
    )
    self.depth, self.remat = depth, remat
    self.layer_axis = layer_axis_name()
    axis = {nnx.PARTITION_NAME: self.layer_axis}

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0, 0), transform_metadata=axis)
    def create(index: jax.Array, rngs: nnx.Rngs) -> ScanLayer:
      blocks = make_blocks(rngs)
      if gain is not None:
        nn_residual.scale_branch_init(blocks, gain)
      res = nn_residual.make_residual_step(
        name,
        width,
        layer_index=index,
        num_layers=depth,
        rngs=rngs,
        sublayers_per_layer=per_layer,
        **kwargs,
      )
      layer = ScanLayer(blocks, res)
      if finish is not None:
        finish(layer)
      return layer

    self.layers = create(jnp.arange(depth), rngs)
    _name_scalar_layer_axes(self.layers, self.layer_axis)

  def __call__(
    self, x: jax.Array, *, return_hidden: bool = False
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Runs the layers on ``x`` ``(..., d)``.

    With ``return_hidden``, also returns the hidden state after every
    layer (not every sublayer, as `residual`'s stacks do), stacked to
    ``(depth, ..., d)``.
    """
    res = self.layers.res

    def body(carry: jax.Array, layer: ScanLayer):
      carry = layer(carry)
      return carry, layer.res.output(carry) if return_hidden else None

    scan = nnx.scan(
      layers.rematerialize(body, self.remat),
      in_axes=(nnx.Carry, 0),
      out_axes=(nnx.Carry, 0),
      transform_metadata={nnx.PARTITION_NAME: self.layer_axis},
    )
    carry, hidden = scan(res.embed(x), self.layers)
    # The scan wrote ``()`` back.
    _name_scalar_layer_axes(self.layers, self.layer_axis)
    out = res.output(carry)
    return (out, hidden) if return_hidden else out
