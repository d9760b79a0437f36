"""The norm registry (name -> `NormSpec`) and `make_norm`."""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal

from flax import nnx

from jaxnorm import _checks
from jaxnorm.nn import registry
from jaxnorm.nn.cplx import norms as cplx_norms
from jaxnorm.nn.norms.batch import BatchNorm, GroupNorm, InstanceNorm
from jaxnorm.nn.norms.cls import CLSNorm
from jaxnorm.nn.norms.dyt import DyT
from jaxnorm.nn.norms.evonorm import EvoNormB0, EvoNormS0
from jaxnorm.nn.norms.l1 import L1BatchNorm, L1LayerNorm
from jaxnorm.nn.norms.layer import CRMSNorm, LayerNorm, RMSNorm
from jaxnorm.nn.norms.powernorm import PowerNorm
from jaxnorm.nn.norms.region import RegionNormB, RegionNormL
from jaxnorm.nn.norms.scale_vectors import ScaleVectorNorm
from jaxnorm.nn.norms.scalenorm import ScaleNorm
from jaxnorm.nn.norms.seednorm import SeeDNorm
from jaxnorm.nn.norms.timestep_decay import TimestepDecayNorm
from jaxnorm.nn.norms.unified import UnifiedNorm
from jaxnorm.nn.norms.unmix_tns import UnMixTNS

NormName = Literal[
  "layernorm",
  "rmsnorm",
  "crmsnorm",
  "batchnorm",
  "groupnorm",
  "instancenorm",
  "dyt",
  "seednorm",
  "evonormb0",
  "evonorms0",
  "powernorm",
  "unifiednorm",
  "regionnormb",
  "regionnorml",
  "unmixtns",
  "l1layernorm",
  "l1batchnorm",
  "scalevectornorm",
  "clsnorm",
  "timestepdecaynorm",
  "scalenorm",
  "complexbatchnorm",
  "complexlayernorm",
  "complexrmsnorm",
  "pctrmsnorm",
]


