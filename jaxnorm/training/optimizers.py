"""Optimizers, schedules and clipping by name for the experiment runner.

Every entry of `OPTIMIZERS` builds an `optax.GradientTransformation` from a
learning-rate schedule (`make_schedule`: ``cosine``, ``wsd`` or
``constant``, each after a linear warmup), a weight decay with its per-leaf
mask, the moment coefficients ``b1``/``b2`` (the entry's defaults unless
given) and any further keyword argument of the method (`options`, e.g.
Conda's ``update_proj_gap``). `build_optimizer` adds global-norm clipping
in front and gradient accumulation (`optax.MultiSteps`) around it.

Weight decay follows one per-leaf mask for every optimizer: the runner
passes `jaxnorm.nn.decay.decay_mask` of the model (the registry's
`decays` rule: matrices, kernels and embeddings yes; norm scales, biases and
gates no, unless a part's spec says otherwise); `matrix_mask` (``ndim >= 2``)
is the default without a model. One exception: ``muon`` hands the leaves that
are not 2-D (vectors, and 4-D convolution kernels) to its internal AdamW,
which optax gives no mask, so those are never decayed under ``muon``.

Depth-muP and CompleteP (``--residual depth_mup|completep``) come with
DepthBench's AdamW rule by depth (`depth_adam_rule`): the hidden parameters
(`hidden_mask`: those inside the residual network) train with the learning
rate times :math:`m^{e-1}` and eps times :math:`m^{-e}`, :math:`m = L /
24`; `from_config` applies it (``adamw`` only) and `build_optimizer` takes
its per-parameter ``eps`` and ``lr_multipliers``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxnorm import optim, residual
from jaxnorm.nn import _common as nn_common
from jaxnorm.nn import residual as nn_residual

# The share of the updates over which ``wsd`` decays to zero at the end.
WSD_DECAY_FRACTION = 0.2
# ``cosine`` ends at this fraction of the peak learning rate.
COSINE_FINAL_FRACTION = 0.1
# Adam's eps of ``adamw`` (optax's default; DepthBench's AdamW eps).
ADAMW_EPS = 1e-8


def matrix_mask(params: Any) -> Any:
  """True for leaves with two or more dimensions (decayed weights)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


# ---------------------------------------------------------------------------
# Depth-muP and CompleteP: DepthBench's AdamW rule by depth.

# Module classes that hold a residual network: the parameters under one are
# the "hidden" ones (DepthBench's ``blocks.*``).
_STACKS: tuple[type, ...] = (
  nn_residual.ResidualStack,
  nn_residual.StreamStack,
  nn_residual.AttnResStack,
  nn_common.ScannedStack,
)


def hidden_mask(model: nnx.Module) -> Any:
  """Which parameters of ``model`` sit inside its residual network.

  The hidden parameters of depth-muP and CompleteP: every parameter under
  a residual network module (the `jaxnorm.nn.residual.make_residual`
  stacks, a scanned stack): the sublayers' matrices and biases and the
  steps' norms. The embeddings, positional tables, final norm and head are
  not hidden. DepthBench's group ``blocks.*`` (OLMo-core's transformer
  blocks, each holding its attention and MLP and their pre-norms) is the
  same set.

  Args:
    model: the module tree (may be abstract, from `nnx.eval_shape`).

  Returns:
    An ``nnx.State`` of Python bools with the structure of
    ``nnx.state(model, nnx.Param)`` (as `jaxnorm.nn.decay.decay_mask`).

  Raises:
    ValueError: for a model without a residual network.

  Examples:
    >>> from jaxnorm.nn import models
    >>> cfg = models.LMConfig(vocab_size=16, width=8, depth=2, num_heads=2,
    ...                       max_len=4, residual="depth_mup")
    >>> lm = models.DecoderLM(cfg, rngs=nnx.Rngs(0))
    >>> mask = nnx.to_pure_dict(hidden_mask(lm))
    >>> mask["embed"], mask["final_norm"]["scale"]
    (False, False)
    >>> mask["net"]["blocks"][0]["q_kernel"], mask["net"]["steps"][0]
    (True, {'norm': {'scale': True}})
  """
  stacks = [
    tuple(path)
    for path, node in nnx.iter_graph(model)
    if isinstance(node, _STACKS)
  ]
  if not stacks:
    raise ValueError(
      f"hidden_mask: {type(model).__name__} holds no residual network "
      f"(none of {', '.join(c.__name__ for c in _STACKS)}); the depth rule "
      "needs one to tell hidden parameters from the others"
    )
  flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
  return nnx.from_flat_state(
    [
      (path, any(tuple(path[: len(s)]) == s for s in stacks))
      for path, _ in flat
    ]
  )


