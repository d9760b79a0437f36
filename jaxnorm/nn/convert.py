"""Exact weight conversions of the decoder LM, and LayerNorm removal.

Pure functions on the parameter tree of a `jaxnorm.nn.models.DecoderLM`
(the nested dict ``nnx.to_pure_dict(nnx.state(model))``, see `lm_params`)
and its `LMConfig`. Each returns a new ``(params, config)`` pair that
`load_lm` (or ``DecoderLM(config)`` plus ``nnx.update``) loads as is. They
work on `jax.Array` and NumPy leaves alike and keep the leaves' namespace
and dtype, so a NumPy float64 tree converts in float64.

Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm (Jiang et al. 2023), in three steps
that each preserve the function (``../shared/specs/norms.md`` section 2):

1. `fold_layer_norm_affine`: every LayerNorm's ``scale`` and ``bias`` go
   into the linear maps that read its output (Q, K, V; MLP up; the head):
   ``W <- diag(scale) W``, ``b <- b + bias W``.
2. `center_writers`: every writer of the residual stream (token and
   position embeddings, attention output and MLP down projections with
   their biases) is centered over the stream axis, so the stream has zero
   mean and each affine-free LayerNorm equals an affine-free RMSNorm.
3. `to_pre_crmsnorm`: the zero-mean stream keeps only its first ``d-1``
   coordinates; writers drop their last output column, readers subtract
   their last input row from the others, and the norm is CRMSNorm.

`to_pre_rmsnorm` does steps 1-2; with ``reparameterize=True`` it instead
returns the paper's *training* form (same free weights, centering in the
forward pass via ``zero_mean_writers``), whose loss equals the Pre-LN loss
as a function of the parameters, so any optimizer follows the same path.

LayerNorm removal (Baroni et al. 2025, spec section 10): `fake_layer_norm`
is LayerNorm with the per-token standard deviation replaced by a given
constant; `removal_steps` is the removal schedule; `remove_fake_ln` exports
a fine-tuned FakeLN model (`jaxnorm.nn.fakeln`) to a model with no norm at
all (``norm="none"``), folding ``1/std`` and the centering into the readers.

Conventions left open by the papers and chosen here:

* Dense kernels are ``(in, out)``; attention ``q/k/v_kernel`` are
  ``(D, N, H)`` and ``out_kernel`` ``(N, H, D)``; the stream axis ``D`` is
  the input axis of readers and the output axis of writers.
* When a LayerNorm has a bias but the model has no linear biases, the
  converted config turns ``use_bias`` on (biases that nothing produced are
  zeros): folding ``bias W`` needs a bias on every reader.
* The conversions use the source model's ``eps`` unchanged.

References:
  Jiang, Gu, Zhu & Pan, *Pre-RMSNorm and Pre-CRMSNorm Transformers:
  Equivalent and Efficient Pre-LN Transformers*, NeurIPS 2023,
  arXiv:2305.14858.
  Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers Don't
  Need LayerNorm at Inference Time: Scaling LayerNorm Removal to GPT-2 XL
  and the Implications for Mechanistic Interpretability*, arXiv:2507.02559
  (2025).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, ArrayLike, Float

from jaxnorm import _checks
from jaxnorm.nn import models

Params = dict[str, Any]

# Attention variants whose only stream readers are q/k/v (plus parameters
# that do not touch the stream, such as sink logits).
SUPPORTED_ATTENTIONS: tuple[str, ...] = ("softmax", "off_by_one", "sink")
_LN_KWARGS = ("eps", "use_scale", "use_bias", "scale_offset")
_RMS_KWARGS = ("eps", "use_scale", "scale_offset")
_LN_DEFAULTS = {
  "eps": 1e-6,
  "use_scale": True,
  "use_bias": True,
  "scale_offset": 0.0,
}
_RMS_DEFAULTS = {
  "eps": 1e-6,
  "use_scale": True,
  "scale_offset": 0.0,
  "eps_mode": "inside",
}


# ---------------------------------------------------------------------------
# Loading and array namespaces.


def lm_params(model: models.DecoderLM) -> Params:
  """The pure parameter (and state) tree of a `DecoderLM`."""
  return nnx.to_pure_dict(nnx.state(model))


def load_lm(
  config: models.LMConfig, params: Params, *, dtype: Any = jnp.float32
) -> models.DecoderLM:
  """Builds ``DecoderLM(config)`` holding ``params``.

  Leaves are cast to the dtypes of the freshly built model (float32 for
  parameters), so NumPy float64 trees load too.

  Raises:
    ValueError: if the tree's paths or shapes differ from the model's.
  """
  model = models.DecoderLM(config, dtype=dtype, rngs=nnx.Rngs(0))
  ref = lm_params(model)
  ref_paths = dict(_flatten(ref))
  got_paths = dict(_flatten(params))
  if ref_paths.keys() != got_paths.keys():
    missing = sorted(set(ref_paths) - set(got_paths))
    extra = sorted(set(got_paths) - set(ref_paths))
    raise ValueError(
      f"load_lm: params do not match the model of {config=}; "
      f"missing {missing}, unexpected {extra}"
    )
  for path, r in ref_paths.items():
    if tuple(np.shape(got_paths[path])) != tuple(r.shape):
      raise ValueError(
        f"load_lm: {path} must have shape {r.shape} for this "
        f"config, got {np.shape(got_paths[path])}"
      )
  # Copies: the model owns its buffers (a trainer may donate them).
  cast = _unflatten(
    {
      p: jnp.array(got_paths[p], r.dtype, copy=True)
      for p, r in ref_paths.items()
    }
  )
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, cast)
  nnx.update(model, state)
  return model


def _flatten(tree: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
  if isinstance(tree, Mapping):
    out = []
    for k in tree:
      out.extend(_flatten(tree[k], prefix + (k,)))
    return out
  return [(prefix, tree)]


def _unflatten(flat: Mapping[tuple, Any]) -> dict:
  out: dict = {}
  for path, v in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


def _xp(x: Any):
  return np if isinstance(x, np.ndarray) else jnp


def _zeros_like_row(w: Any, shape: tuple[int, ...]) -> Any:
  return _xp(w).zeros(shape, w.dtype)


def _center(w: Any, axis: int = -1) -> Any:
  return w - _xp(w).mean(w, axis=axis, keepdims=True)


# ---------------------------------------------------------------------------
# Checks and the canonical per-layer view of the tree.


def _norm_kwargs(
  who: str,
  config: models.LMConfig,
  allowed: tuple[str, ...],
  defaults: Mapping[str, Any],
) -> dict[str, Any]:
  kw = dict(config.norm_kwargs)
  unknown = sorted(set(kw) - set(allowed) - {"scale_init", "bias_init"})
  if unknown:
    raise ValueError(
      f"{who}: norm_kwargs {unknown} are not supported by the "
      f"conversion; supported keys are {', '.join(allowed)}"
    )
  return {**defaults, **{k: v for k, v in kw.items() if k in allowed}}


def _check_lm(who: str, config: Any, norms: tuple[str, ...]) -> None:
  if not isinstance(config, models.LMConfig):
    raise ValueError(
      f"{who}: config must be a jaxnorm.nn.models.LMConfig, "
      f"got {type(config).__name__}"
    )
  if config.residual != "prenorm":
    raise ValueError(
      f"{who}: only pre-norm models (residual='prenorm') "
      f"convert exactly, got residual={config.residual!r}"
    )
  if config.norm not in norms:
    raise ValueError(
      f"{who}: the model's norm must be one of "
      f"{', '.join(norms)}, got norm={config.norm!r}"
    )
  if config.attention not in SUPPORTED_ATTENTIONS:
    raise ValueError(
      f"{who}: attention={config.attention!r} reads the "
      f"stream through maps this conversion does not know; "
      f"supported: {', '.join(SUPPORTED_ATTENTIONS)}"
    )


def _check_untied(who: str, config: models.LMConfig) -> None:
  if config.tie_embeddings:
    raise ValueError(
      f"{who}: the model ties its head to the embedding; the folded head "
      f"diag(scale) E^T and the centered embedding differ, so untie first: "
      f"params, config = jaxnorm.nn.convert.untie_embeddings(params, config)"
    )


def _dims(config: models.LMConfig) -> tuple[int, int]:
  head_dim = config.head_dim or config.width // config.num_heads
  hidden = config.mlp_hidden or config.mlp_ratio * config.width
  return head_dim, hidden


def _split(params: Params, config: models.LMConfig) -> dict[str, Any]:
  """Canonical view: embed, pos, layers [(norm1, attn, norm2, mlp)], ..."""
  net = params["net"]
  wrapped = config.zero_mean_writers

  def block(i):
    b = net["blocks"][i]
    return dict(b["sublayer"] if wrapped else b)

  def norm(tree):
    return dict(tree) if tree is not None else {}

  steps = net.get("steps", {})
  layers = [
    (
      norm(steps.get(2 * i, {}).get("norm")),
      block(2 * i),
      norm(steps.get(2 * i + 1, {}).get("norm")),
      block(2 * i + 1),
    )
    for i in range(config.depth)
  ]
  return {
    "embed": params["embed"],
    "pos": params.get("pos"),
    "layers": layers,
    "final": norm(params.get("final_norm")),
    "head": None if "head" not in params else dict(params["head"]),
  }


def _join(view: dict[str, Any], config: models.LMConfig) -> Params:
  """Inverse of `_split` for the structure ``config`` builds."""
  blocks, steps = {}, {}
  for i, (n1, attn, n2, mlp) in enumerate(view["layers"]):
    for j, (n, b) in enumerate(((n1, attn), (n2, mlp))):
      blocks[2 * i + j] = {"sublayer": b} if config.zero_mean_writers else b
      if config.norm != "none":
        steps[2 * i + j] = {"norm": n}
  out: Params = {"embed": view["embed"]}
  if view["pos"] is not None:
    out["pos"] = view["pos"]
  out["net"] = {"blocks": blocks}
  if config.norm != "none":
    out["net"]["steps"] = steps
    out["final_norm"] = view["final"]
  if not config.tie_embeddings:
    out["head"] = view["head"]
  return out


def _gamma_beta(
  norm: Mapping[str, Any], kw: Mapping[str, Any], d: int, like: Any
) -> tuple[Any, Any]:
  xp = _xp(like)
  offset = float(kw.get("scale_offset", 0.0))
  if kw.get("use_scale", True) and "scale" in norm:
    gamma = norm["scale"] + offset
  else:
    gamma = xp.full((d,), 1.0 + offset, like.dtype)
  beta = norm["bias"] if "bias" in norm else xp.zeros((d,), like.dtype)
  return gamma, beta


def _with_biases(
  view: dict[str, Any], config: models.LMConfig
) -> dict[str, Any]:
  """Adds zero biases to every linear map (for ``use_bias=True``)."""
  head_dim, _ = _dims(config)
  d, n = config.width, config.num_heads
  e = view["embed"]
  layers = []
  for n1, attn, n2, mlp in view["layers"]:
    attn = dict(attn)
    for name in ("q", "k", "v"):
      attn.setdefault(f"{name}_bias", _zeros_like_row(e, (n, head_dim)))
    attn.setdefault("out_bias", _zeros_like_row(e, (d,)))
    mlp = dict(mlp)
    up, down = dict(mlp["up"]), dict(mlp["down"])
    up.setdefault("bias", _zeros_like_row(e, (up["kernel"].shape[1],)))
    down.setdefault("bias", _zeros_like_row(e, (d,)))
    mlp["up"], mlp["down"] = up, down
    layers.append((n1, attn, n2, mlp))
  head = view["head"]
  if head is not None:
    head = dict(head)
    head.setdefault("bias", _zeros_like_row(e, (config.vocab_size,)))
  return {**view, "layers": layers, "head": head}


def _fold_reader(
  kernel: Any, bias: Any, scale: Any, shift: Any, center_input: bool = False
) -> tuple[Any, Any]:
  """``(shift + c(x) * scale) W + b`` as ``x W' + b'`` (input axis 0)."""
  xp = _xp(kernel)
  expand = scale.reshape((-1,) + (1,) * (kernel.ndim - 1))
  new_bias = bias + xp.tensordot(shift, kernel, axes=1)
  new_kernel = expand * kernel
  if center_input:
    new_kernel = _center(new_kernel, axis=0)
  return new_kernel, new_bias


# ---------------------------------------------------------------------------
# Conversions.


def untie_embeddings(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  """Gives a tied model its own head ``kernel = embed.T`` (same function).

  The head bias (with ``use_bias``) starts at zero.

  Returns:
    ``(params, config)`` with ``tie_embeddings=False``; unchanged copies if
    the model is already untied.
  """
  if not config.tie_embeddings:
    return dict(params), config
  e = params["embed"]
  head = {"kernel": e.T}
  if config.use_bias:
    head["bias"] = _zeros_like_row(e, (config.vocab_size,))
  out = dict(params)
  out["head"] = head
  return out, dataclasses.replace(config, tie_embeddings=False)


def fold_layer_norm_affine(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  r"""Step 1: folds every LayerNorm's scale and bias into its readers.

  For a LayerNorm with gain :math:`\gamma` (``scale + scale_offset``) and
  offset :math:`\beta` read by ``(W, b)``: :math:`W \leftarrow
  \mathrm{diag}(\gamma) W`, :math:`b \leftarrow b + \beta W`; readers are
  Q, K, V, the MLP up projection and (for the final norm) the head.

  Returns:
    ``(params, config)`` with affine-free LayerNorms
    (``norm_kwargs`` ``use_scale=False, use_bias=False``); ``use_bias`` is
    turned on if any LayerNorm had a bias.

  Raises:
    ValueError: for a non-LayerNorm, non-pre-norm or tied model, an
      unsupported attention variant or unknown ``norm_kwargs``.
  """
  who = "fold_layer_norm_affine"
  _check_lm(who, config, ("layernorm",))
  _check_untied(who, config)
  kw = _norm_kwargs(who, config, _LN_KWARGS, _LN_DEFAULTS)
  view = _split(params, config)
  use_bias = config.use_bias or bool(kw["use_bias"])
  new_config = dataclasses.replace(
    config,
    use_bias=use_bias,
    norm_kwargs=(("eps", kw["eps"]), ("use_scale", False), ("use_bias", False)),
  )
  if use_bias:
    view = _with_biases(view, new_config)
  return _join(
    _fold_view(view, config, kw, center_input=False), new_config
  ), new_config


def _fold_view(
  view: dict[str, Any],
  config: models.LMConfig,
  kw: Mapping[str, Any],
  *,
  center_input: bool,
  std: Any = None,
) -> dict[str, Any]:
  """Folds each norm's (gamma/std, beta) into its readers.

  ``std`` maps a norm's id to its divisor (FakeLN export); readers of a
  centered input also get ``center_input``. Norm dicts become empty.
  """
  d = config.width
  e = view["embed"]

  def gb(norm, key):
    g, b = _gamma_beta(norm, kw, d, e)
    if std is not None:
      g = g / std[key]
    return g, b

  def fold(tree, names, g, b):
    tree = dict(tree)
    for name in names:
      kname, bname = (
        (f"{name}_kernel", f"{name}_bias") if name else ("kernel", "bias")
      )
      # Callers add zero biases (`_with_biases`) whenever a norm has an
      # offset, so a reader without a bias only ever absorbs b = 0.
      bias = tree.get(bname)
      k, bb = _fold_reader(
        tree[kname],
        _zeros_like_row(e, tree[kname].shape[1:]) if bias is None else bias,
        g,
        b,
        center_input,
      )
      tree[kname] = k
      if bias is not None:
        tree[bname] = bb
    return tree

  layers = []
  for i, (n1, attn, n2, mlp) in enumerate(view["layers"]):
    g1, b1 = gb(n1, ("steps", 2 * i))
    g2, b2 = gb(n2, ("steps", 2 * i + 1))
    attn = fold(attn, ("q", "k", "v"), g1, b1)
    mlp = dict(mlp)
    mlp["up"] = fold(mlp["up"], ("",), g2, b2)
    layers.append(({}, attn, {}, mlp))
  gf, bf = gb(view["final"], ("final_norm",))
  head = fold(view["head"], ("",), gf, bf)
  return {**view, "layers": layers, "final": {}, "head": head}


def center_writers(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  r"""Step 2: centers every stream writer over the stream axis.

  Embedding and position rows :math:`e \leftarrow e - \mathrm{mean}(e)`;
  attention output and MLP down kernels
  :math:`W \leftarrow W - \mathrm{mean}_{out}(W)`, biases
  :math:`b \leftarrow b - \mathrm{mean}(b)`. A pre-norm model whose every
  norm removes the mean computes the same function afterwards.

  Returns:
    ``(params, config)``; the config is unchanged except
    ``zero_mean_writers=False`` (the centering is now in the weights).

  Raises:
    ValueError: for an unsupported config (see `fold_layer_norm_affine`).
  """
  who = "center_writers"
  _check_lm(who, config, ("layernorm", "rmsnorm"))
  view = _split(params, config)
  layers = []
  for n1, attn, n2, mlp in view["layers"]:
    attn = dict(attn)
    attn["out_kernel"] = _center(attn["out_kernel"])
    if attn.get("out_bias") is not None:
      attn["out_bias"] = _center(attn["out_bias"])
    mlp = dict(mlp)
    down = dict(mlp["down"])
    down["kernel"] = _center(down["kernel"])
    if down.get("bias") is not None:
      down["bias"] = _center(down["bias"])
    mlp["down"] = down
    layers.append((n1, attn, n2, mlp))
  view = {
    **view,
    "layers": layers,
    "embed": _center(view["embed"]),
    "pos": None if view["pos"] is None else _center(view["pos"]),
  }
  new_config = dataclasses.replace(config, zero_mean_writers=False)
  return _join(view, new_config), new_config


def to_pre_rmsnorm(
  params: Params, config: models.LMConfig, *, reparameterize: bool = False
) -> tuple[Params, models.LMConfig]:
  """Converts a Pre-LN LM into the equivalent Pre-RMSNorm LM.

  Default (inference form): `fold_layer_norm_affine` then `center_writers`;
  the result has affine-free RMSNorms (same ``eps``) and stores centered
  writers. Needs untied embeddings (`untie_embeddings`).

  ``reparameterize=True`` (training form): the free weights are kept as
  they are, ``zero_mean_writers=True`` centers every writer output in the
  forward pass (the paper's ``DenseZeroMeanOutput``) and each RMSNorm keeps
  the LayerNorm's scale. Its loss is the Pre-LN loss as a function of the
  same parameters, so training it reproduces the Pre-LN run under any
  optimizer. Works with tied embeddings; needs bias-free LayerNorms
  (RMSNorm has no bias), i.e. ``norm_kwargs`` with ``use_bias=False``.

  Returns:
    ``(params, config)`` for ``norm="rmsnorm"``.

  Raises:
    ValueError: for a post-norm (or other non-pre-norm) model, a norm other
      than LayerNorm, an unsupported attention, tied embeddings (inference
      form) or LayerNorm biases (training form).
  """
  who = "to_pre_rmsnorm"
  _check_lm(who, config, ("layernorm",))
  kw = _norm_kwargs(who, config, _LN_KWARGS, _LN_DEFAULTS)
  if reparameterize:
    if kw["use_bias"]:
      raise ValueError(
        f"{who}: reparameterize=True keeps the norm parameters, and "
        f"RMSNorm has no bias; train the Pre-LN model with "
        f"norm_kwargs=(('use_bias', False),) or use the inference form "
        f"(reparameterize=False), got norm_kwargs={config.norm_kwargs}"
      )
    view = _split(params, config)
    view["layers"] = [
      (
        {k: v for k, v in n1.items() if k == "scale"},
        a,
        {k: v for k, v in n2.items() if k == "scale"},
        m,
      )
      for n1, a, n2, m in view["layers"]
    ]
    view["final"] = {k: v for k, v in view["final"].items() if k == "scale"}
    new_config = dataclasses.replace(
      config,
      norm="rmsnorm",
      zero_mean_writers=True,
      norm_kwargs=(
        ("eps", kw["eps"]),
        ("use_scale", kw["use_scale"]),
        ("scale_offset", kw["scale_offset"]),
      ),
    )
    return _join(view, new_config), new_config
  _check_untied(who, config)
  params, config = fold_layer_norm_affine(params, config)
  params, config = center_writers(params, config)
  config = dataclasses.replace(
    config,
    norm="rmsnorm",
    norm_kwargs=(
      ("eps", dict(config.norm_kwargs)["eps"]),
      ("use_scale", False),
    ),
  )
  return _join(_split(params, config), config), config


def _rms_to_affine_free(
  params: Params, config: models.LMConfig, who: str
) -> tuple[Params, models.LMConfig]:
  """A zero-mean Pre-RMSNorm model as affine-free, with centered writers."""
  kw = _norm_kwargs(who, config, _RMS_KWARGS, _RMS_DEFAULTS)
  if not config.zero_mean_writers:
    view = _split(params, config)
    worst = max(
      [
        float(np.max(np.abs(np.mean(np.asarray(w, np.float64), -1))))
        for w in (
          [view["embed"]]
          + ([view["pos"]] if view["pos"] is not None else [])
          + [a["out_kernel"] for _, a, _, _ in view["layers"]]
          + [m["down"]["kernel"] for _, _, _, m in view["layers"]]
        )
      ]
    )
    if worst > 1e-5:
      raise ValueError(
        f"{who}: a Pre-RMSNorm model converts only if its stream has zero "
        f"mean (zero_mean_writers=True, or writers centered as "
        f"to_pre_rmsnorm stores them); the largest writer mean is "
        f"{worst:.3g}"
      )
  _check_untied(who, config)
  view = _split(params, config)
  view["layers"] = [
    (
      {k: v for k, v in n1.items() if k == "scale"},
      a,
      {k: v for k, v in n2.items() if k == "scale"},
      m,
    )
    for n1, a, n2, m in view["layers"]
  ]
  view["final"] = {k: v for k, v in view["final"].items() if k == "scale"}
  folded = _fold_view(
    view, config, {**kw, "use_bias": False}, center_input=False
  )
  cfg = dataclasses.replace(
    config, norm_kwargs=(("eps", kw["eps"]), ("use_scale", False))
  )
  params = _join(folded, cfg)
  return center_writers(params, cfg)


def to_pre_crmsnorm(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  r"""Converts a Pre-LN or zero-mean Pre-RMSNorm LM into Pre-CRMSNorm.

  The zero-mean stream :math:`x \in \mathbb{R}^d` is stored as
  :math:`z = x_{:d-1}`. Writers drop their last output coordinate; readers
  (Q, K, V, MLP up, head) become :math:`W_{:d-1} - W_{d-1}` (the last input
  row subtracted from every other row; biases unchanged); every norm is an
  affine-free `jaxnorm.nn.CRMSNorm` of width ``d-1`` with the source
  ``eps``. The config keeps ``head_dim`` and ``mlp_hidden`` explicit.

  Args:
    params: a Pre-LN tree (converted through `to_pre_rmsnorm` first) or a
      Pre-RMSNorm tree whose stream has zero mean (``zero_mean_writers``
      on, or writers centered as `to_pre_rmsnorm` stores them).
    config: its `LMConfig` (untied embeddings).

  Returns:
    ``(params, config)`` with ``norm="crmsnorm"`` and ``width=d-1``.

  Raises:
    ValueError: for unsupported configs (see `to_pre_rmsnorm`), tied
      embeddings, a model that is already CRMSNorm, or a Pre-RMSNorm model
      whose stream is not zero-mean.
  """
  who = "to_pre_crmsnorm"
  _check_lm(who, config, ("layernorm", "rmsnorm"))
  _check_untied(who, config)
  if config.norm == "layernorm":
    params, config = to_pre_rmsnorm(params, config)
  else:
    params, config = _rms_to_affine_free(params, config, who)
  view = _split(params, config)
  d = config.width
  if d < 2:
    raise ValueError(f"{who}: width must be at least 2, got {d}")

  def reader(tree, names):
    tree = dict(tree)
    for name in names:
      w = tree[name]
      tree[name] = w[: d - 1] - w[d - 1 : d]
    return tree

  layers = []
  for _, attn, _, mlp in view["layers"]:
    attn = reader(attn, ("q_kernel", "k_kernel", "v_kernel"))
    attn["out_kernel"] = attn["out_kernel"][..., : d - 1]
    if attn.get("out_bias") is not None:
      attn["out_bias"] = attn["out_bias"][: d - 1]
    mlp = dict(mlp)
    mlp["up"] = reader(mlp["up"], ("kernel",))
    down = dict(mlp["down"])
    down["kernel"] = down["kernel"][:, : d - 1]
    if down.get("bias") is not None:
      down["bias"] = down["bias"][: d - 1]
    mlp["down"] = down
    layers.append(({}, attn, {}, mlp))
  head_dim, hidden = _dims(config)
  eps = dict(config.norm_kwargs)["eps"]
  new_config = dataclasses.replace(
    config,
    width=d - 1,
    head_dim=head_dim,
    mlp_hidden=hidden,
    norm="crmsnorm",
    norm_kwargs=(("eps", eps), ("use_scale", False)),
  )
  view = {
    **view,
    "layers": layers,
    "final": {},
    "embed": view["embed"][:, : d - 1],
    "pos": None if view["pos"] is None else view["pos"][:, : d - 1],
    "head": reader(view["head"], ("kernel",)),
  }
  return _join(view, new_config), new_config


# ---------------------------------------------------------------------------
# LayerNorm removal.


def fake_layer_norm(
  x: Float[ArrayLike, "... d"],
  scale: Float[ArrayLike, " d"] | None = None,
  bias: Float[ArrayLike, " d"] | None = None,
  *,
  std: Float[ArrayLike, "..."],
) -> Float[Array, "... d"]:
  r"""LayerNorm with a given standard deviation (FakeLN).

  .. math::
    y = \mathrm{scale} \odot \frac{x - \mathrm{mean}_d(x)}{s} + \mathrm{bias}

  The centering is kept (it is linear); ``s = std`` replaces the per-token
  :math:`\sqrt{\mathrm{var}_d(x) + \epsilon}`. With ``std`` equal to that
  value this is `jaxnorm.norms.layer_norm`; with a constant it is linear.

  Args:
    x: input ``(..., d)``, floating.
    scale: gain ``(d,)`` or ``None``.
    bias: offset ``(d,)`` or ``None``.
    std: divisor broadcastable to ``x.shape[:-1]`` (a scalar, a
      per-position ``(T,)`` vector or per-token values).

  Returns:
    Array with the shape and dtype of ``x``; computed in at least float32.

  Raises:
    TypeError: for non-floating ``x``.
    ValueError: for a parameter whose shape is not ``(d,)``, or a ``std``
      that does not broadcast to ``x.shape[:-1]``.

  References:
    Baroni et al., *Transformers Don't Need LayerNorm at Inference Time*,
    arXiv:2507.02559 (2025).
  """
  who = "fake_layer_norm"
  _checks.check_floating(who, "x", x)
  _checks.check_ndim(who, "x", x, minimum=1)
  x = jnp.asarray(x)
  d = x.shape[-1]
  for name, p in (("scale", scale), ("bias", bias)):
    if p is not None:
      _checks.check_floating(who, name, p)
      _checks.check_shape(who, name, p, (d,))
  std = jnp.asarray(std)
  try:
    ok = np.broadcast_shapes(std.shape, x.shape[:-1]) == x.shape[:-1]
  except ValueError:
    ok = False
  if not ok:
    raise ValueError(
      f"{who}: std must broadcast to x.shape[:-1]="
      f"{x.shape[:-1]}, got {std.shape=}"
    )
  cdt = jnp.promote_types(x.dtype, jnp.float32)
  xf = x.astype(cdt)
  xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
  s = jnp.broadcast_to(std.astype(cdt), x.shape[:-1])[..., None]
  y = xc / s
  if scale is not None:
    y = y * jnp.asarray(scale).astype(cdt).reshape((1,) * (x.ndim - 1) + (d,))
  if bias is not None:
    y = y + jnp.asarray(bias).astype(cdt).reshape((1,) * (x.ndim - 1) + (d,))
  return y.astype(x.dtype)


def removal_steps(
  num_layers: int, *, start: int = 20, gap: int = 1
) -> dict[tuple[str, int | None], int]:
  r"""The LayerNorm removal schedule of Baroni et al. (``gpt2_standard``).

  Events fire at the start of the given (0-based) optimizer step, for
  ``n = num_layers`` and layer ``i``:

  =============  ==========================================
  event          step (``gap=1``)
  =============  ==========================================
  ``ln_2`` i     ``start + 2i`` (MLP input)
  ``ln_1qk`` i   ``start + 2n + 2i`` (attention Q/K path)
  ``ln_1v`` i    ``start + 4n + 3i`` (attention V path)
  ``ln_f``       ``start + 7n``
  ``eot_off``    ``start + 7n + 2`` (special EOT std off)
  ``bos_off``    ``start + 7n + 12`` (special position-0 std off)
  =============  ==========================================

  With 12 layers: ``ln_2`` 20-42, ``ln_1qk`` 44-66, ``ln_1v`` 68-101,
  ``ln_f`` 104, EOT 106, BOS 116 (of 300 steps). ``gap`` stretches every
  offset from ``start`` (small models may want more steps per event).

  Args:
    num_layers: number of Transformer layers ``n``.
    start: steps of fine-tuning with every norm real.
    gap: integer multiplier of all offsets after ``start``.

  Returns:
    ``{(event, layer): step}`` with ``layer=None`` for ``ln_f``, ``eot_off``
    and ``bos_off``.

  Raises:
    ValueError: for a non-positive ``num_layers`` or ``gap``, or a negative
      ``start``.
  """
  who = "removal_steps"
  _checks.check_positive_int(who, "num_layers", num_layers)
  _checks.check_positive_int(who, "gap", gap)
  if isinstance(start, bool) or not isinstance(start, int) or start < 0:
    raise ValueError(
      f"{who}: start must be a non-negative integer, got {start=}"
    )
  n = num_layers
  out: dict[tuple[str, int | None], int] = {}
  for i in range(n):
    out[("ln_2", i)] = start + gap * 2 * i
    out[("ln_1qk", i)] = start + gap * (2 * n + 2 * i)
    out[("ln_1v", i)] = start + gap * (4 * n + 3 * i)
  out[("ln_f", None)] = start + gap * 7 * n
  out[("eot_off", None)] = start + gap * (7 * n + 2)
  out[("bos_off", None)] = start + gap * (7 * n + 12)
  return out


def removal_events(
  step: int, num_layers: int, *, start: int = 20, gap: int = 1
) -> frozenset[tuple[str, int | None]]:
  """The events of `removal_steps` that fire at the start of ``step``."""
  return frozenset(
    k
    for k, v in removal_steps(num_layers, start=start, gap=gap).items()
    if v == step
  )


_FAKE_KEYS = ("std", "bos_std", "count", "step", "remove_at", "bos_off_at")


def remove_fake_ln(
  params: Params, config: models.LMConfig
) -> tuple[Params, models.LMConfig]:
  r"""Exports a fine-tuned FakeLN model to a model without any norm.

  Every norm must be fake (its frozen ``std`` in use) with the special
  position-0 std switched off. Each ``y = c(x) \odot (scale/std) + bias``
  is folded into its readers ``(W, b)``:
  :math:`W \leftarrow (I - \tfrac{1}{d}\mathbf{1}\mathbf{1}^\top)
  \,\mathrm{diag}(\mathrm{scale}/s)\,W`, :math:`b \leftarrow b +
  \mathrm{bias}\,W`, so the stream is never normalized or centered.

  Args:
    params: `lm_params` of a `DecoderLM` whose norms were replaced by
      `jaxnorm.nn.fakeln.FakeLayerNorm` (`jaxnorm.nn.fakeln.install_fake_ln`)
      after fine-tuning past the removal schedule.
    config: the model's `LMConfig` (``norm="layernorm"``, pre-norm).

  Returns:
    ``(params, config)`` with ``norm="none"``, untied embeddings and
    ``use_bias`` on when a norm had a bias.

  Raises:
    ValueError: for an unsupported config, a tree without FakeLN state, or
      a norm that is still real or still uses its position-0 std.
  """
  who = "remove_fake_ln"
  _check_lm(who, config, ("layernorm",))
  kw = _norm_kwargs(who, config, _LN_KWARGS, _LN_DEFAULTS)
  params, config = untie_embeddings(params, config)
  view = _split(params, config)
  named = {("final_norm",): view["final"]}
  for i, (n1, _, n2, _) in enumerate(view["layers"]):
    named[("steps", 2 * i)] = n1
    named[("steps", 2 * i + 1)] = n2
  std = {}
  for key, norm in named.items():
    where = ".".join(map(str, key))
    missing = [k for k in _FAKE_KEYS if k not in norm]
    if missing:
      raise ValueError(
        f"{who}: the norm at {where} has no FakeLN state "
        f"{missing}; install jaxnorm.nn.fakeln.install_fake_ln "
        f"and fine-tune first"
      )
    step, remove_at = int(norm["step"]), int(norm["remove_at"])
    if step < remove_at or int(norm["count"]) == 0:
      raise ValueError(
        f"{who}: the norm at {where} is still a real "
        f"LayerNorm (step {step} < remove_at {remove_at}); "
        f"fine-tune past the removal schedule first"
      )
    if step < int(norm["bos_off_at"]):
      raise ValueError(
        f"{who}: the norm at {where} still uses its "
        f"position-0 std (step {step} < bos_off_at "
        f"{int(norm['bos_off_at'])}); fine-tune past it first"
      )
    std[key] = norm["std"]
  use_bias = config.use_bias or bool(kw["use_bias"])
  new_config = dataclasses.replace(
    config, norm="none", norm_kwargs=(), use_bias=use_bias
  )
  if use_bias:
    view = _with_biases(view, new_config)
  folded = _fold_view(view, config, kw, center_input=True, std=std)
  return _join(folded, new_config), new_config
