"""FakeLN: a LayerNorm that freezes its standard deviation on a schedule.

The training mode of LayerNorm removal (Baroni et al. 2025; spec
``norms.md`` section 10). `install_fake_ln` replaces every LayerNorm of a
pre-norm `jaxnorm.nn.models.DecoderLM` by a `FakeLayerNorm` that

* while *real* (training step ``< remove_at``) is an ordinary LayerNorm and
  tracks a running average of the per-token std,
  ``s <- m s + (1 - m) mean_{batch,pos} sqrt(var_d(x) + eps)``;
* from step ``remove_at`` on is *fake*: the running average is frozen and
  used for every token (`jaxnorm.nn.convert.fake_layer_norm`), so the norm is
  a linear map;
* until step ``bos_off_at`` gives position 0 (the attention-sink position)
  its own frozen std.

The schedule lives in each module's state (its own step counter and
``remove_at``), so any training loop runs the removal without changes, e.g.
``jaxnorm.training.trainer.train(cfg, model=model)``. After the schedule,
`jaxnorm.nn.convert.remove_fake_ln` exports the model without norms.

Conventions (the repo's code is the reference, spec section 10):

* The running average is bias-corrected (Adam-style: it starts at zero and
  is divided by ``1 - m^n`` after ``n`` updates), so the frozen value does
  not depend on an initial guess. The first training call always records.
* While the position-0 std is on, the shared average excludes position 0.
* Deviation: the repo evaluates ``ln_1`` twice (a Q/K path and a V path
  with separate removal steps). jaxnorm's attention reads Q, K and V from
  one normalized input, so ``ln_1`` is one FakeLN, removed at the V-path
  step (the later of the two). The EOT special std does not apply to
  byte-level corpora without an EOT token.

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

from jaxnorm import _checks
from jaxnorm.nn import _param, convert
from jaxnorm.nn import models as nn_models
from jaxnorm.nn import norms as nn_norms


class FakeLNStat(nnx.BatchStat):
  """State of a `FakeLayerNorm`: frozen stds, counters and its schedule."""


def _check_step(who: str, name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise ValueError(
      f"{who}: {name} must be a non-negative integer step, got {name}={value!r}"
    )


class FakeLayerNorm(nnx.Module):
  """LayerNorm whose std becomes a frozen running average at ``remove_at``.

  See the module docstring. Parameters ``scale`` and ``bias`` as in
  `jaxnorm.nn.LayerNorm`; state (`FakeLNStat`): ``std`` and ``bos_std``
  (bias-corrected running averages, frozen once fake), ``count`` (updates
  so far), ``step`` (training calls so far), ``remove_at`` and
  ``bos_off_at`` (0 = no special position-0 std). Training calls (the
  default) update the state; ``use_running_average=True`` (set by
  ``model.eval()``) only reads it. Inputs are ``(..., T, d)`` with positions
  on axis -2.
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
    _check_step(who, "remove_at", remove_at)
    _check_step(who, "bos_off_at", bos_off_at)
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
    self.std = FakeLNStat(jnp.ones((), jnp.float32))
    self.bos_std = FakeLNStat(jnp.ones((), jnp.float32))
    self.count = FakeLNStat(jnp.zeros((), jnp.int32))
    self.step = FakeLNStat(jnp.zeros((), jnp.int32))
    self.remove_at = FakeLNStat(jnp.asarray(remove_at, jnp.int32))
    self.bos_off_at = FakeLNStat(jnp.asarray(bos_off_at, jnp.int32))
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
    cdt = jnp.promote_types(x.dtype, jnp.float32)
    xf = x.astype(cdt)
    xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
    tok = jnp.sqrt(jnp.mean(jnp.square(xc), axis=-1) + self.eps)  # (..., T)
    step = self.step[...]
    fake = step >= self.remove_at[...]
    bos_on = step < self.bos_off_at[...]
    num_pos = x.shape[-2]
    if not self.use_running_average:
      t = jax.lax.stop_gradient(tok).astype(jnp.float32)
      shared = (
        jnp.where(bos_on, jnp.mean(t[..., 1:]), jnp.mean(t))
        if num_pos > 1
        else jnp.mean(t)
      )
      count = self.count[...]
      record = jnp.logical_or(jnp.logical_not(fake), count == 0)
      m = self.momentum
      done = 1.0 - jnp.power(m, count.astype(jnp.float32))
      total = 1.0 - jnp.power(m, (count + 1).astype(jnp.float32))

      def update(old, batch):
        return jnp.where(
          record, (m * old * done + (1.0 - m) * batch) / total, old
        )

      self.std[...] = update(self.std[...], shared)
      self.bos_std[...] = update(self.bos_std[...], jnp.mean(t[..., 0]))
      self.count[...] = count + record.astype(jnp.int32)
      self.step[...] = step + 1
    first = jnp.arange(num_pos) == 0
    frozen = jnp.where(
      jnp.logical_and(bos_on, first), self.bos_std[...], self.std[...]
    ).astype(cdt)
    std = jnp.where(fake, jnp.broadcast_to(frozen, tok.shape), tok)
    y = convert.fake_layer_norm(
      xf,
      None if self.scale is None else self.scale[...],
      None if self.bias is None else self.bias[...],
      std=std,
    )
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
  ``ln_f`` step of `jaxnorm.nn.convert.removal_steps`; with ``bos`` the
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
  steps = convert.removal_steps(config.depth, start=start, gap=gap)
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