class DepthRule(NamedTuple):
  """Per-parameter AdamW hyperparameters of depth-muP or CompleteP.

  Attributes:
    lr_multipliers: a tree (the params' structure) of Python floats: the
      factor on the learning rate of each parameter.
    eps: a tree of Python floats: Adam's eps of each parameter.
  """

  lr_multipliers: Any
  eps: Any


def depth_adam_rule(
  hidden: Any,
  *,
  scheme: str,
  num_layers: int,
  base_depth: int = residual.BASE_DEPTH,
  eps: float = ADAMW_EPS,
) -> DepthRule:
  r"""DepthBench's AdamW learning-rate factors and eps, per parameter.

  With :math:`m = L / L_0` and the scheme's exponent :math:`e`
  (`jaxnorm.residual.DEPTH_EXPONENTS`), hidden parameters get the learning
  rate factor :math:`m^{e-1}` and eps :math:`\epsilon m^{-e}`
  (`jaxnorm.residual.depth_adam_scales`); the others factor 1 and eps
  :math:`\epsilon`. At the base depth every factor is 1: plain AdamW.

  Provenance: ``keyu-wang-2002/DepthBench``
  ``examples/pretrain_preln_mup.py`` (commit aba1f652),
  ``apply_depth_only_scaling``: one ``OptimGroupOverride`` on
  ``blocks.*`` with ``lr = lr * m ** (alpha - 1)`` and ``eps = eps * m **
  -alpha``; OLMo-core's scheduler scales each group's ``initial_lr``, so
  the factor holds at every step of the schedule, and PyTorch's ``AdamW``
  decays by the group's learning rate times the weight decay (here: the
  factor multiplies the whole update, decay included).

  Args:
    hidden: a tree of bools, True for the hidden parameters (`hidden_mask`).
    scheme: ``"depth_mup"`` or ``"completep"``.
    num_layers: layers ``L`` of the network.
    base_depth: the base depth :math:`L_0` (DepthBench's 24).
    eps: Adam's base eps (DepthBench's 1e-8).

  Returns:
    A `DepthRule` of two trees of the structure of ``hidden``.

  Raises:
    ValueError: for an unknown scheme or a non-positive depth.

  Examples:
    >>> rule = depth_adam_rule({"embed": False, "w": True},
    ...                        scheme="depth_mup", num_layers=96)
    >>> rule.lr_multipliers, rule.eps  # m = 96 / 24 = 4: m^(-1/2)
    ({'embed': 1.0, 'w': 0.5}, {'embed': 1e-08, 'w': 5e-09})
  """
  if scheme not in residual.DEPTH_EXPONENTS:
    raise ValueError(
      f"depth_adam_rule: scheme must be one of "
      f"{', '.join(residual.DEPTH_EXPONENTS)}, got {scheme=}"
    )
  lr_scale, eps_scale = residual.depth_adam_scales(
    num_layers, base_depth, residual.DEPTH_EXPONENTS[scheme]
  )
  return DepthRule(
    jax.tree.map(lambda h: lr_scale if h else 1.0, hidden),
    jax.tree.map(lambda h: eps * eps_scale if h else eps, hidden),
  )


