"""Helpers the models share: which parts a model accepts, and its residual.

`check_parts` reads the parts' specs, never their names: a model states its
layout and whether it is causal, and the norm and attention registries'
capabilities decide (`valid_norms`, `valid_attentions` list the names that
pass). `residual` wraps a model's sublayers into the named residual scheme.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import registry
from jaxnorm.nn import residual as nn_residual

# ---------------------------------------------------------------------------
# Which parts a model accepts, from the parts' specs.


_COMPLEX_REFUSAL = (
  "is complex-valued (complex inputs and outputs), and this model is real; "
  "the complex models are jaxnorm.nn.cplx.ComplexLM and CVCNN (runner "
  "--model clm, cvcnn)"
)


def _norm_refusal(
  spec: registry.NormSpec, layout: str, causal: bool, allow_batch_stats: bool
) -> str | None:
  """Why a model of ``layout`` (causal or not) refuses a norm, or None."""
  if spec.dtype_kind != "real":
    return _COMPLEX_REFUSAL
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
    return (
      "takes batch statistics in training mode (over batch and sequence, so "
      "position t sees later tokens); set allow_batch_stats=True in the "
      "config to accept this"
    )
  return None


def valid_norms(
  layout: str, causal: bool, allow_batch_stats: bool
) -> tuple[str, ...]:
  """The sorted norm names a model of ``layout`` (causal or not) accepts."""
  return tuple(
    sorted(
      name
      for name, spec in nn_norms.NORMS.items()
      if _norm_refusal(spec, layout, causal, allow_batch_stats) is None
    )
  )


def valid_attentions(layout: str, causal: bool) -> tuple[str, ...]:
  """The sorted attention names a model of ``layout`` (causal or not) takes."""
  return tuple(
    sorted(
      name
      for name, spec in nn_attention.ATTENTIONS.items()
      if layout in spec.layouts
      and (spec.causal or not causal)
      and spec.dtype_kind == "real"
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

  Raises:
    ValueError: naming the part, the reason and the valid alternatives.
  """
  if attention is not None:
    valid = valid_attentions(layout, causal)
    if attention not in nn_attention.ATTENTIONS:
      raise ValueError(
        f"{who}: unknown attention {attention!r}; valid names are "
        f"{', '.join(valid)}"
      )
    spec = nn_attention.ATTENTIONS[attention]
    if spec.dtype_kind != "real":
      raise ValueError(
        f"{who}: attention {attention!r} {_COMPLEX_REFUSAL}; choose one of "
        f"{', '.join(valid)}"
      )
    if layout not in spec.layouts:
      raise ValueError(
        f"{who}: attention {attention!r} does not act on the {layout} "
        f"layout; choose one of {', '.join(valid)}"
      )
    if causal and not spec.causal:
      raise ValueError(
        f"{who}: attention {attention!r} has no causal form, so a decoder "
        f"would see future tokens; choose one of {', '.join(valid)}"
      )
  if norm is None or norm == nn_residual.NORM_FREE:
    return
  valid = valid_norms(layout, causal, allow_batch_stats)
  if norm not in nn_norms.NORMS:
    raise ValueError(
      f"{who}: unknown norm {norm!r}; valid names are {', '.join(valid)}"
    )
  reason = _norm_refusal(
    nn_norms.NORMS[norm], layout, causal, allow_batch_stats
  )
  if reason is not None:
    raise ValueError(
      f"{who}: norm {norm!r} {reason}; choose one of {', '.join(valid)}"
    )


# ---------------------------------------------------------------------------
# The residual scheme.


def residual(
  name: str,
  blocks: list[nnx.Module],
  *,
  width: int,
  per_layer: int,
  norm: str | None,
  norm_kwargs: Mapping[str, Any],
  rngs: nnx.Rngs,
) -> nnx.Module:
  """Wraps the sublayers (``per_layer`` per layer) into the scheme.

  `make_residual` starts from the scheme's spec defaults; the norm goes to
  the schemes whose spec places norms (``uses_norm``).
  """
  spec = nn_residual.RESIDUALS.get(name)
  kwargs = (
    {"norm": norm, "norm_kwargs": dict(norm_kwargs)}
    if spec is not None and spec.uses_norm
    else {}
  )
  return nn_residual.make_residual(
    name,
    blocks,
    num_features=width,
    rngs=rngs,
    sublayers_per_layer=per_layer,
    **kwargs,
  )
