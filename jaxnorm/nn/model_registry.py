"""The model registry: every model as a `registry.ModelSpec`.

`MODELS` is what the runner (``--model``), the part lists (`registries`)
and the registry-driven tests read: a model's config and module, the data
it takes, which part fields it builds by name, its positional encodings,
and the fields that follow from the data. A new model is one entry here
(and its name in `ModelName`).

Examples:
  >>> MODEL_NAMES
  ('lm', 'vit', 'cnn', 'mlp', 'graph', 'clm', 'cvcnn')
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Literal

from jaxnorm import cplx
from jaxnorm.nn import _common, models, registry
from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import cplx as nn_cplx
from jaxnorm.nn import graph as nn_graph
from jaxnorm.nn import norms as nn_norms
from jaxnorm.nn import residual as nn_residual

ModelName = Literal["lm", "vit", "cnn", "mlp", "graph", "clm", "cvcnn"]


def _text(shared: Mapping[str, Any], data: Mapping[str, Any]) -> dict:
  """Vocabulary and longest sequence, from the text data."""
  del shared
  return {"vocab_size": data["vocab_size"], "max_len": data["max_len"]}


def _images(shared: Mapping[str, Any], data: Mapping[str, Any]) -> dict:
  """Classes and image shape, from the image data."""
  del shared
  shape = tuple(int(s) for s in data["image_shape"])
  return {"num_classes": data["num_classes"], "image_shape": shape}


def _vit(shared: Mapping[str, Any], data: Mapping[str, Any]) -> dict:
  """Image fields; 4x4 patches from 16 pixels a side, else 2x2."""
  fields = _images(shared, data)
  fields["patch_size"] = 4 if min(fields["image_shape"][:2]) >= 16 else 2
  return fields


def _graph(shared: Mapping[str, Any], data: Mapping[str, Any]) -> dict:
  """Classes, node vocabulary, encoding size; ``pe``: the run's encoding."""
  return {
    "num_classes": data["num_classes"],
    "vocab_size": data["vocab_size"],
    "pe_dim": data["pe_dim"],
    "pe": shared["positional"],
  }


def _cvcnn(shared: Mapping[str, Any], data: Mapping[str, Any]) -> dict:
  """Image fields; ``depth`` stride-2 stages doubling up to ``width``."""
  depth, width = shared["depth"], shared["width"]
  return {
    **_images(shared, data),
    "widths": tuple(max(width >> (depth - 1 - i), 1) for i in range(depth)),
  }


def _proxy(mapping: Mapping) -> types.MappingProxyType:
  return types.MappingProxyType(
    {k: types.MappingProxyType(dict(v)) for k, v in mapping.items()}
  )


_ALL_PARTS = frozenset(registry.PART_FIELDS)

