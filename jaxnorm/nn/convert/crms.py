"""Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm, exactly (Jiang et al. 2023).

Three steps on the parameter tree of a `jaxnorm.nn.models.DecoderLM` that
each preserve the function (``../shared/specs/norms.md`` section 2):

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

Conventions left open by the paper and chosen here:

* When a LayerNorm has a bias but the model has no linear biases, the
  converted config turns ``use_bias`` on (biases that nothing produced are
  zeros): folding ``bias W`` needs a bias on every reader.
* The conversions use the source model's ``eps`` unchanged.

Examples:
  >>> from jaxnorm.nn.models import LMConfig
  >>> to_pre_crmsnorm({}, LMConfig(norm="layernorm"))  # tied by default
  Traceback (most recent call last):
  ValueError: to_pre_crmsnorm: the model ties its head to the embedding; ...

References:
  Jiang, Gu, Zhu & Pan, *Pre-RMSNorm and Pre-CRMSNorm Transformers:
  Equivalent and Efficient Pre-LN Transformers*, NeurIPS 2023,
  arXiv:2305.14858.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxnorm.nn import models
from jaxnorm.nn.convert import _tree


def fold_layer_norm_affine(
  params: _tree.Params, config: models.LMConfig
) -> tuple[_tree.Params, models.LMConfig]:
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

  Examples:
    A Pre-LN model with untied embeddings:

    >>> from flax import nnx
    >>> from jaxnorm.nn.convert import lm_params, load_lm
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))

    Folded, its LayerNorms are affine-free and its logits unchanged:

    >>> params, config = fold_layer_norm_affine(lm_params(model), model.config)
    >>> dict(config.norm_kwargs), config.use_bias
    ({'eps': 1e-06, 'use_scale': False, 'use_bias': False}, True)
    >>> tokens = np.array([[1, 2, 3]], np.int32)
    >>> y = load_lm(config, params)(tokens)
    >>> bool(np.allclose(y, model(tokens), atol=1e-5))
    True
  """
  who = "fold_layer_norm_affine"
  _tree.check_lm(who, config, ("layernorm",))
  _tree.check_untied(who, config)
  kw = _tree.norm_kwargs(who, config, _tree.LN_KWARGS, _tree.LN_DEFAULTS)
  view = _tree.split(params, config)
  use_bias = config.use_bias or bool(kw["use_bias"])
  new_config = dataclasses.replace(
    config,
    use_bias=use_bias,
    norm_kwargs=(("eps", kw["eps"]), ("use_scale", False), ("use_bias", False)),
  )
  if use_bias:
    view = _tree.with_biases(view, new_config)
  return _tree.join(
    _tree.fold_view(view, config, kw, center_input=False), new_config
  ), new_config


