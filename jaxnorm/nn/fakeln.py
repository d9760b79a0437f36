"""FakeLN: a LayerNorm that freezes its standard deviation on a schedule.

The training mode of LayerNorm removal (Baroni et al. 2025; spec
``norms.md`` section 10). `install_fake_ln` replaces every LayerNorm of a
pre-norm `jaxnorm.nn.models.DecoderLM` by a `FakeLayerNorm` that

* while *real* (training step ``< remove_at``) is an ordinary LayerNorm and
  tracks a running average of the per-token std,
  ``s <- m s + (1 - m) mean_{batch,pos} sqrt(var_d(x) + eps)``;
* from step ``remove_at`` on is *fake*: the running average is frozen and
  used for every token (`jaxnorm.norms.fake_layer_norm`), so the norm is a
  linear map;
* until step ``bos_off_at`` gives position 0 (the attention-sink position)
  its own frozen std.

The maths (statistics, running averages, the frozen std, the schedule) is
`jaxnorm.norms.fakeln` (`jaxnorm.norms.fake_ln`, whose docstring states the
conventions and deviations); this module holds the parameters and the
state. The schedule lives in each module's state (its own step counter and
``remove_at``), so any training loop runs the removal without changes, e.g.
``jaxnorm.training.trainer.train(cfg, model=model)``. After the schedule,
`jaxnorm.nn.convert.remove_fake_ln` exports the model without norms.

Deviation: the repo evaluates ``ln_1`` twice (a Q/K path and a V path with
separate removal steps). jaxnorm's attention reads Q, K and V from one
normalized input, so ``ln_1`` is one FakeLN, removed at the V-path step
(the later of the two).

Examples:
  >>> from jaxnorm.norms.fakeln import removal_steps
  >>> steps = removal_steps(1, start=10)  # one layer, all real until 10
  >>> steps[("ln_2", 0)], steps[("ln_1v", 0)], steps[("ln_f", None)]
  (10, 14, 17)

References:
  Baroni, Khara, Schaeffer, Subkhankulov & Heimersheim, *Transformers Don't
  Need LayerNorm at Inference Time: Scaling LayerNorm Removal to GPT-2 XL
  and the Implications for Mechanistic Interpretability*, arXiv:2507.02559
  (2025).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnorm import _checks, _numerics
from jaxnorm.nn import _param
from jaxnorm.nn import models as nn_models
from jaxnorm.nn import norms as nn_norms
from jaxnorm.norms import fakeln as fakeln_fn


class FakeLNStat(nnx.BatchStat):
  """State of a `FakeLayerNorm`: the fields of `jaxnorm.norms.FakeLNState`.

  Examples:
    >>> ln = FakeLayerNorm(4, rngs=nnx.Rngs(0))
    >>> sorted(nnx.to_pure_dict(nnx.state(ln, FakeLNStat)))
    ['bos_off_at', 'bos_std', 'count', 'remove_at', 'std', 'step']
  """


class FakeLayerNorm(nnx.Module):
  """LayerNorm whose std becomes a frozen running average at ``remove_at``.

  Calls `jaxnorm.norms.fake_ln` (the maths and its conventions). Parameters
  ``scale`` and ``bias`` as in `jaxnorm.nn.LayerNorm`; state (`FakeLNStat`,
  one variable per field of `jaxnorm.norms.FakeLNState`): ``std`` and
  ``bos_std`` (bias-corrected running averages, frozen once fake),
  ``count`` (updates so far), ``step`` (training calls so far),
  ``remove_at`` and ``bos_off_at`` (0 = no special position-0 std).
  Training calls (the default) update the state;
  ``use_running_average=True`` (set by ``model.eval()``) only reads it.
  Inputs are ``(..., T, d)`` with positions on axis -2.

  Examples:
    >>> ln = FakeLayerNorm(2, remove_at=2, rngs=nnx.Rngs(0))
    >>> x = jnp.array([[[1.0, 3.0]]], jnp.float32)  # (B, T, d), std 1
    >>> [round(v, 4) for v in ln(x)[0, 0].tolist()]  # step 0: real
    [-1.0, 1.0]
    >>> _ = ln(x)  # step 1: real; then fake with the running std 1
    >>> [round(v, 4) for v in ln(2 * x)[0, 0].tolist()], int(ln.step[...])
    ([-2.0, 2.0], 3)

    (A real LayerNorm maps ``2 x`` to ``[-1, 1]`` again; the fake one is
    linear.)
  """

  def __init__(
    self,
    num_features: int,
    *,
    eps: float = 1e-6,
    remove_at: int = 0,
    bos_off_at: int = 0,
    momentum: float = 0.9,
    use_scale: bool = True,
    use_bias: bool = True,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    axis_names: Any = ("norm",),
    rngs: nnx.Rngs,
  ):
    who = "FakeLayerNorm"
    _checks.check_positive_int(who, "num_features", num_features)
    fakeln_fn._check_step(who, "remove_at", remove_at)
    fakeln_fn._check_step(who, "bos_off_at", bos_off_at)
    if not 0.0 <= momentum < 1.0:
      raise ValueError(f"{who}: momentum must be in [0, 1), got {momentum=}")
    del rngs  # Constant initialization only.
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.dtype = dtype
    self.scale = (
      _param.param(jnp.ones((num_features,), param_dtype), axis_names)
      if use_scale
      else None
    )
    self.bias = (
      _param.param(jnp.zeros((num_features,), param_dtype), axis_names)
      if use_bias
      else None
    )
    state = fakeln_fn.init_fake_ln_state(
      remove_at=remove_at, bos_off_at=bos_off_at
    )
    self.std = FakeLNStat(state.std)
    self.bos_std = FakeLNStat(state.bos_std)
    self.count = FakeLNStat(state.count)
    self.step = FakeLNStat(state.step)
    self.remove_at = FakeLNStat(state.remove_at)
    self.bos_off_at = FakeLNStat(state.bos_off_at)
    self.use_running_average = False

  @classmethod
  def from_layer_norm(
    cls, norm: nn_norms.LayerNorm, **kwargs: Any
  ) -> FakeLayerNorm:
    """A FakeLN with the parameters and ``eps`` of ``norm``.

    Raises:
      ValueError: if ``norm`` is not a `LayerNorm` or has a nonzero
        ``scale_offset``.
    """
    if not isinstance(norm, nn_norms.LayerNorm):
      raise ValueError(
        f"FakeLayerNorm.from_layer_norm: norm must be a "
        f"jaxnorm.nn.LayerNorm, got {type(norm).__name__}"
      )
    if norm.scale_offset:
      raise ValueError(
        f"FakeLayerNorm.from_layer_norm: scale_offset must be "
        f"0, got {norm.scale_offset=}"
      )
    out = cls(
      norm.num_features,
      eps=norm.eps,
      use_scale=norm.scale is not None,
      use_bias=norm.bias is not None,
      dtype=norm.dtype,
      rngs=nnx.Rngs(0),
      **kwargs,
    )
    if norm.scale is not None:
      out.scale[...] = norm.scale[...]
    if norm.bias is not None:
      out.bias[...] = norm.bias[...]
    return out

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes ``x`` ``(..., T, d)``; updates the state when training."""
    who = "FakeLayerNorm"
    _checks.check_floating(who, "x", x)
    _checks.check_ndim(who, "x", x, minimum=2)
    if x.shape[-1] != self.num_features:
      raise ValueError(
        f"{who}: x must have num_features={self.num_features}"
        f" features on its last axis, got {x.shape=}"
      )
    training = not self.use_running_average
    state = fakeln_fn.FakeLNState(
      *(getattr(self, name)[...] for name in fakeln_fn.FakeLNState._fields)
    )
    y, state = fakeln_fn.fake_ln(
      x.astype(_numerics.compute_dtype(x)),
      None if self.scale is None else self.scale[...],
      None if self.bias is None else self.bias[...],
      state,
      eps=self.eps,
      momentum=self.momentum,
      training=training,
    )
    if training:
      for name, value in zip(state._fields, state):
        getattr(self, name)[...] = value
    return y.astype(self.dtype or x.dtype)


