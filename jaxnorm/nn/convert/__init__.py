"""Exact weight conversions of the decoder LM, and LayerNorm removal.

Pure functions on the parameter tree of a `jaxnorm.nn.models.DecoderLM`
(the nested dict ``nnx.to_pure_dict(nnx.state(model))``, see `lm_params`)
and its `LMConfig`. Each returns a new ``(params, config)`` pair that
`load_lm` (or ``DecoderLM(config)`` plus ``nnx.update``) loads as is. They
work on `jax.Array` and NumPy leaves alike and keep the leaves' namespace
and dtype, so a NumPy float64 tree converts in float64.

Files, one per paper plus the shared tree:

* `_tree`: `lm_params`, `load_lm`, `untie_embeddings`, the checks, the
  canonical per-layer view and the folding of a norm into its readers;
* `crms`: Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm (Jiang et al. 2023):
  `fold_layer_norm_affine`, `center_writers`, `to_pre_rmsnorm`,
  `to_pre_crmsnorm`;
* `fakeln`: LayerNorm removal (Baroni et al. 2025): `remove_fake_ln`
  exports a fine-tuned FakeLN model (`jaxnorm.nn.fakeln`) to a model with
  no norm at all (``norm="none"``). FakeLN's maths and schedule,
  `fake_layer_norm`, `removal_steps` and `removal_events`, are
  `jaxnorm.norms.fakeln`, re-exported here.

This package re-exports every public name.

Examples:
  >>> SUPPORTED_ATTENTIONS  # the cores whose only stream readers are q, k, v
  ('softmax', 'off_by_one', 'sink')

References:
  Jiang, Gu, Zhu & Pan, *Pre-RMSNorm and Pre-CRMSNorm Transformers:
  Equivalent and Efficient Pre-LN Transformers*, NeurIPS 2023,
  arXiv:2305.14858.
  Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers Don't
  Need LayerNorm at Inference Time: Scaling LayerNorm Removal to GPT-2 XL
  and the Implications for Mechanistic Interpretability*, arXiv:2507.02559
  (2025).
"""

from jaxnorm.nn.convert._tree import (
  SUPPORTED_ATTENTIONS,
  Params,
  lm_params,
  load_lm,
  untie_embeddings,
)
from jaxnorm.nn.convert.crms import (
  center_writers,
  fold_layer_norm_affine,
  to_pre_crmsnorm,
  to_pre_rmsnorm,
)
from jaxnorm.nn.convert.fakeln import remove_fake_ln
from jaxnorm.norms.fakeln import (
  fake_layer_norm,
  removal_events,
  removal_steps,
)

__all__ = [
  "SUPPORTED_ATTENTIONS",
  "Params",
  "center_writers",
  "fake_layer_norm",
  "fold_layer_norm_affine",
  "lm_params",
  "load_lm",
  "removal_events",
  "removal_steps",
  "remove_fake_ln",
  "to_pre_crmsnorm",
  "to_pre_rmsnorm",
  "untie_embeddings",
]
