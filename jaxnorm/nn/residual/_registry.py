"""`RESIDUALS`, `make_residual` and, for ``nnx.scan``, `make_residual_step`.

Examples:
  >>> spec = RESIDUALS["rezero"]
  >>> spec.uses_norm, spec.shareable, spec.scannable
  (False, True, True)
  >>> "attnres" in SCAN_RESIDUALS, "prenorm" in NORM_FREE_SCHEMES
  (False, True)
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
from flax import nnx

from jaxnorm import _checks, residual
from jaxnorm.nn import layers, registry
from jaxnorm.nn.residual import attnres, depth, hyper, manifold, wiring
from jaxnorm.nn.residual._common import (
  Placement,
  Sublayer,
  check_blocks,
  check_input,
  layer_steps,
)


def _per_layer(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """LayerNorm Scaling: one factor per layer of ``sublayers_per_layer``."""
  del num_sublayers
  return {"sublayers_per_layer": sublayers_per_layer}


def _rezero(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """ReZero: one gate per layer, shared by its sublayers (official code)."""
  del num_sublayers
  return {"sublayers_per_layer": sublayers_per_layer, "shared": True}


def _layerscale(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """LayerScale: CaiT's init by depth (0.1 to 18 layers, 1e-5 to 24, 1e-6)."""
  layers = residual.num_layers_of(num_sublayers, sublayers_per_layer)
  init = 0.1 if layers <= 18 else 1e-5 if layers <= 24 else 1e-6
  return {"init_value": init, "norm": "rmsnorm"}


