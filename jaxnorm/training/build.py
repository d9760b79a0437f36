"""From a `TrainConfig` to a model: the runner's side of the model layer.

The model layer knows its models (`jaxnorm.nn.model_registry.MODELS`:
config, module, data kind, the parts each builds) and nothing of the
runner; this module maps the runner's flat `TrainConfig` onto a model's
config, fills in what the data decides (vocabulary, image shape, classes,
encoding size), stores parameters in ``param_dtype`` and summarizes the
result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnorm.nn import model_registry
from jaxnorm.training import config as config_lib
from jaxnorm.training import optimizers


def registries(
  model: str = "lm", *, allow_batch_stats: bool = False
) -> dict[str, tuple[str, ...]]:
  """Valid names for each named model part and the optimizer.

  The model's names (`jaxnorm.nn.model_registry.registries`) and the
  names its spec's ``counterparts`` map onto them (``rmsnorm`` for the
  complex LM's ``complexrmsnorm``), so the runner's defaults build every
  model.

  Args:
    model: a model name of `config.MODELS`.
    allow_batch_stats: admit batch-statistics norms in causal models.
  """
  names = model_registry.registries(model, allow_batch_stats=allow_batch_stats)
  for field, aliases in model_registry.spec(model).counterparts.items():
    names[field] = tuple(sorted({*names[field], *aliases}))
  return {**names, "optimizer": tuple(sorted(optimizers.OPTIMIZERS))}


def registries_for(cfg: config_lib.TrainConfig) -> dict[str, tuple[str, ...]]:
  """`registries` for the model and opt-ins of ``cfg``.

  Raises:
    ValueError: for an unknown model (`config.check_model`).
  """
  config_lib.check_model(cfg)
  return registries(cfg.model, allow_batch_stats=cfg.allow_batch_stats)


def model_config(cfg: config_lib.TrainConfig, data: dict[str, Any]) -> Any:
  """The model layer's config for ``cfg``.

  Run fields whose names are fields of the model's config carry over (a
  part name through the spec's ``counterparts``); the spec's ``derive``
  adds what the data decides.

  Args:
    cfg: the run configuration.
    data: what the data decides: ``vocab_size`` and ``max_len`` for the
      text models, ``num_classes`` and ``image_shape`` for the image
      models, ``num_classes``, ``vocab_size`` and ``pe_dim`` for the graph
      model.

  Returns:
    The ``config`` of the model's `jaxnorm.nn.registry.ModelSpec`.

  Raises:
    ValueError: if ``norm_kwargs`` / ``attention_kwargs`` /
      ``allow_batch_stats`` are given for a model whose config does not
      take them.
  """
  cfg = config_lib.resolve(cfg)
  spec = model_registry.spec(cfg.model)
  kind = spec.config
  accepted = {f.name for f in dataclasses.fields(kind)}
  for field in ("norm_kwargs", "attention_kwargs", "allow_batch_stats"):
    if getattr(cfg, field) and field not in accepted:
      raise ValueError(
        f"build: --{field.replace('_', '-')} is not supported by the "
        f"{cfg.model!r} model ({kind.__name__} has no {field} field)"
      )
  shared = dataclasses.asdict(cfg)
  values = {k: v for k, v in shared.items() if k in accepted}
  for field, aliases in spec.counterparts.items():
    if field in values:
      values[field] = aliases.get(values[field], values[field])
  return kind(**{**values, **spec.derive(shared, data)})


def build_model(
  cfg: config_lib.TrainConfig, data: dict[str, Any], *, rngs: nnx.Rngs
) -> nnx.Module:
  """Builds the model ``cfg`` names, parameters stored in ``param_dtype``.

  Modules cast parameters to the compute dtype at use, so parameters built
  in float32 are converted to ``cfg.param_dtype`` after construction;
  statistics and other state keep their dtype.
  """
  model = model_registry.spec(cfg.model).module(
    model_config(cfg, data), dtype=jnp.dtype(cfg.dtype), rngs=rngs
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
