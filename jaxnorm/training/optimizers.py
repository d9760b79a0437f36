"""Optimizers, schedules and clipping by name for the experiment runner.

Every entry of `OPTIMIZERS` builds an `optax.GradientTransformation` from a
learning-rate schedule (`make_schedule`: ``cosine``, ``wsd`` or
``constant``, each after a linear warmup), a weight decay with its per-leaf
mask, and the moment coefficients ``b1``/``b2`` (the entry's defaults unless
given). `build_optimizer` adds global-norm clipping in front and gradient
accumulation (`optax.MultiSteps`) around it.

Weight decay follows one per-leaf mask for every optimizer: the runner
passes `jaxnorm.nn.decay.decay_mask` of the model (the registry's
`decays` rule: matrices, kernels and embeddings yes; norm scales, biases and
gates no, unless a part's spec says otherwise); `matrix_mask` (``ndim >= 2``)
is the default without a model. One exception: ``muon`` hands the leaves that
are not 2-D (vectors, and 4-D convolution kernels) to its internal AdamW,
which optax gives no mask, so those are never decayed under ``muon``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax
import optax

from jaxnorm import optim

# The share of the updates over which ``wsd`` decays to zero at the end.
WSD_DECAY_FRACTION = 0.2
# ``cosine`` ends at this fraction of the peak learning rate.
COSINE_FINAL_FRACTION = 0.1


def matrix_mask(params: Any) -> Any:
  """True for leaves with two or more dimensions (decayed weights)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


@dataclasses.dataclass(frozen=True)
class Entry:
  """One named optimizer.

  Attributes:
    build: ``build(schedule, weight_decay, mask, b1, b2)``; ``b2`` is None
      when the method has no second moment.
    b1: default first-moment / momentum coefficient.
    b2: default second-moment coefficient, or None if the method has none.
  """

  build: Callable[..., optax.GradientTransformation]
  b1: float
  b2: float | None


OPTIMIZERS: types.MappingProxyType = types.MappingProxyType(
  {
    "adamw": Entry(
      lambda lr, wd, mask, b1, b2: optax.adamw(
        lr, b1=b1, b2=b2, weight_decay=wd, mask=mask
      ),
      0.9,
      0.95,
    ),
    "sgd": Entry(
      lambda lr, wd, mask, b1, b2: optax.chain(
        optax.add_decayed_weights(wd, mask),
        optax.sgd(lr, momentum=b1, nesterov=True),
      ),
      0.9,
      None,
    ),
    "adamp": Entry(
      lambda lr, wd, mask, b1, b2: optim.adamp(
        lr, b1=b1, b2=b2, weight_decay=wd, mask=mask
      ),
      0.9,
      0.95,
    ),
    "sgdp": Entry(
      lambda lr, wd, mask, b1, b2: optim.sgdp(
        lr, momentum=b1, nesterov=True, weight_decay=wd, mask=mask
      ),
      0.9,
      None,
    ),
    "conda": Entry(
      lambda lr, wd, mask, b1, b2: optim.conda(
        lr, b1=b1, b2=b2, weight_decay=wd, adam_weight_decay=wd, mask=mask
      ),
      0.9,
      0.95,
    ),
    "rmnp": Entry(
      lambda lr, wd, mask, b1, b2: optim.rmnp(
        lr,
        beta=b1,
        weight_decay=wd,
        adam_b2=b2,
        adam_weight_decay=wd,
        mask=mask,
      ),
      0.95,
      0.95,
    ),
    "muon": Entry(
      lambda lr, wd, mask, b1, b2: optax.contrib.muon(
        lr, beta=b1, adam_b2=b2, weight_decay=wd, weight_decay_mask=mask
      ),
      0.95,
      0.999,
    ),
    "lion": Entry(
      lambda lr, wd, mask, b1, b2: optax.lion(
        lr, b1=b1, b2=b2, weight_decay=wd, mask=mask
      ),
      0.9,
      0.99,
    ),
  }
)