def _streams(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """HC family: 4 streams (both papers), read out by their mean."""
  del num_sublayers, sublayers_per_layer
  return {"num_streams": 4, "readout": "mean"}


def _deepnorm(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """DeepNorm: scale the sublayers' init by beta (DepthBench, DeepNet)."""
  del num_sublayers, sublayers_per_layer
  return {"init_gain": True}


def _base_depth(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """depth-muP, CompleteP: DepthBench's base depth 24, ``(L / 24)^{-e}``.

  `jaxnorm.residual.BASE_DEPTH` (``--base-depth`` of DepthBench's
  ``examples/pretrain_preln_mup.py``); the runner's optimizer rescales the
  hidden parameters' Adam learning rate and eps from the same base depth
  (`jaxnorm.training.optimizers.depth_adam_rule`).
  """
  del num_sublayers, sublayers_per_layer
  return {"base_depth": residual.BASE_DEPTH}


def _blocks(num_sublayers: int, sublayers_per_layer: int) -> dict:
  """Block AttnRes: the paper's 8 blocks, or the largest divisor below."""
  del sublayers_per_layer
  return {"num_blocks": max(b for b in range(1, 9) if num_sublayers % b == 0)}


ResidualName = Literal[
  "prenorm",
  "postnorm",
  "sandwich",
  "lns",
  "scaled",
  "skipinit",
  "rezero",
  "layerscale",
  "hc",
  "mhc",
  "ohc",
  "ihc",
  "attnres",
  "block_attnres",
  "deepnorm",
  "keel",
  "depth_mup",
  "completep",
]

_HC = "Zhu et al., Hyper-Connections, arXiv:2409.19606"
_MHC = "Xie et al., mHC, arXiv:2512.24880"
_OHC = "Guo et al., oHC, arXiv:2609.02672"
_ATTNRES = "Kimi Team, Attention Residuals, arXiv:2603.15031"
# Static routing (HC's alpha, mHC's Sinkhorn logits) is a bias of the
# stream mixing: not decayed, as DepthBench trains HC and mHC. oHC's and
# iHC's steps are the same class as mHC's and carry the same rule (their
# b_res is a vector or absent, so it changes nothing for them).
_HC_DECAY = types.MappingProxyType({"static_alpha": False})
_MHC_DECAY = types.MappingProxyType({"b_res": False})
_MANIFOLD = (manifold.ManifoldHyperConnection,)
_NO_CARRY = "has no fixed-size scan carry"


def _gated(shape: str) -> Callable[..., nnx.Module]:
  return functools.partial(wiring.make_gated_step, shape=shape)


def _manifold(residual_map: residual.ResidualMap) -> Callable[..., nnx.Module]:
  return functools.partial(
    manifold.make_manifold_step, residual_map=residual_map
  )


def _depth_scaled(exponent: float) -> Callable[..., nnx.Module]:
  return functools.partial(depth.make_depth_scaled_step, exponent=exponent)


RESIDUALS: Mapping[str, registry.ResidualSpec] = types.MappingProxyType(
  {
    "prenorm": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Xiong et al., arXiv:2002.04745",
      step=wiring.make_prenorm_step,
      norm_free=True,
      fused=True,
    ),
    "postnorm": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Vaswani et al., arXiv:1706.03762",
      step=wiring.make_postnorm_step,
    ),
    "sandwich": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Ding et al., CogView, arXiv:2105.13290",
      step=wiring.make_sandwich_step,
    ),
    "lns": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Sun et al., The Curse of Depth, arXiv:2502.05795",
      step=wiring.make_lns_step,
      defaults=_per_layer,
    ),
    "scaled": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Dherin & Munn, On residual network depth, arXiv:2510.03470",
      step=wiring.make_scaled_step,
      norm_free=True,
    ),
    "skipinit": registry.ResidualSpec(
      wiring.make_residual_stack,
      "De & Smith, arXiv:2002.10444",
      step=_gated("scalar"),
      uses_norm=False,
      shareable=True,
    ),
    "rezero": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Bachlechner et al., ReZero, arXiv:2003.04887",
      step=_gated("scalar"),
      defaults=_rezero,
      uses_norm=False,
      shareable=True,
    ),
    "layerscale": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Touvron et al., CaiT, arXiv:2103.17239",
      step=_gated("vector"),
      defaults=_layerscale,
      norm_free=True,
    ),
    "hc": registry.ResidualSpec(
      hyper.make_stream_stack,
      _HC,
      step=hyper.make_hc_step,
      defaults=_streams,
      decay=_HC_DECAY,
      modules=(hyper.HyperConnection,),
    ),
    "mhc": registry.ResidualSpec(
      hyper.make_stream_stack,
      _MHC,
      step=_manifold("sinkhorn"),
      defaults=_streams,
      decay=_MHC_DECAY,
      modules=_MANIFOLD,
    ),
    "ohc": registry.ResidualSpec(
      hyper.make_stream_stack,
      _OHC,
      step=_manifold("quaternion"),
      defaults=_streams,
      decay=_MHC_DECAY,
      modules=_MANIFOLD,
    ),
    "ihc": registry.ResidualSpec(
      hyper.make_stream_stack,
      _OHC,
      step=_manifold("identity"),
      defaults=_streams,
      decay=_MHC_DECAY,
      modules=_MANIFOLD,
    ),
    "attnres": registry.ResidualSpec(
      attnres.make_attnres_stack, _ATTNRES, scan_refusal=_NO_CARRY
    ),
    "block_attnres": registry.ResidualSpec(
      attnres.make_block_attnres_stack,
      _ATTNRES,
      defaults=_blocks,
      scan_refusal=_NO_CARRY,
    ),
    "deepnorm": registry.ResidualSpec(
      depth.make_deepnorm_stack,
      "Wang et al., DeepNet, arXiv:2203.00555",
      step=depth.make_deepnorm_step,
      defaults=_deepnorm,
    ),
    "keel": registry.ResidualSpec(
      wiring.make_residual_stack,
      "KEEL, arXiv:2601.19895",
      step=depth.make_keel_step,
      scan_refusal="wires its first layer differently from the others",
    ),
    "depth_mup": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Yang et al., Tensor Programs VI (Depth-muP), arXiv:2310.02244",
      step=_depth_scaled(residual.DEPTH_EXPONENTS["depth_mup"]),
      defaults=_base_depth,
      norm_free=True,
    ),
    "completep": registry.ResidualSpec(
      wiring.make_residual_stack,
      "Dey et al., CompleteP, arXiv:2505.01618",
      step=_depth_scaled(residual.DEPTH_EXPONENTS["completep"]),
      defaults=_base_depth,
      norm_free=True,
    ),
  }
)


def _names(capable: Callable[[registry.ResidualSpec], bool]) -> list[str]:
  """The registered names whose spec has the capability ``capable``."""
  return [name for name, spec in RESIDUALS.items() if capable(spec)]