def scale_by_adam_leafwise(
  b1: float = 0.9, b2: float = 0.999, *, eps: Any = ADAMW_EPS
) -> optax.GradientTransformation:
  r"""Adam's scaling with one eps per parameter.

  .. math:: u = \hat m / (\sqrt{\hat v} + \epsilon_p)

  as `optax.scale_by_adam` (same state, `optax.ScaleByAdamState`; eps
  added after the bias correction, as PyTorch's ``Adam``), with
  :math:`\epsilon_p` read from the tree ``eps`` (or one float for all).

  Args:
    b1: first-moment decay.
    b2: second-moment decay.
    eps: a float, or a tree of floats with the params' structure (or a
      prefix of it, such as `hidden_mask`'s: one float per ``nnx.Param``).

  Returns:
    An `optax.GradientTransformation`.

  Examples:
    >>> tx = scale_by_adam_leafwise(eps={"a": 1e-8, "b": 1.0})
    >>> g = {"a": jnp.ones(2), "b": jnp.ones(2)}
    >>> u, _ = tx.update(g, tx.init(g))
    >>> [round(float(v[0]), 4) for v in (u["a"], u["b"])]  # 1 / (1 + eps)
    [1.0, 0.5]

  References:
    Kingma & Ba, *Adam: A Method for Stochastic Optimization*,
    arXiv:1412.6980 (2015).
  """

  def init_fn(params):
    return optax.ScaleByAdamState(
      count=jnp.zeros([], jnp.int32),
      mu=optax.tree.zeros_like(params),
      nu=optax.tree.zeros_like(params),
    )

  def update_fn(updates, state, params=None):
    del params
    # ``b ** count`` mixes a Python float with the int32 count: standard
    # promotion (as optax's adam under the runner), same values.
    with jax.numpy_dtype_promotion("standard"):
      return _adam_update(updates, state)

  def _adam_update(updates, state):
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = optax.safe_increment(state.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, count)
    if isinstance(eps, (int, float)):
      out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu_hat, nu_hat)
    else:  # eps is a prefix of the updates (a float per nnx.Param node).
      out = jax.tree.map(
        lambda e, m, v: jax.tree.map(lambda a, b: a / (jnp.sqrt(b) + e), m, v),
        eps,
        mu_hat,
        nu_hat,
      )
    nu = optax.tree.cast_like(nu, state.nu)
    return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_multipliers(multipliers: Any) -> optax.GradientTransformation:
  """Multiplies each update by its parameter's constant factor.

  Placed after the learning rate, it gives each parameter its own peak
  learning rate (a PyTorch parameter group's ``lr``), with the schedule's
  shape unchanged and the decoupled weight decay scaled alike.

  Args:
    multipliers: a tree of Python floats with the params' structure (or a
      prefix of it: one float per ``nnx.Param``).

  Returns:
    An `optax.GradientTransformation` without state.

  Examples:
    >>> tx = scale_by_multipliers({"a": 1.0, "b": 0.5})
    >>> u, _ = tx.update({"a": jnp.ones(1), "b": jnp.ones(1)}, tx.init(None))
    >>> float(u["a"][0]), float(u["b"][0])
    (1.0, 0.5)
  """

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    # ``multipliers`` is a prefix of the updates (a float per nnx.Param).
    scaled = jax.tree.map(
      lambda m, u: jax.tree.map(lambda a: a * m, u), multipliers, updates
    )
    return scaled, state

  return optax.GradientTransformation(init_fn, update_fn)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One named optimizer: a method and the runner's fields it takes.

  Attributes:
    method: the optimizer function, called as ``method(schedule,
      **arguments(weight_decay, mask, b1, b2), **options)``.
    arguments: ``arguments(weight_decay, mask, b1, b2)``: the method's
      keyword arguments the runner's own fields fill (``b2`` is None when
      the method has no second moment).
    b1: default first-moment / momentum coefficient.
    b2: default second-moment coefficient, or None if the method has none.
    decay_first: the method has no weight decay of its own: decay with
      `optax.add_decayed_weights` before it.
  """

  method: Callable[..., optax.GradientTransformation]
  arguments: Callable[..., dict[str, Any]]
  b1: float
  b2: float | None
  decay_first: bool = False

  @property
  def sets(self) -> tuple[str, ...]:
    """The method's arguments the runner fills (the schedule's included)."""
    return ("learning_rate", *self.arguments(0.0, None, self.b1, self.b2))

  def build(
    self, lr: Any, wd: float, mask: Any, b1: float, b2: float | None, **options
  ) -> optax.GradientTransformation:
    """The method at schedule ``lr`` with the runner's fields and options."""
    tx = self.method(lr, **self.arguments(wd, mask, b1, b2), **options)
    if self.decay_first:
      return optax.chain(optax.add_decayed_weights(wd, mask), tx)
    return tx