def center_writers(
  params: _tree.Params, config: models.LMConfig
) -> tuple[_tree.Params, models.LMConfig]:
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

  Examples:
    A Pre-LN model with untied embeddings:

    >>> from flax import nnx
    >>> from jaxnorm.nn.convert import lm_params, load_lm
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))

    Its writers, centered, write a zero-mean stream; the logits stay:

    >>> params, config = center_writers(lm_params(model), model.config)
    >>> bool(np.allclose(np.mean(params["embed"], axis=-1), 0.0, atol=1e-6))
    True
    >>> tokens = np.array([[1, 2, 3]], np.int32)
    >>> y = load_lm(config, params)(tokens)
    >>> bool(np.allclose(y, model(tokens), atol=1e-5))
    True
  """
  who = "center_writers"
  _tree.check_lm(who, config, ("layernorm", "rmsnorm"))
  view = _tree.split(params, config)
  layers = []
  for n1, attn, n2, mlp in view["layers"]:
    attn = dict(attn)
    attn["out_kernel"] = _tree.center(attn["out_kernel"])
    if attn.get("out_bias") is not None:
      attn["out_bias"] = _tree.center(attn["out_bias"])
    mlp = dict(mlp)
    down = dict(mlp["down"])
    down["kernel"] = _tree.center(down["kernel"])
    if down.get("bias") is not None:
      down["bias"] = _tree.center(down["bias"])
    mlp["down"] = down
    layers.append((n1, attn, n2, mlp))
  view = {
    **view,
    "layers": layers,
    "embed": _tree.center(view["embed"]),
    "pos": None if view["pos"] is None else _tree.center(view["pos"]),
  }
  new_config = dataclasses.replace(config, zero_mean_writers=False)
  return _tree.join(view, new_config), new_config


def to_pre_rmsnorm(
  params: _tree.Params, config: models.LMConfig, *, reparameterize: bool = False
) -> tuple[_tree.Params, models.LMConfig]:
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

  Examples:
    A Pre-LN model with untied embeddings:

    >>> from flax import nnx
    >>> from jaxnorm.nn.convert import lm_params, load_lm
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))

    The equivalent Pre-RMSNorm model computes the same logits:

    >>> params, config = to_pre_rmsnorm(lm_params(model), model.config)
    >>> config.norm, dict(config.norm_kwargs)
    ('rmsnorm', {'eps': 1e-06, 'use_scale': False})
    >>> tokens = np.array([[1, 2, 3]], np.int32)
    >>> y = load_lm(config, params)(tokens)
    >>> bool(np.allclose(y, model(tokens), atol=1e-5))
    True
  """
  who = "to_pre_rmsnorm"
  _tree.check_lm(who, config, ("layernorm",))
  kw = _tree.norm_kwargs(who, config, _tree.LN_KWARGS, _tree.LN_DEFAULTS)
  if reparameterize:
    if kw["use_bias"]:
      raise ValueError(
        f"{who}: reparameterize=True keeps the norm parameters, and "
        f"RMSNorm has no bias; train the Pre-LN model with "
        f"norm_kwargs=(('use_bias', False),) or use the inference form "
        f"(reparameterize=False), got norm_kwargs={config.norm_kwargs}"
      )
    view = _tree.split(params, config)
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
    return _tree.join(view, new_config), new_config
  _tree.check_untied(who, config)
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
  return _tree.join(_tree.split(params, config), config), config


def _rms_to_affine_free(
  params: _tree.Params, config: models.LMConfig, who: str
) -> tuple[_tree.Params, models.LMConfig]:
  """A zero-mean Pre-RMSNorm model as affine-free, with centered writers."""
  kw = _tree.norm_kwargs(who, config, _tree.RMS_KWARGS, _tree.RMS_DEFAULTS)
  if not config.zero_mean_writers:
    view = _tree.split(params, config)
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
  _tree.check_untied(who, config)
  view = _tree.split(params, config)
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
  folded = _tree.fold_view(
    view, config, {**kw, "use_bias": False}, center_input=False
  )
  cfg = dataclasses.replace(
    config, norm_kwargs=(("eps", kw["eps"]), ("use_scale", False))
  )
  params = _tree.join(folded, cfg)
  return center_writers(params, cfg)


def to_pre_crmsnorm(
  params: _tree.Params, config: models.LMConfig
) -> tuple[_tree.Params, models.LMConfig]:
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

  Examples:
    A Pre-LN model with untied embeddings:

    >>> from flax import nnx
    >>> from jaxnorm.nn.convert import lm_params, load_lm
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))

    The Pre-CRMSNorm model has a ``d - 1`` stream and the same logits:

    >>> params, config = to_pre_crmsnorm(lm_params(model), model.config)
    >>> config.norm, config.width, params["embed"].shape
    ('crmsnorm', 7, (16, 7))
    >>> tokens = np.array([[1, 2, 3]], np.int32)
    >>> y = load_lm(config, params)(tokens)
    >>> bool(np.allclose(y, model(tokens), atol=1e-5))
    True
  """
  who = "to_pre_crmsnorm"
  _tree.check_lm(who, config, ("layernorm", "rmsnorm"))
  _tree.check_untied(who, config)
  if config.norm == "layernorm":
    params, config = to_pre_rmsnorm(params, config)
  else:
    params, config = _rms_to_affine_free(params, config, who)
  view = _tree.split(params, config)
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
  head_dim, hidden = _tree.dims(config)
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
  return _tree.join(view, new_config), new_config
