"""Registry-driven causality of the decoder LM (issue 12, item 1).

For every attention and every norm `DecoderLM` accepts (read from the
specs through `model_registry.registries`), a tiny LM's logits at positions
``< T - 1`` must not change when only the last token changes, in training and in
evaluation mode; every part the LM refuses must raise before anything is
built. A part added to a registry is covered here without a new line.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxnorm.nn import attention as nn_attention
from jaxnorm.nn import model_registry, models
from jaxnorm.nn import norms as nn_norms

TINY = dict(
  vocab_size=32, width=16, depth=1, num_heads=2, max_len=8, mlp_ratio=2
)
LM = model_registry.registries("lm")
LM_OPT_IN = model_registry.registries("lm", allow_batch_stats=True)
BATCH_STATS_NORMS = tuple(n for n in LM_OPT_IN["norm"] if n not in LM["norm"])
REFUSED_ATTENTIONS = tuple(
  n
  for n in nn_attention.TOKEN_ATTENTIONS
  if n not in LM["attention"]
  and nn_attention.ATTENTIONS[n].dtype_kind == "real"
)
COMPLEX_ATTENTIONS = tuple(
  n for n, s in nn_attention.ATTENTIONS.items() if s.dtype_kind == "complex"
)
REFUSED_NORMS = tuple(n for n in nn_norms.NORMS if n not in LM_OPT_IN["norm"])


def _leak(**parts):
  """Max change of the earlier logits, and of the last, per mode.

  Runs eagerly: every part has the same tiny shapes, so after the first
  part the per-op executables are cached and one part costs ~0.1 s, against
  ~1 s to compile a jitted model per part (measured on the 2-core machine).
  Each forward pass starts from a clone of the same state, so training-mode
  state updates of the first pass cannot reach the second.
  """
  model = models.DecoderLM(models.LMConfig(**TINY, **parts), rngs=nnx.Rngs(0))
  a = jax.random.randint(jax.random.key(0), (2, 8), 0, TINY["vocab_size"])
  b = a.at[:, -1].set((a[:, -1] + 1) % TINY["vocab_size"])
  out = {}
  for mode in ("train", "eval"):
    if mode == "eval":
      model.eval()
    x, y = (np.asarray(nnx.clone(model)(t), np.float64) for t in (a, b))
    diff = np.abs(x - y)
    out[mode] = (diff[:, :-1].max(), diff[:, -1].max())
  return out


@pytest.mark.parametrize("attention", LM["attention"])
def test_attention_is_causal_in_lm(attention):
  leak = _leak(attention=attention)
  for mode, (earlier, last) in leak.items():
    assert earlier <= 1e-6, (attention, mode, earlier)
    assert last > 1e-4, (attention, mode, last)  # The change is seen.


@pytest.mark.parametrize("norm", LM["norm"])
def test_norm_is_causal_in_lm(norm):
  leak = _leak(norm=norm)
  for mode, (earlier, last) in leak.items():
    assert earlier <= 1e-6, (norm, mode, earlier)
    assert last > 1e-4, (norm, mode, last)


@pytest.mark.parametrize("norm", BATCH_STATS_NORMS)
def test_batch_stats_norm_opt_in_is_causal_in_eval(norm):
  """Opt-in batch statistics: causal with the running statistics only.

  In training mode the statistics run over batch and sequence, which the
  opt-in accepts; evaluation mode must be causal.
  """
  with pytest.raises(ValueError, match=r"allow_batch_stats=True"):
    models.DecoderLM(models.LMConfig(**TINY, norm=norm), rngs=nnx.Rngs(0))
  earlier, last = _leak(norm=norm, allow_batch_stats=True)["eval"]
  assert earlier <= 1e-6 and last > 1e-4, (norm, earlier, last)


@pytest.mark.parametrize("attention", REFUSED_ATTENTIONS)
def test_lm_refuses_attention_without_causal_form(attention):
  valid = ", ".join(LM["attention"])
  with pytest.raises(
    ValueError,
    match=rf"DecoderLM: attention '{attention}' has no causal form, so a "
    rf"decoder would see future tokens; choose one of {valid}",
  ):
    models.DecoderLM(
      models.LMConfig(**TINY, attention=attention), rngs=nnx.Rngs(0)
    )


@pytest.mark.parametrize("attention", nn_attention.IMAGE_ATTENTIONS)
def test_lm_refuses_image_attention(attention):
  with pytest.raises(
    ValueError,
    match=rf"DecoderLM: attention '{attention}' does not act on the tokens "
    rf"layout; choose one of {', '.join(LM['attention'])}",
  ):
    models.DecoderLM(
      models.LMConfig(**TINY, attention=attention), rngs=nnx.Rngs(0)
    )


@pytest.mark.parametrize("norm", REFUSED_NORMS)
def test_lm_refuses_non_causal_norm(norm):
  spec = nn_norms.NORMS[norm]
  if spec.dtype_kind == "complex":
    reason = "is complex-valued"
  elif "tokens" in spec.layouts:
    reason = "is not causal in the tokens layout"
  else:
    reason = "does not normalize the tokens layout"
  with pytest.raises(
    ValueError,
    match=rf"DecoderLM: norm '{norm}' {reason}.*; choose one of "
    rf"{', '.join(LM_OPT_IN['norm'])}",
  ):
    models.DecoderLM(
      models.LMConfig(**TINY, norm=norm, allow_batch_stats=True),
      rngs=nnx.Rngs(0),
    )


@pytest.mark.parametrize("attention", COMPLEX_ATTENTIONS)
def test_lm_refuses_complex_attention(attention):
  with pytest.raises(
    ValueError,
    match=rf"DecoderLM: attention '{attention}' is complex-valued .*; "
    rf"choose one of {', '.join(LM['attention'])}",
  ):
    models.DecoderLM(
      models.LMConfig(**TINY, attention=attention), rngs=nnx.Rngs(0)
    )