def make_schedule(
  kind: str, learning_rate: float, warmup_steps: int, total_steps: int
) -> optax.Schedule:
  """The learning rate against the update count.

  All start with a linear warmup from 0 over ``warmup_steps`` (at least 1,
  at most ``total_steps - 1``); then ``cosine`` decays to
  `COSINE_FINAL_FRACTION` of the peak at ``total_steps``, ``wsd`` holds the
  peak and decays linearly to 0 over the last `WSD_DECAY_FRACTION` of the
  updates, and ``constant`` holds the peak.

  Raises:
    ValueError: for an unknown kind; the message lists the valid kinds.
  """
  warmup = min(max(warmup_steps, 1), max(total_steps - 1, 1))
  ramp = optax.linear_schedule(0.0, learning_rate, warmup)
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(
      0.0,
      learning_rate,
      warmup,
      max(total_steps, warmup + 1),
      end_value=learning_rate * COSINE_FINAL_FRACTION,
    )
  if kind == "constant":
    return optax.join_schedules(
      [ramp, optax.constant_schedule(learning_rate)], [warmup]
    )
  if kind == "wsd":
    decay = max(round(WSD_DECAY_FRACTION * total_steps), 1)
    stable_end = max(total_steps - decay, warmup)
    return optax.join_schedules(
      [
        ramp,
        optax.constant_schedule(learning_rate),
        optax.linear_schedule(learning_rate, 0.0, decay),
      ],
      [warmup, stable_end],
    )
  raise ValueError(
    f"make_schedule: unknown schedule {kind!r}; valid kinds are cosine, "
    f"wsd, constant"
  )


def build_optimizer(
  name: str,
  *,
  learning_rate: float,
  weight_decay: float,
  warmup_steps: int,
  total_steps: int,
  schedule: str = "cosine",
  clip_norm: float = 1.0,
  b1: float | None = None,
  b2: float | None = None,
  grad_accum: int = 1,
  mask: Any = matrix_mask,
) -> optax.GradientTransformation:
  """The named optimizer with its schedule, clipping and accumulation.

  Args:
    name: a key of `OPTIMIZERS`.
    learning_rate: peak learning rate.
    weight_decay: decoupled weight decay, applied where ``mask`` is True.
    warmup_steps: warmup length in updates.
    total_steps: batches of the run; the schedule spans
      ``total_steps // grad_accum`` updates.
    schedule: ``cosine``, ``wsd`` or ``constant`` (`make_schedule`).
    clip_norm: global-norm clipping threshold; 0 turns clipping off.
    b1: first-moment coefficient; None keeps the entry's default.
    b2: second-moment coefficient; None keeps the entry's default.
    grad_accum: batches averaged into one update (`optax.MultiSteps`).
    mask: the leaves weight decay applies to: a bool tree of the params'
      structure (e.g. `jaxnorm.nn.decay.decay_mask` of the model) or a
      callable from params to one.

  Raises:
    ValueError: for an unknown name (the message lists the valid names) or
      a ``b2`` for a method without a second moment.
  """
  if name not in OPTIMIZERS:
    raise ValueError(
      f"build_optimizer: unknown optimizer {name!r}; valid "
      f"names are {', '.join(sorted(OPTIMIZERS))}"
    )
  entry = OPTIMIZERS[name]
  if b2 is not None and entry.b2 is None:
    raise ValueError(
      f"build_optimizer: {name} has no second moment, so --b2 does not "
      f"apply; optimizers that take it: "
      f"{', '.join(n for n, e in OPTIMIZERS.items() if e.b2 is not None)}"
    )
  lr = make_schedule(
    schedule, learning_rate, warmup_steps, total_steps // grad_accum
  )
  tx = entry.build(
    lr,
    weight_decay,
    mask,
    entry.b1 if b1 is None else b1,
    entry.b2 if b2 is None else b2,
  )
  if clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  if grad_accum > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=grad_accum)
  return tx


def from_config(
  cfg: Any, *, mask: Any = matrix_mask
) -> optax.GradientTransformation:
  """`build_optimizer` with the optimizer fields of a `TrainConfig`."""
  return build_optimizer(
    cfg.optimizer,
    learning_rate=cfg.learning_rate,
    weight_decay=cfg.weight_decay,
    warmup_steps=cfg.warmup_steps,
    total_steps=cfg.steps,
    schedule=cfg.schedule,
    clip_norm=cfg.clip_norm,
    b1=cfg.b1,
    b2=cfg.b2,
    grad_accum=cfg.grad_accum,
    mask=mask,
  )
