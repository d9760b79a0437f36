"""The attention registry: every paper's core (or image layer) and its spec.

`ATTENTIONS` maps a name to its `registry.AttentionSpec`; `make_image_attention`
builds the ``images`` entries (whole layers on NHWC maps), and
`jaxnorm.nn.attention.make_attention` the ``tokens`` cores inside a
`MultiHeadAttention`.

Examples:
  >>> spec = ATTENTIONS["soft"]
  >>> spec.core.__name__, spec.causal, spec.takes_mask, spec.needs_grid
  ('SoftAttention', False, False, True)
  >>> "ela" in IMAGE_ATTENTIONS, "ela" in TOKEN_ATTENTIONS
  (True, False)
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any, Literal

from flax import nnx

from jaxnorm.nn import registry
from jaxnorm.nn.attention import (
  affine_scaled,
  ela,
  lina,
  linear,
  mxfp4,
  nala,
  psa,
  sinkhorn,
  sinks,
  soft,
  softmax,
)
from jaxnorm.nn.cplx import _registry as cplx_attention

AttentionName = Literal[
  "softmax",
  "off_by_one",
  "sink",
  "gated",
  "affine_scaled",
  "soft",
  "nala",
  "lina",
  "causal_linear",
  "mxfp4",
  "sinkhorn",
  "ela",
  "psa",
  "born",
  "complexformer",
  "pct",
  "complex_softmax",
]


def _lina_defaults(
  num_heads: int, head_dim: int, num_tokens: int | None
) -> dict[str, Any]:
  """Static KV gates over every position when the length is fixed."""
  del num_heads, head_dim
  return {} if num_tokens is None else {"max_len": num_tokens}


def _soft_defaults(
  num_heads: int, head_dim: int, num_tokens: int | None
) -> dict[str, Any]:
  """Landmark windows of 2 tokens, or 1 when 2 does not tile the length."""
  del num_heads, head_dim
  return {} if num_tokens is None else {"ratio": math.gcd(num_tokens, 2)}


_IMAGES = frozenset({"images"})

ATTENTIONS: Mapping[str, registry.AttentionSpec] = types.MappingProxyType(
  {
    "softmax": registry.AttentionSpec(
      softmax.SoftmaxAttention, "Vaswani et al., arXiv:1706.03762", kernel=True
    ),
    "off_by_one": registry.AttentionSpec(
      sinks.OffByOneAttention,
      "Miller, Attention Is Off By One (2023)",
      kernel=True,
    ),
    "sink": registry.AttentionSpec(
      sinks.SinkAttention, "OpenAI, arXiv:2508.10925", kernel=True
    ),
    "gated": registry.AttentionSpec(
      sinks.GatedAttention, "Qiu et al., arXiv:2505.06708", kernel=True
    ),
    "affine_scaled": registry.AttentionSpec(
      affine_scaled.AffineScaledAttention,
      "Bae et al., arXiv:2602.23057",
      kernel=True,
    ),
    "soft": registry.AttentionSpec(
      soft.SoftAttention,
      "Lu et al., arXiv:2110.11945",
      defaults=_soft_defaults,
      causal=False,
      takes_mask=False,
      takes_bias=False,
    ),
    "nala": registry.AttentionSpec(
      nala.NaLaAttention,
      "Meng et al., arXiv:2506.21137",
      causal=False,
      takes_mask=False,
      takes_bias=False,
    ),
    "lina": registry.AttentionSpec(
      lina.LinaAttention,
      "Wang et al., arXiv:2601.22630",
      defaults=_lina_defaults,
      causal=False,
      takes_mask=False,
      takes_bias=False,
    ),
    "causal_linear": registry.AttentionSpec(
      linear.CausalLinearAttention,
      "Katharopoulos et al., arXiv:2006.16236",
      takes_mask=False,
      takes_bias=False,
      kernel=True,
    ),
    "mxfp4": registry.AttentionSpec(
      mxfp4.MXFP4Attention, "Yu et al., arXiv:2607.24377"
    ),
    "sinkhorn": registry.AttentionSpec(
      sinkhorn.SinkhornAttention, "Freytes, arXiv:2601.11618"
    ),
    "ela": registry.AttentionSpec(
      ela.ELA,
      "Xu & Wan, arXiv:2403.01123",
      causal=False,
      takes_mask=False,
      takes_bias=False,
      layouts=_IMAGES,
    ),
    "psa": registry.AttentionSpec(
      psa.PolarizedSelfAttention,
      "Liu et al., arXiv:2107.00782",
      causal=False,
      takes_mask=False,
      takes_bias=False,
      layouts=_IMAGES,
    ),
    **cplx_attention.ATTENTION_SPECS,
  }
)
"""Attention name -> `registry.AttentionSpec` (core class and capabilities).