def _adam_like(wd, mask, b1, b2):
  return {"b1": b1, "b2": b2, "weight_decay": wd, "mask": mask}


def _matrix_and_adam(wd, mask):
  """Conda's and RMNP's: matrices and the Adam group share the decay."""
  return {"weight_decay": wd, "adam_weight_decay": wd, "mask": mask}


OPTIMIZERS: types.MappingProxyType = types.MappingProxyType(
  {
    "adamw": Entry(optax.adamw, _adam_like, 0.9, 0.95),
    "sgd": Entry(
      optax.sgd,
      lambda wd, mask, b1, b2: {"momentum": b1, "nesterov": True},
      0.9,
      None,
      decay_first=True,
    ),
    "adamp": Entry(optim.adamp, _adam_like, 0.9, 0.95),
    "sgdp": Entry(
      optim.sgdp,
      lambda wd, mask, b1, b2: {
        "momentum": b1,
        "nesterov": True,
        "weight_decay": wd,
        "mask": mask,
      },
      0.9,
      None,
    ),
    "conda": Entry(
      optim.conda,
      lambda wd, mask, b1, b2: {
        "b1": b1,
        "b2": b2,
        **_matrix_and_adam(wd, mask),
      },
      0.9,
      0.95,
    ),
    "rmnp": Entry(
      optim.rmnp,
      lambda wd, mask, b1, b2: {
        "beta": b1,
        "adam_b2": b2,
        **_matrix_and_adam(wd, mask),
      },
      0.95,
      0.95,
    ),
    "muon": Entry(
      optax.contrib.muon,
      lambda wd, mask, b1, b2: {
        "beta": b1,
        "adam_b2": b2,
        "weight_decay": wd,
        "weight_decay_mask": mask,
      },
      0.95,
      0.999,
    ),
    "lion": Entry(optax.lion, _adam_like, 0.9, 0.99),
  }
)


def options(name: str) -> tuple[str, ...]:
  """The keyword arguments ``name``'s method takes beyond the runner's own.

  These are what ``--optimizer-kwargs`` may set (e.g. Conda's
  ``update_proj_gap``): every keyword argument of the entry's ``method``
  except those its ``build`` fills (`Entry.sets`).

  Raises:
    ValueError: for an unknown name; the message lists the valid names.
  """
  entry = _entry("options", name)
  params = inspect.signature(entry.method).parameters.values()
  keyword = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
  )
  return tuple(
    p.name for p in params if p.kind in keyword and p.name not in entry.sets
  )


def _entry(who: str, name: str) -> Entry:
  if name not in OPTIMIZERS:
    raise ValueError(
      f"{who}: unknown optimizer {name!r}; valid names are "
      f"{', '.join(sorted(OPTIMIZERS))}"
    )
  return OPTIMIZERS[name]