NORM_FREE = "none"
"""The ``norm`` of a norm-free stack: steps without any norm module.

With ``prenorm`` the stack is ``x + f(x)``; the schemes whose spec is
``norm_free`` accept it (models build no final norm either)."""
NORM_FREE_SCHEMES: tuple[str, ...] = tuple(_names(lambda s: s.norm_free))
"""Schemes that place norms but run without one (``norm=NORM_FREE``): the
names whose spec is ``norm_free``."""


def _options(
  name: str,
  num_sublayers: int,
  sublayers_per_layer: int,
  kwargs: Mapping[str, Any],
) -> dict[str, Any]:
  """The spec's defaults of ``name`` under the user's ``kwargs``.

  Refuses the options that the spec's capabilities exclude (``norm="none"``,
  ``shared``, ``fused_implementation``).
  """
  who = "make_residual"
  if name not in RESIDUALS:
    raise ValueError(
      f"{who}: unknown residual scheme {name!r}; "
      f"valid names are {', '.join(sorted(RESIDUALS))}"
    )
  spec = RESIDUALS[name]
  if kwargs.get("norm") == NORM_FREE:
    if not spec.norm_free:
      raise ValueError(
        f"{who}: norm={NORM_FREE!r} (no norm) needs a scheme that "
        f"runs without one, got {name!r}; choose one of "
        f"{', '.join(NORM_FREE_SCHEMES)}"
      )
    kwargs = {**kwargs, "norm": None}
  if kwargs.get("shared") and not spec.shareable:
    raise ValueError(
      f"{who}: shared applies to "
      f"{', '.join(_names(lambda s: s.shareable))} only, got {name!r}"
    )
  if kwargs.get("fused_implementation") is not None and not spec.fused:
    fused = ", ".join(repr(n) for n in _names(lambda s: s.fused))
    raise ValueError(
      f"{who}: fused_implementation applies to {fused} only, got {name!r}"
    )
  _checks.check_positive_int(who, "sublayers_per_layer", sublayers_per_layer)
  options = dict(spec.defaults(num_sublayers, sublayers_per_layer))
  options.setdefault("sublayers_per_layer", sublayers_per_layer)
  options.update(kwargs)
  return options


def make_residual(
  name: ResidualName,
  blocks: Sequence[Sublayer],
  *,
  num_features: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int = 2,
  remat: layers.RematName = "none",
  **kwargs: Any,
) -> nnx.Module:
  r"""Wraps a list of sublayers into a network with the named residual scheme.

  The options start from the scheme's spec defaults
  (``RESIDUALS[name].defaults(len(blocks), sublayers_per_layer)``: LNS and
  ReZero per layer, LayerScale's init by depth, 4 streams read out by their
  mean for the HC family, 8 blocks (or the largest divisor of
  ``len(blocks)`` below) for Block AttnRes); ``kwargs`` override them.

  Args:
    name: one of `RESIDUALS` (table in the `jaxnorm.nn.residual`
      docstring).
    blocks: the sublayers, in order, each ``(..., d) -> (..., d)`` with no
      residual or norm of its own (an attention and an MLP per Transformer
      layer count as two).
    num_features: hidden size ``d``.
    rngs: parameter RNG streams; every step module draws exactly one
      ``params`` key, whatever its norm and options.
    sublayers_per_layer: consecutive blocks that form one layer (2 for a
      Transformer's attention and MLP; 1 for a ResNet-style stack): LNS
      scales layer ``l`` by :math:`1/\sqrt{l}` and ReZero shares one gate
      per layer.
    remat: `jaxnorm.nn.layers.REMAT_CHOICES`: run every sublayer under that
      `jax.checkpoint` policy (``"none"``: keep its activations for the
      backward pass); the network's parameters are the same for every value.
    **kwargs: options of the scheme's step module (e.g. ``norm``,
      ``norm_kwargs``; ``init_gain`` for ``deepnorm``: scale the sublayers'
      weight matrices, in place, by beta (`scale_branch_init`, default
      True); ``base_depth`` for ``depth_mup`` and ``completep`` (default
      24, DepthBench's `jaxnorm.residual.BASE_DEPTH`); ``scale`` for
      ``scaled``; ``init_value`` for the
      gated schemes, ``shared`` for ``skipinit``/``rezero``;
      ``num_streams``, ``dynamic``, ``tanh`` for ``hc``; ``num_iters``,
      ``temperature``, ``res_diag``, ``gate_init`` for
      ``mhc``/``ohc``/``ihc``), plus ``readout`` (streams: ``"sum"`` or
      ``"mean"``; AttnRes: ``"attnres"`` or ``"sum"``), ``num_blocks``
      (``block_attnres``; must divide ``len(blocks)``) and
      ``fused_implementation`` (``prenorm`` with RMSNorm or LayerNorm:
      ``"xla"`` or ``"pallas"``, set as the norms' ``implementation``, each
      residual add fused into the next norm).

  Returns:
    An nnx module ``net`` with ``net(x)`` mapping ``(..., d)`` to
    ``(..., d)`` (the hidden state before the final norm) and
    ``net(x, return_hidden=True)`` also returning per-sublayer states.

  Raises:
    ValueError: for an unknown name (the message lists the valid names),
      an empty or non-callable block list, or a bad option.

  Examples:
    >>> import jax.numpy as jnp
    >>> net = make_residual("rezero", [jnp.tanh] * 4, num_features=4,
    ...                     rngs=nnx.Rngs(0))  # 2 layers of 2 sublayers
    >>> net.steps[0] is net.steps[1], net.steps[1] is net.steps[2]
    (True, False)
    >>> x = jnp.ones((2, 4), jnp.float32)
    >>> bool((net(x) == x).all())  # gates start at 0: the identity
    True
  """
  _checks.check_positive_int("make_residual", "num_features", num_features)
  blocks = check_blocks("make_residual", blocks)
  layers.check_remat("make_residual", remat)
  options = _options(name, len(blocks), sublayers_per_layer, kwargs)
  spec = RESIDUALS[name]
  return spec.build(
    blocks,
    spec.step,
    num_features=num_features,
    rngs=rngs,
    remat=remat,
    **options,
  )


