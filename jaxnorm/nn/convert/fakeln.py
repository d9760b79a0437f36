"""Export of a fine-tuned FakeLN model without any norm (Baroni et al. 2025).

LayerNorm removal by fine-tuning (spec ``norms.md`` section 10): the maths
of FakeLN and its schedule are `jaxnorm.norms.fakeln`, its module and its
installation into a decoder LM `jaxnorm.nn.fakeln`. After the schedule,
every norm divides by a frozen constant, so `remove_fake_ln` folds
``1/std``, the centering and the affine into the readers and returns a
model with ``norm="none"``.

Examples:
  >>> fakeln.FakeLNState._fields  # the state every norm's params must hold
  ('std', 'bos_std', 'count', 'step', 'remove_at', 'bos_off_at')

References:
  Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers Don't
  Need LayerNorm at Inference Time: Scaling LayerNorm Removal to GPT-2 XL
  and the Implications for Mechanistic Interpretability*, arXiv:2507.02559
  (2025).
"""

from __future__ import annotations

import dataclasses

from jaxnorm.nn import models
from jaxnorm.nn.convert import _tree
from jaxnorm.norms import fakeln


def remove_fake_ln(
  params: _tree.Params, config: models.LMConfig
) -> tuple[_tree.Params, models.LMConfig]:
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

  Examples:
    A Pre-LN model with FakeLN installed:

    >>> from flax import nnx
    >>> from jaxnorm.nn.fakeln import install_fake_ln
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))
    >>> schedule = install_fake_ln(model, start=0)

    Training calls (here without updates, as a stand-in for fine-tuning)
    run the schedule; then the norms fold away:

    >>> import jax.numpy as jnp
    >>> tokens = jnp.array([[1, 2, 3]], jnp.int32)
    >>> for _ in range(max(schedule.values()) + 1):
    ...     _ = model(tokens)
    >>> from jaxnorm.nn.convert import lm_params, load_lm
    >>> params, config = remove_fake_ln(lm_params(model), model.config)

    The exported model has no norm and the logits of the fake one:

    >>> model.eval()
    >>> y = load_lm(config, params)(tokens)
    >>> config.norm, bool(jnp.allclose(y, model(tokens), atol=1e-5))
    ('none', True)
  """
  who = "remove_fake_ln"
  _tree.check_lm(who, config, ("layernorm",))
  kw = _tree.norm_kwargs(who, config, _tree.LN_KWARGS, _tree.LN_DEFAULTS)
  params, config = _tree.untie_embeddings(params, config)
  view = _tree.split(params, config)
  named = {("final_norm",): view["final"]}
  for i, (n1, _, n2, _) in enumerate(view["layers"]):
    named[("steps", 2 * i)] = n1
    named[("steps", 2 * i + 1)] = n2
  std = {}
  for key, norm in named.items():
    where = ".".join(map(str, key))
    missing = [k for k in fakeln.FakeLNState._fields if k not in norm]
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
    view = _tree.with_biases(view, new_config)
  folded = _tree.fold_view(view, config, kw, center_input=True, std=std)
  return _tree.join(folded, new_config), new_config