Adding a paper: its core class in `jaxnorm/nn/attention/<paper>.py`, one
entry here and its name in `AttentionName`. The ``images`` entries (ELA,
PSA) register whole layers on NHWC maps, built by `make_image_attention`;
the ``tokens`` entries are cores of `MultiHeadAttention`."""

ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTIONS)
TOKEN_ATTENTIONS: tuple[str, ...] = tuple(
  n for n, s in ATTENTIONS.items() if "tokens" in s.layouts
)
"""The names of the cores of `MultiHeadAttention` (``tokens`` layout)."""
IMAGE_ATTENTIONS: tuple[str, ...] = tuple(
  n for n, s in ATTENTIONS.items() if "images" in s.layouts
)
"""The names of the NHWC attention layers (``images``; `make_image_attention`
builds them)."""


def check_name(who: str, name: str) -> registry.AttentionSpec:
  """The spec of token attention ``name``; refuses others, listing names."""
  if name not in ATTENTIONS:
    raise ValueError(
      f"{who}: unknown attention {name!r}; valid names are "
      f"{', '.join(TOKEN_ATTENTIONS)}"
    )
  if "tokens" not in ATTENTIONS[name].layouts:
    raise ValueError(
      f"{who}: attention {name!r} acts on NHWC images, not on tokens; build "
      f"it with make_image_attention({name!r}, channels, rngs=...); token "
      f"attentions are {', '.join(TOKEN_ATTENTIONS)}"
    )
  return ATTENTIONS[name]


def make_image_attention(
  name: str, channels: int, *, rngs: nnx.Rngs, **kwargs: Any
) -> nnx.Module:
  """Builds the ``images`` attention ``name``: a whole layer on NHWC maps.

  The spec's ``core`` is the layer itself, ``(B, H, W, C) -> (B, H, W, C)``
  (ELA: `ELA`, PSA: `PolarizedSelfAttention`), built as ``core(channels, *,
  rngs, **kwargs)``; it has no projections, heads, mask or causal form.

  Args:
    name: one of `IMAGE_ATTENTIONS`.
    channels: ``C``, the channel (last) axis of the maps.
    rngs: parameter RNG streams.
    **kwargs: the layer's options, e.g. ``variant="T"`` for ``"ela"`` or
      ``variant="sequential"`` for ``"psa"``, ``dtype``, ``param_dtype``.

  Returns:
    The module.

  Raises:
    ValueError: for a name that is not an ``images`` attention (the message
      lists them), or what the layer refuses (channels its groups do not
      divide, an unknown variant).

  Examples:
    >>> import jax.numpy as jnp
    >>> ela = make_image_attention("ela", 16, rngs=nnx.Rngs(0))  # ELA-B
    >>> ela(jnp.ones((2, 4, 4, 16), jnp.float32)).shape  # (B, H, W, C)
    (2, 4, 4, 16)
    >>> psa = make_image_attention(
    ...     "psa", 8, variant="sequential", rngs=nnx.Rngs(0)
    ... )
    >>> type(psa).__name__, psa.channel_down.shape  # C' = 4, C_b = 1
    ('PolarizedSelfAttention', (4, 1))
  """
  spec = ATTENTIONS.get(name)
  if spec is None or "images" not in spec.layouts:
    reason = (
      "unknown attention"
      if spec is None
      else "a token attention: build it with make_attention"
    )
    raise ValueError(
      f"make_image_attention: {name!r} is not an images attention ({reason});"
      f" valid names are {', '.join(IMAGE_ATTENTIONS)}"
    )
  return spec.core(channels, rngs=rngs, **kwargs)
