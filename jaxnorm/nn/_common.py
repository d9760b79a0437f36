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