# ---------------------------------------------------------------------------
# One layer at a time, for nnx.scan.


class ResidualLayer(nnx.Module):
  """The residual steps of one layer, applied to a scan carry.

  ``self(carry, sublayers)`` runs ``carry = steps[j](carry, sublayers[j])``
  for the layer's sublayers in order. The carry is the residual stream
  ``(..., d)`` for single-stream schemes and the stream state ``(..., n,
  d)`` for the HC family: `embed` makes it from the embedding, `output`
  reads the hidden state out. Built by `make_residual_step`.

  Examples:
    >>> import jax.numpy as jnp
    >>> layer = make_residual_step("prenorm", 4, layer_index=0, num_layers=1,
    ...                            rngs=nnx.Rngs(0))
    >>> carry = layer.embed(jnp.ones((2, 4), jnp.float32))
    >>> carry = layer(carry, [lambda h: 2.0 * h, lambda h: 2.0 * h])
    >>> [round(v, 4) for v in layer.output(carry)[0].tolist()]  # 1+2, 3+2
    [5.0, 5.0, 5.0, 5.0]
  """

  def __init__(
    self,
    steps: Sequence[nnx.Module],
    *,
    num_features: int,
    num_streams: int | None = None,
    readout: residual.Readout = "sum",
  ):
    self.num_features, self.num_streams = num_features, num_streams
    self.readout = readout
    self.steps = nnx.List(steps)

  def embed(self, x: jax.Array) -> jax.Array:
    """The initial carry for embeddings ``x`` ``(..., d)``."""
    check_input("ResidualLayer", x, self.num_features)
    if self.num_streams is None:
      return x
    return residual.expand_streams(x, self.num_streams)

  def output(self, carry: jax.Array) -> jax.Array:
    """The hidden state ``(..., d)`` before the final norm."""
    if self.num_streams is None:
      return carry
    return residual.reduce_streams(carry, readout=self.readout)

  def __call__(
    self, carry: jax.Array, sublayers: Sequence[Sublayer]
  ) -> jax.Array:
    """Applies the layer's steps around ``sublayers`` (one per step)."""
    if len(sublayers) != len(self.steps):
      raise ValueError(
        f"ResidualLayer: need one sublayer per step, got "
        f"{len(sublayers)} sublayers for {len(self.steps)} steps"
      )
    for step, sublayer in zip(self.steps, sublayers):
      carry = step(carry, sublayer)
    return carry