def install_fake_ln(
  model: nn_models.DecoderLM,
  *,
  start: int = 20,
  gap: int = 1,
  bos: bool = True,
  momentum: float = 0.9,
) -> dict[tuple[str, int | None], int]:
  """Replaces every LayerNorm of ``model`` by a scheduled `FakeLayerNorm`.

  Layer ``i``'s attention norm (``ln_1``) goes fake at the ``ln_1v`` step,
  its MLP norm (``ln_2``) at the ``ln_2`` step and the final norm at the
  ``ln_f`` step of `jaxnorm.norms.fakeln.removal_steps`; with ``bos`` the
  position-0 std is used until ``bos_off``. Parameters are copied; the
  model is changed in place (its config still names ``layernorm``).

  Args:
    model: a pre-norm LayerNorm `DecoderLM`.
    start: steps with all norms real (`removal_steps`).
    gap: stretch of the schedule (`removal_steps`).
    bos: give position 0 its own std until ``bos_off``.
    momentum: running-average momentum ``m``.

  Returns:
    The schedule ``{(event, layer): step}``.

  Raises:
    ValueError: for a model that is not a pre-norm LayerNorm `DecoderLM`.

  Examples:
    >>> from jaxnorm.nn.models import DecoderLM, LMConfig
    >>> model = DecoderLM(LMConfig(vocab_size=16, width=8, depth=1,
    ...                            num_heads=2, norm="layernorm",
    ...                            tie_embeddings=False), rngs=nnx.Rngs(0))
    >>> schedule = install_fake_ln(model, start=10)
    >>> schedule[("ln_1v", 0)], schedule[("bos_off", None)]
    (14, 29)
    >>> type(model.final_norm).__name__, int(model.final_norm.remove_at[...])
    ('FakeLayerNorm', 17)
  """
  who = "install_fake_ln"
  config = getattr(model, "config", None)
  if (
    not isinstance(model, nn_models.DecoderLM)
    or config.norm != "layernorm"
    or config.residual != "prenorm"
  ):
    raise ValueError(
      f"{who}: model must be a pre-norm DecoderLM with "
      f"norm='layernorm', got {type(model).__name__} with "
      f"config={config}"
    )
  steps = fakeln_fn.removal_steps(config.depth, start=start, gap=gap)
  bos_off = steps[("bos_off", None)] if bos else 0
  kw = {"bos_off_at": bos_off, "momentum": momentum}
  for i in range(config.depth):
    attn, mlp = model.net.steps[2 * i], model.net.steps[2 * i + 1]
    attn.norm = FakeLayerNorm.from_layer_norm(
      attn.norm, remove_at=steps[("ln_1v", i)], **kw
    )
    mlp.norm = FakeLayerNorm.from_layer_norm(
      mlp.norm, remove_at=steps[("ln_2", i)], **kw
    )
  model.final_norm = FakeLayerNorm.from_layer_norm(
    model.final_norm, remove_at=steps[("ln_f", None)], **kw
  )
  return steps