def make_schedule(
  kind: str, learning_rate: float, warmup_steps: int, total_steps: int
) -> optax.Schedule:
  """The learning rate against the update count.

  All start with a linear warmup from 0 over ``warmup_steps`` (at least 1,
  at most ``total_steps - 1``); then ``cosine`` decays to
  `COSINE_FINAL_FRACTION` of the peak at ``total_steps``, ``wsd`` holds the
  peak and decays linearly to 0 over the last `WSD_DECAY_FRACTION` of the
  updates, and ``constant`` holds the peak.

  Raises:
    ValueError: for an unknown kind; the message lists the valid kinds.
  """
  warmup = min(max(warmup_steps, 1), max(total_steps - 1, 1))
  ramp = optax.linear_schedule(0.0, learning_rate, warmup)
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(
      0.0,
      learning_rate,
      warmup,
      max(total_steps, warmup + 1),
      end_value=learning_rate * COSINE_FINAL_FRACTION,
    )
  if kind == "constant":
    return optax.join_schedules(
      [ramp, optax.constant_schedule(learning_rate)], [warmup]
    )
  if kind == "wsd":
    decay = max(round(WSD_DECAY_FRACTION * total_steps), 1)
    stable_end = max(total_steps - decay, warmup)
    return optax.join_schedules(
      [
        ramp,
        optax.constant_schedule(learning_rate),
        optax.linear_schedule(learning_rate, 0.0, decay),
      ],
      [warmup, stable_end],
    )
  raise ValueError(
    f"make_schedule: unknown schedule {kind!r}; valid kinds are cosine, "
    f"wsd, constant"
  )


def build_optimizer(
  name: str,
  *,
  learning_rate: float,
  weight_decay: float,
  warmup_steps: int,
  total_steps: int,
  schedule: str = "cosine",
  clip_norm: float = 1.0,
  b1: float | None = None,
  b2: float | None = None,
  grad_accum: int = 1,
  mask: Any = matrix_mask,
  eps: Any = None,
  lr_multipliers: Any = None,
  kwargs: Mapping[str, Any] | None = None,
) -> optax.GradientTransformation:
  """The named optimizer with its schedule, clipping and accumulation.

  Args:
    name: a key of `OPTIMIZERS`.
    learning_rate: peak learning rate.
    weight_decay: decoupled weight decay, applied where ``mask`` is True.
    warmup_steps: warmup length in updates.
    total_steps: batches of the run; the schedule spans
      ``total_steps // grad_accum`` updates.
    schedule: ``cosine``, ``wsd`` or ``constant`` (`make_schedule`).
    clip_norm: global-norm clipping threshold; 0 turns clipping off.
    b1: first-moment coefficient; None keeps the entry's default.
    b2: second-moment coefficient; None keeps the entry's default.
    grad_accum: batches averaged into one update (`optax.MultiSteps`).
    mask: the leaves weight decay applies to: a bool tree of the params'
      structure (e.g. `jaxnorm.nn.decay.decay_mask` of the model) or a
      callable from params to one.
    eps: ``adamw`` only: Adam's eps per parameter, a tree of floats of the
      params' structure (`scale_by_adam_leafwise`; e.g. `DepthRule.eps`);
      None keeps `ADAMW_EPS` for every parameter (plain `optax.adamw`).
    lr_multipliers: a tree of floats of the params' structure: each
      parameter's factor on the scheduled learning rate, weight decay
      included (`scale_by_multipliers`; e.g. `DepthRule.lr_multipliers`).
    kwargs: further keyword arguments of the method, by name: one of
      `options` of ``name`` each (e.g. ``{"update_proj_gap": 200}`` for
      ``conda``); None or empty keeps the method's defaults.

  Raises:
    ValueError: for an unknown name (the message lists the valid names),
      a ``b2`` for a method without a second moment, an ``eps`` for an
      optimizer other than ``adamw``, a ``kwargs`` name that is not one of
      ``name``'s `options` (the message lists them), or ``kwargs`` with a
      per-parameter ``eps``.
  """
  entry = _entry("build_optimizer", name)
  kwargs = dict(kwargs or {})
  unknown = sorted(set(kwargs) - set(options(name)))
  if unknown:
    raise ValueError(
      f"build_optimizer: --optimizer-kwargs {unknown} are not options of "
      f"{name}; its options: {', '.join(options(name))} (the runner's own "
      f"flags set {', '.join(entry.sets)})"
    )
  if kwargs and eps is not None:
    raise ValueError(
      f"build_optimizer: --optimizer-kwargs {sorted(kwargs)} do not apply "
      f"with a per-parameter eps (DepthBench's AdamW rule by depth builds "
      f"its own Adam); drop them"
    )
  if b2 is not None and entry.b2 is None:
    raise ValueError(
      f"build_optimizer: {name} has no second moment, so --b2 does not "
      f"apply; optimizers that take it: "
      f"{', '.join(n for n, e in OPTIMIZERS.items() if e.b2 is not None)}"
    )
  if eps is not None and name != "adamw":
    raise ValueError(
      f"build_optimizer: a per-parameter eps applies to adamw only, got "
      f"{name!r}; use adamw or drop eps"
    )
  lr = make_schedule(
    schedule, learning_rate, warmup_steps, total_steps // grad_accum
  )
  b1 = entry.b1 if b1 is None else b1
  b2 = entry.b2 if b2 is None else b2
  if eps is None:
    tx = entry.build(lr, weight_decay, mask, b1, b2, **kwargs)
  else:  # optax.adamw with eps per parameter.
    tx = optax.chain(
      scale_by_adam_leafwise(b1, b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(lr),
    )
  if lr_multipliers is not None:
    tx = optax.chain(tx, scale_by_multipliers(lr_multipliers))
  if clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  if grad_accum > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=grad_accum)
  return tx