MODELS: Mapping[str, registry.ModelSpec] = types.MappingProxyType(
  {
    "lm": registry.ModelSpec(
      models.LMConfig,
      models.DecoderLM,
      "Radford et al., GPT-2 (2019): decoder-only transformer",
      "text",
      parts=_ALL_PARTS,
      heads=True,
      positional=("learned", "rope", "none"),
      derive=_text,
    ),
    "vit": registry.ModelSpec(
      models.ViTConfig,
      models.ViT,
      "Dosovitskiy et al., arXiv:2010.11929",
      "images",
      parts=_ALL_PARTS,
      heads=True,
      derive=_vit,
    ),
    "cnn": registry.ModelSpec(
      models.CNNConfig,
      models.CNN,
      "He et al., arXiv:1603.05027 (pre-activation ResNet)",
      "images",
      parts=frozenset({"norm", "residual", "activation"}),
      derive=_images,
    ),
    "mlp": registry.ModelSpec(
      models.SNNConfig,
      models.SNN,
      "Klambauer et al., arXiv:1706.02515",
      "images",
      parts=frozenset({"activation"}),
      derive=_images,
    ),
    "graph": registry.ModelSpec(
      nn_graph.GraphTransformerConfig,
      nn_graph.GraphTransformer,
      "Dwivedi & Bresson, arXiv:2012.09699",
      "graphs",
      parts=frozenset({"norm"}),
      heads=True,
      positional=nn_graph.POSITIONAL,
      norms=nn_graph.graph_norms,
      derive=_graph,
    ),
    "clm": registry.ModelSpec(
      nn_cplx.ComplexLMConfig,
      nn_cplx.ComplexLM,
      "Crasmaru, CNet; Hioki, arXiv:2605.10123 (PCT)",
      "text",
      parts=frozenset({"norm", "attention", "activation"}),
      heads=True,
      mixers=(nn_cplx.FOURIER,),
      activations=("modrelu", "split_gelu"),
      counterparts=_proxy(
        {
          "norm": {
            "rmsnorm": "complexrmsnorm",
            "layernorm": "complexlayernorm",
          },
          "attention": {"softmax": "complex_softmax"},
          "activation": {"gelu": "split_gelu"},
        }
      ),
      derive=_text,
    ),
    "cvcnn": registry.ModelSpec(
      nn_cplx.CVCNNConfig,
      nn_cplx.CVCNN,
      "Trabelsi et al., arXiv:1705.09792 (complex convolutions)",
      "images",
      parts=frozenset({"activation"}),
      activations=tuple(sorted(cplx.ACTIVATIONS)),
      counterparts=_proxy(
        {"activation": {"gelu": "split_gelu", "relu": "crelu"}}
      ),
      derive=_cvcnn,
      layout="images",
      dtype_kind="complex",
    ),
  }
)
"""Model name -> `registry.ModelSpec`."""

MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


def spec(name: str) -> registry.ModelSpec:
  """The spec of model ``name``; an unknown name lists the valid ones.

  Examples:
    >>> lm = spec("lm")
    >>> lm.config.__name__, lm.data, lm.layout, lm.causal, lm.positional
    ('LMConfig', 'text', 'tokens', True, ('learned', 'rope', 'none'))
    >>> lm.derive({}, {"vocab_size": 256, "max_len": 64})
    {'vocab_size': 256, 'max_len': 64}
  """
  if name not in MODELS:
    raise ValueError(
      f"model_registry: unknown model {name!r}; valid names are "
      f"{', '.join(MODEL_NAMES)}"
    )
  return MODELS[name]


def registries(
  model: str = "lm", *, allow_batch_stats: bool = False
) -> dict[str, tuple[str, ...]]:
  """Valid names per part field of ``model``, from the specs.

  A model builds only the part fields of its spec's ``parts``: their names
  follow from the parts' capabilities (the model's layout, causality and
  dtype kind; batch-statistics norms in a causal model only with
  ``allow_batch_stats``). A part field it does not build accepts every
  registered name (the CNN's attention): the model ignores it. A spec's
  ``counterparts`` are not listed (they stand for listed names).

  Args:
    model: a name of `MODELS`.
    allow_batch_stats: the causal models' opt-in for batch-statistics norms.

  Returns:
    ``{"norm", "attention", "residual", "activation"} -> sorted names``.

  Examples:
    >>> sorted(registries("cnn"))
    ['activation', 'attention', 'norm', 'residual']
    >>> "batchnorm" in registries("cnn")["norm"]
    True
    >>> "batchnorm" in registries("lm")["norm"]  # causal: opt-in only
    False
    >>> "batchnorm" in registries("lm", allow_batch_stats=True)["norm"]
    True
  """
  s = spec(model)
  names = {
    "norm": tuple(sorted(nn_norms.NORMS)),
    "attention": tuple(sorted(nn_attention.ATTENTIONS)),
    "residual": tuple(sorted(nn_residual.RESIDUALS)),
    "activation": tuple(sorted(models.ACTIVATIONS)),
  }
  if "norm" in s.parts:
    names["norm"] = (
      s.norms()
      if s.norms is not None
      else _common.valid_norms(
        s.layout, s.causal, allow_batch_stats, dtype_kind=s.dtype_kind
      )
    )
  if "attention" in s.parts:
    found = _common.valid_attentions(
      s.layout, s.causal, dtype_kind=s.dtype_kind
    )
    names["attention"] = tuple(sorted((*found, *s.mixers)))
  if s.activations is not None:
    names["activation"] = s.activations
  return names
