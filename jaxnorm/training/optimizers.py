"""Optimizers by name for the experiment runner.

Every entry returns an `optax.GradientTransformation` with a linear-warmup
cosine schedule, global-norm clipping at 1.0, and decoupled weight decay on
matrices only (``ndim >= 2``; norm scales, biases and gates are never
decayed).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import optax

from jaxnorm import optim

Builder = Callable[
  [optax.Schedule, float, Callable[[Any], Any]], optax.GradientTransformation
]


def matrix_mask(params: Any) -> Any:
  """True for leaves with two or more dimensions (decayed weights)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


OPTIMIZERS: types.MappingProxyType = types.MappingProxyType(
  {
    "adamw": lambda lr, wd, mask: optax.adamw(
      lr, b1=0.9, b2=0.95, weight_decay=wd, mask=mask
    ),
    "sgd": lambda lr, wd, mask: optax.chain(
      optax.add_decayed_weights(wd, mask),
      optax.sgd(lr, momentum=0.9, nesterov=True),
    ),
    "adamp": lambda lr, wd, mask: optim.adamp(lr, b2=0.95, weight_decay=wd),
    "sgdp": lambda lr, wd, mask: optim.sgdp(
      lr, momentum=0.9, nesterov=True, weight_decay=wd
    ),
    "conda": lambda lr, wd, mask: optim.conda(lr, b2=0.95, weight_decay=wd),
    "rmnp": lambda lr, wd, mask: optim.rmnp(
      lr, weight_decay=wd, adam_weight_decay=0.0
    ),
    "muon": lambda lr, wd, mask: optax.contrib.muon(
      lr, weight_decay=wd, weight_decay_mask=mask
    ),
    "lion": lambda lr, wd, mask: optax.lion(lr, weight_decay=wd, mask=mask),
  }
)


def build_optimizer(
  name: str,
  *,
  learning_rate: float,
  weight_decay: float,
  warmup_steps: int,
  total_steps: int,
) -> optax.GradientTransformation:
  """The named optimizer with warmup-cosine schedule and clipping.

  Raises:
    ValueError: for an unknown name; the message lists the valid names.
  """
  if name not in OPTIMIZERS:
    raise ValueError(
      f"build_optimizer: unknown optimizer {name!r}; valid "
      f"names are {', '.join(sorted(OPTIMIZERS))}"
    )
  warmup = min(max(warmup_steps, 1), max(total_steps - 1, 1))
  schedule = optax.warmup_cosine_decay_schedule(
    0.0,
    learning_rate,
    warmup,
    max(total_steps, warmup + 1),
    end_value=learning_rate * 0.1,
  )
  return optax.chain(
    optax.clip_by_global_norm(1.0),
    OPTIMIZERS[name](schedule, weight_decay, matrix_mask),
  )