def from_config(
  cfg: Any, *, mask: Any = matrix_mask, model: nnx.Module | None = None
) -> optax.GradientTransformation:
  """`build_optimizer` with the optimizer fields of a `TrainConfig`.

  With ``cfg.residual`` ``depth_mup`` or ``completep``, AdamW follows
  DepthBench's rule by depth (`depth_adam_rule` with ``cfg.depth`` layers
  and the scheme's base depth, `jaxnorm.residual.BASE_DEPTH`); the
  schedule (and the ``lr`` the runner logs) is the base learning rate, the
  one of the embeddings, final norm and head.

  Args:
    cfg: a `jaxnorm.training.config.TrainConfig`.
    mask: the weight-decay mask (as in `build_optimizer`).
    model: the model (may be abstract); required for ``depth_mup`` and
      ``completep``, whose rule reads its `hidden_mask`; unused otherwise.

  Raises:
    ValueError: for ``depth_mup``/``completep`` with an optimizer other
      than ``adamw`` (the rule is DepthBench's AdamW rule) or without
      ``model``; and as `build_optimizer`.
  """
  depth: dict[str, Any] = {}
  if cfg.residual in residual.DEPTH_EXPONENTS:
    if cfg.optimizer != "adamw":
      raise ValueError(
        f"from_config: --residual {cfg.residual} trains with DepthBench's "
        f"AdamW rule by depth (learning rate and eps of the hidden "
        f"parameters), defined for adamw only, got --optimizer "
        f"{cfg.optimizer}; use --optimizer adamw"
      )
    if model is None:
      raise ValueError(
        f"from_config: --residual {cfg.residual} needs model= (its "
        f"hidden_mask: the parameters whose learning rate and eps scale "
        f"with depth), got model=None"
      )
    rule = depth_adam_rule(
      hidden_mask(model),
      scheme=cfg.residual,
      num_layers=cfg.depth,
      base_depth=residual.BASE_DEPTH,
    )
    depth = {"eps": rule.eps, "lr_multipliers": rule.lr_multipliers}
  return build_optimizer(
    cfg.optimizer,
    learning_rate=cfg.learning_rate,
    weight_decay=cfg.weight_decay,
    warmup_steps=cfg.warmup_steps,
    total_steps=cfg.steps,
    schedule=cfg.schedule,
    clip_norm=cfg.clip_norm,
    b1=cfg.b1,
    b2=cfg.b2,
    grad_accum=cfg.grad_accum,
    mask=mask,
    kwargs=dict(cfg.optimizer_kwargs),
    **depth,
  )