SCAN_RESIDUALS: tuple[str, ...] = tuple(_names(lambda s: s.scannable))
"""Schemes `make_residual_step` builds: the names whose spec is
``scannable`` (no ``scan_refusal``)."""


def make_residual_step(
  name: ResidualName,
  num_features: int,
  *,
  layer_index: residual.IndexLike,
  num_layers: int,
  rngs: nnx.Rngs,
  sublayers_per_layer: int = 2,
  **kwargs: Any,
) -> ResidualLayer:
  """The residual steps of layer ``layer_index``, by scheme name, for scans.

  Builds the same step modules as `make_residual` builds for the sublayers
  ``layer_index * sublayers_per_layer + j`` of a ``num_layers``-layer stack,
  so an ``nnx.scan`` over layers created under ``nnx.vmap`` (with
  ``layer_index = jnp.arange(num_layers)`` as the vmapped input) equals the
  unrolled network::

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0, 0))
    def create(index, rngs):
      return Layer(index, rngs)  # holds attn, mlp and
      # make_residual_step(name, d, layer_index=index, num_layers=L, ...)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(carry, layer):
      return layer.res(carry, [layer.attn, layer.mlp])

  The carry's state must have a fixed shape, so the AttnRes schemes (whose
  sources grow with depth) are refused, and so is KEEL (its first layer has
  another wiring). A traced ``layer_index`` is held in a `LayerIndex`
  variable where the step reads it (LNS). DeepNorm's init gain needs the
  sublayers, which a step does not hold: the spec's ``init_gain`` is
  dropped here (``init_gain=True`` is refused); call `scale_branch_init`
  on the layer's sublayers with `jaxnorm.residual.deepnorm_beta`.

  Args:
    name: one of `SCAN_RESIDUALS`.
    num_features: hidden size ``d``.
    layer_index: 0-based layer index: a Python integer or an integer scalar
      array (traced under ``nnx.vmap``).
    num_layers: layers of the whole stack (the depth rules of ``scaled``
      and ``layerscale`` read it).
    rngs: parameter RNG streams (one ``params`` key per step module).
    sublayers_per_layer: sublayers of each layer (2: attention and MLP).
    **kwargs: options, as for `make_residual` (``readout`` and
      ``num_streams`` set the carry of the HC family).

  Returns:
    A `ResidualLayer`.

  Raises:
    ValueError: for a scheme outside `SCAN_RESIDUALS`, a bad index or a bad
      option.

  Examples:
    >>> import jax.numpy as jnp
    >>> layer = make_residual_step("hc", 4, layer_index=0, num_layers=2,
    ...                            rngs=nnx.Rngs(0))
    >>> carry = layer.embed(jnp.ones((2, 4), jnp.float32))
    >>> carry.shape  # (..., n, d): 4 streams
    (2, 4, 4)
    >>> layer.output(layer(carry, [jnp.tanh, jnp.tanh])).shape
    (2, 4)
  """
  who = "make_residual_step"
  spec = RESIDUALS.get(name)
  if spec is None or not spec.scannable:
    reason = "is unknown" if spec is None else spec.scan_refusal
    raise ValueError(
      f"{who}: residual scheme {name!r} {reason}; "
      f"valid names are {', '.join(SCAN_RESIDUALS)}"
    )
  if kwargs.get("init_gain"):
    raise ValueError(
      f"{who}: init_gain scales the sublayers' weights, which a step does "
      "not hold; scale them with jaxnorm.nn.residual.scale_branch_init("
      "blocks, jaxnorm.residual.deepnorm_beta(num_layers))"
    )
  _checks.check_positive_int(who, "num_features", num_features)
  _checks.check_positive_int(who, "num_layers", num_layers)
  residual.check_layer_index(who, layer_index)
  num_sublayers = num_layers * sublayers_per_layer
  options = _options(name, num_sublayers, sublayers_per_layer, kwargs)
  del options["sublayers_per_layer"]
  options.pop("init_gain", None)
  readout = options.pop("readout", "sum")
  first = layer_index * sublayers_per_layer
  places = [
    Placement(layer_index, first + j, num_sublayers, sublayers_per_layer)
    for j in range(sublayers_per_layer)
  ]
  steps = layer_steps(spec.step, num_features, places, rngs=rngs, **options)
  return ResidualLayer(
    steps,
    num_features=num_features,
    num_streams=options.get("num_streams"),
    readout=readout,
  )