def _two_per_group(groups: int, num_features: int) -> int:
  """``groups``, or ``num_features // 2`` when a group would be one wide."""
  return max(num_features // 2, 1) if groups == num_features else groups


def _groups(
  paper_groups: int,
) -> Callable[[int, str | None], Mapping[str, Any]]:
  """Defaults of a grouped norm (GroupNorm, EvoNorm-S0).

  The paper's group count when it divides the width, else the gcd. On
  sequences (``layout="tokens"``) one statistic per token and group
  (``reduction_axes=-1``), the causal-safe form; there a group needs two
  channels or more (one channel has variance 0), so narrow widths take
  ``width // 2`` groups.
  """

  def defaults(
    num_features: int, layout: str | None = None
  ) -> Mapping[str, Any]:
    groups = math.gcd(num_features, paper_groups)
    if layout != "tokens":
      return {"num_groups": groups}
    return {
      "num_groups": _two_per_group(groups, num_features),
      "reduction_axes": -1,
    }

  return defaults


def _timestep_groups(
  num_features: int, layout: str | None = None
) -> Mapping[str, Any]:
  """Gecko's 64 groups, or the gcd; fewer than the width (``G < D``)."""
  del layout  # Sequences only.
  groups = math.gcd(num_features, 64)
  return {"num_groups": _two_per_group(groups, num_features)}


_PER_TOKEN = frozenset({"tokens", "images", "graphs"})
_IMAGES = frozenset({"images"})
_TOKENS = frozenset({"tokens"})
_CHANNELS = frozenset({"tokens", "images"})

NORMS: Mapping[str, registry.NormSpec] = types.MappingProxyType(
  {
    "layernorm": registry.NormSpec(
      LayerNorm,
      "Ba, Kiros & Hinton, arXiv:1607.06450",
      layouts=_PER_TOKEN,
      takes_mask=True,
      kernel=True,
    ),
    "rmsnorm": registry.NormSpec(
      RMSNorm,
      "Zhang & Sennrich, arXiv:1910.07467",
      layouts=_PER_TOKEN,
      takes_mask=True,
      kernel=True,
    ),
    "crmsnorm": registry.NormSpec(
      CRMSNorm, "Jiang, Gu, Zhu & Pan, arXiv:2305.14858", layouts=_PER_TOKEN
    ),
    "batchnorm": registry.NormSpec(
      BatchNorm,
      "Ioffe & Szegedy, arXiv:1502.03167",
      layouts=_CHANNELS,
      takes_mask=True,
      batch_stats=True,
    ),
    "groupnorm": registry.NormSpec(
      GroupNorm,
      "Wu & He, arXiv:1803.08494",
      defaults=_groups(32),
      layouts=_CHANNELS,
    ),
    "instancenorm": registry.NormSpec(
      InstanceNorm,
      "Ulyanov, Vedaldi & Lempitsky, arXiv:1607.08022",
      layouts=_IMAGES,
      causal=False,
    ),
    "scalenorm": registry.NormSpec(
      ScaleNorm, "Nguyen & Salazar, arXiv:1910.05895", layouts=_PER_TOKEN
    ),
    "dyt": registry.NormSpec(
      DyT, "Zhu et al., arXiv:2503.10622", layouts=_PER_TOKEN, kernel=True
    ),
    "seednorm": registry.NormSpec(
      SeeDNorm,
      "Cai et al., arXiv:2510.22777",
      layouts=_PER_TOKEN,
      decay=types.MappingProxyType({"dyn_scale": True, "dyn_proj": True}),
    ),
    "evonormb0": registry.NormSpec(
      EvoNormB0,
      "Liu et al., arXiv:2004.02967",
      layouts=_IMAGES,
      causal=False,
      batch_stats=True,
    ),
    "evonorms0": registry.NormSpec(
      EvoNormS0,
      "Liu et al., arXiv:2004.02967",
      defaults=_groups(32),
      layouts=_CHANNELS,
    ),
    "powernorm": registry.NormSpec(
      PowerNorm,
      "Shen et al., arXiv:2003.07845",
      layouts=_CHANNELS,
      batch_stats=True,
      backward_state=True,
    ),
    "unifiednorm": registry.NormSpec(
      UnifiedNorm,
      "Yang et al., arXiv:2208.01313",
      layouts=_CHANNELS,
      batch_stats=True,
      backward_state=True,
    ),
    "regionnormb": registry.NormSpec(
      RegionNormB,
      "Yu et al., arXiv:1911.10375",
      layouts=_IMAGES,
      causal=False,
      batch_stats=True,
    ),
    "regionnorml": registry.NormSpec(
      RegionNormL,
      "Yu et al., arXiv:1911.10375",
      layouts=_IMAGES,
      causal=False,
      batch_stats=True,
    ),
    "unmixtns": registry.NormSpec(
      UnMixTNS,
      "Tomar et al., ICLR 2024 (OpenReview xyxU99Nutg)",
      layouts=_CHANNELS,
      causal=False,
      batch_stats=True,
    ),
    "l1layernorm": registry.NormSpec(
      L1LayerNorm, "Guo et al., arXiv:2411.10948", layouts=_PER_TOKEN
    ),
    "l1batchnorm": registry.NormSpec(
      L1BatchNorm,
      "Guo et al., arXiv:2411.10948; Hoffer et al., arXiv:1803.01814",
      layouts=_CHANNELS,
      batch_stats=True,
    ),
    "scalevectornorm": registry.NormSpec(
      ScaleVectorNorm,
      "Wang et al., arXiv:2605.26895",
      layouts=_PER_TOKEN,
      decay=types.MappingProxyType({"scale": False, "scale_direction": False}),
    ),
    "clsnorm": registry.NormSpec(
      CLSNorm, "Marouani et al., arXiv:2602.08626", layouts=_TOKENS
    ),
    "timestepdecaynorm": registry.NormSpec(
      TimestepDecayNorm,
      "Ma et al. (Gecko), arXiv:2601.06463",
      defaults=_timestep_groups,
      layouts=_TOKENS,
    ),
    **cplx_norms.NORM_SPECS,
  }
)
"""Every registered norm: name -> `jaxnorm.nn.registry.NormSpec`.

Flags are read from each paper and its pure function. ``causal``: the
output at position ``t`` of a ``(batch, seq, d)`` input depends on
positions ``<= t`` only, in evaluation mode, as built by
``make_norm(..., layout="tokens")`` (per-token statistics, running
statistics, or Gecko's causal running statistic); grouped norms are causal
there because their token defaults take one statistic per token and group.
Instance, region, EvoNorm-B0 and UnMix-TNS statistics run over the
spatial (sequence) axes, so they are not. ``batch_stats``: training mode
(or, for region norms and UnMix-TNS, every call) takes statistics over the
batch. ``takes_mask``: ``__call__`` takes flax's ``mask=`` (LayerNorm,
RMSNorm, BatchNorm; `GroupNorm` and `InstanceNorm` take it too but are left
unflagged, since `jaxnorm.nn.graph` reads the flag as "a graph norm with a
node mask").
``defaults(num_features, layout=None)`` returns the width- and
layout-dependent keyword arguments (a second positional argument is
accepted by every spec's ``defaults``).
"""


def make_norm(
  name: NormName,
  num_features: int,
  *,
  rngs: nnx.Rngs,
  layout: registry.Layout | None = None,
  **kwargs: Any,
) -> nnx.Module:
  """Builds a norm module by name.

  Args:
    name: one of `NORMS` (``"layernorm"``, ``"rmsnorm"``, ...).
    num_features: size of the normalized axis.
    rngs: parameter RNG streams.
    layout: ``"tokens"``, ``"images"`` or ``"graphs"`` when the caller
      knows it: checked against the spec's ``layouts`` and passed to its
      ``defaults`` (e.g. per-token statistics for grouped norms on
      sequences); ``None`` builds the paper's default form.
    **kwargs: keyword arguments of the chosen module; they override the
      spec's ``defaults(num_features, layout)`` (e.g. the group count).

  Returns:
    The module.

  Raises:
    ValueError: for an unknown name or layout, or a layout the norm does
      not support; the message lists the valid choices.

  Examples:
    >>> norm = make_norm("groupnorm", 64, rngs=nnx.Rngs(0), layout="tokens")
    >>> type(norm).__name__, norm.num_groups, norm.reduction_axes  # per token
    ('GroupNorm', 32, -1)
  """
  if name not in NORMS:
    raise ValueError(
      f"make_norm: unknown norm {name!r}; valid names are "
      f"{', '.join(sorted(NORMS))}"
    )
  spec = NORMS[name]
  if layout is not None:
    _checks.check_choice("make_norm", "layout", layout, registry.LAYOUTS)
    if layout not in spec.layouts:
      fits = sorted(n for n, s in NORMS.items() if layout in s.layouts)
      raise ValueError(
        f"make_norm: norm {name!r} does not support layout {layout!r} (it "
        f"supports {', '.join(sorted(spec.layouts))}); norms for "
        f"{layout!r} are {', '.join(fits)}"
      )
  defaults = spec.defaults(num_features, layout)
  return spec.module(num_features, rngs=rngs, **{**defaults, **kwargs})


_NO_AFFINE_DECAY: Mapping[str, bool] = types.MappingProxyType(
  {"scale": False, "bias": False}
)

FLAX_NORMS: tuple[type[nnx.Module], ...] = (
  nnx.LayerNorm,
  nnx.RMSNorm,
  nnx.BatchNorm,
  nnx.GroupNorm,
  nnx.InstanceNorm,
)
"""flax's own norm modules; their ``scale`` and ``bias`` are never decayed
(whatever the rank given by several ``feature_axes``)."""


def norm_decay(module: nnx.Module) -> Mapping[str, bool] | None:
  """The decay overrides of a norm module, ``None`` if it is not a norm.

  A norm is an instance of a class registered in `NORMS` (its spec's
  ``decay``) or of one of `FLAX_NORMS`.

  Examples:
    >>> dict(norm_decay(SeeDNorm(4, rngs=nnx.Rngs(0))))  # its paper decays them
    {'dyn_scale': True, 'dyn_proj': True}
    >>> dict(norm_decay(nnx.LayerNorm(4, rngs=nnx.Rngs(0))))  # a flax norm
    {'scale': False, 'bias': False}
    >>> print(norm_decay(nnx.Linear(4, 4, rngs=nnx.Rngs(0))))  # not a norm
    None
  """
  for cls in type(module).__mro__:
    for spec in NORMS.values():
      if spec.module is cls:
        return spec.decay
    if cls in FLAX_NORMS:
      return _NO_AFFINE_DECAY
  return None
