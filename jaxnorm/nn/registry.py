"""Registry entries that carry capabilities.

Every family keeps one immutable ``name -> spec`` mapping (`NORMS`,
`ATTENTIONS`, `RESIDUALS`, and the models' `MODELS` in
`jaxnorm.nn.model_registry`). A spec says what the part is and what it can
do; models, the runner and the registry-driven tests read specs, never
names, so a part added to a registry is built, refused or tested by what its
spec says.

Weight decay follows one policy (`decays`): a parameter is decayed when it
has two or more dimensions (matrices, kernels, embeddings), and not
otherwise (norm scales, biases, gates, scalars), unless the spec of the
module that owns it names the parameter in ``decay`` with the paper's rule
(e.g. SeeDNorm decays its ``dyn_scale`` and ``dyn_proj``).

Examples:
  >>> from jaxnorm.nn import NORMS
  >>> override = NORMS["seednorm"].decay
  >>> dict(override), decays("dyn_scale", 1, override), decays("scale", 1)
  ({'dyn_scale': True, 'dyn_proj': True}, True, False)
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal

Layout = Literal["tokens", "images", "graphs"]
LAYOUTS: tuple[str, ...] = ("tokens", "images", "graphs")


DtypeKind = Literal["real", "complex"]
DTYPE_KINDS: tuple[str, ...] = ("real", "complex")


def _resolve_dtype_kind(spec: Any, cls: type) -> None:
  """Sets ``spec.dtype_kind=None`` from ``cls.dtype_kind`` (default real)."""
  if spec.dtype_kind is None:
    kind = getattr(cls, "dtype_kind", "real")
    object.__setattr__(spec, "dtype_kind", kind)


def no_defaults(*args: Any) -> dict[str, Any]:
  """Default keyword arguments of a part that needs none.

  Examples:
    >>> no_defaults(64)
    {}
  """
  del args
  return {}


def _no_decay() -> Mapping[str, bool]:
  return types.MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class NormSpec:
  """A registered normalization layer.

  Attributes:
    module: the nnx module class, called as ``module(num_features, *, rngs,
      **kwargs)``.
    paper: short reference (authors, arXiv id).
    defaults: default kwargs as a function of the width ``num_features``
      (e.g. a group count that divides it).
    layouts: the layouts it normalizes: ``tokens`` ``(batch, seq, d)``,
      ``images`` NHWC, ``graphs`` ``(batch, nodes, d)`` with a node mask.
    causal: in a token layout, position ``t``'s output depends only on
      positions ``<= t`` in evaluation mode (statistics per token, or a
      causal running statistic).
    batch_stats: training mode takes statistics over the batch (and
      sequence) axes, so a causal model needs an explicit opt-in.
    takes_mask: ``__call__`` accepts ``mask=`` (valid positions).
    backward_state: it owns state updated from the backward pass
      (`jaxnorm.nn.BackwardStat`), which the train step must differentiate.
    decay: parameter attribute name -> decayed, overriding the default rule
      of `decays` for this module's own parameters.
    kernel: a Pallas kernel exists (``implementation=``).
    dtype_kind: ``"real"`` or ``"complex"``: the dtype of the inputs and
      outputs of the form ``make_norm`` builds (complex: complex64 /
      complex128, ``num_features`` complex channels). None (the default)
      takes the module class's ``dtype_kind`` attribute (``"real"`` if it
      has none), so the spec and the module cannot disagree.

  Examples:
    >>> from jaxnorm.nn import NORMS
    >>> spec = NORMS["batchnorm"]
    >>> spec.module.__name__, spec.batch_stats, spec.takes_mask, spec.dtype_kind
    ('BatchNorm', True, True, 'real')
    >>> NORMS["rmsnorm"].causal, "graphs" in NORMS["rmsnorm"].layouts
    (True, True)
  """

  module: type
  paper: str
  defaults: Callable[[int], Mapping[str, Any]] = no_defaults
  layouts: frozenset[str] = frozenset({"tokens", "images"})
  causal: bool = True
  batch_stats: bool = False
  takes_mask: bool = False
  backward_state: bool = False
  decay: Mapping[str, bool] = dataclasses.field(default_factory=_no_decay)
  kernel: bool = False
  dtype_kind: DtypeKind | None = None

  def __post_init__(self) -> None:
    """Resolves ``dtype_kind=None`` from the module class."""
    _resolve_dtype_kind(self, self.module)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """A registered attention core (the part between projections and output).

  Attributes:
    core: the nnx module class. In the ``tokens`` layout an `AttentionCore`
      (the part between projections and output of `MultiHeadAttention`);
      in the ``images`` layout the whole layer on NHWC maps, built as
      ``core(channels, *, rngs, **kwargs)`` by `make_image_attention`.
    paper: short reference (authors, arXiv id).
    defaults: default core kwargs as a function of ``(num_heads, head_dim,
      num_tokens)``; ``num_tokens`` is ``None`` when the length varies (a
      model with a token map counts its prefix tokens too).
    causal: has a causal form (output at ``t`` uses keys ``<= t`` only).
    takes_mask: ``__call__`` accepts a boolean ``mask=`` (True: attend).
    takes_bias: ``__call__`` accepts an additive ``bias=`` on the logits
      (Born attention has no logits, so it takes masks but no bias).
    layouts: ``tokens`` for sequence models; ``images`` for the channel /
      spatial attentions that act on NHWC maps (ELA, PSA: no mask, no
      causal form, ``defaults`` unused).
    decay: parameter attribute name -> decayed (see `decays`).
    kernel: a Pallas kernel exists (``implementation=``).
    needs_grid: the paper's layer acts on a 2-D token map (SOFT's conv
      landmarks, NaLaFormer's LePE conv and 2-D RoPE). A model whose tokens
      form a map (the ViT) then builds the core with ``grid_shape=(h, w)``
      (the map, row-major) and ``num_prefix`` (tokens before it, e.g. the
      [CLS]); without them the core runs its token form for 1-D sequences.
      None (the default) takes the core class's ``needs_grid`` attribute
      (False if it has none), so the spec and the core cannot disagree.
    dtype_kind: ``"real"`` or ``"complex"``: the dtype of the heads the
      core takes (complex: `MultiHeadAttention` with a complex input and
      ``param_dtype``); None takes the core class's ``dtype_kind``
      attribute (``"real"`` if it has none), as ``needs_grid``.

  Examples:
    >>> from jaxnorm.nn import ATTENTIONS
    >>> spec = ATTENTIONS["gated"]
    >>> spec.core.__name__, spec.causal, spec.takes_mask, spec.needs_grid
    ('GatedAttention', True, True, False)
    >>> ATTENTIONS["psa"].layouts  # a whole layer on NHWC maps
    frozenset({'images'})
  """

  core: type
  paper: str
  defaults: Callable[..., Mapping[str, Any]] = no_defaults
  causal: bool = True
  takes_mask: bool = True
  takes_bias: bool = True
  layouts: frozenset[str] = frozenset({"tokens"})
  decay: Mapping[str, bool] = dataclasses.field(default_factory=_no_decay)
  kernel: bool = False
  needs_grid: bool | None = None
  dtype_kind: DtypeKind | None = None

  def __post_init__(self) -> None:
    """Resolves ``needs_grid`` and ``dtype_kind`` (None) from the core."""
    if self.needs_grid is None:
      grid = bool(getattr(self.core, "needs_grid", False))
      object.__setattr__(self, "needs_grid", grid)
    _resolve_dtype_kind(self, self.core)


@dataclasses.dataclass(frozen=True)
class ResidualSpec:
  """A registered residual scheme.

  Attributes:
    build: ``build(blocks, step, *, num_features, rngs, sublayers_per_layer,
      remat, **options) -> module``: the network around the sublayers
      ``blocks`` (``step`` is this spec's ``step``; every sublayer runs
      under the `jax.checkpoint` policy ``remat`` names, with the same
      parameters for every ``remat``).
    paper: short reference (authors, arXiv id).
    step: ``step(num_features, place, *, rngs, **options) -> module``: the
      step module around the sublayer at ``place`` (a
      `jaxnorm.nn.residual.Placement`), which `make_residual_step` also
      builds one layer at a time. None for a scheme without per-sublayer
      steps (AttnRes: one module over depth).
    defaults: default kwargs as a function of ``(num_sublayers,
      sublayers_per_layer)``.
    uses_norm: the scheme places norms (takes ``norm=``/``norm_kwargs=``).
    norm_free: the scheme also runs with no norm: ``norm="none"``
      (`jaxnorm.nn.residual.NORM_FREE`) builds its steps without any norm
      module, and models build no final norm either.
    shareable: ``shared=True`` is accepted: one step module serves every
      sublayer of a layer (ReZero's official placement).
    fused: ``fused_implementation=`` is accepted: each residual add runs
      fused into the next norm (`jaxnorm.nn.residual.ResidualStack`).
    scan_refusal: why `make_residual_step` cannot build the scheme one
      layer at a time for ``nnx.scan`` (e.g. "has no fixed-size scan
      carry"); None when it can.
    decay: parameter attribute name -> decayed (see `decays`), for the
      parameters of the classes in ``modules``.
    modules: the nnx module classes the scheme builds that own the
      parameters named in ``decay`` (``build`` is a function, so the weight
      decay policy finds the owners here; e.g. `HyperConnection` for
      ``static_alpha``).

  Raises:
    ValueError: for a scheme without ``step`` that does not say why it
      cannot be scanned, or a norm-free scheme that places no norm.

  Examples:
    >>> from jaxnorm.nn import RESIDUALS
    >>> spec = RESIDUALS["hc"]
    >>> spec.defaults(8, 2)  # (num_sublayers, sublayers_per_layer)
    {'num_streams': 4, 'readout': 'mean'}
    >>> dict(spec.decay), spec.modules[0].__name__
    ({'static_alpha': False}, 'HyperConnection')
    >>> RESIDUALS["attnres"].scannable, RESIDUALS["attnres"].scan_refusal
    (False, 'has no fixed-size scan carry')
  """

  build: Callable[..., Any]
  paper: str
  step: Callable[..., Any] | None = None
  defaults: Callable[..., Mapping[str, Any]] = no_defaults
  uses_norm: bool = True
  norm_free: bool = False
  shareable: bool = False
  fused: bool = False
  scan_refusal: str | None = None
  decay: Mapping[str, bool] = dataclasses.field(default_factory=_no_decay)
  modules: tuple[type, ...] = ()

  def __post_init__(self) -> None:
    """Checks that the capability fields agree with each other."""
    if self.step is None and self.scan_refusal is None:
      raise ValueError(
        "ResidualSpec: a scheme without a step builder cannot be scanned; "
        "give scan_refusal the reason"
      )
    if self.norm_free and not self.uses_norm:
      raise ValueError(
        "ResidualSpec: norm_free=True needs uses_norm=True (a scheme that "
        "places no norm has none to drop)"
      )

  @property
  def scannable(self) -> bool:
    """`make_residual_step` builds the scheme (``scan_refusal`` is None)."""
    return self.scan_refusal is None


DataKind = Literal["text", "images", "graphs"]
DATA_KINDS: tuple[str, ...] = ("text", "images", "graphs")
PART_FIELDS: tuple[str, ...] = ("norm", "attention", "residual", "activation")


def _no_derived(
  shared: Mapping[str, Any], data: Mapping[str, Any]
) -> dict[str, Any]:
  """Config fields derived from the run and the data: none."""
  del shared, data
  return {}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A registered model: what it is built from and what it accepts.

  The model class states its own ``layout`` and ``causal`` (class
  attributes it also checks its parts against), so the spec and the model
  cannot disagree; ``dtype_kind`` likewise.

  Attributes:
    config: the frozen config dataclass (``LMConfig``).
    module: the nnx model class, built as ``module(config, dtype=...,
      rngs=...)``.
    paper: short reference, or what the model reproduces.
    data: the data it takes: ``text`` (token windows), ``images`` (image
      and label) or ``graphs`` (node-classification batches).
    parts: the part fields (of `PART_FIELDS`) the model builds by name; a
      part field not listed is accepted with any name and ignored (the
      CNN's attention).
    heads: the model has attention heads (``num_heads`` must divide
      ``width``).
    positional: the positional encodings it takes, its default first;
      empty when it has none.
    mixers: token mixers ``attention`` accepts beside the attention
      registry's (the complex LM's CNet Fourier mixing).
    activations: the model's own activation names (the complex
      activations), or None for `jaxnorm.nn.activations.ACTIVATIONS`.
    norms: the model's own rule for its norm names (the graph model calls
      some norms with the node mask), or None for the norms of its
      ``layout`` (causal ones if the model is causal).
    counterparts: part field -> {a real part name: the model's name for
      it}, so the names of a real model build a complex one (``rmsnorm``
      stands for ``complexrmsnorm``).
    derive: ``derive(shared, data) -> fields``: config fields that follow
      from the run's shared fields (``width``, ``depth``, ...) and what the
      data decides (``vocab_size``, ``image_shape``, ...).
    layout: the layout its norms and attention see (``tokens``,
      ``images``, ``graphs``); None takes the module's ``layout``.
    causal: position ``t`` depends on positions ``<= t`` only; None takes
      the module's ``causal`` (False if it has none).
    dtype_kind: ``real`` or ``complex`` parts; None takes the module's
      ``dtype_kind`` (``real`` if it has none).

  Examples:
    >>> from jaxnorm.nn.model_registry import MODELS
    >>> spec = MODELS["cvcnn"]
    >>> spec.module.__name__, spec.data, spec.layout, spec.dtype_kind
    ('CVCNN', 'images', 'images', 'complex')
    >>> sorted(spec.parts), spec.counterparts["activation"]["relu"]
    (['activation'], 'crelu')
  """

  config: type
  module: type
  paper: str
  data: DataKind
  parts: frozenset[str] = frozenset()
  heads: bool = False
  positional: tuple[str, ...] = ()
  mixers: tuple[str, ...] = ()
  activations: tuple[str, ...] | None = None
  norms: Callable[[], tuple[str, ...]] | None = None
  counterparts: Mapping[str, Mapping[str, str]] = dataclasses.field(
    default_factory=lambda: types.MappingProxyType({})
  )
  derive: Callable[..., Mapping[str, Any]] = _no_derived
  layout: Layout | None = None
  causal: bool | None = None
  dtype_kind: DtypeKind | None = None

  def __post_init__(self) -> None:
    """Resolves the module's facts; checks the names of the fields."""
    if self.layout is None:
      object.__setattr__(self, "layout", getattr(self.module, "layout", None))
    if self.causal is None:
      causal = bool(getattr(self.module, "causal", False))
      object.__setattr__(self, "causal", causal)
    _resolve_dtype_kind(self, self.module)
    if self.data not in DATA_KINDS:
      raise ValueError(
        f"ModelSpec: data must be one of {', '.join(DATA_KINDS)}, got "
        f"{self.data!r}"
      )
    unknown = sorted(set(self.parts) - set(PART_FIELDS))
    if unknown:
      raise ValueError(
        f"ModelSpec: parts {unknown} are not part fields; valid: "
        f"{', '.join(PART_FIELDS)}"
      )
    named = self.parts & {"norm", "attention"}
    if named and self.norms is None and self.layout not in LAYOUTS:
      raise ValueError(
        f"ModelSpec: {self.module.__name__} builds norms or attention by "
        f"name, so it needs a layout of {', '.join(LAYOUTS)}; got "
        f"{self.layout!r}"
      )


def decays(
  name: str, ndim: int, override: Mapping[str, bool] | None = None
) -> bool:
  """The one weight-decay rule: matrices yes, vectors and scalars no.

  Args:
    name: the parameter's attribute name on its module.
    ndim: its number of dimensions.
    override: the owning module's spec ``decay`` mapping, if registered.

  Returns:
    Whether decoupled weight decay applies to the parameter.

  Examples:
    >>> decays("kernel", 2), decays("bias", 1)
    (True, False)
    >>> decays("gate", 1, {"gate": True})  # the owner's spec overrides
    True
  """
  if override is not None and name in override:
    return override[name]
  return ndim >= 2
