"""From a `TrainConfig` to a model: the runner's side of the model layer.

The model layer (`jaxnorm.nn.models`, `jaxnorm.nn.graph`) knows its own
configs (`LMConfig`, `ViTConfig`, `CNNConfig`, `SNNConfig`,
`GraphTransformerConfig`) and nothing of the runner; this module
maps the runner's flat `TrainConfig` onto them, fills in what the data
decides (vocabulary, image shape, classes, encoding size), stores
parameters in
``param_dtype`` and summarizes the result.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm import cplx
from jaxnorm.nn import cplx as nn_cplx
from jaxnorm.nn import graph as nn_graph
from jaxnorm.nn import models
from jaxnorm.training import config as config_lib
from jaxnorm.training import optimizers

COMPLEX_PARTS: types.MappingProxyType = types.MappingProxyType(
  {
    "clm": {
      "norm": (
        "norm",
        {
          "rmsnorm": "rms",
          "complexrmsnorm": "rms",
          "layernorm": "layer",
          "complexlayernorm": "layer",
        },
      ),
      "attention": ("mixer", {m: m for m in nn_cplx.MIXERS}),
      "activation": (
        "activation",
        {
          "gelu": "split_gelu",
          "split_gelu": "split_gelu",
          "modrelu": "modrelu",
        },
      ),
    },
    "cvcnn": {
      "activation": (
        "activation",
        {
          "gelu": "split_gelu",
          "relu": "crelu",
          **{a: a for a in cplx.ACTIVATIONS},
        },
      ),
    },
  }
)
"""The complex models' choices: runner field -> (config field, runner name
-> value). A real name stands for its complex counterpart (GELU or ReLU on
Re and Im; RMS or layer norm per token), so the runner's defaults build
each model; `ComplexLM`'s attention names are its mixers. A field not
listed is not a choice of the model (the CV-CNN's complex batch norm, the
residual wiring): every name is accepted and ignored."""


def registries(
  model: str = "lm", *, allow_batch_stats: bool = False
) -> dict[str, tuple[str, ...]]:
  """Valid names for each named model part and the optimizer.

  The graph model takes the norms of `jaxnorm.nn.graph.graph_norms` and
  ignores the attention, residual and activation names.

  Args:
    model: a model name of `config.MODELS`.
    allow_batch_stats: admit batch-statistics norms in causal models.
  """
  names = models.registries(model, allow_batch_stats=allow_batch_stats)
  if model == "graph":
    names["norm"] = nn_graph.graph_norms()
  for field, (_, values) in COMPLEX_PARTS.get(model, {}).items():
    names[field] = tuple(sorted(values))
  return {**names, "optimizer": tuple(sorted(optimizers.OPTIMIZERS))}


def registries_for(cfg: config_lib.TrainConfig) -> dict[str, tuple[str, ...]]:
  """`registries` for the model and opt-ins of ``cfg``."""
  return registries(cfg.model, allow_batch_stats=cfg.allow_batch_stats)


def _image_fields(data: dict[str, Any]) -> dict[str, Any]:
  shape = tuple(int(s) for s in data["image_shape"])
  return {"num_classes": data["num_classes"], "image_shape": shape}


def _graph_fields(
  cfg: config_lib.TrainConfig, data: dict[str, Any]
) -> tuple[type, dict[str, Any]]:
  """`GraphTransformerConfig` and its fields beyond the shared parts."""
  return nn_graph.GraphTransformerConfig, {
    "num_classes": data["num_classes"],
    "vocab_size": data["vocab_size"],
    "pe": cfg.positional,
    "pe_dim": data["pe_dim"],
    "graph": cfg.graph,
    "edge_features": cfg.edge_features,
    "logit_clip": cfg.logit_clip,
  }


def model_config(cfg: config_lib.TrainConfig, data: dict[str, Any]) -> Any:
  """The model layer's config for ``cfg``.

  Args:
    cfg: the run configuration.
    data: what the data decides: ``vocab_size`` and ``max_len`` for the LM,
      ``num_classes`` and ``image_shape`` for the image models,
      ``num_classes``, ``vocab_size`` and ``pe_dim`` for the graph model.

  Returns:
    An `LMConfig`, `ViTConfig`, `CNNConfig`, `SNNConfig` or
    `GraphTransformerConfig`.

  Raises:
    ValueError: if ``norm_kwargs`` / ``attention_kwargs`` are given for a
      model whose config does not take them.
  """
  cfg = config_lib.resolve(cfg)
  parts = {
    "width": cfg.width,
    "depth": cfg.depth,
    "num_heads": cfg.num_heads,
    "norm": cfg.norm,
    "attention": cfg.attention,
    "residual": cfg.residual,
    "activation": cfg.activation,
    "positional": cfg.positional,
    "norm_kwargs": cfg.norm_kwargs,
    "attention_kwargs": cfg.attention_kwargs,
    "allow_batch_stats": cfg.allow_batch_stats,
  }
  if cfg.model == "lm":
    kind, extra = (
      models.LMConfig,
      {
        "vocab_size": data["vocab_size"],
        "max_len": data["max_len"],
      },
    )
  elif cfg.model == "vit":
    extra = _image_fields(data)
    kind = models.ViTConfig
    extra["patch_size"] = 4 if min(extra["image_shape"][:2]) >= 16 else 2
  elif cfg.model == "cnn":
    kind, extra = models.CNNConfig, _image_fields(data)
  elif cfg.model == "graph":
    kind, extra = _graph_fields(cfg, data)
  elif cfg.model == "clm":
    kind = nn_cplx.ComplexLMConfig
    extra = {"vocab_size": data["vocab_size"], "max_len": data["max_len"]}
  elif cfg.model == "cvcnn":
    kind, extra = nn_cplx.CVCNNConfig, _image_fields(data)
    # Stride-2 stages doubling up to ``width``.
    extra["widths"] = tuple(
      max(cfg.width >> (cfg.depth - 1 - i), 1) for i in range(cfg.depth)
    )
  else:
    kind, extra = models.SNNConfig, _image_fields(data)
  accepted = {f.name for f in dataclasses.fields(kind)}
  for field in ("norm_kwargs", "attention_kwargs", "allow_batch_stats"):
    if getattr(cfg, field) and field not in accepted:
      raise ValueError(
        f"build: --{field.replace('_', '-')} is not supported by the "
        f"{cfg.model!r} model ({kind.__name__} has no {field} field)"
      )
  values = {k: v for k, v in parts.items() if k in accepted}
  for field, (name, choices) in COMPLEX_PARTS.get(cfg.model, {}).items():
    values.pop(field, None)
    extra[name] = choices[getattr(cfg, field)]
  return kind(**values, **extra)


_MODELS = {
  models.LMConfig: models.DecoderLM,
  models.ViTConfig: models.ViT,
  models.CNNConfig: models.CNN,
  models.SNNConfig: models.SNN,
  nn_graph.GraphTransformerConfig: nn_graph.GraphTransformer,
  nn_cplx.ComplexLMConfig: nn_cplx.ComplexLM,
  nn_cplx.CVCNNConfig: nn_cplx.CVCNN,
}


def build_model(
  cfg: config_lib.TrainConfig, data: dict[str, Any], *, rngs: nnx.Rngs
) -> nnx.Module:
  """Builds the model ``cfg`` names, parameters stored in ``param_dtype``.

  Modules cast parameters to the compute dtype at use, so parameters built
  in float32 are converted to ``cfg.param_dtype`` after construction;
  statistics and other state keep their dtype.
  """
  model_cfg = model_config(cfg, data)
  model = _MODELS[type(model_cfg)](
    model_cfg, dtype=jnp.dtype(cfg.dtype), rngs=rngs
  )
  param_dtype = jnp.dtype(cfg.param_dtype)
  if param_dtype != jnp.float32:
    params = nnx.state(model, nnx.Param)
    nnx.update(
      model,
      jax.tree.map(
        lambda p: (
          p.astype(param_dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p
        ),
        params,
      ),
    )
  return model


def parameter_counts(model: nnx.Module) -> dict[str, int]:
  """Parameter count per top-level attribute of ``model`` (any model)."""
  counts: dict[str, int] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(
    nnx.state(model, nnx.Param)
  ):
    top = str(getattr(path[0], "key", path[0]))
    counts[top] = counts.get(top, 0) + int(np.prod(leaf.shape))
  return counts


def summary_lines(model: nnx.Module) -> list[str]:
  """A start-up table of parameters per top-level module, then the total."""
  counts = parameter_counts(model)
  width = max([len(k) for k in counts] + [5])
  lines = [f"{name:<{width}}  {n:>12,}" for name, n in counts.items()]
  lines.append(f"{'total':<{width}}  {sum(counts.values()):>12,}")
  return [f"{type(model).__name__} parameters:"] + lines
